"""Determinism: two tiny pipelines run from scratch, in two folders, give identical results.

``reproduced_repo`` is one run; this test makes a second fresh copy and reproduces every training stage
there (the ``train`` stage and what it depends on: the curve grid's runs and the students included; not the
interface, budget or report stages, which train nothing), to stay near a minute. Every data and slice output
has the same DVC hash, and every run (train, teacher, DeiT student) has the same accuracies, slice accuracies
and bit-identical ``predictions.npz`` arrays.
"""

from __future__ import annotations

import pytest
import tiny_repo
import yaml

pytestmark = pytest.mark.slow


def test_two_runs_from_scratch_are_identical(make_tiny_repo, reproduced_repo):
    repo = make_tiny_repo("again")
    ref = yaml.safe_load((reproduced_repo / "dvc.lock").read_text())["stages"]
    tiny_repo.dvc(repo, "repro", "train", timeout=900)
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    ran = [name for name in lock if name.startswith(("data@", "slice@")) or name == "teacher"]
    assert ran and all(name in ref for name in ran)
    for name in ran:
        if name != "teacher":
            assert lock[name]["outs"] == ref[name]["outs"], name  # byte-identical arrays
    for folder in ("data/runs", "data/teachers"):
        tiny_repo.assert_same_runs(repo / folder, reproduced_repo / folder)
