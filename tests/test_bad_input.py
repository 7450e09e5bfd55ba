"""Bad configurations and inputs: one ``error:`` line naming the key or file, exit 2, nothing touched.

Every case runs a real stage entry point (``main(argv)`` in-process; a few as a subprocess) on a private
copy of the tiny workspace (tests/conftest.py), after planting a finished result in the stage's output
folder. Afterwards every file in the workspace, the MLflow store included, is byte-identical (so the store
lists the same runs). The table covers each class of input: params numbers (out of range, non-finite,
wrong type), params structure, every file a stage reads (missing, truncated, wrong format, valid but from
another run), the CIFAR archive, the teacher files, the MLflow store and the environment; unwritable
destinations and two concurrent ``dvc repro`` are separate tests below. Cases marked ``xfail`` name whose
fix they wait for: the lead flips them once that fix is merged (``strict``: an unexpected pass fails).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tiny_repo
import yaml
from conftest import mlflow_store

from pipeline.stages import budget, generate, interface, slice, teacher, train

STAGES = {"train": train, "teacher": teacher, "generate": generate, "slice": slice,
          "interface": interface, "budget": budget}


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
    return lambda ws: (ws / rel).write_bytes(content)


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


TEACHER = "data/teachers/resnet/alignment"
CASES = [
    # malformed or missing params.yaml
    Case("yaml-malformed", "train", write("params.yaml", b"geometry: [16, 4\nseed: 0\n"),
         ("params.yaml", "malformed YAML")),
    Case("params-missing", "generate", lambda ws: None, ("nope.yaml", "not found"), (("params", "nope.yaml"),)),
    Case("params-not-mapping", "slice", write("params.yaml", b"- 1\n- 2\n"), ("params.yaml", "top level")),
    # params files that safe_load would take silently or with a traceback (one loader: pipeline.config.load_params)
    Case("params-duplicate-key", "generate", append("params.yaml", b"seed: 1\n"),
         ("params.yaml", "duplicate key 'seed'", "lines 1 and")),
    Case("params-duplicate-nested-key", "train", duplicate_recipe_lr, ("params.yaml", "duplicate key 'lr'")),
    Case("params-utf16", "slice", recode("utf-16"), ("params.yaml", "UTF-16")),
    Case("params-utf16-no-bom", "budget", recode("utf-16-le"), ("params.yaml", "NUL bytes")),
    Case("params-latin1", "train", append("params.yaml", b"# caf\xe9\n"),
         ("params.yaml", "not UTF-8")),
    Case("params-binary", "interface", write("params.yaml", bytes(range(256)) * 4), ("params.yaml", "NUL bytes")),
    Case("params-directory", "teacher", lambda ws: None, ("data/tasks", "not a file"), (("params", "data/tasks"),)),
    # wrong types and values
    Case("unknown-key", "budget", edit("geometry.colour", 3), ("geometry.colour", "unknown key")),
    Case("lr-string", "train", edit("train.recipe.lr", "fast"), ("train.recipe.lr",)),
    Case("seed-float", "generate", edit("seed", 1.5), ("seed",)),
    Case("steps-bool", "teacher", edit("train.recipe.steps", True), ("train.recipe.steps",)),
    Case("batch-negative", "train", edit("train.recipe.batch_size", -4), ("train.recipe.batch_size",)),
    Case("warmup-too-long", "train", edit("train.recipe.warmup_steps", 50), ("train.recipe.warmup_steps",)),
    # worker-only conditions, refused with the params (pipeline.config.Params._worker_limits)
    Case("batch-above-train-size", "train", edit("train.recipe.batch_size", 129),
         ("train.recipe.batch_size", "train.size = 128")),
    Case("batch-above-grid-size", "train", both(edit("train.grids", {"small": {"sizes": [64]}}),
                                                edit("train.recipe.batch_size", 65)),
         ("train.recipe.batch_size", "train.grids.small.sizes = 64")),
    Case("batch-above-teacher-set", "teacher", both(edit("slice.train_sizes", [64, 128, 160]),
                                                    edit("distill.teacher_size", 160),
                                                    edit("train.recipe.batch_size", 33)),
         ("train.recipe.batch_size", "distill.teacher_size - train.size = 32")),
    Case("seed-above-lightning", "generate", edit("seed", 2**32), ("seed", "4294967296", "seed range")),
    Case("train-seed-above-lightning", "train", edit("train.seeds", [0, 2**32]), ("train.seeds", "seed range")),
    Case("grid-seed-above-lightning", "train", edit("train.grids", {"more": {"seeds": [2**33]}}),
         ("train.grids.more.seeds", "seed range")),
    Case("teacher-seed-above-lightning", "teacher", edit("distill.teacher_seed", 2**32 + 5),
         ("distill.teacher_seed", "seed range")),
    # sizes the schema admits but no machine holds (Params._fits_in_memory)
    Case("pool-beyond-memory", "generate", edit("tasks.alignment.n", 10**12), ("tasks.alignment.n", "GiB", "memory")),
    Case("param-target-beyond-memory", "budget", edit("models.param_target", 10**13),
         ("models.param_target", "GiB", "memory")),
    Case("bootstrap-beyond-memory", "budget", edit("report.bootstrap_samples", 10**12),
         ("report.bootstrap_samples", "GiB", "memory")),
    Case("interface-width-beyond-memory", "interface", edit("interface.widths", [8, 10**9]),
         ("interface.widths", "GiB", "memory")),
    # impossible geometry
    Case("patch-not-dividing", "interface", edit("geometry.patch_size", 5), ("geometry.patch_size",)),
    Case("swin-window-too-big", "budget", edit("models.swin.window_size", 16), ("models.swin.window_size",)),
    Case("interface-heads", "interface", edit("interface.num_heads", 3), ("interface.num_heads",)),
    # unknown architecture or task
    Case("arch-unknown-in-params", "train", edit("train.archs.bogus", {"models": "vit", "tasks": ["alignment"]}),
         ("train.archs.bogus", "unknown architecture")),
    Case("task-unknown", "generate", edit("tasks.names", ["alignment", "bogus"]), ("tasks.names",)),
    Case("task-not-enabled-cli", "generate", lambda ws: None, ("tasks.names", "relation"), (("task", "relation"),)),
    Case("train-task-not-generated", "train", edit("train.archs.resnet.tasks", ["alignment", "scale"]),
         ("train.archs.resnet.tasks", "scale")),
    Case("student-teacher-unknown", "train", edit("distill.students.deit", "nobody"), ("distill.students", "nobody")),
    Case("student-named-as-arch", "train", edit("distill.students", {"vit": "resnet"}), ("distill.students", "vit")),
    Case("teacher-unknown", "teacher", edit("distill.teachers.bogus", "vit"), ("distill.teachers", "bogus")),
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
    # integrity: the train stage checks every array it reads against its recorded hash before any worker starts
    Case("train-labels-tampered", "train", tamper_labels, ("labels.npy", "sha256 differs from", "meta.json")),
    Case("train-images-tampered", "train", tamper_images, ("images.npy", "sha256 differs from", "meta.json")),
    Case("train-index-negative", "train", tamper_index("test", lambda a: a.__setitem__(0, -1)),
         ("indices.npz", "test does not hash to", "manifest.json")),
    Case("train-index-swapped", "train", tamper_index("val", lambda a: a.__setitem__(..., a[::-1].copy())),
         ("indices.npz", "val does not hash to")),
    # teacher checkpoint missing or tampered
    Case("teacher-missing", "train", remove(f"{TEACHER}/weights.pt"), ("weights.pt", "missing")),
    Case("teacher-tampered", "train", append(f"{TEACHER}/weights.pt", b"\0"), ("weights.pt", "sha256")),
    Case("teacher-provenance-corrupt", "train", write(f"{TEACHER}/provenance.json", b"{"),
         ("provenance.json",)),
    # numbers: out of range, non-finite, wrong type
    Case("lr-inf", "train", edit("train.recipe.lr", float("inf")), ("train.recipe.lr",)),
    Case("lr-nan", "train", edit("train.recipe.lr", float("nan")), ("train.recipe.lr",)),
    Case("lr-zero", "train", edit("train.recipe.lr", 0.0), ("train.recipe.lr",)),
    Case("weight-decay-negative", "train", edit("train.recipe.weight_decay", -0.1), ("train.recipe.weight_decay",)),
    Case("label-smoothing-one", "teacher", edit("train.recipe.label_smoothing", 1.0),
         ("train.recipe.label_smoothing",)),
    Case("min-lr-ratio-above-one", "train", edit("train.recipe.min_lr_ratio", 1.5), ("train.recipe.min_lr_ratio",)),
    Case("grad-clip-nan", "train", edit("train.recipe.grad_clip", float("nan")), ("train.recipe.grad_clip",)),
    Case("workers-zero", "train", edit("train.runtime.workers", 0), ("train.runtime.workers",)),
    Case("image-size-string", "generate", edit("geometry.image_size", "16"), ("geometry.image_size",)),
    Case("image-size-inf", "budget", edit("geometry.image_size", float("inf")), ("geometry.image_size",)),
    Case("pool-size-zero", "generate", edit("tasks.alignment.n", 0), ("tasks.alignment.n",)),
    Case("param-target-negative", "budget", edit("models.param_target", -1), ("models.param_target",)),
    Case("param-tolerance-nan", "budget", edit("models.param_tolerance", float("nan")), ("models.param_tolerance",)),
    Case("seeds-not-a-list", "train", edit("train.seeds", 0), ("train.seeds",)),
    Case("task-names-string", "generate", edit("tasks.names", "alignment"), ("tasks.names",)),
    Case("task-names-duplicate", "generate", edit("tasks.names", ["alignment", "alignment"]),
         ("tasks.names", "duplicate")),
    Case("swin-heads-per-stage", "budget", edit("models.swin.num_heads", [2]), ("models.swin.num_heads", "depths")),
    Case("train-sizes-float", "slice", edit("slice.train_sizes", [64.5, 128]), ("slice.train_sizes",)),
    # structure: a missing section or key is an error, never a hidden default
    Case("section-missing", "generate", drop("slice"), ("slice",)),
    Case("key-missing", "train", drop("train.recipe.lr"), ("train.recipe.lr",)),
    Case("params-empty", "generate", write("params.yaml", b"{}\n"), ("params.yaml",)),
    # files: missing, truncated, wrong format
    Case("meta-missing", "train", remove("data/tasks/alignment/meta.json"), ("meta.json", "missing")),
    Case("meta-truncated", "train", truncate("data/tasks/alignment/meta.json"), ("meta.json", "not JSON")),
    Case("images-truncated", "train", truncate("data/tasks/alignment/images.npy"), ("images.npy", "unreadable")),
    Case("images-wrong-dtype", "train", images_as_float, ("images.npy", "uint8")),
    Case("indices-truncated", "train", truncate("data/slices/alignment/indices.npz"), ("indices.npz", "unreadable")),
    Case("manifest-missing", "train", remove("data/slices/alignment/manifest.json"), ("manifest.json", "missing")),
    Case("factors-missing", "slice", remove("data/tasks/alignment/factors.csv"), ("factors.csv",)),
    Case("labels-missing", "slice", remove("data/tasks/alignment/labels.npy"), ("labels.npy",)),
    Case("meta-not-json", "slice", write("data/tasks/alignment/meta.json", b"\x00\x01"), ("alignment",)),
    # files: valid JSON of the wrong shape (each reader checks its file's shape in pipeline.schemas)
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
    Case("factors-without-role", "slice", drop_role, ("factors.csv", "no role column")),
    Case("meta-nested-too-deep", "slice", write("data/tasks/alignment/meta.json", b"[" * 200000),
         ("meta.json", "nested deeper")),
    Case("meta-classes-disagree-with-labels", "slice",
         both(reshape("data/tasks/alignment/meta.json", "num_classes", 3),
              reshape("data/tasks/alignment/meta.json", "class_names", ["a", "b", "c"])),
         ("meta.json", "do not describe labels.npy")),
    Case("teacher-provenance-other-task", "train", reshape(f"{TEACHER}/provenance.json", "task", "relation"),
         ("provenance.json", "records the teacher resnet on relation")),
    # integrity beyond the hashes: a forged hash still meets a range, uniqueness or disjointness check
    Case("train-label-out-of-range-forged", "train", forge_label, ("labels.npy", "labels outside 0..3")),
    Case("train-subset-overlaps-test-forged", "train", forge_overlap,
         ("indices.npz", "train_128 shares images with test")),
    Case("indices-without-val", "train", drop_index("val"), ("indices.npz", "no val array")),
    Case("labels-a-matrix-forged", "train", labels_as_matrix, ("labels.npy", "of shape (N,)")),
    # files: valid, but from another run
    Case("slices-stale", "train", regenerate_data, ("indices.npz", "rerun the slice stage")),
    Case("teacher-stale", "train", both(regenerate_data, reslice), ("provenance.json", "rerun the teacher stage")),
    # teacher files
    Case("teacher-truncated", "train", truncate(f"{TEACHER}/weights.pt"), ("weights.pt", "sha256")),
    Case("teacher-wrong-format", "train", teacher_wrong_format, ("weights.pt", "not a")),
    Case("teacher-provenance-missing", "train", remove(f"{TEACHER}/provenance.json"), ("provenance.json",)),
    # the CIFAR-10 archive
    Case("cifar-missing", "generate", natural("nowhere/cifar.tar.gz"), ("tasks.natural.path", "no archive"),
         (("task", "natural"), ("out", "data/tasks/natural"))),
    Case("cifar-not-an-archive", "generate", natural(garbage_archive), ("tasks.natural.path", "cifar.tar.gz"),
         (("task", "natural"), ("out", "data/tasks/natural"))),
    Case("cifar-truncated", "generate", natural(truncated_archive), ("tasks.natural.path", "cifar.tar.gz"),
         (("task", "natural"), ("out", "data/tasks/natural"))),
    # tracking: a corrupt store, a store that cannot be created, environment variables
    Case("mlflow-db-garbage", "train", write("mlflow.db", b"this is not a database\n" * 50), ("mlflow.db",)),
    Case("env-tracking-uri-scheme", "train", lambda ws: None, ("MLFLOW_TRACKING_URI",),
         env=(("MLFLOW_TRACKING_URI", "bogus://nowhere"),)),
    Case("env-tracking-uri-under-a-file", "teacher", lambda ws: None, ("params.yaml",),
         env=(("MLFLOW_TRACKING_URI", "sqlite:///{ws}/params.yaml/mlflow.db"),)),
    # a named Dask cluster that cannot answer (pipeline.executor._connected): refused before any MLflow run
    Case("dask-scheduler-unreachable", "train", lambda ws: None, ("DASK_SCHEDULER_ADDRESS", "tcp://127.0.0.1:9"),
         env=(("DASK_SCHEDULER_ADDRESS", "tcp://127.0.0.1:9"),)),
    Case("dask-scheduler-no-port", "teacher", edit("train.runtime.scheduler", "scheduler.example"),
         ("train.runtime.scheduler", "no port")),
    # tracking faults after the store check passes (pipeline.tracking.store_faults; more in test_tracking_faults.py)
    Case("mlflow-db-a-folder", "teacher", store_as_folder, ("mlflow.db", "a folder, not an SQLite MLflow store")),
    Case("mlflow-db-truncated", "train", truncate("mlflow.db"),
         ("tracking store sqlite:///", "mlflow.db", "malformed")),
    Case("tracking-uri-in-memory", "teacher", edit("tracking.tracking_uri", "sqlite:///:memory:"),
         ("tracking.tracking_uri", "keeps no runs")),
    # a third hostile pass (issue 31): names that become paths, empty or control-character strings, Lightning
    # knobs, sizes no machine holds, an output path of the wrong kind, a lock that cannot be created
    Case("student-name-escapes", "train", edit("distill.students", {"../../escaped": "resnet"}),
         ("distill.students", "../../escaped")),
    Case("grid-name-with-slash", "train", edit("train.grids", {"a/b": {"seeds": [0]}}), ("grids.a/b",)),
    Case("tracking-uri-empty", "teacher", edit("tracking.tracking_uri", ""), ("tracking.tracking_uri",)),
    Case("experiment-prefix-newline", "teacher", edit("tracking.experiment_prefix", "a\nb"),
         ("tracking.experiment_prefix",)),
    Case("scheduler-empty", "teacher", edit("train.runtime.scheduler", ""), ("train.runtime.scheduler",)),
    Case("accelerator-unknown", "teacher", edit("train.runtime.accelerator", "quantum"),
         ("train.runtime.accelerator",)),
    Case("precision-unknown", "teacher", edit("train.runtime.precision", "fp7"), ("train.runtime.precision",)),
    Case("devices-word", "teacher", edit("train.runtime.devices", "many"), ("train.runtime.devices",)),
    Case("threads-huge", "teacher", edit("train.runtime.threads", 10**6), ("train.runtime.threads",)),
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
    Case("arch-on-no-task", "train", edit("train.archs.resnet.tasks", []), ("train.archs.resnet.tasks",)),
    Case("grid-of-no-arch", "train", edit("train.grids", {"g": {"archs": []}}), ("train.grids.g.archs",)),
    Case("report-path-is-a-file", "budget", write("rep", b"a file"), ("rep", "a file stands where a folder"),
         (("report", "rep/"),)),
    Case("data-out-is-a-file", "generate", write("mine", b"a user's file"), ("mine", "a file stands where a folder"),
         (("out", "mine/"),)),  # refused before writing: the file is kept (the snapshot check)
    Case("mlflow-lock-uncreatable", "teacher", lambda ws: None, ("cannot create the lock",),
         env=(("MLFLOW_TRACKING_URI", "sqlite:////proc/mlflow.db"),)),
]



def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.name.endswith(".lock")}


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


@pytest.mark.parametrize("case", marked(CASES))
def test_bad_input(case, copy_workspace, capsys, monkeypatch):
    ws = copy_workspace
    plant_results(ws)
    case.setup(ws)
    files = snapshot(ws)  # mlflow.db included: the same bytes, the same runs
    args = {k: (str(ws / v) if "/" in v else v) for k, v in case.args}
    capsys.readouterr()
    with mlflow_store(ws):
        for name, value in case.env:
            monkeypatch.setenv(name, value.format(ws=ws))
        code = STAGES[case.stage].main(argv(case.stage, ws, **args))
    err = capsys.readouterr().err
    assert code == 2
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for needle in case.expect:
        assert needle in lines[0], f"{needle!r} not named in {lines[0]!r}"
    assert snapshot(ws) == files


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
              "mlflow-db-truncated": [pytest.mark.slow], "dask-scheduler-unreachable": [pytest.mark.slow]}


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=SUBPROCESS[c.id])
                                  for c in CASES if c.id in SUBPROCESS])
def test_bad_input_as_process(case, copy_workspace):
    """The same through ``python -m``: nothing else (no warning, no traceback) reaches stderr."""
    ws = copy_workspace
    case.setup(ws)
    files = snapshot(ws)
    args = {k: (str(ws / v) if "/" in v else v) for k, v in case.args}
    proc = run_stage(case.stage, argv(case.stage, ws, **args), ws, extra_env=case.env)
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


# (stage, the option naming its output); the training stages fail only after training, so they leave a
# checkpoint and a FAILED MLflow run (allowed: what matters is that no output is half-written).
UNWRITABLE = [("generate", "out"), ("slice", "out"),
              pytest.param("teacher", "out", marks=pytest.mark.slow, id="teacher-out"),
              pytest.param("train", "out", marks=pytest.mark.slow, id="train-out")]


@pytest.mark.parametrize(("stage", "option"), UNWRITABLE)
def test_unwritable_output_folder(stage, option, copy_workspace):
    ws = copy_workspace
    out = ws / "readonly"
    out.mkdir()
    prefix, why = _read_only(out)
    skip = ("data/ckpt/", "mlflow.db")
    files = {k: v for k, v in snapshot(ws).items() if not k.startswith(skip)}
    try:
        proc = run_stage(stage, argv(stage, ws, **{option: str(out / "result")}), ws, prefix)
    finally:
        out.chmod(0o755)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("error: "), proc.stderr
    assert str(out) in proc.stderr and why in proc.stderr
    assert {k: v for k, v in snapshot(ws).items() if not k.startswith(skip)} == files


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
    # A large pool makes the first repro's data stage take seconds, so it surely still holds that stage's lock when
    # the second (which needs the same outputs) starts; DVC locks per stage, not for a whole repro.
    repo = make_tiny_repo("repo", {"tasks": {"alignment": {"n": 400_000}}})
    first = subprocess.Popen([str(tiny_repo.VENV_BIN / "dvc"), "repro", "slice@alignment"], cwd=repo,
                             env=tiny_repo.env(repo), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not tiny_repo.stage_running(first.pid, "generate"):
            assert first.poll() is None and time.monotonic() < deadline, "the first repro never ran its stage"
            time.sleep(0.05)
        second = tiny_repo.dvc(repo, "repro", "slice@alignment", check=False, timeout=120)
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
