"""Benchmarks of the runtime; each prints a table and writes JSON."""
