"""Building models on the meta device without paying for the weight init it cannot hold.

A width search builds each architecture a dozen times under ``torch.device("meta")`` only to count its
parameters. timm still initialises every weight there, and each in-place op on a meta tensor runs through torch's
Python reference kernels (``torch._refs``): about two thirds of a meta build (``python -m bench.meta_builds``).
Those ops only write values, which a meta tensor does not have, so skipping them changes no shape, dtype or count
(``tests/test_meta_device.py`` builds every architecture both ways).
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

# In-place ops that write values only (what weight init calls). Never ones that change a tensor's metadata
# (resize_, unsqueeze_, as_strided_, requires_grad_): those must still run on the meta device.
VALUE_WRITES = frozenset({
    "uniform_", "normal_", "erfinv_", "mul_", "add_", "sub_", "div_", "clamp_", "clamp_min_", "clamp_max_",
    "fill_", "zero_", "copy_", "exp_", "log_", "trunc_", "bernoulli_",
})


class SkipMetaWrites(TorchFunctionMode):
    """While active, an in-place value write (:data:`VALUE_WRITES`) to a meta tensor returns the tensor untouched;
    every other call, and every write to a tensor with storage, runs as usual."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if (args and isinstance(args[0], torch.Tensor) and args[0].is_meta
                and getattr(func, "__name__", "") in VALUE_WRITES):
            return args[0]
        return func(*args, **(kwargs or {}))
