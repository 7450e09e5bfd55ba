"""Shared fixtures for the tests that run the real pipeline on tiny inputs (see tests/tiny_repo.py).

Fixtures that build whole pipelines are session-scoped and READ-ONLY; a test that changes one works on its
own copy:
- ``workspace`` (session, read-only): a folder with a tiny ``params.yaml``, the ``alignment`` task's data and
  slices and a trained ``resnet`` teacher, made by calling the stage entry points in-process, with its own
  MLflow store. ``copy_workspace`` is a private writable copy.
- ``reproduced_repo`` (session, read-only): a tiny copy of the repository after one full ``dvc repro``.
  ``copy_reproduced_repo`` is a private writable copy (git history, DVC cache and MLflow store included).
- ``make_tiny_repo``: a fresh tiny copy of the repository (committed, nothing reproduced).
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import pytest
import tiny_repo  # tests/ is on sys.path (pytest's rootdir-less test folder), like this conftest


@contextmanager
def mlflow_store(folder: Path):
    """Point MLflow (pipeline.tracking reads the variable at call time) at ``folder/mlflow.db``."""
    old = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{folder / 'mlflow.db'}"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = old


@pytest.fixture(scope="session")
def workspace(tmp_path_factory) -> Path:
    """``params.yaml``, ``data/tasks/alignment``, ``data/slices/alignment``, ``data/teachers/resnet``,
    ``mlflow.db``: the inputs of the train stage (a student's teacher included), for one task."""
    from pipeline.stages import generate, slice, teacher

    ws = tmp_path_factory.mktemp("workspace")
    params = tiny_repo.params_with({"tasks": {"names": ["alignment"]}, "train": {
        "archs": {a: {"models": a, "tasks": ["alignment"]} for a in ("vit", "resnet")}, "grids": {}}})
    tiny_repo.write_params(ws / "params.yaml", params)
    p = str(ws / "params.yaml")
    assert generate.main(["--params", p, "--task", "alignment", "--out", str(ws / "data/tasks/alignment")]) == 0
    assert slice.main(["--params", p, "--task", "alignment", "--data", str(ws / "data/tasks/alignment"),
                       "--out", str(ws / "data/slices/alignment")]) == 0
    with mlflow_store(ws):
        assert teacher.main(["--params", p, "--data", str(ws / "data/tasks"), "--slices", str(ws / "data/slices"),
                             "--out", str(ws / "data/teachers"), "--ckpt", str(ws / "data/ckpt/teachers")]) == 0
    return ws


@pytest.fixture
def copy_workspace(workspace, tmp_path) -> Path:
    """A private, writable copy of ``workspace``."""
    dest = tmp_path / "ws"
    shutil.copytree(workspace, dest)
    return dest


@pytest.fixture(scope="session")
def reproduced_repo(tmp_path_factory) -> Path:
    repo = tiny_repo.make_repo(tmp_path_factory.mktemp("repro") / "repo")
    tiny_repo.dvc(repo, "repro", timeout=900)
    return repo


@pytest.fixture
def copy_reproduced_repo(reproduced_repo, tmp_path) -> Path:
    """A private, writable copy of ``reproduced_repo`` (commit into it, queue experiments, edit params)."""
    dest = tmp_path / "repo"
    shutil.copytree(reproduced_repo, dest, symlinks=True)
    return dest


@pytest.fixture
def make_tiny_repo(tmp_path):
    """``make_tiny_repo(name, overrides=None)`` -> a committed tiny repository under ``tmp_path``."""
    return lambda name="repo", overrides=None: tiny_repo.make_repo(tmp_path / name, overrides)
