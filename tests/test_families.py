"""Family adapters: one place per family, refused by name when a piece is missing (run identity: test_identity)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from pipeline import families
from pipeline.archs import ARCHS
from pipeline.families import FAMILIES, family, family_of_model
from pipeline.families.common import Family

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
