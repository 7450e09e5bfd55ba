"""``evaluation`` and ``finetune``: natural-image subgroups, other resolutions, fine-tuning at another size."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from pipeline.config.tasks import TaskName
from pipeline.sections import NonNegInt, PosFloat, PosInt, Section


class SubgroupParams(Section):
    """Pre-specified subgroups of the natural test set (pipeline/subgroups.py); no defaults: params.yaml."""

    border: Literal["edge", "constant", "wrap"]  # fill of pixels a translation or zoom brings in
    shuffle_seed: NonNegInt  # the per-image patch permutations of the arrangement subgroup
    zoom: Annotated[list[PosFloat], Field(min_length=1)]  # scale subgroup: < 1 zooms out, > 1 in

class ResolutionParams(Section):
    """Evaluate trained models at other image sizes, same patch size (pipeline/resolution.py)."""

    tasks: list[TaskName]  # tasks whose runs are also evaluated at ``sizes``
    sizes: Annotated[list[PosInt], Field(min_length=1)]  # image sizes (px); the token grid changes
    interpolation: Literal["bicubic", "bilinear"]  # learned absolute position embeddings (timm resample)
    image_resize: Literal["area", "bilinear", "bicubic"]  # native test images -> each size

class Evaluation(Section):
    subgroups: SubgroupParams
    resolution: ResolutionParams

class Finetune(Section):
    """Fine-tuning at another resolution (the ``finetune`` stage, pipeline/finetune.py): each main-grid run of
    ``tasks`` mapped to ``size`` px by the position contract and trained ``steps`` more steps there; no tasks: off.
    The run's weight decay, label smoothing, gradient clip and training views come from ``train.recipe`` and
    the task."""

    tasks: list[TaskName]
    size: PosInt
    steps: PosInt
    lr: PosFloat
    batch_size: PosInt
    warmup_steps: NonNegInt

    @model_validator(mode="after")
    def _warmup(self) -> Finetune:
        if self.warmup_steps >= self.steps:
            raise ValueError(f"warmup_steps: {self.warmup_steps} leaves no step after the warm-up of a "
                             f"{self.steps}-step fine-tuning")
        return self
