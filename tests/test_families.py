"""Family adapters: one place per family, refused by name when a piece is missing, and per-family run identity."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch

from pipeline import families
from pipeline.archs import ARCHS, ArchInfo
from pipeline.families import FAMILIES, family, family_of_model, resnet
from pipeline.families.common import Family
from pipeline.provenance import code_parts, code_sha256

ROOT = Path(__file__).resolve().parents[1]


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


def test_a_run_hashes_only_its_own_family_module_and_rows():
    parts = code_parts(["vit_nopos"])
    modules = {k for k in parts if k.startswith("families/")}
    assert modules == {"families/__init__.py", "families/common.py", "families/vit.py"}
    assert {k for k in parts if k.startswith("archs:")} == {"archs:vit_nopos", "archs:vit"}  # its width's row too
    assert "archs.py" not in parts and "families/resnet.py" not in parts


def test_adding_an_architecture_changes_no_existing_run(monkeypatch):
    before = {arch: code_sha256([arch]) for arch in ARCHS}
    monkeypatch.setitem(ARCHS, "resnet_wide", ArchInfo("resnet", "resnet", "a new variant", "resnet", "ResNet",
                                                       {"downsample": "none"}))
    monkeypatch.setitem(resnet.STEP_COST, "resnet_wide", 2.0)  # a variant is its row plus its two table entries
    monkeypatch.setitem(resnet.PLOT_COLOUR, "resnet_wide", "#123456")
    families._check_table()
    assert {arch: code_sha256([arch]) for arch in before} == before


@pytest.mark.parametrize("table", ["STEP_COST", "PLOT_COLOUR"])
def test_a_variant_without_its_step_cost_or_colour_is_refused_naming_it(monkeypatch, table):
    # A missing step cost once priced a run at vit's silently; now the family refuses it at import.
    monkeypatch.setitem(ARCHS, "resnet_wide", ArchInfo("resnet", "resnet", "a new variant", "resnet", "ResNet"))
    monkeypatch.setitem(getattr(resnet, "PLOT_COLOUR" if table == "STEP_COST" else "STEP_COST"), "resnet_wide", 0)
    with pytest.raises(ImportError, match=f"pipeline.families.resnet: {table} has no entry for resnet_wide"):
        families._check_table()


def test_editing_one_family_module_changes_that_familys_runs_only(tmp_path):
    # Two copies of the package, one with a line added to the Swin module: the Swin runs' identity moves, no
    # other's (identities are cached per package root, as a stage computes them once).
    same, edited = tmp_path / "same" / "pipeline", tmp_path / "edited" / "pipeline"
    for copy in (same, edited):
        shutil.copytree(ROOT / "pipeline", copy, ignore=shutil.ignore_patterns("__pycache__"))
    with (edited / "families/swin.py").open("a") as f:
        f.write("# an edit\n")
    before = {a: code_sha256([a], same) for a in ARCHS}
    changed = {a for a in ARCHS if code_sha256([a], edited) != before[a]}
    assert changed == {a for a, info in ARCHS.items() if info.family == "swin"}
    assert before == {a: code_sha256([a]) for a in ARCHS}  # a copy hashes as the package itself
