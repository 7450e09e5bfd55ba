"""Where does a vision model's inductive bias live? Exact checks, controlled experiments, counted compute."""

import gc

# Every stage and worker process imports this package before torch, timm, Lightning and MLflow, whose imports make
# millions of long-lived objects and little garbage: at Python's default first-generation threshold (700) the
# collector walks them thousands of times, ~1.5 s of CPU of a tiny train stage's ~10 s (`python -m bench.startup`).
# Raised for the start-up and the stages that do not train; a run sets Python's defaults back before it trains
# (pipeline.executor), so cycles that hold tensors go at the usual pace. Neither changes what anything computes.
PYTHON_GC = gc.get_threshold()
STARTUP_GC = (100_000, 50, 100)
gc.set_threshold(*STARTUP_GC)
