"""``SkipMetaWrites`` (pipeline/meta_device.py) skips only what a meta tensor cannot hold: every architecture
built under it has the parameters, shapes and trainable flags of a plain meta build, and tensors with storage are
written as ever."""

from __future__ import annotations

import tiny_repo
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pipeline.archs import ARCHS
from pipeline.config import Params
from pipeline.meta_device import SkipMetaWrites
from pipeline.models import build_model, width_step


def shapes(model: torch.nn.Module) -> list[tuple[str, tuple[int, ...], bool]]:
    return [(name, tuple(p.shape), p.requires_grad) for name, p in model.named_parameters()]


def test_every_architecture_builds_the_same_on_the_meta_device_with_or_without_its_init():
    params = Params.model_validate(tiny_repo.small_params())
    for arch in ARCHS:
        width = 4 * width_step(arch, params)
        with torch.device("meta"):
            plain = shapes(build_model(arch, params, 3, width))
            with SkipMetaWrites():
                skipped = shapes(build_model(arch, params, 3, width))
        assert plain and skipped == plain, arch


class Dispatched(TorchDispatchMode):
    """The ATen ops that reached torch's dispatcher (below every TorchFunctionMode)."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.__name__)
        return func(*args, **(kwargs or {}))


def test_only_value_writes_to_meta_tensors_are_skipped():
    meta = torch.empty(2, 3, device="meta")
    with Dispatched() as plain:
        meta.uniform_(-1, 1)
    with Dispatched() as skipped, SkipMetaWrites():
        assert meta.uniform_(-1, 1) is meta and meta.shape == (2, 3)
        assert torch.zeros(3).fill_(2.0).tolist() == [2.0, 2.0, 2.0]  # a tensor with storage: written
        assert meta.unsqueeze_(0).shape == (1, 2, 3)  # metadata still changes on the meta device
        assert meta.requires_grad_().requires_grad
    assert any(op.startswith("uniform_") for op in plain.ops)
    assert not any(op.startswith("uniform_") for op in skipped.ops)  # the meta write never reached ATen
    assert any(op.startswith("fill_") for op in skipped.ops)
