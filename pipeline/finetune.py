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

:func:`fine_tune` is one run (a worker's job, deterministic); :func:`table` and :func:`markdown` are pure.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.config import Params
from pipeline.errors import ConfigError, StageError
from pipeline.grid import Folders, RunSpec, at_main_budget, specs_for, train_keys, training_views
from pipeline.io import read_json, sha256_file
from pipeline.predict import predict
from pipeline.report.sources import read_model
from pipeline.report.stats import seed_interval
from pipeline.resolution import at_resolution, native_for, position_kind, resize_images
from pipeline.schemas import FINETUNE_RESULT
from pipeline.split import Split, load_split, training_indices

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
        out_jobs.append(Job(s, params, out / s.key.arch / s.key.folder, identity(s, params)))
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


# --------------------------------------------------------------------------- tables (pure)
def table(results: list[dict], trained_acc: dict[str, float], level: float) -> pd.DataFrame:
    """Per (task, arch): seeds, position code, test accuracy at the training size (``trained_acc``: run name ->
    its recorded test accuracy), evaluation only at ``size`` and after fine-tuning there, with Student-t
    intervals over seeds, and the fine-tuning gain over evaluation only."""
    cols = ["task", "arch", "position", "seeds", "size", "trained", "trained_lo", "trained_hi", "eval_only",
            "eval_only_lo", "eval_only_hi", "finetuned", "finetuned_lo", "finetuned_hi", "gain", "gain_lo",
            "gain_hi", "skipped"]
    rows = []
    frame = pd.DataFrame(results)
    if frame.empty:
        return pd.DataFrame(columns=cols)
    for (task, arch), g in frame.groupby(["task", "arch"], sort=True):
        row = {"task": task, "arch": arch, "position": g.position.iloc[0], "seeds": len(g), "size": g["size"].iloc[0]}
        if "skipped" in g and g.skipped.notna().all():
            rows.append({**row, "skipped": g.skipped.iloc[0]})
            continue
        per_seed = {"trained": g.run.map(trained_acc).to_numpy(float), "eval_only": g.eval_only_acc.to_numpy(float),
                    "finetuned": g.finetuned_acc.to_numpy(float)}
        per_seed["gain"] = per_seed["finetuned"] - per_seed["eval_only"]
        for name, values in per_seed.items():  # accuracies stay in [0, 1], the gain (a difference) in [-1, 1]
            b = seed_interval(values, level, bounds=(-1.0, 1.0) if name == "gain" else (0.0, 1.0))
            row |= {name: b["estimate"], f"{name}_lo": b["ci_lo"], f"{name}_hi": b["ci_hi"]}
        rows.append(row)
    return pd.DataFrame(rows, columns=cols)


def markdown(tab: pd.DataFrame, params: Params) -> str:
    """The stage's page: what was done, then one row per (task, arch)."""
    ft, level = params.finetune, params.report.confidence
    head = "# Fine-tuning at another resolution\n\n"
    if not ft.tasks:
        return head + ("Off in this profile (`finetune.tasks` is empty). `params-natural.yaml` trains CIFAR-10 at "
                       "32 px and fine-tunes at 48 px; any task can be listed.\n")

    def cell(r, name: str) -> str:
        if pd.isna(r[name]):
            return "-"
        ci = "" if pd.isna(r[f"{name}_lo"]) else f" [{r[f'{name}_lo']:.3f}, {r[f'{name}_hi']:.3f}]"
        return f"{r[name]:+.3f}{ci}" if name == "gain" else f"{r[name]:.3f}{ci}"

    view = pd.DataFrame([{"task": r.task, "arch": r.arch, "position": r.position, "seeds": r.seeds,
                          f"test acc at {params.geometry.image_size} px": cell(r, "trained"),
                          f"at {ft.size} px, evaluated only": cell(r, "eval_only"),
                          f"at {ft.size} px, fine-tuned": cell(r, "finetuned"),
                          "gain from fine-tuning": cell(r, "gain") if pd.isna(r.skipped) else f"skipped: {r.skipped}"}
                         for _, r in tab.iterrows()])
    text = (f"Every main-grid run of {', '.join(ft.tasks)} (trained at {params.geometry.image_size} px) mapped to "
            f"{ft.size} px by the position contract (`pipeline/resolution.py`), scored on the test split resized "
            f"to {ft.size} px ({params.evaluation.resolution.image_resize}), then fine-tuned {ft.steps} steps there "
            f"on its own training images (batch {ft.batch_size}, AdamW lr {ft.lr:g} after {ft.warmup_steps} "
            f"warm-up steps, cosine to 0; the recipe's weight decay, label smoothing and gradient clip; the task's "
            f"views, if any, scaled to the size) and scored again. Seed means with {level:.0%} Student-t "
            "intervals over seeds; the gain is fine-tuned minus evaluated only, per seed.\n\n")
    return head + text + (view.to_markdown(index=False, disable_numparse=True) if not view.empty else "_no run_") + "\n"
