"""Controlled synthetic tasks and natural images, behind one interface.

Every task module exposes ``generate(n, seed, geometry, cfg) -> TaskData``, ``SLICE_FACTORS`` (the factor
columns the ``slice`` stage cuts evaluation slices by), its ``tasks.<name>`` schema and ``fits`` (what must fit
the geometry). :data:`TASKS` maps task name -> spec; :mod:`pipeline.config` builds the ``tasks`` section from it
(adding a task is its module and its line here).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

from pipeline.sections import Section
from pipeline.tasks import alignment, arrangement, natural, relation, scale
from pipeline.tasks.common import TaskData

if TYPE_CHECKING:  # annotations only: pipeline.config imports this registry to build its tasks section
    from pipeline.config import Params


def _no_derived(factors: pd.DataFrame, params: Params) -> pd.DataFrame:
    return pd.DataFrame(index=factors.index)


def _relation_windows(factors: pd.DataFrame, params: Params) -> pd.DataFrame:
    swin = params.models.swin
    return relation.window_factors(factors, swin.patch_size * swin.window_size, params.geometry.image_size)


@dataclass(frozen=True)
class TaskSpec:
    """generate: the task's generator; slice_factors: columns to slice the test split by; params and fits: its
    schema and its geometry checks (pipeline.config runs them); derive: extra
    factor columns that depend on a model's configuration (added at slice time, e.g. Swin windows);
    twins: the factor column naming each sample's twin pair (splits keep pairs whole), or None."""

    generate: Callable[..., TaskData]
    slice_factors: list[str]
    params: type[Section]  # its tasks.<name> section
    fits: Callable[[Params], list[tuple[bool, str, str]]]  # (bad, key, why) against the geometry
    derive: Callable[[pd.DataFrame, Params], pd.DataFrame] = _no_derived
    twins: str | None = None
    rgb: bool = False  # needs geometry.channels 3
    check_models: Callable[[Params], None] | None = None  # against the models' sections, after their own checks


TASKS: dict[str, TaskSpec] = {
    "alignment": TaskSpec(alignment.generate, alignment.SLICE_FACTORS, alignment.AlignmentParams, alignment.fits),
    "scale": TaskSpec(scale.generate, scale.SLICE_FACTORS, scale.ScaleParams, scale.fits),
    "relation": TaskSpec(relation.generate, relation.SLICE_FACTORS, relation.RelationParams, relation.fits,
                         _relation_windows, twins="pair", rgb=True, check_models=relation.check_windows),
    "arrangement": TaskSpec(arrangement.generate, arrangement.SLICE_FACTORS, arrangement.ArrangementParams,
                            arrangement.fits, twins="pair"),
    "natural": TaskSpec(natural.generate, natural.SLICE_FACTORS, natural.NaturalParams, natural.fits, rgb=True),
}

__all__ = ["TASKS", "TaskData", "TaskSpec"]
