"""A task's ``zoom``: its data, floors and runs on a canvas ``zoom`` x geometry.image_size with every patch ``zoom`` x
as large (``Params.for_task``), so the token grids stay; the other tasks and their runs do not change."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tiny_repo
import torch

from pipeline.config import parse_params
from pipeline.grid import Folders, train_specs
from pipeline.models import build_model
from pipeline.provenance import run_params

ZOOM = {"tasks": {"scale": {"zoom": 2, "max_size": 22, "margin": 5, "train_sizes": [9, 16]}}}


def zoomed(overrides: dict | None = None):
    return parse_params(tiny_repo.small_params(tiny_repo.merge(ZOOM, overrides or {})), "params.yaml")


def test_for_task_scales_every_size_in_px_that_models_and_evaluation_read():
    p = zoomed()
    s = p.for_task("scale")
    assert (s.geometry.image_size, s.geometry.patch_size, s.geometry.grid) == (32, 8, p.geometry.grid)
    assert s.models.swin.patch_size == 2 * p.models.swin.patch_size
    assert s.evaluation.resolution.sizes == [2 * x for x in p.evaluation.resolution.sizes]
    assert s.finetune.size == 2 * p.finetune.size
    assert s.models.vit == p.models.vit and s.tasks == p.tasks and s.train == p.train  # nothing else moves
    assert p.for_task("relation") is p and s.for_task("scale") is s  # zoom 1, and asking the copy again
    with pytest.raises(ValueError, match="at zoom 2 already; relation is drawn at zoom 1"):
        s.for_task("relation")  # it would give relation the zoomed canvas


def test_zooming_one_task_changes_no_run_of_another():
    """What a run reads (its identity's params) is its own task's: zooming scale moves every scale run's and no
    other's."""
    base = parse_params(tiny_repo.small_params(), "params.yaml")
    p = zoomed()
    at = Folders(Path("d"), Path("s"), Path("o"), Path("c"), Path("t"))
    specs = train_specs(base, at)
    assert {s.key.task for s in specs} >= {"scale", "alignment"}
    for spec in specs:
        before, after = run_params(base.for_task(spec.key.task), spec), run_params(p.for_task(spec.key.task), spec)
        if spec.key.task == "scale":
            assert after["geometry"]["image_size"] == 32 and after != before
        else:
            assert after == before, spec.name


@pytest.mark.parametrize("arch", ["vit", "vit_convstem", "vit_hybrid", "swin", "swin_local", "resnet", "mixer",
                                  "convmixer"])
def test_every_family_builds_on_the_zoomed_canvas_with_the_same_tokens(arch):
    from pipeline.families import family

    p = zoomed()
    s = p.for_task("scale")
    model = build_model(arch, s, 2)
    assert model(torch.zeros(3, 3, 32, 32)).shape == (3, 2)
    fam = family(arch)
    assert fam.tokens(s) == fam.tokens(p) or fam.name == "resnet"  # a CNN's positions are its pixels


def test_the_data_stage_draws_a_zoomed_task_on_its_canvas(tmp_path):
    from pipeline.stages import generate

    params = tmp_path / "params.yaml"
    names = {"tasks": {"names": ["alignment", "relation", "scale"]}}
    tiny_repo.write_params(params, tiny_repo.params_with(tiny_repo.merge(ZOOM, names)))
    assert generate.main(["--params", str(params), "--task", "scale", "--out", str(tmp_path / "scale")]) == 0
    images, meta = np.load(tmp_path / "scale/images.npy"), json.loads((tmp_path / "scale/meta.json").read_text())
    assert images.shape[1:] == (32, 32, 3) and (meta["image_size"], meta["patch_size"]) == (32, 8)


def test_a_zoom_that_does_not_fit_names_its_key():
    with pytest.raises(ValueError, match="tasks.scale.max_size: 23 px does not fit a 32 px image with a 5 px margin"):
        zoomed({"tasks": {"scale": {"max_size": 23}}})
