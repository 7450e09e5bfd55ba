"""MLflow at the edge: the only module that imports ``mlflow``. One store per repository, one experiment per stage.

Lifecycle (the stage process alone calls it; workers never talk to MLflow):

* :func:`check_store` before any work: an unreachable server or a corrupt sqlite file is one clear line.
* :func:`stage_run` opens one parent run per stage invocation (with system metrics); its :class:`StageRun`
  opens the nested run of each training run (``open``, or reopen a resumed one), ``record`` s what the worker
  returned, and ends it ``FINISHED``, ``FAILED`` (``fail``) or ``KILLED`` (``kill``, also :func:`end_stale_run`).

The store path is absolute and resolved to the *original* repository even when DVC runs a queued experiment in
a copy under ``.dvc/tmp/exps/``, so every run of a sweep lands in the same store. Creating a fresh sqlite store
from several processes at once corrupts it, so store and experiment creation happen under a file lock.

Metric names: the headline numbers (``test_acc``, ``params``, ``train_flops``, ...) carry no prefix, so MLflow's
run page shows them in its first chart section ("Model metrics"); the curves are grouped by prefix (``train/``,
``val/``). Each quantity is logged under one key (:data:`ALIASES`). The single-value detail (``slice/``,
``budget/``, ``measured/``, ...: :data:`TABLE_PREFIXES`) is one table artifact per run, :data:`SCALARS` (the
artifact viewer shows it as a sortable table), not ~70 metrics: as metrics, each was a bar chart of one bar on
the run's metrics page, ahead of the curves.

Models: each run's network is an MLflow *logged model* and each teacher a registered model version
(pipeline.mlflow_models, through :meth:`StageRun.model` and :meth:`StageRun.log`).
"""

from __future__ import annotations

import csv
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipeline.config import Params
from pipeline.environment import environment
from pipeline.errors import StageError
from pipeline.mlflow_models import (  # noqa: F401 (MODEL_NAME, alias: callers read them here)
    MODEL_NAME,
    MODEL_TAGS,
    alias,
    log_model,
    logged_model,
    quietly,
    register_teacher,
)
from pipeline.mlflow_store import (  # noqa: F401 (tracking_uri, store_faults: callers read them here)
    _client,
    _store_lock,
    check_store,
    fault_reason,
    store_faults,
    tracking_uri,
)
from pipeline.repository import git_commit, repo_root  # noqa: F401 (repo_root: experiment reads it here)

# MLflow 3 before 3.5 opens an experiment of this kind on its runs table (classic training), not the GenAI overview.
# Later UIs (3.17 checked: its bundle reads the tag only when a workflow-type flag is off, and that flag is on) take
# the kind from the page's ``workflowType`` URL parameter, else the browser's stored choice (default "genai"):
# only a link that carries the parameter (:func:`runs_url`) opens a fresh browser on the runs table.
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
WORKFLOW_QUERY = "workflowType=machine_learning"
# The runs table's saved view: a fresh browser opening #/experiments/<id>/runs?viewStateShareKey=headline sees
# these metric columns (MLflow 3 keeps the column choice per browser otherwise; checked in headless Chromium).
HEADLINE_COLUMNS = ["test_acc", "acc/id", "acc/ood", "val/acc", "params", "train_flops"]
# A final metric that repeats another key of the same run (by construction: pipeline.experiment._headline copies
# the budget's and the id/ood slices' numbers into headline keys, and val_acc is the validation curve's last point):
# dropped when the value it repeats is logged in the run, so each quantity has one key (the headline's, or the
# curve's, whose latest value the runs table shows).
ALIASES = {"budget/params": "params", "budget/train_flops": "train_flops", "budget/optimizer_steps": "optimizer_steps",
           "slice/id": "acc/id", "slice/ood": "acc/ood", "val_acc": "val/acc"}


# Final metrics under these prefixes are rows of the run's table artifact SCALARS (section, name, value), not metrics.
TABLE_PREFIXES = ("slice/", "budget/", "measured/", "student_train/", "transfer/")
SCALARS = "scalars.csv"


def _section(item: tuple[str, float]) -> tuple[int, str]:
    """Table order: by section in :data:`TABLE_PREFIXES` order (the slices first), then by name."""
    return next(i for i, p in enumerate(TABLE_PREFIXES) if item[0].startswith(p)), item[0]


def runs_url(base: str, experiment_id: str) -> str:
    """The link that opens an experiment on its runs table with the headline columns, in any browser."""
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?{WORKFLOW_QUERY}&viewStateShareKey=headline"


def _description(experiment_id: str) -> dict[str, str]:
    """The experiment's description (MLflow shows it above the runs): how to get back to this view. The link is
    relative to the page, so it works on whichever address and port the UI is served (``bias ui --port N``)."""
    link = runs_url("", experiment_id).lstrip("/")
    return {"mlflow.note.content": f"[Runs table with the headline columns]({link}) (`bias ui` prints it with its "
            f"address). Without `{WORKFLOW_QUERY}` MLflow 3 opens the GenAI overview until **Model training** is "
            "picked once."}


def experiment_links(uri: str, base: str) -> list[tuple[str, str]]:
    """``(name, link)`` of each experiment in the store at ``uri`` (not MLflow's empty Default), the link opening
    its runs table with the headline columns on the UI served at ``base``. The pipeline's experiments (those with
    the headline view) get this code's tags and description first: a store an older version wrote links to a
    fixed port in its descriptions."""
    with store_faults(uri):
        found = sorted(_client(uri).search_experiments(), key=lambda e: e.name)
        for e in found:
            if next(iter(_headline_view())) in e.tags:
                ensure_experiment(e.name, uri)
    return [(e.name, runs_url(base, e.experiment_id)) for e in found if e.name != "Default"]


def run_label(name: str) -> str:
    """The MLflow run name: the pipeline's name with the seed moved before size and steps
    (``train/vit/alignment/n4000-t1000-s0-d0`` -> ``train/vit/alignment/s0 n4000-t1000-d0``), so a column that
    cuts the name still shows which seed it is. The kind/arch/task prefix stays (runs are searched by it)."""
    head, _, tail = name.rpartition("/")
    parts = tail.split("-")
    seeds = [p for p in parts if re.fullmatch(r"s\d+", p)]
    if not head or len(seeds) != 1:
        return name
    rest = "-".join(p for p in parts if p != seeds[0])
    return f"{head}/{seeds[0]} {rest}" if rest else f"{head}/{seeds[0]}"


def run_description(tags: dict[str, str]) -> str:
    """One readable line for the runs table's Description column, from the tags a run is opened with."""
    t = tags.get
    if not (t("arch") and t("task")):
        return ""
    line = f"{t('arch')} on {t('task')}, seed {t('seed', '?')}"
    extra = [f"{t('train_size')} images" if t("train_size") else "", f"{t('steps')} steps" if t("steps") else "",
             f"data draw {t('data_seed')}" if t("data_seed") not in (None, "0") else "",
             f"{t('budget_mode')} budget" if t("budget_mode") not in (None, "steps") else "",
             f"teacher {t('teacher.arch')}" if t("teacher.arch") else ""]
    return ", ".join([line, *[e for e in extra if e]])


def _headline_view() -> dict[str, str]:
    cols = [f"metrics.`{m}`" for m in HEADLINE_COLUMNS]
    view = {"searchFilter": "", "orderByKey": cols[0], "orderByAsc": False, "startTime": "ALL",
            "lifecycleFilter": "Active", "datasetsFilter": [], "modelVersionFilter": "All Runs",
            "selectedColumns": cols, "runsExpanded": {}, "runsPinned": [], "runsHidden": [],
            "runsHiddenMode": "FIRST_10_RUNS", "viewMaximized": False, "runListHidden": False,
            "isAccordionReordered": False, "useGroupedValuesInCharts": True, "hideEmptyCharts": True,
            "groupBy": None, "groupsExpanded": {}, "autoRefreshEnabled": True}
    return {"mlflow.sharedViewState.headline": json.dumps(view)}


def ensure_experiment(name: str, uri: str) -> str:
    """Create (once, under a lock) or fetch the experiment, tagged to open on its runs table; returns its id."""
    with _store_lock(uri):
        client = _client(uri)
        exp = client.get_experiment_by_name(name)
        tags = {**EXPERIMENT_KIND, **_headline_view()}
        if exp is None:
            exp_id = client.create_experiment(name, tags=tags)
            client.set_experiment_tag(exp_id, *next(iter(_description(exp_id).items())))
            return exp_id
        for k, v in {**tags, **_description(exp.experiment_id)}.items():
            if exp.tags.get(k) != v:
                client.set_experiment_tag(exp.experiment_id, k, v)
        return exp.experiment_id


def experiment_name(params: Params, stage: str) -> str:
    return f"{params.tracking.experiment_prefix}-{stage}"


def dvc_experiment() -> dict[str, str]:
    """The DVC experiment this process runs in (``dvc exp run`` sets these variables) and the profile
    (``bias profile <name>`` sets ``BIAS_PROFILE``), else nothing."""
    names = {"DVC_EXP_NAME": "dvc.exp_name", "DVC_EXP_BASELINE_REV": "dvc.exp_baseline_rev",
             "BIAS_PROFILE": "profile"}
    return {tag: os.environ[var] for var, tag in names.items() if os.environ.get(var)}


def run_tags(stage: str) -> dict[str, str]:
    """Tags every run of this process carries: the stage, the commit, the DVC experiment if any, and the
    environment the numbers also depend on (``env.*``: versions, CPU, kernel dispatch; pipeline.environment). That
    is this process's: on one machine the workers' too; a cluster's workers are checked against it by the executor,
    which warns where one differs."""
    env = {f"env.{key}": value for key, value in environment().items()}
    return {"stage": stage, "git_commit": git_commit(), **dvc_experiment(), **env}


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dict -> ``{"a.b.c": value}`` for MLflow params."""
    out: dict[str, Any] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}{k}."))
    else:
        out[prefix.rstrip(".")] = obj
    return out


def metric_key(key: str) -> str:
    return re.sub(r"[^\w./ -]", "_", key)  # MLflow's allowed characters


def _batches(items: list, size: int) -> Iterator[list]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def unaliased(metrics: dict[str, float], latest: dict[str, float]) -> dict[str, float]:
    """``metrics`` less each :data:`ALIASES` key whose value is already the run's under the key it repeats (in
    ``metrics`` itself, or ``latest``: the run's latest value of each curve). A value that differs is kept."""
    known = {**latest, **metrics}
    return {k: v for k, v in metrics.items() if not (k in ALIASES and known.get(ALIASES[k]) == v)}


class StageRun:
    """One stage invocation's parent run, and the nested runs it opens, records and ends."""

    def __init__(self, client, experiment_id: str, run_id: str, tags: dict[str, str], prefix: str = "bias"):
        self.client, self.experiment_id, self.run_id, self.tags = client, experiment_id, run_id, tags
        self.prefix = prefix  # the experiments' prefix: teachers register as <prefix>-teacher-<arch>
        self.running: set[str] = set()  # nested runs opened and not ended: ended with the stage if it fails
        # a reopened run's (metric, step, value) points in the store, kept up to date: an interrupted run's first
        # attempt logged some, and the resumed attempt replays its live file and the steps after its checkpoint
        self.held: dict[str, set[tuple[str, int, float]]] = {}
        self.latest: dict[str, dict[str, tuple[int, float]]] = {}  # per run: each curve's last (step, value)
        self.finals: dict[str, list] = {}  # per run: the final metrics logged, linked to its logged model
        self.models: dict[str, str] = {}  # per run: its logged model's id
        self.model_tags: dict[str, dict[str, str]] = {}  # per run: the tags its logged model copies (MODEL_TAGS)
        self.scalars: dict[str, dict[str, float]] = {}  # per run: the rows of its table artifact SCALARS

    def open(self, name: str, tags: dict[str, str], params: dict[str, Any], run_id: str | None = None,
             start_time: float | None = None) -> str:
        """A nested run (RUNNING) started at ``start_time`` (seconds since the epoch; default now), or the resumed
        ``run_id`` reopened; returns its id."""
        from mlflow.exceptions import MlflowException

        if run_id is not None:
            try:
                self.client.update_run(run_id, status="RUNNING")
                self.running.add(run_id)
                data = self.client.get_run(run_id).data
                self.held[run_id] = {(key, m.step, m.value) for key in data.metrics
                                     for m in self.client.get_metric_history(run_id, key)}
                self.model_tags[run_id] = {k: v for k, v in data.tags.items() if k in MODEL_TAGS}
                self._remember(run_id, self.held[run_id])
                return run_id
            except MlflowException:
                pass  # deleted, or from another store: start a new one
        note = run_description(tags)
        all_tags = {**self.tags, **tags, "mlflow.parentRunId": self.run_id,
                    **({"mlflow.note.content": note} if note else {})}
        start_ms = int(1000 * start_time) if start_time is not None else None
        run = self.client.create_run(self.experiment_id, run_name=run_label(name), tags=all_tags, start_time=start_ms)
        self.running.add(run.info.run_id)
        self.model_tags[run.info.run_id] = {k: str(v) for k, v in tags.items() if k in MODEL_TAGS}
        self.log(run.info.run_id, params=params)
        return run.info.run_id

    def _remember(self, run_id: str, points) -> None:
        """Keep each curve's last point (highest step) among ``points`` ``(key, step, value)``."""
        latest = self.latest.setdefault(run_id, {})
        for key, step, value in points:
            if key not in latest or step >= latest[key][0]:
                latest[key] = (step, value)

    def log(self, run_id: str | None = None, *, params: dict | None = None, metrics: dict | None = None,
            series: list[dict] | None = None, tags: dict | None = None) -> None:
        """Params, tags, final metrics, and per-step ``series`` rows ``{"step": k, name: value, ...}`` (a point a
        reopened run already holds, same step and value, is not logged again; a final metric that repeats another
        key's value, :data:`ALIASES`, is not logged). A teacher's own provenance record (the tags whose
        ``teacher.mlflow_run_id`` is this run) registers its logged model (:meth:`register_teacher`)."""
        from mlflow.entities import Metric, Param, RunTag

        run_id = run_id or self.run_id
        now = int(time.time() * 1000)
        points = [(metric_key(k), int(row["step"]), float(v)) for row in series or [] for k, v in row.items()
                  if k != "step" and v is not None]
        self._remember(run_id, points)
        latest = {k: v for k, (_, v) in self.latest.get(run_id, {}).items()}
        numbers = {k: float(v) for k, v in (metrics or {}).items() if isinstance(v, (int, float)) and v == v}
        if table := {k: v for k, v in numbers.items() if k.startswith(TABLE_PREFIXES)}:  # their own names
            self.table(run_id, table)
        finals = {metric_key(k): v for k, v in numbers.items() if k not in table}  # NaN is not a metric
        entries = [Metric(k, v, now, 0) for k, v in unaliased(finals, latest).items()]
        entries += [Metric(k, v, now, step) for k, step, v in points]
        if (held := self.held.get(run_id)) is not None:  # a reopened run: each point once (a changed value is new)
            entries = [m for m in entries if (m.key, m.step, m.value) not in held]
        self.finals.setdefault(run_id, []).extend(m for m in entries if m.key in finals)
        plist = [Param(k, str(v)[:6000]) for k, v in flatten(params or {}).items()]
        tlist = [RunTag(k, str(v)) for k, v in (tags or {}).items()]
        for chunk in _batches(entries, 1000):
            self.client.log_batch(run_id, metrics=chunk)
            if held is not None:  # only once in the store: a failed batch is logged again by the run's record
                held.update((m.key, m.step, m.value) for m in chunk)
        for chunk in _batches(plist, 100):
            self.client.log_batch(run_id, params=chunk)
        if tlist:
            self.client.log_batch(run_id, tags=tlist)
        if tags and str(tags.get("teacher.mlflow_run_id")) == run_id:
            self.register_teacher(run_id, {k.removeprefix("teacher."): str(v) for k, v in tags.items()})

    def table(self, run_id: str, rows: dict[str, float]) -> None:
        """Add ``rows`` (``{"slice/dx=1": 0.5, ...}``) to the run's table artifact :data:`SCALARS`, one row per key
        (``section,name,value``: ``slice,dx=1,0.5``), the slices first, written again whole (a resumed run's is
        replaced)."""
        held = self.scalars.setdefault(run_id, {})
        held.update(rows)
        with tempfile.TemporaryDirectory(prefix="bias-table-") as tmp:
            path = Path(tmp) / SCALARS
            with path.open("w", newline="") as f:
                out = csv.writer(f, lineterminator="\n")
                out.writerow(["section", "name", "value"])
                out.writerows([*key.split("/", 1), repr(value)] for key, value in sorted(held.items(), key=_section))
            self.client.log_artifact(run_id, str(path))

    def artifact(self, path: Path, run_id: str | None = None, folder: str | None = None) -> str:
        """Log a file or folder; returns its artifact URI (``runs:/<id>/<folder>/<name>``)."""
        run_id = run_id or self.run_id
        if path.is_dir():
            self.client.log_artifacts(run_id, str(path), folder)
        else:
            self.client.log_artifact(run_id, str(path), folder)
        return f"runs:/{run_id}/{f'{folder}/' if folder else ''}{path.name}"

    def datasets(self, run_id: str, inputs: list[dict[str, Any]]) -> None:
        """MLflow dataset inputs of a run, each ``{"name", "context", "digest", "source", "profile"}``: the
        Datasets column and the run page show which data (by hash) it trained and was tested on."""
        from mlflow.entities import Dataset, DatasetInput, InputTag

        self.client.log_inputs(run_id, datasets=[
            DatasetInput(Dataset(name=d["name"], digest=d["digest"][:32], source_type="local", source=d["source"],
                                 profile=json.dumps(d["profile"], sort_keys=True)),
                         tags=[InputTag("mlflow.data.context", d["context"])]) for d in inputs])

    def model(self, run_id: str, model: Any, example: Any) -> str:
        """Log a trained torch ``model`` as the run's MLflow logged model (:func:`pipeline.mlflow_models.log_model`),
        with the run's headline metrics linked to it; returns ``models:/<model_id>``, which
        ``mlflow.pytorch.load_model`` turns back into the module (as it does ``runs:/<run_id>/network``). A reopened
        run that logged its model before is not logged again."""
        known = logged_model(self.client, self.experiment_id, run_id) if run_id in self.held else None
        self.models[run_id] = known or log_model(
            self.client, self.experiment_id, run_id, model, example, self.model_tags.get(run_id),
            [m for m in self.finals.get(run_id, []) if m.key in HEADLINE_COLUMNS])
        return f"models:/{self.models[run_id]}"

    def register_teacher(self, run_id: str, record: dict[str, str]) -> str | None:
        """Register a teacher run's logged model as a version of ``<prefix>-teacher-<arch>``
        (:func:`pipeline.mlflow_models.register_teacher`); returns the version, or None where the run logged no
        model."""
        model_id = self.models.get(run_id) or logged_model(self.client, self.experiment_id, run_id)
        if model_id is None:
            return None
        description = run_description(self.client.get_run(run_id).data.tags)
        return register_teacher(self.client, model_id, self.prefix, run_id, record, description)

    def finish(self, run_id: str) -> None:
        self.end(run_id, "FINISHED")

    def fail(self, run_id: str) -> None:
        self.end(run_id, "FAILED")

    def kill(self, run_id: str) -> None:
        self.end(run_id, "KILLED")

    def end(self, run_id: str, status: str) -> None:
        self.client.set_terminated(run_id, status)
        self.running.discard(run_id)

    def end_all(self, status: str) -> None:
        """End every nested run still open, then the parent, as ``status``: best effort, since the store may be
        what failed (the stage's own error is the one reported; a run left behind is ended KILLED next time)."""
        for run_id in [*sorted(self.running), self.run_id]:
            try:
                self.end(run_id, status)
            except Exception as err:  # noqa: BLE001  the stage is already failing with its own error
                if fault_reason(err) is None and not isinstance(err, StageError):
                    raise


@contextmanager
def stage_run(params: Params, stage: str, name: str, tags: dict[str, str] | None = None) -> Iterator[StageRun]:
    """The parent run of one stage invocation (system metrics sampled while it lasts); FAILED if the block raises."""
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    logging.getLogger("mlflow.system_metrics").setLevel(logging.ERROR)  # start/stop banners, its own store faults
    uri = check_store(params)
    exp_id = ensure_experiment(experiment_name(params, stage), uri)
    client = _client(uri)
    base = {**run_tags(stage), **(tags or {})}
    _end_dead_parents(client, exp_id, name)
    _end_orphans(client, exp_id)
    parent = client.create_run(exp_id, run_name=name, tags={**base, "host": os.uname().nodename,
                                                           "pid": str(os.getpid())})
    run = StageRun(client, exp_id, parent.info.run_id, base, params.tracking.experiment_prefix)
    monitor = SystemMetricsMonitor(run.run_id, sampling_interval=5, tracking_uri=uri)
    with store_faults(uri):
        monitor.start()
    try:
        yield run
    except BaseException as err:
        quietly(monitor.finish)
        # Ctrl-C: KILLED, like the runs an interrupted stage leaves (they resume); anything else FAILED.
        run.end_all("KILLED" if isinstance(err, KeyboardInterrupt) else "FAILED")
        raise
    with store_faults(uri):
        monitor.finish()
    client.set_terminated(run.run_id, "FINISHED")


def _alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError):
        return False
    except PermissionError:
        return True
    return True


def _end_dead_parents(client, exp_id: str, name: str) -> None:
    """A killed stage leaves its parent run RUNNING: end it KILLED when its process is gone."""
    found = client.search_runs([exp_id], filter_string=f"attributes.run_name = '{name}' and "
                               "attributes.status = 'RUNNING'")
    for run in found:
        t = run.data.tags
        if t.get("host") == os.uname().nodename and not _alive(t.get("pid", "")):
            client.set_terminated(run.info.run_id, "KILLED")


def _end_orphans(client, exp_id: str) -> None:
    """A run whose stage ended without it (its parent no longer RUNNING) and whose checkpoint cannot name it (a
    garbled ``config.json``) would stay RUNNING for good: end it KILLED. A run that resumes is reopened anyway."""
    running = client.search_runs([exp_id], filter_string="attributes.status = 'RUNNING'", max_results=50000)
    live = {r.info.run_id for r in running if "mlflow.parentRunId" not in r.data.tags}
    for run in running:
        parent = run.data.tags.get("mlflow.parentRunId")
        if parent is not None and parent not in live:
            client.set_terminated(run.info.run_id, "KILLED")


def end_stale_run(run_id: str, uri: str) -> None:
    """Mark a run that can no longer be resumed KILLED (only if it is still RUNNING)."""
    from mlflow.exceptions import MlflowException

    client = _client(uri)
    try:
        if client.get_run(run_id).info.status == "RUNNING":
            client.set_terminated(run_id, "KILLED")
    except MlflowException:
        pass  # the run was deleted or belongs to another store: nothing to end
