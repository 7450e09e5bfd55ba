"""Slicing: nested balanced subsets, disjoint splits, evaluation slices, errors, and the stage end to end."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import tiny_repo
import yaml

from pipeline.config import Slicing
from pipeline.errors import ConfigError, StageError
from pipeline.slicing import (
    check_splits,
    check_twins,
    first_copies,
    image_digests,
    make_splits,
    manifest,
    per_class_counts,
)
from pipeline.stages import generate as gen_stage
from pipeline.stages import slice as slice_stage
from pipeline.tasks import TASKS

CFG = Slicing(train_sizes=[30, 60, 120], val_size=40, test_size=100)


def pool(task: str, n: int = 600):
    params = tiny_repo.repo_params()
    cfg = getattr(params.tasks, task)
    data = TASKS[task].generate(n, 0, params.geometry, cfg)
    factors = data.factors.join(TASKS[task].derive(data.factors, params))
    return data, factors


@pytest.mark.parametrize("task", ["alignment", "scale", "relation", "arrangement"])
def test_splits_are_nested_balanced_disjoint(task):
    data, factors = pool(task)
    k = len(data.class_names)
    out = make_splits(data.labels, factors, k, TASKS[task].slice_factors, CFG, seed=0, task=task,
                      twins=TASKS[task].twins)
    role = factors["role"].to_numpy()
    assert (role[out["test"]] == "eval").all() and (role[out["val"]] == "fit").all()
    for n in CFG.train_sizes:
        idx = out[f"train_{n}"]
        assert idx.dtype == np.int64 and len(idx) == n and (np.diff(idx) > 0).all()
        counts = np.bincount(data.labels[idx], minlength=k)
        assert counts.max() - counts.min() <= 1
    assert np.isin(out["train_30"], out["train_60"]).all() and np.isin(out["train_60"], out["train_120"]).all()
    assert not np.intersect1d(out["train_120"], out["val"]).size and not np.intersect1d(out["val"], out["test"]).size
    slices = [name for name in out if name.startswith("slice/")]
    for col in TASKS[task].slice_factors:
        assert any(s.startswith(f"slice/{col}=") for s in slices), col
    # Each factor's slices partition the test split.
    col = TASKS[task].slice_factors[0]
    parts = np.concatenate([out[s] for s in slices if s.startswith(f"slice/{col}=")])
    np.testing.assert_array_equal(np.sort(parts), out["test"])
    again = make_splits(data.labels, factors, k, TASKS[task].slice_factors, CFG, seed=0, task=task,
                        twins=TASKS[task].twins)
    assert all(np.array_equal(out[key], again[key]) for key in out)
    other = make_splits(data.labels, factors, k, TASKS[task].slice_factors, CFG, seed=1, task=task,
                        twins=TASKS[task].twins)
    assert not np.array_equal(out["train_120"], other["train_120"])


def _pair_sets(z, names: list[str], pairs: np.ndarray) -> dict[str, set]:
    return {name: set(pairs[z[name]].tolist()) for name in names}


def stage_params(task: str, n: int, slices: dict) -> dict:
    """Tiny params generating only ``task``; the training grid uses only it and the sliced sizes."""
    small, teacher = slices["train_sizes"][0], slices["train_sizes"][1]
    arch = {"models": "resnet", "tasks": [task]}
    return tiny_repo.params_with({
        "tasks": {"names": [task], task: {"n": n}}, "slice": slices,
        "train": {"size": small, "archs": {"resnet": arch},
                  "grids": {"curve": {"archs": ["resnet"], "tasks": [task], "sizes": [small]}}},
        "distill": {"tasks": [task], "teacher_size": teacher}})


@pytest.mark.parametrize("task", ["relation", "arrangement"])
def test_twin_aware_splits_on_generated_data(task, tmp_path):
    """On the data and slice stages' real outputs: no twin pair straddles train/val/test, test and every
    slice hold whole pairs, the nested subsets stay nested and exactly class-balanced; the manifest says so."""
    raw = stage_params(task, 800, {"train_sizes": [40, 100, 200], "val_size": 60, "test_size": 120})
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(raw))
    data, out = tmp_path / "tasks", tmp_path / "slices"
    assert gen_stage.main(["--params", str(params), "--task", task, "--out", str(data)]) == 0
    assert slice_stage.main(["--params", str(params), "--task", task, "--data", str(data), "--out", str(out)]) == 0
    factors = pd.read_csv(data / "factors.csv")
    pairs, labels = factors["pair"].to_numpy(), np.load(data / "labels.npy")
    with np.load(out / "indices.npz") as z:
        arrays = {name: z[name] for name in z.files}
    sets = _pair_sets(arrays, ["train_200", "val", "test"], pairs)
    assert not sets["train_200"] & sets["val"] and not sets["train_200"] & sets["test"]
    assert not sets["val"] & sets["test"]
    for name, idx in arrays.items():  # whole pairs: every touched pair is there with both twins
        assert np.isin(np.flatnonzero(np.isin(pairs, pairs[idx])), idx).all(), name
        assert len(idx) == 2 * len(np.unique(pairs[idx])), name
    for small, big in (("train_40", "train_100"), ("train_100", "train_200")):
        assert np.isin(arrays[small], arrays[big]).all()
    for n in (40, 100, 200):
        assert np.bincount(labels[arrays[f"train_{n}"]]).tolist() == [n // 2, n // 2]
    assert any(name.startswith("slice/") for name in arrays)
    man = json.loads((out / "manifest.json").read_text())
    assert man["twin_aware"] is True and man["twin_column"] == "pair"


def test_twin_checks_refuse_straddles_and_odd_sizes():
    pairs = np.repeat(np.arange(6), 2)
    good = {"train_2": np.array([0, 1]), "val": np.array([2, 3]), "test": np.array([4, 5, 6, 7])}
    check_twins(good, pairs)
    with pytest.raises(StageError, match="val: shares a twin pair with test"):
        check_twins({**good, "val": np.array([2, 3, 5])}, pairs)
    with pytest.raises(StageError, match="slice/a=1: holds incomplete twin pairs"):
        check_twins({**good, "slice/a=1": np.array([4])}, pairs)
    data, factors = pool("relation")
    odd = Slicing(train_sizes=[31], val_size=40, test_size=100)
    with pytest.raises(ConfigError, match="slice.train_sizes: 31"):
        make_splits(data.labels, factors, 2, [], odd, seed=0, task="relation", twins="pair")
    with pytest.raises(StageError, match="twins"):  # a 'pair' column that does not pair the classes
        make_splits(data.labels, factors.assign(pair=np.arange(len(factors))), 2, [], CFG, seed=0,
                    task="relation", twins="pair")


def test_id_and_ood_slices_where_a_training_range_exists():
    data, factors = pool("alignment")
    out = make_splits(data.labels, factors, len(data.class_names), ["offset"], CFG, seed=0, task="alignment")
    assert len(out["slice/id"]) + len(out["slice/ood"]) == len(out["test"])
    assert factors["id"].to_numpy()[out["slice/id"]].all() and not factors["id"].to_numpy()[out["slice/ood"]].any()
    assert "slice/offset=3,3" in out  # every alignment is tested, though training saw dx, dy in [0, 1]
    data, factors = pool("arrangement")  # no training range: no id/ood slices
    assert "slice/id" not in make_splits(data.labels, factors, 2, ["dcol"], CFG, seed=0, task="arrangement")


def test_per_class_counts_are_monotone():
    prev = per_class_counts(0, 3)
    for n in range(1, 50):
        cur = per_class_counts(n, 3)
        assert cur.sum() == n and (cur >= prev).all()
        prev = cur


@pytest.mark.parametrize("cfg, key", [
    (Slicing(train_sizes=[30, 5000], val_size=40, test_size=100), "slice.train_sizes"),
    (Slicing(train_sizes=[30], val_size=40, test_size=5000), "slice.test_size"),
    (Slicing(train_sizes=[30], val_size=5000, test_size=100), "slice.val_size"),
])
def test_too_small_pool_names_the_key(cfg, key):
    data, factors = pool("scale")
    with pytest.raises(ConfigError, match=key):
        make_splits(data.labels, factors, len(data.class_names), ["size"], cfg, seed=0, task="scale")


def test_check_splits_refuses_overlap_and_empty():
    good = {"train_2": np.array([0, 1]), "val": np.array([2]), "test": np.array([3, 4]), "slice/a=1": np.array([3])}
    check_splits(good)
    with pytest.raises(StageError, match="val: overlaps test"):
        check_splits({**good, "val": np.array([3])})
    with pytest.raises(StageError, match="slice/a=1: empty"):
        check_splits({**good, "slice/a=1": np.array([], dtype=np.int64)})
    with pytest.raises(StageError, match="not a subset of test"):
        check_splits({**good, "slice/a=1": np.array([0])})


@pytest.mark.parametrize("task", ["alignment", "scale", "relation", "arrangement"])
def test_no_image_in_two_splits_by_content(task):
    """Every task's pool, with each image repeated (a generator may redraw a small image): no pixel-identical image
    lies in two of train/val/test/transfer; checked by hash, the way the slice stage draws."""
    data, factors = pool(task)
    images = np.concatenate([data.images, data.images])
    labels = np.concatenate([data.labels, data.labels])
    twins = TASKS[task].twins
    doubled = pd.concat([factors, factors.assign(**({twins: factors[twins] + factors[twins].max() + 1}
                                                    if twins else {}))], ignore_index=True)
    digests = image_digests(images)
    assert first_copies(digests).sum() == len(np.unique(digests)) <= len(data.labels)
    out = make_splits(labels, doubled, len(data.class_names), TASKS[task].slice_factors, CFG, seed=0, task=task,
                      twins=twins, digests=digests)
    held = [out[f"train_{CFG.train_sizes[-1]}"], out["val"], out["test"], out.get("transfer", np.array([], int))]
    for i, a in enumerate(held):
        for b in held[i + 1:]:
            assert not np.intersect1d(digests[a], digests[b]).size
    blind = make_splits(labels, doubled, len(data.class_names), TASKS[task].slice_factors, CFG, seed=0, task=task,
                        twins=twins)  # without digests the doubled pool does put copies in two splits
    assert np.intersect1d(digests[blind["val"]], digests[blind["test"]]).size or \
        np.intersect1d(digests[blind[f"train_{CFG.train_sizes[-1]}"]], digests[blind["val"]]).size


def test_check_splits_refuses_pixel_identical_copies():
    good = {"train_2": np.array([0, 1]), "val": np.array([2]), "test": np.array([3, 4])}
    check_splits(good, np.array([10, 11, 12, 13, 14], dtype=np.uint64))
    with pytest.raises(StageError, match="val: holds an image pixel-identical to one in test"):
        check_splits(good, np.array([10, 11, 12, 12, 14], dtype=np.uint64))


def test_manifest_records_sizes_counts_hashes_and_ranges():
    data, factors = pool("scale")
    out = make_splits(data.labels, factors, len(data.class_names), ["size"], CFG, seed=0, task="scale")
    man = manifest(out, data.labels, factors, data.class_names, {"labels_sha256": "x"})
    assert man["arrays"]["train_120"]["size"] == 120
    assert sum(man["arrays"]["val"]["class_counts"].values()) == 40
    assert len(man["arrays"]["test"]["sha256"]) == 64
    hi = tiny_repo.repo_params().tasks.scale.train_sizes[1]  # the largest training size; test goes beyond
    assert man["factor_ranges"]["train_120"]["size"][1] <= hi < man["factor_ranges"]["test"]["size"][1]


def test_slice_stage_end_to_end(tmp_path, capsys):
    raw = stage_params("relation", 600, {"train_sizes": [50, 100], "val_size": 50, "test_size": 100})
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(raw))
    data = tmp_path / "tasks" / "relation"
    assert gen_stage.main(["--params", str(params), "--task", "relation", "--out", str(data)]) == 0
    outs = []
    for run in ("a", "b"):
        out = tmp_path / run
        assert slice_stage.main(["--params", str(params), "--task", "relation", "--data", str(data),
                                 "--out", str(out)]) == 0
        outs.append(out)
    blob = (outs[0] / "indices.npz").read_bytes()
    assert blob == (outs[1] / "indices.npz").read_bytes()  # byte-deterministic
    with np.load(outs[0] / "indices.npz") as z:
        assert {"train_50", "train_100", "val", "test", "slice/window=same", "slice/window=cross",
                "slice/distance_tokens=3"} <= set(z.files)
        assert z["train_100"].dtype == np.int64
    man = json.loads((outs[0] / "manifest.json").read_text())
    meta = json.loads((data / "meta.json").read_text())
    assert man["source"]["labels_sha256"] == meta["sha256"]["labels"] and man["twin_aware"] is True

    # Too large a training size: one line naming the key, no output folder.
    raw["slice"]["train_sizes"] = [50, 100, 10_000]
    params.write_text(yaml.safe_dump(raw))
    fresh = tmp_path / "fresh"
    assert slice_stage.main(["--params", str(params), "--task", "relation", "--data", str(data),
                             "--out", str(fresh)]) == 2
    err = capsys.readouterr().err.strip()
    assert "slice.train_sizes" in err and "\n" not in err and not fresh.exists()

    # Labels modified after generation: refused.
    labels = np.load(data / "labels.npy")
    np.save(data / "labels.npy", 1 - labels)
    raw["slice"]["train_sizes"] = [50, 100]
    params.write_text(yaml.safe_dump(raw))
    assert slice_stage.main(["--params", str(params), "--task", "relation", "--data", str(data),
                             "--out", str(fresh)]) == 2
    assert "sha256" in capsys.readouterr().err and not fresh.exists()
