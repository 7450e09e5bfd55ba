"""A finished run's model, rebuilt from the final weights its folder kept: what the report's null-space check and
the fine-tuning stage read back (a run itself never does, so this is no part of its code identity)."""

from __future__ import annotations

from pathlib import Path

from pipeline.errors import StageError
from pipeline.models import build_model


def read_model(folder: str | Path, model: str, params, num_classes: int):
    """The trained ``model`` whose final weights a run folder kept (``weights.pt``), or None if it kept none."""
    import torch

    path = Path(folder) / "weights.pt"
    if not path.exists():
        return None
    net = build_model(model, params, num_classes)
    try:
        net.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    except Exception as err:  # any unreadable or mismatched file: one line naming it
        raise StageError(f"{path}: not a {model} checkpoint ({type(err).__name__})") from None
    return net.eval()
