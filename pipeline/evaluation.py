"""Evaluating a trained run (pure: a model and its data in, accuracies out): test logits, accuracy per slice,
one-pixel shift consistency, extra sets, and for main-grid runs the natural-image subgroups and the resolution
sweep. A worker runs it right after :func:`pipeline.experiment.fit` trains."""

from __future__ import annotations

import numpy as np

from pipeline.config import Params
from pipeline.grid import RunSpec, at_main_budget
from pipeline.predict import predict, slice_accuracy
from pipeline.resolution import evaluate_resolutions, native_for
from pipeline.subgroups import evaluate_subgroups


def evaluate(model, split, batch_size: int, extra: dict[str, np.ndarray]) -> dict:
    """Test logits, accuracy overall and per slice, one-pixel shift consistency, accuracy on ``extra`` sets.

    Shift consistency: does the prediction survive a (cyclic) one-pixel shift along x, which moves content
    across patch boundaries?
    """
    test_idx = split.indices["test"]
    logits = predict(model, split.images[test_idx], batch_size)
    pred = np.full(len(split.labels), -1, dtype=np.int64)
    pred[test_idx] = logits.argmax(-1)
    shifted = predict(model, np.roll(split.images[test_idx], 1, axis=2), batch_size)
    sets = {}
    for name, idx in extra.items():
        acc = float((predict(model, split.images[idx], batch_size).argmax(-1) == split.labels[idx]).mean())
        sets[name] = {"acc": acc, "disagreement": 1.0 - acc, "n": int(len(idx))}
    return {"test_idx": test_idx, "logits": logits, "slices": slice_accuracy(pred, split.labels, split.indices),
            "shift_consistency": float((shifted.argmax(-1) == logits.argmax(-1)).mean()), "sets": sets}


def evaluate_factors(model, spec: RunSpec, split, params: Params) -> dict:
    """The pre-specified test-set subgroups (natural images) and the resolution sweep (``evaluation``), for
    main-grid runs."""
    if not at_main_budget(spec, params):
        return {}
    ev, bs, task = params.evaluation, params.train.runtime.eval_batch_size, spec.key.task
    test_idx = split.indices["test"]
    x, y = split.images[test_idx], split.labels[test_idx]
    out = {}
    if task == "natural":
        out["subgroups"] = evaluate_subgroups(lambda b: predict(model, b, bs), x, y, params)
    if task in ev.resolution.tasks:
        native = native_for(task, spec.data_dir, test_idx, x)
        res = evaluate_resolutions(model, spec.model, params, native, y, ev.resolution.sizes, bs)
        out["resolution"] = {str(k): v for k, v in res.items()}
    return out
