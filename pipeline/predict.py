"""From uint8 arrays to a trained model's predictions: the one pixel map every stage shares, and evaluation.

Plain torch and numpy, no Lightning: the report (patch collisions) and the resolution sweep import this
without the training stack; :mod:`pipeline.learner` feeds its batches through the same :func:`to_tensor`.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

# uint8 images -> roughly zero-mean, unit-scale floats; the same fixed map for every task and architecture.
PIXEL_MEAN, PIXEL_STD = 127.5, 64.0


def to_tensor(images: np.ndarray) -> torch.Tensor:
    """(N, H, W, C) uint8 -> (N, C, H, W) float32, normalised."""
    x = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float()
    return (x - PIXEL_MEAN) / PIXEL_STD


def predict(model: nn.Module, images: np.ndarray, batch_size: int = 1000) -> np.ndarray:
    """Logits (N, K) float32 of ``model`` in eval mode (averaging DeiT's two heads)."""
    model.eval()
    outs = []
    with torch.inference_mode():
        for start in range(0, len(images), batch_size):
            out = model(to_tensor(images[start:start + batch_size]))
            outs.append((out[0] + out[1]) / 2 if isinstance(out, tuple) else out)
    return torch.cat(outs).float().numpy()


def slice_accuracy(pred: np.ndarray, labels: np.ndarray, indices: dict[str, np.ndarray]) -> dict[str, dict]:
    """Accuracy overall on ``test`` and on every ``slice/...`` (index arrays into the full task arrays).

    ``pred`` holds the predicted class of every sample of the task (-1 where not predicted).
    """
    out = {}
    for key in ["test", *sorted(k for k in indices if k.startswith("slice/"))]:
        idx = indices[key]
        if len(idx):
            out[key] = {"acc": float((pred[idx] == labels[idx]).mean()), "n": int(len(idx))}
    return out
