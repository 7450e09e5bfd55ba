"""``train``, ``tune`` and ``plan``: the grids of runs, the one recipe, the runtime, matched tuning and the
second look."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field, model_validator

from pipeline.archs import ARCHS
from pipeline.config.models import arch_section
from pipeline.sections import Count, Fraction, Name, NonNegInt, PosFloat, PosInt, Section, Text

BudgetMode = Literal["steps", "flops", "criterion"]


class ArchEntry(Section):
    """One trained architecture: the models.<section> it reads and the tasks where its contrast matters."""

    models: str
    tasks: Annotated[list[str], Field(min_length=1)]  # an arch on no task: drop its entry instead

class Grid(Section):
    """Extra axes over the main grid; an omitted key takes the main grid's value."""

    # an empty list would make a grid of no runs: omit the key instead
    archs: Annotated[list[str], Field(min_length=1)] | None = None  # omitted: every train.archs entry
    tasks: Annotated[list[str], Field(min_length=1)] | None = None  # omitted: each arch's own tasks
    sizes: Annotated[list[PosInt], Field(min_length=1)] | None = None  # omitted: [train.size]
    steps: Annotated[list[PosInt], Field(min_length=1)] | None = None  # omitted: [train.recipe.steps]
    seeds: Annotated[list[NonNegInt], Field(min_length=1)] | None = None  # omitted: train.seeds
    data_seeds: Annotated[list[NonNegInt], Field(min_length=1)] | None = None  # omitted: [0] (the slice subset)
    budget_mode: BudgetMode | None = None  # omitted: train.recipe.budget_mode
    # steps = ceil(epochs x size / batch_size) per size: a data-size curve at matched exposure (exclusive with steps)
    epochs: PosInt | None = None
    augment: bool | None = None  # false: the task's training views off (tasks.natural.augment); omitted: on

    @model_validator(mode="after")
    def _axes(self) -> Grid:
        if self.epochs is not None and self.steps is not None:
            raise ValueError("epochs: a grid gives steps or epochs, not both (epochs sets each size's steps)")
        if self.augment is False and self.tasks != ["natural"]:
            raise ValueError("augment: false needs tasks: [natural] (only natural images have training views)")
        return self

    def steps_at(self, size: int, recipe: Recipe) -> list[int]:
        """The grid's step counts at one training-set size: its ``steps``, ``epochs`` passes over ``size`` images,
        or the recipe's."""
        if self.epochs is not None:
            return [math.ceil(self.epochs * size / recipe.batch_size)]
        return self.steps or [recipe.steps]

class Recipe(Section):
    """One recipe for every architecture: tuning effort is matched by construction (the same knobs for all)."""

    budget_mode: BudgetMode  # equal optimizer steps+data, equal training FLOPs, or to a criterion (train.criterion)
    steps: PosInt  # optimizer steps (steps), the reference arch's steps (flops), or the cap (criterion)
    flops_reference_arch: str  # budget_mode=flops: every arch spends this arch's training FLOPs
    batch_size: PosInt
    lr: PosFloat
    weight_decay: Annotated[float, Field(ge=0)]
    warmup_steps: NonNegInt
    min_lr_ratio: Fraction  # cosine decays to lr * min_lr_ratio
    label_smoothing: Annotated[float, Field(ge=0, lt=1)]
    grad_clip: Annotated[float, Field(ge=0)]  # 0 disables

    @model_validator(mode="after")
    def _ranges(self) -> Recipe:
        if self.warmup_steps >= self.steps:
            raise ValueError(f"warmup_steps: {self.warmup_steps} must be below steps {self.steps}")
        if arch_section(self.flops_reference_arch) is None:
            raise ValueError(f"flops_reference_arch: unknown architecture {self.flops_reference_arch!r}")
        return self

class Runtime(Section):
    """How runs execute. Lightning's own scaling knobs go straight to ``lightning.Trainer`` (README "Scaling")."""

    workers: PosInt  # runs side by side, one process each (2 cores: two 1-thread processes)
    scheduler: Text | None  # a Dask scheduler address; null: a loopback LocalCluster of `workers`
    threads: Annotated[int, Field(gt=0, le=1024)]  # torch threads per process
    accelerator: Literal["cpu", "gpu", "cuda", "mps", "tpu", "auto"]  # lightning.Trainer's names
    devices: PosInt | Literal["auto"]
    strategy: Text
    num_nodes: PosInt
    precision: Literal["32-true", "32", "16-mixed", "bf16-mixed", "16-true", "bf16-true", "64-true", "64",
                       "transformer-engine"]
    val_every_steps: PosInt
    log_every_steps: PosInt
    checkpoint_every_steps: PosInt  # resume granularity after an interruption
    eval_batch_size: PosInt

class StopRule(Section):
    """``budget_mode: criterion``: a run stops when it has learned (``accuracy`` held ``hold`` validations), or
    when it stopped learning (plateau), or at ``recipe.steps`` (the cap): pipeline.learner.Criterion."""

    accuracy: Fraction  # in-distribution validation accuracy that counts as learned
    hold: PosInt  # ... at this many consecutive validations
    patience: PosInt  # plateau: validations without a rise of min_delta in the best accuracy
    min_delta: Annotated[float, Field(ge=0)]
    min_steps: NonNegInt  # no plateau stop before this step
    # ... nor while the best accuracy is below chance + plateau_above x (1 - chance): near chance, train to the cap
    plateau_above: Annotated[float, Field(ge=0, lt=1)]

class Train(Section):
    """The main grid (each arch on its tasks x seeds at one size), extra grids, the recipe, the runtime."""

    seeds: list[NonNegInt]
    size: PosInt  # training-set size of the main grid (one of slice.train_sizes)
    # per_seed: each seed trains on its own class-balanced draw from the slice stage's pool (every arm's seed s on
    # the same draw, so pairs stay paired and intervals carry the data draw); fixed: every seed on train_<size>
    draw: Literal["per_seed", "fixed"]
    archs: dict[str, ArchEntry]
    grids: dict[Name, Grid]  # a grid's name is part of its runs' names
    recipe: Recipe
    criterion: StopRule
    runtime: Runtime

    @model_validator(mode="after")
    def _archs(self) -> Train:
        for arch, entry in self.archs.items():
            if arch_section(arch) is None:
                raise ValueError(f"archs.{arch}: unknown architecture (known: "
                                 f"{', '.join(ARCHS)})")
            if entry.models != arch_section(arch):
                raise ValueError(f"archs.{arch}.models: {arch} reads models.{arch_section(arch)}, "
                                 f"not models.{entry.models}")
        for name, grid in self.grids.items():
            if unknown := [a for a in grid.archs or [] if a not in self.archs]:
                raise ValueError(f"grids.{name}.archs: {unknown} not in train.archs")
            fewest = min(s for n in grid.sizes or [self.size] for s in grid.steps_at(n, self.recipe))
            if fewest <= self.recipe.warmup_steps:
                raise ValueError(f"grids.{name}: a run of {fewest} steps never leaves recipe.warmup_steps "
                                 f"{self.recipe.warmup_steps} (more epochs or steps, or a shorter warm-up)")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds: must be a non-empty list of distinct seeds, got {self.seeds}")
        return self

    @property
    def tasks(self) -> list[str]:
        """Every task some arch trains on, in first-mention order."""
        return list(dict.fromkeys(t for e in self.archs.values() for t in e.tasks))

    def sizes(self) -> list[int]:
        """Every training-set size any grid trains at."""
        return sorted({self.size, *(s for g in self.grids.values() for s in g.sizes or [])})


class Tune(Section):
    """Matched tuning (the ``tune`` stage, pipeline/tune.py): every cell of the main grid gets one trial per ``lrs``
    value on ``seed`` (a seed no grid trains), judged on validation accuracy only; one value: no trials."""

    lrs: Annotated[list[PosFloat], Field(min_length=1)]
    seed: NonNegInt

    @model_validator(mode="after")
    def _distinct_lrs(self) -> Tune:
        if len(set(self.lrs)) != len(self.lrs):
            raise ValueError(f"lrs: {self.lrs} lists a learning rate twice (each trial would run once)")
        return self

class Plan(Section):
    """The second look (docs/methods.md "Sequential seeds"): the ``plan`` stage reads the first look's ledger
    (every cell at ``train.seeds``) and gives a paired row that is informative but inconclusive the seeds its
    power calculation asks for, when that is at most ``max_seeds``; ``train_more`` trains only those. Each look is
    one Holm family at half of ``1 - report.confidence``. ``max_seeds`` at or below the first look's seed count:
    no second look, one family at the whole alpha. ``budget`` (thousands of ViT-step equivalents, as priced by
    :func:`pipeline.report.seeds.seed_prices`; null: no cap) caps the second look: rows are bought cheapest first
    and one that does not fit in what is left stays at its first look (0: none continues)."""

    max_seeds: Count
    budget: Annotated[float, Field(ge=0)] | None = None
