"""Shortcut floors: every baseline finds a planted shortcut and stays at chance on shuffled labels; the
stage writes floors.json from the real generated data."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import tiny_repo
import yaml

from pipeline.shortcut_bags import (
    BAG_VOCAB,
    exact_additive,
    kmeans_bags,
    pattern_bag,
    pixel_codes,
    staircase_fit,
)
from pipeline.shortcuts import (
    TREES,
    channel_histograms,
    colour_histogram,
    factor_onehot,
    fit_score,
    fit_trees,
    floors,
    foreground_area,
    tokens_bag,
    tokens_pos,
)
from pipeline.stages import generate as gen_stage
from pipeline.stages import shortcuts as shortcut_stage
from pipeline.stages import slice as slice_stage
from pipeline.tasks import TASKS
from pipeline.tasks.common import PALETTE

N, S, P = 600, 16, 4  # images, side, patch


def _canvas(rng: np.random.Generator) -> np.ndarray:
    """Dark noisy backgrounds (N, S, S, 3), values 0..40."""
    return rng.integers(0, 41, (N, S, S, 3)).astype(np.uint8)


def _scatter(images: np.ndarray, rng: np.random.Generator, counts: np.ndarray, colour) -> None:
    for i, k in enumerate(counts):
        cells = rng.choice(S * S, k, replace=False)
        images[i, cells // S, cells % S] = colour[i] if np.ndim(colour) == 2 else colour


def planted_count(rng):
    """Label = parity of the number of bright pixels (the area, not any threshold of it)."""
    k = rng.integers(2, 12, N)
    images = _canvas(rng)
    _scatter(images, rng, k, (250, 250, 250))
    return images, pd.DataFrame(index=range(N)), k % 2


def planted_channel(rng):
    """Label = the bright pixels are red or green (same count and position statistics)."""
    y = rng.integers(0, 2, N)
    images = _canvas(rng)
    colour = np.where(y[:, None] == 1, [250, 20, 20], [20, 250, 20])
    _scatter(images, rng, np.full(N, 6), colour)
    return images, pd.DataFrame(index=range(N)), y


def planted_patch(rng, by_position: bool):
    """One patch-sized bar per image in a random cell: label = bar orientation (a patch's content), or
    (by_position) whether the bar's cell lies in the left half (its position; orientation random)."""
    y, orient, cell = rng.integers(0, 2, N), rng.integers(0, 2, N), rng.integers(0, (S // P) ** 2, N)
    if by_position:
        cell = (cell // (S // P)) * (S // P) + rng.integers(0, S // P // 2, N) + (S // P // 2) * y
    else:
        orient = y
    images = _canvas(rng)
    for i in range(N):
        r, c = (cell[i] // (S // P)) * P, (cell[i] % (S // P)) * P
        if orient[i]:
            images[i, r: r + P, c + 1] = 250
        else:
            images[i, r + 1, c: c + P] = 250
    return images, pd.DataFrame(index=range(N)), y


def planted_factor(rng):
    """Label = a function of one object's colour (a factor column), another column pure noise."""
    colour = rng.integers(0, 4, N)
    return _canvas(rng), pd.DataFrame({"colour_a": colour, "xa": rng.integers(0, 12, N)}), (colour % 3 == 0)


CASES = {
    "foreground_area": (planted_count, lambda im, f: foreground_area(im), False),
    "channel_histograms": (planted_channel, lambda im, f: channel_histograms(im), False),
    "colour_histogram": (planted_channel, lambda im, f: colour_histogram(im), False),
    "tokens_bag": (lambda rng: planted_patch(rng, False), lambda im, f: tokens_bag(im, P, 0), False),
    "tokens_pos": (lambda rng: planted_patch(rng, True), lambda im, f: tokens_pos(im, P, 0), False),
    "one_object": (planted_factor, factor_onehot([["colour_a", "xa"]]), True),
}


@pytest.mark.parametrize("name", CASES)
def test_baseline_finds_a_planted_shortcut_and_not_shuffled_labels(name):
    planted, features, categorical = CASES[name]
    rng = np.random.default_rng(0)
    images, factors, y = planted(rng)
    y = np.asarray(y, dtype=np.int64)
    x = features(images, factors)
    half = N // 2
    found = fit_score(x[:half], y[:half], x[half:], y[half:], categorical)
    assert found["acc"] >= 0.95 and found["n"] == half, found
    lo, hi = found["ci"]
    assert lo <= found["acc"] <= hi <= 1.0
    shuffled = rng.permutation(y)
    control = fit_score(x[:half], shuffled[:half], x[half:], shuffled[half:], categorical)
    majority = np.bincount(shuffled[half:]).max() / half
    assert control["acc"] <= majority + 0.08, control  # no better than guessing the larger class


def test_position_blind_probe_misses_a_position_shortcut():
    images, factors, y = planted_patch(np.random.default_rng(1), by_position=True)
    x = tokens_bag(images, P, 0)
    assert fit_score(x[: N // 2], y[: N // 2], x[N // 2:], y[N // 2:])["acc"] < 0.65


def test_additive_objects_cannot_express_an_interaction():
    """Label = colour(A) == colour(B) on 2 colours (XOR): separate one-hots (no interaction) stay near chance
    under the logistic loss; the joint one-hot (interaction) solves it."""
    rng = np.random.default_rng(2)
    f = pd.DataFrame({"a": rng.integers(0, 2, N), "b": rng.integers(0, 2, N)})
    y = (f["a"] == f["b"]).to_numpy(dtype=np.int64)
    h = N // 2
    sep, joint = factor_onehot([["a"], ["b"]])(None, f), factor_onehot([["a", "b"]])(None, f)
    assert fit_score(sep[:h], y[:h], sep[h:], y[h:], True)["acc"] < 0.65
    assert fit_score(joint[:h], y[:h], joint[h:], y[h:], True)["acc"] == 1.0


@pytest.mark.slow  # a stage, a store, a browser or a long fit: make test, not test-fast
def test_floors_per_slice_on_a_task_with_unseen_offsets():
    params = tiny_repo.repo_params()
    d = TASKS["alignment"].generate(200, 0, params.geometry, params.tasks.alignment)
    role, in_dist = d.factors["role"].to_numpy(), d.factors["id"].to_numpy()
    train, test = np.flatnonzero(role == "fit")[:100], np.flatnonzero(role == "eval")
    slices = {"slice/id": test[in_dist[test]], "slice/ood": test[~in_dist[test]]}
    rec = floors("alignment", d.images, d.labels, d.factors, train, test, 2, 4, 0, slices)
    assert rec["chance"] <= 0.6 and {"foreground_area", "tokens_pos", "position_alone"} <= set(rec["baselines"])
    for name, idx in slices.items():
        got = {b: r["slices"][name] for b, r in rec["baselines"].items()}
        assert all(g["n"] == len(idx) for g in got.values())
        assert rec["floor_slices"][name] == max(g["acc"] for g in got.values())  # alignment: none sees the factor
    assert "beside_slices" not in rec and {"bag1c_pooled", "bag1c_pooled" + TREES} <= set(rec["baselines"])


@pytest.mark.slow  # a stage, a store, a browser or a long fit: make test, not test-fast
def test_arrangement_counts_no_baseline_that_sees_the_layout():
    """Arrangement's factor is where the glyphs lie: a quadrant-pooled bag or tokens with their position sees it,
    so it is reported but not counted in the floor; its position-free (global) bags are counted."""
    params = tiny_repo.repo_params()
    d = TASKS["arrangement"].generate(200, 0, params.geometry, params.tasks.arrangement)
    role = d.factors["role"].to_numpy()
    train, test = np.flatnonzero(role == "fit")[:100], np.flatnonzero(role == "eval")
    rec = floors("arrangement", d.images, d.labels, d.factors, train, test, 2, 4, 0)
    sees = {name for name, b in rec["baselines"].items() if b["uses_factor"]}
    assert {"tokens_pos", "bag3b_pooled", "kmeans_pooled"} <= sees
    assert not sees & {"bag3b_global", "kmeans_global", "tokens_bag"} and rec["floor_baseline"] not in sees
    # read by trees: every global bag (it may be a floor), no pooled one (it sees the factor: never a floor)
    trees = {name for name in rec["baselines"] if name.endswith(TREES)}
    assert trees == {name + TREES for name in rec["baselines"] if name.endswith("_global")}


@pytest.mark.slow  # a stage, a store, a browser or a long fit: make test, not test-fast
def test_shortcuts_stage_on_generated_data(tmp_path, capsys):
    arch = {"models": "resnet", "tasks": ["relation"]}
    raw = tiny_repo.params_with({
        "tasks": {"names": ["relation"], "relation": {"n": 400}},
        "slice": {"train_sizes": [100, 200, 280], "val_size": 40, "test_size": 60},
        "train": {"size": 200, "archs": {"resnet": arch},
                  "grids": {"curve": {"archs": ["resnet"], "tasks": ["relation"], "sizes": [200]}}},
        "distill": {"tasks": ["relation"], "teacher_size": 280}})
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(raw))
    data, slices, out = tmp_path / "tasks", tmp_path / "slices", tmp_path / "shortcuts"
    report = tmp_path / "reports" / "relation.md"
    assert gen_stage.main(["--params", str(params), "--task", "relation", "--out", str(data)]) == 0
    assert slice_stage.main(["--params", str(params), "--task", "relation", "--data", str(data),
                             "--out", str(slices)]) == 0
    argv = ["--params", str(params), "--task", "relation", "--data", str(data), "--slices", str(slices)]
    assert shortcut_stage.main([*argv, "--out", str(out), "--report", str(report)]) == 0
    rec = json.loads((out / "floors.json").read_text())
    assert rec["task"] == "relation" and rec["chance"] == 0.5
    counted = {k: b["acc"] for k, b in rec["baselines"].items() if not b["uses_factor"]}
    assert {"foreground_area", "tokens_bag", "a_alone"} <= set(counted)
    assert rec["floor"] == max(counted.values()) and counted[rec["floor_baseline"]] == rec["floor"]
    assert all(b["n"] == 60 and b["uses"] and b["ci"][0] <= b["acc"] <= b["ci"][1] for b in rec["baselines"].values())
    # Twin pairs give identical global counts to both labels: exactly chance on a whole-pair test split.
    assert rec["baselines"]["colour_histogram"]["acc"] == 0.5
    page = report.read_text()
    assert "| a_alone |" in page and "| slice/window=cross |" in page and "a_plus_b_exact" in rec["baselines"]
    # every slice of the splits has its own floor, named: the strongest counted baseline there
    with np.load(slices / "indices.npz") as z:
        assert set(rec["floor_slices"]) == {k for k in z.files if k.startswith("slice/") and len(z[k])}
    for name, acc in rec["floor_slices"].items():
        assert acc == max(b["slices"][name]["acc"] for b in rec["baselines"].values() if not b["uses_factor"])
        assert rec["baselines"][rec["floor_slice_baselines"][name]]["slices"][name]["acc"] == acc

    # Splits without train_<train.size>, or unreadable: one line naming the key or file, nothing written.
    fresh = tmp_path / "fresh"
    with np.load(slices / "indices.npz") as z:
        np.savez(slices / "indices.npz", test=z["test"])
    assert shortcut_stage.main([*argv, "--out", str(fresh)]) == 2
    err = capsys.readouterr().err.strip()
    assert "train.size" in err and "train_200" in err and "\n" not in err and not fresh.exists()
    (slices / "indices.npz").write_bytes(b"")
    assert shortcut_stage.main([*argv, "--out", str(fresh)]) == 2
    err = capsys.readouterr().err.strip()
    assert "indices.npz" in err and "\n" not in err and not fresh.exists()


def test_floors_include_a_linear_read_of_raw_pixels():
    # The no-architecture reference of every task: a logistic regression on every pixel, counted as a
    # floor (it does not see a factor label, only the image); on images whose class is one pixel's value it
    # reads that pixel.
    from pipeline.shortcuts import fit_score, task_baselines

    raw = {b.name: b for b in task_baselines("natural", P, 0)}["raw_pixels"]
    assert not raw.uses_factor and "raw_pixels" in {b.name for b in task_baselines("scale", P, 0)}
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(400, 8, 8, 3), dtype=np.uint8)
    labels = rng.integers(0, 2, 400)
    images[:, 3, 5, 1] = 255 * labels  # the class is one pixel's value
    x = raw.features(images, pd.DataFrame())
    assert x.shape == (400, 192)
    assert fit_score(x[:300], labels[:300], x[300:], labels[300:])["acc"] >= 0.95


def test_a_bag_of_local_patterns_reads_shape_anywhere_and_kmeans_bags_have_both_poolings():
    """Label = a plus or an x drawn at a random place: pixel position is irrelevant, the 3x3 pattern decides.
    A binarised 3x3 bag reaches 1.0 on held-out images; on shuffled labels it stays near chance."""
    rng = np.random.default_rng(3)
    images, y = _canvas(rng), rng.integers(0, 2, N)
    plus, cross = np.array([[0, 1, 0], [1, 1, 1], [0, 1, 0]]), np.array([[1, 0, 1], [0, 1, 0], [1, 0, 1]])
    for i in range(N):
        r, c = rng.integers(0, S - 3, 2)
        images[i, r: r + 3, c: c + 3][(plus if y[i] else cross) == 1] = 250
    h = N // 2
    for pooled in (False, True):
        x = pattern_bag(images, h, 3, "b", pooled)
        assert x.shape[1] <= (4 if pooled else 1) * (min(BAG_VOCAB, 2**9) + 1)
        assert (x.sum(1) == (S - 2) ** 2).all()  # every 3x3 window counted once, in one bin
        assert fit_score(x[:h], y[:h], x[h:], y[h:])["acc"] == 1.0
    shuffled = rng.permutation(y)
    x = pattern_bag(images, h, 3, "b", False)
    assert fit_score(x[:h], shuffled[:h], x[h:], shuffled[h:])["acc"] < 0.62
    g, p = kmeans_bags(images, h, 3, 0, atoms=16)
    assert g.shape[0] == p.shape[0] == N and p.shape[1] == 4 * g.shape[1]
    assert np.allclose((p**2).reshape(N, 4, -1).sum(1), g**2, rtol=1e-4)  # quadrants add up (power-normalised)


def test_colour_patterns_tell_red_from_green_where_grey_cannot():
    """Red and green of the palette share a grey level: the grey-quantised code is one, the colour code two."""
    pixels = PALETTE[None, None, :2]  # (1, 1, 2, 3): red, green
    assert len(np.unique(pixel_codes(pixels, "q")[0])) == 1 and len(np.unique(pixel_codes(pixels, "c")[0])) == 2


def test_trees_read_codes_that_occur_together_where_a_linear_read_cannot():
    """Label = whether code a occurs exactly when code b does (XOR of their presence; both classes have the same
    mean counts): a linear read of the counts stays near chance, trees read it."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 2, (2 * N, 3)).astype(np.float32)  # presence of codes a, b and an unrelated one
    y = (x[:, 0] == x[:, 1]).astype(np.int64)
    assert fit_score(x[:N], y[:N], x[N:], y[N:])["acc"] < 0.6
    assert (fit_trees(x[:N], y[:N], x[N:]) == y[N:]).mean() == 1.0


def test_exact_additive_readout_reaches_the_optimum_logistic_misses():
    """relation's structure: label 1 iff colour(B) = colour(A) + 1 (mod 4), else colour(A) - 1. Every additive
    rule u(A) + v(B) > 0 gets at most 6 of the 8 configurations; enumeration finds 0.75, the logistic fit on
    separate one-hots (palette-symmetric loss) stays near chance."""
    rng = np.random.default_rng(4)
    a = rng.integers(0, 4, 4000)
    y = rng.integers(0, 2, 4000)
    b = (a + np.where(y == 1, 1, -1)) % 4
    h = 2000
    got = exact_additive([a[:h], b[:h]], y[:h], [a[h:], b[h:]])
    assert abs((got == y[h:]).mean() - 0.75) < 0.03
    f = pd.DataFrame({"a": a, "b": b})
    sep = factor_onehot([["a"], ["b"]])(None, f)
    assert fit_score(sep[:h], y[:h], sep[h:], y[h:], True)["acc"] < (got == y[h:]).mean() - 0.1
    # brute force over every 0/1 table that is a staircase: none beats the enumeration on the training rows
    pos, neg = np.zeros((4, 4)), np.zeros((4, 4))
    np.add.at(pos, (a[:h], b[:h]), y[:h] == 1)
    np.add.at(neg, (a[:h], b[:h]), y[:h] == 0)
    table, right = staircase_fit(pos, neg)
    u, v = np.arange(4), np.arange(4)
    best = max(int((pos * t + neg * (1 - t)).sum()) for t in (
        ((u[:, None] * su + v[None, :] * sv) > th).astype(int)
        for su in (1, -1) for sv in (1, -1) for th in np.arange(-7, 8) + 0.5))
    assert right >= best and right == int((pos * table + neg * (1 - table)).sum())
    # one group: the majority label of each value (a lookup, exact)
    one = exact_additive([a[:h]], (a[:h] == 2).astype(np.int64), [a[h:]])
    assert (one == (a[h:] == 2)).all()


ARRANGEMENT_CELLS = ["row_a", "col_a", "row_b", "col_b"]


@pytest.mark.slow  # a stage, a store, a browser or a long fit: make test, not test-fast
def test_natural_pooled_bags_stand_beside_the_floor_not_in_it():
    """On natural images the quadrant-pooled bags (coarse layout) are shown beside the floor: the floor is the best
    position-free or raw baseline, ``beside_floor`` the best pooled one, and the page says which is which."""
    rng = np.random.default_rng(0)
    labels = np.repeat([0, 1], 60)
    images = rng.integers(0, 60, (120, S, S, 3), dtype=np.uint8)
    for i, y in enumerate(labels):  # the class is where a bright square lies: left half or right half
        x0 = rng.integers(0, 4) + (0 if y == 0 else 8)
        images[i, 4:10, x0:x0 + 6] = 250
    factors = pd.DataFrame({"class": labels.astype(str)})
    train, test = np.arange(0, 120, 2), np.arange(1, 120, 2)
    rec = floors("natural", images, labels, factors, train, test, 2, P, 0)
    beside = {name for name, b in rec["baselines"].items() if b["beside"]}
    assert beside == {name for name in rec["baselines"] if name.endswith("_pooled")}  # linear only (cost)
    assert "kmeans_global" + TREES in rec["baselines"] and "kmeans_pooled" + TREES not in rec["baselines"]
    assert rec["floor_baseline"] not in beside
    assert rec["floor"] == max(b["acc"] for n, b in rec["baselines"].items() if n not in beside)
    assert rec["beside_floor"] == max(rec["baselines"][n]["acc"] for n in beside) > 0.9
    assert rec["baselines"][rec["beside_baseline"]]["acc"] == rec["beside_floor"]
    page = shortcut_stage.markdown(rec)
    assert f"Shown beside, not counted: {rec['beside_baseline']}" in page and "beside (coarse layout)" in page
    assert rec["beside_slices"] == {}  # no slices given: the whole test split only
    other = floors("arrangement", images, labels, factors.assign(**{c: 0 for c in ARRANGEMENT_CELLS}), train, test, 2,
                   P, 0)
    assert "beside_floor" not in other and not any(b["beside"] for b in other["baselines"].values())


def test_the_bag_of_patches_whitens_its_patches_before_k_means():
    """Coates & Ng's recipe, whitening included (on the committed natural data a referee's whitened bag read 0.06
    above the unwhitened one): the dictionary's ZCA maps its own sample of patches to a covariance whose eigenvalues
    lie in (0, 1], the strong directions at about 1 (the regulariser only shrinks the weak ones), and the bags are
    coded in that space."""
    from pipeline.shortcut_bags import WHITEN_EPS, patch_bags, patch_dictionary, patches

    rng = np.random.default_rng(0)
    images = (rng.random((40, 12, 12, 3)) ** 3 * 255).astype(np.uint8)
    mean, white, centres = patch_dictionary(images, 3, seed=0, atoms=16, sample=2000)
    assert white.shape == (27, 27) and centres.shape == (16, 27) and np.allclose(white, white.T, atol=1e-5)
    sample = patches(images, 3).reshape(-1, 27)
    eig = np.linalg.eigvalsh(np.cov((sample - mean) @ white, rowvar=False))
    assert eig.max() <= 1.05 and eig.max() > 1 / (1 + WHITEN_EPS) - 0.1 and eig.min() > 0
    glob, pooled = patch_bags(images, (mean, white, centres), 3)
    raw = patch_bags(images, (mean, np.eye(27, dtype=np.float32), centres), 3)[0]
    assert glob.shape == (40, 16) and pooled.shape == (40, 64) and not np.allclose(glob, raw)
