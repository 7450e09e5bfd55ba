"""SIGKILL in the middle of training, then ``dvc repro`` again: exact resume, no orphaned MLflow run.

One tiny repository (tests/conftest.py) with one task and one architecture, long enough (400 steps, a
checkpoint every 20) to be killed between checkpoints, serves both scenarios (one test, a subtest each): a
kill before the first checkpoint (the training stage's program on its own params file and folders, with no
checkpoint at all), whose rerun from scratch is the uninterrupted reference; then a kill between checkpoints
under ``dvc repro``, whose resumed run must equal that reference.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import tiny_repo
import yaml

pytestmark = pytest.mark.slow

OVERRIDES = {
    "tasks": {"names": ["alignment"]},
    # steps 60, 120, ... both checkpoint and validate: a kill may land between the two (tests/test_train.py
    # stops a run exactly there)
    "train": {"archs": {"vit": {"models": "vit", "tasks": ["alignment"]}}, "grids": {},
              "recipe": {"steps": 400, "warmup_steps": 10},
              "runtime": {"checkpoint_every_steps": 20, "val_every_steps": 60}},
    "distill": {"teachers": {}, "students": {}},
}
RUN = Path("alignment/n128-t400-s0-d0-criterion")


def start(repo: Path, args: list[str]) -> subprocess.Popen:
    """A command in its own process group (so SIGKILL reaches DVC and the stage it runs)."""
    return subprocess.Popen(args, cwd=repo, env=tiny_repo.env(repo), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def kill_when(proc: subprocess.Popen, path: Path, timeout: float = 240, ready=None) -> None:
    """SIGKILL the process group once ``path`` exists (and ``ready(path)`` holds, if given)."""
    deadline = time.monotonic() + timeout
    while not (path.exists() and (ready is None or ready(path))):
        if proc.poll() is not None:
            pytest.fail(f"finished (rc {proc.returncode}) before {path} appeared: nothing to interrupt")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"{path} did not appear in {timeout} s")
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def names_a_run(config: Path) -> bool:
    """The run's worker has started and the stage has opened its MLflow run (config.json names it)."""
    return config.exists() and json.loads(config.read_text())["mlflow_run_id"] is not None


def runs(repo: Path) -> dict[str, str]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{repo / 'mlflow.db'}")
    exps = [e.experiment_id for e in client.search_experiments()]
    return {r.info.run_id: r.info.status for r in client.search_runs(exps)}


def curve_steps(repo: Path, run_id: str, min_points: int = 2) -> dict[str, list[int]]:
    """{metric: the steps of its logged points, in order} of the metrics of an MLflow run with at least
    ``min_points`` points (2: the per-step curves, not the final metrics)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{repo / 'mlflow.db'}")
    history = {k: sorted(m.step for m in client.get_metric_history(run_id, k))
               for k in client.get_run(run_id).data.metrics}
    return {k: steps for k, steps in history.items() if len(steps) >= min_points}


def logits(folder: Path) -> np.ndarray:
    with np.load(folder / "predictions.npz") as z:
        return z["logits"]


def train_cmd(params: str, out: str, ckpt: str) -> list[str]:
    return [str(tiny_repo.VENV_BIN / "python"), "-m", "pipeline.stages.train", "--params", params, "--data",
            "data/tasks", "--slices", "data/slices", "--teachers", "data/teachers", "--out", out, "--ckpt", ckpt]


def test_sigkill_mid_training_then_rerun(subtests, make_tiny_repo):
    repo = make_tiny_repo("repo", OVERRIDES)
    tiny_repo.dvc(repo, "repro", "slice@alignment")
    with subtests.test("before the first checkpoint"):
        reference = killed_before_first_checkpoint(repo)
    with subtests.test("between checkpoints, under dvc repro"):
        resumes_exactly(repo, reference)


def resumes_exactly(repo: Path, ref: Path) -> None:
    """``ref``: the same run trained uninterrupted (checkpoints change nothing it computes)."""
    ckpt = repo / "data/ckpt/train/vit" / RUN
    out = repo / "data/runs/vit" / RUN

    proc = start(repo, [str(tiny_repo.VENV_BIN / "dvc"), "repro", "train"])
    # killed once its MLflow run holds curve points: the resumed attempt must not log them again
    kill_when(proc, ckpt / "last.ckpt", ready=lambda _: names_a_run(ckpt / "config.json") and curve_steps(
        repo, json.loads((ckpt / "config.json").read_text())["mlflow_run_id"], min_points=1))
    stamp = json.loads((ckpt / "config.json").read_text())
    assert runs(repo)[stamp["mlflow_run_id"]] == "RUNNING"
    assert not (out / "metrics.json").exists()  # nothing half-done is presented as a result

    tiny_repo.dvc(repo, "repro", "train")
    resumed = json.loads((out / "metrics.json").read_text())
    assert resumed["measured"]["resumed"] and 0 < resumed["measured"]["steps_this_process"] < 400  # mid-training
    assert resumed["mlflow_run_id"] == stamp["mlflow_run_id"]  # the killed run was continued, not orphaned

    reference = json.loads((ref / "metrics.json").read_text())
    assert not reference["measured"]["resumed"]
    assert resumed["slices"] == reference["slices"] and resumed["val_acc"] == reference["val_acc"]
    assert np.array_equal(logits(out), logits(ref))
    # its curves in MLflow: each point once (the first attempt streamed some, the resumed one replays them), as
    # in the uninterrupted run
    assert curve_steps(repo, resumed["mlflow_run_id"]) == curve_steps(repo, reference["mlflow_run_id"])

    assert "RUNNING" not in runs(repo).values()
    assert "train" not in tiny_repo.dvc(repo, "status", "train").stdout  # up to date


def killed_before_first_checkpoint(repo: Path) -> Path:
    """No checkpoint to resume from: the rerun starts over and ends the dead MLflow run as KILLED. Returns the
    rerun's folder: the run of ``params.yaml`` trained uninterrupted, checkpoints aside."""
    run = Path("vit") / RUN
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["train"]["runtime"]["checkpoint_every_steps"] = 100_000  # never reached: killed without a checkpoint
    tiny_repo.write_params(repo / "never.yaml", params)
    cmd = train_cmd("never.yaml", "data/k", "data/k_ckpt")

    proc = start(repo, cmd)
    # config.json names the MLflow run once the run's worker has started and the stage has opened it
    kill_when(proc, repo / "data/k_ckpt" / run / "config.json", ready=names_a_run)
    proc_dead = json.loads((repo / "data/k_ckpt" / run / "config.json").read_text())["mlflow_run_id"]
    assert runs(repo)[proc_dead] == "RUNNING"
    assert not (repo / "data/k" / run / "metrics.json").exists()

    subprocess.run(cmd, cwd=repo, env=tiny_repo.env(repo), check=True, capture_output=True)
    finished = json.loads((repo / "data/k" / run / "metrics.json").read_text())
    status = runs(repo)
    assert status[proc_dead] == "KILLED"
    assert finished["mlflow_run_id"] != proc_dead and status[finished["mlflow_run_id"]] == "FINISHED"
    assert not finished["measured"]["resumed"]
    return repo / "data/k" / run
