"""Explicit comparisons, recorded: every level-1 claim becomes a row ``expected vs actual, held?``.

The stage collects these in one list, writes them out, and fails if any did not hold, so the report's
"N of N checks held" is a count of real comparisons, not a summary someone typed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Check:
    """One comparison. ``expected`` is the rule in words (``"== 48"``, ``"<= 1e-10"``, ``"> 1e-05"``)."""

    group: str  # the kind of check: nullspace | patchify | permutation | pairs | reachability | position
    name: str
    expected: str
    actual: float
    held: bool

    def row(self) -> dict:
        return asdict(self)


def equal(group: str, name: str, expected: float, actual: float) -> Check:
    return Check(group, name, f"== {expected:g}", float(actual), bool(actual == expected))


def at_most(group: str, name: str, actual: float, bound: float) -> Check:
    return Check(group, name, f"<= {bound:g}", float(actual), bool(actual <= bound))


def above(group: str, name: str, actual: float, bound: float) -> Check:
    return Check(group, name, f"> {bound:g}", float(actual), bool(actual > bound))


def summary(checks: list[Check]) -> dict[str, int]:
    """``{"checked": n, "held": k}`` overall and per group (``"<group>.checked"``...)."""
    out = {"checked": len(checks), "held": sum(c.held for c in checks)}
    for fam in sorted({c.group for c in checks}):
        mine = [c for c in checks if c.group == fam]
        out[f"{fam}.checked"] = len(mine)
        out[f"{fam}.held"] = sum(c.held for c in mine)
    return out
