"""``report`` and ``tracking``: how runs are summarised and judged, and where MLflow logs them."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BeforeValidator, Field, model_validator

from pipeline.config.models import arch_section
from pipeline.config.tasks import TaskName
from pipeline.sections import Fraction, Name, PosInt, Section, Text


def _timestamp(value: object) -> object:
    """An ISO 8601 string (quoted in params.yaml: DVC refuses YAML's own timestamps) as a datetime."""
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"{value!r} is not an ISO 8601 time (e.g. \"2026-12-06T07:00:00Z\")") from None
    return value


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
    # When this data draw (the top-level `seed`) was first generated: a ledger row registered (contrasts.csv,
    # bench.registration) before it is confirmatory on it, a later one exploratory (its design may have seen these
    # data). Null: no row is confirmatory. Set it to the time of the commit that first runs a new draw.
    registered_before: Annotated[datetime | None, BeforeValidator(_timestamp)]

    @model_validator(mode="after")
    def _expected(self) -> Report:
        if self.registered_before is not None and self.registered_before.tzinfo is None:
            raise ValueError(f"registered_before: {self.registered_before.isoformat()} needs a time zone "
                             "(e.g. 2026-12-06T07:00:00Z)")
        for task, archs in self.expected.items():
            for arch, (lo, hi) in archs.items():
                if arch_section(arch) is None:
                    raise ValueError(f"expected.{task}.{arch}: unknown architecture")
                if lo > hi:
                    raise ValueError(f"expected.{task}.{arch}: [{lo}, {hi}] is not a range (lo > hi)")
        return self

class Tracking(Section):
    # None: sqlite:///<repository root>/mlflow.db (absolute, so `dvc exp run --queue` copies log to it)
    tracking_uri: Text | None
    experiment_prefix: Name  # the MLflow experiments' names start with it
