"""Thin DVC stage entry points: ``python -m pipeline.stages.<verb>``; paths come from dvc.yaml."""
