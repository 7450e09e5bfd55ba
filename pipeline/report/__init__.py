"""The reviewer's view: runs judged on item-level evidence, tables, figures and the prediction ledger.

- :mod:`.sources`: the only module that reads files (metrics.json trees, predictions, pools and slices, shortcut
  floors, teacher provenance) and turns them into plain records;
- :mod:`.stats`: intervals (Wilson, Clopper-Pearson, seed-level t, TOST), Holm, power, the looks' levels; an item
  bootstrap as within-seed precision;
- :mod:`.cells`: per-run item correctness, seeds x items matrices, per-cell and per-slice summaries;
- :mod:`.aggregate`: pure pandas run frames and the budget/distillation/steps tables;
- :mod:`.contrasts`: what the ledger predicts (minimal pairs, floors, exact checks) and which rows params plan;
- :mod:`.measure`, :mod:`.gate`: a row's measurement, and why it cannot be decided yet;
- :mod:`.ledger`: every planned row measured, gated, in one Holm family and judged;
- :mod:`.seeds`: the plan of a second look's seeds;
- :mod:`.natural`: level 3 (CIFAR-10 subgroups, resolution + position contract, literature anchors);
- :mod:`.figures`: matplotlib figures, one colour per architecture;
- :mod:`.markdown`: Markdown tables (one renderer) and the generated ``reports/README.md``;
- :mod:`.pages`: the list of tables, figures, captions and notes the stage writes.
"""
