"""Lightning pieces: a DataModule over the sliced arrays and one LightningModule for every architecture.

The plain ``nn.Module`` (from :mod:`pipeline.models`) knows nothing of Lightning; :class:`Classifier` only
joins loss, metrics, optimizer and schedule. DeiT students add a distillation head whose target is a frozen
teacher's hard label (DeiT's "hard distillation") or its logits (soft), computed once before training and carried
in the batch beside the label; see :func:`distillation_loss`.
"""

from __future__ import annotations

import json
import logging
import math
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from timm.optim import param_groups_weight_decay
from torch import nn
from torch.utils.data import DataLoader, Sampler, TensorDataset

from pipeline.predict import to_tensor

if TYPE_CHECKING:
    from pipeline.split import Split


class StepBatches(Sampler[list[int]]):
    """Batch ``k`` of a run is a pure function of (seed, k): the ``k % steps_per_epoch``-th slice of the
    permutation drawn for epoch ``k // steps_per_epoch``.

    The whole run is one Lightning epoch of ``total`` batches, and iteration starts at ``start()`` (the
    trainer's global step), so a run resumed from a mid-run checkpoint sees exactly the batches an
    uninterrupted run sees from there on. (A plain dataloader restarts from its first batch on resume.)
    """

    def __init__(self, n: int, batch_size: int, seed: int, total: int, start: Callable[[], int] = lambda: 0):
        if n < batch_size:
            raise ValueError(f"{n} training samples are fewer than one batch of {batch_size}")
        self.n, self.batch_size, self.seed, self.total, self.start = n, batch_size, seed, total, start

    def __len__(self) -> int:
        return self.total

    def __iter__(self):
        per_epoch = self.n // self.batch_size  # the last partial batch of each permutation is dropped
        epoch, perm = -1, None
        for k in range(self.start(), self.total):
            e, j = divmod(k, per_epoch)
            if e != epoch:
                gen = torch.Generator().manual_seed(self.seed * 100_003 + e)
                epoch, perm = e, torch.randperm(self.n, generator=gen)
            yield perm[j * self.batch_size:(j + 1) * self.batch_size].tolist()


class BatchTensors(TensorDataset):
    """A TensorDataset fetched a whole batch at a time: one indexing op per tensor instead of one per sample
    plus a ``torch.stack`` (the DataLoader calls ``__getitems__`` when it exists; pair with :func:`as_batch`)."""

    def __getitems__(self, idx: list[int]) -> tuple[torch.Tensor, ...]:
        index = torch.as_tensor(idx, device=self.tensors[0].device)
        return tuple(t[index] for t in self.tensors)


def as_batch(batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The collate function of :class:`BatchTensors`: the batch is already built."""
    return batch


class ArrayData(L.LightningDataModule):
    """Train on ``train_<n>`` for ``total_steps`` batches, validate on ``val``, test on ``test``.

    A distilled student's training rows carry a third tensor, ``targets`` (the teacher's logits per row), and
    may carry ``labels`` of their own (-1: a transfer image, whose true label the student never sees)."""

    def __init__(self, split: Split, train_key: str, batch_size: int, eval_batch_size: int, seed: int,
                 total_steps: int, labels: np.ndarray | None = None, targets: np.ndarray | None = None):
        super().__init__()
        self.split, self.train_key = split, train_key
        self.batch_size, self.eval_batch_size, self.seed = batch_size, eval_batch_size, seed
        self.total_steps = total_steps
        self.labels, self.targets = labels, targets

    def _dataset(self, key: str) -> BatchTensors:
        idx = self.split.indices[key]
        if key != self.train_key:
            tensors = (to_tensor(self.split.images[idx]), torch.from_numpy(self.split.labels[idx]))
        else:
            labels = self.split.labels[idx] if self.labels is None else self.labels
            extra = () if self.targets is None else (torch.from_numpy(self.targets),)
            tensors = (to_tensor(self.split.images[idx]), torch.from_numpy(labels), *extra)
        # the whole split on the run's device once (a GPU then never waits for a host copy; CPU: no copy)
        device = self.trainer.strategy.root_device if self.trainer is not None else torch.device("cpu")
        return BatchTensors(*(t.to(device) for t in tensors))

    def train_dataloader(self) -> DataLoader:
        data = self._dataset(self.train_key)
        batches = StepBatches(len(data), self.batch_size, self.seed, self.total_steps,
                              start=lambda: self.trainer.global_step)
        return DataLoader(data, batch_sampler=batches, collate_fn=as_batch)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self._dataset("val"), batch_size=self.eval_batch_size, collate_fn=as_batch)


def warmup_cosine(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Learning-rate multiplier: linear warmup over ``warmup`` steps, then cosine to ``min_ratio``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def augment_views(x: torch.Tensor, crop_pad: int, flip: bool, seed: int, step: int) -> torch.Tensor:
    """A batch's training views: each image padded with ``crop_pad`` px of black (in the normalised input space),
    cropped back to size at a random offset, and mirrored left-right with probability 1/2 when ``flip``.

    The draws are a pure function of (seed, step) on the CPU, whatever the device: a resumed run sees the same
    views as an uninterrupted one, and a GPU run the same as a CPU run. Labels are unchanged (the views preserve
    the class: natural images only, never a synthetic task whose factor is position or chirality)."""
    n, c, h, w = x.shape
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    dy, dx = torch.randint(0, 2 * crop_pad + 1, (2, n, 1), generator=gen)
    mirror = torch.rand(n, generator=gen) < 0.5
    if crop_pad:
        black = to_tensor(np.zeros((1, 1, 1, c), np.uint8)).to(x)
        padded = black.expand(n, c, h + 2 * crop_pad, w + 2 * crop_pad).clone()
        padded[:, :, crop_pad:crop_pad + h, crop_pad:crop_pad + w] = x  # copied, not shifted: exact values
        rows = (dy + torch.arange(h)).to(x.device)  # (n, h): the rows each crop keeps
        cols = (dx + torch.arange(w)).to(x.device)
        # advanced indices split by a slice: the result is (n, h, w, c)
        x = padded[torch.arange(n, device=x.device)[:, None, None], :, rows[:, :, None], cols[:, None, :]]
        x = x.permute(0, 3, 1, 2).contiguous()
    if flip:
        x = torch.where(mirror.to(x.device)[:, None, None, None], x.flip(-1), x)
    return x


def distillation_loss(cls_logits: torch.Tensor, dist_logits: torch.Tensor, labels: torch.Tensor,
                      teacher_logits: torch.Tensor, soft: bool = False, tau: float = 1.0,
                      label_smoothing: float = 0.0) -> torch.Tensor:
    """DeiT's loss: mean of the class head's CE on labels and the distillation head's loss on the teacher.

    Hard distillation (DeiT's default): CE against the teacher's argmax. Soft: tau^2 * KL(teacher || student)
    at temperature tau. Both heads weigh 1/2. A label of -1 (a transfer image) trains the distillation head
    only: the class head's CE averages over the labelled rows (zero when a batch has none).
    """
    known = labels >= 0
    base = (F.cross_entropy(cls_logits[known], labels[known], label_smoothing=label_smoothing) if known.any()
            else cls_logits.sum() * 0.0)
    if soft:
        distill = F.kl_div(F.log_softmax(dist_logits / tau, dim=-1), F.log_softmax(teacher_logits / tau, dim=-1),
                           reduction="batchmean", log_target=True) * tau * tau
    else:
        distill = F.cross_entropy(dist_logits, teacher_logits.argmax(dim=-1))
    return 0.5 * base + 0.5 * distill


class Classifier(L.LightningModule):
    """Cross-entropy classification (optionally DeiT distillation) with AdamW and warmup+cosine, on training views
    (:func:`augment_views`) where the task has them."""

    def __init__(self, model: nn.Module, *, lr: float, weight_decay: float, warmup_steps: int, total_steps: int,
                 min_lr_ratio: float = 0.0, label_smoothing: float = 0.0,
                 soft_distillation: bool = False, distillation_tau: float = 1.0,
                 crop_pad: int = 0, flip: bool = False, seed: int = 0):
        super().__init__()
        # Convolution weights in channels-last layout: oneDNN's fast path on CPU (4-5% off a ResNet step inside the
        # study of 492dbde, whose inputs were already channels-last; 15-24% on standard-layout inputs); a model
        # without 4-D weights is unchanged. In place: the caller's model.
        self.model = model.to(memory_format=torch.channels_last)
        # Lightning's own record of the recipe: saved in every checkpoint (the module is not a hyperparameter;
        # the stage process, not the Trainer's logger, writes MLflow params).
        self.save_hyperparameters(ignore=["model"], logger=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.model(x)
        # A distilled ViT in training mode returns (class, distillation) logits; inference averages the heads.
        return (out[0] + out[1]) / 2 if isinstance(out, tuple) else out

    def training_step(self, batch, batch_idx):
        x, y, *targets = batch
        hp = self.hparams
        if hp.crop_pad or hp.flip:  # a distilled student's targets stay its teacher's view of the clean image
            x = augment_views(x, hp.crop_pad, hp.flip, hp.seed, self.global_step)
        out = self.model(x)
        if isinstance(out, tuple):
            if not targets:
                raise RuntimeError("a distilled model needs its teacher's targets in the batch")
            loss = distillation_loss(out[0], out[1], y, targets[0], self.hparams.soft_distillation,
                                     self.hparams.distillation_tau, self.hparams.label_smoothing)
            logits = (out[0] + out[1]) / 2
        else:
            loss = F.cross_entropy(out, y, label_smoothing=self.hparams.label_smoothing)
            logits = out
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite training loss {loss.item()} at step {self.global_step}")
        # Lightning's logging machinery costs ~10% of a small model's step: feed it only on the steps a logger
        # writes (every log_every_n_steps, when there is one) and before a validation (the learning curve).
        if self._before_validation() or (self.trainer.loggers
                                         and (self.global_step + 1) % self.trainer.log_every_n_steps == 0):
            known = y >= 0  # a transfer image has no label to score
            acc = (logits.argmax(-1)[known] == y[known]).float().mean()
            self.log_dict({"train/loss": loss, "train/acc": acc}, on_step=True, on_epoch=False)
        return loss

    def _before_validation(self) -> bool:
        interval = self.trainer.val_check_interval
        return isinstance(interval, int) and (self.global_step + 1) % interval == 0

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log_dict({"val/loss": F.cross_entropy(logits, y), "val/acc": (logits.argmax(-1) == y).float().mean()},
                      on_step=False, on_epoch=True)

    def configure_optimizers(self):
        hp = self.hparams
        # Norms, biases and what the model lists in no_weight_decay() (position embeddings, class/distillation
        # tokens, Swin's relative-position tables) are not decayed: timm's own grouping, the ViT/DeiT recipe.
        skip = self.model.no_weight_decay() if hasattr(self.model, "no_weight_decay") else ()
        groups = param_groups_weight_decay(self.model, hp["weight_decay"], no_weight_decay_list=skip)
        # fused: one kernel for the whole update instead of chains of foreach ops (on the 45k ViT: opt.step 3x
        # faster, ~180 fewer copy_ calls a step); deterministic run after run (tests/test_train.py).
        opt = torch.optim.AdamW(groups, lr=hp["lr"], fused=True)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: warmup_cosine(s, hp["warmup_steps"], hp["total_steps"], hp["min_lr_ratio"]))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def val_point(row: dict) -> dict:
    """A validation row of :class:`Curves` as the MLflow series point it is logged as."""
    return {"step": row["step"], "val/loss": row.get("val_loss"), "val/acc": row.get("val_acc")}


class StepCheckpoint(ModelCheckpoint):
    """``last.ckpt`` every ``every`` optimizer steps, except at a step that validates: there :class:`Curves` saves
    once the validation is done. Saved before it, a checkpoint would hold the step without the validation that
    follows, and a run killed between the two would resume past that validation (its curve point and the stop
    rule's check lost: validation at a restored step does not rerun)."""

    def __init__(self, dirpath: Path, every: int, val_interval: int):
        super().__init__(dirpath=dirpath, filename="last", save_top_k=1, every_n_train_steps=every,
                         enable_version_counter=False)
        self.val_interval = val_interval  # the trainer's: min(val_every, steps) (see :func:`trainer`)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step % self.val_interval:
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)


class Curves(L.Callback):
    """Per-step train loss and learning rate (every ``log_every_steps``) and the validation curve.

    Saved in every checkpoint, so a resumed run's curves are the whole run's curves. ``live``: a file each
    point is also appended to as one JSON line the moment it exists (the stage process streams it to MLflow
    while the run trains; workers never talk to MLflow).
    """

    def __init__(self, name: str, total: int, every: int, ckpt_every: int, ckpt: Path, live: Path | None = None):
        self.name, self.total, self.every, self.ckpt_every, self.ckpt = name, total, every, ckpt_every, ckpt
        self.live = live
        self.rows: list[dict] = []  # at each validation: step, train_loss, val_loss, val_acc, lr
        self.series: list[dict] = []  # every `every` steps: step, train/loss, lr

    def _emit(self, point: dict) -> None:
        if self.live is not None:
            self.live.parent.mkdir(parents=True, exist_ok=True)  # Lightning makes the checkpoint folder lazily
            with open(self.live, "a") as f:
                f.write(json.dumps(point) + "\n")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if step % self.every == 0:
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs
            self.series.append(point := {"step": step, "train/loss": float(loss), "lr": _lr(trainer)})
            self._emit(point)

    def on_validation_end(self, trainer, pl_module):
        m = trainer.callback_metrics
        row = {"step": trainer.global_step, "lr": _lr(trainer),
               **{k.replace("/", "_"): float(m[k]) for k in ("train/loss", "val/loss", "val/acc") if k in m}}
        self.rows.append(row)
        self._emit(val_point(row))
        if row["step"] % self.ckpt_every == 0:
            # the step's checkpoint, which :class:`StepCheckpoint` left for now: with this row and the stop rule's
            # verdict (the last step's too, where a resume trains nothing and only restores)
            trainer.save_checkpoint(self.ckpt)
        print(f"  {self.name}: step {row['step']}/{self.total} val acc {row.get('val_acc', float('nan')):.3f}",
              flush=True)

    @property
    def state_key(self) -> str:
        return "Curves"  # one key for subclasses too, so any checkpoint restores the curves

    def state_dict(self) -> dict:
        return {"rows": self.rows, "series": self.series}

    def load_state_dict(self, state_dict: dict) -> None:
        self.rows, self.series = list(state_dict["rows"]), list(state_dict.get("series", []))


class Criterion(L.Callback):
    """Training to a criterion (``budget_mode: criterion``): stop once the run has learned, or stopped learning.

    Learned: in-distribution validation accuracy >= ``accuracy`` at ``hold`` consecutive validations (one lucky
    validation does not end a run). Plateau: from ``min_steps`` on, stop when the best validation accuracy has
    not risen by ``min_delta`` for ``patience`` validations, but only once that best has left chance, i.e.
    cleared ``chance + plateau_above x (1 - chance)``. A run still near chance trains on to the cap: these tiny
    models leave chance in a sudden transition after a long flat phase (vit_overlap on alignment, lr 5e-4: the
    old rule stopped 3 of 5 seeds near 0.24, the other 2 ended at chance at a 1,000-step cap; run on under a
    2,000-step cap it read 0.56 at step 700 and 0.97 at step 900), so flatness near chance says nothing about
    whether a run will learn. Race (tune trials only): at step ``race`` a run that has not held the criterion
    stops; another trial of its cell held it by then, so this one has lost (pipeline/tune.py). Otherwise the
    trainer's ``max_steps`` (the cap) ends it; the learning-rate schedule always runs to the cap. Lightning's
    ``EarlyStopping`` has a threshold and a patience but no hold count, no start step or floor for its
    patience and no record of which rule fired, which the learnability table reports; so one small callback.
    Its state rides in every checkpoint: a resumed run stops where an uninterrupted one would.
    """

    def __init__(self, accuracy: float, hold: int, patience: int, min_delta: float, min_steps: int,
                 plateau_above: float = 0.0, chance: float = 0.0, race: int | None = None):
        self.accuracy, self.hold, self.patience = accuracy, hold, patience
        self.race = race
        self.min_delta, self.min_steps = min_delta, min_steps
        # the best accuracy the plateau rule needs; plateau_above 0: none (a below-chance run may stop too)
        self.plateau_from = chance + plateau_above * (1 - chance) if plateau_above > 0 else -math.inf
        self.accs: list[float] = []  # validation accuracy at each validation so far
        self.best, self.best_at = -math.inf, 0  # best accuracy and the validation count when it was set
        self.reached_step: int | None = None  # the step at which the criterion was first held
        self.stop_reason = "cap"

    def on_validation_end(self, trainer, pl_module):
        if trainer.sanity_checking or "val/acc" not in trainer.callback_metrics:
            return
        acc = float(trainer.callback_metrics["val/acc"])
        self.accs.append(acc)
        if acc >= self.best + self.min_delta:
            self.best, self.best_at = acc, len(self.accs)
        if len(self.accs) >= self.hold and min(self.accs[-self.hold:]) >= self.accuracy:
            self.reached_step, self.stop_reason = trainer.global_step, "criterion"
        elif (trainer.global_step >= self.min_steps and self.best >= self.plateau_from
              and len(self.accs) - self.best_at >= self.patience):
            self.stop_reason = "plateau"
        elif self.race is not None and trainer.global_step >= self.race:
            self.stop_reason = "race"
        else:
            return
        trainer.should_stop = True

    @property
    def state_key(self) -> str:
        return "Criterion"

    def state_dict(self) -> dict:
        return {"accs": self.accs, "best": self.best, "best_at": self.best_at, "reached_step": self.reached_step,
                "stop_reason": self.stop_reason}

    def load_state_dict(self, state_dict: dict) -> None:
        self.accs = list(state_dict["accs"])
        self.best, self.best_at = float(state_dict["best"]), int(state_dict["best_at"])
        self.reached_step, self.stop_reason = state_dict["reached_step"], state_dict["stop_reason"]


def _lr(trainer) -> float:
    return float(trainer.optimizers[0].param_groups[0]["lr"])


class PhaseTimer(L.Callback):
    """Wall seconds of one ``fit`` by phase (this process only; a resumed run restarts the clock).

    ``steps``: batch start to batch end (forward, backward, clipping, optimizer); ``validation``;
    ``checkpoint``: the gap after a step that saved a checkpoint; ``loop``: the other gaps between steps
    (logging, the data loader, Lightning's loop); ``setup``: the rest of ``fit``. List it before
    :class:`StepCheckpoint` so its batch end runs before the save.
    """

    def __init__(self):
        self.seconds = {"steps": 0.0, "validation": 0.0, "checkpoint": 0.0, "loop": 0.0, "setup": 0.0, "fit": 0.0}
        self.steps = 0
        self._fit = self._batch = self._val = self._end = None
        self._saved, self._val_in_gap = False, 0.0

    def on_fit_start(self, trainer, pl_module):
        self._fit = time.perf_counter()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._batch = time.perf_counter()
        if self._end is not None:
            gap = self._batch - self._end - self._val_in_gap
            self.seconds["checkpoint" if self._saved else "loop"] += gap
        self._saved, self._val_in_gap = False, 0.0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._end = time.perf_counter()
        self.seconds["steps"] += self._end - self._batch
        self.steps += 1

    def on_validation_start(self, trainer, pl_module):
        self._val = time.perf_counter()

    def on_validation_end(self, trainer, pl_module):
        spent = time.perf_counter() - self._val
        self.seconds["validation"] += spent
        self._val_in_gap += spent

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        self._saved = True

    def on_fit_end(self, trainer, pl_module):
        s = self.seconds
        s["fit"] = time.perf_counter() - self._fit
        s["setup"] = s["fit"] - sum(v for k, v in s.items() if k not in ("fit", "setup"))

    @property
    def step_share(self) -> float:
        """Training steps' share of the fit's wall time."""
        return self.seconds["steps"] / self.seconds["fit"] if self.seconds["fit"] else 0.0


def trainer(runtime, grad_clip: float, steps: int, val_every: int, callbacks: list | None = None,
            **overrides) -> L.Trainer:
    """The Lightning Trainer of every fit (runs, fine-tunes, the benchmarks): bounded by optimizer steps,
    deterministic, validating every ``val_every`` steps, no logger (the stage process tracks), quiet; ``overrides``
    replace any of these settings."""
    settings = dict(
        max_steps=steps, accelerator=runtime.accelerator, devices=runtime.devices, strategy=runtime.strategy,
        num_nodes=runtime.num_nodes, precision=runtime.precision, deterministic=True, logger=False,
        callbacks=callbacks, val_check_interval=min(val_every, steps), check_val_every_n_epoch=None,
        log_every_n_steps=runtime.log_every_steps, gradient_clip_val=grad_clip or None,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    return L.Trainer(**{**settings, **overrides})


def training_threads(threads: int) -> None:
    """The torch settings of a process about to train: ``threads`` intra-op threads, and denormal floats flushed
    to zero. Swin's shifted-window mask (-100) leaves softmax weights near e^-100 ~ 4e-44, below float32's
    smallest normal number; x86 computes with such numbers in microcode: a `swin_local_shift` step took 29 ms
    against 17 ms flushed (`swin` 27 against 20; one thread, 16 px). Flushed, they are the exact zeros the mask
    means; nothing a run reports is that small."""
    import torch

    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)


def quiet_lightning() -> None:
    """Keep stage logs to what a reader needs: Lightning's banners and tips say nothing about the run.

    Called where a run fits (a worker process or the stage process); Lightning's import (above) has set its
    loggers to INFO by then."""
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*(LeafSpec|logging interval|does not have many workers).*")
    # Safe here: a run's batches are a function of the global step (pipeline.learner.StepBatches), so a
    # mid-epoch resume with a fresh dataloader continues the exact batch sequence.
    warnings.filterwarnings("ignore", message=".*dataloader is not resumable.*")
    # The checkpoint folder holds the run's identity stamp (config.json) beside last.ckpt by design.
    warnings.filterwarnings("ignore", message=".*Checkpoint directory .* exists and is not empty.*")
    logging.getLogger("lightning.pytorch.utilities.rank_zero").setLevel(logging.WARNING)
