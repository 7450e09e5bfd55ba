"""Architecture families: one adapter (:class:`~pipeline.families.common.Family`) per family, one module each.

A family is what its builder, FLOP formula, token count, token graph and resolution mapping share; an
architecture is a row of :data:`pipeline.archs.ARCHS` that names a family and its options. Adding a variant
is one row; adding a family is one module here, its entry in ``_MODULES`` and its rows. A run's code
identity (:func:`source`) is its own family's module, not every family's, so adding or editing one family
retrains that family's runs only.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from pipeline.archs import ARCHS
from pipeline.errors import ConfigError
from pipeline.families import convmixer, mixer, resnet, swin, vit
from pipeline.families.common import Family

_MODULES = (vit, swin, resnet, mixer, convmixer)  # a new family: its module here and in the import above
FAMILIES: dict[str, Family] = {m.FAMILY.name: m.FAMILY for m in _MODULES}
MODULES: dict[str, Path] = {m.FAMILY.name: Path(m.__file__) for m in _MODULES}


def _check_table() -> None:
    """Every architecture names a family that exists and only options that family reads (one line otherwise)."""
    for arch, info in ARCHS.items():
        if info.family not in FAMILIES:
            raise ImportError(f"pipeline.archs: {arch} names family {info.family!r}, which has no adapter in "
                              f"pipeline.families (have: {', '.join(FAMILIES)})")
        unknown = set(info.options) - FAMILIES[info.family].options
        if unknown:
            raise ImportError(f"pipeline.archs: {arch} sets option(s) {sorted(unknown)} that family "
                              f"{info.family!r} does not read (it reads {sorted(FAMILIES[info.family].options)})")


_check_table()


def family(arch: str) -> Family:
    """The adapter of ``arch``'s family; :class:`ConfigError` for an unknown architecture."""
    try:
        return FAMILIES[ARCHS[arch].family]
    except KeyError:
        raise ConfigError(f"arch: unknown architecture {arch!r}; expected one of {', '.join(ARCHS)}") from None


def family_of_model(model: nn.Module) -> Family:
    """The family whose builder returns a module of ``model``'s type (a built model finds its adapter)."""
    for fam in FAMILIES.values():
        if isinstance(model, fam.classes):
            return fam
    raise TypeError(f"{type(model).__name__}: no family in pipeline.families builds this module")


def source(arch: str) -> Path:
    """The module file that holds ``arch``'s family: the family part of a run's code identity."""
    return MODULES[ARCHS[arch].family]
