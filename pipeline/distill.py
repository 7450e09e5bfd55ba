"""Teacher provenance: what a teacher stage writes beside its weights, and the check every student makes.

A distilled student inherits bias through its teacher's signal, so each student records exactly which
teacher stood behind it (MLflow run id, architecture, checkpoint sha256, training slice and data hashes,
accuracy, compute) and refuses to train when the weights on disk are not the ones recorded.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pipeline.errors import StageError
from pipeline.io import sha256_file

WEIGHTS = "model.pt"
PROVENANCE = "provenance.json"


def provenance(metrics: dict, weights: Path, train_slice_sha256: str) -> dict:
    """The record a teacher run leaves for its students (flat, so it maps onto MLflow tags)."""
    b = metrics["budget"]
    return {
        "arch": metrics["arch"], "task": metrics["task"], "seed": metrics["seed"],
        "train_size": metrics["train_size"], "mlflow_run_id": metrics["mlflow_run_id"],
        "checkpoint": weights.name, "checkpoint_sha256": sha256_file(weights),
        "data_sha256": metrics["data_sha256"], "train_slice_sha256": train_slice_sha256,
        "test_acc": metrics["test_acc"], "params": b["params"],
        "forward_flops_per_image": b["forward_flops_per_image"], "train_flops": b["train_flops"],
        "wall_time_s": metrics["measured"]["wall_time_s"],
    }


def load_teacher(teacher_dir: Path, task: str, params, num_classes: int):
    """Build the teacher recorded in ``<teacher_dir>/<task>/provenance.json`` and verify its weights.

    Returns ``(model in eval mode with frozen weights, provenance record)``. Raises :class:`StageError`
    when the record or weights are missing or the weights' sha256 differs from the recorded one.
    """
    import torch

    from pipeline.models import build_model

    folder = teacher_dir / task
    record_path, weights = folder / PROVENANCE, folder / WEIGHTS
    for path in (record_path, weights):
        if not path.exists():
            raise StageError(f"{path}: teacher file missing (run the teacher stage: dvc repro)")
    try:
        record = json.loads(record_path.read_text())
        expected = record["checkpoint_sha256"]
    except (json.JSONDecodeError, KeyError) as err:
        raise StageError(f"{record_path}: unreadable teacher provenance ({err})") from None
    actual = sha256_file(weights)
    if actual != expected:
        raise StageError(f"{weights}: sha256 {actual[:12]}... does not match the recorded teacher "
                         f"checkpoint {expected[:12]}... in {record_path}; refusing to distill from it")
    model = build_model(record["arch"], params, num_classes)
    model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    return model.eval().requires_grad_(False), record


def agreement(a_logits: np.ndarray, b_logits: np.ndarray) -> float:
    """Fraction of samples on which two models predict the same class."""
    return float((a_logits.argmax(-1) == b_logits.argmax(-1)).mean())
