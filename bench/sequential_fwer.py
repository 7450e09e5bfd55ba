"""The two-look design's family-wise error and power, simulated with the committed study's own rows.

    python -m bench.sequential_fwer [--ledger reports/tables/ledger.csv] [--studies 20000] [--out reports/sequential]

Rows: the ledger's informative paired rows outside the budget axis (their expect and per-seed sd; margin and
smallest effect of interest from contrasts.csv); the
params' alpha, first-look seeds and ``plan.max_seeds``; the plan's continuation rule as implemented
(:func:`pipeline.report.sequential.simulate`). Global null: every "+" row at 0, every "0" row at its margin (a wrong
verdict is any held or failed). Power: every "+" row at its anchored effect (the margin where it has none), every
"0" row at 0 (held = equivalent). Rules: ``union`` (the previous: Holm at alpha / 2 per look, look 2 over the
continued rows on all their seeds), ``combination`` (the rule in force: inverse-normal of look 1 and the new seeds
alone, every row in look 2's family), ``new_only`` (valid too, less power: look 2 on the new seeds alone, Holm over
the continued rows only), ``single`` (one look at
alpha, no second look: the reference). A second null, for the rules in force and the reference: the same rows with
seeds that learn or stay at chance (both arms one bimodal distribution, a seed learning with probability
:data:`ESCAPE`: ``simulate(escape=...)``), under which the t test's normal model fails (docs/methods.md, Error
rates). Writes ``sequential.csv``, ``sequential_fwer.csv`` and ``sequential.md``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from pipeline.config import load_params
from pipeline.io import write_text
from pipeline.report.contrasts import CONTRASTS
from pipeline.report.sequential import simulate

RULES = ("union", "combination", "new_only", "single")
ESCAPE = 0.5  # the bimodal null's chance that a seed learns (its worst case: 3 of 3 against 0 of 3 most often)


def study_rows(ledger: pd.DataFrame) -> pd.DataFrame:
    """The informative paired rows outside the budget axis, with the anchored effect of their contrast."""
    anchors = {c["id"]: c["anchor"] for c in CONTRASTS}
    sesoi = {c["id"]: c["sesoi"] for c in CONTRASTS}
    rows = ledger[(ledger.kind == "paired") & (ledger.finding != "budget") & (ledger.verdict != "uninformative")
                  & ledger.seed_sd.notna()].copy()
    rows["anchor"] = [anchors.get(i.rsplit(".", 1)[0], float("nan")) for i in rows.id]
    margins = {c["id"]: c["margin"] for c in CONTRASTS}  # contrasts.csv's, which may be newer than the study's
    rows["margin"] = [margins.get(i.rsplit(".", 1)[0], m) for i, m in zip(rows.id, rows.margin, strict=True)]
    rows["sesoi"] = [sesoi.get(i.rsplit(".", 1)[0], m) for i, m in zip(rows.id, rows.margin, strict=True)]
    return rows


def scenario(rows: pd.DataFrame, null: bool) -> list[dict]:
    out = []
    for r in rows.itertuples():
        sesoi = r.anchor if r.anchor == r.anchor else r.margin
        true = (r.margin if r.expect == "0" else 0.0) if null else (0.0 if r.expect == "0" else sesoi)
        out.append({"id": r.id, "expect": r.expect, "sd": r.seed_sd, "margin": r.margin, "sesoi": r.sesoi,
                    "true": true})
    return out


def run(ledger: pd.DataFrame, alpha: float, first: int, cap: int, studies: int, seed: int) -> tuple[pd.DataFrame,
                                                                                                     pd.DataFrame]:
    """(FWER per rule, power per row and rule)."""
    rows = study_rows(ledger)
    fwer, power = [], {}
    for rule, escape in [*((r, None) for r in RULES), ("combination", ESCAPE), ("single", ESCAPE)]:
        null = simulate(scenario(rows, True), rule, studies, seed, alpha, first, cap, escape=escape)
        fwer.append({"rule": rule, "null": "normal seeds" if escape is None else f"bimodal seeds (escape {escape})",
                     "fwer": null["fwer"], "ci_lo": null["fwer_ci"][0], "ci_hi": null["fwer_ci"][1],
                     "studies": studies})
        if escape is None:
            power[rule] = simulate(scenario(rows, False), rule, studies, seed + 1, alpha, first, cap)["held"]
    table = rows[["id", "expect", "seed_sd", "margin", "anchor", "sesoi"]].reset_index(drop=True)
    for rule in RULES:
        table[f"held_{rule}"] = power[rule]
    return pd.DataFrame(fwer), table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ledger", type=Path, default=Path("reports/sequential/ledger_simulated.csv"))
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--studies", type=int, default=20000)
    ap.add_argument("--out", type=Path, default=Path("reports/sequential"))  # not the report stage's output folder
    args = ap.parse_args(argv)
    params = load_params(args.params)
    alpha = 1 - params.report.confidence
    fwer, power = run(pd.read_csv(args.ledger), alpha, len(params.train.seeds), params.plan.max_seeds,
                      args.studies, params.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    power.to_csv(args.out / "sequential.csv", index=False)
    fwer.to_csv(args.out / "sequential_fwer.csv", index=False)
    text = (f"# Two-look error control (bench/sequential_fwer.py, {args.studies} simulated studies)\n\n"
            f"{len(power)} informative paired rows of {args.ledger}, alpha {alpha:g}, "
            f"{len(params.train.seeds)} first-look seeds, plan.max_seeds {params.plan.max_seeds}.\n\n"
            "## Family-wise error under the global null\n\nNormal seeds: every '+' row at 0, every '0' row at its "
            "margin. Bimodal seeds: both arms of every row learn with the same probability; a '+' row held or "
            "failed is wrong, a '0' row cannot be.\n\n" + fwer.to_markdown(index=False, floatfmt=".4f") +
            "\n\n## Share held (power): '+' rows at their anchored effect (else margin), '0' rows at 0\n\n"
            + power.to_markdown(index=False, floatfmt=".3f") + "\n")
    write_text(args.out / "sequential.md", text)
    print(fwer.to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
