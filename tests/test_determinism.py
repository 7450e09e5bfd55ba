"""Determinism: two tiny pipelines run from scratch, in two folders, give identical results.

``reproduced_repo`` is one run; this test makes a second fresh copy and runs ``dvc repro`` there. Every
data and slice output has the same DVC hash, and every run (train, curve, teacher, DeiT student) has the
same accuracies, slice accuracies and bit-identical ``predictions.npz`` arrays.
"""

from __future__ import annotations

import pytest
import tiny_repo
import yaml
from test_faults import assert_same_runs

pytestmark = pytest.mark.slow


def test_two_runs_from_scratch_are_identical(make_tiny_repo, reproduced_repo):
    repo = make_tiny_repo("again")
    tiny_repo.dvc(repo, "repro", timeout=900)
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    ref = yaml.safe_load((reproduced_repo / "dvc.lock").read_text())["stages"]
    assert sorted(lock) == sorted(ref)
    for name in (n for n in lock if n.startswith(("data@", "slice@"))):
        assert lock[name]["outs"] == ref[name]["outs"], name
    for folder in ("data/runs", "data/curve", "data/teachers"):
        assert_same_runs(repo / folder, reproduced_repo / folder)
    assert (repo / "reports/tables/accuracy.csv").read_bytes() == \
        (reproduced_repo / "reports/tables/accuracy.csv").read_bytes()
