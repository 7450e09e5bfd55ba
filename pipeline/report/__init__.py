"""The reviewer's view: runs aggregated over seeds, tables, figures and the prediction ledger.

- :mod:`.sources`: the only module that reads files (metrics.json trees, predictions, interface outputs, MLflow
  histories) and turns them into plain records;
- :mod:`.aggregate`: pure pandas: runs/slices frames, Student-t intervals over seeds, every table;
- :mod:`.ledger`: analytic predictions (functions of params + interface outputs only) and their verdicts;
- :mod:`.figures`: matplotlib figures from the aggregated frames;
- :mod:`.markdown`: Markdown tables and the generated ``reports/README.md``.
"""
