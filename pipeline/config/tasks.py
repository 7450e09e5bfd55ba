"""``tasks`` and ``slice``: the enabled tasks, one section per task (its schema declared in its module,
:data:`pipeline.tasks.TASKS`), and the nested training subsets."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, create_model, model_validator

from pipeline.sections import PosInt, Section
from pipeline.tasks import TASKS

TaskName = Literal[tuple(TASKS)]


def _distinct(names: list[str]) -> list[str]:
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate task in {names}")
    return names


Tasks = create_model(
    "Tasks", __base__=Section,
    names=(Annotated[list[TaskName], Field(min_length=1), AfterValidator(_distinct)], ...),  # enabled (dvc.yaml matrix)
    **{name: (spec.params, ...) for name, spec in TASKS.items()},
)


class Slicing(Section):
    """Nested, class-balanced training subsets, a fixed validation and test split (same for every size)."""

    train_sizes: Annotated[list[PosInt], Field(min_length=1)]
    val_size: PosInt  # from fit rows, disjoint from every training subset
    test_size: PosInt  # from eval rows; evaluation slices are subsets of it

    @model_validator(mode="after")
    def _increasing(self) -> Slicing:
        if any(a >= b for a, b in zip(self.train_sizes, self.train_sizes[1:], strict=False)):
            raise ValueError(f"train_sizes: {self.train_sizes} must be strictly increasing")
        return self
