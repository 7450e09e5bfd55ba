"""The root of the schema, organised like params.yaml: one field per section, then the checks across sections
(each model section's and each task's own cross-checks run from here, in the order of their registries)."""

from __future__ import annotations

from pydantic import PrivateAttr, model_validator

from pipeline.archs import SECTIONS
from pipeline.config.distill import Distill
from pipeline.config.evaluation import Evaluation, Finetune
from pipeline.config.interface import Interface
from pipeline.config.memory import check_fits_in_memory
from pipeline.config.models import Models
from pipeline.config.report import Report, Tracking
from pipeline.config.tasks import Slicing, Tasks
from pipeline.config.train import Plan, Train, Tune
from pipeline.sections import Geometry, NonNegInt, Section
from pipeline.tasks import TASKS

# Lightning's seed_everything range (numpy's legacy seeding is uint32): a seed outside it fails only in a worker.
SEED_MAX = 2**32 - 1
# The tasks whose schema has a transfer set (named in the error of a student that asks one of another task).
_WITH_TRANSFER = " and ".join(name for name, spec in TASKS.items() if "transfer_n" in spec.params.model_fields)


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
    _zoom: int = PrivateAttr(1)  # > 1 on the copy :meth:`for_task` returns for a zoomed task

    def for_task(self, task: str) -> Params:
        """What ``task``'s data, floors and runs read: these params with the geometry, every model section and the
        evaluated and fine-tuned sizes at the task's ``zoom`` (these params themselves at zoom 1). A copy at a zoom
        serves every task at that zoom; asking it for a task at another zoom is an error (it would zoom twice)."""
        k = getattr(self.tasks, task).zoom
        if k == self._zoom:
            return self
        if self._zoom != 1:
            raise ValueError(f"these params are at zoom {self._zoom} already; {task} is drawn at zoom {k}")
        g, res, ft = self.geometry, self.evaluation.resolution, self.finetune
        at = self.model_copy(update={
            "geometry": g.model_copy(update={"image_size": k * g.image_size, "patch_size": k * g.patch_size}),
            "models": self.models.model_copy(update={name: getattr(self.models, name).zoomed(k) for name in SECTIONS}),
            "evaluation": self.evaluation.model_copy(update={
                "resolution": res.model_copy(update={"sizes": [k * size for size in res.sizes]})}),
            "finetune": ft.model_copy(update={"size": k * ft.size})})
        at._zoom = k
        return at

    @model_validator(mode="after")
    def _resolution_sizes(self) -> Params:
        """Every evaluated (or fine-tuned) size must keep whole patches, and what each model section asks."""
        r, ft = self.evaluation.resolution, self.finetune
        sizes = [("evaluation.resolution.sizes", size) for size in r.sizes]
        for key, size in [*sizes, *([("finetune.size", ft.size)] if ft.tasks else [])]:
            if size % self.geometry.patch_size:
                raise ValueError(f"{key}: {size} is not a multiple of geometry.patch_size {self.geometry.patch_size}")
            for name in SECTIONS:
                getattr(self.models, name).check_size(self, key, size)
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
                                 f"(tasks.<task>.transfer_n: {_WITH_TRANSFER} have one, when it is > 0)")
        wanted = [("train.size", [t.size]), ("distill.teacher_size", [self.distill.teacher_size])]
        wanted += [(f"train.grids.{g}.sizes", x.sizes or []) for g, x in t.grids.items()]
        for key, want in wanted:
            if missing := [x for x in want if x not in sizes]:
                raise ValueError(f"{key}: {missing} not in slice.train_sizes {sorted(sizes)}")
        if self.distill.students and self.distill.teacher_size <= t.size:  # no students: no teacher set needed
            raise ValueError(f"distill.teacher_size: {self.distill.teacher_size} must exceed train.size {t.size} "
                             "(teachers train on the images students do not see)")
        held, d = self.distill.teacher_size - t.size, self.distill
        if d.students and d.teacher_train is not None and d.teacher_train > held:
            raise ValueError(f"distill.teacher_train: {d.teacher_train} exceeds the teacher set, distill.teacher_size"
                             f" - train.size = {held} images (each teacher draws its images from it)")
        if len(set(d.teacher_seeds)) < len(d.teacher_seeds):
            raise ValueError(f"distill.teacher_seeds: {d.teacher_seeds} repeats a seed (one teacher per seed)")
        if clash := sorted(set(self.distill.students) & set(t.archs)):  # both write data/runs/<name>
            raise ValueError(f"distill.students: {clash} also named in train.archs")
        return self

    @model_validator(mode="after")
    def _worker_limits(self) -> Params:
        """What a worker would otherwise find only after an MLflow run and a checkpoint folder exist."""
        t, d = self.train, self.distill
        seeds = [("seed", [self.seed]), ("train.seeds", t.seeds), ("distill.teacher_seeds", d.teacher_seeds)]
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
        check_fits_in_memory(self)
        return self

    @model_validator(mode="after")
    def _tasks_fit_geometry(self) -> Params:
        checks = [check for name, spec in TASKS.items() for check in spec.fits(self.for_task(name))]
        g, rgb = self.geometry, [name for name, spec in TASKS.items() if spec.rgb]
        checks.append((g.channels != 3 and bool(set(rgb) & set(self.tasks.names)), "geometry.channels",
                       f"{g.channels}: the {' and '.join(rgb)} tasks are RGB (3 channels)"))
        for bad, key, why in checks:
            if bad:
                raise ValueError(f"{key}: {why}")
        return self

    @model_validator(mode="after")
    def _cross(self) -> Params:
        """Each model section against the geometry, then each task against the models (a bad window is reported
        as such, not as a task's block)."""
        zoomed = {getattr(self.tasks, t).zoom: self.for_task(t) for t in self.tasks.names}  # one per canvas
        for p in [self, *(p for k, p in zoomed.items() if k > 1)]:
            for name in SECTIONS:
                getattr(p.models, name).check_against(p)
        for name, spec in TASKS.items():
            if spec.check_models is not None:
                spec.check_models(self.for_task(name))
        return self


def training_sets(p: Params) -> dict[str, int]:
    """Each training-set size some run trains on, by the key that sets it (teachers: their transfer set)."""
    t, d = p.train, p.distill
    sizes = {"train.size": t.size}
    sizes |= {f"train.grids.{g}.sizes": min(x.sizes) for g, x in t.grids.items() if x.sizes}
    if d.teachers and d.tasks:
        sizes["distill.teacher_size - train.size"] = d.teacher_size - t.size
        if d.teacher_train is not None:
            sizes["distill.teacher_train"] = d.teacher_train
    return sizes
