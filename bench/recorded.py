"""Figures measured once and quoted, not re-measured (bench/recorded.yaml): history is data, not code."""

from __future__ import annotations

from pathlib import Path

import yaml

_RECORDED = yaml.safe_load(Path(__file__).with_name("recorded.yaml").read_text(encoding="utf-8"))
REFERENCE_STEPS: dict = _RECORDED["reference_steps"]  # {"commit", "steps", "s": {arch: seconds per `steps`}}
RECORDED_CHANGES: list[dict] = _RECORDED["changes"]  # [{"change", "measured", "before", "after", "source"}]
