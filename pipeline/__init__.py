"""Where does a vision model's inductive bias live? Exact checks, controlled experiments, counted compute."""

import gc

# Every stage and worker process imports this package before torch, timm, Lightning and MLflow, whose imports make
# millions of long-lived objects and little garbage: at Python's default first-generation threshold (700) the
# collector walks them thousands of times, ~1.5 s of CPU of a tiny train stage's ~10 s (`python -m bench.startup`).
# Raised for the whole process but its runs: a run trains at Python's own (pipeline.executor), so cycles that hold
# tensors go at the usual pace. Neither setting changes what anything computes.
PYTHON_GC = gc.get_threshold()
RAISED_GC = (100_000, 50, 100)
gc.set_threshold(*RAISED_GC)
