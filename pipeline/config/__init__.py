"""Typed schema for ``params.yaml``: loaded once, validated before any stage does work.

Every section is a frozen, strict pydantic model that rejects unknown keys. ``load_params`` turns any
problem into a single :class:`ConfigError` line naming the key and the reason; stage entry points print
that line and exit non-zero without writing anything (see :mod:`pipeline.stages.common`).

One module per part of params.yaml. This package names no family and no task: ``models.<section>`` schemas
come from :data:`pipeline.archs.SECTIONS` and ``tasks.<name>`` schemas from :data:`pipeline.tasks.TASKS`, each
with its own cross-checks.
"""

from pipeline.config.distill import Distill, Student
from pipeline.config.evaluation import Evaluation, Finetune, ResolutionParams, SubgroupParams
from pipeline.config.interface import Interface, PairCounts
from pipeline.config.loader import DuplicateKey, StrictLoader, load_params, parse_params, read_params_text
from pipeline.config.memory import machine_memory
from pipeline.config.models import Models, arch_section
from pipeline.config.params import SEED_MAX, Params, training_sets
from pipeline.config.report import Report, Tracking
from pipeline.config.tasks import Slicing, TaskName, Tasks
from pipeline.config.train import ArchEntry, BudgetMode, Grid, Plan, Recipe, Runtime, StopRule, Train, Tune
from pipeline.errors import ConfigError
from pipeline.sections import Geometry, Section

__all__ = [
    "arch_section",
    "ArchEntry",
    "BudgetMode",
    "ConfigError",
    "Distill",
    "DuplicateKey",
    "Evaluation",
    "Finetune",
    "Geometry",
    "Grid",
    "Interface",
    "load_params",
    "machine_memory",
    "Models",
    "PairCounts",
    "Params",
    "parse_params",
    "Plan",
    "read_params_text",
    "Recipe",
    "Report",
    "ResolutionParams",
    "Runtime",
    "Section",
    "SEED_MAX",
    "Slicing",
    "StopRule",
    "StrictLoader",
    "Student",
    "SubgroupParams",
    "TaskName",
    "Tasks",
    "Tracking",
    "Train",
    "training_sets",
    "Tune",
]
