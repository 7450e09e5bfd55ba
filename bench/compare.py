"""The quick profile against the default study: its repro scaled to the default repro's machine, and its ledger
verdicts beside the default's. Arithmetic only; bench/render.py words it."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from bench.recorded import REFERENCE_STEPS

QUICK = "reports/quick/repro_timing.json"
# stages whose work is the same in both profiles (no training, no report): their time ratio scales the rest
SHARED_STAGES = ("interface", "data", "slice", "shortcuts")


def stage_seconds(timing: dict) -> dict[str, float]:
    """A ``repro_timing.json``'s per-stage seconds, without its summaries (total, and the mappings: training,
    machine steps, cost per decided row)."""
    return {k: v for k, v in timing.items() if k != "total" and isinstance(v, (int, float))}


def machine_ratios(machine: dict | None) -> dict[str, float]:
    """Per arch: a repro machine's training-step time over the reference machine's (``machine``: the
    ``machine_steps_s`` that ``bench.repro_breakdown --phases`` stored beside that repro's timing)."""
    if not machine:
        return {}
    ref, n = REFERENCE_STEPS["s"], REFERENCE_STEPS["steps"]
    return {a: machine["s"][a] / machine["steps"] / (ref[a] / n) for a in ref if a in machine["s"]}


@dataclass
class Estimate:
    """A repro's minutes on the reference machine: training stages scaled by the per-arch step ratios, the other
    stages by the shared stages' time ratio; ``mid`` at the mean step ratio, ``lo``/``hi`` at the extremes."""

    step_ratios: dict[str, float]
    shared: list[str]  # the shared stage kinds both repros ran
    other_ratio: float
    mid: float
    lo: float
    hi: float


def on_reference_machine(quick: dict, default: dict | None) -> Estimate | None:
    """The quick profile's repro (its ``repro_timing.json``) estimated on the machine of the default repro
    (``default``: that repro's timing); None without the machine figures, shared stages or training times."""
    stages, t = stage_seconds(quick), quick.get("training", {})
    ratios = machine_ratios(quick.get("machine_steps_s"))
    common = [k for k in stages if k.split("@")[0] in SHARED_STAGES and default and k in default]
    if not (ratios and common and t):
        return None
    other = quick["total"] - t["wall_s"]
    other_ratio = sum(stages[k] for k in common) / sum(default[k] for k in common)

    def minutes(step_ratio: float) -> float:
        return (t["wall_s"] / step_ratio + other / other_ratio) / 60

    return Estimate(ratios, sorted({k.split("@")[0] for k in common}), other_ratio,
                    mid=minutes(sum(ratios.values()) / len(ratios)), lo=minutes(max(ratios.values())),
                    hi=minutes(min(ratios.values())))


def verdict_changes(default: pd.DataFrame, quick: pd.DataFrame) -> list[str]:
    """How the quick profile's ledger rows compare with the same rows at the default (``ledger.csv`` tables)."""
    both = default.set_index("id")[["verdict"]].join(
        quick.set_index("id")[["verdict"]].rename(columns={"verdict": "verdict_quick"}), how="inner")
    same = both.verdict == both.verdict_quick
    decided = {"held", "failed", "not equivalent", "equivalent"}
    lost = both[~same & both.verdict.isin(decided) & ~both.verdict_quick.isin(decided)]
    flipped = both[~same & both.verdict.isin(decided) & both.verdict_quick.isin(decided)]
    gained = both[~same & ~both.verdict.isin(decided) & both.verdict_quick.isin(decided)]
    lines = [f"Of its {len(quick)} ledger rows, {len(both)} are also the default's ({len(default)} rows): "
             f"{int(same.sum())} with the same verdict; {len(lost)} decided at the default and not here "
             f"({', '.join(lost.index) or 'none'}); {len(flipped)} decided both ways with another verdict "
             f"({', '.join(f'{i}: {r.verdict} -> {r.verdict_quick}' for i, r in flipped.iterrows()) or 'none'}); "
             f"{len(gained)} undecided at the default and decided here "
             f"({', '.join(f'{i}: {r.verdict_quick}' for i, r in gained.iterrows()) or 'none'})."]
    return lines
