"""Micro-benchmarks: run each as ``python -m bench.<name>``."""
