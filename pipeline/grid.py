"""Which runs a stage trains: the main grid plus ``train.grids``, as :class:`RunSpec` rows.

Two stages train: ``teacher`` (:func:`teacher_specs`) and ``train`` (:func:`train_specs`: every architecture's runs
and the distilled students, in one worker pool). Names mean what they mean in ``metrics.json``: ``arch`` is the
result name (``deit_labels``, ``deit_vit``), ``model`` the factory key it builds (``deit``), ``teacher`` the teacher
arch of a distilled student (or None).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from pipeline.config import Params


@dataclass(frozen=True)
class RunKey:
    """What one run trains; a run listed by two grids has one key and runs once."""

    task: str
    arch: str
    seed: int
    train_size: int
    steps: int  # configured steps (budget_mode=flops: the reference arch's steps)
    budget_mode: str
    data_seed: int = 0  # 0: the slice stage's subset; k > 0: the k-th reshuffled draw from the same pool
    augment: bool = True  # the task's training views (tasks.natural.augment); False: a grid turned them off

    @property
    def folder(self) -> str:
        """``<task>/n<size>-t<steps>-s<seed>-d<data_seed>[-flops][-noaug]``: readable, unique within an arch."""
        mode = "" if self.budget_mode == "steps" else f"-{self.budget_mode}"
        views = "" if self.augment else "-noaug"
        return f"{self.task}/n{self.train_size}-t{self.steps}-s{self.seed}-d{self.data_seed}{mode}{views}"


@dataclass(frozen=True)
class RunSpec:
    """One run: its key, the model it builds, its teacher, and the folders it reads and writes."""

    kind: str  # "train", "teacher", "distill" (a student) or "tune" (a trial): the run name's prefix
    key: RunKey
    model: str  # factory key (pipeline.models)
    data_dir: Path  # data/tasks/<task>
    slices_dir: Path  # data/slices/<task>
    out_dir: Path  # metrics.json, predictions.npz, weights.pt (DVC outs)
    ckpt_dir: Path  # Lightning checkpoints (persisted across interruptions)
    teacher: str | None = None  # the teacher arch of a distilled student
    teacher_dir: Path | None = None  # that teacher's stage output
    lr: float | None = None  # the cell's learning rate chosen by the tune stage (a trial's own); None: the recipe's
    race: int | None = None  # a trial's step to beat: its cell's best steps to criterion so far (pipeline/tune.py)

    @property
    def name(self) -> str:
        """The run's unique, readable name: ``train/vit/alignment/n4000-t1000-s0-d0`` (a trial's ends ``-lr<lr>``)."""
        if self.kind == "teacher":
            return f"teacher/{self.key.arch}/{teacher_folder(self.key)}"
        trial = f"-lr{self.lr:g}" if self.kind == "tune" else ""
        return f"{self.kind}/{self.key.arch}/{self.key.folder}{trial}"


def train_keys(params: Params, arch: str) -> list[RunKey]:
    """Every run of ``arch``: the main grid, then each grid that lists it (deduplicated, in order)."""
    t = params.train
    r = t.recipe
    keys = [RunKey(task, arch, seed, t.size, r.steps, r.budget_mode)
            for task in t.archs[arch].tasks for seed in t.seeds]
    for grid in t.grids.values():
        if arch not in (grid.archs or t.archs):
            continue
        keys += [RunKey(task, arch, seed, size, steps, grid.budget_mode or r.budget_mode, data_seed,
                        grid.augment is not False)
                 for task in grid.tasks or t.archs[arch].tasks for size in grid.sizes or [t.size]
                 for steps in grid.steps_at(size, r) for seed in grid.seeds or t.seeds
                 for data_seed in grid.data_seeds or [0]]
    return list(dict.fromkeys(keys))


def training_views(spec: RunSpec, params: Params) -> dict:
    """The run's training views (``tasks.<task>.augment``): {} where the task has none or its grid turned them off."""
    views = getattr(getattr(params.tasks, spec.key.task), "augment", None)
    return views.model_dump() if views is not None and views.on and spec.key.augment else {}


def at_main_budget(spec: RunSpec, params: Params) -> bool:
    """Is this run a cell of the main grid (``train.size``, the recipe's steps and budget mode, the official
    draw, the task's training views)? Only those get the subgroup and resolution evaluations, so those tables never
    pool grid points."""
    k, r = spec.key, params.train.recipe
    if spec.kind == "tune":  # a trial answers one question: its validation accuracy
        return False
    return ((k.train_size, k.steps, k.budget_mode, k.data_seed, k.augment)
            == (params.train.size, r.steps, r.budget_mode, 0, True))


def student_keys(params: Params, student: str) -> list[RunKey]:
    """A distilled student's runs: its tasks (``distill.tasks`` unless its own) x ``train.seeds`` at the main
    budget."""
    t, r = params.train, params.train.recipe
    return [RunKey(task, student, seed, t.size, r.steps, r.budget_mode)
            for task in params.distill.student_tasks(student) for seed in t.seeds]


def teacher_keys(params: Params, arch: str) -> list[RunKey]:
    """A teacher type's runs: one per teacher seed and task one of its students trains on, each on its own draw of
    ``distill.teacher_train`` images from ``distill.teacher_size`` minus the students' ``train.size``."""
    d, r = params.distill, params.train.recipe
    n = d.teacher_train or d.teacher_size - params.train.size
    return [RunKey(task, arch, seed, n, r.steps, r.budget_mode) for task in d.teacher_tasks(arch)
            for seed in d.teacher_seeds]


def teacher_folder(key: RunKey) -> str:
    """Where one teacher lives under ``data/teachers/<arch>``: ``s<seed>/<task>``."""
    return f"s{key.seed}/{key.task}"


@dataclass(frozen=True)
class Folders:
    """Where a training stage reads and writes (dvc.yaml's values): one sub-folder per arch under ``out``/``ckpt``."""

    data: Path  # data/tasks
    slices: Path  # data/slices
    out: Path  # data/runs or data/teachers
    ckpt: Path  # persisted checkpoints
    teachers: Path | None = None  # data/teachers: the teacher stage's output (students read it)


def specs_for(kind: str, keys: list[RunKey], at: Folders, model: str | None = None,
              teacher: str | None = None, teacher_of: Callable[[int], int] | None = None) -> list[RunSpec]:
    """``teacher``: a student's teacher type; ``teacher_of`` (``Distill.teacher_of``) which of its seeds
    teaches a student seed: the spec's ``teacher_dir`` is that teacher's ``data/teachers/<arch>/s<seed>``."""
    def folder(k: RunKey) -> str:
        return f"{k.arch}/{teacher_folder(k)}" if kind == "teacher" else f"{k.arch}/{k.folder}"

    def taught_by(k: RunKey) -> Path | None:
        if teacher is None:
            return None
        if teacher_of is None:
            raise ValueError("specs_for: a student's specs need teacher_of (which teacher seed teaches a seed)")
        return at.teachers / teacher / f"s{teacher_of(k.seed)}"

    return [RunSpec(kind=kind, key=k, model=model or k.arch, data_dir=at.data / k.task,
                    slices_dir=at.slices / k.task, out_dir=at.out / folder(k), ckpt_dir=at.ckpt / folder(k),
                    teacher=teacher, teacher_dir=taught_by(k)) for k in keys]


def cells(params: Params) -> list[tuple[str, str]]:
    """The (arch, task) cells of the main grid, the distilled students' included: what the tune stage tunes."""
    out = [(arch, task) for arch, entry in params.train.archs.items() for task in entry.tasks]
    return out + [(student, task) for student in params.distill.students
                  for task in params.distill.student_tasks(student)]


def train_specs(params: Params, at: Folders, lrs: dict[tuple[str, str], float] | None = None) -> list[RunSpec]:
    """The ``train`` stage: every arch of ``train.archs`` (main grid + ``train.grids``), then every DeiT student of
    ``distill.students`` with its teacher. ``lrs``: the tune stage's learning rate per (arch, task) cell, used by
    every run of that cell (its grid runs too); a task only a grid trains an arch on keeps the recipe's."""
    specs = [s for arch in params.train.archs for s in specs_for("train", train_keys(params, arch), at)]
    for student, entry in params.distill.students.items():
        specs += specs_for("distill", student_keys(params, student), at, model="deit", teacher=entry.teacher,
                           teacher_of=params.distill.teacher_of)
    lrs = lrs or {}
    return [replace(s, lr=lrs.get((s.key.arch, s.key.task))) for s in specs]


def tune_specs(params: Params, at: Folders) -> list[RunSpec]:
    """The ``tune`` stage's trials: each cell of :func:`cells` once per ``tune.lrs`` value, at the main budget on
    ``tune.seed``; outputs under ``<out>/lr<lr>/<arch>/<run folder>``. One value: nothing to try."""
    t, r, lrs = params.train, params.train.recipe, params.tune.lrs
    if len(lrs) < 2:
        return []
    out = []
    for lr in lrs:
        trial = Folders(at.data, at.slices, at.out / f"lr{lr:g}", at.ckpt / f"lr{lr:g}", at.teachers)
        for arch, task in cells(params):
            teacher = params.distill.students[arch].teacher if arch in params.distill.students else None
            key = RunKey(task, arch, params.tune.seed, t.size, r.steps, r.budget_mode)
            out += [replace(s, lr=lr) for s in specs_for("tune", [key], trial, model="deit" if teacher else None,
                                                          teacher=teacher, teacher_of=params.distill.teacher_of)]
    return out


def teacher_specs(params: Params, at: Folders) -> list[RunSpec]:
    """The ``teacher`` stage: every teacher arch of ``distill.teachers`` on every task its students train on."""
    return [s for arch in params.distill.teachers for s in specs_for("teacher", teacher_keys(params, arch), at)]


def configured_cells(params) -> dict[str, set[str]]:
    """arch -> the tasks it trains on in the main grid (``train.archs``, the distilled students)."""
    out = {arch: set(entry.tasks) for arch, entry in params.train.archs.items()}
    for student in params.distill.students:
        out.setdefault(student, set()).update(params.distill.student_tasks(student))
    return out
