"""What a second-look budget would have bought: the plan of a finished study replayed under ``plan.budget`` values.

    python -m bench.plan_budget --repo <reproduced repo> [--budgets 0 25 50 ...] [--out reports]

Reads the study's first look as the ``plan`` stage does (``data/runs``, teachers, pools, slices, floors; the same
ledger code and ``seed_prices``) and makes its plan again at each budget (thousands of ViT-step equivalents;
``none``: no cap, which must give the study's own ``data/plan/plan.json``). A budgeted plan's seeds are a subset of
the study's second look, so the ledger is judged again exactly as the report judges it (``ledger.judge`` on the
first look and ``data/runs_more`` with the budgeted plan; ``none`` must give the study's committed ledger), and the
second look is priced with the study's own measured runs of those seeds (``measured.run_s``). Writes
``plan_budget.md``.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

from pipeline.config import load_params
from pipeline.io import read_json, write_text
from pipeline.report import inputs as report_inputs
from pipeline.report import ledger, markdown, seeds, sources
from pipeline.schemas import SEED_PLAN

# verdicts that answer a row's question (pipeline.report.markdown)
DECIDED = ("held", "failed", "not equivalent", "equivalent")


def inputs(repo: Path, params, more: bool):
    """What the report reads of the study: the first look's runs, and with ``more`` the second look's too."""
    data = repo / "data"
    records = sources.read_records(params, data / "runs", data / "teachers", data / "runs_more" if more else None)
    return report_inputs.load(params, records, data / "tasks", data / "slices", data / "shortcuts",
                              data / "teachers", {})


def judge(inp, params, plan: dict | None = None) -> pd.DataFrame:
    """The ledger as the report judges it (less the exact rows of trained weights, which no look decides)."""
    return ledger.judge(params, inp.runs, inp.items, inp.floors, inp.disagreement, params.seed, seed_plan=plan,
                        transfer_rates=inp.transfer_disagreement)


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


def replay(plan: dict, led: pd.DataFrame, study: pd.DataFrame, more: pd.DataFrame) -> dict:
    """The second look's measured worker-minutes under ``plan`` (and at first-look speed), the row counts of its
    ledger ``led`` (the report's own, :func:`pipeline.report.markdown.row_counts`), and the rows the ``study``'s
    ledger decided at look 2 that ``led`` leaves undecided."""
    keyed = more.set_index(["task", "arch", "seed"])

    def total(column: str) -> float:
        return sum(float(keyed[column].get((c["task"], c["arch"], s), math.nan)) for c in plan["cells"]
                   for s in c["seeds"])

    counts = markdown.row_counts(led)
    decided = set(led.id[led.verdict.isin(DECIDED)])
    lost = [i for i in study.id[(study.look == 2) & study.verdict.isin(DECIDED)] if i not in decided]
    return {"rows_continued": sum(r["continued"] for r in plan["rows"]),
            "runs": sum(len(c["seeds"]) for c in plan["cells"]), "kvit_priced": plan["spent_kvit"],
            "second_look_min": total("minutes"), "at_look1_speed": total("at_look1_speed"),
            "informative_paired": counts["paired"]["informative"], "decided_paired": counts["paired"]["decided"],
            "decided_floor": counts.get("floor", {}).get("decided", 0),
            "decided_at_look_2": int(((led.look == 2) & led.verdict.isin(DECIDED)).sum()),
            "study_decisions_lost": ", ".join(lost) or "none"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, required=True, help="a repository whose dvc repro finished")
    ap.add_argument("--budgets", nargs="+", default=["none", "0", "25", "50", "75", "100", "150"],
                    help="plan.budget values in thousands of ViT-step equivalents; none: no cap")
    ap.add_argument("--out", type=Path, default=Path("reports"))
    ap.add_argument("--study", default=None, help="how the report names the study (default: the repo's folder)")
    args = ap.parse_args(argv)
    params = load_params(args.repo / "params.yaml")
    first = inputs(args.repo, params, more=False)
    look1_ledger, prices = judge(first, params), seeds.seed_prices(first.runs)
    both = inputs(args.repo, params, more=True)
    study = pd.read_csv(args.repo / "reports" / "tables" / "ledger.csv")
    committed = read_json(args.repo / "data" / "plan" / "plan.json", SEED_PLAN)
    more = run_minutes(args.repo / "data" / "runs_more")
    more["at_look1_speed"] = at_first_look_speed(more, run_minutes(args.repo / "data" / "runs"))
    look1 = sum(float(m["measured"]["run_s"]) for name in ("tune", "teachers", "runs")
                for m in sources.read_metrics(args.repo / "data" / name, name)) / 60
    rows = []
    for text in args.budgets:
        budget = None if text == "none" else float(text)
        capped = params.model_copy(update={"plan": params.plan.model_copy(update={"budget": budget})})
        plan = seeds.make_plan(look1_ledger, capped, prices)
        led = judge(both, params, plan)
        if budget is None and (plan["cells"] != committed["cells"] or
                               list(led.verdict) != list(study.set_index("id").verdict.reindex(led.id))):
            raise SystemExit(f"error: the replayed plan or ledger differs from {args.repo}'s data/plan/plan.json "
                             "or reports/tables/ledger.csv: the study was made by other code or params than this "
                             "checkout's")
        r = replay(plan, led, study, more)
        total, steady = look1 + r["second_look_min"], look1 + r.pop("at_look1_speed")
        lost = r.pop("study_decisions_lost")
        rows.append({"plan.budget": text, **r, "worker_min": total,
                     "worker_min_per_informative_paired": total / r["informative_paired"],
                     "same_at_look1_speed": steady / r["informative_paired"], "study_decisions_lost": lost})
    table = pd.DataFrame(rows)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.1f}"))
    text = (f"# The second look under a budget: {args.study or f'the study in `{args.repo.name}`'} replayed\n\n"
            "Written by `python -m bench.plan_budget`. The first look is the study's own (tune, teachers and "
            f"train runs: {look1:.1f} worker-minutes inside the runs, `measured.run_s`). Each row makes the "
            "`plan` stage's plan again with `plan.budget` at that value (thousands of ViT-step equivalents as "
            "`pipeline.report.seeds.seed_prices` counts them; rows bought cheapest first), judges the ledger "
            "again as the report would on the study's own runs of the seeds that plan keeps (`none` is the study "
            "as it ran and gives its committed ledger), and prices the second look with the study's measured runs "
            "of those seeds. `study_decisions_lost` names the rows the study decided at look 2 that the budget "
            "leaves undecided; `same_at_look1_speed` prices each second-look run at its cell's first-look minutes "
            "per step instead (anything else that shared the cores during the second look left out). "
            "Worker-minutes here are inside the runs; the repro breakdown's figure adds the stages' own overhead "
            "(about 2%).\n\n" + table.to_markdown(index=False, floatfmt=".1f") + "\n")
    write_text(args.out / "plan_budget.md", text)
    print(f"wrote {args.out / 'plan_budget.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
