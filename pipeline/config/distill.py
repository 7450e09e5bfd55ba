"""``distill``: teachers and the DeiT students distilled from them."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from pipeline.config.models import arch_section
from pipeline.sections import Name, NonNegInt, PosFloat, PosInt, Section


class Student(Section):
    """One DeiT student: its teacher, where it trains, and what its distillation head is trained on.

    ``transfer``: the student also trains on its task's transfer set (images at the factor's unseen values,
    ``tasks.<task>.transfer_n``) and gets no true label for them: only the distillation head's target.
    ``targets`` on the transfer set: ``teacher`` (the teacher's argmax, or its logits when ``soft``);
    ``relabel``, the noise control (each item's target drawn from the teacher's own confusion matrix at the
    item's factor value and true class: its errors' shape and rate, without which images they fall on, so no
    bias); or ``truth``, the oracle (the true labels: what label availability alone gives)."""

    teacher: str
    tasks: Annotated[list[str], Field(min_length=1)] | None = None  # None: distill.tasks
    transfer: bool = False
    targets: Literal["teacher", "relabel", "truth"] = "teacher"
    soft: bool | None = None  # None: distill.soft

    @model_validator(mode="before")
    @classmethod
    def _teacher_only(cls, value):
        return {"teacher": value} if isinstance(value, str) else value  # `deit: resnet` is the short form

    @model_validator(mode="after")
    def _control(self) -> Student:
        if self.targets != "teacher" and not self.transfer:
            raise ValueError(f"targets: {self.targets} replaces the teacher's targets on the transfer set; it needs "
                             "transfer: true")
        if self.targets != "teacher" and self.soft:
            raise ValueError(f"soft: {self.targets} targets are hard labels; a soft {self.targets} is not defined")
        return self

class Distill(Section):
    """Teachers (trained by the ``teacher`` stage) and the DeiT students distilled from them."""

    teachers: dict[str, str]  # teacher arch: its models section
    students: dict[Name, Student]  # student name (its run folder) -> its teacher (or the whole entry)
    tasks: list[str]  # where a student without its own ``tasks`` trains
    # Teachers are a random factor: one teacher per seed and type, each on its own draw of ``teacher_train``
    # images; a student of seed s learns from teacher_seeds[s % len(teacher_seeds)] (pipeline.grid).
    teacher_seeds: Annotated[list[NonNegInt], Field(min_length=1)]
    teacher_train: PosInt | None = None  # None: the whole teacher set (then teachers differ by seed only)
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

    def teacher_of(self, seed: int) -> int:
        """The teacher seed a student of ``seed`` learns from (teachers cycle over the student seeds)."""
        return self.teacher_seeds[seed % len(self.teacher_seeds)]

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
