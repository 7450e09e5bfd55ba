"""Seeds where the power calculation asks for them: does a profile give every inconclusive ledger row its seeds?

    python -m bench.seed_plan [--ledger reports/tables/ledger.csv] [--params profiles/large.yaml] [--check]

Reads the committed study's ledger (``seeds_needed``: the report's power calculation at the row's Holm-adjusted
alpha, pipeline/report/ledger.py) and counts the seeds the profile trains for each inconclusive row's arms: the
main-budget seeds of both arms of a paired row, of the one arm of a floor row, and of the arch under both budgets
of a budget row (``budget.<arch>.<task>.<mode><steps>``). Prints the ``train.grids`` entries that would supply
what is missing (YAML); ``--write`` replaces the profile's ``power_*`` grids with them (comments kept): in an
overlay (``profiles/<name>.yaml``, composed onto ``params.yaml``) as flow-style entries of its ``train.grids``, in a
full params file through DVC's own ``-S`` writer; ``--check`` exits 1 when anything is missing. Rows whose need
exceeds ``report.max_seeds`` (">200") are listed as out of reach: no profile decides an effect that small; rows
with a distilled student as an arm get no grid (students train on ``train.seeds``; the second look adds seeds).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path

import pandas as pd
import yaml
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from pipeline import profiles
from pipeline.config import load_params
from pipeline.errors import ConfigError
from pipeline.grid import student_keys, train_keys

PREFIX = "power_"  # the grids this script writes (and rewrites)
BUDGET_ID = re.compile(r"^budget\.(?P<arch>[^.]+)\.(?P<task>[^.]+)\.(?P<mode>[a-z]+)(?P<steps>\d+)$")


def seeds_of(params, arch: str, task: str, steps: int | None = None, mode: str | None = None) -> set[int]:
    """The seeds ``params`` trains ``arch`` on ``task`` with at the main size and draw, at ``steps``/``mode``
    (default: the main budget)."""
    t, r = params.train, params.train.recipe
    steps, mode = steps or r.steps, mode or r.budget_mode
    keys = train_keys(params, arch) if arch in t.archs else (
        student_keys(params, arch) if arch in params.distill.students else [])
    return {k.seed for k in keys if (k.task, k.train_size, k.steps, k.budget_mode, k.data_seed)
            == (task, t.size, steps, mode, 0)}


UNDECIDED = ("inconclusive", "underpowered")  # "underpowered": its name in ledgers written before 2026-12-06


def arms(row: pd.Series) -> list[tuple[str, int | None, str | None]]:
    """(arch, steps, mode) of each arm the row's seeds are counted on (None: the main budget)."""
    if m := BUDGET_ID.match(row["id"]):
        return [(m["arch"], int(m["steps"]), m["mode"]), (m["arch"], None, None)]
    return [(row["a"], None, None)] + ([(row["b"], None, None)] if row["kind"] == "paired" else [])


def plan(ledger: pd.DataFrame, params) -> pd.DataFrame:
    """Per inconclusive row: the seeds it needs, the seeds the profile gives its arms (the fewest), missing."""
    rows = []
    for _, row in ledger[ledger.verdict.isin(UNDECIDED)].iterrows():
        given = min(len(seeds_of(params, arch, row["task"], steps, mode)) for arch, steps, mode in arms(row))
        needed = None if pd.isna(row["seeds_needed"]) else int(row["seeds_needed"])
        rows.append({"id": row["id"], "needs": row["needs_seeds"], "needed": needed, "given": given,
                     "missing": max(0, needed - given) if needed is not None else None})
    return pd.DataFrame(rows, columns=["id", "needs", "needed", "given", "missing"])


def training_seeds(params, n: int) -> list[int]:
    """The first ``n`` seeds a run may train with: every seed but ``tune.seed`` (the trials' own)."""
    return [s for s in range(n + 1) if s != params.tune.seed][:n]


def grids(ledger: pd.DataFrame, table: pd.DataFrame, params) -> dict[str, dict]:
    """``train.grids`` entries that give each row still short of seeds its ``needed`` seeds on every arm. A row
    with a distilled student among its arms is left out: a grid lists architectures, and a student trains on
    ``train.seeds`` (the second look, ``plan.max_seeds``, is what gives it more)."""
    out = {}
    short = table[table.missing.fillna(0) > 0]
    for _, p in short.iterrows():
        row = ledger.set_index("id").loc[p["id"]]
        row_arms = arms(pd.Series({**row.to_dict(), "id": p["id"]}))
        if any(arch in params.distill.students for arch, _, _ in row_arms):
            continue
        for arch, steps, mode in row_arms:
            if len(seeds_of(params, arch, row["task"], steps, mode)) >= p["needed"]:
                continue  # this arm has its seeds already
            name = f"{PREFIX}{arch}_{row['task']}" + (f"_{mode}{steps}" if steps else "")
            grid = {"archs": [arch], "tasks": [row["task"]], "seeds": training_seeds(params, int(p["needed"]))}
            if steps:
                grid |= {"steps": [steps], "budget_mode": mode}
            if name not in out or len(out[name]["seeds"]) < len(grid["seeds"]):
                out[name] = grid
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ledger", type=Path, default=Path("reports/tables/ledger.csv"))
    ap.add_argument("--params", type=Path, default=Path("profiles/large.yaml"),
                    help="a profile's overlay (profiles/<name>.yaml) or a full params file")
    ap.add_argument("--check", action="store_true", help="exit 1 when a row within reach lacks seeds")
    ap.add_argument("--write", action="store_true",
                    help="replace the power_* grids of --params with what is missing (comments kept)")
    args = ap.parse_args(argv)
    ledger = pd.read_csv(args.ledger)
    overlay = is_overlay(args.params)
    with tempfile.TemporaryDirectory() as tmp:  # --write edits a copy; the profile changes only once it validates
        work = Path(tmp) / "params.yaml"
        if overlay:
            profiles.write(profiles.compose(args.params), work, args.params)
        else:
            shutil.copyfile(args.params, work)
        if args.write:  # a fresh plan: the grids an earlier ledger asked for go first
            from dvc.utils.hydra import apply_overrides

            # read raw: an earlier plan may no longer validate (a seed that is now a tune seed)
            grids_now = (yaml.safe_load(work.read_text()).get("train") or {}).get("grids") or {}
            stale = [g for g in grids_now if g.startswith(PREFIX)]
            if stale:
                apply_overrides(work, [f"~train.grids.{g}" for g in stale])
        params = load_params(work)
        table = plan(ledger, params)
        print(table.to_markdown(index=False) if len(table) else "no inconclusive row")
        needed = grids(ledger, table, params)
        if needed:
            print(f"\n# train.grids entries {args.params} lacks:")
            print(yaml.safe_dump(needed, sort_keys=False, default_flow_style=None))
        if args.write and overlay:
            write_overlay(args.params, needed)
        elif args.write:
            if needed:
                write(work, needed)
            shutil.copyfile(work, args.params)
        if args.write:
            print(f"{args.params}: {len(needed)} power grids")
            return 0
    return 1 if args.check and needed else 0


def is_overlay(path: Path) -> bool:
    return path.parent.name == profiles.DIR and profiles.base_of(path).is_file()


def write_overlay(overlay: Path, new: dict[str, dict]) -> None:
    """Replace the overlay's ``power_*`` grids with ``new``, one flow-style entry each (every other line kept);
    the overlay changes only once it still composes into valid params."""
    rt = YAML()
    rt.width = 116
    doc = rt.load(overlay.read_text())
    grids = (doc.get("train") or {}).get("grids")
    if not isinstance(grids, CommentedMap) or getattr(grids.tag, "value", None) != profiles.REPLACE:
        raise ConfigError(f"{overlay}: train.grids: power grids need the overlay to give it whole "
                          f"({profiles.REPLACE})")
    for name in [g for g in grids if g.startswith(PREFIX)]:
        del grids[name]
    for name, grid in new.items():
        entry = CommentedMap((k, _flow(CommentedSeq(v)) if isinstance(v, list) else v) for k, v in grid.items())
        grids[name] = _flow(entry)
    with tempfile.TemporaryDirectory() as tmp:
        trial = Path(tmp) / profiles.DIR / overlay.name
        trial.parent.mkdir()
        shutil.copyfile(profiles.base_of(overlay), Path(tmp) / "params.yaml")
        with trial.open("w") as f:
            rt.dump(doc, f)
        trial.write_text("".join(line.rstrip() + "\n" for line in trial.read_text().splitlines()))
        profiles.load(trial)  # a ConfigError leaves the overlay as it was
        shutil.copyfile(trial, overlay)


def _flow(node):
    node.fa.set_flow_style()
    return node


def write(path: Path, new: dict[str, dict]) -> None:
    """Add ``train.grids.<name>`` entries as ``dvc exp run -S +train.grids.<name>={...}`` would."""
    from dvc.utils.hydra import apply_overrides

    def value(v) -> str:
        return "[" + ",".join(map(str, v)) + "]" if isinstance(v, list) else str(v)

    overrides = ["+train.grids." + name + "={" + ",".join(f"{k}:{value(v)}" for k, v in grid.items()) + "}"
                 for name, grid in new.items()]
    apply_overrides(path, overrides)
    load_params(path)  # still a valid profile (a ConfigError leaves the caller's file as it was)


if __name__ == "__main__":
    sys.exit(main())
