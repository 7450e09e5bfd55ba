"""A finished run's model, rebuilt from the final weights its folder kept: what the report's null-space check and
the fine-tuning stage read back (a run itself never does, so this is no part of its code identity)."""

from __future__ import annotations

from pathlib import Path

from pipeline.errors import StageError
from pipeline.models import build_model
from pipeline.provenance import load_state


def read_model(folder: str | Path, model: str, params, num_classes: int):
    """The trained ``model`` whose final weights a run folder kept (``weights.pt``), or None if it kept none."""

    path = Path(folder) / "weights.pt"
    if not path.exists():
        return None
    net = build_model(model, params, num_classes)
    state = load_state(path, model, "rerun the stage that trained it (dvc repro)")
    try:
        net.load_state_dict(state)
    except (RuntimeError, KeyError) as err:  # tensors of another model: one line naming the file
        raise StageError(f"{path}: not a {model} checkpoint ({type(err).__name__})") from None
    return net.eval()
