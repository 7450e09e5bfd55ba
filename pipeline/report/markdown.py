"""Markdown: table pages and the generated ``reports/README.md`` (every sentence computed from the numbers).

Every table is rendered one way, :func:`md_table` (``DataFrame.to_markdown``).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from pipeline.report import stats
from pipeline.report.aggregate import CI_METHOD
from pipeline.report.gate import SPEED
from pipeline.report.ledger import counts, leads

MAX_FINDINGS = 5
LEADS_FIGURE = "figures/leads.png"  # embedded under the findings, not among the other figures


def md_table(df: pd.DataFrame, empty: str = "not run") -> str:
    """The one Markdown rendering of a table (or why it is empty); a ``|`` inside a cell is escaped."""
    if not len(df):
        return f"_{empty}_"
    text = df.apply(lambda col: col.map(lambda v: v.replace("|", r"\|") if isinstance(v, str) else v))
    return text.to_markdown(index=False, floatfmt=".4g")


def ci_text(mean: float, lo: float, hi: float, sign: bool = False) -> str:
    """``0.850 [0.815, 0.880]``; ``0.850 (no CI)`` without an interval; ``not run`` for a missing mean."""
    if mean != mean:
        return "not run"
    f = "{:+.3f}" if sign else "{:.3f}"
    return f.format(mean) + (f" [{f.format(lo)}, {f.format(hi)}]" if lo == lo else " (no CI)")


def table_page(title: str, note: str, df: pd.DataFrame, empty: str = "not run") -> str:
    """A Markdown page: title, what the numbers are (level, convention), the table (or why it is empty)."""
    return f"# {title}\n\n{note}\n\n{md_table(df, empty)}\n"


def floors_line(floors: dict[str, dict]) -> str:
    """One line with every task's shortcut floor (printed beside every accuracy table)."""
    if not floors:
        return "Shortcut floors: not computed (no data/shortcuts/<task>/floors.json)."
    parts = [f"{t} {r.get('floor', math.nan):.3f} ({r.get('floor_baseline', '?')}; chance {r.get('chance', 0):.3f}"
             + (f"; beside it, not counted: {r['beside_baseline']} {r['beside_floor']:.3f}" if "beside_floor" in r
                else "") + ")" for t, r in sorted(floors.items())]
    return "Shortcut floors (best baseline that does not use the task's factor): " + "; ".join(parts) + "."


def escape_line(floors: dict[str, dict], threshold: float) -> str:
    """Per task, the escape threshold beside its best one-object baseline (``*_alone`` in
    ``pipeline.shortcuts.OBJECTS``: a rule that reads one object's factor and ignores the other): an escape only
    shows that a model used more than one object where the threshold lies above that rule."""
    parts = []
    for task, rec in sorted(floors.items()):
        alone = {name: b["acc"] for name, b in rec.get("baselines", {}).items() if name.endswith("_alone")}
        if alone:
            name = max(alone, key=alone.get)
            side = "above it" if threshold > alone[name] else "NOT above it: an escape may read one object only"
            parts.append(f"{task} {alone[name]:.3f} ({name}; {side})")
    return (f"Escape threshold {threshold} against each task's best one-object baseline: " + "; ".join(parts) + "."
            if parts else "")


def floor_flags(floors: dict[str, dict], ceiling: float = 1.0, near: float = 0.1) -> list[str]:
    """Tasks whose floor is within ``near`` of the ceiling: they do not measure their factor."""
    return [t for t, r in sorted(floors.items()) if r.get("floor", 0) >= ceiling - near]


def accuracy_matrix(cells: pd.DataFrame) -> pd.DataFrame:
    """task x arch of ``mean [lo, hi]`` strings (the main grid's reading view), with "k/n" on bimodal cells."""
    if cells.empty:
        return pd.DataFrame()

    def cell(r) -> str:
        text = ci_text(r["mean"], r.ci_lo, r.ci_hi)
        return text + (f" ({r.k_escaped}/{r.n} escaped{'; needs more seeds' if 'more' in r.note else ''})"
                       if r.bimodal else "")

    view = cells.assign(cell=[cell(r) for _, r in cells.iterrows()])
    return view.pivot_table(index="task", columns="arch", values="cell", aggfunc="first").fillna("not run") \
        .reset_index().rename_axis(columns=None)


def ledger_view(ledger: pd.DataFrame) -> pd.DataFrame:
    """The ledger's reading view: the prediction, the measured difference with CI, Holm p, floor, verdict."""
    if ledger.empty:
        return ledger

    def what(r) -> str:
        if r.kind == "exact":
            return r.claim
        other = f"floor ({r.floor_baseline})" if r.kind == "floor" else r.b
        claim = {"+": "> 0", "0": "= 0 (within the margin)", "<=": "<= 0 (at most the floor)"}[r.expect]
        if r.subset == SPEED:
            return f"{r.a} - {other}: share of the step cap left at train.criterion {claim}"
        return f"{r.a} - {other} on {r.subset} {claim}"

    def measured(r) -> str:
        if r.verdict == "not run":
            return "-"
        if r.kind == "exact" and r.detail:
            return r.detail
        if r.kind == "exact":
            return f"pair accuracy {r.estimate:.4f} (min {r.ci_lo:.4f}, max {r.ci_hi:.4f}); max logit diff " \
                   f"{r.max_logit_diff:.2g} ({r.seeds} seeds)"
        items = f", {r['items']} items" if r["items"] else ""  # a speed row is per run, not per item
        return f"{ci_text(r.estimate, r.ci_lo, r.ci_hi, sign=True)}; Holm p {r.p_holm:.3g} ({r.seeds} seeds{items})"

    def verdict(r) -> str:
        said = inconclusive_text(r) if r.verdict == "inconclusive" else r.verdict
        return f"{said} (look 2)" if getattr(r, "look", 1) == 2 else said

    labels = ledger["label"] if "label" in ledger else ledger["id"]
    return pd.DataFrame({"id": ledger["id"], "row": labels, "task": ledger["task"],
                         "prediction": [what(r) for _, r in ledger.iterrows()],
                         "isolates": ledger["isolates"],
                         "measured (95% CI)": [measured(r) for _, r in ledger.iterrows()],
                         "shortcut floor": [f"{f:.3f}" if f == f else "n/a" for f in ledger["floor"]],
                         "verdict": [verdict(r) for _, r in ledger.iterrows()],
                         "context": ledger["context"]})


def _explained(path: Path) -> tuple[dict, ...]:
    """``explained.csv``: ledger rows (id prefix) whose failure a finding's own explanation predicts, with why."""
    return tuple(pd.read_csv(path, dtype=str, keep_default_na=False).to_dict("records"))


EXPLAINED = _explained(Path(__file__).with_name("explained.csv"))
ROW_TYPES = ("paired", "floor", "exact", "budget")
FINDING_RULE = (
    "How a finding is labelled (pipeline/report/markdown.py: `finding_status`). Only informative rows count "
    "(verdict neither `uninformative` nor `not run`); its lead is the first pre-registered row of its group that "
    "ran, never picked by outcome. In this order: 'smoke' for natural images when none of its rows is informative "
    "(it counts as no finding: the natural profiles decide it); 'undecided' when the lead is uninformative or "
    "inconclusive; "
    "'contradicted' when the lead failed, or when another informative row of the group failed and the finding "
    "does not explain that failure (`pipeline/report/explained.csv` names the rows whose failure a finding's own "
    "explanation predicts, with the reason); 'no effect' when the lead is equivalent; otherwise 'supported' (lead "
    "held). Where a lead's arm sits below the stronger reference shown beside the floor (natural images: the pooled "
    "bag of patches), the label says so; where a decided lead's arms learned in different numbers of seeds and "
    "Fisher's exact test on those counts does not reach alpha, it says that too (its t test assumes normal spread: "
    "docs/methods.md, Error rates). An explained failure never counts as support. Each finding lists the rows "
    "that support it (held), contradict it, the failures it explains, and how many of its rows were uninformative "
    "(reasons: the ledger).")


def verdict_counts(ledger: pd.DataFrame) -> dict[str, int]:
    """Rows per verdict: every verdict of :data:`ledger.VERDICTS` (zeros included), `uninformative` always."""
    out = counts(ledger)
    out.setdefault("uninformative", int((ledger["verdict"] == "uninformative").sum()) if len(ledger) else 0)
    return out


def row_type(ledger: pd.DataFrame) -> pd.Series:
    """paired / floor / exact, and budget for the budget axis's paired rows (read apart: same arch twice)."""
    return ledger["kind"].where(ledger["finding"] != "budget", "budget")


def uninformative(ledger: pd.DataFrame) -> pd.Series:
    """Rows the ledger's gate set aside (verdict or flag); a frame without either reads every row informative."""
    flag = ledger["uninformative"].eq(True) if "uninformative" in ledger else False  # None, NaN: informative
    return (ledger["verdict"] == "uninformative") | flag


def informative(ledger: pd.DataFrame) -> pd.Series:
    return ~uninformative(ledger) & (ledger["verdict"] != "not run")


DECIDED = ("held", "failed", "not equivalent", "equivalent")  # verdicts that answer a row's question


def inconclusive_text(r) -> str:
    """What an inconclusive row could and could not see: the smallest effect it had the power to detect at its
    seeds, and the seeds its smallest effect of interest asks for."""
    det = getattr(r, "detectable", float("nan"))
    could = "" if det != det else f"could detect {det:.3g} at {r.seeds} seeds; " if det <= 1 else \
        f"no effect within the accuracy scale detectable at {r.seeds} seeds; "  # power too low for any effect
    ses = getattr(r, "sesoi", float("nan"))
    return f"inconclusive ({could}{r.needs_seeds} seeds for its effect of interest {ses:.3g})" if ses == ses \
        else f"inconclusive ({could}needs {r.needs_seeds} seeds)"


def row_counts(ledger: pd.DataFrame) -> dict[str, dict[str, int]]:
    """Per row type: rows, informative, uninformative, decided (held / failed / not equivalent / equivalent),
    inconclusive,
    not run."""
    if ledger.empty:
        return {}
    t = ledger.assign(type=row_type(ledger), is_info=informative(ledger), is_uninf=uninformative(ledger))
    out = {}
    for name in [*ROW_TYPES, *sorted(set(t["type"]) - set(ROW_TYPES))]:
        g = t[t["type"] == name]
        if len(g):
            out[name] = {"rows": len(g), "informative": int(g.is_info.sum()), "uninformative": int(g.is_uninf.sum()),
                         "decided": int((g.is_info & g.verdict.isin(DECIDED)).sum()),
                         "inconclusive": int((g.is_info & (g.verdict == "inconclusive")).sum()),
                         "not run": int((g.verdict == "not run").sum())}
    return out


def counts_text(rows: dict[str, dict[str, int]]) -> str:
    """The README's per-row-type sentence: how many rows of each type were decided."""
    parts = [f"{name}: {c['decided']} of {c['rows']} decided ({c['informative']} informative, of which "
             f"{c['inconclusive']} inconclusive; {c['uninformative']} uninformative; {c['not run']} not run)"
             for name, c in rows.items()]
    return "Rows decided, by type: " + "; ".join(parts) + "." if parts else "No ledger rows."


def explains(finding: str, row_id: str, explained: tuple[dict, ...] = EXPLAINED) -> str | None:
    """Why ``finding`` predicts that row ``row_id`` fails (None when it does not)."""
    for e in explained:
        if e["finding"] == finding and (row_id == e["row"] or row_id.startswith(e["row"] + ".")):
            return e["reason"]
    return None


# Findings that read "smoke" where none of their rows is informative, never "undecided", and count as no finding:
# the CPU default's CIFAR-10 cells sit below the position-free floors, so its natural rows cannot decide anything
# (issue 55); the natural profiles are where they are meant to be decided.
SMOKE = {"natural": "see the natural profiles (profiles/natural-cpu.yaml, profiles/natural.yaml)"}


def beside_note(lead: pd.Series) -> str:
    """The lead's arms below the stronger reference shown beside its floor (natural: the quadrant-pooled bags,
    ``beside_floor`` on the row's slice), in words; empty when there is none or both arms clear it."""
    bf = lead.get("beside_floor", math.nan)
    if lead.get("kind") != "paired" or not isinstance(bf, float) or bf != bf:
        return ""
    low = [f"{arm} {acc:.3f}" for arm, acc in ((lead.a, lead.acc_a), (lead.b, lead.acc_b)) if acc < bf]
    return f"below the pooled floor {lead.beside_baseline} {bf:.3f}: {', '.join(low)}" if low else ""


DECIDED = ("held", "failed", "equivalent", "not equivalent")


def seeds_caveat(lead: pd.Series, alpha: float) -> str:
    """Where a decided paired lead's arms learned in different numbers of seeds and the exact test on those counts
    (:func:`stats.counts_p`) does not reach ``alpha``: the counts and that p, in words; empty otherwise. The row's
    t test reads seeds that learn or stay at chance as normal spread, which they are not (3 of 3 against 0 of 3
    gives p ~ 1e-5 where no test free of that assumption reaches 0.01: docs/methods.md, Error rates)."""
    k_a, k_b, n = (lead.get(c, math.nan) for c in ("learned_a", "learned_b", "seeds"))
    if lead.get("kind") != "paired" or lead.get("verdict") not in DECIDED or not pd.notna([k_a, k_b, n]).all() \
            or k_a == k_b:
        return ""
    p = stats.counts_p(int(k_a), int(k_b), int(n))
    return f"its arms learned in {int(k_a)} and {int(k_b)} of {int(n)} seeds (Fisher's exact p = {p:.2f})" \
        if p > alpha else ""


def finding_status(name: str, group: pd.DataFrame, lead: pd.Series, alpha: float | None = None,
                   explained: tuple[dict, ...] = EXPLAINED) -> dict:
    """The label of one finding and the row ids behind it (the rule: :data:`FINDING_RULE`); ``beside``: where its
    lead's arms sit below the stronger reference shown beside the floor (:func:`beside_note`); ``caveat``: where its
    decided lead's p rests on seeds that learned against seeds that did not (:func:`seeds_caveat` at ``alpha``;
    none without one: the callers that read the label only)."""
    g = group.assign(is_info=informative(group), is_uninf=uninformative(group))
    # the lead states the finding: its own outcome is never "explained" away
    why = {r.id: None if r.id == lead["id"] else explains(name, r.id, explained) for r in g.itertuples()}
    failed = g[g.is_info & g.verdict.isin(["failed", "not equivalent"])]
    out = {"supports": [r.id for r in g[g.is_info & (g.verdict == "held")].itertuples() if why[r.id] is None],
           "contradicts": [r.id for r in failed.itertuples() if why[r.id] is None],
           "explained": {r.id: why[r.id] for r in failed.itertuples() if why[r.id] is not None},
           "uninformative": [r.id for r in g[g.is_uninf].itertuples()]}
    lead_uninf = bool(uninformative(lead.to_frame().T).iloc[0])
    if lead.verdict == "not run":
        label = "not run"
    elif lead_uninf and name in SMOKE and not g.is_info.any():
        label = f"smoke (no row of it is informative at this scale; {SMOKE[name]})"
    elif lead_uninf:
        reason = lead.get("reason", "")
        label = f"undecided (lead uninformative{': ' + reason if isinstance(reason, str) and reason else ''})"
    elif lead.verdict == "inconclusive":
        label = f"undecided ({inconclusive_text(lead).replace('inconclusive (', 'inconclusive: ', 1)[:-1]})"
    elif lead.verdict in ("failed", "not equivalent") or out["contradicts"]:
        label = "contradicted"
    elif lead.verdict == "equivalent":
        label = "no effect (equivalent)"
    else:
        label = "supported"
    caveat = "" if alpha is None else seeds_caveat(lead, alpha)
    return {"label": label, "beside": "" if lead_uninf else beside_note(lead), "caveat": caveat, **out}


def _ids(ids) -> str:
    return ", ".join(f"`{i}`" for i in ids) or "none"


def findings(ledger: pd.DataFrame, alpha: float | None = None) -> list[str]:
    """At most five findings, one per ledger ``finding`` group, in plain words first: its label
    (:func:`finding_status`), what its lead row compares (the row's human label) and its difference with CI (only
    when the lead is informative); then the lead's id, slice and what it isolates, the shortcut floor, and the row
    ids that support it, contradict it, or whose failure it explains, and at ``alpha`` the lead's seeds caveat
    (:func:`seeds_caveat`). Generated from the ledger only."""
    out = []
    for name, g, lead in leads(ledger)[:MAX_FINDINGS]:
        st = finding_status(name, g, lead, alpha)
        label = lead.get("label") if isinstance(lead.get("label"), str) and lead.get("label") else lead["id"]
        pair = f"{lead.a} vs {lead.b or 'exact'}" if lead.kind != "floor" else f"{lead.a} vs shortcut floor"
        if st["label"].startswith(("undecided (lead", "not run", "smoke")):
            measured = "not stated (its lead is not informative)"
        else:
            measured = ci_text(lead.estimate, lead.ci_lo, lead.ci_hi, sign=lead.kind != "exact")
            n = lead.get("seeds", math.nan)
            measured += f" ({int(n)} seeds)" if n == n and n is not None and lead.kind != "exact" else ""
        floor = f"{lead.floor:.3f} ({lead.floor_baseline})" if lead.floor == lead.floor else "not computed"
        expl = "; ".join(f"`{i}` ({why})" for i, why in st["explained"].items()) or "none"
        short, _, why = st["label"].partition(" (")
        why = f" Why {short}: {why.removesuffix(')')}." if why else ""
        why += f" But {st['caveat']}: its t test assumes normal spread (docs/methods.md, Error rates)." \
            if st["caveat"] else ""
        short += f" ({st['beside']})" if st["beside"] else ""
        out.append(f"**{name}: {short}.** {label}: {measured}.{why} Minimal pair {pair} on {lead.task} (lead "
                   f"`{lead['id']}`, {lead.subset}; isolates {lead.isolates}). Shortcut floor {floor}. Supported by "
                   f"{_ids(st['supports'])}; contradicted by {_ids(st['contradicts'])}; failures it explains: "
                   f"{expl}; uninformative: {len(st['uninformative'])} of {len(g)} rows (reasons in the ledger).")
    return out


def exploratory_line(ledger: pd.DataFrame) -> str:
    """The rows no finding stands on: registered after this data draw was first used (or generated from params),
    with their verdicts; empty when there are none."""
    if "registration" not in ledger.columns:
        return ""
    ex = ledger[ledger.registration == "exploratory"]
    if ex.empty:
        return ""
    tally = ", ".join(f"{n} {v}" for v, n in ex.verdict.value_counts().items())
    return (f"Exploratory rows ({len(ex)}: {tally}) were registered after this data draw was first used "
            "(`report.registered_before`), or are generated from params (budget rows): reported in "
            "[the ledger](tables/ledger.csv) (column `registration`), never used for a finding. Confirmatory: "
            f"{int((ledger.registration == 'confirmatory').sum())} rows, exact: "
            f"{int((ledger.registration == 'exact').sum())}.")


def readme(*, commit: str, date: str, level: float, scale: str, sentences: list[str], floors_text: str,
           counts: dict, tables: dict[str, str], figures: dict[str, tuple[str, str]], links: dict[str, str],
           rows: dict[str, dict[str, int]] | None = None, exploratory: str = "") -> str:
    """reports/README.md. counts: rows per verdict; rows: :func:`row_counts`; tables: name -> relative path
    (.md; a .csv lies beside it); figures: path -> (title, caption); links: label -> relative path of other
    stages' reports."""
    tally = ", ".join(f"{v} {k}" for k, v in counts.items())
    leads_figure = {k: v for k, v in figures.items() if k == LEADS_FIGURE}
    lines = [
        "# Where does a vision model put its inductive bias? Results", "",
        f"Generated by the `report` stage from commit `{commit}` on {date} (`dvc repro report`). "
        "Every number below is computed from the per-run files DVC tracks; nothing about results is hand-written.",
        "", "## Findings", "",
        "A finding is **supported** when its pre-registered lead row held its Holm-corrected test and passed the "
        "gate (both arms learned the task; the winning arm clears every shortcut floor on the compared "
        "slice), **undecided** when the lead decides nothing yet (the reason follows), **contradicted** or **no "
        "effect** when it failed or came out equivalent (the whole rule below).", "",
        *[f"{i}. {s}" for i, s in enumerate(sentences, 1)], "",
        *[f"![{title}]({path})\n\n{caption}\n" for path, (title, caption) in leads_figure.items()],
        f"Intervals: {level:.0%} {CI_METHOD}. Our runs are tiny ({scale}) and far smaller than the papers "
        "quoted in the [anchors](tables/anchors.md).", "", FINDING_RULE, "",
        *([exploratory, ""] if exploratory else []),
        floors_text, "", f"Prediction ledger: {tally} ([ledger](tables/ledger.md)). {counts_text(rows or {})}", "",
        "## Tables (Markdown; CSV beside each)", "",
        *[f"- [{name}]({path}) ([csv]({path.removesuffix('.md')}.csv))" for name, path in tables.items()], "",
        "## Figures", "",
    ]
    figures = {k: v for k, v in figures.items() if k != LEADS_FIGURE}
    for path, (title, caption) in figures.items():
        lines += [f"### {title}", "", f"![{title}]({path})", "", caption, ""]
    lines += ["## Other stages' reports", "", *[f"- [{k}]({v})" for k, v in links.items()], ""]
    lines += BROWSE
    return "\n".join(lines)


# The tools a reader opens; the screenshots are taken and checked by `python -m bench.screenshots`.
BROWSE = [
    "## Browse the runs", "",
    "`make mlflow-ui` (`make mlflow-ui PORT=5123` for another port) prints each experiment's link on the address it "
    "serves, then serves the UI; the link opens the experiment's runs with the headline columns (test accuracy, in- "
    "and out-of-distribution slices, budget): "
    "`http://127.0.0.1:<port>/#/experiments/<id>/runs?workflowType=machine_learning&viewStateShareKey=headline`. "
    "Every run of a stage invocation is nested under one parent run; a run's network is a logged model (the Models "
    "tab), its accuracy per slice, budget and timings one table (`scalars.csv`); a student's run carries its "
    "teacher's run id, artifact and sha256. `dvc plots show` draws every plot offline.", "",
    "![MLflow runs table](screens/mlflow_runs.png)", "", "![A distilled student's run](screens/mlflow_student.png)",
    "", "![DVC plots](screens/dvc_plots.png)", "",
    "Taken and checked (DOM assertions) by `python -m bench.screenshots --store mlflow.db --out reports/screens`.", "",
]


def nan_to_none(obj):
    """JSON-safe copy: NaN -> None (dvc metrics cannot compare NaN)."""
    if isinstance(obj, dict):
        return {k: nan_to_none(v) for k, v in obj.items()}
    if isinstance(obj, float) and math.isnan(obj):
        return None
    return obj
