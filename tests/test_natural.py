"""Natural images (CIFAR-10): where the archive comes from, the subgroups of the test set, resolution change."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import tiny_repo
import yaml

from bench.screenshots import serve_folder
from pipeline.errors import StageError
from pipeline.stages import generate as gen_stage
from pipeline.tasks import natural
from pipeline.tasks.natural import CLASSES, NaturalParams


# --------------------------------------------------------------------------- archives
def fake_python_archive(path: Path, per_class: int = 2) -> np.ndarray:
    """A tiny ``cifar-10-python.tar.gz`` with the official layout (pickled batches of R, G, B planes).

    Returns the test images (10 * per_class, 32, 32, 3) in archive order.
    """
    rng = np.random.default_rng(7)
    test = None
    with tarfile.open(path, "w:gz") as tar:
        for name in ("batches.meta", "data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4",
                     "data_batch_5", "test_batch"):
            if name == "batches.meta":
                payload = {b"label_names": [c.encode() for c in CLASSES]}
            else:
                labels = np.repeat(np.arange(10), per_class)
                imgs = rng.integers(0, 256, (len(labels), 32, 32, 3), dtype=np.uint8)
                payload = {b"data": imgs.transpose(0, 3, 1, 2).reshape(len(labels), -1),
                           b"labels": labels.tolist()}
                test = imgs if name == "test_batch" else test
            blob = pickle.dumps(payload)
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    return test


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()  # noqa: S324 (CIFAR's published checksum is an md5)


NAMES = [*tiny_repo.TINY["tasks"]["names"], "natural"]  # the tiny tasks plus this one
DEFAULT_NATURAL = yaml.safe_load((Path(__file__).parents[1] / "params.yaml").read_text())["tasks"]["natural"]


def cfg(paths: list[Path], url: str = "http://127.0.0.1:9/cifar-10-python.tar.gz",
        digest: str = "c58f30108f718f92721af3b95e74349a") -> NaturalParams:
    return NaturalParams.model_validate({**DEFAULT_NATURAL, "path": [str(p) for p in paths], "url": url,
                                         "md5": digest, "per_class_train": 2, "per_class_test": 2})


def test_default_candidates_and_official_checksum():
    c = NaturalParams.model_validate(DEFAULT_NATURAL)  # the repository's params.yaml
    assert c.path == ["../shared/data/cifar10_jpg.tar.gz", "data/raw/cifar-10-python.tar.gz"]
    assert c.md5 == "c58f30108f718f92721af3b95e74349a" and c.url.endswith("/cifar-10-python.tar.gz")
    assert NaturalParams.model_validate({**DEFAULT_NATURAL, "path": "a.tar.gz"}).path == ["a.tar.gz"]


def test_candidates_tried_in_order(tmp_path):
    first, second, third = (tmp_path / f"{k}.tar.gz" for k in "abc")
    fake_python_archive(second)
    fake_python_archive(third)
    assert natural.resolve_path(cfg([first, second, third])) == second  # first missing: skipped
    fake_python_archive(first)
    assert natural.resolve_path(cfg([first, second, third])) == first
    assert natural.candidate_paths(cfg([first, second])) == [first, second]


@pytest.mark.parametrize("scheme", ["file", "http"])
def test_download_lands_in_last_candidate(tmp_path, scheme):
    """file://: the issue's local-archive test; http://127.0.0.1: torchvision's own downloader end to end."""
    src = tmp_path / "mirror" / "cifar-10-python.tar.gz"
    src.parent.mkdir()
    test = fake_python_archive(src)
    dest = tmp_path / "repo" / "data" / "raw" / "cifar-10-python.tar.gz"
    with serve_folder(src.parent) as root:
        url = src.as_uri() if scheme == "file" else f"{root}/{src.name}"
        c = cfg([tmp_path / "nowhere.tar.gz", dest], url=url, digest=md5(src))
        assert natural.resolve_path(c) == dest and dest.read_bytes() == src.read_bytes()
    assert sorted(p.name for p in dest.parent.iterdir()) == [dest.name]  # no temporary left behind
    images, table = natural.read_cifar10(dest, 2, 2)
    np.testing.assert_array_equal(images[(table["split"] == "test").to_numpy()], test)


@pytest.mark.parametrize("case", ["checksum file", "checksum http", "offline"])
def test_refusal_is_one_line_and_writes_nothing(tmp_path, capsys, case):
    src = tmp_path / "mirror" / "cifar-10-python.tar.gz"
    src.parent.mkdir()
    fake_python_archive(src)
    with serve_folder(src.parent) as root:
        # checksum: an archive arrives but it is not the published one; offline: nothing listens on port 9
        url = {"checksum file": src.as_uri(), "checksum http": f"{root}/{src.name}",
               "offline": "http://127.0.0.1:9/cifar-10-python.tar.gz"}[case]
        _refused(tmp_path, capsys, url, case)


def _refused(tmp_path: Path, capsys, url: str, case: str) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    dest = repo / "data" / "raw" / "cifar-10-python.tar.gz"
    with pytest.raises(StageError) as err:
        natural.resolve_path(cfg([dest], url=url))
    msg = str(err.value)
    assert "\n" not in msg and "tasks.natural.url" in msg and url in msg and "tasks.natural.path" in msg
    assert ("checksum" in msg) == case.startswith("checksum"), msg
    assert list(repo.iterdir()) == []  # not even data/raw/

    # the data stage: exit 2, the one line, no output folder
    params = tmp_path / "params.yaml"
    natural_params = {"names": NAMES, "natural": {"path": [str(dest)], "url": url}}
    params.write_text(yaml.safe_dump(tiny_repo.params_with({"tasks": natural_params})))
    out = repo / "data" / "tasks" / "natural"
    assert gen_stage.main(["--params", str(params), "--task", "natural", "--out", str(out)]) == 2
    line = capsys.readouterr().err.strip()
    assert line.count("\n") == 0 and line.startswith("error: tasks.natural.path") and url in line
    assert list(repo.iterdir()) == []


def test_stage_stores_native_eval_images(tmp_path):
    src = tmp_path / "c.tar.gz"
    test = fake_python_archive(src, per_class=3)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(tiny_repo.params_with({"tasks": {"names": NAMES, "natural": {
        "path": [str(tmp_path / "no.tar.gz"), str(src)], "per_class_train": 2, "per_class_test": 3}}})))
    out = tmp_path / "natural"
    assert gen_stage.main(["--params", str(params), "--task", "natural", "--out", str(out)]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["archive"]["path"] == str(src)
    images = np.load(out / "images.npy")
    index = np.load(out / "native_eval_index.npy")
    assert images.shape[1] == 16 and len(index) == 30
    np.testing.assert_array_equal(natural.native_images(out, index), test)  # class-sorted == archive order
    np.testing.assert_array_equal(natural.resize(natural.native_images(out, index), 16), images[index])
    with pytest.raises(StageError, match="eval rows only"):
        natural.native_images(out, np.array([0]))
    from pipeline.resolution import native_for

    np.testing.assert_array_equal(native_for("natural", out, index[:5], images[index[:5]]), test[:5])
    own = images[index[:5]]
    assert native_for("scale", out, index[:5], own) is own  # a synthetic task starts from its own images


# --------------------------------------------------------------------------- subgroups
def imgs(n: int = 6, size: int = 16, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, size, size, 3), dtype=np.uint8)


def repo_params(**evaluation):
    from pipeline.config import parse_params

    raw = yaml.safe_load(Path("params.yaml").read_text())
    for key, value in evaluation.items():
        raw["evaluation"][key].update(value)
    return parse_params(raw)


def test_patch_shuffle_preserves_the_multiset_of_patches():
    from pipeline.subgroups import shuffle_patches
    from pipeline.tasks.common import image_to_cells

    x = imgs()
    y = shuffle_patches(x, 4, seed=3)
    assert y.shape == x.shape and not np.array_equal(x, y)
    for a, b in zip(image_to_cells(x, 4), image_to_cells(y, 4), strict=True):
        key = lambda cells: sorted(c.tobytes() for c in cells.reshape(-1, 4, 4, 3))  # noqa: E731
        assert key(a) == key(b)
    np.testing.assert_array_equal(y, shuffle_patches(x, 4, seed=3))  # seeded
    assert not np.array_equal(y, shuffle_patches(x, 4, seed=4))


@pytest.mark.parametrize("border", ["edge", "constant", "wrap"])
def test_translation_and_zoom(border):
    from pipeline.subgroups import translate, zoom

    x = imgs()
    np.testing.assert_array_equal(translate(x, 0, 0, border), x)
    np.testing.assert_array_equal(zoom(x, 1.0, border), x)
    y = translate(x, 2, 3, border)
    np.testing.assert_array_equal(y[:, 2:, 3:], x[:, :-2, :-3])  # content moved down 2, right 3
    fill = {"edge": x[:, :1, :1], "constant": np.zeros_like(x[:, :1, :1]), "wrap": x[:, -2:-1, -3:-2]}[border]
    np.testing.assert_array_equal(y[:, :1, :1], fill)
    # zoom x2 in: the central 8 x 8 block, each pixel read at a quarter-pixel offset (bilinear, inside)
    z = zoom(x, 2.0, border)
    centre = x[:, 4:12, 4:12].astype(float)
    want = np.floor(0.75 * 0.75 * centre[:, :-1, :-1] + 0.75 * 0.25 * (centre[:, 1:, :-1] + centre[:, :-1, 1:])
                    + 0.25 * 0.25 * centre[:, 1:, 1:] + 0.5)
    np.testing.assert_array_equal(z[:, 1:-1:2, 1:-1:2], want)  # output 2k+1 reads source 4+k+0.25
    # zoom x0.5 out: the whole image in the central 8 x 8 (2 x 2 means), the rest is border fill
    small = zoom(x, 0.5, border)
    np.testing.assert_array_equal(small[:, 4:12, 4:12],
                                  np.floor(x.reshape(6, 8, 2, 8, 2, 3).mean((2, 4)) + 0.5))
    if border == "constant":
        assert (small[:, :3] == 0).all()


def test_evaluate_subgroups_shape_and_per_class_average():
    from pipeline.subgroups import evaluate_subgroups

    params = repo_params()
    x = imgs(n=40)
    labels = np.arange(40) % 4

    def predict(batch: np.ndarray) -> np.ndarray:  # a fixed rule of the pixels: top-left pixel's red value
        return np.eye(4)[batch[:, 0, 0, 0].astype(int) % 4]

    out = evaluate_subgroups(predict, x, labels, params, class_names=["a", "b", "c", "d"])
    p = params.geometry.patch_size
    assert set(out) == {"alignment", "arrangement", "scale", "class"}
    assert len(out["alignment"]) == p * p and out["alignment"]["0,0"]["consistency"] == 1.0
    acc = out["alignment"]["0,0"]["acc"]
    assert acc == float((predict(x).argmax(1) == labels).mean())
    assert out["scale"]["x1"] == out["alignment"]["0,0"]  # zoom 1 is the identity
    assert out["arrangement"]["original"]["acc"] == acc and out["arrangement"]["shuffled"]["n"] == 40
    # translating by (dy, dx) >= 1 with edge fill keeps the top-left pixel: predictions unchanged
    assert all(v["consistency"] == 1.0 for v in out["alignment"].values())
    cls = out["class"]
    assert list(cls) == ["a", "b", "c", "d"] and all(v["consistency"] is None for v in cls.values())
    # balanced classes: the per-class accuracies average to the overall accuracy
    assert np.isclose(np.mean([v["acc"] for v in cls.values()]), acc)
    assert sum(v["n"] for v in cls.values()) == 40


def test_evaluation_params_are_checked():
    from pipeline.errors import ConfigError

    with pytest.raises(ConfigError, match="evaluation.resolution.sizes: 18 is not a multiple of geometry"):
        repo_params(resolution={"sizes": [18]})
    with pytest.raises(ConfigError, match="evaluation.subgroups.border"):
        repo_params(subgroups={"border": "mirror"})


# --------------------------------------------------------------------------- resolution
def test_area_resize_equals_the_data_stage_where_sizes_divide():
    from pipeline.resolution import resize_images

    x = imgs(size=32)
    np.testing.assert_array_equal(resize_images(x, 16, "area"), natural.resize(x, 16))
    np.testing.assert_array_equal(resize_images(x, 8, "area"), natural.resize(x, 8))
    np.testing.assert_array_equal(resize_images(x[:, ::2, ::2], 32, "area"), natural.resize(x[:, ::2, ::2], 32))
    for size, method in ((12, "area"), (20, "bicubic"), (24, "bilinear")):
        y = resize_images(x, size, method)
        assert y.shape == (6, size, size, 3) and y.dtype == np.uint8
    np.testing.assert_array_equal(resize_images(x, 32, "bicubic"), x)


@pytest.mark.parametrize("arch", ["vit", "swin", "resnet"])
def test_evaluate_resolutions_matches_plain_prediction_at_the_training_size(arch):
    import torch

    from pipeline.models import build_model
    from pipeline.predict import predict
    from pipeline.resolution import evaluate_resolutions, resize_images

    params = repo_params()
    torch.manual_seed(0)
    model = build_model(arch, params, 10, width=8 if arch != "swin" else 4).eval()
    native = imgs(n=20, size=32)
    labels = np.arange(20) % 10
    sizes = params.evaluation.resolution.sizes
    out = evaluate_resolutions(model, arch, params, native, labels, sizes)
    assert list(out) == sizes and all(v["n"] == 20 for v in out.values())
    at_train = predict(model, resize_images(native, params.geometry.image_size, "area")).argmax(1)
    assert out[params.geometry.image_size]["acc"] == float((at_train == labels).mean())


def test_subgroup_interval_is_over_seeds_not_pooled_items():
    """5 seeds x the same 2,000 items: a Student-t interval over the seed means, not Wilson on 10,000 'items'."""
    from scipy import stats as st

    from pipeline.report.natural import subgroup_table

    accs = [0.40, 0.42, 0.45, 0.41, 0.47]
    recs = [{"task": "natural", "source": "runs", "arch": "vit", "seed": i,
             "subgroups": {"zoom": {"1.0": {"acc": a, "n": 2000}}}} for i, a in enumerate(accs)]
    row = subgroup_table(recs, 0.95).iloc[0]
    lo, hi = st.t.interval(0.95, len(accs) - 1, loc=np.mean(accs), scale=st.sem(accs))
    assert (row.seeds, row.n) == (5, 10000) and np.isclose(row.ci_lo, lo) and np.isclose(row.ci_hi, hi)
    one = subgroup_table(recs[:1], 0.95).iloc[0]
    assert np.isnan(one.ci_lo) and np.isnan(one.ci_hi)  # one seed: no interval, not a narrow one


def test_natural_level_is_called_a_smoke_test_when_a_vit_sits_near_the_floor():
    from pipeline.report.natural import evidence_level

    cells = pd.DataFrame({"task": "natural", "data_seed": 0, "arch": ["vit", "vit_nopos", "resnet", "deit"],
                          "mean": [0.41, 0.52, 0.44, 0.49]})
    line = evidence_level(cells, floor=0.373)
    assert line.startswith("**A smoke test, not evidence:** the reference ViT sits below the shortcut floor + 0.05")
    assert "1 of 3 ViT-family cells on CIFAR-10: vit 0.410." in line  # vit_nopos and deit clear 0.423
    assert "resnet" not in line  # a CNN near the floor is not what the line is about
    assert evidence_level(cells.assign(mean=0.9), floor=0.373) == ""
    # the reference clears the bar: a control below it (vit_nopos, a position row's loser) is a finding, not smoke
    assert evidence_level(cells.assign(mean=[0.45, 0.40, 0.5, 0.5]), floor=0.373) == ""
    assert evidence_level(cells.iloc[0:0], floor=0.373) == ""
