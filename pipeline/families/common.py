"""What every family adapter is written in: the FLOP primitives of the counting convention and the token graph.

FLOPs follow :mod:`pipeline.budget`'s convention (2 per multiply-add of matmul-type ops, exactly what torch's
``FlopCounterMode`` counts). A :class:`Layer` is one step of a model's token graph, which
:mod:`pipeline.interface.reachability` measures by autograd and compares with ``predicted``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, fields

import numpy as np
import torch
from torch import nn


# --------------------------------------------------------------------------- the adapter
@dataclass(frozen=True, kw_only=True)
class Family:
    """Everything the pipeline needs to know about one family of architectures, in one place.

    Every dispatch reads this (building, width, FLOPs, tokens, reachability, resolution); nothing dispatches on
    timm attribute names. A piece left out is refused when the family module is imported, by name.

    * ``classes``: the module types ``build`` returns (how a built model finds its family);
    * ``build(params, num_classes, width, **options) -> nn.Module``: its keyword arguments are the family's
      :attr:`options` (an architecture row naming another is refused); ``width_step(params, **options) -> int``;
    * ``flops(params, width, num_classes, **options) -> int``: forward FLOPs per image, equal to torch's counter;
    * ``tokens(params, **options) -> int``: image tokens the first layer sees, from the geometry alone;
    * ``chain(model, image_size) -> list[Layer]``: the token graph the reachability check measures;
    * ``position(model) -> str``: the kind of ``model``'s position signal, one of :attr:`contract`'s keys;
    * ``contract``: ``{kind: how it maps to another image size}``, this family's rows of
      :data:`pipeline.resolution.POSITION_CONTRACT`;
    * ``position_checks(trained, mapped, size) -> [(label, expected, got)]``: how the interface stage reads the
      position table of a copy mapped to ``size`` px (the family knows its own module; nothing else does);
    * ``size_step(model) -> int`` and ``resize(model, size, params, arch)``: how a copy is mapped to another
      image size in place; ``resize=None`` is the one encoding of a fixed token grid (evaluated at its
      training size only, refused on ``evaluation.resolution.tasks``);
    * ``step_cost``: ``{arch: seconds per optimizer step against vit's}`` for every architecture of the family
      (the pool's order and the plan's prices); ``plot_colour``: ``{arch: colour}`` in every figure and DVC
      plot; ``expected_tokens(params, **options) -> int``: the tests' independent token rule. A family module
      keeps these three in top-level ``STEP_COST``, ``PLOT_COLOUR`` and ``EXPECTED_TOKENS`` constants, which
      stay out of a run's code identity (:mod:`pipeline.provenance`).
    """

    name: str
    classes: tuple[type[nn.Module], ...]
    build: Callable[..., nn.Module]
    width_step: Callable[..., int]
    flops: Callable[..., int]
    tokens: Callable[..., int]
    chain: Callable[[nn.Module, int], list]
    position: Callable[[nn.Module], str]
    contract: dict[str, str]
    position_checks: Callable[[nn.Module, nn.Module, int], list[tuple[str, float, float]]]
    size_step: Callable[[nn.Module], int]
    resize: Callable[..., None] | None
    step_cost: dict[str, float]
    plot_colour: dict[str, str]
    expected_tokens: Callable[..., int]

    def __post_init__(self):
        data = ("name", "classes", "contract", "step_cost", "plot_colour")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "resize" and value is None:
                continue
            if value is None or (f.name not in data and not callable(value)):
                raise TypeError(f"family {self.name!r}: {f.name} is missing (None or not callable)")
        for f in ("classes", "contract"):
            if not getattr(self, f):
                raise TypeError(f"family {self.name!r}: {f} is empty")

    @property
    def options(self) -> set[str]:
        """The option names ``build`` reads: its parameters after (params, num_classes, width)."""
        return set(list(inspect.signature(self.build).parameters)[3:])


# --------------------------------------------------------------------------- FLOP primitives
def linear(tokens: int, d_in: int, d_out: int) -> int:
    """(tokens, d_in) @ (d_in, d_out); a k x k convolution is this with d_in = k*k*c_in at every position."""
    return 2 * tokens * d_in * d_out


def attention(tokens: int, keys: int, dim: int) -> int:
    """Q K^T (tokens x keys x dim) plus A V (tokens x keys x dim), summed over heads (dim = all heads)."""
    return 2 * 2 * tokens * keys * dim


def transformer_block(tokens: int, keys: int, dim: int, hidden: int) -> int:
    """Pre-norm block: qkv, attention, projection, two-layer MLP; ``keys`` = tokens each query sees."""
    return (linear(tokens, dim, 3 * dim) + attention(tokens, keys, dim) + linear(tokens, dim, dim)
            + mlp(tokens, dim, hidden))


def mlp(tokens: int, dim: int, hidden: int) -> int:
    """Two-layer MLP on each of ``tokens`` rows: dim -> hidden -> dim."""
    return linear(tokens, dim, hidden) + linear(tokens, hidden, dim)


# --------------------------------------------------------------------------- token graph
@dataclass(frozen=True)
class Layer:
    """One step of a model's token graph. Layouts: ``nchw``, ``nhwc`` or ``nlc`` (tokens ``(B, N, C)``).

    ``predicted``: the connectivity the layer's definition implies (patch membership, all-to-all, the
    window mask), ``(N_out, N_in)`` bool, or None where there is no closed form (convolution blocks).
    """

    name: str
    fn: Callable[[torch.Tensor], torch.Tensor]
    layout_in: str
    layout_out: str
    predicted: np.ndarray | None = None


def patch_membership(grid: int, patch: int, prefix: int = 0) -> np.ndarray:
    """``(prefix + grid^2, (grid*patch)^2)``: patch token ``t`` depends on exactly the pixels of its patch."""
    side = grid * patch
    yy, xx = np.divmod(np.arange(side * side), side)
    owner = (yy // patch) * grid + xx // patch
    dep = np.zeros((prefix + grid * grid, side * side), dtype=bool)
    dep[prefix + owner, np.arange(side * side)] = True
    return dep


def merge_pattern(grid: int) -> np.ndarray:
    """Swin patch merging on a ``grid x grid`` map: output ``(i, j)`` reads inputs ``(2i+a, 2j+b)``."""
    out = (grid + 1) // 2
    yy, xx = np.divmod(np.arange(grid * grid), grid)
    dep = np.zeros((out * out, grid * grid), dtype=bool)
    dep[(yy // 2) * out + xx // 2, np.arange(grid * grid)] = True
    return dep


def no_position_table(trained: nn.Module, mapped: nn.Module, size: int) -> list:
    """``position_checks`` of a family whose modules carry no position table (convolutions, a fixed grid)."""
    return []
