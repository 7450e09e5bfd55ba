"""When each ledger row was registered: the commit from which its decision fields stood as they stand now.

A row of ``pipeline/report/contrasts.csv`` is registered at the oldest commit of the unbroken run of commits
(newest first) whose copy of the file holds the row with the same decision fields (arms, slice, direction,
margin, smallest effect of interest, learn slice). Editing any of them re-registers the row; editing its prose
does not. ``--write`` fills the ``registered`` (commit time, UTC) and ``registered_commit`` columns; ``--check``
exits 1 when they are stale. A row not yet committed cannot be registered: commit it, then write.

    python -m bench.registration --write
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
CSV = "pipeline/report/contrasts.csv"
FIELDS = ["a", "b", "subset", "expect", "margin", "sesoi", "learned_on"]
COLUMNS = ["registered", "registered_commit"]


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True).stdout


def history(path: str = CSV) -> list[tuple[str, str, pd.DataFrame]]:
    """(commit, commit time in UTC, the file at that commit) for every commit that changed it, newest first."""
    out = []
    for line in _git("log", "--format=%H %ct", "--", path).splitlines():
        sha, ts = line.split()
        when = datetime.fromtimestamp(int(ts), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        text = _git("show", f"{sha}:{path}")
        out.append((sha, when, pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)))
    return out


def _fields(frame: pd.DataFrame) -> dict[str, tuple]:
    cols = [c for c in FIELDS if c in frame.columns]
    return {r["id"]: tuple(r.get(c, "") for c in FIELDS) for r in frame[["id", *cols]].to_dict("records")}


def registrations(current: pd.DataFrame, versions: list[tuple[str, str, pd.DataFrame]]) -> pd.DataFrame:
    """``current`` with ``registered``/``registered_commit`` from ``versions`` (newest first); a row whose decision
    fields no commit holds gets empty ones (not registered yet)."""
    now = _fields(current)
    seen = [(sha, when, _fields(frame)) for sha, when, frame in versions]
    when_col, sha_col = [], []
    for rid, fields in now.items():
        found = ("", "")
        for sha, when, rows in seen:
            if rows.get(rid) != fields:
                break
            found = (when, sha[:12])
        when_col.append(found[0])
        sha_col.append(found[1])
    return current.drop(columns=[c for c in COLUMNS if c in current.columns]).assign(
        registered=when_col, registered_commit=sha_col)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="rewrite contrasts.csv's registration columns")
    ap.add_argument("--check", action="store_true", help="exit 1 when they are stale")
    args = ap.parse_args(argv)
    path = ROOT / CSV
    current = pd.read_csv(path, dtype=str, keep_default_na=False)
    got = registrations(current, history())
    if missing := list(got.loc[got.registered == "", "id"]):
        print(f"{CSV}: not committed with their current decision fields yet: {', '.join(missing)} "
              "(commit, then run --write)", file=sys.stderr)
    stale = not current.reindex(columns=got.columns, fill_value="").equals(got)
    if args.write and stale:
        got.to_csv(path, index=False)
        print(f"{CSV}: registration of {len(got)} rows written")
    elif args.check and stale:
        print(f"{CSV}: registration columns are stale: python -m bench.registration --write", file=sys.stderr)
        return 1
    else:
        print(got[["id", *COLUMNS]].to_string(index=False))
    return 1 if missing and args.check else 0


if __name__ == "__main__":
    raise SystemExit(main())
