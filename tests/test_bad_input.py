"""Bad configurations and inputs: one ``error:`` line naming the key or file, exit 2, nothing touched.

Every case runs a real stage entry point (``main(argv)`` in-process; a few also as a subprocess) on a
private copy of the tiny workspace (tests/conftest.py), after planting a finished result in the stage's
output folder. Afterwards every file in the workspace, the MLflow store included, is byte-identical and
the store still lists the same runs.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import mlflow_store

from pipeline.stages import budget, distill, generate, interface, slice, teacher, train

STAGES = {"train": train, "teacher": teacher, "distill": distill, "generate": generate, "slice": slice,
          "interface": interface, "budget": budget}


def argv(stage: str, ws: Path, **extra: str) -> list[str]:
    """The stage's command line on the workspace (``extra`` replaces an option's value)."""
    d = ws / "data"
    common = {"--params": ws / "params.yaml"}
    per_stage = {
        "train": {"--arch": "resnet", "--data": d / "tasks", "--slices": d / "slices", "--out": d / "runs/resnet",
                  "--ckpt": d / "ckpt/train/resnet"},
        "teacher": {"--arch": "resnet", "--data": d / "tasks", "--slices": d / "slices",
                    "--out": d / "teachers/resnet", "--ckpt": d / "ckpt/teachers/resnet"},
        "distill": {"--student": "deit", "--teachers": d / "teachers/resnet", "--data": d / "tasks",
                    "--slices": d / "slices", "--out": d / "runs/deit", "--ckpt": d / "ckpt/train/deit"},
        "generate": {"--task": "alignment", "--out": d / "tasks/alignment"},
        "slice": {"--task": "alignment", "--data": d / "tasks/alignment", "--out": d / "slices/alignment"},
        "interface": {"--out": d / "interface", "--report": ws / "reports/interface"},
        "budget": {"--report": ws / "reports/budget"},
    }[stage]
    opts = {**common, **per_stage, **{f"--{k}": v for k, v in extra.items()}}
    return [str(x) for kv in opts.items() for x in kv]


def edit(key: str, value) -> Callable[[Path], None]:
    """Set dotted ``key`` of the workspace's params.yaml."""
    def apply(ws: Path) -> None:
        path = ws / "params.yaml"
        params = yaml.safe_load(path.read_text())
        *parents, last = key.split(".")
        node = params
        for k in parents:
            node = node[k]
        node[last] = value
        path.write_text(yaml.safe_dump(params, sort_keys=False))
    return apply


def write(rel: str, content: bytes) -> Callable[[Path], None]:
    return lambda ws: (ws / rel).write_bytes(content)


def remove(rel: str) -> Callable[[Path], None]:
    return lambda ws: (ws / rel).unlink()


def append(rel: str, content: bytes) -> Callable[[Path], None]:
    def apply(ws: Path) -> None:
        with open(ws / rel, "ab") as fh:
            fh.write(content)
    return apply


def tamper_labels(ws: Path) -> None:
    path = ws / "data/tasks/alignment/labels.npy"
    labels = np.load(path)
    labels[0] = (labels[0] + 1) % 4  # a valid file whose content no longer matches meta.json's sha256
    np.save(path, labels)


@dataclass(frozen=True)
class Case:
    id: str
    stage: str
    setup: Callable[[Path], None]
    expect: tuple[str, ...]  # substrings of the error line (the key or file it names)
    args: tuple[tuple[str, str], ...] = ()


TEACHER = "data/teachers/resnet/alignment"
CASES = [
    # malformed or missing params.yaml
    Case("yaml-malformed", "train", write("params.yaml", b"geometry: [16, 4\nseed: 0\n"),
         ("params.yaml", "malformed YAML")),
    Case("params-missing", "generate", lambda ws: None, ("nope.yaml", "not found"), (("params", "nope.yaml"),)),
    Case("params-not-mapping", "slice", write("params.yaml", b"- 1\n- 2\n"), ("params.yaml", "top level")),
    # wrong types and values
    Case("unknown-key", "budget", edit("geometry.colour", 3), ("geometry.colour", "unknown key")),
    Case("lr-string", "train", edit("train.recipe.lr", "fast"), ("train.recipe.lr",)),
    Case("seed-float", "generate", edit("seed", 1.5), ("seed",)),
    Case("steps-bool", "teacher", edit("train.recipe.steps", True), ("train.recipe.steps",)),
    Case("batch-negative", "train", edit("train.recipe.batch_size", -4), ("train.recipe.batch_size",)),
    Case("warmup-too-long", "train", edit("train.recipe.warmup_steps", 50), ("train.recipe.warmup_steps",)),
    # impossible geometry
    Case("patch-not-dividing", "interface", edit("geometry.patch_size", 5), ("geometry.patch_size",)),
    Case("swin-window-too-big", "budget", edit("models.swin.window_size", 16), ("models.swin.window_size",)),
    Case("interface-heads", "interface", edit("interface.num_heads", 3), ("interface.num_heads",)),
    # unknown architecture or task
    Case("arch-unknown-in-params", "train", edit("train.archs", {"resnet": "resnet", "bogus": "vit"}),
         ("train.archs.bogus",)),
    Case("arch-unknown-cli", "train", lambda ws: None, ("train.archs", "bogus"), (("arch", "bogus"),)),
    Case("task-unknown", "generate", edit("tasks.names", ["alignment", "bogus"]), ("tasks.names",)),
    Case("task-not-enabled-cli", "generate", lambda ws: None, ("tasks.names", "relation"), (("task", "relation"),)),
    Case("train-task-not-generated", "train", edit("train.tasks", ["alignment", "scale"]), ("train.tasks",)),
    Case("student-unknown", "distill", lambda ws: None, ("distill.students", "nobody"), (("student", "nobody"),)),
    Case("teacher-unknown", "teacher", lambda ws: None, ("distill.teachers", "vit"), (("arch", "vit"),)),
    # empty, overlapping or impossible slices
    Case("slices-empty", "slice", edit("slice.train_sizes", []), ("slice.train_sizes",)),
    Case("slices-overlapping", "slice", edit("slice.train_sizes", [64, 64]), ("slice.train_sizes",)),
    Case("train-size-not-sliced", "train", edit("train.size", 100), ("train.size",)),
    Case("slice-exceeds-pool", "slice", edit("slice.test_size", 5000), ("slice.test_size",)),
    # missing or corrupt dataset files
    Case("images-missing", "train", remove("data/tasks/alignment/images.npy"), ("images.npy", "missing")),
    Case("images-corrupt", "train", write("data/tasks/alignment/images.npy", b"\x93NUMPY garbage"),
         ("images.npy", "unreadable")),
    Case("indices-missing", "train", remove("data/slices/alignment/indices.npz"), ("indices.npz",)),
    Case("indices-corrupt", "train", write("data/slices/alignment/indices.npz", b"PK\x03\x04 not a zip"),
         ("indices.npz", "unreadable")),
    Case("labels-corrupt", "slice", write("data/tasks/alignment/labels.npy", b"junk"), ("alignment",)),
    Case("labels-tampered", "slice", tamper_labels, ("labels.npy", "sha256")),
    # teacher checkpoint missing or tampered
    Case("teacher-missing", "distill", remove(f"{TEACHER}/model.pt"), ("model.pt", "missing")),
    Case("teacher-tampered", "distill", append(f"{TEACHER}/model.pt", b"\0"), ("model.pt", "sha256")),
    Case("teacher-provenance-corrupt", "distill", write(f"{TEACHER}/provenance.json", b"{"),
         ("provenance.json",)),
]


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.name.endswith(".lock")}


def mlflow_runs(folder: Path) -> set[tuple[str, str]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}")
    exps = [e.experiment_id for e in client.search_experiments()]
    return {(r.info.run_id, r.info.status) for r in client.search_runs(exps)}


def plant_results(ws: Path) -> None:
    """A finished result in every stage's output folder, which a failing stage must leave alone."""
    src = ws / TEACHER
    for dest in ("data/runs/resnet/alignment/n128/s0", "data/runs/deit/alignment/n128/s0", "data/interface",
                 "reports/budget", "reports/interface"):
        shutil.copytree(src, ws / dest, dirs_exist_ok=True)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case, copy_workspace, capsys):
    ws = copy_workspace
    plant_results(ws)
    case.setup(ws)
    files, runs = snapshot(ws), mlflow_runs(ws)
    capsys.readouterr()
    with mlflow_store(ws):
        code = STAGES[case.stage].main(argv(case.stage, ws, **dict(case.args)))
    err = capsys.readouterr().err
    assert code == 2
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for needle in case.expect:
        assert needle in lines[0], f"{needle!r} not named in {lines[0]!r}"
    assert snapshot(ws) == files
    assert mlflow_runs(ws) == runs


def run_stage(stage: str, args: list[str], ws: Path, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{ws / 'mlflow.db'}"}
    return subprocess.run([*prefix, sys.executable, "-m", f"pipeline.stages.{stage}", *args], env=env,
                          capture_output=True, text=True, timeout=120)


SUBPROCESS = ["yaml-malformed", "images-corrupt", "teacher-tampered"]


@pytest.mark.parametrize("case", [c for c in CASES if c.id in SUBPROCESS], ids=SUBPROCESS)
def test_bad_input_as_process(case, copy_workspace):
    """The same through ``python -m``: nothing else (no warning, no traceback) reaches stderr."""
    ws = copy_workspace
    case.setup(ws)
    files = snapshot(ws)
    proc = run_stage(case.stage, argv(case.stage, ws, **dict(case.args)), ws)
    assert proc.returncode == 2
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert all(n in proc.stderr for n in case.expect)
    assert snapshot(ws) == files


def _read_only(folder: Path) -> tuple[tuple[str, ...], str]:
    """A command prefix that makes ``folder`` unwritable for the stage (root ignores file modes, so as root a
    read-only bind mount in a private mount namespace), and the message expected."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return (), "permission denied"
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"]).returncode:
        pytest.skip("running as root without user namespaces: cannot make a folder unwritable")
    script = f'mount --bind -o ro "{folder}" "{folder}" && exec "$0" "$@"'
    return ("unshare", "-rm", "sh", "-c", script), "read-only file system"


def test_unwritable_output_folder(copy_workspace):
    ws = copy_workspace
    out = ws / "readonly"
    out.mkdir()
    prefix, why = _read_only(out)
    files = snapshot(ws)
    try:
        proc = run_stage("generate", argv("generate", ws, out=str(out / "alignment")), ws, prefix)
    finally:
        out.chmod(0o755)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("error: "), proc.stderr
    assert str(out) in proc.stderr and why in proc.stderr
    assert snapshot(ws) == files


def test_other_os_errors_are_not_hidden():
    """Only unwritable outputs become one-line errors; any other OSError is a bug and keeps its traceback."""
    from pipeline.stages.common import stage_main

    @stage_main
    def broken(argv):
        raise OSError(errno.EIO, "disk on fire")

    with pytest.raises(OSError, match="disk on fire"):
        broken([])
