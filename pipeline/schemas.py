"""What each JSON file the pipeline reads must hold: one shape per kind of file, checked by
:func:`pipeline.io.read_json`, so a file of the wrong shape is one line naming the file and the field.

A shape lists the fields a reader uses (dotted keys for nested ones), not every field the writer puts there:
the report reads optional keys with ``.get`` and says what it does when they are absent. ``tests/test_schemas``
fails when a module reads JSON any other way.
"""

from __future__ import annotations

from pipeline.io import Shape, Unit

# data/tasks/<task>/meta.json (stages.generate): the pool's classes and the hashes its arrays must match.
TASK_META: Shape = {"num_classes": int, "class_names": list, "sha256.images": str, "sha256.labels": str}

# data/slices/<task>/manifest.json (stages.slice): which pool it was drawn from and each index array's hash.
SLICE_MANIFEST: Shape = {"source.images_sha256": str, "source.labels_sha256": str, "arrays": dict}

# <run>/metrics.json (experiment.record): what the report needs of a finished run (the resume check reads
# ``identity`` too, and reruns a run whose file lacks it).
RUN_METRICS: Shape = {"task": str, "arch": str, "seed": int, "train_size": int, "test_acc": Unit,
                      "val_acc": (Unit, type(None)), "slices.*.acc": Unit}

# <ckpt>/live.jsonl (learner.Curves, one point per line): what live_runs.LiveRuns streams to MLflow.
CURVE_POINT: Shape = {"step": int}

# <ckpt>/started.json (experiment.fit): when the run's worker began; live_runs.LiveRuns opens its MLflow run then.
RUN_STARTED: Shape = {"started": float}

# <ckpt>/config.json (experiment.execute): which run identity and MLflow run a checkpoint belongs to.
CHECKPOINT_CONFIG: Shape = {"identity": str, "mlflow_run_id": (str, type(None))}

# data/teachers/<task>/provenance.json (provenance.record): the frozen teacher a student distils from.
TEACHER_PROVENANCE: Shape = {"arch": str, "model": str, "task": str, "seed": int, "checkpoint_sha256": str,
                             "student_train_disagreement": Unit}

# data/tune/choice.json (stages.tune): the chosen learning rate per arch and task.
TUNE_CHOICE: Shape = {"lrs": dict}

# data/shortcuts/<task>/floors.json (stages.shortcuts): chance and the strongest shortcut baseline.
SHORTCUT_FLOORS: Shape = {"chance": Unit, "floor": Unit, "floor_baseline": str, "baselines.*.acc": Unit,
                          "baselines.*.n": int}

# data/interface/summary.json (stages.interface): the exact checks' counts and key numbers.
INTERFACE_SUMMARY: Shape = {"checks.checked": int, "checks.held": int, "key_numbers": dict}

# reports/summary.json (report stage): the ledger's counts, as `bias repro` prints them.
REPORT_SUMMARY: Shape = {"ledger": dict}

# reports[/<profile>]/repro_timing.json (bench.repro_breakdown): a repro's seconds, which README's block quotes.
REPRO_TIMING: Shape = {"total": float}

# data/finetune/<arch>/<run>/metrics.json (stages.finetune): one run fine-tuned at another size (or skipped).
FINETUNE_RESULT: Shape = {"identity": str, "arch": str, "task": str, "seed": int, "run": str, "position": str,
                          "size": int}

# data/plan/plan.json (stages.plan): the second look, which rows continue on which seeds, which cells train them.
SEED_PLAN: Shape = {"enabled": bool, "rows": list, "cells": list}
