"""Provenance: what data, code and params decided a run, and the teacher record every student verifies.

A distilled student inherits bias through its teacher's signal, so each student records exactly which
teacher stood behind it (MLflow run id and artifact, checkpoint sha256, its own training set, data hashes, accuracy,
disagreement with the true labels on the students' images) and refuses to train when the weights on disk are
not the ones recorded.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import pickle
from pathlib import Path

import numpy as np

from pipeline.archs import ARCHS
from pipeline.errors import StageError
from pipeline.families import source
from pipeline.grid import at_main_budget, training_views
from pipeline.io import index_sha256, read_json, sha256_file
from pipeline.models import build_model
from pipeline.schemas import TEACHER_PROVENANCE

WEIGHTS = "weights.pt"  # every run's final state_dict; a teacher's is what its students load
PROVENANCE = "provenance.json"
# The shared modules every run executes and whose code decides its numbers (the train stages' DVC deps list them).
# Not here: registries that only list families (families/__init__.py), scheduling, tracking and reporting code.
# A run's identity adds only its own family's module and the behaviour of its own rows of the table.
CODE = ("learner", "predict", "experiment", "split", "grid", "models", "meta_device", "budget", "provenance",
        "subgroups", "resolution", "families/common", "evaluation")
# Top-level constants that schedule, draw or test a module's code but never change what a run computes (a family's
# relative step cost, its plot colour, its expected token rule): refreshing one retrains nothing.
OUT_OF_IDENTITY = frozenset({"STEP_COST", "PLOT_COLOUR", "EXPECTED_TOKENS"})
# The fields of a table row that decide what its runs build (its description and partner only label it).
ROW_FIELDS = ("section", "family", "options", "width_of")


class _Behaviour(ast.NodeTransformer):
    """Drops what a module's text says without computing it: string statements (docstrings) everywhere and the
    top-level assignments to :data:`OUT_OF_IDENTITY` names."""

    def generic_visit(self, node):
        super().generic_visit(node)
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
            kept = [s for s in body if not _says_only(s, top=isinstance(node, ast.Module))]
            node.body = kept or [ast.Pass()]
        return node


def _says_only(stmt: ast.stmt, top: bool) -> bool:
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
        return True
    if not top:
        return False
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
    return bool(targets) and all(isinstance(t, ast.Name) and t.id in OUT_OF_IDENTITY for t in targets)


@functools.cache  # keyed by the text itself: an edited file is parsed again
def behaviour(source: str) -> str:
    """What of a module's source decides what it computes: its syntax tree without comments, layout, docstrings
    or :data:`OUT_OF_IDENTITY` constants, written back as canonical source (``ast.unparse``). Moving code between
    modules may change it; a comment, docstring or blank line may not."""
    return ast.unparse(_Behaviour().visit(ast.parse(source)))


def row_behaviour(arch: str) -> str:
    """The fields of ``arch``'s table row that decide what its runs build (:data:`ROW_FIELDS`)."""
    return repr({f: getattr(ARCHS[arch], f) for f in ROW_FIELDS})


def code_parts(archs, root: Path | None = None) -> dict[str, str]:
    """What the code identity of a run building ``archs`` hashes: the behaviour (:func:`behaviour`) of the shared
    modules and of each family module of ``archs``, and each one's table row (with the row whose width it
    reuses). ``root``: read the modules from this copy of the package instead (what an edit would change)."""
    here = Path(__file__).parent
    root = root or here
    parts = {f"{name}.py": behaviour((root / f"{name}.py").read_text()) for name in CODE}
    for arch in archs:
        rel = source(arch).relative_to(here).as_posix()
        parts[rel] = behaviour((root / rel).read_text())
        for name in dict.fromkeys([arch, ARCHS[arch].width_of or arch]):
            parts[f"archs:{name}"] = row_behaviour(name)
    return parts


def code_sha256(archs, root: Path | None = None) -> str:
    """The code identity of a run that builds ``archs`` (its model; in ``flops`` mode also the reference arch):
    adding an architecture or a family, or editing one family's module, changes no other family's runs; an
    edit that changes no syntax (comments, docstrings, layout) changes no run's."""
    return _code_sha256(tuple(archs), root)


@functools.cache
def _code_sha256(archs: tuple[str, ...], root: Path | None) -> str:
    # once per process and arch set: a stage asks for every run's identity, tags and record (the files do not
    # change while it runs; a test that edits a copy passes that copy's root)
    parts = code_parts(archs, root)
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def run_archs(params, spec) -> list[str]:
    """The architectures a run builds or whose cost decides its steps (``flops`` mode: the reference too)."""
    archs = [spec.model]
    if spec.key.budget_mode == "flops":
        archs.append(params.train.recipe.flops_reference_arch)
    return archs


# Where runs execute, not what they compute: results through the Dask pool equal the in-process ones
# (tests/test_executor.py), so these stay out of a run's identity.
PLACEMENT = {"workers", "scheduler"}


def run_params(params, spec) -> dict:
    """The params one run reads (logged to MLflow, hashed into ``params_sha256`` and its identity): the geometry,
    the shared model settings and the models sections it builds (its own; in ``flops`` mode also the reference
    arch's), the recipe, the runtime minus :data:`PLACEMENT`, and (main-grid runs) the evaluation settings.
    Editing ``models.swin`` changes no ViT run."""
    sections = {ARCHS[spec.model].section}
    if spec.key.budget_mode == "flops":
        sections.add(ARCHS[params.train.recipe.flops_reference_arch].section)
    runtime = set(type(params.train.runtime).model_fields) - PLACEMENT
    out = params.model_dump(mode="json", include={
        "geometry": True, "models": {"param_target", "param_tolerance", "reference_classes", *sections},
        "train": {"recipe": True, "runtime": runtime}})
    if params.train.draw == "per_seed" and spec.kind != "teacher":  # its own draw, from the pool less the teachers'
        d = params.distill
        taught = any(spec.key.task in d.teacher_tasks(t) for t in d.teachers)
        out["draw"] = {"mode": "per_seed", "teacher_set": [d.teacher_size, params.train.size] if taught else None}
    if views := training_views(spec, params):  # the task's training views (tasks.natural.augment)
        out["views"] = views
    if spec.lr is not None:  # the cell's tuned learning rate (a trial's own) replaces the recipe's
        out["train"]["recipe"]["lr"] = spec.lr
    if at_main_budget(spec, params):  # only main-grid runs get the subgroup and resolution evaluations
        out["evaluation"] = params.model_dump(mode="json", include={"evaluation"})["evaluation"]
    if spec.key.budget_mode == "criterion":  # the stop rule decides how long it trains
        out["train"]["criterion"] = params.model_dump(mode="json", include={"train": {"criterion"}})["train"][
            "criterion"]
    if spec.teacher is not None:
        out["distill"] = params.model_dump(mode="json", include={"distill": {"soft", "tau"}})["distill"]
        student = params.distill.students[spec.key.arch]
        out["distill"]["student"] = student.model_dump(mode="json")
        if student.targets == "relabel":  # the relabel draw is seeded by the global seed
            out["seed"] = params.seed
    if spec.kind == "teacher":
        out["distill"] = params.model_dump(mode="json", include={"distill": {"teacher_size", "teacher_train"}})[
            "distill"]
    return out


def params_sha256(read: dict) -> str:
    return hashlib.sha256(json.dumps(read, sort_keys=True).encode()).hexdigest()


def pool_sha256(manifest: dict) -> str:
    """The hash of the image pool the slices were cut from (recorded by the slice stage)."""
    try:
        return manifest["source"]["images_sha256"]
    except (KeyError, TypeError):
        raise StageError("manifest.json: no source.images_sha256 (rerun the slice stage)") from None


def data_provenance(manifest: dict, train_idx: np.ndarray) -> dict:
    """The pool's image hash and the hash of the exact training indices this run used."""
    return {"data_sha256": pool_sha256(manifest), "train_slice_sha256": index_sha256(train_idx)}


def teacher_record(metrics: dict, weights: Path, run_id: str, artifact_uri: str, teacher_set: str) -> dict:
    """The record a teacher run leaves for its students (flat, so it maps onto MLflow tags)."""
    b = metrics["budget"]
    return {
        "arch": metrics["arch"], "model": metrics["model"], "task": metrics["task"], "seed": metrics["seed"],
        "train_size": metrics["train_size"], "teacher_set": teacher_set, "mlflow_run_id": run_id,
        # teachers of different types are not tuned to equal accuracy: the ledger prints their mismatch instead
        "accuracy_matching": "none: the mismatch on the students' images is reported beside every comparison",
        "artifact_uri": artifact_uri, "checkpoint": weights.name, "checkpoint_sha256": sha256_file(weights),
        "data_sha256": metrics["provenance"]["data_sha256"],
        "train_slice_sha256": metrics["provenance"]["train_slice_sha256"],
        "test_acc": metrics["test_acc"], "student_train_acc": metrics["student_train"]["acc"],
        "student_train_disagreement": metrics["student_train"]["disagreement"],
        **({"transfer_acc": metrics["transfer"]["acc"], "transfer_disagreement": metrics["transfer"]["disagreement"]}
           if "transfer" in metrics else {}),
        "params": b["params"],
        "forward_flops_per_image": b["forward_flops_per_image"], "train_flops": b["train_flops"],
        "wall_time_s": metrics["measured"]["wall_time_s"],
    }


def read_teacher(teacher_dir: Path, task: str) -> tuple[dict, Path]:
    """``(provenance record, weights path)`` of the teacher for ``task``; a one-line error if unreadable."""
    folder = teacher_dir / task
    record_path, weights = folder / PROVENANCE, folder / WEIGHTS
    for path in (record_path, weights):
        if not path.exists():
            raise StageError(f"{path}: teacher file missing (run the teacher stage: dvc repro)")
    return read_json(record_path, TEACHER_PROVENANCE), weights


# torch's own advice on a blocked pickle is to turn the protection off; ours is to drop the file.
UNSAFE = ("holds pickled objects beyond tensors, which torch refuses to load (weights_only=True); treat it as "
          "unsafe: delete it and {rerun}; never load it with weights_only=False")


def load_state(path: Path, model: str, rerun: str) -> dict:
    """The tensors of a checkpoint file loaded with ``weights_only=True``; any unreadable file is one line naming it,
    and a file torch refuses to unpickle is called unsafe (delete and regenerate it, never lift the protection)."""
    import torch  # heavy: the provenance records and hashes need no torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if "unsupported global" in str(err).lower():  # a pickle that names code to run: blocked, and called unsafe
            raise StageError(f"{path}: {UNSAFE.format(rerun=rerun)}") from None
        raise StageError(f"{path}: not a {model} checkpoint (unreadable as a weights-only torch file); "
                         f"{rerun}") from None
    except (RuntimeError, ValueError, EOFError, OSError, KeyError, AttributeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise StageError(f"{path}: not a {model} checkpoint ({type(err).__name__}: {first[:120]}); "
                         f"{rerun}") from None


def load_teacher(teacher_dir: Path, task: str, params, num_classes: int):
    """Build the teacher recorded in ``<teacher_dir>/<task>/provenance.json`` and verify its weights.

    Returns ``(model in eval mode with frozen weights, provenance record)``. Raises :class:`StageError`
    when the record or weights are missing or the weights' sha256 differs from the recorded one.
    """

    record, weights = read_teacher(teacher_dir, task)
    expected, actual = record["checkpoint_sha256"], sha256_file(weights)
    if actual != expected:
        raise StageError(f"{weights}: sha256 {actual[:12]}... does not match the recorded teacher "
                         f"checkpoint {expected[:12]}... in {teacher_dir / task / PROVENANCE}; refusing to distill")
    model = build_model(record["model"], params, num_classes)
    state = load_state(weights, record["model"], "rerun the teacher stage (dvc repro)")
    try:
        model.load_state_dict(state)
    except (RuntimeError, KeyError) as err:  # tensors of another model
        raise StageError(f"{weights}: not a {record['model']} checkpoint ({type(err).__name__}); "
                         f"rerun the teacher stage") from None
    return model.eval().requires_grad_(False), record
