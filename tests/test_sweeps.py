"""A parallel sweep: ``dvc exp run --queue -S`` twice, ``dvc queue start --jobs 2``, one intact MLflow store; then
docs/usage.md's "Compare experiments" commands on the two experiments it made.

Queued experiments run in copies under ``.dvc/tmp/exps``; with no ``MLFLOW_TRACKING_URI`` set,
pipeline.tracking must resolve those copies back to the repository's own ``mlflow.db``. The comparing commands
work as printed: each exits 0, and an ``exp show`` table has columns beyond ``Experiment``, a row per revision and
values in them (a tiny repository's experiments are what they compare, so the sweep's serve).
"""

from __future__ import annotations

import csv
import io
import shlex
import sqlite3
import subprocess
import time

import pytest
import tiny_repo
from test_readme import readme_commands

pytestmark = pytest.mark.slow

LRS = ["0.001", "0.0005"]  # both away from the tiny repository's own (0.002): two experiments that train


def test_queued_sweep_logs_every_run_to_one_store_and_the_docs_compare_it(copy_reproduced_repo, subtests):
    repo = copy_reproduced_repo
    tiny_repo.git(repo, "add", "-A")
    tiny_repo.git(repo, "commit", "-q", "-m", "baseline reproduced")  # queued runs start from this commit
    env = tiny_repo.env(repo)
    del env["MLFLOW_TRACKING_URI"]  # the default store: <repo>/mlflow.db, found from the temporary copies

    def dvc(*args: str) -> str:
        proc = subprocess.run([str(tiny_repo.VENV_BIN / "dvc"), *args], cwd=repo, env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    for lr in LRS:
        dvc("exp", "run", "--queue", "-S", f"tune.lrs=[{lr}]", "train")  # one lr: no trials, every cell at it
    dvc("queue", "start", "--jobs", "2")
    # each finished experiment leaves a git ref (a cheap poll); DVC's own status (a second of CPU per call, beside
    # the two experiments training) only now and then, to stop at a failure
    deadline, asked = time.monotonic() + 400, time.monotonic()
    while len([r for r in tiny_repo.git(repo, "for-each-ref", "--format=%(refname)", "refs/exps").splitlines()
                if "/celery/" not in r]) < len(LRS):  # the queue's own stash refs live under refs/exps/celery
        if time.monotonic() - asked > 15:
            status, asked = dvc("queue", "status"), time.monotonic()
            assert "Failed" not in status and time.monotonic() < deadline, status
        time.sleep(0.5)
    while any(word in (status := dvc("queue", "status")) for word in ("Queued", "Running")):  # Success may lag
        assert time.monotonic() < deadline, status
        time.sleep(1)
    assert status.count("Success") == len(LRS), status
    dvc("queue", "stop")
    with subtests.test("one store"):
        one_store(repo)
    with subtests.test("the comparing commands"):
        for command in readme_commands():
            prints_a_table(repo, env, command)


def one_store(repo) -> None:
    from mlflow.tracking import MlflowClient

    db = repo / "mlflow.db"
    with sqlite3.connect(db) as con:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    exp = client.get_experiment_by_name("bias-train")
    found = {}
    for r in client.search_runs([exp.experiment_id]):
        if r.data.tags.get("arch") == "resnet":
            found.setdefault(r.data.params["train.recipe.lr"], []).append(r.info.status)
    for lr in LRS:
        # per sweep point: resnet's two tasks + the curve grid's run (resnet, alignment, n=32)
        assert found.get(str(float(lr))) == ["FINISHED"] * 3, found
    assert not (repo / ".dvc/tmp/exps/mlflow.db").exists()
    assert not list((repo / ".dvc/tmp/exps").glob("*/mlflow.db"))


def prints_a_table(repo, env: dict[str, str], command: str) -> None:
    argv = shlex.split(command)
    assert argv[0] == "dvc", command
    exp_show = argv[1:3] == ["exp", "show"]
    proc = subprocess.run([str(tiny_repo.VENV_BIN / "dvc"), *argv[1:], *(["--csv"] if exp_show else [])],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{command}: {proc.stderr}"
    if exp_show:
        header, *rows = list(csv.reader(io.StringIO(proc.stdout)))
        assert len(header) > 1 and "Experiment" in header, f"{command}: an empty table ({header})"
        assert len(rows) >= 1 + len(LRS), f"{command}: not a row per revision ({rows})"
        values = [v for row in rows for name, v in zip(header, row, strict=False) if name != "Experiment"]
        assert any(v not in ("", "-") for v in values), f"{command}: every value empty"
