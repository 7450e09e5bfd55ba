"""Registration: when each ledger row took its decision fields (from git), and which rows a finding may stand on."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest

from bench import registration
from pipeline.report import ledger, markdown

ROOT = Path(__file__).resolve().parents[1]


def _csv(**rows) -> pd.DataFrame:
    return pd.DataFrame([{"id": rid, "a": a, "b": "vit", "subset": "test", "expect": "+", "margin": m, "sesoi": m,
                          "learned_on": "", "isolates": prose} for rid, (a, m, prose) in rows.items()])


def test_a_row_is_registered_when_its_decision_fields_last_changed_not_its_prose():
    oldest = _csv(x=("resnet", "0.06", "old words"), y=("resnet", "0.06", ""))
    middle = _csv(x=("resnet", "0.04", "old words"), y=("resnet", "0.06", ""))  # x's margin changed here
    newest = _csv(x=("resnet", "0.04", "new words"), y=("resnet", "0.06", ""))  # prose only
    history = [("c" * 40, "2026-12-03T00:00:00Z", newest), ("b" * 40, "2026-12-02T00:00:00Z", middle),
               ("a" * 40, "2026-12-01T00:00:00Z", oldest)]
    now = pd.concat([newest, _csv(z=("swin", "0.01", ""))], ignore_index=True)  # z: not committed yet
    got = registration.registrations(now, history).set_index("id")
    assert got.loc["x", "registered"] == "2026-12-02T00:00:00Z" and got.loc["x", "registered_commit"] == "b" * 12
    assert got.loc["y", "registered"] == "2026-12-01T00:00:00Z"
    assert got.loc["z", "registered"] == "" and got.loc["z", "registered_commit"] == ""


def test_committed_registrations_are_current():
    shallow = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"],
                             capture_output=True, text=True)
    if shallow.returncode or shallow.stdout.strip() != "false":
        pytest.skip("needs the repository's full git history")
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", registration.CSV],
                           capture_output=True, text=True).stdout
    if dirty.strip():
        pytest.skip(f"{registration.CSV} has uncommitted edits")
    assert registration.main(["--check"]) == 0
    table = pd.read_csv(ROOT / registration.CSV, dtype=str, keep_default_na=False)
    assert (table.registered != "").all() and table.registered_commit.str.fullmatch("[0-9a-f]{12}").all()


def test_findings_stand_on_confirmatory_rows_only():
    cutoff = datetime(2026, 12, 6, 7, 20, tzinfo=UTC)
    assert ledger.registration({"kind": "paired", "registered": "2026-12-06T03:42:46Z"}, cutoff) == "confirmatory"
    assert ledger.registration({"kind": "paired", "registered": "2026-12-06T08:00:00Z"}, cutoff) == "exploratory"
    assert ledger.registration({"kind": "paired", "registered": ""}, cutoff) == "exploratory"  # a budget row
    assert ledger.registration({"kind": "paired", "registered": "2026-12-06T03:42:46Z"}, None) == "exploratory"
    assert ledger.registration({"kind": "exact"}, None) == "exact"
    table = pd.DataFrame([
        {"id": "scale.a", "finding": "scale", "verdict": "held", "registration": "exploratory"},
        {"id": "scale.b", "finding": "scale", "verdict": "inconclusive", "registration": "confirmatory"},
        {"id": "budget.x", "finding": "budget", "verdict": "held", "registration": "exploratory"}])
    leads = ledger.leads(table)
    assert [(name, lead["id"]) for name, _, lead in leads] == [("scale", "scale.b")]  # the held row is exploratory
    line = markdown.exploratory_line(table)
    assert line.startswith("Exploratory rows (2: 2 held)") and "Confirmatory: 1 rows" in line
    assert markdown.exploratory_line(table.assign(registration="confirmatory")) == ""
