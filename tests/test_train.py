"""Training through Lightning on the tiny workspace: MLflow record, exact resume, determinism, distillation."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from conftest import mlflow_store
from torch.utils.data import DataLoader, TensorDataset

from pipeline import train as train_mod
from pipeline.config import load_params
from pipeline.distill import load_teacher
from pipeline.errors import StageError
from pipeline.experiment import RunSpec, run
from pipeline.models import build_model
from pipeline.train import Classifier, distillation_loss

torch.set_num_threads(1)


def spec(ws: Path, out: Path, seed: int = 0) -> RunSpec:
    return RunSpec(stage="train", task="alignment", arch="vit", seed=seed, train_size=128,
                   data_dir=ws / "data/tasks/alignment", slices_dir=ws / "data/slices/alignment",
                   out_dir=out / "runs", ckpt_dir=out / "ckpt")


def logits(out: Path) -> np.ndarray:
    with np.load(out / "runs/predictions.npz") as z:
        return z["logits"]


class Interrupt(Exception):
    """Stands in for a crash in the middle of a run."""


def interrupting_progress(at_step: int):
    class Interrupting(train_mod.History):
        def on_validation_end(self, trainer, pl_module):
            super().on_validation_end(trainer, pl_module)
            if trainer.global_step >= at_step:
                raise Interrupt(f"stopped at step {trainer.global_step}")
    return Interrupting


@pytest.fixture(scope="module")
def runs(workspace, tmp_path_factory):
    """Three runs of one spec: a, b (same seed, fresh) and c (interrupted at step 10, then rerun)."""
    params = load_params(workspace / "params.yaml")
    root = tmp_path_factory.mktemp("train_runs")
    out = {name: root / name for name in "abc"}
    with mlflow_store(root):
        metrics = {name: run(spec(workspace, out[name]), params) for name in "ab"}
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(train_mod, "History", interrupting_progress(10))
            with pytest.raises(Interrupt):
                run(spec(workspace, out["c"]), params)
        stamp = json.loads((out["c"] / "ckpt/config.json").read_text())
        interrupted_files = sorted(p.name for p in (out["c"] / "ckpt").iterdir())
        metrics["c"] = run(spec(workspace, out["c"]), params)
    return {"params": params, "root": root, "out": out, "metrics": metrics, "stamp": stamp,
            "interrupted_files": interrupted_files}


def test_run_is_tracked_with_budget_and_slices(runs):
    from mlflow.tracking import MlflowClient

    m = runs["metrics"]["a"]
    assert {"params", "optimizer_steps", "images_seen", "tokens_seen", "train_flops"} <= set(m["budget"])
    assert m["budget"]["optimizer_steps"] == 20 and m["budget"]["images_seen"] == 20 * 16
    assert any(k.startswith("slice/") for k in m["slices"])
    client = MlflowClient(tracking_uri=f"sqlite:///{runs['root'] / 'mlflow.db'}")
    rec = client.get_run(m["mlflow_run_id"])
    assert rec.info.status == "FINISHED"
    assert rec.data.metrics["budget/train_flops"] == m["budget"]["train_flops"]
    assert rec.data.params["budget.optimizer_steps"] == "20"
    slice_metrics = [k for k in rec.data.metrics if k.startswith("test/slice/")]
    assert len(slice_metrics) == sum(k.startswith("slice/") for k in m["slices"])
    assert rec.data.tags["task"] == "alignment" and rec.data.tags["config_hash"] == m["config_hash"]


def test_same_seed_same_metrics(runs):
    a, b = runs["metrics"]["a"], runs["metrics"]["b"]
    assert a["slices"] == b["slices"] and a["val_acc"] == b["val_acc"]
    assert np.array_equal(logits(runs["out"]["a"]), logits(runs["out"]["b"]))


def test_resume_continues_from_checkpoint(runs):
    from mlflow.tracking import MlflowClient

    c = runs["metrics"]["c"]
    assert "last.ckpt" in runs["interrupted_files"]
    assert c["measured"]["resumed"] and 0 < c["measured"]["steps_this_process"] < 20
    assert c["mlflow_run_id"] == runs["stamp"]["mlflow_run_id"]  # the interrupted run continues
    assert MlflowClient(tracking_uri=f"sqlite:///{runs['root'] / 'mlflow.db'}").get_run(
        c["mlflow_run_id"]).info.status == "FINISHED"
    assert np.array_equal(logits(runs["out"]["a"]), logits(runs["out"]["c"]))
    assert c["slices"] == runs["metrics"]["a"]["slices"]
    assert not any((runs["out"]["c"] / "ckpt").iterdir())  # a finished run keeps no checkpoints


def test_distillation_loss_by_hand():
    cls = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 0.0]])
    dist = torch.tensor([[0.0, 1.0, 0.0], [1.0, -1.0, 2.0]])
    labels = torch.tensor([0, 1])
    teacher = torch.tensor([[0.1, 3.0, 0.2], [2.0, 1.0, 0.0]])  # argmax: 1, 0

    def log_softmax(row, t=1.0):
        z = [v / t for v in row]
        lse = math.log(sum(math.exp(v) for v in z))
        return [v - lse for v in z]

    def ce(rows, targets):
        return -sum(log_softmax(r)[t] for r, t in zip(rows, targets, strict=True)) / len(rows)

    c, d, t = cls.tolist(), dist.tolist(), teacher.tolist()
    hard = 0.5 * ce(c, [0, 1]) + 0.5 * ce(d, [1, 0])
    assert distillation_loss(cls, dist, labels, teacher).item() == pytest.approx(hard, rel=1e-6)

    tau = 2.0
    kl = sum(math.exp(lt) * (lt - ls) for tr, sr in zip(t, d, strict=True)
             for lt, ls in zip(log_softmax(tr, tau), log_softmax(sr, tau), strict=True)) / len(t)
    soft = 0.5 * ce(c, [0, 1]) + 0.5 * tau * tau * kl
    got = distillation_loss(cls, dist, labels, teacher, soft=True, tau=tau).item()
    assert got == pytest.approx(soft, rel=1e-6)


def test_teacher_gets_no_gradients(workspace):
    params = load_params(workspace / "params.yaml")
    teacher, _ = load_teacher(workspace / "data/teachers/resnet", "alignment", params, 4)
    student = build_model("deit", params, 4)
    student.set_distilled_training(True)
    module = Classifier(student, lr=1e-3, weight_decay=0.0, warmup_steps=0, total_steps=2, teacher=teacher)
    x = torch.randn(8, 3, 16, 16)
    data = DataLoader(TensorDataset(x, torch.arange(8) % 4), batch_size=8)
    L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
              enable_model_summary=False, accelerator="cpu").fit(module, data)
    assert all(not p.requires_grad and p.grad is None for p in teacher.parameters())
    assert any(p.grad is not None for p in student.parameters())  # the step did backpropagate
    assert not teacher.training


def test_tampered_teacher_is_refused(workspace, tmp_path):
    params = load_params(workspace / "params.yaml")
    teachers = tmp_path / "teachers"
    shutil.copytree(workspace / "data/teachers/resnet", teachers)
    weights = teachers / "alignment/model.pt"
    state = torch.load(weights, weights_only=True)
    key = next(iter(state))
    state[key] = state[key] + 1e-3  # a loadable checkpoint, different weights
    torch.save(state, weights)
    with pytest.raises(StageError, match="sha256"):
        load_teacher(teachers, "alignment", params, 4)
