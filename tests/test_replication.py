"""bench.replication: two ledgers of the same rows, the findings and decisions that replicate and those that do not."""

from __future__ import annotations

import pandas as pd

from bench import replication


def _ledger(verdict: str, estimate: float) -> pd.DataFrame:
    base = {"kind": "paired", "task": "relation", "a": "swin_local_shift", "b": "swin_local", "subset": "test",
            "expect": "+", "ci_lo": estimate - 0.05, "ci_hi": estimate + 0.05, "seeds": 3, "reason": "",
            "needs_seeds": "", "registration": "confirmatory"}
    return pd.DataFrame([{**base, "id": "relation.shift.relation", "finding": "relation", "verdict": verdict,
                          "estimate": estimate},
                         {**base, "id": "scale.pyramid.scale", "finding": "scale", "verdict": "inconclusive",
                          "estimate": 0.01}])


def test_a_decision_that_moves_is_listed_and_its_finding_is_unstable(tmp_path):
    same = replication.compare(_ledger("held", 0.4), _ledger("held", 0.3))
    assert same.set_index("id").loc["relation.shift.relation", "same_verdict"]
    page = replication.page(_ledger("held", 0.4), _ledger("inconclusive", -0.02), ("draw 1", "draw 2"))
    assert "| relation | supported | undecided | no: unstable |" in page
    assert "| `relation.shift.relation` | held: +0.400 [+0.350, +0.450] | inconclusive: -0.020" in page
    assert "| no | no |" in page and "1 decided in at least one; 0 of them decided the same way" in page
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    _ledger("held", 0.4).to_csv(a, index=False)
    _ledger("held", 0.3).to_csv(b, index=False)
    assert replication.main([str(a), str(b), "--out", str(tmp_path / "r.md")]) == 0
    assert "| relation | supported | supported | yes |" in (tmp_path / "r.md").read_text()
    assert replication.main([str(a), str(tmp_path / "missing.csv")]) == 2
