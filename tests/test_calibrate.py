"""``python -m bench.calibrate`` runs on the pipeline's own executor: every cell gets every learning rate."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import mlflow_store

from bench import calibrate

pytestmark = pytest.mark.slow


def test_every_cell_gets_the_same_trials_and_each_its_own_lr(copy_workspace, tmp_path):
    from mlflow.tracking import MlflowClient

    ws, out = copy_workspace, tmp_path / "calibration"
    with mlflow_store(ws):
        assert calibrate.main(["--params", str(ws / "params.yaml"), "--lrs", "1e-3", "4e-3", "--tasks", "alignment",
                               "--data", str(ws / "data/tasks"), "--slices", str(ws / "data/slices"),
                               "--out", str(out)]) == 0
    table = pd.read_csv(out / "calibration.csv")
    trials = sorted(zip(table.arch, table.lr, strict=True))
    assert trials == [("resnet", 1e-3), ("resnet", 4e-3), ("vit", 1e-3), ("vit", 4e-3)]
    assert table.val_acc.between(0, 1).all() and (table.task == "alignment").all()
    assert "val acc @ lr 0.004" in (out / "calibration.md").read_text()
    client = MlflowClient(tracking_uri=f"sqlite:///{ws / 'mlflow.db'}")
    exp = client.get_experiment_by_name("bias-calibrate")
    logged = [r.data.params for r in client.search_runs([exp.experiment_id]) if "mlflow.parentRunId" in r.data.tags]
    assert sorted(float(p["train.recipe.lr"]) for p in logged) == [1e-3, 1e-3, 4e-3, 4e-3]  # the trial's own lr
