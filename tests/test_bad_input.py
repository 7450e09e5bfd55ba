"""Bad configurations and inputs: one ``error:`` line naming the key or file, exit 2, nothing touched.

Every case runs a real stage entry point (``main(argv)`` in-process; a few also as a subprocess below), or the
``bias`` command (``pipeline.cli.main``, in the workspace), on a private copy of the tiny workspace
(tests/conftest.py), after planting a finished result in each stage's output folder. Afterwards every entry of
the workspace is as it was: each file byte-identical (the MLflow store included, so it lists the same runs), no
folder, FIFO or link added or removed (so nothing half-written is left). A case still running after its
``limit`` seconds fails as hung (a blocking read); ``fsize`` runs the stage under a file-size limit (a disk that
fills up). Unwritable destinations, a second stage on the same outputs and two concurrent ``dvc repro`` are
separate tests below; a store locked by another writer (sqlite's 20 s wait) is in tests/test_tracking_faults.py.
Cases marked ``xfail`` name the file whose fix they wait for, and the fix, in their reason: the lead deletes
the mark once that fix is merged (``strict``: an unexpected pass fails).

The table (``TABLE``), 330 cases by class (test_the_docstring_counts_each_class keeps these counts true):
- params.yaml itself: 18 cases
- params: wrong type: 26 cases
- params: out of range or not finite: 41 cases
- params: unknown or missing key: 16 cases
- params: contradictory keys: 31 cases
- params: unknown or unsafe names: 14 cases
- params: sizes beyond the machine: 20 cases
- profiles (overlays): 14 cases
- data: missing, truncated, corrupt: 21 cases
- data: special files: 15 cases
- data: JSON shapes, NaN, infinities: 14 cases
- data: array headers, pickled arrays: 9 cases
- data: wrong dtype, shape, values; tampered; stale: 20 cases
- checkpoints: 13 cases
- CIFAR-10 archive: 3 cases
- MLflow store: 12 cases
- full disk: 5 cases
- environment: 16 cases
- command lines (stages, bias): 22 cases
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tiny_repo
import yaml
from conftest import mlflow_store

from pipeline import cli
from pipeline.stages import budget, generate, interface, slice, teacher, train, validate

STAGES = {"train": train, "teacher": teacher, "generate": generate, "slice": slice,
          "interface": interface, "budget": budget, "validate": validate}


def argv(stage: str, ws: Path, **extra: str) -> list[str]:
    """The stage's command line on the workspace (``extra`` replaces an option's value)."""
    d = ws / "data"
    common = {"--params": ws / "params.yaml"}
    per_stage = {
        "train": {"--data": d / "tasks", "--slices": d / "slices", "--teachers": d / "teachers", "--out": d / "runs",
                  "--ckpt": d / "ckpt/train"},
        "teacher": {"--data": d / "tasks", "--slices": d / "slices", "--out": d / "teachers",
                    "--ckpt": d / "ckpt/teachers"},
        "generate": {"--task": "alignment", "--out": d / "tasks/alignment"},
        "slice": {"--task": "alignment", "--data": d / "tasks/alignment", "--out": d / "slices/alignment"},
        "interface": {"--out": d / "interface", "--report": ws / "reports/interface"},
        "budget": {"--report": ws / "reports/budget"},
        "validate": {"--out": d / "validated.txt"},
    }[stage]
    opts = {**common, **per_stage, **{f"--{k}": v for k, v in extra.items()}}
    return [str(x) for kv in opts.items() for x in kv]


def _change(key: str, change: Callable[[dict, str], None]) -> Callable[[Path], None]:
    """Apply ``change(parent, last)`` at dotted ``key`` of the workspace's params.yaml."""
    def apply(ws: Path) -> None:
        path = ws / "params.yaml"
        params = yaml.safe_load(path.read_text())
        *parents, last = key.split(".")
        node = params
        for k in parents:
            node = node[k]
        change(node, last)
        path.write_text(yaml.safe_dump(params, sort_keys=False))
    return apply


def edit(key: str, value) -> Callable[[Path], None]:
    """Set dotted ``key`` of the workspace's params.yaml."""
    return _change(key, lambda node, last: node.__setitem__(last, value))


def drop(key: str) -> Callable[[Path], None]:
    """Remove dotted ``key`` from the workspace's params.yaml."""
    return _change(key, lambda node, last: node.__delitem__(last))


def write(rel: str, content: bytes) -> Callable[[Path], None]:
    def apply(ws: Path) -> None:
        (ws / rel).write_bytes(content)
    return apply


def remove(rel: str) -> Callable[[Path], None]:
    return lambda ws: (ws / rel).unlink()


def append(rel: str, content: bytes) -> Callable[[Path], None]:
    def apply(ws: Path) -> None:
        with open(ws / rel, "ab") as fh:
            fh.write(content)
    return apply


def truncate(rel: str) -> Callable[[Path], None]:
    def apply(ws: Path) -> None:
        data = (ws / rel).read_bytes()
        (ws / rel).write_bytes(data[: len(data) // 2])
    return apply


def cut(rel: str, size: int) -> Callable[[Path], None]:
    """Keep the first ``size`` bytes of ``rel``."""
    def apply(ws: Path) -> None:
        (ws / rel).write_bytes((ws / rel).read_bytes()[:size])
    return apply


def overwrite(rel: str, at: int, content: bytes) -> Callable[[Path], None]:
    """``content`` written over ``rel`` at byte ``at`` (its length kept)."""
    def apply(ws: Path) -> None:
        data = bytearray((ws / rel).read_bytes())
        data[at:at + len(content)] = content
        (ws / rel).write_bytes(bytes(data))
    return apply


def both(*steps: Callable[[Path], None]) -> Callable[[Path], None]:
    def apply(ws: Path) -> None:
        for step in steps:
            step(ws)
    return apply


def regenerate_data(ws: Path) -> None:
    """Valid task data from another run (another seed): the slices and the teacher now describe other images."""
    other = ws / "other.yaml"
    params = yaml.safe_load((ws / "params.yaml").read_text())
    params["seed"] += 1
    other.write_text(yaml.safe_dump(params, sort_keys=False))
    out = ws / "data/tasks/alignment"
    assert generate.main(["--params", str(other), "--task", "alignment", "--out", str(out)]) == 0
    other.unlink()


def reslice(ws: Path) -> None:
    """Slice the (regenerated) task data again: the slices match, the teacher still describes the old images."""
    out = ws / "data/slices/alignment"
    shutil.rmtree(out)
    assert slice.main(["--params", str(ws / "params.yaml"), "--task", "alignment",
                             "--data", str(ws / "data/tasks/alignment"), "--out", str(out)]) == 0


def images_as_float(ws: Path) -> None:
    path = ws / "data/tasks/alignment/images.npy"
    np.save(path, np.load(path).astype(np.float32))  # a readable array of the wrong type


def teacher_wrong_format(ws: Path) -> None:
    """A weights file that is not a checkpoint, with a provenance record that matches it (so sha256 passes)."""
    weights, record = ws / TEACHER / "weights.pt", ws / TEACHER / "provenance.json"
    weights.write_bytes(b"not a torch checkpoint\n")
    prov = json.loads(record.read_text())
    prov["checkpoint_sha256"] = hashlib.sha256(weights.read_bytes()).hexdigest()
    record.write_text(json.dumps(prov))


def natural(path: str | Callable[[Path], str]) -> Callable[[Path], None]:
    """Enable the CIFAR-10 task with ``tasks.natural.path`` (a path, or a function making the file)."""
    def apply(ws: Path) -> None:
        value = path(ws) if callable(path) else path
        edit("tasks.names", ["alignment", "natural"])(ws)
        edit("tasks.natural.path", value)(ws)
        edit("tasks.natural.per_class_train", 2)(ws)
        edit("tasks.natural.per_class_test", 1)(ws)
    return apply


def garbage_archive(ws: Path) -> str:
    (ws / "cifar.tar.gz").write_bytes(b"this is not a tar archive\n" * 20)
    return str(ws / "cifar.tar.gz")


def truncated_archive(ws: Path) -> str:
    """A real gzip'd tar cut in half (a download that stopped)."""
    src = ws / "cifar_src"
    (src / "train/cat").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(4):
        (src / f"train/cat/{i:04d}.jpg").write_bytes(rng.integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with tarfile.open(ws / "cifar.tar.gz", "w:gz") as tar:
        tar.add(src, arcname=".")
    shutil.rmtree(src)
    truncate("cifar.tar.gz")(ws)
    return str(ws / "cifar.tar.gz")


def tamper_labels(ws: Path) -> None:
    path = ws / "data/tasks/alignment/labels.npy"
    labels = np.load(path)
    labels[0] = (labels[0] + 1) % 4  # a valid file whose content no longer matches meta.json's sha256
    np.save(path, labels)


def tamper_index(name: str, change: Callable[[np.ndarray], None]) -> Callable[[Path], None]:
    """Rewrite one index array of alignment's indices.npz in place (a valid file the manifest no longer matches)."""
    def setup(ws: Path) -> None:
        path = ws / "data/slices/alignment/indices.npz"
        with np.load(path) as z:
            arrays = {k: z[k].copy() for k in z.files}
        change(arrays[name])
        np.savez(path, **arrays)
    return setup


def store_as_folder(ws: Path) -> None:
    (ws / "mlflow.db").unlink()
    (ws / "mlflow.db").mkdir()


def drop_role(ws: Path) -> None:
    import pandas as pd

    path = ws / "data/tasks/alignment/factors.csv"
    pd.read_csv(path, keep_default_na=False).drop(columns="role").to_csv(path, index=False)


def forge_label(ws: Path) -> None:
    """A label outside the task's classes, with meta.json's hash forged to match: only a range check sees it."""
    path, meta_path = ws / "data/tasks/alignment/labels.npy", ws / "data/tasks/alignment/meta.json"
    labels = np.load(path)
    labels[5] = 7
    np.save(path, labels)
    meta = json.loads(meta_path.read_text())
    meta["sha256"]["labels"] = hashlib.sha256(labels.tobytes()).hexdigest()
    meta_path.write_text(json.dumps(meta))


def forge_overlap(ws: Path) -> None:
    """train_128 replaced by test images, the manifest's hash forged to match: only a disjointness check sees it."""
    path, man_path = ws / "data/slices/alignment/indices.npz", ws / "data/slices/alignment/manifest.json"
    with np.load(path) as z:
        arrays = {k: z[k].copy() for k in z.files}
    arrays["train_128"] = np.sort(arrays["test"][:128]).astype(np.int64)
    np.savez(path, **arrays)
    manifest = json.loads(man_path.read_text())
    manifest["arrays"]["train_128"]["sha256"] = hashlib.sha256(arrays["train_128"].tobytes()).hexdigest()
    man_path.write_text(json.dumps(manifest))


def drop_index(name: str) -> Callable[[Path], None]:
    """Remove one array from alignment's indices.npz, the manifest left as it was."""
    def setup(ws: Path) -> None:
        path = ws / "data/slices/alignment/indices.npz"
        with np.load(path) as z:
            arrays = {k: z[k].copy() for k in z.files if k != name}
        np.savez(path, **arrays)
    return setup


def labels_as_matrix(ws: Path) -> None:
    """Labels of the right count in a (N, 1) array, meta.json's hash forged to match: a shape check sees it."""
    path, meta_path = ws / "data/tasks/alignment/labels.npy", ws / "data/tasks/alignment/meta.json"
    labels = np.load(path)[:, None]
    np.save(path, labels)
    meta = json.loads(meta_path.read_text())
    meta["sha256"]["labels"] = hashlib.sha256(labels.tobytes()).hexdigest()
    meta_path.write_text(json.dumps(meta))


def tamper_images(ws: Path) -> None:
    path = ws / "data/tasks/alignment/images.npy"
    images = np.load(path)
    images[0, 0, 0, 0] ^= 1  # one bit of one pixel
    np.save(path, images)


DROP = object()


def reshape(rel: str, key: str, value=DROP) -> Callable[[Path], None]:
    """Set (or drop) top-level ``key`` of a JSON file: valid JSON of another shape than pipeline.schemas says."""
    def apply(ws: Path) -> None:
        path = ws / rel
        obj = json.loads(path.read_text())
        if value is DROP:
            del obj[key]
        else:
            obj[key] = value
        path.write_text(json.dumps(obj))
    return apply


def recode(encoding: str) -> Callable[[Path], None]:
    """params.yaml's own text saved in another encoding."""
    def apply(ws: Path) -> None:
        path = ws / "params.yaml"
        path.write_bytes(path.read_text().encode(encoding))
    return apply


def duplicate_recipe_lr(ws: Path) -> None:
    """A second ``lr:`` inside train.recipe (yaml.safe_load would keep the later one)."""
    path = ws / "params.yaml"
    text = path.read_text()
    assert text.count("\n  recipe:\n") == 1
    path.write_text(text.replace("\n  recipe:\n", "\n  recipe:\n    lr: 0.5\n"))


# --- issue 57's classes: special files, forged headers, NaN in JSON, unsafe pickles, overlays, the bias CLI ---

def fifo(rel: str) -> Callable[[Path], None]:
    """A named pipe in place of an input (reading it with no writer would block for ever)."""
    def apply(ws: Path) -> None:
        path = ws / rel
        if path.exists():
            path.unlink()
        os.mkfifo(path)
    return apply


def folder(rel: str) -> Callable[[Path], None]:
    """A folder in place of an input file."""
    def apply(ws: Path) -> None:
        (ws / rel).unlink()
        (ws / rel).mkdir()
    return apply


def link(rel: str, target: str) -> Callable[[Path], None]:
    """``rel`` replaced by a symbolic link to ``target`` (a device such as /dev/zero, or ``rel`` itself: a loop)."""
    def apply(ws: Path) -> None:
        path = ws / rel
        if path.exists() or path.is_symlink():
            path.unlink()
        path.symlink_to(target if target.startswith("/") else ws / target)
    return apply


def socket_file(rel: str) -> Callable[[Path], None]:
    """A unix socket (nobody listening) in place of an input."""
    def apply(ws: Path) -> None:
        import socket

        path = ws / rel
        path.unlink()
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(path))
    return apply


def forged_npy(shape: tuple[int, ...], dtype: str = "|u1", held: int = 16) -> bytes:
    """A .npy whose header declares ``shape`` but holds ``held`` bytes (a forged or damaged header)."""
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": False, "shape": shape})
    return buf.getvalue() + bytes(held)


def forged_member(name: str, shape: tuple[int, ...], dtype: str = "<i8") -> Callable[[Path], None]:
    """alignment's indices.npz with member ``name`` replaced by a forged header (the other members kept)."""
    def apply(ws: Path) -> None:
        import zipfile

        path = ws / "data/slices/alignment/indices.npz"
        with zipfile.ZipFile(path) as z:
            members = {i.filename: z.read(i) for i in z.infolist()}
        members[f"{name}.npy"] = forged_npy(shape, dtype, 64)
        with zipfile.ZipFile(path, "w") as z:
            for member, data in members.items():
                z.writestr(member, data)
    return apply


def forge_array(rel: str, change: Callable[[np.ndarray], np.ndarray], key: str = "",
                pickle: bool = False) -> Callable[[Path], None]:
    """Replace the task array ``rel`` by ``change(array)``, meta.json's sha256 ``key`` forged to match (when
    given): only a check of the array itself can see it."""
    def apply(ws: Path) -> None:
        path, meta_path = ws / rel, ws / "data/tasks/alignment/meta.json"
        array = change(np.load(path))
        np.save(path, array, allow_pickle=pickle)
        if key:
            meta = json.loads(meta_path.read_text())
            meta["sha256"][key] = hashlib.sha256(array.tobytes()).hexdigest()
            meta_path.write_text(json.dumps(meta))
    return apply


def damage_middle(rel: str, size: int = 8192) -> Callable[[Path], None]:
    """``size`` bytes of garbage written over the middle of ``rel`` (its length and header kept)."""
    def apply(ws: Path) -> None:
        data = bytearray((ws / rel).read_bytes())
        middle = len(data) // 2
        data[middle:middle + size] = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes()
        (ws / rel).write_bytes(bytes(data))
    return apply


def teacher_weights(content: bytes | Callable[[Path], None]) -> Callable[[Path], None]:
    """The teacher's weights.pt replaced, provenance.json's checkpoint_sha256 forged to match (so the hash passes
    and the loader itself must refuse it)."""
    def apply(ws: Path) -> None:
        weights, record = ws / TEACHER / "weights.pt", ws / TEACHER / "provenance.json"
        if callable(content):
            content(weights)
        else:
            weights.write_bytes(content)
        prov = json.loads(record.read_text())
        prov["checkpoint_sha256"] = hashlib.sha256(weights.read_bytes()).hexdigest()
        record.write_text(json.dumps(prov))
    return apply


class Payload:
    """Unpickled, it would run a shell command (creating a file the snapshot would see): a hostile checkpoint."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def malicious(weights: Path) -> None:
    import torch

    torch.save({"model": Payload(weights.parent / "pwned")}, weights)


def pickled_path(weights: Path) -> None:
    """A checkpoint that pickles an object of a class torch does not allow (harmless here, but not tensors)."""
    import torch

    torch.save({"model": weights.parent}, weights)


def other_arch_weights(weights: Path) -> None:
    """A real torch checkpoint of another model's tensors (loads safely, fits no resnet)."""
    import torch

    torch.save({"head.weight": torch.zeros(3, 3)}, weights)


def truncated_zip_checkpoint(weights: Path) -> None:
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 3])


def overlay(text: str | bytes, name: str = "mine") -> Callable[[Path], None]:
    """A repository around the workspace (dvc.yaml, profiles/) with ``profiles/<name>.yaml`` holding ``text``."""
    def apply(ws: Path) -> None:
        (ws / "dvc.yaml").write_text("stages: {}\n")
        (ws / "profiles").mkdir(exist_ok=True)
        (ws / "profiles" / f"{name}.yaml").write_bytes(text.encode() if isinstance(text, str) else text)
    return apply


def banner_server(banner: bytes) -> Callable[[Path], dict[str, str]]:
    """A loopback server that greets every connection with ``banner`` (not a Dask scheduler), named by
    DASK_SCHEDULER_ADDRESS: the setup's returned variables are set for the stage."""
    def apply(ws: Path) -> dict[str, str]:
        import socket
        import threading

        server = socket.create_server(("127.0.0.1", 0))
        server.settimeout(30)  # the thread ends with the case (the stage connects once, at once)

        def serve() -> None:
            with server:
                while True:
                    try:
                        conn, _ = server.accept()
                    except OSError:  # the timeout included
                        return
                    with conn:
                        conn.sendall(banner)

        threading.Thread(target=serve, daemon=True).start()
        return {"DASK_SCHEDULER_ADDRESS": f"tcp://127.0.0.1:{server.getsockname()[1]}"}
    return apply


@dataclass(frozen=True)
class Case:
    id: str
    stage: str
    setup: Callable[[Path], None]
    expect: tuple[str, ...]  # substrings of the error line (the key or file it names)
    args: tuple[tuple[str, str], ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # environment variables set for the stage ("{ws}" -> workspace)
    xfail: str = ""  # whose fix this case waits for
    slow: bool = False
    cli: tuple[str, ...] = ()  # stage "bias": the command line, run in the workspace
    limit: int = 60  # seconds before the case counts as hung (a blocking read)
    fsize: int | None = None  # a file-size limit (bytes) while the stage runs: a disk that fills up


TEACHER = "data/teachers/resnet/s0/alignment"
NAN, INF = float("nan"), float("inf")
META, MANIFEST = "data/tasks/alignment/meta.json", "data/slices/alignment/manifest.json"
IMAGES, LABELS = "data/tasks/alignment/images.npy", "data/tasks/alignment/labels.npy"
INDICES, FACTORS = "data/slices/alignment/indices.npz", "data/tasks/alignment/factors.csv"
PROVENANCE, WEIGHTS = f"{TEACHER}/provenance.json", f"{TEACHER}/weights.pt"

PARAMS_FILE = [  # params.yaml itself: missing, malformed, mis-encoded, not a file, YAML that must not run or expand
    Case("yaml-malformed", "train", write("params.yaml", b"geometry: [16, 4\nseed: 0\n"),
         ("params.yaml", "malformed YAML")),
    Case("params-missing", "generate", lambda ws: None, ("nope.yaml", "not found"), (("params", "nope.yaml"),)),
    Case("params-not-mapping", "slice", write("params.yaml", b"- 1\n- 2\n"), ("params.yaml", "top level")),
    Case("params-duplicate-key", "generate", append("params.yaml", b"seed: 1\n"),
         ("params.yaml", "duplicate key 'seed'", "lines 1 and")),
    Case("params-duplicate-nested-key", "train", duplicate_recipe_lr, ("params.yaml", "duplicate key 'lr'")),
    Case("params-utf16", "slice", recode("utf-16"), ("params.yaml", "UTF-16")),
    Case("params-utf16-no-bom", "budget", recode("utf-16-le"), ("params.yaml", "NUL bytes")),
    Case("params-latin1", "train", append("params.yaml", b"# caf\xe9\n"),
         ("params.yaml", "not UTF-8")),
    Case("params-binary", "interface", write("params.yaml", bytes(range(256)) * 4), ("params.yaml", "NUL bytes")),
    Case("params-directory", "teacher", lambda ws: None, ("data/tasks", "not a file"), (("params", "data/tasks"),)),
    Case("params-empty", "generate", write("params.yaml", b"{}\n"), ("params.yaml",)),
    Case("params-fifo", "validate", fifo("params.yaml"), ("params.yaml", "FIFO")),
    Case("params-dev-zero", "validate", link("params.yaml", "/dev/zero"), ("params.yaml", "character device")),
    Case("params-link-loop", "validate", link("params.yaml", "params.yaml"), ("params.yaml",)),
    Case("params-empty-file", "validate", write("params.yaml", b""), ("params.yaml",)),
    Case("params-python-tag", "validate", append("params.yaml", b"evil: !!python/object/apply:os.system ['true']\n"),
         ("params.yaml",)),
    Case("params-tab-indent", "validate", append("params.yaml", b"extra:\n\tkey: 1\n"), ("params.yaml",)),
    Case("params-alias-bomb", "validate", append("params.yaml", b"a: &a [x, x, x, x, x, x, x, x, x]\n"
                                                  b"b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                                                  b"c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
                                                  b"d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
                                                  b"e: [*d, *d, *d, *d, *d, *d, *d, *d, *d]\n"), ("params.yaml",)),
]


WRONG_TYPE = [  # params: a value of the wrong type
    Case("lr-string", "train", edit("train.recipe.lr", "fast"), ("train.recipe.lr",)),
    Case("seed-float", "generate", edit("seed", 1.5), ("seed",)),
    Case("steps-bool", "teacher", edit("train.recipe.steps", True), ("train.recipe.steps",)),
    Case("image-size-string", "generate", edit("geometry.image_size", "16"), ("geometry.image_size",)),
    Case("seeds-not-a-list", "train", edit("train.seeds", 0), ("train.seeds",)),
    Case("task-names-string", "generate", edit("tasks.names", "alignment"), ("tasks.names",)),
    Case("train-sizes-float", "slice", edit("slice.train_sizes", [64.5, 128]), ("slice.train_sizes",)),
    Case("devices-word", "teacher", edit("train.runtime.devices", "many"), ("train.runtime.devices",)),
    Case("accelerator-unknown", "teacher", edit("train.runtime.accelerator", "quantum"),
         ("train.runtime.accelerator",)),
    Case("precision-unknown", "teacher", edit("train.runtime.precision", "fp7"), ("train.runtime.precision",)),
    Case("vit-depth-string", "validate", edit("models.vit.depth", "two"), ("models.vit.depth",)),
    Case("embed-dim-list", "interface", edit("interface.embed_dim", [16]), ("interface.embed_dim",)),
    Case("patch-size-bool", "validate", edit("geometry.patch_size", True), ("geometry.patch_size",)),
    Case("seeds-strings", "train", edit("train.seeds", ["0"]), ("train.seeds",)),
    Case("pool-size-float", "generate", edit("tasks.alignment.n", 400.5), ("tasks.alignment.n",)),
    Case("warmup-float", "train", edit("train.recipe.warmup_steps", 2.5), ("train.recipe.warmup_steps",)),
    Case("swin-depths-string", "budget", edit("models.swin.depths", "2,2"), ("models.swin.depths",)),
    Case("experiment-prefix-int", "validate", edit("tracking.experiment_prefix", 7), ("tracking.experiment_prefix",)),
    Case("confidence-string", "validate", edit("report.confidence", "high"), ("report.confidence",)),
    Case("students-a-list", "train", edit("distill.students", ["deit"]), ("distill.students",)),
    Case("archs-a-list", "validate", edit("train.archs", ["vit"]), ("train.archs",)),
    Case("recipe-null", "train", edit("train.recipe", None), ("train.recipe",)),
    Case("tune-lrs-string", "validate", edit("tune.lrs", "0.002"), ("tune.lrs",)),
    Case("soft-string", "validate", edit("distill.soft", "yes"), ("distill.soft",)),
    Case("mlp-ratio-list", "budget", edit("models.vit.mlp_ratio", [2.0]), ("models.vit.mlp_ratio",)),
    Case("interpolation-unknown", "validate", edit("evaluation.resolution.interpolation", "magic"),
         ("evaluation.resolution.interpolation",)),
]


OUT_OF_RANGE = [  # params: a number out of range or not finite
    Case("batch-negative", "train", edit("train.recipe.batch_size", -4), ("train.recipe.batch_size",)),
    Case("seed-above-lightning", "generate", edit("seed", 2**32), ("seed", "4294967296", "seed range")),
    Case("train-seed-above-lightning", "train", edit("train.seeds", [0, 2**32]), ("train.seeds", "seed range")),
    Case("grid-seed-above-lightning", "train", edit("train.grids", {"more": {"seeds": [2**33]}}),
         ("train.grids.more.seeds", "seed range")),
    Case("teacher-seed-above-lightning", "teacher", edit("distill.teacher_seeds", [0, 2**32 + 5]),
         ("distill.teacher_seeds", "seed range")),
    Case("lr-inf", "train", edit("train.recipe.lr", float("inf")), ("train.recipe.lr",)),
    Case("lr-nan", "train", edit("train.recipe.lr", float("nan")), ("train.recipe.lr",)),
    Case("lr-zero", "train", edit("train.recipe.lr", 0.0), ("train.recipe.lr",)),
    Case("weight-decay-negative", "train", edit("train.recipe.weight_decay", -0.1), ("train.recipe.weight_decay",)),
    Case("label-smoothing-one", "teacher", edit("train.recipe.label_smoothing", 1.0),
         ("train.recipe.label_smoothing",)),
    Case("min-lr-ratio-above-one", "train", edit("train.recipe.min_lr_ratio", 1.5), ("train.recipe.min_lr_ratio",)),
    Case("grad-clip-nan", "train", edit("train.recipe.grad_clip", float("nan")), ("train.recipe.grad_clip",)),
    Case("workers-zero", "train", edit("train.runtime.workers", 0), ("train.runtime.workers",)),
    Case("image-size-inf", "budget", edit("geometry.image_size", float("inf")), ("geometry.image_size",)),
    Case("pool-size-zero", "generate", edit("tasks.alignment.n", 0), ("tasks.alignment.n",)),
    Case("param-target-negative", "budget", edit("models.param_target", -1), ("models.param_target",)),
    Case("param-tolerance-nan", "budget", edit("models.param_tolerance", float("nan")), ("models.param_tolerance",)),
    Case("threads-huge", "teacher", edit("train.runtime.threads", 10**6), ("train.runtime.threads",)),
    Case("seed-negative", "generate", edit("seed", -1), ("seed",)),
    Case("steps-zero", "train", edit("train.recipe.steps", 0), ("train.recipe.steps",)),
    Case("label-smoothing-negative", "teacher", edit("train.recipe.label_smoothing", -0.1),
         ("train.recipe.label_smoothing",)),
    Case("lr-negative", "validate", edit("train.recipe.lr", -0.001), ("train.recipe.lr",)),
    Case("eval-fraction-one", "generate", edit("tasks.alignment.eval_fraction", 1.0),
         ("tasks.alignment.eval_fraction",)),
    Case("noise-negative", "generate", edit("tasks.alignment.noise", -1), ("tasks.alignment.noise",)),
    Case("num-classes-one", "generate", edit("tasks.alignment.num_classes", 1), ("tasks.alignment.num_classes",)),
    Case("confidence-above-one", "validate", edit("report.confidence", 1.5), ("report.confidence",)),
    Case("equivalence-margin-negative", "validate", edit("report.equivalence_margin", -0.01),
         ("report.equivalence_margin",)),
    Case("power-zero", "validate", edit("report.power", 0), ("report.power",)),
    Case("tau-zero", "validate", edit("distill.tau", 0), ("distill.tau",)),
    Case("tau-inf", "validate", edit("distill.tau", INF), ("distill.tau",)),
    Case("patience-negative", "validate", edit("train.criterion.patience", -1), ("train.criterion.patience",)),
    Case("criterion-accuracy-above-one", "validate", edit("train.criterion.accuracy", 1.2),
         ("train.criterion.accuracy",)),
    Case("val-every-zero", "validate", edit("train.runtime.val_every_steps", 0), ("train.runtime.val_every_steps",)),
    Case("eval-batch-zero", "validate", edit("train.runtime.eval_batch_size", 0), ("train.runtime.eval_batch_size",)),
    Case("zoom-negative", "validate", edit("evaluation.subgroups.zoom", [-0.5, 1.0]), ("evaluation.subgroups.zoom",)),
    Case("resolution-size-zero", "validate", edit("evaluation.resolution.sizes", [0, 16]),
         ("evaluation.resolution.sizes",)),
    Case("finetune-lr-nan", "validate", edit("finetune.lr", NAN), ("finetune.lr",)),
    Case("learn-fraction-above-one", "validate", edit("report.learn_fraction", 1.5), ("report.learn_fraction",)),
    Case("plan-max-seeds-zero", "validate", edit("plan.max_seeds", 0), ("plan.max_seeds",)),
    Case("weight-decay-inf", "validate", edit("train.recipe.weight_decay", INF), ("train.recipe.weight_decay",)),
    Case("bootstrap-zero", "validate", edit("report.bootstrap_samples", 0), ("report.bootstrap_samples",)),
]


UNKNOWN_OR_MISSING = [  # params: an unknown key, or a key or section missing (no hidden defaults)
    Case("unknown-key", "budget", edit("geometry.colour", 3), ("geometry.colour", "unknown key")),
    Case("section-missing", "generate", drop("slice"), ("slice",)),
    Case("key-missing", "train", drop("train.recipe.lr"), ("train.recipe.lr",)),
    Case("unknown-top-level", "validate", edit("colour", 3), ("colour", "unknown key")),
    Case("unknown-in-recipe", "train", edit("train.recipe.momentum", 0.9), ("train.recipe.momentum",)),
    Case("unknown-in-vit", "budget", edit("models.vit.dropout", 0.1), ("models.vit.dropout",)),
    Case("unknown-in-tracking", "validate", edit("tracking.password", "x"), ("tracking.password",)),
    Case("unknown-in-interface", "interface", edit("interface.bogus", 1), ("interface.bogus",)),
    Case("unknown-in-task", "generate", edit("tasks.alignment.colour", 2), ("tasks.alignment.colour",)),
    Case("unknown-in-runtime", "teacher", edit("train.runtime.gpus", 4), ("train.runtime.gpus",)),
    Case("misspelt-seeds", "validate", both(drop("train.seeds"), edit("train.seed", [0])), ("train.seed",)),
    Case("unknown-in-student", "train", edit("distill.students", {"deit": {"teacher": "resnet", "temperature": 2}}),
         ("distill.students.deit", "temperature")),
    Case("key-missing-interface", "validate", drop("interface.embed_dim"), ("interface.embed_dim",)),
    Case("key-missing-models", "budget", drop("models.vit.depth"), ("models.vit.depth",)),
    Case("section-missing-tracking", "validate", drop("tracking"), ("tracking",)),
    Case("section-null", "validate", edit("slice", None), ("slice",)),
]


CONTRADICTORY = [  # params: keys that contradict each other
    Case("warmup-too-long", "train", edit("train.recipe.warmup_steps", 50), ("train.recipe.warmup_steps",)),
    Case("batch-above-train-size", "train", edit("train.recipe.batch_size", 129),
         ("train.recipe.batch_size", "train.size = 128")),
    Case("batch-above-grid-size", "train", both(edit("train.grids", {"small": {"sizes": [64]}}),
                                                edit("train.recipe.batch_size", 65)),
         ("train.recipe.batch_size", "train.grids.small.sizes = 64")),
    Case("batch-above-teacher-set", "teacher", both(edit("slice.train_sizes", [64, 128, 160]),
                                                    edit("distill.teacher_size", 160),
                                                    edit("train.recipe.batch_size", 33)),
         ("train.recipe.batch_size", "distill.teacher_size - train.size = 32")),
    Case("patch-not-dividing", "interface", edit("geometry.patch_size", 5), ("geometry.patch_size",)),
    Case("swin-window-too-big", "budget", edit("models.swin.window_size", 16), ("models.swin.window_size",)),
    Case("interface-heads", "interface", edit("interface.num_heads", 3), ("interface.num_heads",)),
    Case("swin-heads-per-stage", "budget", edit("models.swin.num_heads", [2]), ("models.swin.num_heads", "depths")),
    Case("task-names-duplicate", "generate", edit("tasks.names", ["alignment", "alignment"]),
         ("tasks.names", "duplicate")),
    Case("slices-empty", "slice", edit("slice.train_sizes", []), ("slice.train_sizes",)),
    Case("slices-overlapping", "slice", edit("slice.train_sizes", [64, 64]), ("slice.train_sizes",)),
    Case("train-size-not-sliced", "train", edit("train.size", 100), ("train.size",)),
    Case("slice-exceeds-pool", "slice", edit("slice.test_size", 5000), ("slice.test_size",)),
    Case("num-nodes-without-launcher", "teacher", edit("train.runtime.num_nodes", 2),
         ("train.runtime.num_nodes", "launcher")),
    Case("student-relabel-without-transfer", "train",
         edit("distill.students", {"deit": {"teacher": "resnet", "targets": "relabel"}}),
         ("distill.students.deit", "needs transfer: true")),
    Case("student-soft-relabel", "train", edit("distill.students", {"deit": {
        "teacher": "resnet", "transfer": True, "targets": "relabel", "soft": True}}),
         ("distill.students.deit", "soft")),
    Case("student-transfer-without-set", "train", both(edit("tasks.alignment.transfer_n", 0), edit(
        "distill.students", {"deit": {"teacher": "resnet", "transfer": True}})),
         ("distill.students.deit.transfer", "no transfer set")),
    Case("student-unknown-targets", "train", edit("distill.students", {"deit": {"teacher": "resnet", "targets": "x"}}),
         ("distill.students.deit", "targets")),
    Case("student-oracle-without-transfer", "train",
         edit("distill.students", {"deit": {"teacher": "resnet", "targets": "truth"}}),
         ("distill.students.deit", "needs transfer: true")),
    Case("teacher-train-exceeds-set", "teacher", edit("distill.teacher_train", 10**6),
         ("distill.teacher_train", "exceeds the teacher set")),
    Case("teacher-seeds-repeated", "teacher", edit("distill.teacher_seeds", [1, 1]),
         ("distill.teacher_seeds", "repeats")),
    Case("teacher-seeds-empty", "teacher", edit("distill.teacher_seeds", []), ("distill.teacher_seeds",)),
    Case("arch-on-no-task", "train", edit("train.archs.resnet.tasks", []), ("train.archs.resnet.tasks",)),
    Case("grid-of-no-arch", "train", edit("train.grids", {"g": {"archs": []}}), ("train.grids.g.archs",)),
    Case("teacher-size-not-sliced", "teacher", edit("distill.teacher_size", 100), ("distill.teacher_size",)),
    Case("distill-task-not-enabled", "train", edit("distill.tasks", ["scale"]), ("distill.tasks",)),
    Case("finetune-task-not-enabled", "validate", edit("finetune.tasks", ["scale"]), ("finetune.tasks",)),
    Case("vit-heads-not-dividing", "budget", edit("models.vit.num_heads", 7),
         ("models.param_target", "widths step by 28", "models.vit")),
    Case("pair-patch-not-dividing", "interface", edit("interface.pair_counts.patch_sizes", [4, 5]),
         ("interface.pair_counts.patch_sizes",)),
    Case("train-size-is-teacher-size", "teacher", edit("train.size", 256), ("train.size",)),
    Case("tune-seed-in-seeds", "validate", edit("tune.seed", 0), ("tune.seed",)),
]


NAMES = [  # params: names that are unknown, or unsafe as paths and MLflow names
    Case("arch-unknown-in-params", "train", edit("train.archs.bogus", {"models": "vit", "tasks": ["alignment"]}),
         ("train.archs.bogus", "unknown architecture")),
    Case("task-unknown", "generate", edit("tasks.names", ["alignment", "bogus"]), ("tasks.names",)),
    Case("train-task-not-generated", "train", edit("train.archs.resnet.tasks", ["alignment", "scale"]),
         ("train.archs.resnet.tasks", "scale")),
    Case("student-teacher-unknown", "train", edit("distill.students.deit", "nobody"), ("distill.students", "nobody")),
    Case("student-named-as-arch", "train", edit("distill.students", {"vit": "resnet"}), ("distill.students", "vit")),
    Case("teacher-unknown", "teacher", edit("distill.teachers.bogus", "vit"), ("distill.teachers", "bogus")),
    Case("student-name-escapes", "train", edit("distill.students", {"../../escaped": "resnet"}),
         ("distill.students", "../../escaped")),
    Case("grid-name-with-slash", "train", edit("train.grids", {"a/b": {"seeds": [0]}}), ("grids.a/b",)),
    Case("experiment-prefix-newline", "teacher", edit("tracking.experiment_prefix", "a\nb"),
         ("tracking.experiment_prefix",)),
    Case("experiment-prefix-escapes", "validate", edit("tracking.experiment_prefix", "../evil"),
         ("tracking.experiment_prefix",)),
    Case("teacher-name-escapes", "teacher", edit("distill.teachers", {"../x": "resnet"}), ("distill.teachers",)),
    Case("arch-name-with-space", "validate", edit("train.archs", {"v it": {"models": "vit", "tasks": ["alignment"]}}),
         ("train.archs.v it", "unknown architecture")),
    Case("grid-name-dotdot", "train", edit("train.grids", {"..": {"seeds": [0]}}), ("grids",)),
    Case("experiment-prefix-nul", "validate", edit("tracking.experiment_prefix", "a\x00b"),
         ("tracking.experiment_prefix",)),
]


SIZES = [  # params: sizes no machine holds, bounded before anything allocates or builds
    Case("pool-beyond-memory", "generate", edit("tasks.alignment.n", 10**12), ("tasks.alignment.n", "GiB", "memory")),
    Case("param-target-beyond-memory", "budget", edit("models.param_target", 10**13),
         ("models.param_target", "GiB", "memory")),
    Case("bootstrap-beyond-memory", "budget", edit("report.bootstrap_samples", 10**12),
         ("report.bootstrap_samples", "GiB", "memory")),
    Case("interface-width-beyond-memory", "interface", edit("interface.widths", [8, 10**9]),
         ("interface.widths", "GiB", "memory")),
    Case("vit-heads-huge", "budget", edit("models.vit.num_heads", 10**6), ("models.vit.num_heads",)),
    Case("vit-depth-huge", "budget", edit("models.vit.depth", 10**7), ("models.vit.depth",)),
    Case("interface-probes-huge", "interface", edit("interface.probes", 10**9), ("interface.probes", "GiB")),
    Case("interface-large-tokens-huge", "interface", edit("interface.large_tokens", 10**9),
         ("interface.large_tokens", "GiB")),
    Case("interface-image-size-huge", "interface", edit("interface.image_size", 2**20),
         ("interface.image_size", "GiB")),
    Case("interface-permutations-huge", "interface", edit("interface.random_permutations", 10**12),
         ("interface.random_permutations",)),
    Case("pair-counts-image-huge", "interface", edit("interface.pair_counts.image_size", 2**40),
         ("interface.pair_counts.image_size",)),
    Case("embed-dim-huge", "interface", edit("interface.embed_dim", 2**20), ("interface.embed_dim", "too large")),
    Case("extra-image-size-huge", "interface", edit("interface.pair_counts.extra_image_sizes", [2**24]),
         ("interface.pair_counts.extra_image_sizes", "too large")),
    Case("resolution-size-huge", "validate", edit("evaluation.resolution.sizes", [16, 2**20]),
         ("evaluation.resolution.sizes", "too large")),
    Case("finetune-size-huge", "validate", both(edit("finetune.tasks", ["alignment"]), edit("finetune.size", 2**16)),
         ("finetune.size", "too large")),
    Case("resnet-layers-huge", "budget", edit("models.resnet.layers", [10**6]), ("models.resnet.layers",)),
    Case("reference-classes-huge", "budget", edit("models.reference_classes", 10**9), ("models.reference_classes",)),
    Case("finetune-batch-huge", "validate", both(edit("finetune.tasks", ["alignment"]),
                                                 edit("finetune.batch_size", 10**9)),
         ("finetune.batch_size", "too large")),
    Case("eval-batch-huge", "validate", edit("train.runtime.eval_batch_size", 10**12),
         ("train.runtime.eval_batch_size", "too large")),
    Case("train-sizes-huge", "slice", edit("slice.train_sizes", [64, 128, 10**12]), ("slice.train_sizes",)),
]


PROFILES = [  # profiles: overlays that cannot compose, or compose into bad params (bias profile NAME)
    Case("profile-unknown-key", "bias", overlay("tracking: {experiment_prefix: bias-mine}\ntrian: {seeds: [1]}\n"),
         ("profiles/mine.yaml", "trian", "not a key"), cli=("profile", "mine")),
    Case("profile-nested-unknown-key", "bias",
         overlay("tracking: {experiment_prefix: bias-mine}\ntrain: {recipe: {lrr: 0.1}}\n"),
         ("profiles/mine.yaml", "train.recipe.lrr"), cli=("profile", "mine")),
    Case("profile-replace-on-a-list", "bias", overlay("train: {seeds: !replace [1]}\n"),
         ("profiles/mine.yaml", "!replace"), cli=("profile", "mine")),
    Case("profile-not-mapping", "bias", overlay("- 1\n"), ("profiles/mine.yaml", "mapping"), cli=("profile", "mine")),
    Case("profile-duplicate-key", "bias", overlay("seed: 1\nseed: 2\n"), ("profiles/mine.yaml", "duplicate key 'seed'"),
         cli=("profile", "mine")),
    Case("profile-malformed", "bias", overlay("train: [1, 2\n"), ("profiles/mine.yaml", "malformed YAML"),
         cli=("profile", "mine")),
    Case("profile-bad-value", "bias", overlay("tracking: {experiment_prefix: bias-mine}\ntrain: {seeds: [-1]}\n"),
         ("profiles/mine.yaml", "train.seeds"), cli=("profile", "mine")),
    Case("profile-default-prefix", "bias", overlay("train: {seeds: [1]}\n"),
         ("profiles/mine.yaml", "tracking.experiment_prefix"), cli=("profile", "mine")),
    Case("profile-name-a-path", "bias", overlay("seed: 1\n"), ("../params", "no such profile"),
         cli=("profile", "../params")),
    Case("profile-unknown-name", "bias", overlay("seed: 1\n"), ("profiles/nope.yaml", "no such profile"),
         cli=("profile", "nope")),
    Case("profile-fifo", "bias", both(overlay("seed: 1\n"), fifo("profiles/mine.yaml")), ("profiles/mine.yaml", "FIFO"),
         cli=("profile", "mine")),
    Case("profile-utf16", "bias", overlay("seed: 1\n".encode("utf-16")), ("profiles/mine.yaml", "UTF-16"),
         cli=("profile", "mine")),
    Case("profile-python-tag", "bias", overlay("seed: !!python/object/apply:os.system ['touch pwned']\n"),
         ("profiles/mine.yaml",), cli=("profile", "mine")),
    Case("profile-base-broken", "bias", both(overlay("seed: 1\n"), write("params.yaml", b"seed: [\n")),
         ("params.yaml", "malformed YAML"), cli=("profile", "mine")),
]


DATA_UNREADABLE = [  # data files: missing, truncated, empty or corrupt
    Case("images-missing", "train", remove("data/tasks/alignment/images.npy"), ("images.npy", "missing")),
    Case("images-corrupt", "train", write("data/tasks/alignment/images.npy", b"\x93NUMPY garbage"),
         ("images.npy", "unreadable")),
    Case("indices-missing", "train", remove("data/slices/alignment/indices.npz"), ("indices.npz",)),
    Case("indices-corrupt", "train", write("data/slices/alignment/indices.npz", b"PK\x03\x04 not a zip"),
         ("indices.npz", "unreadable")),
    Case("labels-corrupt", "slice", write("data/tasks/alignment/labels.npy", b"junk"), ("alignment",)),
    Case("meta-missing", "train", remove("data/tasks/alignment/meta.json"), ("meta.json", "missing")),
    Case("meta-truncated", "train", truncate("data/tasks/alignment/meta.json"), ("meta.json", "not JSON")),
    Case("images-truncated", "train", truncate("data/tasks/alignment/images.npy"), ("images.npy", "unreadable")),
    Case("indices-truncated", "train", truncate("data/slices/alignment/indices.npz"), ("indices.npz", "unreadable")),
    Case("manifest-missing", "train", remove("data/slices/alignment/manifest.json"), ("manifest.json", "missing")),
    Case("factors-missing", "slice", remove("data/tasks/alignment/factors.csv"), ("factors.csv",)),
    Case("labels-missing", "slice", remove("data/tasks/alignment/labels.npy"), ("labels.npy",)),
    Case("meta-not-json", "slice", write("data/tasks/alignment/meta.json", b"\x00\x01"), ("alignment",)),
    Case("meta-empty-file", "train", write(META, b""), ("meta.json", "not JSON")),
    Case("manifest-not-utf8", "train", write(MANIFEST, b'{"arrays": "\xff"}'), ("manifest.json", "not JSON")),
    Case("images-empty-file", "train", write(IMAGES, b""), ("images.npy", "unreadable")),
    Case("indices-empty-file", "train", write(INDICES, b""), ("indices.npz",)),
    Case("indices-damaged-middle", "train", damage_middle(INDICES, 64), ("indices.npz",)),
    Case("factors-truncated", "slice", truncate(FACTORS), ("factors.csv",)),
    Case("factors-empty", "slice", write(FACTORS, b""), ("factors.csv",)),
    Case("factors-binary", "slice", write(FACTORS, bytes(range(256))), ("factors.csv",)),
]


SPECIAL_FILES = [  # data files: a FIFO, device, socket, loop of links or folder in place of an input (no blocking read)
    Case("meta-fifo", "train", fifo(META), ("meta.json", "FIFO")),
    Case("images-fifo", "train", fifo(IMAGES), ("images.npy", "FIFO")),
    Case("labels-fifo", "slice", fifo(LABELS), ("labels.npy", "FIFO")),
    Case("indices-fifo", "train", fifo(INDICES), ("indices.npz", "FIFO")),
    Case("manifest-fifo", "train", fifo(MANIFEST), ("manifest.json", "FIFO")),
    Case("factors-fifo", "slice", fifo(FACTORS), ("factors.csv", "FIFO"), limit=5),
    Case("provenance-fifo", "train", fifo(PROVENANCE), ("provenance.json", "FIFO")),
    Case("weights-fifo", "train", fifo(WEIGHTS), ("weights.pt", "FIFO")),
    Case("images-dev-zero", "train", link(IMAGES, "/dev/zero"), ("images.npy", "character device")),
    Case("meta-dev-null", "slice", link(META, "/dev/null"), ("meta.json", "character device")),
    Case("labels-socket", "slice", socket_file(LABELS), ("labels.npy", "socket")),
    Case("meta-link-loop", "train", link(META, META), ("meta.json",)),
    Case("meta-a-folder", "train", folder(META), ("meta.json", "folder")),
    Case("images-a-folder", "train", folder(IMAGES), ("images.npy", "folder")),
    Case("indices-a-folder", "train", folder(INDICES), ("indices.npz", "folder")),
]


JSON_SHAPES = [  # data files: JSON of the wrong shape, or NaN and infinities where a finite number is meant
    Case("meta-a-list", "slice", write("data/tasks/alignment/meta.json", b'[{"task": "alignment"}]'),
         ("meta.json", "should hold a JSON object")),
    Case("meta-no-hashes", "train", reshape("data/tasks/alignment/meta.json", "sha256"),
         ("meta.json", "missing key 'sha256'")),
    Case("meta-classes-a-string", "slice",
         reshape("data/tasks/alignment/meta.json", "num_classes", "4"),
         ("meta.json", "'num_classes' should be an integer, not a string")),
    Case("manifest-no-arrays", "train", reshape("data/slices/alignment/manifest.json", "arrays"),
         ("manifest.json", "missing key 'arrays'")),
    Case("manifest-source-a-list", "train",
         reshape("data/slices/alignment/manifest.json", "source", []),
         ("manifest.json", "'source' should be a mapping")),
    Case("teacher-provenance-no-model", "train", reshape(f"{TEACHER}/provenance.json", "model"),
         ("provenance.json", "missing key 'model'")),
    Case("teacher-provenance-hash-null", "train",
         reshape(f"{TEACHER}/provenance.json", "checkpoint_sha256", None),
         ("provenance.json", "'checkpoint_sha256' should be a string, not null")),
    Case("teacher-provenance-corrupt", "train", write(f"{TEACHER}/provenance.json", b"{"),
         ("provenance.json",)),
    Case("meta-nested-too-deep", "slice", write("data/tasks/alignment/meta.json", b"[" * 200000),
         ("meta.json", "nested deeper")),
    Case("meta-classes-disagree-with-labels", "slice",
         both(reshape("data/tasks/alignment/meta.json", "num_classes", 1),  # the labels hold 2
              reshape("data/tasks/alignment/meta.json", "class_names", ["a"])),
         ("meta.json", "do not describe labels.npy")),
    Case("provenance-seed-nan", "train", reshape(PROVENANCE, "seed", NAN), ("provenance.json", "'seed'")),
    Case("provenance-disagreement-nan", "train", reshape(PROVENANCE, "student_train_disagreement", NAN),
         ("provenance.json", "'student_train_disagreement'")),
    Case("provenance-disagreement-inf", "train", reshape(PROVENANCE, "student_train_disagreement", INF),
         ("provenance.json", "'student_train_disagreement'")),
    Case("meta-classes-nan", "slice", reshape(META, "num_classes", NAN), ("meta.json", "'num_classes'")),
]


ARRAY_HEADERS = [  # data files: array headers forged or damaged (checked before anything allocates), pickled arrays
    Case("images-header-huge", "train", write(IMAGES, forged_npy((2**38,))), ("images.npy", "header declares")),
    Case("labels-header-huge", "slice", write(LABELS, forged_npy((2**38,), "<i8")), ("labels.npy", "header declares")),
    Case("indices-member-huge", "train", forged_member("val", (2**38, 8)),
         ("indices.npz", "val.npy", "header declares")),
    Case("images-header-short", "train", write(IMAGES, forged_npy((448, 16, 16, 3), held=100)),
         ("images.npy", "header declares")),
    Case("labels-object-array", "slice", forge_array(LABELS, lambda a: a.astype(object), pickle=True),
         ("labels.npy", "object array")),
    Case("train-labels-object-array", "train", forge_array(LABELS, lambda a: a.astype(object), pickle=True),
         ("labels.npy", "object array")),
    Case("indices-member-object-array", "train", forged_member("val", (4,), "|O"),
         ("indices.npz", "val.npy", "object array")),
    Case("images-header-negative", "train", write(IMAGES, forged_npy((-1, 16, 16, 3))), ("images.npy", "unreadable")),
    Case("images-header-wider-dtype", "train", write(IMAGES, forged_npy((448, 16, 16, 3), "<f8", 448 * 16 * 16 * 3)),
         ("images.npy", "header declares")),
]


DATA_CONTENT = [  # data files: the wrong dtype, shape or values, tampered, or from another run (hashes forged or stale)
    Case("images-wrong-dtype", "train", images_as_float, ("images.npy", "uint8")),
    Case("labels-tampered", "slice", tamper_labels, ("labels.npy", "sha256")),
    Case("train-labels-tampered", "train", tamper_labels, ("labels.npy", "sha256 differs from", "meta.json")),
    Case("train-images-tampered", "train", tamper_images, ("images.npy", "sha256 differs from", "meta.json")),
    Case("train-index-negative", "train", tamper_index("test", lambda a: a.__setitem__(0, -1)),
         ("indices.npz", "test does not hash to", "manifest.json")),
    Case("train-index-swapped", "train", tamper_index("val", lambda a: a.__setitem__(..., a[::-1].copy())),
         ("indices.npz", "val does not hash to")),
    Case("train-label-out-of-range-forged", "train", forge_label, ("labels.npy", "labels outside 0..1")),
    Case("train-subset-overlaps-test-forged", "train", forge_overlap,
         ("indices.npz", "train_128 shares images with test")),
    Case("indices-without-val", "train", drop_index("val"), ("indices.npz", "no val array")),
    Case("labels-a-matrix-forged", "train", labels_as_matrix, ("labels.npy", "of shape (N,)")),
    Case("factors-without-role", "slice", drop_role, ("factors.csv", "no role column")),
    Case("teacher-provenance-other-task", "train", reshape(f"{TEACHER}/provenance.json", "task", "relation"),
         ("provenance.json", "records the teacher resnet on relation")),
    Case("slices-stale", "train", regenerate_data, ("indices.npz", "rerun the slice stage")),
    Case("teacher-stale", "train", both(regenerate_data, reslice), ("provenance.json", "rerun the teacher stage")),
    Case("images-no-channels-forged", "train", forge_array(IMAGES, lambda a: a[..., 0].copy(), "images"),
         ("images.npy", "(N,H,W,C)")),
    Case("images-int64-forged", "train", forge_array(IMAGES, lambda a: a.astype(np.int64), "images"),
         ("images.npy", "uint8")),
    Case("labels-float-forged", "train", forge_array(LABELS, lambda a: a.astype(np.float64), "labels"),
         ("labels.npy",)),
    Case("labels-short-forged", "train", forge_array(LABELS, lambda a: a[:-1].copy(), "labels"),
         ("images.npy", "matching labels", "(447,)")),
    Case("labels-negative-forged", "train", forge_array(LABELS, lambda a: np.where(np.arange(a.size) == 3, -1, a)
                                                        .astype(a.dtype), "labels"), ("labels.npy",)),
    Case("images-other-size-forged", "train", forge_array(IMAGES, lambda a: a[:, :8, :8].copy(), "images"),
         ("images.npy",)),
]


CHECKPOINTS = [  # checkpoints: the teacher's weights missing, tampered, truncated, unsafe pickles, of another model
    Case("teacher-missing", "train", remove(f"{TEACHER}/weights.pt"), ("weights.pt", "missing")),
    Case("teacher-tampered", "train", append(f"{TEACHER}/weights.pt", b"\0"), ("weights.pt", "sha256")),
    Case("teacher-truncated", "train", truncate(f"{TEACHER}/weights.pt"), ("weights.pt", "sha256")),
    Case("teacher-wrong-format", "train", teacher_wrong_format, ("weights.pt", "not a")),
    Case("teacher-provenance-missing", "train", remove(f"{TEACHER}/provenance.json"), ("provenance.json",)),
    Case("weights-unsafe-pickle", "train", teacher_weights(malicious),
         ("weights.pt", "treat it as unsafe", "delete it")),
    Case("weights-unknown-global", "train", teacher_weights(pickled_path), ("weights.pt", "treat it as unsafe")),
    Case("weights-empty", "train", teacher_weights(b""), ("weights.pt", "not a resnet checkpoint")),
    Case("weights-truncated-forged", "train", teacher_weights(truncated_zip_checkpoint),
         ("weights.pt", "not a resnet checkpoint")),
    Case("weights-other-model", "train", teacher_weights(other_arch_weights),
         ("weights.pt", "not a resnet checkpoint")),
    Case("weights-a-folder", "train", folder(WEIGHTS), ("weights.pt", "folder")),
    Case("weights-dev-zero", "train", link(WEIGHTS, "/dev/zero"), ("weights.pt", "character device")),
    Case("weights-link-loop", "train", link(WEIGHTS, WEIGHTS), ("weights.pt",)),
]


ARCHIVE = [  # the CIFAR-10 archive
    Case("cifar-missing", "generate", natural("nowhere/cifar.tar.gz"), ("tasks.natural.path", "no archive"),
         (("task", "natural"), ("out", "data/tasks/natural"))),
    Case("cifar-not-an-archive", "generate", natural(garbage_archive), ("tasks.natural.path", "cifar.tar.gz"),
         (("task", "natural"), ("out", "data/tasks/natural"))),
    Case("cifar-truncated", "generate", natural(truncated_archive), ("tasks.natural.path", "cifar.tar.gz"),
         (("task", "natural"), ("out", "data/tasks/natural"))),
]


STORE = [  # the MLflow store: damaged, of the wrong kind, keeping nothing, its lock
    Case("mlflow-db-garbage", "train", write("mlflow.db", b"this is not a database\n" * 50), ("mlflow.db",)),
    Case("mlflow-db-a-folder", "teacher", store_as_folder, ("mlflow.db", "a folder, not an SQLite MLflow store")),
    Case("mlflow-db-truncated", "train", truncate("mlflow.db"),
         ("tracking store sqlite:///", "mlflow.db", "malformed")),
    Case("tracking-uri-in-memory", "teacher", edit("tracking.tracking_uri", "sqlite:///:memory:"),
         ("tracking.tracking_uri", "keeps no runs")),
    Case("tracking-uri-empty", "teacher", edit("tracking.tracking_uri", ""), ("tracking.tracking_uri",)),
    Case("mlflow-lock-uncreatable", "teacher", lambda ws: None, ("cannot create the lock",),
         env=(("MLFLOW_TRACKING_URI", "sqlite:////proc/mlflow.db"),)),
    Case("mlflow-db-damaged-middle", "train", damage_middle("mlflow.db"), ("mlflow.db", "damaged")),
    Case("mlflow-db-fifo", "teacher", fifo("mlflow.db"), ("mlflow.db", "FIFO")),
    Case("mlflow-db-header-only", "train", cut("mlflow.db", 100), ("mlflow.db",)),
    Case("mlflow-db-dev-zero", "teacher", link("mlflow.db", "/dev/zero"), ("mlflow.db",)),
    Case("mlflow-db-link-loop", "teacher", link("mlflow.db", "mlflow.db"), ("mlflow.db",)),
    Case("mlflow-db-other-magic", "train", overwrite("mlflow.db", 0, b"SQLite format 2\x00"), ("mlflow.db",)),
]


FULL_DISK = [  # a full disk (a file-size limit while the stage runs): outputs, the stage lock, the MLflow store
    Case("full-disk-validate", "validate", lambda ws: None, ("validated.txt",), fsize=0),
    Case("full-disk-generate", "generate", lambda ws: None, ("data/tasks/alignment",), fsize=64 * 1024),
    Case("full-disk-slice", "slice", lambda ws: None, ("data/slices/alignment",), fsize=1024),
    Case("full-disk-lock", "teacher", lambda ws: None, ("bias-", ".lock", "file too large"), fsize=0),
    Case("full-disk-store", "teacher", lambda ws: None, ("mlflow.db", "no room to write"), fsize=64),
]


ENVIRONMENT = [  # environment: MLFLOW_TRACKING_URI and the Dask scheduler's address
    Case("env-tracking-uri-scheme", "train", lambda ws: None, ("MLFLOW_TRACKING_URI",),
         env=(("MLFLOW_TRACKING_URI", "bogus://nowhere"),)),
    Case("env-tracking-uri-under-a-file", "teacher", lambda ws: None, ("params.yaml",),
         env=(("MLFLOW_TRACKING_URI", "sqlite:///{ws}/params.yaml/mlflow.db"),)),
    Case("env-tracking-uri-mysql", "train", lambda ws: None, ("MLFLOW_TRACKING_URI", "mysql", "driver"),
         env=(("MLFLOW_TRACKING_URI", "mysql://bias:secret@db.example/mlflow"),)),
    Case("env-tracking-uri-postgresql", "teacher", lambda ws: None, ("MLFLOW_TRACKING_URI", "postgresql", "driver"),
         env=(("MLFLOW_TRACKING_URI", "postgresql://bias@db.example/mlflow"),)),
    Case("env-tracking-uri-file", "teacher", lambda ws: None, ("MLFLOW_TRACKING_URI", "file:"),
         env=(("MLFLOW_TRACKING_URI", "file:///{ws}/mlruns"),)),
    Case("env-tracking-uri-http-closed", "train", lambda ws: None, ("MLFLOW_TRACKING_URI", "127.0.0.1:9"),
         env=(("MLFLOW_TRACKING_URI", "http://127.0.0.1:9"),)),
    Case("env-tracking-uri-relative", "teacher", lambda ws: None, ("MLFLOW_TRACKING_URI",),
         env=(("MLFLOW_TRACKING_URI", "sqlite://mlflow.db"),)),
    Case("dask-scheduler-unreachable", "train", lambda ws: None, ("DASK_SCHEDULER_ADDRESS", "tcp://127.0.0.1:9"),
         env=(("DASK_SCHEDULER_ADDRESS", "tcp://127.0.0.1:9"),)),
    Case("dask-scheduler-no-port", "teacher", edit("train.runtime.scheduler", "scheduler.example"),
         ("train.runtime.scheduler", "no port")),
    Case("scheduler-empty", "teacher", edit("train.runtime.scheduler", ""), ("train.runtime.scheduler",)),
    Case("env-scheduler-ssh-banner", "train", banner_server(b"SSH-2.0-OpenSSH_9.6\r\n"),
         ("DASK_SCHEDULER_ADDRESS", "not a Dask scheduler")),
    Case("env-scheduler-http-banner", "teacher", banner_server(b"HTTP/1.1 400 Bad Request\r\n\r\n"),
         ("DASK_SCHEDULER_ADDRESS", "not a Dask scheduler")),
    Case("env-scheduler-closes", "train", banner_server(b""), ("DASK_SCHEDULER_ADDRESS", "closed the connection")),
    Case("env-scheduler-tls", "train", lambda ws: None, ("DASK_SCHEDULER_ADDRESS", "tls://"),
         env=(("DASK_SCHEDULER_ADDRESS", "tls://127.0.0.1:9"),)),
    Case("env-scheduler-unknown-scheme", "teacher", lambda ws: None,
         ("DASK_SCHEDULER_ADDRESS", "unknown address scheme"),
         env=(("DASK_SCHEDULER_ADDRESS", "udp://127.0.0.1:9"),)),
    Case("env-scheduler-no-port", "train", lambda ws: None, ("DASK_SCHEDULER_ADDRESS", "no port"),
         env=(("DASK_SCHEDULER_ADDRESS", "tcp://127.0.0.1"),)),
]


COMMAND_LINES = [  # command lines: a stage's options (outputs where none can go) and bias's
    Case("task-not-enabled-cli", "generate", lambda ws: None, ("tasks.names", "relation"), (("task", "relation"),)),
    Case("report-path-is-a-file", "budget", write("rep", b"a file"), ("rep", "a file stands where a folder"),
         (("report", "rep/"),)),
    Case("data-out-is-a-file", "generate", write("mine", b"a user's file"), ("mine", "a file stands where a folder"),
         (("out", "mine/"),)),  # refused before writing: the file is kept (the snapshot check)
    Case("cli-task-unknown", "generate", lambda ws: None, ("bogus",), (("task", "bogus"),)),
    Case("cli-slice-task-a-path", "slice", lambda ws: None, ("../x",), (("task", "../x"),)),
    Case("cli-params-fifo", "train", fifo("p.yaml"), ("p.yaml", "FIFO"), (("params", "p.yaml/"),)),
    Case("cli-validate-out-under-a-file", "validate", write("mine", b"a user's file"), ("mine",),
         (("out", "mine/validated.txt"),)),
    Case("cli-ckpt-is-a-file", "teacher", write("ck", b"a user's file"), ("ck",), (("ckpt", "ck/"),)),
    Case("cli-out-under-proc", "validate", lambda ws: None, ("/proc/bias", "no folder can be made there"),
         (("out", "/proc/bias/validated.txt"),)),
    Case("cli-out-under-sys", "generate", lambda ws: None, ("/sys/bias",), (("out", "/sys/bias/alignment"),)),
    Case("bias-run-one-arch-unknown", "bias", lambda ws: None, ("--arch bogus", "not a cell"),
         cli=("run-one", "--arch", "bogus", "--task", "alignment")),
    Case("bias-run-one-task-unknown", "bias", lambda ws: None, ("--task", "scale"),
         cli=("run-one", "--arch", "vit", "--task", "scale")),
    Case("bias-run-one-seed-not-in-seeds", "bias", lambda ws: None, ("--seed 7", "train.seeds"),
         cli=("run-one", "--arch", "vit", "--task", "alignment", "--seed", "7")),
    Case("bias-run-one-lr-nan", "bias", lambda ws: None, ("--lr nan",),
         cli=("run-one", "--arch", "vit", "--task", "alignment", "--lr", "nan")),
    Case("bias-run-one-lr-negative", "bias", lambda ws: None, ("--lr -1",),
         cli=("run-one", "--arch", "vit", "--task", "alignment", "--lr", "-1")),
    Case("bias-run-one-steps-zero", "bias", lambda ws: None, ("--steps 0",),
         cli=("run-one", "--arch", "vit", "--task", "alignment", "--steps", "0")),
    Case("bias-run-one-data-missing", "bias", lambda ws: shutil.rmtree(ws / "data/slices"),
         ("data/slices/alignment", "slice@alignment"), cli=("run-one", "--arch", "vit", "--task", "alignment")),
    Case("bias-run-one-params-missing", "bias", lambda ws: None, ("nope.yaml",),
         cli=("run-one", "--arch", "vit", "--task", "alignment", "--params", "nope.yaml")),
    Case("bias-run-one-params-fifo", "bias", fifo("p.yaml"), ("p.yaml", "FIFO"),
         cli=("run-one", "--arch", "vit", "--task", "alignment", "--params", "p.yaml")),
    Case("bias-smoke-keep-a-file", "bias", write("mine", b"a user's file"), ("--keep", "mine"),
         cli=("smoke", "--keep", "mine")),
    Case("bias-smoke-keep-not-empty", "bias", lambda ws: None, ("--keep", "data", "not an empty folder"),
         cli=("smoke", "--keep", "data")),
    Case("bias-smoke-keep-under-proc", "bias", lambda ws: None, ("/proc/x",), cli=("smoke", "--keep", "/proc/x")),
]


TABLE = {  # class -> cases; the module docstring counts them (test_the_docstring_counts_each_class)
    "params.yaml itself": PARAMS_FILE,
    "params: wrong type": WRONG_TYPE,
    "params: out of range or not finite": OUT_OF_RANGE,
    "params: unknown or missing key": UNKNOWN_OR_MISSING,
    "params: contradictory keys": CONTRADICTORY,
    "params: unknown or unsafe names": NAMES,
    "params: sizes beyond the machine": SIZES,
    "profiles (overlays)": PROFILES,
    "data: missing, truncated, corrupt": DATA_UNREADABLE,
    "data: special files": SPECIAL_FILES,
    "data: JSON shapes, NaN, infinities": JSON_SHAPES,
    "data: array headers, pickled arrays": ARRAY_HEADERS,
    "data: wrong dtype, shape, values; tampered; stale": DATA_CONTENT,
    "checkpoints": CHECKPOINTS,
    "CIFAR-10 archive": ARCHIVE,
    "MLflow store": STORE,
    "full disk": FULL_DISK,
    "environment": ENVIRONMENT,
    "command lines (stages, bias)": COMMAND_LINES,
}
CASES = [case for cases in TABLE.values() for case in cases]



def snapshot(folder: Path) -> dict[str, str]:
    """Every entry under ``folder`` (lock files aside): a file by its sha256, anything else (a folder, a FIFO, a
    link) by its kind, so a half-written file, a new folder or a consumed FIFO all show."""
    def state(p: Path) -> str:
        if p.is_symlink():
            return f"link to {os.readlink(p)}"
        if stat.S_ISREG(p.lstat().st_mode):
            return hashlib.sha256(p.read_bytes()).hexdigest()
        return stat.filemode(p.lstat().st_mode)
    return {str(p.relative_to(folder)): state(p) for p in sorted(folder.rglob("*")) if not p.name.endswith(".lock")}


@contextmanager
def file_size_limit(size: int | None):
    """No file may grow past ``size`` bytes (``ulimit -f``): writes fail with EFBIG as on a full disk (Python
    ignores SIGXFSZ, so the write returns the error instead of the signal killing the process)."""
    if size is None:
        yield
        return
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, old[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)


class Hung(BaseException):
    """A case still running after its time: a blocking read (no ``except Exception`` in a stage catches it)."""


@contextmanager
def deadline(seconds: int):
    def hung(signum, frame):
        raise Hung(f"still running after {seconds} s (blocked on a read?)")
    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def marked(cases: list[Case]) -> list:
    return [pytest.param(c, id=c.id, marks=([pytest.mark.xfail(strict=True, reason=c.xfail)] if c.xfail else [])
                         + ([pytest.mark.slow] if c.slow else [])) for c in cases]


def plant_results(ws: Path) -> None:
    """A finished result in every stage's output folder, which a failing stage must leave alone."""
    src = ws / TEACHER
    for dest in ("data/runs/resnet/alignment/n128-t20-s0-d0-criterion",
                 "data/runs/deit/alignment/n128-t20-s0-d0-criterion", "data/interface",
                 "reports/budget", "reports/interface"):
        shutil.copytree(src, ws / dest, dirs_exist_ok=True)
    (ws / "data/validated.txt").write_text(validate.VALID)


@pytest.mark.parametrize("case", marked(CASES))
def test_bad_input(case, copy_workspace, capsys, monkeypatch):
    ws = copy_workspace
    plant_results(ws)
    env = case.setup(ws) or {}  # a setup may name variables for the stage (a server's address)
    files = snapshot(ws)  # mlflow.db included: the same bytes, the same runs
    args = {k: (str(ws / v) if "/" in v else v) for k, v in case.args}
    capsys.readouterr()
    with mlflow_store(ws):
        for name, value in [*case.env, *env.items()]:
            monkeypatch.setenv(name, value.format(ws=ws))
        with deadline(case.limit), file_size_limit(case.fsize):
            if case.stage == "bias":
                monkeypatch.chdir(ws)
                code = cli.main(list(case.cli))
            else:
                code = STAGES[case.stage].main(argv(case.stage, ws, **args))
    err = capsys.readouterr().err
    assert code == 2
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    said = lines[0].replace(str(ws), "<ws>")  # the workspace's own path (named after the case) proves nothing
    for needle in case.expect:
        assert needle in said, f"{needle!r} not named in {said!r}"
    assert snapshot(ws) == files


def test_the_docstring_counts_each_class():
    """The counts above are the table's: a case added or moved updates them, and every class has several cases."""
    said = dict(re.findall(r"^- (.+): (\d+) cases$", __doc__, re.MULTILINE))
    assert {name: len(cases) for name, cases in TABLE.items()} == {name: int(n) for name, n in said.items()}
    assert f"{len(CASES)} cases by class" in __doc__
    usage = (Path(__file__).resolve().parents[1] / "docs/usage.md").read_text()
    assert f"({len(CASES)} cases in {len(TABLE)} classes," in " ".join(usage.split())  # its Troubleshooting
    assert len({case.id for case in CASES}) == len(CASES) >= 140
    assert all(len(cases) >= 3 for cases in TABLE.values())


def run_stage(stage: str, args: list[str], ws: Path, prefix: tuple[str, ...] = (),
              extra_env: tuple[tuple[str, str], ...] = ()) -> subprocess.CompletedProcess:
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{ws / 'mlflow.db'}",
           **{name: value.format(ws=ws) for name, value in extra_env}}
    return subprocess.run([*prefix, sys.executable, "-m", f"pipeline.stages.{stage}", *args], env=env,
                          capture_output=True, text=True, timeout=600)  # a teacher trains first


# The stages that import torch take ~10 s to start on 2 cores: those run with the slow tests.
SUBPROCESS = {"yaml-malformed": [], "images-corrupt": [pytest.mark.slow], "teacher-tampered": [pytest.mark.slow],
              "params-duplicate-key": [], "params-utf16": [],
              # MLflow's and Dask's own loggers and __del__ hooks print only in a real process
              "mlflow-db-truncated": [pytest.mark.slow], "dask-scheduler-unreachable": [pytest.mark.slow],
              # a blocking read or an expanding YAML in a real process; a Dask peer that is no scheduler
              "params-fifo": [], "params-alias-bomb": [], "mlflow-db-fifo": [pytest.mark.slow],
              "env-scheduler-ssh-banner": [pytest.mark.slow]}


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=SUBPROCESS[c.id])
                                  for c in CASES if c.id in SUBPROCESS])
def test_bad_input_as_process(case, copy_workspace):
    """The same through ``python -m``: nothing else (no warning, no traceback) reaches stderr."""
    ws = copy_workspace
    env = case.setup(ws) or {}
    files = snapshot(ws)
    args = {k: (str(ws / v) if "/" in v else v) for k, v in case.args}
    proc = run_stage(case.stage, argv(case.stage, ws, **args), ws, extra_env=(*case.env, *env.items()))
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


# (stage, the option naming its output); the training stages check their output folders before any run trains,
# so they leave no checkpoint either.
UNWRITABLE = [("generate", "out"), ("slice", "out"),
              pytest.param("teacher", "out", marks=pytest.mark.slow, id="teacher-out"),
              pytest.param("train", "out", marks=pytest.mark.slow, id="train-out")]


@pytest.mark.parametrize(("stage", "option"), UNWRITABLE)
def test_unwritable_output_folder(stage, option, copy_workspace):
    ws = copy_workspace
    out = ws / "readonly"
    out.mkdir()
    prefix, why = _read_only(out)
    files = snapshot(ws)
    try:
        proc = run_stage(stage, argv(stage, ws, **{option: str(out / "result")}), ws, prefix)
    finally:
        out.chmod(0o755)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("error: "), proc.stderr
    assert str(out) in proc.stderr and why in proc.stderr
    assert snapshot(ws) == files


@pytest.mark.slow
def test_prune_after_shrinking_tasks(copy_workspace, capsys):
    """docs/usage.md's ablation path: a task dropped from ``train.archs.<arch>.tasks`` leaves finished runs
    (persisted outputs) with nested folders; the train stage prunes them without crashing and trains the rest."""
    ws = copy_workspace
    stale = ws / "data/runs/resnet/relation"
    for run in ("n128-t20-s0-d0", "n128-t20-s1-d0"):
        shutil.copytree(ws / TEACHER, stale / run)
        (stale / run / "plots/x").mkdir(parents=True)
        (stale / run / "plots/x/curve.csv").write_text("step,acc\n")
    with mlflow_store(ws):
        code = train.main(argv("train", ws))
    assert code == 0, capsys.readouterr().err
    assert not stale.exists() and (ws / "data/runs/resnet/alignment/n128-t20-s0-d0-criterion/metrics.json").exists()


@pytest.mark.slow
def test_two_repros_at_once_second_is_refused(make_tiny_repo):
    """DVC's repository lock: a second ``dvc repro`` while one runs fails at once with a clear message, and the
    first finishes with every output intact."""
    # The first repro is paused (SIGSTOP to DVC and its stage) once its data stage runs, so it surely still holds
    # that stage's lock when the second (which needs the same outputs) starts, then resumed; DVC locks per stage,
    # not for a whole repro.
    repo = make_tiny_repo("repo")
    first = subprocess.Popen([str(tiny_repo.VENV_BIN / "dvc"), "repro", "slice@alignment"], cwd=repo,
                             env=tiny_repo.env(repo), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not tiny_repo.stage_running(first.pid, "generate"):
            assert first.poll() is None and time.monotonic() < deadline, "the first repro never ran its stage"
            time.sleep(0.01)
        os.killpg(first.pid, signal.SIGSTOP)
        try:
            second = tiny_repo.dvc(repo, "repro", "slice@alignment", check=False, timeout=120)
        finally:
            os.killpg(first.pid, signal.SIGCONT)
        out, _ = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert second.returncode != 0
    assert "lock" in (second.stdout + second.stderr).lower(), second.stdout + second.stderr
    assert first.returncode == 0, out
    status = tiny_repo.dvc(repo, "status", "slice@alignment").stdout
    assert "changed" not in status and "modified" not in status, status
    for path in ("data/tasks/alignment/images.npy", "data/slices/alignment/indices.npz"):
        assert (repo / path).stat().st_size > 0


def test_other_os_errors_are_not_hidden():
    """Only unwritable outputs become one-line errors; any other OSError is a bug and keeps its traceback."""
    from pipeline.stages.common import stage_main

    @stage_main
    def broken(argv):
        raise OSError(errno.EIO, "disk on fire")

    with pytest.raises(OSError, match="disk on fire"):
        broken([])


@pytest.mark.parametrize("stage", ["train", "teacher"])
def test_a_second_stage_on_the_same_outputs_is_refused(stage, copy_workspace, capsys):
    # Started by hand beside one already writing the same checkpoints, a stage refuses in one line naming the
    # folder and the lock, before any MLflow run or file is touched (two stages would train the same runs twice).
    from pipeline.io import exclusive

    ws = copy_workspace
    plant_results(ws)
    files = snapshot(ws)
    ckpt = Path(dict(zip(argv(stage, ws)[::2], argv(stage, ws)[1::2], strict=True))["--ckpt"])
    capsys.readouterr()
    with exclusive(ckpt, f"the {stage} stage"), mlflow_store(ws):
        code = STAGES[stage].main(argv(stage, ws))
    lines = capsys.readouterr().err.splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: {ckpt}: the {stage} stage is already running on it (pid ")
    assert ".lock" in lines[0]
    assert snapshot(ws) == files
    with exclusive(ckpt, "a later stage"):  # released with its holder
        pass
