"""Where does a vision model's inductive bias live? Exact checks, controlled experiments, counted compute."""

import gc

# Every stage and worker process imports this package before torch, timm, Lightning and MLflow, whose imports make
# millions of long-lived objects and little garbage: at Python's default first-generation threshold (700) the
# collector walks them thousands of times: 4.9 s of CPU to import that stack, 4.1 s raised (`python -m bench.startup`,
# reports/performance.md). Raised for the whole process but its runs: a run trains at the thresholds the process had
# before this (pipeline.executor), so cycles that hold tensors go at the usual pace. Neither changes any number.
PYTHON_GC = gc.get_threshold()  # Python's own, unless the process set others before importing the package
RAISED_GC = (100_000, 50, 100)
gc.set_threshold(*RAISED_GC)
