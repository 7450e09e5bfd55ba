"""Compute accounting: analytic FLOPs equal torch's counter, the SDPA gap is real, the budget arithmetic."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import tiny_repo
import torch
import yaml

from pipeline import experiment
from pipeline.archs import ARCHS
from pipeline.budget import (
    analytic_forward_flops,
    architecture_table,
    measured_forward_flops,
    steps_for_flops,
    teacher_flops,
    train_flops_per_image,
    training_flops,
)
from pipeline.config import Geometry, Models, load_params, parse_params
from pipeline.errors import ConfigError
from pipeline.families import family
from pipeline.grid import Folders, RunKey, specs_for
from pipeline.models import build_model

torch.set_num_threads(1)

# small models, a Swin MLP whose hidden width is not a multiple of its input's, a ResNet with two blocks in stage 0
SMALL_RAW = tiny_repo.small_params({"models": {"swin": {"mlp_ratio": 1.5}, "resnet": {"layers": [2, 1]}}})
SMALL = parse_params(SMALL_RAW)
WIDTH, CLASSES = 12, 5


@pytest.mark.parametrize("arch", list(ARCHS))
def test_analytic_equals_counter(arch):
    model = build_model(arch, SMALL, CLASSES, width=WIDTH)
    counted = measured_forward_flops(model, SMALL)
    assert counted > 0
    assert analytic_forward_flops(arch, SMALL, WIDTH, CLASSES) == counted


def test_analytic_follows_a_different_geometry():
    # 12x12 images, 3-px patches; a 3-stage Swin (12 -> 6 -> 3 tokens a side, 3x3 windows: the last stage is
    # one window); a 4-stage ResNet whose odd 3-px stage rounds up to 2. model_copy skips the cross-section
    # checks on purpose: the synthetic tasks' glyph sizes do not fit 3-px patches, the FLOP formulas must.
    params = SMALL.model_copy(update={
        "geometry": Geometry(image_size=12, patch_size=3, channels=3),
        "models": Models(**{**SMALL_RAW["models"], "vit": {"depth": 1, "num_heads": 4, "mlp_ratio": 3.0},
                            "swin": {"patch_size": 1, "window_size": 3, "depths": [2, 1, 1],
                                     "num_heads": [1, 2, 4], "mlp_ratio": 2.0},
                            "resnet": {"layers": [1, 1, 1, 1]}}),
    })
    for arch in ARCHS:
        if arch in ("vit_convstem", "vit_hybrid"):  # their stride-2 stems need a power-of-2 patch: below
            continue
        model = build_model(arch, params, 7, width=8)
        assert analytic_forward_flops(arch, params, 8, 7) == measured_forward_flops(model, params), arch
    # 32 px, 8-px patches: a three-convolution stem (32 -> 16 -> 8 -> 4).
    params = params.model_copy(update={"geometry": Geometry(image_size=32, patch_size=8, channels=3)})
    for arch in ("vit_convstem", "vit_hybrid"):
        model = build_model(arch, params, 7, width=8)
        assert analytic_forward_flops(arch, params, 8, 7) == measured_forward_flops(model, params), arch


def test_default_attention_backend_hides_vit_attention_from_the_counter():
    # Documents the stack fact: CPU fused SDPA counts 0, so only the MATH backend sees Q K^T and A V.
    model = build_model("vit", SMALL, CLASSES, width=WIDTH)
    math = measured_forward_flops(model, SMALL)
    fused = measured_forward_flops(model, SMALL, math_attention=False)
    tokens = SMALL.geometry.grid**2
    attention = SMALL.models.vit.depth * 2 * 2 * tokens * tokens * WIDTH
    assert math - fused == attention, f"gap {math - fused}, attention products {attention}"


def test_counting_restores_the_training_mode():
    model = build_model("resnet", SMALL, CLASSES, width=WIDTH).train()
    measured_forward_flops(model, SMALL)
    assert model.training


def test_unknown_arch_is_a_config_error():
    with pytest.raises(ConfigError, match="^arch: unknown"):
        analytic_forward_flops("mlp", SMALL, WIDTH, CLASSES)


def test_training_convention_and_teacher_cost():
    forward, teacher, images = 1_000, 4_000, 256
    assert training_flops(forward, images) == 3 * forward * images
    assert teacher_flops(teacher, images) == teacher * images
    assert training_flops(forward, images, teacher) == 3 * forward * images + teacher * images
    assert train_flops_per_image(forward, teacher) * images == training_flops(forward, images, teacher)


def test_steps_for_flops_matches_a_budget():
    per_image, batch = train_flops_per_image(3_527_776), 64
    target = training_flops(3_527_776, 1_500 * batch)
    assert steps_for_flops(target, per_image, batch) == 1_500
    step = per_image * batch
    assert steps_for_flops(target + step * 0.4, per_image, batch) == 1_500  # nearest step
    assert steps_for_flops(target + step * 0.6, per_image, batch) == 1_501
    assert steps_for_flops(1, per_image, batch) == 1  # never zero steps
    with pytest.raises(ValueError, match="^batch_size: must be positive"):
        steps_for_flops(target, per_image, 0)


@pytest.mark.slow  # a stage, a store, a browser or a long fit: make test, not test-fast
def test_budget_stage_writes_tables_and_rejects_bad_params(tmp_path, capsys):
    from pipeline.stages.budget import main

    good = tmp_path / "params.yaml"
    good.write_text(yaml.safe_dump(SMALL_RAW))
    report = tmp_path / "report"
    assert main(["--params", str(good), "--report", str(report)]) == 0
    table = pd.read_csv(report / "architectures.csv")
    assert list(table.arch) == list(ARCHS)
    assert (table.forward_flops == table.forward_flops_counted).all()
    assert (table.forward_flops_counted_fused <= table.forward_flops_counted).all()
    layout = pd.read_csv(report / "swin_layout.csv")
    assert set(layout.arch) == {a for a, info in ARCHS.items() if info.family == "swin"}
    assert "| vit_sincos" in (report / "README.md").read_text()

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(tiny_repo.merge(SMALL_RAW, {"models": {"param_target": 30}})))
    assert main(["--params", str(bad), "--report", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: models.param_target:") and "\n" not in err, err
    assert not (tmp_path / "nothing").exists()


def _expected_tokens(arch: str, params) -> int:
    """What the first layer sees, by the family's own test rule from the geometry (not the built module)."""
    return family(arch).expected_tokens(params, **ARCHS[arch].options)


@pytest.fixture(scope="module")
def workspace_budget(workspace):
    """The workspace's params and its budget table at alignment's classes (as its data records them), built once
    for every arch below."""
    params = load_params(workspace / "params.yaml")
    classes = json.loads((workspace / "data/tasks/alignment/meta.json").read_text())["num_classes"]
    return params, architecture_table(params, classes).set_index("arch"), classes


@pytest.mark.parametrize("arch", list(ARCHS))
def test_one_step_of_every_arch_records_its_family_budget(arch, workspace, workspace_budget, tmp_path):
    # Through the training code itself, so a budget record that reads the wrong module attribute (a family
    # whose embedding is not `patch_embed` counted as pixels) fails here rather than in a report.
    params, table, classes = workspace_budget
    key = RunKey("alignment", arch, 0, params.train.size, 1, "steps")
    at = Folders(workspace / "data/tasks", workspace / "data/slices", tmp_path / "runs", tmp_path / "ckpt")
    [spec] = specs_for("train", [key], at)
    result = experiment.fit(experiment.Job(spec, params, "test", None))
    got, row = result["budget"], table.loc[arch]
    images = result["steps_done"] * params.train.recipe.batch_size
    assert result["steps_done"] == 1 and result["num_classes"] == classes
    assert got["params"] == row.params
    assert got["forward_flops_per_image"] == row.forward_flops  # counted in the run == the family's formula
    assert got["tokens_per_image"] == _expected_tokens(arch, params)
    assert (got["images_seen"], got["tokens_seen"]) == (images, images * got["tokens_per_image"])
    assert got["train_flops"] == 3 * row.forward_flops * images
