"""A run's network as an MLflow *logged model*, and a teacher's as a registered model version.

Each run's network is the logged model :data:`MODEL_NAME` (the Models tab; ``models:/<model_id>`` or
``runs:/<run_id>/network`` loads it); each teacher is also a version of the registered model
``<prefix>-teacher-<arch>`` with its provenance as version tags and ``<task>-s<seed>`` as alias. Called through
:class:`pipeline.tracking.StageRun` (its ``model`` and ``register_teacher``), with the stage's client: the fluent
``mlflow.pytorch.log_model`` would set the process's tracking URI, re-log every metric of the run to link it, and
load the saved model back to validate the example.
"""

from __future__ import annotations

import logging
import re
import tempfile
from typing import Any

from pipeline.errors import StageError
from pipeline.mlflow_store import store_faults

MODEL_NAME = "network"  # the logged model's name: runs:/<run_id>/network resolves to it
MODEL_TAGS = ("arch", "task", "model", "seed", "data_seed", "train_size", "steps", "identity")  # copied onto it


def alias(task: str) -> str:
    """A registry alias for ``task`` (letters, digits, ``_`` and ``-``; never MLflow's reserved ``v<n>``)."""
    name = re.sub(r"[^\w-]", "_", task) or "task"
    return f"task_{name}" if re.fullmatch(r"v\d+|latest", name) else name


def quietly(fn) -> None:
    """Call ``fn``, ignoring a store fault: used while a stage is already failing with its own error."""
    try:
        with store_faults(""):
            fn()
    except StageError:
        pass


def mlflow_pytorch():
    """``mlflow.pytorch``, imported without its side effects on this process's logging: its Lightning autolog
    module imports ``pytorch_lightning``, which takes over the banner logger every later Trainer prints through
    ("GPU available", "TPU available", a tip, per run), and calls ``logging.basicConfig``, which prints them."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    import mlflow.pytorch

    root.handlers[:] = handlers
    root.setLevel(level)
    for name in ("pytorch_lightning", "lightning.pytorch", "lightning.fabric", "mlflow.pytorch"):
        logging.getLogger(name).setLevel(logging.ERROR if name == "mlflow.pytorch" else logging.WARNING)
    return mlflow.pytorch


def log_model(client, experiment_id: str, run_id: str, model: Any, example: Any, tags: dict[str, str] | None,
              linked: list) -> str:
    """Log a trained torch ``model`` as the run's logged model :data:`MODEL_NAME` (the MLmodel names its model and
    run ids; input example, its inferred signature, the torch and timm versions it needs), with the final
    metrics ``linked`` (``mlflow.entities.Metric``) linked to it; returns its model id. Pickle format: a tenth of
    pt2's export time per run on 2 cores, and the store is the user's own."""
    from mlflow.entities import LoggedModelOutput, Metric
    from mlflow.models import Model

    pytorch = mlflow_pytorch()
    import timm
    import torch

    needs = [f"torch=={torch.__version__.split('+')[0]}", f"timm=={timm.__version__}"]
    logged = client.create_logged_model(experiment_id, MODEL_NAME, run_id, tags=tags)
    try:
        client.log_outputs(run_id, [LoggedModelOutput(logged.model_id, step=0)])
        meta = Model(artifact_path=logged.artifact_location, model_uuid=logged.model_id, run_id=run_id,
                     model_id=logged.model_id)
        with tempfile.TemporaryDirectory(prefix="bias-model-") as tmp:
            pytorch.save_model(model, f"{tmp}/{MODEL_NAME}", mlflow_model=meta, input_example=example,
                               pip_requirements=needs, serialization_format="pickle")
            client.log_model_artifacts(logged.model_id, f"{tmp}/{MODEL_NAME}")
        # the same points (key, step, value, timestamp) again, now naming the model: the store keeps each once
        points = [Metric(m.key, m.value, m.timestamp, m.step, model_id=logged.model_id, run_id=run_id)
                  for m in linked]
        if points:
            client.log_batch(run_id, metrics=points)
    except BaseException:
        quietly(lambda: client.finalize_logged_model(logged.model_id, "FAILED"))
        raise
    client.finalize_logged_model(logged.model_id, "READY")
    return logged.model_id


def logged_model(client, experiment_id: str, run_id: str) -> str | None:
    """The id of the READY logged model :data:`MODEL_NAME` of ``run_id``, if one was logged."""
    from mlflow.entities import LoggedModelStatus

    found = client.search_logged_models(
        [experiment_id], filter_string=f"source_run_id = '{run_id}' AND name = '{MODEL_NAME}'")
    ready = [m.model_id for m in found if m.status == LoggedModelStatus.READY]
    return ready[0] if ready else None


def register_teacher(client, model_id: str, prefix: str, run_id: str, record: dict[str, str],
                     description: str) -> str:
    """Register a teacher run's logged model as a version of ``<prefix>-teacher-<arch>`` (one registered model per
    teacher type), tagged with its provenance ``record`` (pipeline.provenance.teacher_record: run, seed, task,
    training set and data hashes, checkpoint hash, accuracies) and the run's identity, and point the alias
    ``<task>-s<seed>`` at it (one teacher per seed and task). A run registered before keeps its version (a resumed
    record, a rerun). Returns the version."""
    from mlflow.exceptions import MlflowException

    name = f"{prefix}-teacher-{record['arch']}"
    run_tags = client.get_run(run_id).data.tags
    tags = {**{k: run_tags[k] for k in ("data_seed", "identity", "git_commit", "params_sha256", "code_sha256")
               if k in run_tags}, **record}
    found = client.search_model_versions(f"name = '{name}' and run_id = '{run_id}'")
    if found:
        version = found[0].version
    else:
        try:
            client.create_registered_model(name, tags={"teacher.arch": record["arch"]}, description=(
                f"Distillation teachers of type {record['arch']}: one version per trained teacher (task, "
                "seed, training set in its tags); the alias <task>-s<seed> names one."))
        except MlflowException as err:
            if err.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        # the logged model's own artifact location as the source: a models:/ URI would be resolved against the
        # process's global tracking URI, which need not be this client's store (another store: "not found")
        source = client.get_logged_model(model_id).artifact_location
        version = client.create_model_version(
            name, source, run_id=run_id, tags=tags, model_id=model_id, await_creation_for=0,
            description=description or None).version
    where = f"{record.get('task', '')}-s{record.get('seed', '')}"
    client.set_registered_model_alias(name, alias(where), str(version))
    return str(version)
