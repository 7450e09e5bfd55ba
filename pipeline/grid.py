"""Which runs a stage trains: the main grid plus ``train.grids``, as :class:`RunSpec` rows.

Names mean what they mean in ``metrics.json``: ``arch`` is the result name (``deit_labels``, ``deit_vit``),
``model`` the factory key it builds (``deit``), ``teacher`` the teacher arch of a distilled student (or None).
"""

from __future__ import annotations

from dataclasses import dataclass
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

    @property
    def folder(self) -> str:
        """``<task>/n<size>-t<steps>-s<seed>-d<data_seed>[-flops]``: readable, unique within an arch."""
        mode = "" if self.budget_mode == "steps" else f"-{self.budget_mode}"
        return f"{self.task}/n{self.train_size}-t{self.steps}-s{self.seed}-d{self.data_seed}{mode}"


@dataclass(frozen=True)
class RunSpec:
    """One run: its key, the model it builds, its teacher, and the folders it reads and writes."""

    stage: str  # "train", "teacher" or "distill": the MLflow experiment and the run name's prefix
    key: RunKey
    model: str  # factory key (pipeline.models)
    data_dir: Path  # data/tasks/<task>
    slices_dir: Path  # data/slices/<task>
    out_dir: Path  # metrics.json, predictions.npz, weights.pt (DVC outs)
    ckpt_dir: Path  # Lightning checkpoints (persisted across interruptions)
    teacher: str | None = None  # the teacher arch of a distilled student
    teacher_dir: Path | None = None  # that teacher's stage output

    @property
    def name(self) -> str:
        """The run's unique, readable name: ``train/vit/alignment/n4000-t1000-s0-d0``."""
        if self.stage == "teacher":
            return f"teacher/{self.key.arch}/{self.key.task}"
        return f"{self.stage}/{self.key.arch}/{self.key.folder}"


def train_keys(params: Params, arch: str) -> list[RunKey]:
    """Every run of ``arch``: the main grid, then each grid that lists it (deduplicated, in order)."""
    t = params.train
    r = t.recipe
    keys = [RunKey(task, arch, seed, t.size, r.steps, r.budget_mode)
            for task in t.archs[arch].tasks for seed in t.seeds]
    for grid in t.grids.values():
        if arch not in (grid.archs or t.archs):
            continue
        keys += [RunKey(task, arch, seed, size, steps, grid.budget_mode or r.budget_mode, data_seed)
                 for task in grid.tasks or t.archs[arch].tasks for size in grid.sizes or [t.size]
                 for steps in grid.steps or [r.steps] for seed in grid.seeds or t.seeds
                 for data_seed in grid.data_seeds or [0]]
    return list(dict.fromkeys(keys))


def specs_for(stage: str, keys: list[RunKey], data: Path, slices: Path, out: Path, ckpt: Path,
              teacher: str | None = None, teacher_dir: Path | None = None) -> list[RunSpec]:
    def folder(k: RunKey) -> str:
        return k.task if stage == "teacher" else k.folder

    return [RunSpec(stage=stage, key=k, model=k.arch if stage != "distill" else "deit",
                    data_dir=data / k.task, slices_dir=slices / k.task, out_dir=out / folder(k),
                    ckpt_dir=ckpt / folder(k), teacher=teacher, teacher_dir=teacher_dir) for k in keys]
