"""Timed training steps: Lightning against a plain PyTorch loop on the same work, and what to compare them with.

Step by step in alternation (:class:`Interleaved`), so a slow spell of a shared machine slows both sides alike; an
A/A control (:func:`aa_control`) shows the harness's own bias; Lightning's loop alone on a linear model
(:func:`loop_floor`); this machine's matmul rate for the achieved FLOP/s; and the bootstrap interval of the
total-time ratio (:func:`ratio_interval`), whose verdict the report gives.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from pipeline import budget, learner
from pipeline.config import Params
from pipeline.learner import BatchTensors, Classifier, as_batch
from pipeline.models import build_model


def _module(model: torch.nn.Module, params: Params, steps: int) -> Classifier:
    r = params.train.recipe
    return Classifier(model, lr=r.lr, weight_decay=r.weight_decay, warmup_steps=min(r.warmup_steps, steps - 1),
                      total_steps=steps, min_lr_ratio=r.min_lr_ratio, label_smoothing=r.label_smoothing)


class PlainStep:
    """A hand-written training step of a copy of the model: its next batch from its own loader, then the same
    optimizer, schedule, clipping and loss as :class:`~pipeline.learner.Classifier` under the Trainer."""

    def __init__(self, model: torch.nn.Module, loader: DataLoader, params: Params, steps: int):
        self.model, self.recipe, self.batches = model, params.train.recipe, iter(loader)
        conf = _module(model, params, steps).configure_optimizers()
        self.opt, self.sched = conf["optimizer"], conf["lr_scheduler"]["scheduler"]
        model.train()

    def __call__(self) -> None:
        x, y = next(self.batches)
        self.opt.zero_grad(set_to_none=True)
        F.cross_entropy(self.model(x), y, label_smoothing=self.recipe.label_smoothing).backward()
        if self.recipe.grad_clip:  # over the optimizer's parameters in its groups' order, as Lightning clips
            torch.nn.utils.clip_grad_norm_([q for g in self.opt.param_groups for q in g["params"]],
                                           self.recipe.grad_clip)
        self.opt.step()
        self.sched.step()


class Interleaved(L.Callback):
    """After every Lightning step, one :class:`PlainStep` (the same batch, from its own pass over the loader): the
    two are timed in alternation, milliseconds apart, so a slow spell of a shared machine slows both sides of a
    pair alike.

    Lightning step ``k``: from batch ``k``'s start to batch ``k + 1``'s (its whole loop: data, hooks, closure,
    optimizer), minus the plain step run in between. The first ``skip`` steps are warm-up.
    """

    def __init__(self, plain: PlainStep, skip: int):
        self.plain_step, self.skip = plain, skip
        self.lightning: list[float] = []
        self.plain: list[float] = []
        self._start, self._inside = None, 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        now = time.perf_counter()
        if self._start is not None and batch_idx > self.skip:
            self.lightning.append(now - self._start - self._inside)
        self._start = now

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        t = time.perf_counter()
        self.plain_step()
        self._inside = time.perf_counter() - t
        if batch_idx >= self.skip:
            self.plain.append(self._inside)


def interleaved_steps(model: torch.nn.Module, loader: DataLoader, params: Params, steps: int,
                      skip: int) -> tuple[list[float], list[float], bool]:
    """Per-step seconds (Lightning, plain) of two copies of ``model`` trained side by side on the same batches
    (each fetched from its own pass over ``loader``), and whether they end with bit-identical weights (the same
    computation both ways); the Trainer is ``pipeline.learner.trainer`` minus its checkpoints and validation."""
    rt, r = params.train.runtime, params.train.recipe
    harness = Interleaved(PlainStep(copy.deepcopy(model), loader, params, steps), skip)
    trainer = learner.trainer(rt, r.grad_clip, steps, steps, [harness], accelerator="cpu", devices=1,
                              enable_checkpointing=False, limit_val_batches=0)
    module = _module(copy.deepcopy(model), params, steps)
    trainer.fit(module, train_dataloaders=loader)
    n = len(harness.lightning)  # the last step has no next start
    return harness.lightning, harness.plain[:n], _same_weights(module.model, harness.plain_step.model)


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    x, y = a.state_dict(), b.state_dict()
    return all(torch.equal(x[k], y[k]) for k in x)


def plain_pairs(model: torch.nn.Module, loader: DataLoader, params: Params, steps: int,
                skip: int) -> tuple[list[float], list[float], bool]:
    """The A/A control of :func:`interleaved_steps`: two plain copies alternating step by step in a plain loop.
    Their ratio should be 1 within its interval; a harness that favoured the first or the second of a pair would
    show here."""
    a, b = (PlainStep(copy.deepcopy(model), loader, params, steps) for _ in range(2))
    first, second = [], []
    for k in range(steps):
        t0 = time.perf_counter()
        a()
        t1 = time.perf_counter()
        b()
        if k >= skip:
            first.append(t1 - t0)
            second.append(time.perf_counter() - t1)
    return first, second, _same_weights(a.model, b.model)


def matmul_flops_per_s(n: int = 512, repeats: int = 20) -> float:
    """This machine's fp32 matmul rate on one thread: 2 n^3 FLOPs per (n x n) @ (n x n), best of ``repeats``."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


# consecutive steps per bootstrap block (neighbours share a machine's slow spells), and the fewest blocks an
# interval is given for
BLOCK, MIN_BLOCKS = 20, 5


@dataclass
class StepResult:
    """Per-step times of one model both ways, in ``fits`` separate fits, paired step by step."""

    arch: str
    fits: list[tuple[list[float], list[float]]]  # per fit: (s per step one way, s per step the other way)
    train_flops_per_step: int
    identical: bool  # in every fit both copies ended with bit-identical weights
    block: int = BLOCK

    @property
    def lightning_s(self) -> float:
        """Mean s per step, the first way (Lightning)."""
        return sum(sum(a) for a, _ in self.fits) / sum(len(a) for a, _ in self.fits)

    @property
    def plain_s(self) -> float:
        return sum(sum(b) for _, b in self.fits) / sum(len(b) for _, b in self.fits)

    @property
    def ratio(self) -> float:
        """Total time the first way over total time the other: what the training loop costs, not a typical step."""
        return self.lightning_s / self.plain_s

    @property
    def interval(self) -> tuple[float, float] | None:
        """95% interval of :attr:`ratio` (:func:`ratio_interval`); None with fewer than MIN_BLOCKS blocks."""
        return ratio_interval(self.fits, self.block)


def ratio_interval(fits: list[tuple[list[float], list[float]]], block: int, level: float = 0.95,
                   replicates: int = 2000, seed: int = 0) -> tuple[float, float] | None:
    """Two-level bootstrap of sum(first) / sum(second): fits drawn with replacement, then blocks of ``block``
    consecutive paired steps within each drawn fit (percentile interval, seeded). The blocks keep the
    step-to-step correlation of a machine's slow spells; the fits carry the variation from one fit to the next.
    """
    per_fit = [np.array([(sum(a[i:i + block]), sum(b[i:i + block])) for i in range(0, len(a) - block + 1, block)])
               for a, b in fits]
    per_fit = [f for f in per_fit if len(f)]
    if sum(len(f) for f in per_fit) < MIN_BLOCKS:
        return None
    rng = np.random.default_rng(seed)
    ratios = np.empty(replicates)
    for r in range(replicates):
        total = np.zeros(2)
        for f in rng.integers(0, len(per_fit), len(per_fit)):
            total += per_fit[f][rng.integers(0, len(per_fit[f]), len(per_fit[f]))].sum(axis=0)
        ratios[r] = total[0] / total[1]
    lo, hi = np.quantile(ratios, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def _loader(params: Params, steps: int) -> DataLoader:
    """``steps`` batches in order, fetched as the pipeline's runs fetch them (:class:`BatchTensors`)."""
    batch = params.train.recipe.batch_size
    g = params.geometry
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(steps * batch, g.channels, g.image_size, g.image_size, generator=gen)
    y = torch.randint(0, 10, (steps * batch,), generator=gen)
    return DataLoader(BatchTensors(x, y), batch_size=batch, collate_fn=as_batch)


def _fits(measure, model: torch.nn.Module, params: Params, steps: int, skip: int,
          fits: int) -> tuple[list, bool]:
    """``measure`` (:func:`interleaved_steps` or :func:`plain_pairs`) ``fits`` times from ``model``'s weights: the
    paired step times of each fit, and whether every fit ended with the same weights both ways."""
    loader = _loader(params, steps)
    runs = [measure(model, loader, params, steps, skip) for _ in range(fits)]
    return [(a, b) for a, b, _ in runs], all(same for *_, same in runs)


def training_step(arch: str, params: Params, steps: int, skip: int, fits: int, block: int = BLOCK) -> StepResult:
    """Lightning and plain step times of ``arch`` (:func:`interleaved_steps`, ``fits`` times) from the same
    initial weights on the same batches."""
    L.seed_everything(0, verbose=False)
    model = build_model(arch, params, 10)
    pairs, identical = _fits(interleaved_steps, model, params, steps, skip, fits)
    per_image = budget.train_flops_per_image(budget.measured_forward_flops(model, params))
    return StepResult(arch, pairs, per_image * params.train.recipe.batch_size, identical, block)


def loop_floor(params: Params, steps: int, skip: int, fits: int, block: int = BLOCK) -> StepResult:
    """Both ways on a one-layer linear classifier, whose own compute is next to nothing: what Lightning's loop
    alone costs per step."""
    g = params.geometry
    L.seed_everything(0, verbose=False)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(g.channels * g.image_size ** 2, 10))
    pairs, identical = _fits(interleaved_steps, model, params, steps, skip, fits)
    return StepResult("linear", pairs, 0, identical, block)


def aa_control(arch: str, params: Params, steps: int, skip: int, fits: int, block: int = BLOCK) -> StepResult:
    """:func:`plain_pairs` on ``arch``: the harness's own bias and noise, where the true ratio is 1."""
    L.seed_everything(0, verbose=False)
    pairs, identical = _fits(plain_pairs, build_model(arch, params, 10), params, steps, skip, fits)
    return StepResult(arch, pairs, 0, identical, block)
