"""Failures at the tracking edge and in workers: one line, exit 2, nothing half-written (tiny workspace)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from conftest import mlflow_store

from pipeline.config import ConfigError, load_params
from pipeline.stages import train

ARGS = ["--data", "data/tasks", "--slices", "data/slices", "--teachers", "data/teachers", "--out", "data/runs",
        "--ckpt", "data/ckpt/train"]


def stage(ws: Path, params: dict | None = None) -> list[str]:
    path = ws / "params.yaml"
    if params is not None:
        path = ws / "edited.yaml"
        path.write_text(yaml.safe_dump(params))
    return ["--params", str(path), *[str(ws / a) if a.startswith("data/") else a for a in ARGS]]


def edited(ws: Path, **recipe) -> dict:
    raw = yaml.safe_load((ws / "params.yaml").read_text())
    raw["train"]["recipe"].update(recipe)
    raw["train"]["runtime"]["workers"] = 1
    raw["train"]["archs"] = {"vit": raw["train"]["archs"]["vit"]}  # one arch, no student: one run
    raw["distill"]["students"] = {}
    return raw


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_infinite_float_is_refused(workspace, tmp_path):
    raw = edited(workspace, lr=float("inf"))
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="train.recipe.lr"):
        load_params(tmp_path / "p.yaml")


def test_garbage_store_is_named_and_kept(copy_workspace, capsys):
    store = copy_workspace / "mlflow.db"
    store.write_bytes(b"this is not a database\x00" * 40)
    before = store.read_bytes()
    with mlflow_store(copy_workspace):
        assert train.main(stage(copy_workspace)) == 2
    line = error_line(capsys)
    assert str(store) in line and "move it aside" in line
    assert store.read_bytes() == before
    assert not (copy_workspace / "data/runs/vit").exists()


def test_unreachable_server_fails_fast(copy_workspace, capsys):
    raw = yaml.safe_load((copy_workspace / "params.yaml").read_text())
    raw["tracking"]["tracking_uri"] = "http://127.0.0.1:9/"
    t0 = time.monotonic()
    assert train.main(stage(copy_workspace, raw)) == 2
    assert time.monotonic() - t0 < 30
    assert "tracking.tracking_uri" in error_line(capsys)
    assert not (copy_workspace / "data/runs/vit").exists()


def test_diverging_run_is_one_line_and_failed(copy_workspace, capsys):
    from mlflow.tracking import MlflowClient

    raw = edited(copy_workspace, lr=1.0e30, grad_clip=0.0)
    stale = copy_workspace / "data/runs/vit/old/s0/metrics.json"  # not in the grid: pruned only on success
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")
    with mlflow_store(copy_workspace):
        assert train.main(stage(copy_workspace, raw)) == 2
    line = error_line(capsys)
    assert "train/vit/alignment/" in line and "at step" in line and "train.recipe.lr=1e+30" in line
    log = Path(line.rsplit("(traceback: ", 1)[1].rstrip(")"))
    assert "FloatingPointError" in log.read_text()
    assert list((copy_workspace / "data/runs/vit").rglob("metrics.json")) == [stale]
    assert [p.name for p in (copy_workspace / "data/ckpt/train").iterdir()] == ["logs"]
    client = MlflowClient(tracking_uri=f"sqlite:///{copy_workspace / 'mlflow.db'}")
    exp = client.get_experiment_by_name("bias-train")
    status = {r.info.run_name: r.info.status for r in client.search_runs([exp.experiment_id])}
    assert status["train"] == "FAILED"
    assert [s for n, s in status.items() if n.startswith("train/vit/")] == ["FAILED"]


def test_git_commit_is_dirty_only_when_what_decides_results_changed(tmp_path, monkeypatch):
    import subprocess

    from pipeline.repository import git_commit

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    for rel in ("pipeline/x.py", "params.yaml", "constraints.txt", "dvc.lock", "reports/README.md"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("a\n")
    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "x")
    monkeypatch.chdir(tmp_path)
    sha = git_commit()
    (tmp_path / "dvc.lock").write_text("b\n")  # a repro rewrites its outputs: still the commit it ran
    (tmp_path / "reports/README.md").write_text("b\n")
    assert git_commit() == sha and "+" not in sha
    for rel in ("params.yaml", "constraints.txt"):  # each alone decides results
        git("checkout", "-q", "--", ".")
        (tmp_path / rel).write_text("b\n")
        assert git_commit() == f"{sha}+dirty", rel


@pytest.mark.slow  # a stage, a store, a browser or a long fit: make test, not test-fast
def test_live_runs_open_when_the_worker_starts_and_stream_while_it_trains(tmp_path):
    """A run waiting for a worker has no MLflow run; once the worker stamps its start, the run is opened with that
    start time (its duration is not its wait in the pool) and config.json names it. Points the worker appends
    are in the run before it ends, each once; a line still being written waits for the next poll."""
    from mlflow.tracking import MlflowClient
    from test_tracking_faults import params_for

    from pipeline import tracking
    from pipeline.live_runs import STARTED, LiveRuns, Opening

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    live = tmp_path / "live.jsonl"
    client = MlflowClient(tracking_uri=uri)
    with tracking.stage_run(params_for(uri), "train", "train") as run:
        runs = LiveRuns(run, every_s=3600)  # polled by hand here
        runs.watch(Opening("train/vit/alignment/s0", tmp_path, "abc", {"arch": "vit"}, {"lr": 0.001}))
        runs.poll()
        assert runs.opened("train/vit/alignment/s0") is None  # queued: nothing in MLflow yet
        assert len(client.search_runs([run.experiment_id])) == 1  # the stage's parent run only

        started = time.time() - 120  # the worker began two minutes before this poll
        (tmp_path / STARTED).write_text(json.dumps({"started": started}))
        live.write_text('{"step": 0, "train/loss": 1.5, "lr": 0.001}\n{"step": 100, "val/acc": 0.5')
        runs.poll()
        run_id = runs.opened("train/vit/alignment/s0")
        info = client.get_run(run_id)
        assert info.info.start_time == int(1000 * started) and info.info.status == "RUNNING"
        assert info.data.tags["arch"] == "vit" and info.data.params["lr"] == "0.001"
        assert json.loads((tmp_path / "config.json").read_text()) == {"identity": "abc", "mlflow_run_id": run_id}
        assert [m.value for m in client.get_metric_history(run_id, "train/loss")] == [1.5]
        assert client.get_metric_history(run_id, "val/acc") == []  # half a line: not yet
        with live.open("a") as f:
            f.write(', "val/loss": 0.7}\n')
        runs.poll()
        assert [(m.step, m.value) for m in client.get_metric_history(run_id, "val/acc")] == [(100, 0.5)]
        assert runs.done("train/vit/alignment/s0") == (
            run_id, {(0, "train/loss"), (0, "lr"), (100, "val/acc"), (100, "val/loss")})
        run.finish(run_id)


def test_a_trained_run_logs_each_curve_point_once(copy_workspace, monkeypatch):
    """Through the real train stage (streamed while it trains, the rest with the final record): every
    validation point is in the run's history exactly once, and the live file is gone with the checkpoints."""
    from mlflow.tracking import MlflowClient

    from pipeline import live_runs

    monkeypatch.setattr(live_runs, "LIVE_EVERY_S", 0.05)
    raw = edited(copy_workspace)
    with mlflow_store(copy_workspace):
        assert train.main(stage(copy_workspace, raw)) == 0
    client = MlflowClient(tracking_uri=f"sqlite:///{copy_workspace / 'mlflow.db'}")
    exp = client.get_experiment_by_name("bias-train")
    (run,) = [r for r in client.search_runs([exp.experiment_id]) if r.info.run_name.startswith("train/vit/")]
    metrics = json.loads(next((copy_workspace / "data/runs/vit").rglob("metrics.json")).read_text())
    history = client.get_metric_history(run.info.run_id, "val/acc")
    assert sorted(m.step for m in history) == [r["step"] for r in metrics["curve"]]
    losses = client.get_metric_history(run.info.run_id, "train/loss")
    assert len({m.timestamp for m in losses}) > 1  # arrived over time, not all with the final record
    assert not list((copy_workspace / "data/ckpt/train").rglob(live_runs.LIVE))


def test_a_queued_run_is_timed_from_its_own_start(copy_workspace):
    """Two runs on one worker: the second waits for the first, yet its MLflow run starts when its worker does, so
    the UI's duration is the run's own (the worker's time and the record), not its wait in the pool."""
    from mlflow.tracking import MlflowClient

    raw = edited(copy_workspace)
    raw["train"]["archs"] = yaml.safe_load((copy_workspace / "params.yaml").read_text())["train"]["archs"]
    with mlflow_store(copy_workspace):
        assert train.main(stage(copy_workspace, raw)) == 0
    client = MlflowClient(tracking_uri=f"sqlite:///{copy_workspace / 'mlflow.db'}")
    exp = client.get_experiment_by_name("bias-train")
    runs = sorted((r for r in client.search_runs([exp.experiment_id]) if "mlflow.parentRunId" in r.data.tags),
                  key=lambda r: r.info.start_time)
    assert len(runs) == 2
    worker_s = [json.loads(next((copy_workspace / "data/runs" / r.data.tags["arch"]).rglob("metrics.json"))
                           .read_text())["measured"]["run_s"] for r in runs]
    first, second = runs
    # what tells the two designs apart: opened at submission, both runs would start within milliseconds
    assert second.info.start_time >= first.info.start_time + 1000 * worker_s[0]  # not opened while it waited
    for run, own in zip(runs, worker_s, strict=True):  # the worker's time plus the record's few seconds
        duration = (run.info.end_time - run.info.start_time) / 1000
        assert own <= duration < own + 5, (run.info.run_name, duration, own)


def test_every_run_logs_its_network_and_datasets(copy_workspace):
    """The run's MLflow model loads back and reproduces the run's own test logits; its dataset inputs carry
    the training subset's and the pool's hashes from metrics.json."""
    import mlflow.pytorch
    import numpy as np
    import torch
    from mlflow.tracking import MlflowClient

    from pipeline.predict import to_tensor

    with mlflow_store(copy_workspace):
        assert train.main(stage(copy_workspace, edited(copy_workspace))) == 0
    uri = f"sqlite:///{copy_workspace / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("bias-train")
    (run,) = [r for r in client.search_runs([exp.experiment_id]) if r.info.run_name.startswith("train/vit/")]
    folder = next((copy_workspace / "data/runs/vit").rglob("metrics.json")).parent
    metrics = json.loads((folder / "metrics.json").read_text())
    inputs = {d.dataset.name: d for d in run.inputs.dataset_inputs}
    train_set = inputs["alignment/train_128"]
    assert [t.value for t in train_set.tags if t.key == "mlflow.data.context"] == ["training"]
    assert json.loads(train_set.dataset.profile)["train_slice_sha256"] == metrics["provenance"]["train_slice_sha256"]
    assert inputs["alignment/pool"].dataset.digest == metrics["provenance"]["data_sha256"][:32]
    with mlflow_store(copy_workspace):
        net = mlflow.pytorch.load_model(f"runs:/{run.info.run_id}/network").eval()
    with np.load(folder / "predictions.npz") as z:
        index, logits = z["index"], z["logits"]
    images = np.load(copy_workspace / "data/tasks/alignment/images.npy")[index]
    with torch.no_grad():
        again = net(to_tensor(images)).numpy()
    np.testing.assert_allclose(again, logits, rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # a stage, a store, a browser or a long fit: make test, not test-fast
def test_a_run_its_stage_left_running_is_ended_by_the_next_stage(tmp_path):
    """A stage that died with a run open, whose checkpoint stamp can no longer name that run (a garbled
    config.json), would leave it RUNNING for good: the next stage of the experiment ends it KILLED, and leaves a
    run of a stage that is still alive alone."""
    from mlflow.tracking import MlflowClient
    from test_tracking_faults import params_for

    from pipeline import tracking

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    with tracking.stage_run(params_for(uri), "train", "train") as first:
        orphan = first.open("train/vit/alignment/s0", {}, {})
        first_parent = first.run_id
    client.update_run(orphan, status="RUNNING")  # as a SIGKILL between opening and finishing leaves it
    with tracking.stage_run(params_for(uri), "train", "train") as second:
        assert client.get_run(orphan).info.status == "KILLED"
        assert client.get_run(first_parent).info.status != "RUNNING"
        mine = second.open("train/vit/alignment/s1", {}, {})
        with tracking.stage_run(params_for(uri), "train", "train-probe"):  # a live stage's run is not an orphan
            assert client.get_run(mine).info.status == "RUNNING"
        second.finish(mine)
