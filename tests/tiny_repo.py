"""The tests' tiny params and repository helpers; the repository copy itself lives in :mod:`bench.tiny`.

:func:`params_with`, :func:`make_repo`, :func:`dvc` and the rest of the tiny copy's machinery are
:mod:`bench.tiny`'s, re-exported here so tests keep importing them from ``tiny_repo`` (``python -m bench`` needs
them too, and bench imports nothing from ``tests/``). What only tests use stays here: :func:`stage_running` and
:func:`assert_same_runs` serve the fault tests (which are also the determinism test); :data:`SMALL` and
:func:`repo_params` the model and config tests.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import yaml

from bench.tiny import (
    REPLACE,
    ROOT,
    TINY,
    VENV_BIN,
    dvc,
    env,
    git,
    make_repo,
    merge,
    params_with,
    source_files,
    write_params,
)

__all__ = ["REPLACE", "ROOT", "SMALL", "TINY", "VENV_BIN", "assert_same_runs", "dvc", "env", "git", "make_repo",
           "merge", "params_with", "repo_params", "runs", "small_params", "source_files", "stage_running",
           "write_params"]


def stage_running(session: int, module: str) -> bool:
    """Is a process of ``session`` running ``python -m pipeline.stages.<module>``?"""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.getsid(int(pid)) != session:
                continue
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ProcessLookupError):
            continue
        if f"pipeline.stages.{module}".encode() in cmd:
            return True
    return False


def runs(folder: Path) -> dict[str, dict]:
    """Per run: what a result is (accuracies, slices) and its predictions."""
    out = {}
    for metrics in sorted(folder.rglob("metrics.json")):
        m = json.loads(metrics.read_text())
        with np.load(metrics.parent / "predictions.npz") as z:
            preds = {k: z[k] for k in z.files}
        out[str(metrics.parent.relative_to(folder))] = {
            "acc": {k: m.get(k) for k in ("test_acc", "val_acc", "slices")}, "preds": preds}
    return out


def assert_same_runs(got: Path, want: Path) -> None:
    a, b = runs(got), runs(want)
    assert a and sorted(a) == sorted(b)
    for name in a:
        assert a[name]["acc"] == b[name]["acc"], name
        assert sorted(a[name]["preds"]) == sorted(b[name]["preds"]), name
        for key, array in a[name]["preds"].items():
            assert np.array_equal(array, b[name]["preds"][key]), (name, key)


# Small models at the default 16-px geometry. Swin: a 4x4 then 2x2 token grid with 2x2 windows (stage 0 shifts,
# stage 1 is one window and cannot); patch 4 and one merge, so the evaluated sizes step by 8.
SMALL = {
    "models": {
        "param_target": 8000, "param_tolerance": 0.3, "reference_classes": 3,
        "vit": {"depth": 2, "num_heads": 2, "mlp_ratio": 2.0},
        "swin": {"patch_size": 4, "window_size": 2, "depths": [2, 2], "num_heads": [2, 4], "mlp_ratio": 2.0},
        "resnet": {"layers": [1, 1]},
    },
    "evaluation": {"resolution": {"sizes": [16, 24, 32]}},
}


def small_params(overrides: dict | None = None) -> dict:
    """The repository's ``params.yaml`` with :data:`SMALL` (then ``overrides``) deep-merged in, unvalidated."""
    return merge(merge(yaml.safe_load((ROOT / "params.yaml").read_text()), SMALL), overrides or {})


def repo_params(overrides: dict | None = None):
    """The repository's own ``params.yaml`` (no :data:`TINY`), deep-merged with ``overrides``, validated."""
    from pipeline.config import Params

    return Params.model_validate(merge(yaml.safe_load((ROOT / "params.yaml").read_text()), overrides or {}))
