"""A training stage's inputs, checked before any MLflow run or checkpoint is touched, so a refusal is one line
and changes nothing."""

from __future__ import annotations

from pipeline.config import Params
from pipeline.errors import ConfigError, StageError
from pipeline.grid import RunSpec, at_main_budget
from pipeline.split import load_split, training_indices, transfer_set


def check_inputs(specs: list[RunSpec], params: Params) -> None:
    """Read every file the runs will read, before any MLflow run or checkpoint is touched.

    A refusal is then one line and changes nothing: data, slices, training subsets, a transfer student's transfer
    set, and each teacher (readable, its sha256 as recorded, trained on these images).
    """
    # here, not at the top: both load torch and timm (~4 s), which `bias --help` and `bias pair`'s planning never need
    from pipeline.families import family
    from pipeline.provenance import PROVENANCE, load_teacher, pool_sha256

    splits, teachers = {}, set()
    for spec in specs:
        if (spec.key.task in params.evaluation.resolution.tasks and at_main_budget(spec, params)
                and family(spec.model).resize is None):
            raise ConfigError(f"evaluation.resolution.tasks: lists {spec.key.task}, where {spec.model} trains, but "
                              f"the {family(spec.model).name} family has a fixed token grid (no mapping to another "
                              f"size): drop {spec.key.task} from train.archs.{spec.key.arch}.tasks or from the sweep")
        where = (spec.data_dir, spec.slices_dir)
        if where not in splits:
            splits[where] = load_split(spec, verify=True)
        split, manifest = splits[where]
        training_indices(spec, split, params)
        if spec.teacher is not None and params.distill.students[spec.key.arch].transfer:
            transfer_set(split.indices, spec.key.task, spec.slices_dir / "indices.npz")
        if spec.teacher_dir is None or (spec.teacher_dir, spec.key.task) in teachers:
            continue
        teachers.add((spec.teacher_dir, spec.key.task))
        record = load_teacher(spec.teacher_dir, spec.key.task, params.for_task(spec.key.task), split.num_classes)[1]
        said = (record["arch"], record["task"], record["seed"])
        want = (spec.teacher, spec.key.task, params.distill.teacher_of(spec.key.seed))
        if said != want:
            raise StageError(f"{spec.teacher_dir / spec.key.task / PROVENANCE}: records the teacher {said[0]} on "
                             f"{said[1]}, seed {said[2]}, not {want[0]} on {want[1]}, seed {want[2]} "
                             f"(distill.teacher_seeds); rerun the teacher stage")
        if record.get("data_sha256") != pool_sha256(manifest):
            raise StageError(f"{spec.teacher_dir / spec.key.task / PROVENANCE}: the teacher was trained on other "
                             f"images than {spec.data_dir} (data_sha256 differs); rerun the teacher stage")
