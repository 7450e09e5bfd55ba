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
