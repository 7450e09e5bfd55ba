"""Where a full ``dvc repro``'s wall time went: per stage, and per run inside the training stages.

    python -m bench.repro_breakdown --log repro.log --repo <reproduced repo> [--out reports] [--phases]

``--log`` is the console of the repro with a Unix timestamp prefixed to every line (for example
``make repro | while read l; do echo "$(date +%s.%N) $l"; done``). A stage lasts from its ``Running stage``
line to the next one (the last one to the final line). Inside a training stage the runs' own
``metrics.json`` say how long each run took in its worker (``measured.run_s``: data, model, fit, evaluation), how
long its fit took and which share of it was optimizer steps (``measured.phases_s``,
:class:`pipeline.learner.PhaseTimer`); the rest of the stage's worker time (process start, imports, the Dask
cluster, writing outputs and MLflow while workers wait, idle workers at the end) is its overhead. Writes
``repro_timing.json`` (what ``python -m bench`` renders into performance.md) and ``repro_breakdown.md``.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pandas as pd

from pipeline.io import write_json, write_text
from pipeline.report.gate import below_floor

PHASE_ARCHS, PHASE_STEPS = ("vit", "swin", "resnet"), 1000  # the same as reference_steps in bench/recorded.yaml
STAGE = re.compile(r"Running stage '([^']+)'")
CPU = re.compile(r"^(\w+): \d+ runs; the stage process used ([\d.]+) s of CPU")  # pipeline.stages.common


def stage_cpu(logs: list[Path]) -> dict[str, float]:
    """{training stage: CPU seconds its own process used} summed over the logs (taken from the workers' cores)."""
    cpu: dict[str, float] = {}
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            if m := CPU.match(line.partition(" ")[2]):
                cpu[m.group(1)] = cpu.get(m.group(1), 0.0) + float(m.group(2))
    return cpu


def stage_times(logs: list[Path]) -> tuple[dict[str, float], float]:
    """{stage: seconds} summed over the logs (a repro interrupted and restarted leaves one log per attempt) and
    the total, each log from its first stage's start to its last line."""
    times: dict[str, float] = {}
    total = 0.0
    for log in logs:
        stamps = []
        for line in log.read_text(errors="replace").splitlines():
            stamp, _, text = line.partition(" ")
            try:
                stamps.append((float(stamp), text))
            except ValueError:
                continue
        starts = [(t, m.group(1)) for t, text in stamps if (m := STAGE.search(text))]
        if not starts:
            raise SystemExit(f"error: {log}: no 'Running stage' line")
        ends = [t for t, _ in starts[1:]] + [stamps[-1][0]]
        for (t, name), end in zip(starts, ends, strict=True):
            times[name] = round(times.get(name, 0.0) + end - t, 1)
        total += stamps[-1][0] - starts[0][0]
    return times, round(total, 1)


# The training stages by the data/ folder their runs live in (dvc.yaml's outs).
STAGE_OF = {"runs": "train", "runs_more": "train_more", "teachers": "teacher", "tune": "tune"}


def run_rows(repo: Path) -> pd.DataFrame:
    """One row per trained run: its stage family, arch, fit wall time and step seconds."""
    rows = []
    for path in sorted((repo / "data").glob("*/**/metrics.json")):
        m = json.loads(path.read_text())
        measured = m.get("measured", {})
        phases = measured.get("phases_s") or {}
        folder = path.relative_to(repo / "data").parts[0]
        rows.append({"stage": STAGE_OF.get(folder, folder), "arch": m["arch"], "task": m.get("task"),
                     "mode": m.get("budget_mode"),
                     "fit_s": phases.get("fit", measured.get("wall_time_s", 0.0)), "steps_s": phases.get("steps", 0.0),
                     "run_s": measured.get("run_s", float("nan")),  # absent before the run's own timer existed
                     "optimizer_steps": m.get("budget", {}).get("optimizer_steps"),
                     "cap": m.get("steps"), "stop_reason": m.get("stop_reason", "cap")})
    return pd.DataFrame(rows)


def stop_savings(runs: pd.DataFrame) -> pd.DataFrame:
    """Per stop reason: runs, and the worker-minutes the steps they did not take would have cost at each run's
    own measured seconds per step (criterion and plateau stops; a run that hit its cap saved nothing)."""
    per_step = runs.steps_s / runs.optimizer_steps
    left = (runs.cap - runs.optimizer_steps).clip(lower=0).where(runs.stop_reason != "cap", 0)
    table = runs.assign(saved_min=left * per_step / 60, steps_min=runs.steps_s / 60)
    return table.groupby("stop_reason").agg(runs=("arch", "size"), steps_min=("steps_min", "sum"),
                                             saved_min=("saved_min", "sum"))


def cell_costs(runs: pd.DataFrame) -> dict[str, dict]:
    """Per ``<arch>/<task>`` cell (tune, train and teacher runs together): measured ms per optimizer step, the
    seconds of a run outside its steps (data, evaluation, validation), and how its criterion runs stopped: the
    share of its cap a run used, the share that ran to the cap, and the mean step of those that stopped before it
    (a criterion or plateau stop happens at a step, not at a share of the cap: under another cap the early stops
    stay where they were and the capped runs move with it). What ``python -m bench.estimate`` prices another
    profile with."""
    r = runs.assign(other_s=runs.run_s - runs.steps_s,
                    share=(runs.optimizer_steps / runs.cap).where(runs["mode"] == "criterion"))
    out = {}
    for (arch, task), g in r.groupby(["arch", "task"]):
        crit = g[g["mode"] == "criterion"]
        early = crit[crit.stop_reason != "cap"].optimizer_steps
        out[f"{arch}/{task}"] = {"runs": len(g), "ms_per_step": round(float(g.steps_s.sum() / g.optimizer_steps.sum()
                                                                             * 1e3), 3),
                                 "other_s": round(float(g.other_s.mean()), 2),
                                 "cap_share": round(float(crit.share.clip(upper=1).mean()), 3) if len(crit) else 1.0,
                                 "at_cap": round(float((crit.stop_reason == "cap").mean()), 3) if len(crit) else 1.0,
                                 "early_steps": round(float(early.mean()), 1) if len(early) else None}
    return out


def closed_before_training(rows: pd.DataFrame) -> pd.Series:
    """Paired rows no training could decide: the gate (``pipeline.report.gate.below_floor``) would hold them below
    their compared slice's shortcut floor, which the shortcuts stage computes before anything trains, even with
    both arms at accuracy 1 (floor plus margin above 1). None in a ledger without floors."""
    if not {"floor", "margin", "subset", "expect"} <= set(rows.columns):
        return pd.Series(False, index=rows.index)
    perfect = {"acc_a": 1.0, "acc_b": 1.0, "floor_baseline": ""}
    return pd.Series([r["kind"] == "paired" and bool(below_floor(r, {**perfect, "floor": r["floor"]}))
                      for r in rows.to_dict("records")], index=rows.index, dtype=bool)


def cost_by_cell(runs: pd.DataFrame, ledger: pd.DataFrame) -> pd.DataFrame:
    """Per ``(arch, task)`` cell: its runs' worker-minutes (tune, train and second look together), the paired and
    floor ledger rows it is an arm of, how many of those are informative (decided or inconclusive, not
    "uninformative" or "not run"), and how many the shortcut floors left open before training
    (:func:`closed_before_training`). A cell with no informative row is paid for only by a figure or by nothing;
    one with no open row could not have paid for itself whatever its runs learned."""
    rows = ledger[ledger.kind.isin(["paired", "floor"])]
    rows = rows.assign(open=~closed_before_training(rows))
    arms = pd.concat([rows.assign(arch=rows.a), rows.assign(arch=rows.b)])
    arms = arms.assign(informative=~arms.verdict.astype(str).str.startswith(("uninformative", "not run")))
    read = arms.groupby(["arch", "task"]).agg(rows=("id", "size"), informative_rows=("informative", "sum"),
                                              open_rows=("open", "sum"))
    cost = runs.dropna(subset=["task"]).groupby(["arch", "task"]).agg(runs=("run_s", "size"),
                                                                      worker_min=("run_s", "sum"))
    cost["worker_min"] /= 60
    table = cost.join(read, how="left").fillna({"rows": 0, "informative_rows": 0, "open_rows": 0}).astype(
        {"rows": int, "informative_rows": int, "open_rows": int})
    return table.sort_values("worker_min", ascending=False)


def seeds_by_row(ledger: pd.DataFrame) -> pd.DataFrame:
    """The seeds each paired and floor ledger row was judged on, the look that judged it (2: the plan continued
    it) and its verdict, with what its power calculation still asks for where it stayed inconclusive."""
    rows = ledger[ledger.kind.isin(["paired", "floor"])]
    cols = [c for c in ["id", "verdict", "seeds", "look", "needs_seeds"] if c in rows]
    table = rows[cols].copy()
    if "needs_seeds" in table:
        # "underpowered": the name in ledgers written before 2026-12-06
        table["needs_seeds"] = table.needs_seeds.where(table.verdict.isin(("inconclusive", "underpowered")))
    return table.reset_index(drop=True)


DECIDED = ("held", "failed", "equivalent", "not equivalent")


def decided_paired(ledger: pd.DataFrame) -> int:
    """Paired ledger rows with a decision (held, failed, equivalent, not equivalent): what the plan buys."""
    return int(((ledger.kind == "paired") & ledger.verdict.isin(DECIDED)).sum())


def decided(summary: dict) -> tuple[int, int]:
    """(informative paired ledger rows, informative rows of every kind) from a report's ``summary.json``."""
    informative = summary.get("informative", {})
    return int(informative.get("paired", 0)), int(sum(informative.values()))


def profile_row(name: str, timing: dict) -> dict:
    """One profile's repro in the figures that carry across machines: its minutes beside its machine's ViT step
    time (``--phases``, one process alone) and its ViT runs' own step time in the study (every worker busy), and
    worker-minutes of training per informative paired row, also in thousands of ViT steps at that in-study step
    time (what carries across machines: docs/methods.md)."""
    t, d = timing["training"], timing.get("per_decision", {})
    steps = timing.get("machine_steps_s")
    vit_ms = steps["s"]["vit"] / steps["steps"] * 1e3 if steps and "vit" in steps.get("s", {}) else float("nan")
    in_study = t.get("ms_per_step", {}).get("vit", float("nan"))
    per, paired = d.get("worker_min_per_paired"), d.get("informative_paired", 0)
    return {"profile": name, "dvc_repro_min": timing["total"] / 60, "vit_ms_per_step": vit_ms,
            "vit_ms_in_study": in_study, "runs": t["runs"], "training_worker_min": t["worker_s"] / 60,
            "informative_paired": paired, "worker_min_per_informative_paired": per if per is not None else float("nan"),
            "kvit_steps_per_informative_paired": t["worker_s"] / in_study / paired if paired else float("nan")}


def breakdown(times: dict[str, float], runs: pd.DataFrame, workers: int, cpu: dict[str, float]) -> pd.DataFrame:
    per_stage = runs.groupby("stage").agg(runs=("fit_s", "size"), run_s=("run_s", "sum"), fit_s=("fit_s", "sum"),
                                          steps_s=("steps_s", "sum"))
    table = pd.DataFrame({"wall_s": pd.Series(times)}).join(per_stage, how="left").fillna(0)
    table["worker_s"] = table.wall_s * workers
    table["stage_cpu_s"] = pd.Series(cpu)
    # Share of the stage's worker time spent in optimizer steps (2 workers: the stage's wall time twice over).
    table["steps_share"] = (table.steps_s / table.worker_s).where(table.runs > 0)
    return table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log", type=Path, nargs="+", required=True, help="one log per attempt, in order")
    ap.add_argument("--repo", type=Path, required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("reports"))
    ap.add_argument("--phases", action="store_true",
                    help="also time 1000 training steps of vit, swin and resnet here (bench phases), so another "
                         "machine's repro can be compared with this one; run it on the repro's machine")
    ap.add_argument("--phases-from", type=Path, metavar="TIMING",
                    help="instead of --phases: the step times an earlier run of this command measured right after "
                         "the same repro (its repro_timing.json), e.g. to add a profile to --compare later")
    ap.add_argument("--compare", nargs="*", default=[], metavar="NAME=TIMING",
                    help="other profiles' repro_timing.json, tabled beside this one (e.g. quick=reports/quick/"
                         "repro_timing.json)")
    args = ap.parse_args(argv)
    times, total = stage_times(args.log)
    attempts = len(args.log)
    runs = run_rows(args.repo)
    table = breakdown(times, runs, args.workers, stage_cpu(args.log))
    train = table[table.runs > 0]
    sums = runs.groupby("arch")[["run_s", "fit_s", "steps_s", "optimizer_steps"]].sum(min_count=1)
    per_arch = runs.groupby("arch").agg(runs=("fit_s", "size"), mean_run_s=("run_s", "mean"),
                                        mean_fit_s=("fit_s", "mean"))
    per_arch["steps_share_of_run"] = sums.steps_s / sums.run_s
    per_arch["steps_share_of_fit"] = sums.steps_s / sums.fit_s
    # what another repro's machine is compared by (two workers stepping at once, as in every repro)
    per_arch["ms_per_step"] = sums.steps_s / sums.optimizer_steps * 1e3
    whole = runs[["run_s", "steps_s"]].sum(min_count=1)
    t = {"runs": int(train.runs.sum()), "wall_s": float(train.wall_s.sum()), "worker_s": float(train.worker_s.sum()),
         "steps_s": float(train.steps_s.sum()), "run_s": float(whole.run_s)}
    t |= {"steps_share": t["steps_s"] / max(t["worker_s"], 1e-9),
          "steps_share_of_runs": float(whole.steps_s / whole.run_s)}
    t["ms_per_step"] = {a: round(float(v), 3) for a, v in per_arch.ms_per_step.dropna().items()}
    # tune trials apart: they stop by the race (pipeline/tune.py), which the study's runs never do
    priced = runs.dropna(subset=["task", "optimizer_steps", "cap"])
    t["cells"] = cell_costs(priced[priced.stage != "tune"])
    t["tune_cells"] = cell_costs(priced[priced.stage == "tune"])
    timing = {**times, "total": total, "training": t}
    if args.phases_from is not None:
        kept = json.loads(args.phases_from.read_text()).get("machine_steps_s")
        if kept is None:
            raise SystemExit(f"error: --phases-from {args.phases_from}: no machine_steps_s (written by --phases)")
        timing["machine_steps_s"] = kept
    elif args.phases:
        from bench import overheads

        timing["machine_steps_s"] = {"steps": PHASE_STEPS, "s": {
            arch: overheads.breakdown(arch, PHASE_STEPS, repeat=1, time_imports=False)["phases"]["fit/steps"]
            for arch in PHASE_ARCHS}}
    savings = stop_savings(runs[runs.stage.isin(["train", "train_more", "tune"])])
    summary_path = args.repo / "reports" / "summary.json"
    paired, every = decided(json.loads(summary_path.read_text())) if summary_path.exists() else (0, 0)
    ledger_path = args.repo / "reports" / "tables" / "ledger.csv"
    n_decided = decided_paired(pd.read_csv(ledger_path)) if ledger_path.exists() else 0
    vit_ms = t["ms_per_step"].get("vit")
    timing["per_decision"] = {"informative_paired": paired, "informative": every,
                              "worker_min_per_paired": t["worker_s"] / 60 / paired if paired else None,
                              "decided_paired": n_decided,
                              "worker_min_per_decided_paired": t["worker_s"] / 60 / n_decided if n_decided else None,
                              "kvit_steps_per_decided_paired": (t["worker_s"] / (vit_ms / 1e3) / 1e3 / n_decided
                                                                if n_decided and vit_ms else None)}
    write_json(args.out / "repro_timing.json", timing)
    by_cell = cost_by_cell(runs, pd.read_csv(ledger_path)) if ledger_path.exists() else None
    others = []
    for item in args.compare:
        name, _, path = item.partition("=")
        if not path or not Path(path).is_file():
            raise SystemExit(f"--compare {item!r}: expected NAME=path/to/repro_timing.json (an existing file)")
        others.append(profile_row(name, json.loads(Path(path).read_text())))
    per_row = (f"**{t['worker_s'] / 60 / paired:.1f} worker-minutes of the training stages per informative paired "
               f"ledger row** ({t['worker_s'] / 60:.1f} worker-minutes, {paired} informative paired rows; "
               f"{t['worker_s'] / 60 / every:.1f} per informative row of any kind, {every} rows)"
               if paired else "no informative paired ledger row (or no reports/summary.json in --repo)")
    dec = timing["per_decision"]
    per_row += (f"; **{dec['worker_min_per_decided_paired']:.1f} worker-minutes per decided paired row** "
                f"({n_decided} decided: held, failed, equivalent or not equivalent"
                + (f"; {dec['kvit_steps_per_decided_paired']:.1f} thousand ViT steps each at this study's "
                   f"{vit_ms:.1f} ms per ViT step)" if vit_ms else ")")
                if n_decided else "; no decided paired row")
    saved, spent = savings.saved_min.sum(), savings.steps_min.sum()
    lines = [
        "# Full `dvc repro`: where the wall time went", "",
        "Written by `python -m bench.repro_breakdown` from the timestamped console of one fresh-clone `make repro` "
        f"(installation excluded) and the runs' metrics, over {attempts} attempt(s) (an interrupted repro resumes: "
        f"finished runs are kept, the others continue from their checkpoints). Stage time summed over the "
        f"attempts: **{total / 60:.1f} min**. "
        f"Training stages: {t['wall_s'] / 60:.1f} min of wall time; their {t['runs']} runs spent "
        f"{t['steps_s'] / 60:.1f} worker-minutes in optimizer steps out of {t['worker_s'] / 60:.1f} "
        f"({t['steps_share']:.0%}) with {args.workers} workers. Inside the runs themselves (the worker's time from "
        f"loading the data to the last evaluation, `measured.run_s`: {t['run_s'] / 60:.1f} worker-minutes), steps "
        f"take {t['steps_share_of_runs']:.0%}; the rest of a run is evaluation (natural-image subgroups and the "
        "resolution sweep included), validation and Lightning's loop. Outside the runs: process start and imports, "
        "the Dask cluster, the stage process writing outputs and MLflow while workers wait, and workers idle at a "
        "stage's end.", "",
        "## Per stage", "", table.reset_index(names="stage").to_markdown(index=False, floatfmt=".2f"), "",
        "## Per architecture (every run of the study)", "",
        per_arch.reset_index().to_markdown(index=False, floatfmt=".3f"), "",
        "## Cost per decided question", "",
        f"{per_row}: the machine-independent figure, up to the step time above (issue 33). Stops before the cap "
        f"(tune and train runs; `saved_min`: the steps a stopped run did not take, at its own measured seconds "
        f"per step) saved {saved:.1f} worker-minutes of optimizer steps against {spent:.1f} spent.", "",
        savings.reset_index().to_markdown(index=False, floatfmt=".1f"), "",
    ]
    if by_cell is not None:
        idle = by_cell[by_cell.informative_rows == 0]
        closed = by_cell[(by_cell.rows > 0) & (by_cell.open_rows == 0)]
        spent = by_cell.worker_min.sum()
        kept = (f" ({(spent - closed.worker_min.sum()) / n_decided:.1f} without them, against "
                f"{spent / n_decided:.1f} with them, per decided paired row inside the runs)" if n_decided else "")
        lines += ["## Cost by cell", "",
                  f"Each (arch, task) cell's runs in worker-minutes inside the runs (`measured.run_s`; tune, train "
                  f"and the second look), beside the paired and floor ledger rows it is an arm of, how many of "
                  f"those are informative, and how many the shortcut floors left open before any training (a "
                  f"paired row is closed where its compared slice's floor plus its margin is above 1: no accuracy "
                  f"clears it). Cells with no informative row: {len(idle)}, {idle.worker_min.sum():.1f} of "
                  f"{spent:.1f} worker-minutes (a figure may still read them). Cells whose every row was closed "
                  f"before training: {len(closed)}, {closed.worker_min.sum():.1f} worker-minutes, what a plan that "
                  f"read the floors first would not have bought{kept}.", "",
                  by_cell.reset_index().to_markdown(index=False, floatfmt=".1f"), ""]
    if ledger_path.exists():
        seeds = seeds_by_row(pd.read_csv(ledger_path))
        looks = seeds.look.value_counts().to_dict() if "look" in seeds else {}
        by_stage = table.worker_s.to_dict()
        first = sum(by_stage.get(s, 0.0) for s in ("teacher", "tune", "train")) / 60
        lines += ["## Seeds per row", "",
                  f"The seeds each paired and floor row was judged on: {looks.get(1, 0)} rows at the first look, "
                  f"{looks.get(2, 0)} continued by the plan to a second (docs/methods.md, sequential seeds). The "
                  f"first look (teacher, tune, train) took {first:.1f} worker-minutes of the stages, the second "
                  f"(`train_more`) {by_stage.get('train_more', 0.0) / 60:.1f}. `needs_seeds`: what the power "
                  f"calculation asks for where a row stayed inconclusive.", "",
                  seeds.fillna({"needs_seeds": ""}).to_markdown(index=False, floatfmt=".0f"), ""]
    if others:
        lines += ["## Profiles", "",
                  "Each profile's own repro: minutes of `dvc repro` beside the ViT step time of the machine it ran on "
                  "(`vit_ms_per_step`: `--phases`, one process alone; `vit_ms_in_study`: the study's ViT runs, every "
                  "worker busy), and worker-minutes of training per informative paired row, also as thousands of "
                  "ViT steps at the in-study step time (`kvit_steps_per_informative_paired`: the figure that carries "
                  "across machines; a machine slower under load than alone moves the minutes, not this). The seeds "
                  "each row of another profile received are in its report's `tables/seeds.md`.", "",
                  pd.DataFrame([profile_row("this repro", timing), *others]).to_markdown(index=False,
                                                                                        floatfmt=".1f"), ""]
    write_text(args.out / "repro_breakdown.md", "\n".join(lines))
    print(f"{total / 60:.1f} min total; wrote {args.out / 'repro_timing.json'} and {args.out / 'repro_breakdown.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
