"""MLflow as its users expect, on a real store without training: each run's network a logged model that loads
back, each teacher a registered model version with its provenance, each quantity under one metric key, and
nothing printed. The same through the real train and teacher stages: ``test_a_trained_study_logs_each_metric_once``
(slow)."""

from __future__ import annotations

import sys
import tempfile
from collections import Counter

import pytest
import torch
from conftest import mlflow_store
from test_tracking import edited, stage
from test_tracking_faults import params_for

from pipeline import mlflow_models, tracking
from pipeline.stages import teacher, train


def points(client, run_id: str) -> Counter:
    """How often each (metric, step) is in the store for ``run_id`` (read back, not from what was sent)."""
    return Counter((key, m.step) for key in client.get_run(run_id).data.metrics
                   for m in client.get_metric_history(run_id, key))


def scalars(client, run_id: str) -> dict[tuple[str, str], float]:
    """The run's table artifact read back: ``{(section, name): value}``."""
    import pandas as pd

    with tempfile.TemporaryDirectory() as tmp:
        table = pd.read_csv(client.download_artifacts(run_id, tracking.SCALARS, tmp),
                            float_precision="round_trip")
    assert list(table.columns) == ["section", "name", "value"]
    return {(r.section, r.name): r.value for r in table.itertuples()}


def assert_each_metric_once(client, run_id: str) -> None:
    """Each (key, step) once, and no key that repeats another key's value by construction."""
    seen = points(client, run_id)
    assert seen and max(seen.values()) == 1, [p for p, n in seen.items() if n > 1]
    final = client.get_run(run_id).data.metrics
    repeated = [k for k, other in tracking.ALIASES.items() if k in final and final.get(other) == final[k]]
    assert not repeated, repeated


def test_unaliased_drops_only_a_repeated_value():
    metrics = {"params": 10.0, "budget/params": 10.0, "train_flops": 5.0, "budget/train_flops": 6.0,
               "val_acc": 0.5, "slice/id": 0.25, "acc/id": 0.25, "slice/ood": 0.1}
    kept = tracking.unaliased(metrics, latest={"val/acc": 0.5})
    # budget/train_flops differs from train_flops, slice/ood has no acc/ood: both kept; the repeats dropped
    assert kept == {"params": 10.0, "train_flops": 5.0, "budget/train_flops": 6.0, "acc/id": 0.25,
                    "slice/ood": 0.1}
    assert "val_acc" in tracking.unaliased(metrics, latest={"val/acc": 0.4})  # not the curve's last point
    assert tracking.alias("alignment") == "alignment" and tracking.alias("v2") == "task_v2"


@pytest.mark.slow  # a stage, a store, a browser or a long fit: make test, not test-fast
def test_a_run_logs_a_loadable_model_and_a_teacher_registers_once(tmp_path, monkeypatch, capfd):
    """Through StageRun as the record step calls it: the network is a READY logged model (Models tab) linked
    to the run as its output, with the headline metrics; it loads back from ``models:/``, ``runs:/`` and the
    registry alias, and gives the same outputs. A teacher's provenance registers it once: a resumed record (the
    run reopened) adds no model, no version and no metric point. Nothing is printed."""
    import mlflow.pytorch
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)  # the artifact root (./mlruns) of a fresh store
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3)).eval()
    example = torch.randn(2, 3, 2, 2).numpy()
    series = [{"step": 10, "train/loss": 1.2, "val/acc": 0.4}, {"step": 20, "train/loss": 0.9, "val/acc": 0.5}]
    finals = {"test_acc": 0.6, "val_acc": 0.5, "params": 39.0, "budget/params": 39.0, "acc/id": 0.7,
              "slice/id": 0.7, "slice/dx=0": 0.5}
    opened = {"arch": "resnet", "task": "alignment", "seed": "0", "data_seed": "0", "train_size": "128"}
    params = params_for(uri)
    capfd.readouterr()

    def record(tracker, run_id):
        tracker.log(run_id, metrics=finals, series=series, tags={"data_sha256": "ab"})
        tracker.model(run_id, net, example)
        tracker.log(run_id, tags={"teacher.arch": "resnet", "teacher.task": "alignment", "teacher.seed": 0,
                                  "teacher.mlflow_run_id": run_id, "teacher.test_acc": 0.6,
                                  "teacher.checkpoint_sha256": "cd"})
        tracker.finish(run_id)

    with tracking.stage_run(params, "teacher", "teacher") as tracker:
        run_id = tracker.open("teacher/resnet/s0/alignment", opened, {"lr": 0.1})
        record(tracker, run_id)
    with tracking.stage_run(params, "teacher", "teacher") as tracker:  # a resumed run recorded again
        assert tracker.open("teacher/resnet/s0/alignment", opened, {"lr": 0.1}, run_id=run_id) == run_id
        record(tracker, run_id)
    assert capfd.readouterr() == ("", "")

    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    (model,) = client.search_logged_models([run.info.experiment_id])
    assert (model.name, model.source_run_id, model.status.to_proto()) == ("network", run_id, 2)  # READY
    assert [o.model_id for o in run.outputs.model_outputs] == [model.model_id]
    assert {m.key: m.value for m in model.metrics} == {"test_acc": 0.6, "params": 39.0, "acc/id": 0.7}
    assert model.tags["arch"] == "resnet" and model.tags["task"] == "alignment"
    assert_each_metric_once(client, run_id)
    # the headline numbers and the curves are metrics; the per-slice and budget numbers one table, all of them
    assert set(run.data.metrics) == {"test_acc", "params", "acc/id", "train/loss", "val/acc"}
    table = scalars(client, run_id)
    assert table == {("slice", "id"): 0.7, ("slice", "dx=0"): 0.5, ("budget", "params"): 39.0}  # slices' names
    assert [a.path for a in client.list_artifacts(run_id) if a.path.endswith(".csv")] == [tracking.SCALARS]

    name = f"{params.tracking.experiment_prefix}-teacher-resnet"
    (version,) = client.search_model_versions(f"name = '{name}'")
    assert (version.run_id, version.source, version.tags["checkpoint_sha256"]) == (
        run_id, model.artifact_location, "cd")  # its own artifacts, not a URI resolved elsewhere
    assert version.tags["test_acc"] == "0.6" and version.tags["data_seed"] == "0"
    assert client.get_model_version_by_alias(name, "alignment-s0").version == version.version  # task, teacher seed

    x = torch.from_numpy(example)
    with mlflow_store(tmp_path), torch.no_grad():
        info = mlflow.models.get_model_info(f"models:/{model.model_id}")
        assert info.signature is not None and info.saved_input_example_info is not None
        assert list(info.signature.inputs.to_dict()[0]["tensor-spec"]["shape"]) == [-1, 3, 2, 2]
        for where in (f"models:/{model.model_id}", f"runs:/{run_id}/network", f"models:/{name}@alignment-s0"):
            loaded = mlflow.pytorch.load_model(where)
            assert not loaded.training, where
            torch.testing.assert_close(loaded(x), net(x), msg=where)


@pytest.mark.slow  # a stage, a store, a browser or a long fit: make test, not test-fast
def test_experiment_links_follow_the_server_they_are_served_on(tmp_path):
    """The experiment's description links to its runs view relative to the page (any address, any port); the
    links ``bias ui`` prints carry the address it serves."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    exp_id = tracking.ensure_experiment("bias-train", uri)
    client = MlflowClient(uri)
    note = client.get_experiment(exp_id).tags["mlflow.note.content"]
    assert f"](#/experiments/{exp_id}/runs?{tracking.WORKFLOW_QUERY}&viewStateShareKey=headline)" in note
    assert "http" not in note and "5000" not in note
    assert tracking.experiment_links(uri, "http://127.0.0.1:5123") == [
        ("bias-train", f"http://127.0.0.1:5123/#/experiments/{exp_id}/runs?{tracking.WORKFLOW_QUERY}"
                       "&viewStateShareKey=headline")]
    # a store an older version wrote (a link to port 5000) gets this description when its links are listed
    client.set_experiment_tag(exp_id, "mlflow.note.content", "http://127.0.0.1:5000/#/experiments/1/runs")
    tracking.experiment_links(uri, "http://127.0.0.1:5123")
    assert client.get_experiment(exp_id).tags["mlflow.note.content"] == note


def test_loading_the_model_module_leaves_logging_quiet():
    """mlflow.pytorch's import adds a root log handler and routes Lightning's banners through
    ``pytorch_lightning``'s INFO logger; through tracking it does neither (its modules imported afresh here, on a
    root logger without handlers, as in a stage process)."""
    import logging

    root, banners = logging.getLogger(), logging.getLogger("pytorch_lightning")
    handlers, level = list(root.handlers), banners.level
    for name in [m for m in sys.modules if m == "mlflow.pytorch" or m.startswith("mlflow.pytorch.")]:
        sys.modules.pop(name)
    root.handlers[:] = []
    banners.setLevel(logging.INFO)
    try:
        mlflow_models.mlflow_pytorch()
        assert root.handlers == []
        assert not logging.getLogger("pytorch_lightning.utilities.rank_zero").isEnabledFor(logging.INFO)
    finally:
        root.handlers[:] = handlers
        banners.setLevel(level)


@pytest.mark.slow
def test_a_trained_study_logs_each_metric_once(copy_workspace, monkeypatch, capfd):
    """The real teacher and train stages (a student distilled from the teacher among them): every run's store
    holds each (metric, step) once and no repeated key, lists its network as a logged model, the teacher is a
    registered version, and no Lightning banner or MLflow warning is printed."""
    import yaml
    from mlflow.tracking import MlflowClient

    from pipeline import live_runs

    monkeypatch.setattr(live_runs, "LIVE_EVERY_S", 0.05)  # curves streamed while training: val_acc's repeat too
    monkeypatch.chdir(copy_workspace)
    ws = copy_workspace
    raw = edited(ws)
    full = yaml.safe_load((ws / "params.yaml").read_text())
    raw["train"]["archs"], raw["distill"]["students"] = full["train"]["archs"], full["distill"]["students"]
    capfd.readouterr()
    with mlflow_store(ws):
        assert teacher.main(["--params", str(ws / "params.yaml"), "--data", str(ws / "data/tasks"), "--slices",
                             str(ws / "data/slices"), "--out", str(ws / "data/teachers2"), "--ckpt",
                             str(ws / "data/ckpt/teachers2")]) == 0
        assert train.main(stage(ws, raw)) == 0
    out = "\n".join(capfd.readouterr())
    for noise in ("GPU available", "TPU available", "Tip:", "WARNING", "Warning"):
        assert noise not in out, noise
    client = MlflowClient(tracking_uri=f"sqlite:///{ws / 'mlflow.db'}")
    nested = [r for e in ("bias-teacher", "bias-train")
              for r in client.search_runs([client.get_experiment_by_name(e).experiment_id])
              if "mlflow.parentRunId" in r.data.tags]
    assert len(nested) == 5  # the fixture's teacher, this test's teacher; resnet, vit and the student
    for run in nested:
        assert_each_metric_once(client, run.info.run_id)
    for run in nested:
        assert len(run.outputs.model_outputs) == 1, run.info.run_name
        assert not [k for k in run.data.metrics if k.startswith(tracking.TABLE_PREFIXES)], run.info.run_name
        assert any(section == "slice" for section, _ in scalars(client, run.info.run_id)), run.info.run_name
    versions = client.search_model_versions("name = 'bias-teacher-resnet'")
    assert {v.run_id for v in versions} == {r.info.run_id for r in nested if r.info.run_name.startswith("teacher/")}
