"""Benchmark and quality Jobs for MiniCPM-o 4.5 speech serving.

The package runs inside the perf Job pods: it drives the official `vllm bench serve --omni`
client exactly as the benchmark protocol prescribes, re-scores the saved speech, and reduces
the official result files to a summary the operator reads from the pod's termination message.

The result schema it writes belongs to the contract the operator reads it by
(`minicpm_speech_contract.termination`); the operator never imports this package.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
