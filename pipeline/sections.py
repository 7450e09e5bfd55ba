"""What every section of the params schema is written in: the strict base model, the shared value types and
``geometry`` (the one section every task and model reads).

Outside :mod:`pipeline.config` on purpose: the modules that register sections into it (the tasks, the
architecture list) import this, and :mod:`pipeline.config` imports them.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

PosInt = Annotated[int, Field(gt=0)]
# Architecture counts (blocks, heads): far above any model this pipeline solves widths for, far below what makes
# building one take minutes or gigabytes before any check could say so.
Count = Annotated[int, Field(gt=0, le=256)]
# Names that become folders (data/runs/<name>, train.grids.<name>) and MLflow names: no path separators, no "..",
# no control characters.
Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
# A string a user sets (a URI, an address, a Lightning knob): not empty, nothing a log line or a name breaks on.
Text = Annotated[str, Field(min_length=1, pattern=r"^[^\x00-\x1f\x7f]+$")]
NonNegInt = Annotated[int, Field(ge=0)]
PosFloat = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]
Range = Annotated[list[NonNegInt], Field(min_length=2, max_length=2)]  # [lo, hi], inclusive


class Section(BaseModel):
    # allow_inf_nan=False: `.inf`/`.nan` are refused for every float key (a non-finite lr diverges at step 1).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class Geometry(Section):
    """Image and patch grid shared by tasks, models and the reachability prediction."""

    image_size: PosInt  # H = W in pixels
    patch_size: PosInt  # P: ViT patch, and the grid the controlled tasks are built against
    channels: PosInt

    @model_validator(mode="after")
    def _divides(self) -> Geometry:
        if self.image_size % self.patch_size:
            raise ValueError(
                f"patch_size: {self.patch_size} does not divide image_size {self.image_size}"
            )
        return self

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size


class TaskSection(Section):
    """A ``tasks.<name>`` section of params.yaml (declared in the task's module, pipeline/tasks)."""

    # The task's canvas is ``zoom`` x geometry.image_size, and every size in px that models and evaluation read is
    # ``zoom`` x its value (``Params.for_task``): the token grids stay, the pixels per token grow. The task's own
    # sizes (boxes, margins) are in px of its canvas.
    zoom: PosInt = 1


class ModelSection(Section):
    """A ``models.<section>`` of params.yaml (declared beside the architectures that read it, pipeline/archs.py).

    Its checks against the rest of the file run after every section is valid, in the order of the sections."""

    def zoomed(self, k: int) -> ModelSection:
        """This section on a canvas ``k`` times larger (a task's ``zoom``): its sizes in px times ``k``."""
        return self

    def check_size(self, params, key: str, size: int) -> None:
        """Refuse (ValueError) an evaluated or fine-tuned image ``size`` (set by ``key``) these models cannot map."""

    def check_against(self, params) -> None:
        """Refuse (ValueError) a value that does not fit the geometry or the tasks."""


def check_range(key: str, r: list[int], lo: int | None = None, hi: int | None = None) -> None:
    if r[0] > r[1]:
        raise ValueError(f"{key}: [{r[0]}, {r[1]}] is not an increasing range")
    if (lo is not None and r[0] < lo) or (hi is not None and r[1] > hi):
        raise ValueError(f"{key}: [{r[0]}, {r[1]}] leaves the allowed range [{lo}, {hi}]")
