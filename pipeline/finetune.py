"""Fine-tuning at another resolution: the ViT paper's practice, beside evaluation only at that size.

A ViT is usually trained at one resolution and fine-tuned briefly at a higher one, its position embedding
resampled to the new token grid (Dosovitskiy et al. 2021, section 3.2). The resolution sweep
(:mod:`pipeline.resolution`) asks what the mapped model does with no training at the new size; this asks what
a short fine-tuning there recovers, per position code. Each main-grid run of a ``finetune.tasks`` task is
rebuilt from its ``weights.pt``, mapped to ``finetune.size`` by the position contract (the same
:func:`pipeline.resolution.at_resolution`), scored on the test split resized to that size, fine-tuned
``finetune.steps`` steps on its own training images at that size (AdamW, warm-up and cosine, the recipe's
weight decay, label smoothing, gradient clip and the task's views), and scored again. A family whose token
mixing is tied to the training grid (MLP-Mixer) has no mapping and is listed as skipped.

:func:`fine_tune` is one run (a worker's job, deterministic); the stage's page is :mod:`pipeline.report.finetune`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.config import Params
from pipeline.errors import ConfigError, StageError
from pipeline.grid import Folders, RunSpec, at_main_budget, specs_for, train_keys, training_views
from pipeline.io import read_json, sha256_file
from pipeline.predict import predict
from pipeline.resolution import at_resolution, native_for, position_kind, resize_images
from pipeline.schemas import FINETUNE_RESULT
from pipeline.split import Split, load_split, training_indices
from pipeline.trained import read_model

RESULT = "metrics.json"


@dataclass(frozen=True)
class Job:
    """One fine-tuning (picklable): the trained run, the params, where its result goes and its identity."""

    spec: RunSpec
    params: Params
    out_dir: Path
    identity: str


def specs(params: Params, at: Folders) -> list[RunSpec]:
    """The trained main-grid runs of every ``finetune.tasks`` task (not the grids' other budgets or students)."""
    tasks = set(params.finetune.tasks)
    runs = [s for arch in params.train.archs for s in specs_for("train", train_keys(params, arch), at)]
    return [s for s in runs if s.key.task in tasks and at_main_budget(s, params)]


def identity(spec: RunSpec, params: Params) -> str:
    """What a finished result must match to be kept: the trained weights' bytes and the fine-tuning settings."""
    weights = sha256_file(spec.out_dir / "weights.pt")
    settings = {"finetune": params.finetune.model_dump(), "recipe": params.train.recipe.model_dump(),
                "resize": params.evaluation.resolution.model_dump(), "runtime": params.train.runtime.precision}
    return hashlib.sha256(json.dumps([weights, settings], sort_keys=True).encode()).hexdigest()[:16]


def jobs(params: Params, at: Folders, out: Path) -> list[Job]:
    """A :class:`Job` per run of :func:`specs`; a run without weights is a one-line error naming the file."""
    out_jobs = []
    for s in specs(params, at):
        if not (s.out_dir / "weights.pt").exists():
            raise StageError(f"{s.out_dir / 'weights.pt'}: missing (run the train stage: dvc repro)")
        task_params = params.for_task(s.key.task)  # its task's canvas: finetune.size in its px
        out_jobs.append(Job(s, task_params, out / s.key.arch / s.key.folder, identity(s, task_params)))
    return out_jobs


def finished(job: Job) -> dict | None:
    """The job's result if it was written for this identity (an interrupted stage resumes at the next run)."""
    path = job.out_dir / RESULT
    if not path.exists():
        return None
    try:
        rec = read_json(path, FINETUNE_RESULT)
    except StageError:  # a half-written or foreign file: fine-tune that run again
        return None
    return rec if rec["identity"] == job.identity else None


def _accuracy(model, images: np.ndarray, labels: np.ndarray, batch_size: int) -> float:
    return float((predict(model, images, batch_size).argmax(1) == labels).mean())


def _resized_split(spec: RunSpec, params: Params, size: int):
    """The run's own training rows and the validation rows, from the images it trained on, and the test rows from
    their native images (as the resolution sweep reads them; CIFAR-10 keeps its 32 px for test rows only), each
    resized to ``size``."""
    split, _ = load_split(spec)
    rows = {"fit": training_indices(spec, split, params), "val": split.indices["val"], "test": split.indices["test"]}
    method = params.evaluation.resolution.image_resize
    test = native_for(spec.key.task, spec.data_dir, rows["test"], split.images[rows["test"]])
    parts = {k: resize_images(test if k == "test" else split.images[idx], size, method) for k, idx in rows.items()}
    starts = np.cumsum([0, *(len(v) for v in parts.values())])
    indices = {k: np.arange(a, b) for k, a, b in zip(parts, starts[:-1], starts[1:], strict=True)}
    labels = np.concatenate([split.labels[idx] for idx in rows.values()])
    return Split(np.concatenate(list(parts.values())), labels, indices, split.num_classes), split.images.shape[1]


def fine_tune(job: Job) -> dict:
    """Map, score, fine-tune and score one trained run at ``finetune.size`` (``skipped`` where no mapping
    exists). Deterministic: the batches and views are functions of the run's seed and step."""
    import lightning as L

    from pipeline import learner
    learner.quiet_lightning()
    spec, params, ft = job.spec, job.params, job.params.finetune
    r, rt = params.train.recipe, params.train.runtime
    L.seed_everything(spec.key.seed, workers=True, verbose=False)
    learner.training_threads(rt.threads)
    big, trained_px = _resized_split(spec, params, ft.size)
    trained = read_model(spec.out_dir, spec.model, params, big.num_classes)
    base = {"identity": job.identity, "arch": spec.key.arch, "task": spec.key.task, "seed": spec.key.seed,
            "run": spec.name, "position": position_kind(trained), "size": ft.size,
            "trained_size": params.geometry.image_size, "steps": ft.steps}
    try:
        model = at_resolution(trained, spec.key.arch, params, ft.size)
    except ConfigError:  # a token grid tied to its training size (MLP-Mixer): nothing to map
        return {**base, "skipped": f"a fixed token grid (position kind {base['position']}): no mapping to another size"}
    test = big.indices["test"]
    eval_only = _accuracy(model.eval(), big.images[test], big.labels[test], rt.eval_batch_size)
    views = training_views(spec, params)
    pad = round(views.get("crop_pad", 0) * ft.size / trained_px)  # the same share of the image as in training
    module = learner.Classifier(model.train(), lr=ft.lr, weight_decay=r.weight_decay, warmup_steps=ft.warmup_steps,
                        total_steps=ft.steps, min_lr_ratio=0.0, label_smoothing=r.label_smoothing, crop_pad=pad,
                        flip=views.get("flip", False), seed=spec.key.seed)
    trainer = learner.trainer(rt, r.grad_clip, ft.steps, ft.steps, enable_checkpointing=False)
    data = learner.ArrayData(big, "fit", ft.batch_size, rt.eval_batch_size, spec.key.seed, total_steps=ft.steps)
    trainer.fit(module, datamodule=data)
    tuned = _accuracy(model.cpu().eval(), big.images[test], big.labels[test], rt.eval_batch_size)
    val = trainer.callback_metrics.get("val/acc")
    return {**base, "eval_only_acc": eval_only, "finetuned_acc": tuned, "n": int(len(test)),
            "val_acc": float(val) if val is not None else None, "views": {"crop_pad": pad, **(
                {"flip": views["flip"]} if "flip" in views else {})}}
