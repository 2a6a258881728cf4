"""Test harness: one ``cluster`` fixture for the emulator or a real cluster, and a Kopf runner.

The fixtures themselves live in ``tests/conftest.py``; the machinery they use lives here.
"""
