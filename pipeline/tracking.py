"""MLflow at the edges: one sqlite store per repository, one experiment per stage.

The store path is absolute and resolved to the *original* repository even when DVC runs a queued
experiment in a copy under ``.dvc/tmp/exps/``, so every run of a sweep lands in the same store.
Creating a fresh sqlite store from several processes at once corrupts it, so the first creation
(and experiment creation) happens under a file lock.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipeline.config import Params

STORE_NAME = "mlflow.db"


def repo_root(start: str | Path | None = None) -> Path:
    """The repository that owns ``start`` (default: cwd), seen through DVC's temporary experiment copies."""
    path = Path(start or os.getcwd()).resolve()
    parts = path.parts
    for i in range(len(parts) - 3):
        if parts[i : i + 3] == (".dvc", "tmp", "exps"):
            return Path(*parts[:i])
    for candidate in (path, *path.parents):
        if (candidate / "dvc.yaml").exists() or (candidate / ".git").exists():
            return candidate
    return path


def tracking_uri(params: Params | None = None, start: str | Path | None = None) -> str:
    """params ``tracking.tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///<repo>/mlflow.db``."""
    if params is not None and params.tracking.tracking_uri:
        return params.tracking.tracking_uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{repo_root(start) / STORE_NAME}"


@contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    if uri.startswith("sqlite:///"):
        lock = Path(uri.removeprefix("sqlite:///") + ".lock")
        lock.parent.mkdir(parents=True, exist_ok=True)
        with open(lock, "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)
    else:
        yield


def ensure_experiment(name: str, uri: str) -> str:
    """Create (once, under a lock) or fetch the experiment; returns its id."""
    from mlflow.tracking import MlflowClient

    with _store_lock(uri):
        client = MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        return client.create_experiment(name)


def experiment_name(params: Params, stage: str) -> str:
    return f"{params.tracking.experiment_prefix}-{stage}"


def git_commit(cwd: str | Path | None = None) -> str:
    """The checked-out commit (``+dirty`` when tracked files differ), or ``unknown`` outside git."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{sha}+dirty" if dirty else sha


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dict -> ``{"a.b.c": value}`` for MLflow params."""
    out: dict[str, Any] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}{k}."))
    else:
        out[prefix.rstrip(".")] = obj
    return out


@contextmanager
def stage_run(params: Params, stage: str, run_name: str, tags: dict[str, str] | None = None):
    """An MLflow run for one stage invocation; marked FAILED if the block raises."""
    import mlflow

    uri = tracking_uri(params)
    exp_id = ensure_experiment(experiment_name(params, stage), uri)
    mlflow.set_tracking_uri(uri)
    all_tags = {"stage": stage, "git_commit": git_commit(), **(tags or {})}
    with mlflow.start_run(experiment_id=exp_id, run_name=run_name, tags=all_tags) as run:
        yield run


def end_stale_run(run_id: str, uri: str) -> None:
    """Mark a run that can no longer be resumed KILLED (only if it is still RUNNING)."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    try:
        if client.get_run(run_id).info.status == "RUNNING":
            client.set_terminated(run_id, "KILLED")
    except MlflowException:
        pass  # the run was deleted or belongs to another store: nothing to end
