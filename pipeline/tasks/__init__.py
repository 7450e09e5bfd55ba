"""Controlled synthetic tasks and natural images, behind one interface.

Every task module exposes ``generate(n, seed, geometry, cfg) -> TaskData`` and ``SLICE_FACTORS`` (the
factor columns the ``slice`` stage cuts evaluation slices by). :data:`TASKS` maps task name -> spec.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from pipeline.config import Params
from pipeline.tasks import alignment, arrangement, natural, relation, scale
from pipeline.tasks.common import TaskData


def _no_derived(factors: pd.DataFrame, params: Params) -> pd.DataFrame:
    return pd.DataFrame(index=factors.index)


def _relation_windows(factors: pd.DataFrame, params: Params) -> pd.DataFrame:
    swin = params.models.swin
    return relation.window_factors(factors, swin.patch_size * swin.window_size, params.geometry.image_size)


@dataclass(frozen=True)
class TaskSpec:
    """generate: the task's generator; slice_factors: columns to slice the test split by; derive: extra
    factor columns that depend on a model's configuration (added at slice time, e.g. Swin windows);
    twins: the factor column naming each sample's twin pair (splits keep pairs whole), or None."""

    generate: Callable[..., TaskData]
    slice_factors: list[str]
    derive: Callable[[pd.DataFrame, Params], pd.DataFrame] = _no_derived
    twins: str | None = None


TASKS: dict[str, TaskSpec] = {
    "alignment": TaskSpec(alignment.generate, alignment.SLICE_FACTORS),
    "scale": TaskSpec(scale.generate, scale.SLICE_FACTORS),
    "relation": TaskSpec(relation.generate, relation.SLICE_FACTORS, _relation_windows, twins="pair"),
    "arrangement": TaskSpec(arrangement.generate, arrangement.SLICE_FACTORS, twins="pair"),
    "natural": TaskSpec(natural.generate, natural.SLICE_FACTORS),
}

__all__ = ["TASKS", "TaskData", "TaskSpec"]
