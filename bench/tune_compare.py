"""Two tune stages' trials side by side: which cells learn under one stop rule and not the other?

    python -m bench.tune_compare --before reports/tune/trials.csv --after reports/quick/tune/trials.csv \
        [--out reports/quick/tune/compared.md] [--ledger reports/tables/ledger.csv]

Both files are the tune stage's ``reports/tune/trials.csv`` (one row per arch, task and learning rate: the
trial's best validation accuracy, its steps and how it stopped). Trials are matched on (arch, task, lr), so
where both ran on the same data and tune seed the only differences are what changed in between (the stop rule,
the cap). A cell *learned* when its best trial reaches chance + half the span to 1 (the plateau rule's own
``plateau_above`` 0.5 line). Prints (and with ``--out`` writes) the Markdown table.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from pipeline.io import write_text


def compare(before: pd.DataFrame, after: pd.DataFrame, chance: dict[str, float]) -> pd.DataFrame:
    """One row per (arch, task) tried in both: each side's best val accuracy, steps and stop reasons, learned?"""
    both = before.merge(after, on=["arch", "task", "lr"], suffixes=("_before", "_after"))
    rows = []
    for (arch, task), g in both.groupby(["arch", "task"], sort=True):
        line = chance[task] + 0.5 * (1 - chance[task])
        row = {"arch": arch, "task": task, "lrs": len(g)}
        for side in ("before", "after"):
            best = g.loc[g[f"val_acc_{side}"].idxmax()]
            row |= {f"best_{side}": float(best[f"val_acc_{side}"]), f"steps_{side}": int(best[f"steps_done_{side}"]),
                    f"stops_{side}": "/".join(sorted(set(g[f"stop_reason_{side}"]))),
                    f"learned_{side}": bool(best[f"val_acc_{side}"] >= line)}
        rows.append(row)
    return pd.DataFrame(rows)


def page(table: pd.DataFrame, before: str, after: str) -> str:
    n = len(table)
    head = (f"# Tune trials compared\n\n`{before}` (before) vs `{after}` (after), matched on arch, task and "
            f"learning rate: {n} cells tried in both. Learned (best trial at chance + half the span or above): "
            f"{int(table.learned_before.sum())} before, {int(table.learned_after.sum())} after; "
            f"{int((~table.learned_before & table.learned_after).sum())} cells learn only after, "
            f"{int((table.learned_before & ~table.learned_after).sum())} only before.\n\n")
    cols = ["arch", "task", "lrs", "best_before", "steps_before", "stops_before", "best_after", "steps_after",
            "stops_after", "learned_before", "learned_after"]
    return head + table[cols].to_markdown(index=False, floatfmt=".3f") + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, required=True)
    ap.add_argument("--after", type=Path, required=True)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--ledger", type=Path, default=Path("reports/tables/ledger.csv"),
                    help="a report's ledger: each task's chance level (its `chance` column)")
    args = ap.parse_args(argv)
    ledger = pd.read_csv(args.ledger).dropna(subset=["chance"])
    chance = ledger.groupby("task").chance.first().to_dict()
    table = compare(pd.read_csv(args.before), pd.read_csv(args.after), chance)
    text = page(table, str(args.before), str(args.after))
    if args.out:
        write_text(args.out, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
