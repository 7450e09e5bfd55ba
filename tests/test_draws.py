"""Per-seed data draws (train.draw: per_seed): each seed its own class-balanced draw from the slice pool, the same
for every arm, nested over sizes, whole twin pairs, never a teacher's image."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tiny_repo

from pipeline.config import Slicing
from pipeline.errors import StageError
from pipeline.slicing import make_splits
from pipeline.split import seed_draw
from pipeline.tasks import TASKS

CFG = Slicing(train_sizes=[30, 60, 120], val_size=40, test_size=100)
WHERE = Path("indices.npz")


def _pool(task: str, n: int = 600):
    params = tiny_repo.repo_params()
    data = TASKS[task].generate(n, 0, params.geometry, getattr(params.tasks, task))
    factors = data.factors.join(TASKS[task].derive(data.factors, params))
    out = make_splits(data.labels, factors, len(data.class_names), [], CFG, seed=0, task=task,
                      twins=TASKS[task].twins)
    return data, factors, out


def test_a_seed_draws_its_own_balanced_nested_subset_from_the_pool():
    data, _, out = _pool("scale")
    pool, labels = out["pool"], data.labels
    assert not np.intersect1d(pool, out["val"]).size and not np.intersect1d(pool, out["test"]).size
    assert np.isin(out["train_120"], pool).all() and len(pool) > 120
    small, large = (seed_draw(pool, labels, n, 1, (3, 0), WHERE) for n in (60, 120))
    assert np.isin(small, large).all()  # one stream: nested over sizes
    counts = np.bincount(labels[large])
    assert counts.max() - counts.min() <= 1 and np.isin(large, pool).all() and len(np.unique(large)) == 120
    again, other = seed_draw(pool, labels, 120, 1, (3, 0), WHERE), seed_draw(pool, labels, 120, 1, (4, 0), WHERE)
    assert np.array_equal(large, again) and not np.array_equal(large, other)  # per seed, the same for every arm
    assert not np.array_equal(large, seed_draw(pool, labels, 120, 1, (3, 1), WHERE))  # data_seed: another draw
    with pytest.raises(StageError, match="pool: .* cannot give a draw of 100000"):
        seed_draw(pool, labels, 100000, 1, (0, 0), WHERE)


def test_twin_tasks_draw_whole_pairs():
    data, factors, out = _pool("relation")
    pairs = factors["pair"].to_numpy()
    k = len(data.class_names)
    assert (pairs[out["pool"]].reshape(-1, k) == pairs[out["pool"]].reshape(-1, k)[:, :1]).all()
    got = seed_draw(out["pool"], data.labels, 60, k, (1, 0), WHERE)
    assert np.bincount(np.unique(pairs[got], return_counts=True)[1]).tolist() == [0, 0, 30]  # 30 whole pairs
    with pytest.raises(StageError, match="twin pairs cannot give a draw of 61"):
        seed_draw(out["pool"], data.labels, 61, k, (1, 0), WHERE)


def test_runs_draw_from_the_pool_less_the_teacher_set_and_arms_share_a_seed_draw():
    from types import SimpleNamespace

    from pipeline.grid import RunKey
    from pipeline.split import Split, teacher_set, training_indices

    params = tiny_repo.repo_params()
    params = params.model_copy(update={"distill": params.distill.model_copy(update={"teacher_size": 120}),
                                       "train": params.train.model_copy(update={"size": 60})})
    data, _, out = _pool("scale")
    split = Split(data.images, data.labels, out, len(data.class_names))

    def spec(arch: str, seed: int, kind: str = "run"):
        return SimpleNamespace(slices_dir=Path("."), kind=kind, key=RunKey("scale", arch, seed, 60, 100, "steps"))

    held = teacher_set(split, params, "scale", WHERE)
    assert len(held) == 60 and np.array_equal(training_indices(spec("resnet", 0, "teacher"), split, params), held)
    vit, deit = (training_indices(spec(a, 2), split, params) for a in ("vit", "deit"))
    assert np.array_equal(vit, deit) and not np.intersect1d(vit, held).size
    assert not np.array_equal(vit, training_indices(spec("vit", 3), split, params))
    fixed = params.model_copy(update={"train": params.train.model_copy(update={"draw": "fixed"})})
    assert np.array_equal(training_indices(spec("vit", 2), split, fixed), out["train_60"])
