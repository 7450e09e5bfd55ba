"""Tasks: interface, determinism, factors read back from pixels, invariance proofs, CIFAR loading, stage I/O."""

from __future__ import annotations

import io
import json
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
import tiny_repo
import yaml
from PIL import Image

from pipeline.config import Geometry, parse_params
from pipeline.errors import ConfigError, StageError
from pipeline.shortcut_bags import pattern_bag
from pipeline.shortcuts import TREES, fit_predict, fit_trees, floors
from pipeline.stages import generate as gen_stage
from pipeline.tasks import TASKS
from pipeline.tasks.common import TaskData, image_to_cells
from pipeline.tasks.natural import CLASSES, NaturalParams, read_cifar10, resize
from pipeline.tasks.relation import PALETTE, near_pairs, window_factors

SYNTHETIC = [name for name in TASKS if name != "natural"]  # every generated task: a new one is tested too
REPO = tiny_repo.repo_params()
GEO = REPO.geometry  # 16 px, P = 4


def make(task: str, n: int = 400, seed: int = 0, geometry: Geometry = GEO, **overrides) -> TaskData:
    base = getattr(REPO.tasks, task)
    if "transfer_n" in type(base).model_fields:  # the pool alone, unless a test asks for transfer rows
        overrides = {"transfer_n": 0, **overrides}
    cfg = base.model_copy(update=overrides)
    return TASKS[task].generate(n, seed, geometry, cfg)


def background(images: np.ndarray) -> np.ndarray:
    """(N, C): the most frequent colour per image (objects cover far fewer pixels than the background)."""
    n, h, w, c = images.shape
    flat = images.reshape(n, h * w, c).astype(np.int64)
    packed = (flat[..., 0] << 16) | (flat[..., 1] << 8) | flat[..., 2]
    mode = np.array([np.bincount(np.unique(p, return_inverse=True)[1]).argmax() for p in packed])
    uniq = [np.unique(p) for p in packed]
    val = np.array([u[m] for u, m in zip(uniq, mode, strict=True)])
    return np.stack([(val >> 16) & 255, (val >> 8) & 255, val & 255], axis=1)


def bbox(mask: np.ndarray) -> tuple[np.ndarray, ...]:
    """mask (N, H, W) -> (ymin, xmin, ymax, xmax) per image."""
    rows, cols = mask.any(2), mask.any(1)
    h = mask.shape[1]
    return (rows.argmax(1), cols.argmax(1), h - 1 - rows[:, ::-1].argmax(1), h - 1 - cols[:, ::-1].argmax(1))


# --------------------------------------------------------------------------- interface and determinism
@pytest.mark.parametrize("task", SYNTHETIC)
def test_interface_determinism_and_balance(task):
    a, b, c = make(task), make(task), make(task, seed=1)
    assert a.images.dtype == np.uint8 and a.images.shape == (400, 16, 16, 3)
    assert a.labels.dtype == np.int64 and a.labels.shape == (400,) and len(a.factors) == 400
    assert a.images.tobytes() == b.images.tobytes() and a.labels.tobytes() == b.labels.tobytes()
    assert a.factors.equals(b.factors)
    assert a.images.tobytes() != c.images.tobytes()
    k = len(a.class_names)
    assert set(a.factors["role"]) == {"fit", "eval"}
    for role in ("fit", "eval"):
        counts = np.bincount(a.labels[a.factors["role"].to_numpy() == role], minlength=k)
        assert counts.max() - counts.min() <= 1, (role, counts)
    assert (a.factors.loc[a.factors["role"] == "fit", "id"]).all()


def test_tasks_draw_independent_streams():
    assert make("alignment").labels.tobytes() != make("scale").labels.tobytes()


def test_scale_transfer_rows_are_unseen_sizes_and_leave_the_pool_alone():
    pool, both = make("scale"), make("scale", transfer_n=120)
    assert both.images[:400].tobytes() == pool.images[:400].tobytes()  # appended from their own stream
    rows = both.factors.iloc[400:]
    lo, hi = REPO.tasks.scale.train_sizes
    assert set(rows["role"]) == {"transfer"} and not rows["id"].any() and len(rows) == 120
    assert set(rows["size"]) == {s for s in range(REPO.tasks.scale.min_size, REPO.tasks.scale.max_size + 1)
                                 if not lo <= s <= hi}
    _, _, ymax, xmax = bbox((both.images[400:] != background(both.images[400:])[:, None, None, :]).any(-1))
    assert (np.maximum(ymax - rows["y"].to_numpy(), xmax - rows["x"].to_numpy()) < rows["size"].to_numpy()).all()


# --------------------------------------------------------------------------- alignment
def test_alignment_transfer_rows_are_unseen_offsets_and_leave_the_pool_alone():
    pool, both = make("alignment"), make("alignment", transfer_n=120)
    assert both.images[:400].tobytes() == pool.images[:400].tobytes()  # appended from their own stream
    assert both.labels[:400].tobytes() == pool.labels[:400].tobytes() and len(both.labels) == 520
    rows = both.factors.iloc[400:]
    assert set(rows["role"]) == {"transfer"} and not rows["id"].any()
    lo, hi = REPO.tasks.alignment.train_offsets
    outside = ~(rows.dx.between(lo, hi) & rows.dy.between(lo, hi))
    assert outside.all() and set(rows.dx) | set(rows.dy) >= {GEO.patch_size - 1}
    counts = np.bincount(both.labels[400:], minlength=len(both.class_names))
    assert counts.max() - counts.min() <= 1
    bg = background(both.images[400:])
    mask = (both.images[400:] != bg[:, None, None, :]).any(-1)
    ymin, xmin, _, _ = bbox(mask)  # the offsets are the ones recorded, read back from the pixels
    np.testing.assert_array_equal(xmin % GEO.patch_size, rows["dx"])
    np.testing.assert_array_equal(ymin % GEO.patch_size, rows["dy"])


def test_alignment_pairs_put_every_dot_at_the_offset_pixel_of_its_patch():
    """A 9 px box (1 mod P): its four dots all sit at pixel (dx, dy) of their patches, so an unseen offset is a
    patch pixel where no training image had a dot."""
    d = make("alignment", n=400)
    bg = background(d.images)
    rows, ys, xs = np.nonzero((d.images != bg[:, None, None, :]).any(-1))
    assert (np.bincount(rows) == 4).all()
    np.testing.assert_array_equal(ys % GEO.patch_size, d.factors["dy"].to_numpy()[rows])
    np.testing.assert_array_equal(xs % GEO.patch_size, d.factors["dx"].to_numpy()[rows])


def test_alignment_offset_read_back_from_pixels():
    d = make("alignment", n=2000, train_offsets=[0, 1], noise=0, clutter=0)  # clean: read back exactly
    bg = background(d.images)
    mask = (d.images != bg[:, None, None, :]).any(-1)
    ymin, xmin, _, _ = bbox(mask)  # every glyph has its pixel (0, 0) on: bbox corner = glyph origin
    f = d.factors
    p = GEO.patch_size
    np.testing.assert_array_equal(xmin % p, f["dx"])
    np.testing.assert_array_equal(ymin % p, f["dy"])
    np.testing.assert_array_equal(xmin // p, f["cell_x"])  # whole-patch position = a scene shift by k*P
    fit = f[f["role"] == "fit"]
    assert fit["dx"].between(0, 1).all() and fit["dy"].between(0, 1).all()
    ev = f[f["role"] == "eval"]
    assert ev["offset"].nunique() == p * p  # the test range covers every alignment
    np.testing.assert_array_equal(ev["id"], ev["dx"].le(1) & ev["dy"].le(1))


@pytest.mark.parametrize("k, size, flips", [(4, 3, 2), (2, 3, 4), (3, 3, 1), (4, 4, 3), (2, 3, 3)])
def test_glyphs_differ_by_exactly_twice_the_flips_and_have_equal_area(k, size, flips):
    from pipeline.tasks.common import glyph_bank

    for seed in range(20):
        g = glyph_bank(np.random.default_rng(seed), k, size, flips).reshape(k, -1)
        dist = (g[:, None] != g[None]).sum(-1)
        assert (dist[~np.eye(k, dtype=bool)] == 2 * flips).all() and g[:, 0].all()
        assert len(set(g.sum(1).tolist())) == 1  # equal pixel counts: area is no shortcut


# --------------------------------------------------------------------------- scale
def test_scale_size_and_straddle_read_back_from_pixels():
    d = make("scale", n=1000)
    keep = (d.factors["size"] <= 11).to_numpy()  # a 12 px square covers most of a 16 px image: no bg mode
    images, f = d.images[keep], d.factors[keep]
    bg = background(images)
    ymin, xmin, ymax, xmax = bbox((images != bg[:, None, None, :]).any(-1))
    np.testing.assert_array_equal(np.maximum(ymax - ymin, xmax - xmin) + 1, f["size"])
    np.testing.assert_array_equal(xmin, f["x"])
    p = GEO.patch_size
    straddles = (ymin // p != ymax // p) | (xmin // p != xmax // p)
    np.testing.assert_array_equal(straddles, f["straddles"])
    f = d.factors
    fit = f[f["role"] == "fit"]
    lo, hi = REPO.tasks.scale.train_sizes
    assert fit["size"].between(lo, hi).all() and not f["size"].between(lo, hi).all()  # unseen sizes: eval rows
    p, sizes = GEO.patch_size, range(REPO.tasks.scale.min_size, REPO.tasks.scale.max_size + 1)
    assert set(f["size_bin"]) == {"sub" if s < p else "patch" if s < 2 * p else "multi" for s in sizes}


@pytest.mark.parametrize("task", ["scale", "alignment"])
def test_pairs_read_back_from_pixels(task):
    """Four dots at the box's corners in two palette colours: the two dots of the top row share a colour exactly
    when the class is ``rows``, those of the left column when it is ``columns``; nothing else is drawn."""
    from pipeline.tasks.common import PALETTE

    cfg = getattr(REPO.tasks, task)
    assert cfg.objects == "pairs" and cfg.dot == 1  # what params.yaml runs
    d = make(task, n=600)
    assert d.class_names == ["rows", "columns"]
    sizes = d.factors["size"] if task == "scale" else np.full(len(d.labels), cfg.box)
    for i, (r, size) in enumerate(zip(d.factors.itertuples(), sizes, strict=True)):
        ys, xs = [r.y, r.y + size - 1], [r.x, r.x + size - 1]
        corner = {(a, b): d.images[i, y, x] for a, y in enumerate(ys) for b, x in enumerate(xs)}
        assert all((c == PALETTE[:cfg.colours]).all(-1).any() for c in corner.values())
        top, left = np.array_equal(corner[0, 0], corner[0, 1]), np.array_equal(corner[0, 0], corner[1, 0])
        assert (top, left) == ((True, False) if d.labels[i] == 0 else (False, True))
        assert not np.array_equal(corner[0, 0], corner[1, 1]) and not np.array_equal(corner[0, 1], corner[1, 0])
    bg = background(d.images)
    drawn = (d.images != bg[:, None, None, :]).any(-1)
    assert (drawn.sum((1, 2)) == 4).all() and (bg < 64).all()  # the dots on a dark background, nothing else


@pytest.mark.slow
def test_the_battery_finds_the_pairs_border_leak():
    """The pairs' known leak (a referee's, 2026-12-07): a window near the image border shows how far its dot lies
    from the border, and only in class ``rows`` do a colour's two dots share that distance to the top. A linear
    read of the position-free colour bag stays near chance (its class means are equal); the same bag read by
    trees, as the battery reads every bag, reads the class, on the whole test split and at the unseen sizes."""
    d = make("scale", n=2400)
    fit, test = np.flatnonzero(d.factors["role"] == "fit"), np.flatnonzero(d.factors["role"] == "eval")
    rows = np.concatenate([fit, test])
    x, labels, n = pattern_bag(d.images[rows], 1500, 3, "c", pooled=False), d.labels[rows], len(fit)
    unseen = ~d.factors["id"].to_numpy()[test]
    linear = fit_predict(x[:1500], labels[:1500], x[n:], x_val=x[1500:n], y_val=labels[1500:n]) == labels[n:]
    trees = fit_trees(x[:1500], labels[:1500], x[n:], x_val=x[1500:n], y_val=labels[1500:n]) == labels[n:]
    assert linear.mean() <= 0.6
    assert trees.mean() >= 0.75 and trees[unseen].mean() >= 0.65  # 1,500 training rows; 0.93 at the study's 4,000


@pytest.mark.slow
def test_a_margin_closes_the_border_leak_and_a_quadrant_reader_still_solves_the_pairs():
    """The leak's fix (docs/history.md, 2026-12-07): on a 32 px canvas (8 px patches) with every dot at least 5 px
    from each edge, no window of the battery (5 px at most) sees a dot's distance to an edge, so every global bag
    stays near chance, read by trees too (at 16 px they read the class: the test above). It is not enough: a box
    that straddles the image's midlines puts its colours in known quadrants, and the quadrant-pooled bags read by
    trees name the class at sizes never trained on; they count in the floor (a shortcut: no size in them)."""
    geo = Geometry(image_size=32, patch_size=8, channels=3)
    d = make("scale", n=700, geometry=geo, min_size=6, max_size=22, train_sizes=[9, 16], margin=5)
    fit, test = np.flatnonzero(d.factors["role"] == "fit"), np.flatnonzero(d.factors["role"] == "eval")
    unseen = test[~d.factors["id"].to_numpy()[test]]
    got = floors("scale", d.images, d.labels, d.factors, fit[:420], test, 2, geo.patch_size, 0,
                 slices={"slice/ood": unseen}, val=fit[420:])  # global bags at most 0.52, the pooled floor 0.96
    glob = {n: b for n, b in got["baselines"].items() if n.removesuffix(TREES).endswith("_global")}
    assert all(b["acc"] <= 0.6 and b["slices"]["slice/ood"]["acc"] <= 0.6 for b in glob.values()), "leak"
    assert got["floor_slice_baselines"]["slice/ood"].endswith("_pooled" + TREES)
    assert got["floor_slices"]["slice/ood"] >= 0.75 and "beside_floor" not in got


def test_the_margin_keeps_the_pairs_off_the_edges():
    """``margin`` px stay free of dots at each edge (scale: any box; alignment: the cells it may use); with none,
    the pairs reach the edges."""
    geo = Geometry(image_size=32, patch_size=8, channels=3)
    for task, extra in (("scale", {"max_size": 20}), ("alignment", {})):
        for margin in (0, 6):
            d = make(task, n=300, geometry=geo, margin=margin, **extra)
            dots = (d.images != background(d.images)[:, None, None, :]).any(-1)
            near = [dots[:, :6].any(), dots[:, -6:].any(), dots[:, :, :6].any(), dots[:, :, -6:].any()]
            assert all(near) if margin == 0 else dots.any() and not any(near), (task, margin)
    with pytest.raises(ValueError, match="tasks.scale.max_size: 16 px does not fit a 16 px image with a 1 px margin"):
        parse_params(tiny_repo.small_params({"tasks": {"scale": {"margin": 1}}}), "p")


def test_scale_shape_and_quarter_turn_read_back_from_pixels():
    """The ``shapes`` objects: inside its box each image shows exactly its class's shape turned by its
    `rotation` factor."""
    from pipeline.shapes import shape_mask

    d = make("scale", n=400, objects="shapes", shapes=["zed", "ess"], min_size=3, max_size=12, train_sizes=[5, 8],
             rotate=True)  # the quarter turns are an option
    fg = (d.images != background(d.images)[:, None, None, :]).any(-1)
    names = ["zed", "ess"]
    for i, r in enumerate(d.factors.itertuples()):
        box = fg[i, r.y:r.y + r.size, r.x:r.x + r.size]
        np.testing.assert_array_equal(box, np.rot90(shape_mask(names[d.labels[i]], r.size), r.rotation // 90))
    assert set(d.factors["rotation"]) == {0, 90, 180, 270}


@pytest.mark.parametrize("size", range(3, 13))
def test_zed_and_ess_differ_only_in_arrangement(size):
    """Mirror images with equal area that no quarter turn maps onto each other: orientation-free local parts
    (corners, bar ends) are shared, so a shape's class is in how its parts are arranged."""
    from pipeline.shapes import shape_mask

    zed, ess = shape_mask("zed", size), shape_mask("ess", size)
    assert np.array_equal(ess, zed[:, ::-1]) and zed.sum() == ess.sum()
    assert not any(np.array_equal(np.rot90(zed, k), ess) for k in range(4))


# --------------------------------------------------------------------------- relation
def _frames(images: np.ndarray, level: int) -> tuple[np.ndarray, np.ndarray]:
    mask = (images == level).all(-1)
    ymin, xmin, _, _ = bbox(mask)
    return ymin, xmin


def test_relation_distance_and_label_read_back_from_pixels():
    d = make("relation", n=1000, near_fraction=0)
    f = d.factors
    ya, xa = _frames(d.images, 255)
    yb, xb = _frames(d.images, 128)
    np.testing.assert_array_equal(ya, f["ya"])
    np.testing.assert_array_equal(xb, f["xb"])
    p = GEO.patch_size
    np.testing.assert_array_equal(np.maximum(abs(ya // p - yb // p), abs(xa // p - xb // p)), f["distance_tokens"])
    np.testing.assert_allclose(np.hypot(ya - yb, xa - xb), f["distance_px"], atol=1e-3)
    # The label is the ordered colour relation of the designated marks' centres.
    n = np.arange(len(f))
    col = lambda y, x: (d.images[n, y + 1, x + 1][:, None, :] == PALETTE[None, :4]).all(-1).argmax(1)  # noqa: E731
    k = 4
    assert ((col(yb, xb) - col(ya, xa)) % k == np.where(d.labels == 1, 1, k - 1)).all()
    dist = f["distance_tokens"].value_counts(normalize=True)
    assert set(dist.index) == {1, 2, 3} and dist.min() > 0.25  # distances controlled: uniform


def test_relation_no_local_or_global_statistic_gives_the_label_away():
    d = make("relation", n=8000, clutter=3)
    f, y = d.factors, d.labels
    # Global: twins (2i, 2i+1) have opposite labels and identical colour histograms (so any function of
    # the histogram, or of the unordered set of marks, is independent of the label).
    flat = d.images.reshape(len(y), -1, 3).astype(np.int64)
    packed = np.sort((flat[..., 0] << 16) | (flat[..., 1] << 8) | flat[..., 2], axis=1)
    assert (y[0::2] != y[1::2]).all()
    np.testing.assert_array_equal(packed[0::2], packed[1::2])
    # Local: each designated mark's colour is uniform over the palette in both classes.
    for col in ("colour_a", "colour_b"):
        freq = np.stack([np.bincount(f[col][y == c], minlength=4) / (y == c).sum() for c in (0, 1)])
        assert np.abs(freq - 0.25).max() < 0.03, (col, freq)
    # Local: the pixels of the patch holding A (or B) have the same mean in both classes.
    cells = image_to_cells(d.images, GEO.patch_size)
    n = np.arange(len(y))
    for yy, xx in (("ya", "xa"), ("yb", "xb")):
        patch = cells[n, f[yy] // 4, f[xx] // 4].reshape(len(y), -1).mean(1)
        assert abs(patch[y == 0].mean() - patch[y == 1].mean()) < 2.0
    # The designated marks never repeat the same colour (which would make "same" a shortcut).
    assert (f["colour_a"] != f["colour_b"]).all()


def test_relation_near_pairs_share_one_swin_window_and_leave_the_rest_as_they_were():
    far = make("relation", n=4000, near_fraction=0)
    d = make("relation", n=4000, near_fraction=0.5, near_block=2)
    window = window_factors(d.factors, window_px=2 * GEO.patch_size, image_size=GEO.image_size)["window"]
    baseline = window_factors(far.factors, window_px=2 * GEO.patch_size, image_size=GEO.image_size)["window"]
    share, base = (window == "same").mean(), (baseline == "same").mean()
    assert 0.15 < base < 0.25  # 48 of the 240 ordered cell pairs of a 4 x 4 grid share a 2 x 2 block
    assert abs(share - (0.5 + 0.5 * base)) < 0.04, (share, base)
    # The marks read back from the pixels are where the factors say, and the labels stay balanced per twin.
    ya, xa = _frames(d.images, 255)
    np.testing.assert_array_equal(ya, d.factors["ya"])
    np.testing.assert_array_equal(xa, d.factors["xa"])
    assert (d.labels[0::2] != d.labels[1::2]).all()
    # Every block and every ordered pair inside a block is drawn.
    rng = np.random.default_rng(0)
    a, b = near_pairs(4, 2, 20000, rng)
    assert (a != b).all() and (a // 4 // 2 == b // 4 // 2).all() and (a % 4 // 2 == b % 4 // 2).all()
    assert len(set(zip(a.tolist(), b.tolist(), strict=True))) == 4 * 4 * 3


def test_window_factors():
    import pandas as pd

    f = pd.DataFrame({"ya": [0, 0, 4], "xa": [0, 0, 4], "yb": [4, 8, 8], "xb": [4, 0, 8], "mark_px": 4})
    w = window_factors(f, window_px=8, image_size=16)
    assert w["window"].tolist() == ["same", "cross", "cross"]
    assert w["shifted_window"].tolist() == ["cross", "cross", "same"]  # shift 4: pixels 4..11 share a window


# --------------------------------------------------------------------------- arrangement
def test_arrangement_twins_are_the_same_multiset_of_patches():
    d = make("arrangement", n=2000, clutter=3, noise=20, distractor_types=2, glyph_flips=2)
    cells = image_to_cells(d.images, GEO.patch_size)  # (N, G, G, P, P, C)
    patches = cells.reshape(len(d.labels), -1, GEO.patch_size**2 * 3)
    keys = np.sort(np.array([[p.tobytes() for p in img] for img in patches]), axis=1)
    assert (d.labels[0::2] != d.labels[1::2]).all()
    assert (keys[0::2] == keys[1::2]).all()
    assert (d.images[0::2] != d.images[1::2]).any(axis=(1, 2, 3)).all()  # layouts differ
    # A's patch moves with A: twin 2i+1 holds at A's new cell what twin 2i held at A's old cell.
    f = d.factors
    n = np.arange(0, len(f), 2)
    a0 = cells[n, f["row_a"][n], f["col_a"][n]]
    a1 = cells[n + 1, f["row_a"][n + 1], f["col_a"][n + 1]]
    np.testing.assert_array_equal(a0, a1)
    np.testing.assert_array_equal(d.labels, (f["col_b"] < f["col_a"]).astype(int))


# --------------------------------------------------------------------------- params
@pytest.mark.parametrize("raw, key", [
    ({"tasks": {"alignment": {"train_offsets": [0, 9]}}}, "tasks.alignment.train_offsets"),
    ({"tasks": {"alignment": {"train_offsets": [2, 1]}}}, "tasks.alignment.train_offsets"),
    ({"tasks": {"alignment": {"objects": "glyphs", "glyph_flips": 5}}}, "tasks.alignment.glyph_flips"),
    ({"tasks": {"alignment": {"box": 14}}}, "tasks.alignment.box"),  # 14 px at offset 3 leaves a 16 px image
    ({"tasks": {"alignment": {"box": 2}}}, "tasks.alignment.box"),  # no gap between two dots
    ({"tasks": {"scale": {"objects": "shapes", "shapes": ["disc", "plus"], "min_size": 3}}}, "tasks.scale.min_size"),
    ({"tasks": {"scale": {"min_size": 2}}}, "tasks.scale.min_size"),  # pairs: no gap between two dots
    ({"tasks": {"scale": {"rotate": True}}}, "tasks.scale.rotate"),  # pairs: a quarter turn swaps the classes
    ({"tasks": {"scale": {"max_size": 40}}}, "tasks.scale.max_size"),
    ({"tasks": {"relation": {"mark_size": 3}}}, "tasks.relation.mark_size"),
    ({"tasks": {"relation": {"n": 101}}}, "tasks.relation.n"),
    ({"tasks": {"relation": {"num_colours": 2}}}, "tasks.relation.num_colours"),
    ({"tasks": {"relation": {"near_fraction": 1.5}}}, "tasks.relation.near_fraction"),
    ({"tasks": {"relation": {"near_fraction": 0.5, "near_block": 3}}}, "tasks.relation.near_block"),
    ({"tasks": {"relation": {"near_fraction": 0.5}},
      "models": {"swin": {"window_size": 2, "depths": [2, 2], "local": None}}}, "tasks.relation.near_block"),
    ({"tasks": {"arrangement": {"glyph_size": 5}}}, "tasks.arrangement.glyph_size"),
    ({"tasks": {"names": ["alignment", "mnist"]}}, "tasks.names"),
    ({"tasks": {"natural": {"colour": 1}}}, "tasks.natural.colour"),
    ({"slice": {"train_sizes": [100, 50]}}, "slice.train_sizes"),
])
def test_bad_params_name_the_key(raw, key):
    with pytest.raises(ConfigError) as err:
        parse_params(tiny_repo.params_with(raw))
    assert "\n" not in str(err.value) and key in str(err.value), str(err.value)


# --------------------------------------------------------------------------- natural (CIFAR-10)
def _pixels(k: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (k, 32, 32, 3), dtype=np.uint8)


def _add(tar: tarfile.TarFile, name: str, payload: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(payload)
    tar.addfile(info, io.BytesIO(payload))


def tiny_jpg_archive(path: Path, per_class: int = 3) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for split in ("train", "test"):
            for c, name in enumerate(CLASSES):
                for i, img in enumerate(_pixels(per_class, c)):
                    buf = io.BytesIO()
                    Image.fromarray(img).save(buf, format="JPEG")
                    _add(tar, f"{split}/{name}/{i:04d}.jpg", buf.getvalue())


def tiny_python_archive(path: Path, per_class: int = 3) -> np.ndarray:
    """Two train batches and a test batch; returns all train images in archive order."""
    rng = np.random.default_rng(1)
    train = []
    with tarfile.open(path, "w:gz") as tar:
        for name in ("data_batch_1", "data_batch_2", "test_batch"):
            labels = rng.permutation(np.repeat(np.arange(10), per_class))
            imgs = _pixels(len(labels), hash(name) % 100)
            if name != "test_batch":
                train.append((imgs, labels))
            data = imgs.transpose(0, 3, 1, 2).reshape(len(labels), -1)  # R, G, B planes per row
            _add(tar, f"cifar-10-batches-py/{name}", pickle.dumps({b"data": data, b"labels": labels.tolist()}))
    return train


def test_cifar_jpg_archive(tmp_path):
    tiny_jpg_archive(tmp_path / "c.tar.gz")
    images, table = read_cifar10(tmp_path / "c.tar.gz", per_class_train=2, per_class_test=1)
    assert images.shape == (30, 32, 32, 3) and images.dtype == np.uint8
    assert (table["split"] == "train").sum() == 20 and table["class"].iloc[0] == "airplane"
    assert table["index"].max() == 1


def test_cifar_python_archive_keeps_first_per_class_in_order(tmp_path):
    train = tiny_python_archive(tmp_path / "p.tar.gz")
    images, table = read_cifar10(tmp_path / "p.tar.gz", per_class_train=4, per_class_test=2)
    assert len(images) == 10 * 4 + 10 * 2
    # Class 3's first four train images in batch order, exactly (the python format is lossless).
    all_imgs = np.concatenate([i for i, _ in train])
    all_labels = np.concatenate([lab for _, lab in train])
    want = all_imgs[all_labels == 3][:4]
    got = images[((table["split"] == "train") & (table["label"] == 3)).to_numpy()]
    np.testing.assert_array_equal(got, want)


def test_cifar_errors(tmp_path):
    with pytest.raises(StageError, match="tasks.natural.path"):
        read_cifar10(tmp_path / "missing.tar.gz", 1, 1)
    tiny_jpg_archive(tmp_path / "c.tar.gz", per_class=2)
    with pytest.raises(StageError, match="tasks.natural.per_class_train"):
        read_cifar10(tmp_path / "c.tar.gz", per_class_train=5, per_class_test=1)


def test_resize_is_exact_block_mean():
    img = np.random.default_rng(0).integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    small = resize(img, 16)
    block = img[:, :2, :2].astype(int).sum((1, 2))
    np.testing.assert_array_equal(small[:, 0, 0], (block + 2) // 4)
    np.testing.assert_array_equal(resize(img, 64)[:, ::2, ::2], img)


# --------------------------------------------------------------------------- stage
def tiny_params(tmp_path: Path, **tasks) -> Path:
    raw = tiny_repo.params_with({
        "tasks": {"names": SYNTHETIC + ["natural"], **{t: {"n": 400} for t in SYNTHETIC},
                  "alignment": {"n": 400, "transfer_n": 0}, **tasks},
        "slice": {"train_sizes": [40, 80], "val_size": 40, "test_size": 60},
        # the training grid must only use generated tasks and sliced sizes
        "train": {"size": 40, "grids": {"curve": {"archs": ["resnet"], "tasks": ["alignment"], "sizes": [40]}}},
        "distill": {"teacher_size": 80}})
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_generate_stage_outputs_and_byte_deterministic_samples(tmp_path):
    params = tiny_params(tmp_path)
    outs = []
    for run in ("a", "b"):
        out, png = tmp_path / run / "alignment", tmp_path / run / "alignment.png"
        assert gen_stage.main(["--params", str(params), "--task", "alignment", "--out", str(out),
                               "--samples", str(png)]) == 0
        outs.append((out, png))
    (out, png), (out2, png2) = outs
    meta = json.loads((out / "meta.json").read_text())
    images, labels = np.load(out / "images.npy"), np.load(out / "labels.npy")
    assert images.shape == (400, 16, 16, 3) and labels.shape == (400,)
    assert meta["num_classes"] == 2 and meta["n"] == 400  # rows, columns
    from pipeline.io import sha256_bytes

    assert meta["sha256"]["images"] == sha256_bytes(images.tobytes())
    assert meta["params"]["train_offsets"] == [0, 2]
    assert png.read_bytes() == png2.read_bytes() and png.read_bytes()[:4] == b"\x89PNG"
    assert (out / "images.npy").read_bytes() == (out2 / "images.npy").read_bytes()


def test_natural_stage_records_archive_hash_and_missing_archive_leaves_nothing(tmp_path, capsys):
    tiny_python_archive(tmp_path / "p.tar.gz")
    params = tiny_params(tmp_path, natural={"path": str(tmp_path / "p.tar.gz"), "per_class_train": 4,
                                            "per_class_test": 2})
    out = tmp_path / "natural"
    assert gen_stage.main(["--params", str(params), "--task", "natural", "--out", str(out)]) == 0
    meta = json.loads((out / "meta.json").read_text())
    from pipeline.io import sha256_file

    assert meta["archive"]["sha256"] == sha256_file(tmp_path / "p.tar.gz")
    assert np.load(out / "images.npy").shape == (60, 16, 16, 3)

    params = tiny_params(tmp_path, natural={"path": str(tmp_path / "nowhere.tar.gz")})
    fresh = tmp_path / "fresh"
    assert gen_stage.main(["--params", str(params), "--task", "natural", "--out", str(fresh)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "tasks.natural.path" in err
    assert not fresh.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".fresh")]


def test_natural_params_pool_size():
    natural = {**REPO.tasks.natural.model_dump(), "per_class_train": 3, "per_class_test": 2}
    assert NaturalParams.model_validate(natural).n == 50


@pytest.mark.parametrize("shape", ["square", "frame", "triangle", "plus", "disc", "diamond", "zed", "ess"])
def test_every_shape_fills_its_box(shape):
    """So the size (and whether the object straddles a patch line) is what the pixels show."""
    from pipeline.shapes import shape_mask

    for s in range(3, 17):
        m = shape_mask(shape, s)
        assert m[0].any() and m[-1].any() and m[:, 0].any() and m[:, -1].any(), (shape, s)
