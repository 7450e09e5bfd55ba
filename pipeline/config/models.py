"""``models``: the parameter target every width is solved for, and one section per ``models.<section>`` that an
architecture reads (the schemas are declared beside the architectures, :data:`pipeline.archs.SECTIONS`)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, create_model

from pipeline.archs import ARCHS, SECTIONS
from pipeline.sections import PosInt, Section


def arch_section(arch: str) -> str | None:
    """The models.<section> an architecture reads (the one table: pipeline/archs.py); None if unknown."""
    info = ARCHS.get(arch)
    return info.section if info else None


class ModelBudget(Section):
    param_target: PosInt  # widths are solved so every architecture lands near this count
    param_tolerance: Annotated[float, Field(gt=0, lt=1)]
    # Widths are solved once with a head of this many classes and reused by every task, so an architecture's
    # body is the same on a 2-class and a 10-class task (the head alone differs).
    reference_classes: PosInt


Models = create_model("Models", __base__=ModelBudget, **{name: (schema, ...) for name, schema in SECTIONS.items()})
