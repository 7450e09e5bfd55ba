"""Teachers as a random factor: one teacher per seed and type, each on its own draw, each student seed paired
with one of them (pipeline.grid, pipeline.split)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tiny_repo

from pipeline.config import parse_params
from pipeline.grid import Folders, teacher_specs, train_specs


def test_each_student_seed_learns_from_its_own_teacher_and_teachers_cycle():
    params = parse_params(tiny_repo.params_with({
        "train": {"seeds": [0, 1, 2, 3]}, "distill": {"teacher_seeds": [5, 7], "teacher_train": 100}}))
    at = Folders(Path("d"), Path("s"), Path("o"), Path("c"), Path("t"))
    teachers = teacher_specs(params, at)
    assert [(s.key.seed, s.key.train_size, str(s.out_dir)) for s in teachers] == [
        (5, 100, "o/resnet/s5/alignment"), (7, 100, "o/resnet/s7/alignment")]
    assert teachers[0].name == "teacher/resnet/s5/alignment"
    students = [s for s in train_specs(params, at) if s.teacher]
    assert [(s.key.seed, str(s.teacher_dir)) for s in students] == [
        (0, "t/resnet/s5"), (1, "t/resnet/s7"), (2, "t/resnet/s5"), (3, "t/resnet/s7")]


def test_teachers_draw_their_own_images_from_the_teacher_set_only(workspace):
    from pipeline.grid import RunSpec, teacher_keys
    from pipeline.split import load_split, teacher_set, training_indices

    params = parse_params(tiny_repo.params_with({"distill": {"teacher_seeds": [0, 1], "teacher_train": 96}}))
    at = Folders(workspace / "data/tasks", workspace / "data/slices", Path("o"), Path("c"))
    keys = teacher_keys(params, "resnet")
    specs = [RunSpec(kind="teacher", key=k, model="resnet", data_dir=at.data / k.task, slices_dir=at.slices / k.task,
                     out_dir=Path("o"), ckpt_dir=Path("c")) for k in keys]
    split, _ = load_split(specs[0])
    held = teacher_set(split, params, "alignment", Path("x"))
    drawn = [training_indices(s, split, params) for s in specs]
    assert all(len(d) == 96 and np.isin(d, held).all() for d in drawn)
    assert not np.array_equal(drawn[0], drawn[1])  # each teacher its own draw
    counts = [np.bincount(split.labels[d], minlength=split.num_classes) for d in drawn]
    assert all(c.max() - c.min() <= 1 for c in counts)  # class-balanced
