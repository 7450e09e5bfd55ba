"""Shared fixtures for the tests that run the real pipeline on tiny inputs (see tests/tiny_repo.py).

Fixtures that build whole pipelines are session-scoped and READ-ONLY; a test that changes one works on its
own copy:
- ``workspace`` (session, read-only): a folder with a tiny ``params.yaml``, the ``alignment`` task's data and
  slices and a trained ``resnet`` teacher, made by calling the stage entry points in-process, with its own
  MLflow store. ``copy_workspace`` is a private writable copy.
- ``reproduced_repo`` (session, read-only): a tiny copy of the repository after one full ``dvc repro``, made by
  ``bias smoke --keep`` (so the smoke command's own test reads that run's output, ``smoke_run``, instead of
  repeating it), one per pytest run (shared by the xdist workers, started in the background as soon as a selected
  test needs it). ``copy_reproduced_repo`` is a private writable copy (git history, DVC cache and MLflow store
  included).
- ``make_tiny_repo``: a fresh tiny copy of the repository (committed, nothing reproduced).
"""

from __future__ import annotations

# ruff: noqa: E402 (the thread variables below are set before anything imports numpy)
import os

# One BLAS/OpenMP thread per test worker (and the stages it starts): two xdist workers on two cores, each with
# two spinning threads, made a floors fit 4x slower (152 s vs 34 s, 2026-12-07). Set before numpy loads.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
# The commands the tests start write bytecode, as Python does by default (PYTHONDONTWRITEBYTECODE, set where this
# project is developed, hid it): stages then leave __pycache__ folders inside the folders DVC hashes as dependencies
# (pipeline/families, pipeline/report, ...), and test_e2e's second repro runs stages again unless .dvcignore keeps
# them out.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

import json
import shutil
import subprocess
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest
import tiny_repo  # tests/ is on sys.path (pytest's rootdir-less test folder), like this conftest
from filelock import FileLock, Timeout

_BASETEMP: list[Path] = []  # this worker's pytest temporary folder (the empty store's template lives there)


@pytest.fixture(scope="session", autouse=True)
def _basetemp(tmp_path_factory) -> None:
    _BASETEMP.append(tmp_path_factory.getbasetemp())


def empty_store(folder: Path) -> None:
    """``folder/mlflow.db``: an empty MLflow store, copied from one MLflow created once per worker (creating the
    tables takes ~1.5 s of CPU, a copy a few ms; both are the store a stage creates where none exists)."""
    template = _BASETEMP[0] / "empty-mlflow.db"
    if not template.exists():  # its Default experiment's artifacts would go beside it (the pipeline never uses it)
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        SqlAlchemyStore(f"sqlite:///{template}", (template.parent / "mlruns").as_uri()).engine.dispose()
    shutil.copyfile(template, folder / "mlflow.db")


@contextmanager
def mlflow_store(folder: Path):
    """Point MLflow at ``folder/mlflow.db`` (an empty store where none is): the variable (pipeline.tracking reads it
    at call time) and MLflow's own global URI, which Lightning's MLFlowLogger sets in this process and which MLflow
    prefers to the variable (a ``models:/`` lookup after a training test in the same worker went to that test's
    store)."""
    import mlflow

    if not os.path.lexists(folder / "mlflow.db"):  # a test's own store (a link, a folder, garbage) stays as it is
        empty_store(folder)
    old = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(f"sqlite:///{folder / 'mlflow.db'}")  # sets the variable as well
    try:
        yield
    finally:
        mlflow.set_tracking_uri(None)  # no global left behind; it also unsets the variable
        if old is not None:
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


class Reproduced:
    """One ``reproduced_repo`` per pytest run, shared by the xdist workers and built in the background.

    The first worker whose tests need it starts ``dvc repro`` in a thread (the work runs in DVC's
    subprocesses) and goes on with its other tests; a lock file held during the build makes every other
    user wait for it, and whoever takes the lock first builds if nobody has.
    """

    def __init__(self, tmp_path_factory):
        base = tmp_path_factory.getbasetemp()
        root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the run's folder, all workers
        self.repo, self.done, self.failed = root / "reproduced/repo", root / "reproduced.done", root / "reproduced.err"
        self.record = root / "reproduced.smoke.json"  # what `bias smoke` printed, and the checkout before and after
        self.lock = FileLock(root / "reproduced.lock")

    def build(self, wait: bool) -> None:
        try:
            self.lock.acquire(timeout=-1 if wait else 0)
        except Timeout:
            return  # another worker is building it
        try:
            if not (self.done.exists() or self.failed.exists()):
                before = checkout_status()
                proc = subprocess.run([str(tiny_repo.VENV_BIN / "bias"), "smoke", "--keep", str(self.repo)],
                                      cwd=tiny_repo.ROOT, capture_output=True, text=True, timeout=900)
                self.record.write_text(json.dumps({"returncode": proc.returncode, "stdout": proc.stdout,
                                                   "stderr": proc.stderr, "before": before,
                                                   "after": checkout_status()}))
                if proc.returncode:
                    raise RuntimeError(f"bias smoke failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
                self.done.touch()
        except Exception as err:  # noqa: BLE001 (every user of the fixture reports it)
            self.failed.write_text(f"{type(err).__name__}: {err}")
        finally:
            self.lock.release()

    def get(self) -> Path:
        self.build(wait=True)
        if self.failed.exists():
            raise RuntimeError(f"reproduced_repo: the tiny dvc repro failed: {self.failed.read_text()}")
        return self.repo


def checkout_status() -> str:
    """``git status`` of the repository the tests run from, untracked files included."""
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=tiny_repo.ROOT,
                          capture_output=True, text=True, check=True).stdout


# Fixtures that train (the teacher in ``workspace``, every stage in ``reproduced_repo``): their users are ``slow``.
TRAINING_FIXTURES = {"workspace", "copy_workspace", "reproduced_repo", "copy_reproduced_repo"}


def pytest_collection_modifyitems(config, items):
    """Mark the users of a training fixture ``slow``, and order the tests for ``--dist worksteal`` (the Makefile's),
    which first splits the list into one contiguous share per worker: each share gets its part of every kind, the
    slow ones first, so no worker is left with a long one at the end, and the tests on ``reproduced_repo`` last, so
    its background build has finished when a worker reaches them (ordered by kind only, a worker got fast tests
    and then those, and waited ~35 s for the build). Files keep their order within a kind."""
    for item in items:
        if TRAINING_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.slow)
    kinds = [[i for i in items if ("reproduced_repo" in i.fixturenames, i.get_closest_marker("slow") is None) == k]
             for k in ((False, False), (False, True), (True, False), (True, True))]
    workers = getattr(config, "workerinput", {}).get("workercount", 1)
    items[:] = [i for w in range(workers) for kind in kinds for i in kind[len(kind) * w // workers:
                                                                            len(kind) * (w + 1) // workers]]


@pytest.fixture(autouse=True)
def _fast_tests_train_nothing(request, monkeypatch):
    """``make test-fast`` (``-m "not slow"``) trains nothing: an unmarked test that fits a model fails here,
    naming itself, instead of quietly making the fast loop slow."""
    if request.node.get_closest_marker("slow") is None:
        # imported here, not at the top: pytest's main process (the xdist controller) imports this file before it
        # starts the workers, and Lightning would delay them by its ~6 s of imports
        import lightning.pytorch

        def refuse(*_args, **_kwargs):
            raise AssertionError(f"{request.node.nodeid} trains a model (Trainer.fit): mark it `slow`")
        monkeypatch.setattr(lightning.pytorch.Trainer, "fit", refuse)


@pytest.fixture(scope="session", autouse=True)
def _reproduce_in_background(request, tmp_path_factory):
    """Start the shared tiny repro as soon as a worker starts, if any selected test needs it."""
    if any("reproduced_repo" in item.fixturenames for item in request.session.items):
        threading.Thread(target=Reproduced(tmp_path_factory).build, args=(False,), daemon=False).start()


@pytest.fixture(scope="session")
def reproduced_repo(tmp_path_factory) -> Path:
    return Reproduced(tmp_path_factory).get()


@pytest.fixture(scope="session")
def smoke_run(reproduced_repo, tmp_path_factory) -> dict:
    """How ``bias smoke --keep`` went when it made ``reproduced_repo``: returncode, stdout, stderr, and the
    checkout's ``git status`` before and after."""
    return json.loads(Reproduced(tmp_path_factory).record.read_text())


@pytest.fixture
def copy_reproduced_repo(reproduced_repo, tmp_path) -> Path:
    """A private, writable copy of ``reproduced_repo`` (commit into it, queue experiments, edit params)."""
    dest = tmp_path / "repo"
    shutil.copytree(reproduced_repo, dest, symlinks=True)
    return dest


@pytest.fixture
def make_tiny_repo(tmp_path):
    """``make_tiny_repo(name, overrides=None)`` -> a committed tiny repository under ``tmp_path``."""
    def make(name: str = "repo", overrides: dict | None = None) -> Path:
        repo = tiny_repo.make_repo(tmp_path / name, overrides)
        empty_store(repo)  # what its first stage would create
        return repo

    return make
