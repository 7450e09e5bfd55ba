"""What a second-look budget would have bought: the plan of a finished study replayed under ``plan.budget`` values.

    python -m bench.plan_budget --repo <reproduced repo> [--budgets 0 25 50 ...] [--out reports]

Reads the study's first look as the ``plan`` stage does (``data/runs``, teachers, pools, slices, floors; the same
ledger code and ``seed_prices``) and makes its plan again at each budget (thousands of ViT steps; ``none``: no
cap, which must give the study's own ``data/plan/plan.json``). For each plan it prices the second look with the
study's own measured runs (``measured.run_s`` of each planned seed in ``data/runs_more``) and counts what the
ledger would then say: a continued row takes its verdict from the study's committed ledger (look 2), any other
row its first-look verdict. That verdict was judged in the study's larger look-2 Holm family, so a smaller family
could only decide as many rows or more: the decided counts are a lower bound. Writes ``plan_budget.md``.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

from pipeline.config import load_params
from pipeline.io import read_json, write_text
from pipeline.report import ledger, markdown, pages, seeds, sources
from pipeline.schemas import SEED_PLAN

DECIDED = ("held", "failed", "equivalent")  # verdicts that answer a row's question (pipeline.report.markdown)


def first_look(repo: Path, params) -> tuple[pd.DataFrame, dict]:
    """The first look's ledger and cell prices, exactly as the ``plan`` stage computes them."""
    data = repo / "data"
    records = sources.read_records(params, data / "runs", data / "teachers")
    inp = pages.load(params, records, data / "tasks", data / "slices", data / "shortcuts", data / "teachers", {},
                     collisions=False)
    first = ledger.judge(params, inp.runs, inp.items, inp.floors, inp.disagreement, params.seed,
                         transfer_rates=inp.transfer_disagreement)
    return first, seeds.seed_prices(inp.runs)


def run_minutes(folder: Path) -> pd.DataFrame:
    """(task, arch, seed, minutes, steps) of every finished run under ``folder`` (``measured.run_s``,
    ``steps_done``)."""
    rows = [{"task": m["task"], "arch": m["arch"], "seed": m["seed"], "minutes": m["measured"]["run_s"] / 60,
             "steps": m["steps_done"]} for m in sources.read_metrics(folder, "runs")]
    return pd.DataFrame(rows, columns=["task", "arch", "seed", "minutes", "steps"])


def at_first_look_speed(more: pd.DataFrame, first: pd.DataFrame) -> pd.Series:
    """Each second-look run's minutes had it run at its cell's first-look minutes per step (evaluation included):
    what the second look costs without whatever else shared the cores while it ran."""
    per_step = first.groupby(["task", "arch"]).minutes.sum() / first.groupby(["task", "arch"]).steps.sum()
    return more.steps * pd.Series(list(zip(more.task, more.arch, strict=True))).map(per_step).to_numpy()


def replay(plan: dict, first: pd.DataFrame, final: pd.DataFrame, more: pd.DataFrame) -> dict:
    """The second look's measured worker-minutes under ``plan`` and the ledger's row counts (the report's own,
    :func:`pipeline.report.markdown.row_counts`) when continued rows take their look-2 line and the rest keep
    look 1's."""
    keyed = more.set_index(["task", "arch", "seed"])

    def total(column: str) -> float:
        return sum(float(keyed[column].get((c["task"], c["arch"], s), math.nan)) for c in plan["cells"]
                   for s in c["seeds"])
    go = [r["id"] for r in plan["rows"] if r["continued"]]
    lines = pd.concat([final.loc[go], first.drop(index=go)])[final.columns.intersection(first.columns)]
    counts = markdown.row_counts(lines.reset_index())
    decided = sum(lines.verdict.get(i) in DECIDED for i in go)
    lost = [i for i in final.index.difference(go) if final.at[i, "look"] == 2 and final.at[i, "verdict"] in DECIDED]
    return {"rows_continued": len(go), "runs": sum(len(c["seeds"]) for c in plan["cells"]),
            "kvit_priced": plan["spent_kvit"], "second_look_min": total("minutes"),
            "at_look1_speed": total("at_look1_speed"),
            "informative_paired": counts["paired"]["informative"], "decided_paired": counts["paired"]["decided"],
            "decided_floor": counts.get("floor", {}).get("decided", 0), "decided_at_look_2": decided,
            "study_decisions_left_at_look_1": ", ".join(lost) or "none"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, required=True, help="a repository whose dvc repro finished")
    ap.add_argument("--budgets", nargs="+", default=["none", "0", "25", "50", "75", "100", "150"],
                    help="plan.budget values in thousands of ViT steps; none: no cap")
    ap.add_argument("--out", type=Path, default=Path("reports"))
    ap.add_argument("--study", default=None, help="how the report names the study (default: the repo's folder)")
    args = ap.parse_args(argv)
    params = load_params(args.repo / "params.yaml")
    first, prices = first_look(args.repo, params)
    final = pd.read_csv(args.repo / "reports" / "tables" / "ledger.csv").set_index("id")
    first = first.set_index("id")
    committed = read_json(args.repo / "data" / "plan" / "plan.json", SEED_PLAN)
    more = run_minutes(args.repo / "data" / "runs_more")
    more["at_look1_speed"] = at_first_look_speed(more, run_minutes(args.repo / "data" / "runs"))
    look1 = sum(float(m["measured"]["run_s"]) for name in ("tune", "teachers", "runs")
                for m in sources.read_metrics(args.repo / "data" / name, name)) / 60
    rows = []
    for text in args.budgets:
        budget = None if text == "none" else float(text)
        capped = params.model_copy(update={"plan": params.plan.model_copy(update={"budget": budget})})
        plan = seeds.make_plan(first.reset_index(), capped, prices)
        if budget is None and plan["cells"] != committed["cells"]:
            raise SystemExit(f"error: the replayed plan differs from {args.repo}/data/plan/plan.json: the study was "
                             "made by other code or params than this checkout's")
        r = replay(plan, first, final, more)
        total, steady = look1 + r["second_look_min"], look1 + r.pop("at_look1_speed")
        lost = r.pop("study_decisions_left_at_look_1")
        rows.append({"plan.budget": text, **r, "worker_min": total,
                     "worker_min_per_informative_paired": total / r["informative_paired"],
                     "same_at_look1_speed": steady / r["informative_paired"],
                     "study_decisions_left_at_look_1": lost})
    table = pd.DataFrame(rows)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.1f}"))
    text = (f"# The second look under a budget: {args.study or f'the study in `{args.repo.name}`'} replayed\n\n"
            "Written by `python -m bench.plan_budget`. The first look is the study's own (tune, teachers and "
            f"train runs: {look1:.1f} worker-minutes inside the runs, `measured.run_s`); each row replays the "
            "`plan` stage on it with `plan.budget` at that value (thousands of ViT steps as "
            "`pipeline.report.seeds.seed_prices` counts them; rows bought cheapest first) and prices the second "
            "look with the study's own measured runs of those seeds. `none` is the study as it ran. A continued "
            "row's verdict is the one the study's ledger gave it at look 2 (judged in the full look-2 family: a "
            "smaller family decides as many or more, so the decided counts are a lower bound); every other row "
            "keeps its first-look verdict; `study_decisions_left_at_look_1` names the rows the study decided at look 2 "
            "that the budget leaves at look 1; `same_at_look1_speed` prices each second-look run at its cell's "
            "first-look minutes per step instead (anything else that shared the cores during the second look "
            "left out). Worker-minutes here are inside the runs; the repro breakdown's "
            "figure adds the stages' own overhead (about 2%).\n\n"
            + table.to_markdown(index=False, floatfmt=".1f") + "\n")
    write_text(args.out / "plan_budget.md", text)
    print(f"wrote {args.out / 'plan_budget.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
