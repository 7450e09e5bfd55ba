"""A throwaway tiny copy of this repository: the whole pipeline in about a minute.

Here, not in ``tests/``, because both sides use it: ``python -m bench`` reproduces a tiny copy for its DVC
figures, the tests (``tests/tiny_repo.py``, ``tests/conftest.py``) for everything that needs a real ``dvc repro``,
and neither may touch the main repository's outputs or MLflow store. :func:`params_with` is the one place a tiny
params mapping comes from: the repository's ``params.yaml`` with :data:`TINY` and the caller's overrides
deep-merged in. The copy holds the working tree's tracked files plus untracked files git does not ignore (so
uncommitted stages are exercised too), minus generated outputs (``data/``, ``dvc.lock``, the MLflow store); it gets
its own git history (DVC's experiment queue needs a commit and an identity) and its own ``mlflow.db``.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent  # the interpreter running us: DVC stages call `python` from PATH

# Overrides of params.yaml: 2 tasks of 400 images, 2 archs + a CNN teacher and its DeiT student, 1 seed,
# 20 steps of batch 16, ~20k-parameter models, a shrunken interface study. Sections another helper adds to
# params.yaml stay as they are (deep merge), so new stages run with their defaults.
TINY: dict[str, Any] = {
    "interface": {
        "widths": [8, 48], "collision_width": 16, "embed_dim": 16, "num_heads": 2, "small_tokens": 3,
        "large_tokens": 8, "random_permutations": 2, "image_size": 8, "depth": 1, "probes": 1,
        "pair_counts": {"image_size": 32, "patch_sizes": [4, 8], "window": 2, "extra_image_sizes": [64],
                        "extra_patch_size": 16},
    },
    "models": {"param_target": 20000, "param_tolerance": 0.2, "vit": {"depth": 2}, "resnet": {"layers": [1, 1]}},
    "tasks": {"names": ["alignment", "relation"], "alignment": {"n": 400, "transfer_n": 48}, "relation": {"n": 400}},
    "slice": {"train_sizes": [64, 128, 256], "val_size": 32, "test_size": 64},
    "train": {
        "archs": {"vit": {"models": "vit", "tasks": ["alignment", "relation"]},
                  "resnet": {"models": "resnet", "tasks": ["alignment", "relation"]}},
        "seeds": [0], "size": 128, "grids": {"curve": {"archs": ["resnet"], "tasks": ["alignment"], "sizes": [64]}},
        "recipe": {"steps": 20, "batch_size": 16, "warmup_steps": 2},
        "runtime": {"workers": 1, "val_every_steps": 10, "log_every_steps": 5, "checkpoint_every_steps": 5,
                    "eval_batch_size": 256},
    },
    "distill": {"teachers": {"resnet": "resnet"}, "students": {"deit": "resnet"}, "tasks": ["alignment"],
                "teacher_size": 256, "teacher_seeds": [0], "teacher_train": None},
    "tune": {"lrs": [2e-3]},  # no trials (tests/test_tune.py runs them)
}


# `bias smoke` lays these over TINY (so does the tests' shared `reproduced_repo`, which is `bias smoke --keep`'s
# copy; the tests that make their own repositories keep TINY's sizes): half the images, a
# main grid at 64 images and 10 steps. Measured stage by stage on 2 cores, the shortcut floors' logistic fits on
# train_<train.size> and the k-means dictionary were the time that scaled with the config (24 of 115 CPU s); the
# rest is each stage process importing torch, timm and Lightning. models.param_target stays: at 8000 a 2-block
# conv-stem ViT no longer mixes every token pair, and the interface stage rightly fails. Alignment is drawn at zoom 2
# (32 px, 8 px patches) beside relation at 16 px: every stage goes through a task on its own canvas.
SMOKE: dict[str, Any] = {
    "tasks": {"alignment": {"n": 256, "transfer_n": 32, "zoom": 2}, "relation": {"n": 256}},
    "slice": {"train_sizes": [32, 64, 128], "val_size": 32, "test_size": 48},
    "train": {"size": 64, "grids": {"curve": {"archs": ["resnet"], "tasks": ["alignment"], "sizes": [32]}},
              "recipe": {"steps": 10}, "runtime": {"val_every_steps": 5}},
    "distill": {"teacher_size": 128},
}


def merge(base: dict, over: dict) -> dict:
    """Deep merge: mappings merge key by key, anything else in ``over`` replaces ``base``."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


# Mappings that name what runs (architectures, teachers, students) replace the repository's, not merge.
REPLACE = {("train", "archs"), ("train", "grids"), ("distill", "teachers"), ("distill", "students")}


def params_with(overrides: dict | None = None, source: Path = ROOT / "params.yaml") -> dict:
    """The repository's params with :data:`TINY` (then ``overrides``) deep-merged in: every test's params.

    Validate with ``pipeline.config.Params.model_validate`` or write with :func:`write_params`."""
    params = merge(merge(yaml.safe_load(source.read_text()), TINY), overrides or {})
    for path in REPLACE:
        for layer in (TINY, overrides or {}):
            node, target = layer, params
            for key in path[:-1]:
                node, target = node.get(key, {}), target[key]
            if path[-1] in node:
                target[path[-1]] = copy.deepcopy(node[path[-1]])
    return params


def write_params(path: Path, params: dict) -> Path:
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def env(repo: Path) -> dict[str, str]:
    """Environment for commands in ``repo``: its own MLflow store, the venv's ``python`` first on PATH."""
    e = dict(os.environ)
    e["MLFLOW_TRACKING_URI"] = f"sqlite:///{repo / 'mlflow.db'}"
    e["PATH"] = f"{VENV_BIN}{os.pathsep}{e.get('PATH', '')}"
    e["GIT_AUTHOR_NAME"] = e["GIT_COMMITTER_NAME"] = "tiny-repo"
    e["GIT_AUTHOR_EMAIL"] = e["GIT_COMMITTER_EMAIL"] = "tiny-repo@localhost"
    e.pop("DVC_EXP_BASELINE_REV", None)
    return e


def source_files(root: Path = ROOT) -> list[str]:
    """Tracked files plus untracked ones git does not ignore, without generated outputs."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=root, check=True,
                         capture_output=True, text=True).stdout.splitlines()
    skip = ("data/", "mlflow.db", "dvc.lock", "reports/repro_timing.json")
    return sorted(f for f in out if not f.startswith(skip) and (root / f).is_file())


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, env=env(repo), check=True, capture_output=True,
                          text=True).stdout


def make_repo(dest: Path, overrides: dict | None = None) -> Path:
    """Copy the working tree to ``dest`` with tiny params, ``git init`` and commit it; returns ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for rel in source_files():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target)
    write_params(dest / "params.yaml", params_with(overrides))
    git(dest, "init", "-q", "-b", "main")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", "tiny repo")
    return dest


def dvc(repo: Path, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``dvc <args>`` in ``repo`` (raises with its output when ``check`` and it fails)."""
    proc = subprocess.run([str(VENV_BIN / "dvc"), *args], cwd=repo, env=env(repo), capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode:
        raise RuntimeError(f"dvc {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc
