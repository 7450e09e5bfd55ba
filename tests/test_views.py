"""Training views of natural images (tasks.natural.augment) and the grid axes that go with them: epochs and
augment: false."""

from __future__ import annotations

import copy
import math
from dataclasses import replace
from pathlib import Path

import pytest
import tiny_repo
import torch

from pipeline.config import Params
from pipeline.grid import Folders, RunKey, at_main_budget, specs_for, train_keys, training_views
from pipeline.learner import augment_views
from pipeline.predict import to_tensor
from pipeline.provenance import run_params

BLACK = to_tensor(torch.zeros(1, 1, 1, 3, dtype=torch.uint8).numpy())[0, :, 0, 0]


def shifted(x: torch.Tensor, sy: int, sx: int) -> torch.Tensor:
    """``x`` (C, H, W) moved down ``sy`` and right ``sx`` pixels, black where nothing moved in."""
    c, h, w = x.shape
    out = BLACK.view(c, 1, 1).expand(c, h, w).clone()
    out[:, max(sy, 0):h + min(sy, 0), max(sx, 0):w + min(sx, 0)] = x[:, max(-sy, 0):h - max(sy, 0),
                                                                       max(-sx, 0):w - max(sx, 0)]
    return out


def test_a_crop_is_the_image_shifted_by_at_most_the_padding_with_black_moved_in():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, 8, 8, generator=gen)
    views = augment_views(x, 2, False, seed=3, step=5)
    seen = set()
    for image, view in zip(x, views, strict=True):
        matches = [(sy, sx) for sy in range(-2, 3) for sx in range(-2, 3)
                   if torch.equal(shifted(image, sy, sx), view)]
        assert len(matches) == 1  # exactly one shift within the padding explains the view
        seen.add(matches[0])
    assert len(seen) > 10  # the offsets are spread over the 5 x 5 choices


def test_a_mirror_flips_left_right_about_half_the_batch():
    x = torch.randn(200, 3, 4, 4, generator=torch.Generator().manual_seed(1))
    views = augment_views(x, 0, True, seed=0, step=0)
    same = [torch.equal(v, i) for v, i in zip(views, x, strict=True)]
    mirrored = [torch.equal(v, i.flip(-1)) for v, i in zip(views, x, strict=True)]
    assert all(a != b for a, b in zip(same, mirrored, strict=True))  # each view is one or the other
    assert 70 < sum(mirrored) < 130


def test_views_are_a_function_of_seed_and_step_and_off_is_the_identity():
    x = torch.randn(16, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    a = augment_views(x, 2, True, seed=0, step=7)
    assert torch.equal(a, augment_views(x.clone(), 2, True, seed=0, step=7))  # a resumed run sees the same
    assert not torch.equal(a, augment_views(x, 2, True, seed=0, step=8))
    assert not torch.equal(a, augment_views(x, 2, True, seed=1, step=7))
    assert torch.equal(augment_views(x, 0, False, seed=0, step=7), x)


def _params(**natural) -> tuple[dict, Params]:
    raw = tiny_repo.params_with()
    raw["tasks"]["natural"]["augment"] = {"crop_pad": 2, "flip": True, **natural}
    return raw, Params.model_validate(raw)


def test_epochs_set_each_sizes_steps_and_augment_false_is_its_own_run():
    raw, _ = _params()
    arch = next(iter(raw["train"]["archs"]))
    raw["tasks"]["names"] = [*raw["tasks"]["names"], "natural"]
    raw["train"]["archs"][arch]["tasks"] = [*raw["train"]["archs"][arch]["tasks"], "natural"]
    raw["train"]["grids"] = {"exposure": {"archs": [arch], "tasks": ["natural"], "sizes": [64, 128], "epochs": 3,
                                          "budget_mode": "steps", "seeds": [0]},
                             "noaug": {"archs": [arch], "tasks": ["natural"], "augment": False, "seeds": [0]}}
    params = Params.model_validate(raw)
    batch, t = params.train.recipe.batch_size, params.train
    keys = train_keys(params, arch)
    exposure = [k for k in keys if k.budget_mode == "steps" and k.augment]
    assert {(k.train_size, k.steps) for k in exposure} == {(n, math.ceil(3 * n / batch)) for n in (64, 128)}
    off = [k for k in keys if not k.augment]
    assert [(k.task, k.seed, k.train_size) for k in off] == [("natural", 0, t.size)]
    assert off[0].folder.endswith("-noaug") and len({k.folder for k in keys}) == len(keys)
    at = Folders(Path("d"), Path("s"), Path("o"), Path("c"))
    main, views_off = specs_for("train", [replace(off[0], augment=True), off[0]], at)
    assert at_main_budget(main, params) and not at_main_budget(views_off, params)
    assert training_views(main, params) == {"crop_pad": 2, "flip": True} and training_views(views_off, params) == {}
    assert run_params(params, main)["views"] == {"crop_pad": 2, "flip": True}  # in the run's identity
    assert "views" not in run_params(params, views_off)


def test_only_natural_runs_read_the_views():
    _, params = _params()
    at = Folders(Path("d"), Path("s"), Path("o"), Path("c"))
    t, r = params.train, params.train.recipe
    synthetic, = specs_for("train", [RunKey("alignment", "vit", 0, t.size, r.steps, r.budget_mode)], at)
    assert training_views(synthetic, params) == {} and "views" not in run_params(params, synthetic)
    _, off = _params(crop_pad=0, flip=False)
    natural, = specs_for("train", [RunKey("natural", "vit", 0, t.size, r.steps, r.budget_mode)], at)
    assert training_views(natural, off) == {}


@pytest.mark.parametrize(("grid", "message"), [
    ({"steps": [10], "epochs": 2}, "steps or epochs, not both"),
    ({"augment": False}, "augment: false needs tasks: \\[natural\\]"),
    ({"augment": False, "tasks": ["alignment"]}, "augment: false needs tasks: \\[natural\\]"),
])
def test_grid_axes_that_mean_nothing_are_refused(grid, message):
    raw, _ = _params()
    bad = copy.deepcopy(raw)
    bad["train"]["grids"] = {"g": grid}
    with pytest.raises(ValueError, match=message):
        Params.model_validate(bad)
