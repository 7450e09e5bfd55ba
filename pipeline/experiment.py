"""One training run, end to end: data in, Lightning fit with resume, per-slice metrics and MLflow out.

Shared by the ``train`` and ``teacher`` stages. Counts (parameters, images, tokens, steps, FLOPs) and
measurements (wall time, throughput, peak memory) are recorded apart, both in the metrics JSON that DVC
tracks and in the run's MLflow record.
"""

from __future__ import annotations

import hashlib
import json
import re
import resource
import shutil
import time
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from pipeline import budget, tracking
from pipeline.config import Params
from pipeline.distill import WEIGHTS, load_teacher
from pipeline.errors import StageError
from pipeline.io import write_json, write_with
from pipeline.models import param_count

FLOPS_CONVENTION = ("2 FLOPs per multiply-add of matmul/conv ops (torch FlopCounterMode, MATH attention); "
                    "train = 3 x forward")


@dataclass(frozen=True)
class RunSpec:
    """What one run trains, on what, and where it writes."""

    stage: str  # "train" or "teacher": the MLflow experiment
    task: str
    arch: str
    seed: int
    train_size: int
    data_dir: Path  # data/tasks/<task>
    slices_dir: Path  # data/slices/<task>
    out_dir: Path  # metrics.json, predictions.npz (DVC outs)
    ckpt_dir: Path  # Lightning checkpoints (persisted across interruptions)
    teacher_dir: Path | None = None  # a teacher stage output (DeiT students only)
    label: str = ""  # the name results go by when it differs from the model (deit_vit: a deit from a ViT)

    @property
    def model_name(self) -> str:
        return self.label or self.arch

    @property
    def name(self) -> str:
        return f"{self.task}/{self.model_name}/n{self.train_size}/s{self.seed}"


def load_split(spec: RunSpec):
    """Arrays + indices for a task; every missing or inconsistent file is a one-line :class:`StageError`."""
    from pipeline.train import Split

    files = {k: spec.data_dir / f for k, f in
             {"images": "images.npy", "labels": "labels.npy", "meta": "meta.json"}.items()}
    files["indices"] = spec.slices_dir / "indices.npz"
    files["manifest"] = spec.slices_dir / "manifest.json"
    for path in files.values():
        if not path.exists():
            raise StageError(f"{path}: missing (run the data and slice stages: dvc repro)")
    current = files["images"]  # the file being read, named in the error
    try:
        images = np.load(current, allow_pickle=False)
        labels = np.load(current := files["labels"], allow_pickle=False)
        with np.load(current := files["indices"], allow_pickle=False) as z:
            indices = {k: z[k] for k in z.files}
        meta = json.loads((current := files["meta"]).read_text())
        manifest = json.loads((current := files["manifest"]).read_text())
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
        raise StageError(f"{current}: unreadable ({type(err).__name__}: {err})") from None
    if images.ndim != 4 or images.dtype != np.uint8 or len(images) != len(labels):
        raise StageError(f"{files['images']}: expected uint8 (N,H,W,C) matching labels, got "
                         f"{images.dtype} {images.shape} vs {labels.shape}")
    key = f"train_{spec.train_size}"
    if key not in indices:
        sizes = sorted(int(k.removeprefix("train_")) for k in indices if k.startswith("train_"))
        raise StageError(f"{files['indices']}: no training subset of size {spec.train_size} (have {sizes})")
    split = Split(images=images, labels=labels.astype(np.int64), indices=indices,
                  num_classes=int(meta["num_classes"]))
    return split, meta, manifest


# The modules whose code decides what a run computes: part of every run's identity.
_CODE = ("train", "experiment", "models", "budget", "distill")


def code_fingerprint() -> str:
    h = hashlib.sha256()
    for name in _CODE:
        h.update((Path(__file__).parent / f"{name}.py").read_bytes())
    return h.hexdigest()[:16]


def _config_hash(spec: RunSpec, params: Params, extra: dict) -> str:
    """Identity of a run: spec, the params it reads and the training code.

    A checkpoint or finished result made under any other identity is never resumed or reused.
    """
    relevant = params.model_dump(mode="json", include={"geometry", "models", "distill"})
    relevant["recipe"] = params.train.recipe.model_dump(mode="json")
    blob = json.dumps({"spec": {k: str(v) for k, v in asdict(spec).items()}, "params": relevant,
                       "code": code_fingerprint(), **extra}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _finished(spec: RunSpec, config_hash: str) -> dict | None:
    """The metrics of an identical run that already finished (an interrupted stage skips it on rerun)."""
    path = spec.out_dir / "metrics.json"
    if path.exists():
        try:
            metrics = json.loads(path.read_text())
        except json.JSONDecodeError:
            return None
        if metrics.get("config_hash") == config_hash:
            return metrics
    return None


def _readable(ckpt: Path) -> bool:
    """A checkpoint a kill did not cut short (loads with ``weights_only=True``)."""
    import torch

    try:
        return "global_step" in torch.load(ckpt, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError):
        return False


def _prepare_ckpt_dir(ckpt_dir: Path, config_hash: str, params: Params) -> tuple[Path | None, str | None]:
    """Keep a checkpoint (and the MLflow run it belongs to) only if it was made by this exact config.

    A run that was killed before its first checkpoint, or whose config changed, is marked KILLED in MLflow
    instead of being left RUNNING forever.
    """
    stamp = ckpt_dir / "config.json"
    if stamp.exists():
        saved = json.loads(stamp.read_text())
        last = ckpt_dir / "last.ckpt"
        if saved.get("config_hash") == config_hash and _readable(last):
            return last, saved.get("mlflow_run_id")
        if saved.get("mlflow_run_id"):
            tracking.end_stale_run(saved["mlflow_run_id"], tracking.tracking_uri(params))
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    return None, None


def tokens_per_image(model, params: Params) -> int:
    """Image tokens the first layer sees: patches for ViT/DeiT/Swin, pixel positions for the CNN."""
    pe = getattr(model, "patch_embed", None)
    if pe is not None and getattr(pe, "num_patches", None):
        return int(pe.num_patches)
    return params.geometry.image_size ** 2


def peak_rss_mb() -> float:
    """Peak resident memory of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def count_budget(model, params: Params, steps: int, teacher_record: dict | None) -> dict:
    """Counted (not measured) budget of one run; the convention is stated in ``flops_convention``."""
    batch = params.train.recipe.batch_size
    images = steps * batch
    fwd = budget.measured_forward_flops(model, params)
    tokens = tokens_per_image(model, params)
    counts = {
        "params": param_count(model), "optimizer_steps": steps, "batch_size": batch, "images_seen": images,
        "tokens_per_image": tokens, "tokens_seen": images * tokens, "forward_flops_per_image": fwd,
        "train_flops": budget.training_flops(fwd, images),
        # Distillation: the teacher's eval-mode forward on every student image, plus its own training run
        # (charged in full to every student it teaches, not amortised).
        "teacher_forward_flops": budget.teacher_flops(teacher_record["forward_flops_per_image"], images)
        if teacher_record else 0,
        "teacher_train_flops": teacher_record["train_flops"] if teacher_record else 0,
        "flops_convention": FLOPS_CONVENTION,
    }
    counts["total_flops_with_teacher"] = (counts["train_flops"] + counts["teacher_forward_flops"]
                                          + counts["teacher_train_flops"])
    return counts


def optimizer_steps(model, params: Params, num_classes: int) -> int:
    """Steps under the matching mode: the same for every arch, or as many as the reference arch's FLOPs buy."""
    from pipeline.models import build_model

    r = params.train.recipe
    if r.budget_mode == "steps":
        return r.steps
    ref = build_model(r.flops_reference_arch, params, num_classes)
    target = budget.training_flops(budget.measured_forward_flops(ref, params), r.steps * r.batch_size)
    own = budget.train_flops_per_image(budget.measured_forward_flops(model, params))
    return budget.steps_for_flops(target, own, r.batch_size)


def _mlflow_logger(spec: RunSpec, params: Params, run_id: str | None, tags: dict):
    from lightning.pytorch.loggers import MLFlowLogger

    uri = tracking.tracking_uri(params)
    experiment = tracking.experiment_name(params, spec.stage)
    tracking.ensure_experiment(experiment, uri)
    return MLFlowLogger(experiment_name=experiment, tracking_uri=uri, run_name=spec.name, tags=tags,
                        run_id=run_id, log_model=False)


def _metric_key(key: str) -> str:
    return re.sub(r"[^\w./ -]", "_", key)  # MLflow's allowed characters


def run(spec: RunSpec, params: Params, save_weights: bool = False) -> dict:
    """Train (or resume) one run and write ``metrics.json`` + ``predictions.npz``; returns the metrics.

    With ``spec.teacher_dir`` the model is a DeiT student distilled from the verified teacher found there.
    ``save_weights`` also writes the final ``state_dict`` (a teacher's checkpoint for its students).
    """
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    from pipeline.models import build_model
    from pipeline.train import ArrayData, Classifier, History, predict, slice_accuracy

    recipe, rt = params.train.recipe, params.train.runtime
    split, _meta, manifest = load_split(spec)
    L.seed_everything(spec.seed, workers=True, verbose=False)
    torch.set_num_threads(rt.threads)

    teacher, teacher_record = None, None
    if spec.teacher_dir is not None:
        teacher, teacher_record = load_teacher(spec.teacher_dir, spec.task, params, split.num_classes)
    model = build_model(spec.arch, params, split.num_classes)
    if hasattr(model, "set_distilled_training"):
        model.set_distilled_training(teacher is not None)
    steps = optimizer_steps(model, params, split.num_classes)
    counts = count_budget(model, params, steps, teacher_record)

    config_hash = _config_hash(spec, params, {"teacher": (teacher_record or {}).get("checkpoint_sha256")})
    if (done := _finished(spec, config_hash)) is not None:
        print(f"  {spec.name}: already finished with this configuration, kept", flush=True)
        spec.ckpt_dir.mkdir(parents=True, exist_ok=True)  # a declared DVC out: must exist (queued exp copies)
        return done
    resume_from, run_id = _prepare_ckpt_dir(spec.ckpt_dir, config_hash, params)
    tags = {"task": spec.task, "arch": spec.model_name, "model": spec.arch, "seed": str(spec.seed),
            "train_size": str(spec.train_size), "git_commit": tracking.git_commit(),
            "data_sha256": manifest.get("data_sha256", ""), "config_hash": config_hash,
            "train_slice_sha256": manifest.get("sha256", {}).get(f"train_{spec.train_size}", ""),
            **{f"teacher.{k}": str(v) for k, v in (teacher_record or {}).items()}}
    logger = _mlflow_logger(spec, params, run_id, tags)
    write_json(spec.ckpt_dir / "config.json", {"config_hash": config_hash, "mlflow_run_id": logger.run_id})
    if resume_from is None:
        logger.log_hyperparams({
            **tracking.flatten(params.train.model_dump(mode="json"), "train."),
            **tracking.flatten(params.models.model_dump(mode="json"), "models."),
            **tracking.flatten(params.geometry.model_dump(mode="json"), "geometry."),
            "arch": spec.model_name, "model": spec.arch, "task": spec.task, "seed": spec.seed,
            "train_size": spec.train_size, "num_classes": split.num_classes,
            **{f"budget.{k}": v for k, v in counts.items()}})

    module = Classifier(model, lr=recipe.lr, weight_decay=recipe.weight_decay, warmup_steps=recipe.warmup_steps,
                        total_steps=steps, min_lr_ratio=recipe.min_lr_ratio, label_smoothing=recipe.label_smoothing,
                        teacher=teacher, soft_distillation=params.distill.soft, distillation_tau=params.distill.tau)
    start_step = int(torch.load(resume_from, weights_only=True)["global_step"]) if resume_from else 0
    data = ArrayData(split, f"train_{spec.train_size}", recipe.batch_size, rt.eval_batch_size, spec.seed,
                     total_steps=steps)
    ckpt = ModelCheckpoint(dirpath=spec.ckpt_dir, filename="last", save_top_k=1,
                           every_n_train_steps=rt.checkpoint_every_steps, enable_version_counter=False)
    history = History(spec.name, steps)
    trainer = L.Trainer(
        max_steps=steps, accelerator=rt.accelerator, devices=rt.devices, strategy=rt.strategy,
        num_nodes=rt.num_nodes, precision=rt.precision, deterministic=True, logger=logger,
        callbacks=[ckpt, history], val_check_interval=min(rt.val_every_steps, steps),
        check_val_every_n_epoch=None, log_every_n_steps=rt.log_every_steps,
        gradient_clip_val=recipe.grad_clip or None, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    t0 = time.perf_counter()
    trainer.fit(module, datamodule=data, ckpt_path=resume_from)  # a failure marks the MLflow run FAILED
    wall = time.perf_counter() - t0

    client = logger.experiment
    try:
        test_idx = split.indices["test"]
        logits = predict(model, split.images[test_idx], rt.eval_batch_size)
        pred = np.full(len(split.labels), -1, dtype=np.int64)
        pred[test_idx] = logits.argmax(-1)
        slices = slice_accuracy(pred, split.labels, split.indices)
        # Consistency under a one-pixel (cyclic) shift along x: does the prediction survive a translation
        # that moves content across patch boundaries?
        shifted = predict(model, np.roll(split.images[test_idx], 1, axis=2), rt.eval_batch_size)
        shift_consistency = float((shifted.argmax(-1) == logits.argmax(-1)).mean())
        steps_run = trainer.global_step - start_step
        measured = {"wall_time_s": wall, "resumed": resume_from is not None, "steps_this_process": steps_run,
                    "images_per_s": steps_run * recipe.batch_size / wall if wall > 0 else 0.0,
                    "peak_rss_mb": peak_rss_mb()}
        val = trainer.callback_metrics.get("val/acc")
        metrics = {
            "task": spec.task, "arch": spec.model_name, "model": spec.arch, "seed": spec.seed,
            "train_size": spec.train_size, "test_acc": slices["test"]["acc"],
            "val_acc": float(val) if val is not None else None, "shift_consistency": shift_consistency,
            "slices": slices, "curve": history.rows, "budget": counts, "measured": measured,
            "mlflow_run_id": logger.run_id,
            "config_hash": config_hash, "data_sha256": tags["data_sha256"],
            "train_slice_sha256": tags["train_slice_sha256"],
            **({"teacher": teacher_record} if teacher_record else {}),
        }
        final = {"test/acc": slices["test"]["acc"], "test/shift_consistency": shift_consistency,
                 **{f"test/{k}": v["acc"] for k, v in slices.items() if k != "test"},
                 **{f"budget/{k}": v for k, v in counts.items() if isinstance(v, (int, float))},
                 **{f"measured/{k}": float(v) for k, v in measured.items()}}
        for key, value in final.items():
            client.log_metric(logger.run_id, _metric_key(key), float(value))
        if save_weights:
            write_with(spec.out_dir / WEIGHTS, lambda tmp: torch.save(model.state_dict(), tmp))
        write_with(spec.out_dir / "predictions.npz",
                   lambda tmp: np.savez_compressed(tmp.open("wb"), index=test_idx, logits=logits))
        write_json(spec.out_dir / "metrics.json", metrics)  # last: its presence marks the run finished
        client.log_artifact(logger.run_id, str(spec.out_dir / "metrics.json"))
        for f in spec.ckpt_dir.iterdir():  # checkpoints only serve a resume; the result is complete
            f.unlink()
    except BaseException:
        client.set_terminated(logger.run_id, "FAILED")
        raise
    return metrics


def run_pool(specs: list[RunSpec], params: Params, workers: int, save_weights: bool = False) -> list[dict]:
    """Run several seeds side by side, one single-threaded process per core.

    On this 2-core machine two 1-thread processes train 11-77% faster than one 2-thread process
    (docs/design.md §8), and ``dvc repro`` runs stages one at a time, so the parallelism lives here. ``fork``
    pays the torch/Lightning import once per stage instead of once per run.
    """
    import multiprocessing

    if workers <= 1 or len(specs) <= 1:
        return [run(s, params, save_weights) for s in specs]
    with multiprocessing.get_context("fork").Pool(min(workers, len(specs))) as pool:
        return pool.starmap(run, [(s, params, save_weights) for s in specs])


def prune(root: Path, keep: list[Path]) -> None:
    """Delete run folders under ``root`` that the current grid no longer has (persisted outputs stay clean)."""
    if not root.exists():
        return
    keep_set = {k.resolve() for k in keep}
    for metrics in root.rglob("metrics.json"):
        folder = metrics.parent.resolve()
        if folder not in keep_set:
            shutil.rmtree(folder)
