"""Architecture families: one adapter (:class:`~pipeline.families.common.Family`) per family, one module each.

A family is what its builder, FLOP formula, token count, token graph, resolution mapping, step cost and plot
colour share; an architecture is a row of :data:`pipeline.archs.ARCHS` that names a family and its options.
Adding a variant is one row (and its entries in the family's ``STEP_COST`` and ``PLOT_COLOUR``); adding a family
is one module here, its entry in ``_MODULES`` and its rows (docs/design.md section 7). A run's code identity
(:func:`source`) is its own family's module, not every family's, so adding or editing one family retrains that
family's runs only. Every table below is checked at import: a missing piece is refused naming the architecture.
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
# kind -> how it maps to another image size: every family's rows, in family order (pipeline.resolution)
POSITION_CONTRACT: dict[str, str] = {kind: text for f in FAMILIES.values() for kind, text in f.contract.items()}
# arch -> seconds per optimizer step against vit's: the pool's order (pipeline.experiment), the plan's prices
STEP_COST: dict[str, float] = {a: c for f in FAMILIES.values() for a, c in f.step_cost.items()}
PLOT_COLOUR: dict[str, str] = {a: c for f in FAMILIES.values() for a, c in f.plot_colour.items()}


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
    for name, fam in FAMILIES.items():
        own = {a for a, info in ARCHS.items() if info.family == name}
        for table in ("step_cost", "plot_colour"):
            given = set(getattr(fam, table))
            if missing := sorted(own - given):
                raise ImportError(f"pipeline.families.{name}: {table.upper()} has no entry for {', '.join(missing)}")
            if extra := sorted(given - own):
                raise ImportError(f"pipeline.families.{name}: {table.upper()} names {', '.join(extra)}, not an "
                                  f"architecture of family {name!r} in pipeline.archs")
    for kind in {k for f in FAMILIES.values() for k in f.contract}:
        texts = {f.contract[kind] for f in FAMILIES.values() if kind in f.contract}
        if len(texts) > 1:
            raise ImportError(f"pipeline.families: position kind {kind!r} is given {len(texts)} different contracts")
    if len(set(PLOT_COLOUR.values())) != len(PLOT_COLOUR):
        raise ImportError("pipeline.families: two architectures share a PLOT_COLOUR")


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
