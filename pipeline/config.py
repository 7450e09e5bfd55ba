"""Typed schema for ``params.yaml``: loaded once, validated before any stage does work.

Every section is a frozen, strict pydantic model that rejects unknown keys. ``load_params`` turns any
problem into a single :class:`ConfigError` line naming the key and the reason; stage entry points print
that line and exit non-zero without writing anything (see :mod:`pipeline.stages.common`).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pipeline.archs import ARCHS
from pipeline.errors import ConfigError
from pipeline.shapes import coinciding_shapes

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


class Section(BaseModel):
    # allow_inf_nan=False: `.inf`/`.nan` are refused for every float key (a non-finite lr diverges at step 1).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


# --------------------------------------------------------------------------- geometry
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


# --------------------------------------------------------------------------- interface (level 1)
class PairCounts(Section):
    image_size: PosInt
    patch_sizes: list[PosInt]
    window: PosInt
    extra_image_sizes: list[PosInt]  # at extra_patch_size
    extra_patch_size: PosInt

    @model_validator(mode="after")
    def _grids(self) -> PairCounts:
        if not self.patch_sizes:
            raise ValueError("patch_sizes: must list at least one patch size")
        for p in self.patch_sizes:
            if self.image_size % p:
                raise ValueError(f"patch_sizes: {p} does not divide image_size {self.image_size}")
        for h in self.extra_image_sizes:
            if h % self.extra_patch_size:
                raise ValueError(f"extra_image_sizes: {h} is not a multiple of extra_patch_size "
                                 f"{self.extra_patch_size}")
        return self


class Interface(Section):
    patch_size: PosInt  # P of the null-space study: D = P * P * channels
    widths: list[PosInt]  # embedding widths d
    collision_width: PosInt  # d < D for the collision pair (and a full-width control at d >= D)
    embed_dim: PosInt  # width of the attention/ViT modules in the permutation checks
    num_heads: PosInt
    small_tokens: Annotated[int, Field(gt=1, le=7)]  # every permutation (n! of them)
    large_tokens: PosInt
    random_permutations: Annotated[int, Field(gt=0, le=10_000)]  # one forward pass each
    atol: PosFloat  # float32 tolerance for "equal"
    exact_tol: PosFloat  # float64 tolerance for "equal" (the exact identities)
    image_size: PosInt  # images of the whole-ViT collision and permutation checks
    depth: Count  # blocks of those whole ViTs
    probes: PosInt  # reachability: random inputs whose Jacobian sparsity is united (ReLU gates)
    jacobian_cut: Annotated[float, Field(gt=0, lt=1)]  # |dy/dx| below cut * max counts as 0
    pair_counts: PairCounts

    @model_validator(mode="after")
    def _heads(self) -> Interface:
        if self.embed_dim % self.num_heads:
            raise ValueError(f"num_heads: {self.num_heads} does not divide embed_dim {self.embed_dim}")
        if self.collision_width % self.num_heads:
            raise ValueError(
                f"collision_width: {self.collision_width} is not divisible by num_heads {self.num_heads}"
            )
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size: {self.image_size} is not a multiple of patch_size {self.patch_size}")
        if not self.widths:
            raise ValueError("widths: must list at least one embedding width")
        return self


# --------------------------------------------------------------------------- models
class ViTParams(Section):
    depth: Count
    num_heads: Count
    mlp_ratio: PosFloat


class SwinLocal(Section):
    """The one-stage pair's own grid (``swin_local``, ``swin_local_shift``); its window spans the same pixels."""

    patch_size: PosInt
    window_size: PosInt


class SwinParams(Section):
    patch_size: PosInt
    window_size: PosInt
    depths: list[Count]  # blocks per stage; a patch merging between stages
    num_heads: list[Count]  # one entry per stage
    mlp_ratio: PosFloat
    local: SwinLocal | None = None  # None: the one-stage pair keeps patch_size and window_size

    def grid(self, local: bool) -> tuple[int, int]:
        """(patch px, window in tokens) of the two-stage model, or of the one-stage pair."""
        return (self.local.patch_size, self.local.window_size) if local and self.local else (
            self.patch_size, self.window_size)

    @model_validator(mode="after")
    def _one_head_count_per_stage(self) -> SwinParams:
        if len(self.depths) != len(self.num_heads):
            raise ValueError(f"num_heads: has {len(self.num_heads)} entries, depths has {len(self.depths)}")
        return self


class ResNetParams(Section):
    # BasicBlocks per stage; channels width * 2**stage; 3 stages (16 -> 8 -> 4 px) like the CIFAR ResNets.
    # At most 4 stages: timm's ResNet turns further stages into dilation instead of downsampling.
    layers: Annotated[list[PosInt], Field(min_length=1, max_length=4)]


class Models(Section):
    param_target: PosInt  # widths are solved so every architecture lands near this count
    param_tolerance: Annotated[float, Field(gt=0, lt=1)]
    # Widths are solved once with a head of this many classes and reused by every task, so an architecture's
    # body is the same on a 2-class and a 10-class task (the head alone differs).
    reference_classes: PosInt
    vit: ViTParams
    swin: SwinParams
    resnet: ResNetParams


# --------------------------------------------------------------------------- training
BudgetMode = Literal["steps", "flops", "criterion"]


def arch_section(arch: str) -> str | None:
    """The models.<section> an architecture reads (the one table: pipeline/archs.py); None if unknown."""
    info = ARCHS.get(arch)
    return info.section if info else None


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


# --------------------------------------------------------------------------- distillation
class Student(Section):
    """One DeiT student: its teacher, where it trains, and what its distillation head is trained on.

    ``transfer``: the student also trains on its task's transfer set (images at the factor's unseen values,
    ``tasks.<task>.transfer_n``) and gets no true label for them: only the distillation head's target.
    ``targets``: ``teacher`` (the teacher's argmax, or its logits when ``soft``), or ``relabel``: the control
    of docs/design.md section 4 (the true labels, a random share of the transfer set moved to a random other
    class at the teacher's own disagreement rate there: the same noise without the teacher's bias)."""

    teacher: str
    tasks: Annotated[list[str], Field(min_length=1)] | None = None  # None: distill.tasks
    transfer: bool = False
    targets: Literal["teacher", "relabel"] = "teacher"
    soft: bool | None = None  # None: distill.soft

    @model_validator(mode="before")
    @classmethod
    def _teacher_only(cls, value):
        return {"teacher": value} if isinstance(value, str) else value  # `deit: resnet` is the short form

    @model_validator(mode="after")
    def _control(self) -> Student:
        if self.targets == "relabel" and not self.transfer:
            raise ValueError("targets: relabel is the transfer set's noise control; it needs transfer: true")
        if self.targets == "relabel" and self.soft:
            raise ValueError("soft: relabelled targets are hard labels; a soft relabel control is not defined")
        return self


class Distill(Section):
    """Teachers (trained by the ``teacher`` stage) and the DeiT students distilled from them."""

    teachers: dict[str, str]  # teacher arch: its models section
    students: dict[Name, Student]  # student name (its run folder) -> its teacher (or the whole entry)
    tasks: list[str]  # where a student without its own ``tasks`` trains
    teacher_seed: NonNegInt
    # Teachers train on train_<teacher_size> minus the students' train_<train.size> (nested subsets): a
    # transfer set disjoint from the students' images, so their labels on the students' data can disagree.
    teacher_size: PosInt
    soft: bool  # DeiT's default is hard distillation (teacher argmax)
    tau: PosFloat  # soft-distillation temperature

    @model_validator(mode="after")
    def _students(self) -> Distill:
        for arch, section in self.teachers.items():
            if arch_section(arch) != section:
                raise ValueError(f"teachers.{arch}: unknown architecture or not models.{section}")
        for student, entry in self.students.items():
            if entry.teacher not in self.teachers:
                raise ValueError(f"students.{student}: teacher {entry.teacher!r} is not in distill.teachers")
        return self

    def student_tasks(self, student: str) -> list[str]:
        return self.students[student].tasks or self.tasks

    def teacher_tasks(self, teacher: str) -> list[str]:
        """Where ``teacher`` is trained: every task one of its students trains on, in ``tasks.names`` order of
        first appearance."""
        return list(dict.fromkeys(t for s, e in self.students.items() if e.teacher == teacher
                                  for t in self.student_tasks(s)))

    def is_soft(self, student: str) -> bool:
        soft = self.students[student].soft
        return self.soft if soft is None else soft


# --------------------------------------------------------------------------- tuning
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


# --------------------------------------------------------------------------- sequential seeds
class Plan(Section):
    """The second look (docs/design.md §4 "Sequential seeds"): the ``plan`` stage reads the first look's ledger
    (every cell at ``train.seeds``) and gives a paired row that is informative but underpowered the seeds its
    power calculation asks for, when that is at most ``max_seeds``; ``train_more`` trains only those. Each look is
    one Holm family at half of ``1 - report.confidence``. ``max_seeds`` at or below the first look's seed count:
    no second look, one family at the whole alpha. ``budget`` (thousands of ViT-step equivalents, as priced by
    :func:`pipeline.report.seeds.seed_prices`; null: no cap) caps the second look: rows are bought cheapest first
    and one that does not fit in what is left stays at its first look (0: none continues)."""

    max_seeds: Count
    budget: Annotated[float, Field(ge=0)] | None = None


# --------------------------------------------------------------------------- report
TaskName = Literal["alignment", "scale", "relation", "arrangement", "natural"]
class Report(Section):
    """How the ``report`` stage summarises runs and judges the prediction ledger (pipeline/report)."""

    confidence: Annotated[float, Field(gt=0.5, lt=1)]  # interval level; Holm's alpha = 1 - confidence
    # TOST margin of the rows without one of their own in contrasts.csv (the budget rows); the ledger refuses a
    # value above the smallest literature effect a contrast is anchored to.
    equivalence_margin: Annotated[float, Field(gt=0, lt=1)]
    bootstrap_samples: Annotated[int, Field(ge=100)]  # item-bootstrap replicates of the within-seed precision
    escape_threshold: Annotated[float, Field(gt=0, le=1)]  # a seed "escapes" when its test accuracy reaches this
    min_seeds_bimodal: Annotated[int, Field(ge=2)]  # a bimodal cell with fewer seeds is flagged "needs more seeds"
    collision_items: PosInt  # test images per (task, seed) in the trained-weights collision check
    # An arm learned a task when its in-distribution accuracy >= base + learn_fraction x (1 - base), base =
    # max(chance, shortcut floor, analytic bound); learn_fraction_tasks overrides it per task.
    learn_fraction: Annotated[float, Field(gt=0, lt=1)]
    learn_fraction_tasks: dict[TaskName, Annotated[float, Field(gt=0, lt=1)]]
    ceiling_tol: Annotated[float, Field(gt=0, lt=0.5)]  # both arms >= 1 - this (or <= chance + this): uninformative
    power: Annotated[float, Field(gt=0.5, lt=1)]  # target power of "seeds needed"
    max_seeds: Annotated[int, Field(ge=2)]  # seeds needed above this are reported as "> max_seeds"
    # Per task and arch, the test accuracy range the literature leads one to expect ([lo, hi], with its source in
    # a comment): the report prints each beside the measured cell (pipeline.report.natural.expected_table).
    expected: dict[TaskName, dict[str, Annotated[list[Fraction], Field(min_length=2, max_length=2)]]] = {}

    @model_validator(mode="after")
    def _expected(self) -> Report:
        for task, archs in self.expected.items():
            for arch, (lo, hi) in archs.items():
                if arch_section(arch) is None:
                    raise ValueError(f"expected.{task}.{arch}: unknown architecture")
                if lo > hi:
                    raise ValueError(f"expected.{task}.{arch}: [{lo}, {hi}] is not a range (lo > hi)")
        return self


# --------------------------------------------------------------------------- tracking
class Tracking(Section):
    # None: sqlite:///<repository root>/mlflow.db (absolute, so `dvc exp run --queue` copies log to it)
    tracking_uri: Text | None
    experiment_prefix: Name  # the MLflow experiments' names start with it


# --------------------------------------------------------------------------- tasks (level 2 data) and slicing
Range = Annotated[list[NonNegInt], Field(min_length=2, max_length=2)]  # [lo, hi], inclusive


def _check_range(key: str, r: list[int], lo: int | None = None, hi: int | None = None) -> None:
    if r[0] > r[1]:
        raise ValueError(f"{key}: [{r[0]}, {r[1]}] is not an increasing range")
    if (lo is not None and r[0] < lo) or (hi is not None and r[1] > hi):
        raise ValueError(f"{key}: [{r[0]}, {r[1]}] leaves the allowed range [{lo}, {hi}]")


class SyntheticParams(Section):
    """What every controlled task shares: its pool and the generic difficulty knobs."""

    n: PosInt  # pool size: fit rows (train + val) and eval rows (test)
    eval_fraction: Annotated[float, Field(gt=0, lt=1)]  # share of the pool reserved for the test split
    noise: Annotated[int, Field(ge=0, le=255)]  # uniform integer noise in [-noise, noise] per pixel
    clutter: NonNegInt  # distractors: random pixels (alignment, scale), marks/glyphs (relation, arrangement)


class AlignmentParams(SyntheticParams):
    num_classes: Annotated[int, Field(ge=2)]
    glyph_size: PosInt  # px; glyphs differ in exactly 2 * glyph_flips pixels (similarity knob)
    glyph_flips: PosInt
    train_offsets: Range  # fit rows: dx, dy in this range; eval rows: all of 0..P-1
    # transfer rows: offsets outside train_offsets only, never trained on with their labels (distill.students
    # with transfer: true learn them from a teacher's targets); 0: none
    transfer_n: NonNegInt = 0

    @model_validator(mode="after")
    def _glyphs(self) -> AlignmentParams:
        _check_range("train_offsets", self.train_offsets)
        if self.num_classes * self.glyph_flips > self.glyph_size**2 - 1:
            raise ValueError(f"glyph_flips: {self.num_classes} classes x {self.glyph_flips} flips exceed the "
                             f"{self.glyph_size ** 2 - 1} flippable pixels of a {self.glyph_size} px glyph")
        return self


class ScaleParams(SyntheticParams):
    shapes: list[Literal["square", "frame", "triangle", "plus", "disc", "diamond", "zed", "ess"]]
    rotate: bool  # each shape turned by a random quarter turn (factor `rotation`)
    min_size: Annotated[int, Field(ge=2)]  # px, over all (eval) rows
    max_size: PosInt
    train_sizes: Range  # fit rows draw sizes here; eval rows from min_size..max_size
    # transfer rows: unseen sizes only, never trained on with their labels (distill.students with transfer: true
    # learn them from a teacher's targets); 0: none
    transfer_n: NonNegInt = 0

    @model_validator(mode="after")
    def _sizes(self) -> ScaleParams:
        if len(set(self.shapes)) != len(self.shapes) or len(self.shapes) < 2:
            raise ValueError(f"shapes: need at least two distinct shapes, got {self.shapes}")
        _check_range("train_sizes", self.train_sizes, self.min_size, self.max_size)
        if self.min_size > self.max_size:
            raise ValueError(f"max_size: {self.max_size} is below min_size {self.min_size}")
        if problem := coinciding_shapes(list(self.shapes), self.min_size, self.max_size):
            raise ValueError(f"min_size: {problem}")
        if self.transfer_n and self.train_sizes == [self.min_size, self.max_size]:
            raise ValueError("transfer_n: every size is a training size, so there is no unseen size to draw from")
        return self


class RelationParams(SyntheticParams):
    num_colours: Annotated[int, Field(ge=3, le=8)]  # K; the relation is colour(B) = colour(A) +- 1 mod K
    mark_size: PosInt  # px of colour inside a 1 px frame: a mark is mark_size + 2 px wide
    clutter: NonNegInt  # distractor marks (dark-grey frames, random colours)
    # share of twin pairs whose two marks lie in one aligned near_block x near_block block of patch cells
    # (one Swin window: checked against models.swin); the rest at a uniform distance as before
    near_fraction: Annotated[float, Field(ge=0, le=1)]
    near_block: Annotated[int, Field(ge=2)]  # patch cells per block side

    @model_validator(mode="after")
    def _even(self) -> RelationParams:
        if self.n % 2:
            raise ValueError(f"n: {self.n} must be even (label-swapped twins)")
        return self


class ArrangementParams(SyntheticParams):
    glyph_size: PosInt  # must fit strictly inside a patch cell
    glyph_flips: PosInt
    distractor_types: NonNegInt  # glyph identities other than A and B, used by the clutter glyphs
    same_row: bool  # A and B always in one row

    @model_validator(mode="after")
    def _glyphs(self) -> ArrangementParams:
        if self.n % 2:
            raise ValueError(f"n: {self.n} must be even (layout-swapped twins)")
        k = 2 + self.distractor_types
        if k * self.glyph_flips > self.glyph_size**2 - 1:
            raise ValueError(f"glyph_flips: {k} glyphs x {self.glyph_flips} flips exceed the "
                             f"{self.glyph_size ** 2 - 1} flippable pixels of a {self.glyph_size} px glyph")
        if self.clutter and not self.distractor_types:
            raise ValueError("distractor_types: clutter glyphs need at least one distractor type")
        return self


class Augment(Section):
    """Label-preserving training views (pipeline.learner.augment_views), drawn per (seed, step): the standard
    CIFAR recipe of a random crop of the image padded with black, and a left-right mirror."""

    crop_pad: NonNegInt  # px of black on each side before a random crop back to size (0: no crop)
    flip: bool  # mirror left-right with probability 1/2

    @property
    def on(self) -> bool:
        return bool(self.crop_pad or self.flip)


class NaturalParams(Section):
    """CIFAR-10 from an archive outside the repository (never committed), downloaded when none is found."""

    # Candidate archives, tried in order, relative to the repository root (jpg tarball or python archive);
    # when none exists the official archive is downloaded to the last one. A single string is one candidate.
    path: Annotated[list[str], Field(min_length=1)]
    url: str  # the official archive
    md5: Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")] = "c58f30108f718f92721af3b95e74349a"  # published
    per_class_train: Annotated[int, Field(ge=1, le=5000)]  # first k per class of the official train
    per_class_test: Annotated[int, Field(ge=1, le=1000)]  # ... and of the official test split
    augment: Augment  # training views of every run on natural (a grid with augment: false turns them off)

    @field_validator("path", mode="before")
    @classmethod
    def _one_path(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @property
    def n(self) -> int:
        """Pool size (CIFAR-10 has 10 classes)."""
        return 10 * (self.per_class_train + self.per_class_test)


def _distinct(names: list[str]) -> list[str]:
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate task in {names}")
    return names


class Tasks(Section):
    # enabled tasks (dvc.yaml matrix)
    names: Annotated[list[TaskName], Field(min_length=1), AfterValidator(_distinct)]
    alignment: AlignmentParams
    scale: ScaleParams
    relation: RelationParams
    arrangement: ArrangementParams
    natural: NaturalParams


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


# --------------------------------------------------------------------------- evaluation (natural images)
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


# --------------------------------------------------------------------------- root
class Params(Section):
    seed: NonNegInt
    geometry: Geometry
    interface: Interface
    models: Models
    train: Train
    distill: Distill
    tune: Tune
    tracking: Tracking
    report: Report
    plan: Plan
    tasks: Tasks
    slice: Slicing
    evaluation: Evaluation
    finetune: Finetune

    @model_validator(mode="after")
    def _resolution_sizes(self) -> Params:
        """Every evaluated (or fine-tuned) size must keep whole patches for the ViTs and whole merges for Swin."""
        r, s, ft = self.evaluation.resolution, self.models.swin, self.finetune
        step = s.patch_size * 2 ** (len(s.depths) - 1)
        sizes = [("evaluation.resolution.sizes", size) for size in r.sizes]
        for key, size in [*sizes, *([("finetune.size", ft.size)] if ft.tasks else [])]:
            if size % self.geometry.patch_size:
                raise ValueError(f"{key}: {size} is not a multiple of geometry.patch_size {self.geometry.patch_size}")
            if size % step:
                raise ValueError(f"{key}: {size} is not a multiple of {step} (Swin patch {s.patch_size} and "
                                 f"{len(s.depths) - 1} patch mergings)")
            if s.local and size % s.local.patch_size:
                raise ValueError(f"{key}: {size} is not a multiple of models.swin.local.patch_size "
                                 f"{s.local.patch_size}")
        if missing := [x for x in ft.tasks if x not in self.tasks.names]:
            raise ValueError(f"finetune.tasks: {missing} not in tasks.names {sorted(self.tasks.names)}")
        if ft.tasks and ft.size == self.geometry.image_size:
            raise ValueError(f"finetune.size: {ft.size} is the training size geometry.image_size (nothing to map)")
        return self

    @model_validator(mode="after")
    def _interface_cross(self) -> Params:
        i, c = self.interface, self.geometry.channels
        big_d = i.patch_size**2 * c
        if i.collision_width >= big_d:
            raise ValueError(
                f"interface.collision_width: {i.collision_width} must be below D = patch_size^2 * channels "
                f"= {big_d}, or no collision pair exists"
            )
        return self

    @model_validator(mode="after")
    def _grid_uses_generated_data(self) -> Params:
        """Every trained task is generated, every trained size is sliced."""
        names, sizes = set(self.tasks.names), set(self.slice.train_sizes)
        t = self.train
        listed = [(f"train.archs.{a}.tasks", e.tasks) for a, e in t.archs.items()]
        listed += [(f"train.grids.{g}.tasks", x.tasks or []) for g, x in t.grids.items()]
        listed += [(f"distill.students.{s}.tasks", e.tasks or []) for s, e in self.distill.students.items()]
        for key, tasks in [*listed, ("distill.tasks", self.distill.tasks)]:
            if missing := [x for x in tasks if x not in names]:
                raise ValueError(f"{key}: {missing} not in tasks.names {sorted(names)}")
        for s, e in self.distill.students.items():
            lacking = [x for x in self.distill.student_tasks(s)
                       if e.transfer and not getattr(getattr(self.tasks, x), "transfer_n", 0)]
            if lacking:
                raise ValueError(f"distill.students.{s}.transfer: {lacking} have no transfer set "
                                 f"(tasks.<task>.transfer_n: alignment and scale have one, when it is > 0)")
        wanted = [("train.size", [t.size]), ("distill.teacher_size", [self.distill.teacher_size])]
        wanted += [(f"train.grids.{g}.sizes", x.sizes or []) for g, x in t.grids.items()]
        for key, want in wanted:
            if missing := [x for x in want if x not in sizes]:
                raise ValueError(f"{key}: {missing} not in slice.train_sizes {sorted(sizes)}")
        if self.distill.students and self.distill.teacher_size <= t.size:  # no students: no teacher set needed
            raise ValueError(f"distill.teacher_size: {self.distill.teacher_size} must exceed train.size {t.size} "
                             "(teachers train on the images students do not see)")
        if clash := sorted(set(self.distill.students) & set(t.archs)):  # both write data/runs/<name>
            raise ValueError(f"distill.students: {clash} also named in train.archs")
        return self

    @model_validator(mode="after")
    def _worker_limits(self) -> Params:
        """What a worker would otherwise find only after an MLflow run and a checkpoint folder exist."""
        t, d = self.train, self.distill
        seeds = [("seed", [self.seed]), ("train.seeds", t.seeds), ("distill.teacher_seed", [d.teacher_seed])]
        seeds += [(f"train.grids.{g}.seeds", x.seeds or []) for g, x in t.grids.items()]
        seeds.append(("tune.seed", [self.tune.seed]))
        if (trained := {v for key, values in seeds[1:-1] for v in values}) and self.tune.seed in trained:
            raise ValueError(f"tune.seed: {self.tune.seed} is also a training seed; trials must use a seed no "
                             "run of the study trains with")
        for key, values in seeds:
            if bad := [v for v in values if v > SEED_MAX]:
                raise ValueError(f"{key}: {bad[0]} is outside Lightning's seed range 0..{SEED_MAX}")
        batch = t.recipe.batch_size
        if (smallest := min(training_sets(self).items(), key=lambda kv: kv[1]))[1] < batch:
            raise ValueError(f"train.recipe.batch_size: {batch} exceeds the smallest training set, "
                             f"{smallest[0]} = {smallest[1]} images (a run needs one full batch)")
        return self

    @model_validator(mode="after")
    def _fits_in_memory(self) -> Params:
        """Sizes the schema admits but this machine cannot hold: MemoryError or swapping for minutes otherwise."""
        g, have = self.geometry, machine_memory()
        pools = [(f"tasks.{t}.n", getattr(self.tasks, t).n + getattr(getattr(self.tasks, t), "transfer_n", 0))
                 for t in self.tasks.names if t != "natural"]
        needs = [(key, n, n * g.image_size**2 * g.channels, f"{n} images of {g.image_size}x{g.image_size}x"
                  f"{g.channels} uint8 (geometry.image_size, geometry.channels)") for key, n in pools]
        # weights, gradients and AdamW's two moments: four float32 copies of every parameter
        needs.append(("models.param_target", self.models.param_target, 16 * self.models.param_target,
                      f"{self.models.param_target} parameters x 16 bytes (weights, gradients, AdamW moments)"))
        # the report's item bootstrap: a (replicates x test items) float64 weight matrix and its int64 counts
        reps, items = self.report.bootstrap_samples, self.slice.test_size
        needs.append(("report.bootstrap_samples", reps, 16 * reps * items,
                      f"{reps} replicates x {items} test items x 16 bytes"))
        # the interface's widest patch embedding: its weights and the Jacobian and null-space copies of them
        i = self.interface
        d, fan_in = max(i.widths), i.patch_size**2 * g.channels
        needs.append(("interface.widths", d, 16 * d * fan_in, f"a width-{d} embedding of {fan_in} inputs x 16 bytes"))
        # the exact checks' largest tensors: an (n x n) attention map per head at large_tokens, a (pixels x
        # pixels) Jacobian per probe at interface.image_size, a (tokens x tokens) Swin mask at pair_counts
        pixels = i.image_size**2 * g.channels
        needs.append(("interface.large_tokens", i.large_tokens, 8 * i.large_tokens**2 * i.num_heads,
                      f"a {i.large_tokens} x {i.large_tokens} float64 attention map per head"))
        needs.append(("interface.image_size", i.image_size, 8 * pixels**2,
                      f"a ({pixels} x {pixels}) float64 Jacobian of a {i.image_size} px image"))
        needs.append(("interface.probes", i.probes, 8 * pixels**2 * i.probes,
                      f"{i.probes} Jacobians of {pixels} x {pixels} float64"))
        grid_tokens = max((i.pair_counts.image_size // p) ** 2 for p in i.pair_counts.patch_sizes)
        needs.append(("interface.pair_counts.image_size", i.pair_counts.image_size, grid_tokens**2 // 8,
                      f"a {grid_tokens} x {grid_tokens} token-pair mask"))
        for key, value, need, what in needs:
            if need > have:
                raise ValueError(f"{key}: {value} is too large: {what} take {need / 2**30:.1f} GiB, more than "
                                 f"this machine's {have / 2**30:.1f} GiB of memory")
        return self

    @model_validator(mode="after")
    def _tasks_fit_geometry(self) -> Params:
        g, t = self.geometry, self.tasks
        p, h = g.patch_size, g.image_size
        a, sc, r, ar = t.alignment, t.scale, t.relation, t.arrangement
        checks = [
            (a.train_offsets[1] > p - 1, "tasks.alignment.train_offsets",
             f"{a.train_offsets} leaves the offsets 0..{p - 1} of a {p} px patch"),
            (a.glyph_size + p - 1 > h, "tasks.alignment.glyph_size",
             f"{a.glyph_size} px at offset {p - 1} does not fit a {h} px image"),
            (sc.max_size > h, "tasks.scale.max_size", f"{sc.max_size} px does not fit a {h} px image"),
            (r.mark_size + 2 > p, "tasks.relation.mark_size",
             f"{r.mark_size} px + a 1 px frame on each side does not fit a {p} px patch cell"),
            (r.near_fraction > 0 and g.grid % r.near_block > 0, "tasks.relation.near_block",
             f"{r.near_block} cells do not divide the {g.grid} x {g.grid} cell grid"),
            (2 + r.clutter > g.grid**2, "tasks.relation.clutter",
             f"2 marks + {r.clutter} distractors exceed the {g.grid ** 2} patch cells"),
            (g.grid < 2, "geometry.image_size", f"relation/arrangement need at least 2x2 patch cells, got {h}/{p}"),
            (ar.glyph_size > p, "tasks.arrangement.glyph_size", f"{ar.glyph_size} px exceeds the {p} px cell"),
            (2 + ar.clutter > g.grid**2, "tasks.arrangement.clutter",
             f"2 glyphs + {ar.clutter} distractors exceed the {g.grid ** 2} patch cells"),
            (g.channels != 3 and bool({"relation", "natural"} & set(t.names)), "geometry.channels",
             f"{g.channels}: the relation and natural tasks are RGB (3 channels)"),
            ("natural" in t.names and 32 % h and h % 32, "geometry.image_size",
             f"{h} is neither a divisor nor a multiple of CIFAR's 32 px"),
        ]
        for bad, key, why in checks:
            if bad:
                raise ValueError(f"{key}: {why}")
        return self

    @model_validator(mode="after")
    def _cross(self) -> Params:
        g, s = self.geometry, self.models.swin
        if g.image_size % s.patch_size:
            raise ValueError(
                f"models.swin.patch_size: {s.patch_size} does not divide geometry.image_size {g.image_size}"
            )
        grid = g.image_size // s.patch_size
        if s.window_size > grid:
            raise ValueError(
                f"models.swin.window_size: {s.window_size} is larger than the token grid {grid}x{grid}"
            )
        if grid % s.window_size:
            raise ValueError(
                f"models.swin.window_size: {s.window_size} does not divide the token grid {grid}"
            )
        if grid % (2 ** (len(s.depths) - 1)):
            raise ValueError(
                f"models.swin.depths: {len(s.depths)} stages halve the {grid}x{grid} grid too often"
            )
        # timm pads a window that does not divide a later stage's grid, and shrinks it (turning the shift off)
        # where it covers the whole grid; refuse the first, and a layout where no block shifts at all
        # (then swin and swin_noshift would be the same model).
        stage_grids = [grid // 2**i for i in range(len(s.depths))]
        for i, res in enumerate(stage_grids):
            if res > s.window_size and res % s.window_size:
                raise ValueError(
                    f"models.swin.window_size: {s.window_size} does not divide stage {i}'s grid {res} "
                    "(timm would pad it)"
                )
        if not any(res > s.window_size and d >= 2 for res, d in zip(stage_grids, s.depths, strict=True)):
            raise ValueError(
                f"models.swin.window_size: {s.window_size} leaves no block with a shifted window "
                f"(stage grids {stage_grids}, depths {s.depths}): swin would equal swin_noshift"
            )
        if (loc := s.local) is not None:
            # One stage: the window must tile the grid and leave room to shift, and span the pixels of the
            # two-stage window, which relation's window slices (near/cross pairs) are cut by.
            key, lgrid = "models.swin.local", g.image_size // loc.patch_size
            if g.image_size % loc.patch_size:
                raise ValueError(f"{key}.patch_size: {loc.patch_size} does not divide geometry.image_size "
                                 f"{g.image_size}")
            if lgrid % loc.window_size or lgrid <= loc.window_size:
                raise ValueError(f"{key}.window_size: {loc.window_size} must divide the {lgrid}x{lgrid} token grid "
                                 "and be smaller than it (else swin_local_shift never shifts)")
            if loc.patch_size * loc.window_size != s.patch_size * s.window_size:
                raise ValueError(f"{key}: a window of {loc.window_size} x {loc.patch_size} px, not the "
                                 f"{s.window_size} x {s.patch_size} px of models.swin (relation's window slices)")
        # after the model's own checks: a bad window is reported as such, not as the task's block
        r = self.tasks.relation
        window_px = s.patch_size * s.window_size
        if r.near_fraction and r.near_block * g.patch_size != window_px:
            fix = (f"set it to {window_px // g.patch_size} (or near_fraction to 0)"
                   if window_px % g.patch_size == 0 and window_px // g.patch_size >= 2
                   else f"set near_fraction to 0 (a {window_px} px window holds no block of 2 x 2 cells)")
            raise ValueError(
                f"tasks.relation.near_block: {r.near_block} cells of {g.patch_size} px are not one Swin window "
                f"({s.window_size} x {s.patch_size} px), so 'near' would not mean 'in one window': {fix}"
            )
        return self


def machine_memory() -> int:
    """Physical memory in bytes (what a size estimate is compared with)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def training_sets(p: Params) -> dict[str, int]:
    """Each training-set size some run trains on, by the key that sets it (teachers: their transfer set)."""
    t, d = p.train, p.distill
    sizes = {"train.size": t.size}
    sizes |= {f"train.grids.{g}.sizes": min(x.sizes) for g, x in t.grids.items() if x.sizes}
    if d.teachers and d.tasks:
        sizes["distill.teacher_size - train.size"] = d.teacher_size - t.size
    return sizes


def _format(err: ValidationError) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown key"
    elif first["type"] == "missing":
        msg = "missing (params.yaml holds every value; the schema has no defaults)"
    # A validator message that already starts with a key name ("swin.depths: ...") is more precise.
    if ":" in msg.split(" ")[0]:
        key, _, msg = msg.partition(": ")
        loc = f"{loc}.{key}" if loc else key
    return f"{loc}: {msg}" if loc else msg


def parse_params(raw: object, source: str = "params.yaml") -> Params:
    """Validate an already-loaded mapping; raises :class:`ConfigError` with one line."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: top level must be a mapping of sections, got {type(raw).__name__}")
    try:
        return Params.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(f"{source}: {_format(err)}") from None


# Lightning's seed_everything range (numpy's legacy seeding is uint32): a seed outside it fails only in a worker.
SEED_MAX = 2**32 - 1
MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKey(yaml.YAMLError):
    """A mapping names one key twice: ``safe_load`` would keep the last value without a word (DVC refuses it)."""

    def __init__(self, key: object, first: int, second: int):
        super().__init__(f"duplicate key {key!r} at lines {first} and {second}")


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key repeated within one mapping (``<<`` merges may still override)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[object, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node.start_mark.line + 1)
                except TypeError:  # an unhashable key: SafeLoader's own error names it
                    continue
                if first != key_node.start_mark.line + 1:
                    raise DuplicateKey(key, first, key_node.start_mark.line + 1)
        return super().construct_mapping(node, deep)


def read_params_text(path: Path) -> str:
    """The text of a params file, or one :class:`ConfigError` line naming the file (missing, not a file,
    unreadable, binary, not UTF-8)."""
    if not path.exists():
        raise ConfigError(f"{path}: file not found")
    if not path.is_file():
        raise ConfigError(f"{path}: not a file (a params file is YAML text)")
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read ({err.strerror or err})") from None
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise ConfigError(f"{path}: UTF-16 text; save it as UTF-8")
    if b"\0" in data:
        raise ConfigError(f"{path}: holds NUL bytes (binary, or UTF-16 without a BOM), not UTF-8 YAML text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text (byte {err.start})") from None


def load_params(path: str | Path = "params.yaml") -> Params:
    """Read and validate ``params.yaml`` (safe YAML loading, duplicate keys refused): every stage's one loader."""
    path = Path(path)
    text = read_params_text(path)
    try:
        raw = yaml.load(text, Loader=StrictLoader)  # noqa: S506  a SafeLoader subclass
    except DuplicateKey as err:
        raise ConfigError(f"{path}: {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise ConfigError(f"{path}: malformed YAML{where}") from None
    except RecursionError:  # thousands of nested brackets
        raise ConfigError(f"{path}: malformed YAML (nested too deeply)") from None
    return parse_params(raw if raw is not None else {}, str(path))
