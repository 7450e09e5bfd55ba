"""Family adapters: one place per family, refused by name when a piece is missing (run identity: test_identity)."""

from __future__ import annotations

import dataclasses
import importlib
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import tiny_repo
import torch

from pipeline import families
from pipeline.archs import ARCHS, ArchInfo
from pipeline.families import FAMILIES, family, family_of_model, resnet
from pipeline.families.common import Family

torch.set_num_threads(1)  # tiny models: threads only contend on a shared machine

ROOT = Path(__file__).resolve().parents[1]
TOY = Path(__file__).parent / "fixtures/toy_family.py"


def family_checks(arch: str, params_raw: dict) -> None:
    """What every family must pass, from its adapter alone: build, width, FLOPs = torch's counter, tokens = the
    family's test rule, the token graph where predicted, its position kind and the resolution contract.

    The pipeline's modules are looked up when called, so the same checks run on a copy of the package
    (the toy family below)."""
    config, budget, models, resolution = (importlib.import_module(f"pipeline.{m}")
                                          for m in ("config", "budget", "models", "resolution"))
    families, reach = importlib.import_module("pipeline.families"), importlib.import_module(
        "pipeline.interface.reachability")
    errors = importlib.import_module("pipeline.errors")
    params, fam, options = config.parse_params(params_raw), families.family(arch), families.ARCHS[arch].options
    g, classes = params.geometry, 5
    width = 4 * fam.width_step(params, **options)
    torch.manual_seed(0)
    model = models.build_model(arch, params, classes, width=width).eval()
    assert families.family_of_model(model) is fam
    assert budget.analytic_forward_flops(arch, params, width, classes) == budget.measured_forward_flops(model, params)
    assert budget.tokens_per_image(arch, params) == fam.expected_tokens(params, **options)
    if any(layer.predicted is not None for layer in reach.layer_chain(model, g.image_size)):  # else nothing to match
        layers, deps, _ = reach.reachability(model, g.image_size, g.channels, probes=1)
        assert all(np.array_equal(c.predicted, d.matrix) for c, d in zip(layers, deps, strict=True)
                   if c.predicted is not None), arch
    kind = resolution.position_kind(model)
    assert resolution.POSITION_CONTRACT[kind] == fam.contract[kind]
    x = torch.rand(2, g.channels, g.image_size, g.image_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(resolution.at_resolution(model, arch, params, g.image_size).eval()(x), model(x)), arch
    other = 2 * g.image_size  # a multiple of every size step (patch, Swin mergings)
    if fam.resize is None:  # a fixed grid: refused at another size, naming the key
        with pytest.raises(errors.ConfigError, match="evaluation.resolution.tasks"):
            resolution.at_resolution(model, arch, params, other)
        return
    mapped = resolution.at_resolution(model, arch, params, other).eval()
    with torch.no_grad():
        assert mapped(torch.rand(2, g.channels, other, other)).shape == (2, classes)
    for label, want, got in fam.position_checks(model, mapped, other):
        assert want == got, (arch, label)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_every_family_passes_the_family_checks(arch):
    family_checks(arch, tiny_repo.small_params())


def test_a_toy_family_added_by_the_checklist_passes_them(tmp_path, monkeypatch):
    # docs/extending.md "A family", followed on a copy of the package: the module, its registry line, its row.
    pkg = tmp_path / "pipeline"
    shutil.copytree(ROOT / "pipeline", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(TOY, pkg / "families/toy.py")
    registry = pkg / "families/__init__.py"
    text = registry.read_text()
    text = text.replace("from pipeline.families import convmixer, mixer, resnet, swin, vit",
                        "from pipeline.families import convmixer, mixer, resnet, swin, toy, vit")
    text = text.replace("_MODULES = (vit, swin, resnet, mixer, convmixer)",
                        "_MODULES = (vit, swin, resnet, mixer, convmixer, toy)")
    assert "toy" in text.split("_MODULES = ")[1].split("\n")[0]
    registry.write_text(text)
    archs = pkg / "archs.py"
    archs.write_text(archs.read_text().replace(
        "\n}\n", '\n    "toy": ArchInfo("vit", "toy", "patches and a global mean", "vit", "toy family"),\n}\n', 1))
    # the copy in place of the package for this test only (torch and timm stay loaded: the check is fast)
    saved = {name: mod for name, mod in sys.modules.items() if name == "pipeline" or name.startswith("pipeline.")}
    for name in saved:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert importlib.import_module("pipeline").__file__ == str(pkg / "__init__.py")
        families = importlib.import_module("pipeline.families")
        assert families.STEP_COST["toy"] == 0.5 and families.POSITION_CONTRACT["pooled"]
        family_checks("toy", tiny_repo.small_params())
    finally:
        for name in [n for n in sys.modules if n == "pipeline" or n.startswith("pipeline.")]:
            del sys.modules[name]
        sys.modules.update(saved)


def _pieces(name: str) -> dict:
    return {f.name: getattr(FAMILIES[name], f.name) for f in dataclasses.fields(Family)}


@pytest.mark.parametrize("piece", [f.name for f in dataclasses.fields(Family) if f.name != "name"])
def test_a_family_missing_a_piece_is_refused_naming_it(piece):
    pieces = _pieces("resnet")
    del pieces[piece]
    with pytest.raises(TypeError, match=piece):
        Family(**pieces)
    if piece not in ("resize", "options"):  # resize=None states a fixed grid; an empty option set is allowed
        with pytest.raises(TypeError, match=rf"family 'resnet': {piece}"):
            Family(**{**_pieces("resnet"), piece: None if piece != "classes" else ()})


def test_a_row_naming_an_unknown_family_or_option_fails_the_import_check(monkeypatch):
    row = ARCHS["resnet"]
    monkeypatch.setitem(ARCHS, "resnet_typo", dataclasses.replace(row, options={"downsampel": "none"}))
    with pytest.raises(ImportError, match=r"resnet_typo sets option\(s\) \['downsampel'\] that family 'resnet'"):
        families._check_table()
    monkeypatch.setitem(ARCHS, "resnet_typo", dataclasses.replace(row, family="resnt"))
    with pytest.raises(ImportError, match="resnet_typo names family 'resnt', which has no adapter"):
        families._check_table()


def test_every_arch_finds_its_family_from_the_built_module():
    from pipeline.config import load_params
    from pipeline.models import build_model

    params = load_params(ROOT / "params.yaml")
    for arch, info in ARCHS.items():
        width = 8 * family(arch).width_step(params, **info.options)
        with torch.device("meta"):  # structure only
            model = build_model(arch, params, 10, width=width)
        assert family_of_model(model) is family(arch), arch


@pytest.mark.parametrize("table", ["STEP_COST", "PLOT_COLOUR"])
def test_a_variant_without_its_step_cost_or_colour_is_refused_naming_it(monkeypatch, table):
    # A missing step cost once priced a run at vit's silently; now the family refuses it at import.
    monkeypatch.setitem(ARCHS, "resnet_wide", ArchInfo("resnet", "resnet", "a new variant", "resnet", "ResNet"))
    monkeypatch.setitem(getattr(resnet, "PLOT_COLOUR" if table == "STEP_COST" else "STEP_COST"), "resnet_wide", 0)
    with pytest.raises(ImportError, match=f"pipeline.families.resnet: {table} has no entry for resnet_wide"):
        families._check_table()
