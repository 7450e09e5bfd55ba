"""bench.repro_breakdown on a hand-written console and two runs: stage times, the stage process's CPU, shares."""

from __future__ import annotations

import json

from bench import repro_breakdown

LOG = """\
100.0 Running stage 'data@alignment':
102.5 > python -m pipeline.stages.generate ...
103.0 Running stage 'train':
150.0 train: 2 runs; the stage process used 7.5 s of CPU (imports, input checks, writing outputs, MLflow)
160.0 Updating lock file 'dvc.lock'
"""


def run(tmp, arch, run_s, fit, steps):
    folder = tmp / "data/runs" / arch / "alignment/n1-t1-s0-d0"
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps({"arch": arch, "teacher": None, "budget": {"optimizer_steps": 400},
                                                     "measured": {"run_s": run_s, "phases_s": {"fit": fit,
                                                                                               "steps": steps}}}))


def test_breakdown_of_a_small_repro(tmp_path):
    log = tmp_path / "repro.log"
    log.write_text(LOG)
    run(tmp_path, "vit", 50.0, 45.0, 40.0)
    run(tmp_path, "resnet", 60.0, 55.0, 50.0)
    times, total = repro_breakdown.stage_times([log])
    assert times == {"data@alignment": 3.0, "train": 57.0} and total == 60.0
    assert repro_breakdown.stage_cpu([log]) == {"train": 7.5}
    table = repro_breakdown.breakdown(times, repro_breakdown.run_rows(tmp_path), 2, {"train": 7.5})
    row = table.loc["train"]
    assert (row.runs, row.run_s, row.steps_s, row.worker_s, row.stage_cpu_s) == (2, 110.0, 90.0, 114.0, 7.5)
    assert row.steps_share == 90.0 / 114.0
    assert repro_breakdown.main(["--log", str(log), "--repo", str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out/repro_breakdown.md").read_text()
    assert "`measured.run_s`: 1.8 worker-minutes), steps take 82%" in text  # 90 of 110 s inside the runs
    timing = json.loads((tmp_path / "out/repro_timing.json").read_text())
    assert timing["total"] == 60.0 and timing["training"]["steps_share_of_runs"] == 90.0 / 110.0
    assert timing["training"]["ms_per_step"] == {"resnet": 125.0, "vit": 100.0}  # 50 s and 40 s over 400 steps


def test_quick_profile_is_scaled_by_this_machines_steps():
    from bench.__main__ import REFERENCE_STEPS, render_quick

    ref = REFERENCE_STEPS["s"]["vit"]  # seconds per REFERENCE_STEPS["steps"] steps on the reference machine
    quick = {"train": 3000.0, "report": 600.0, "total": 3600.0,
             "training": {"runs": 10, "wall_s": 3000.0, "steps_share": 0.8, "steps_share_of_runs": 0.9}}
    twice = [{"arch": "vit", "steps": 500, "phases": {"fit/steps": ref}}]  # half the steps in the same time
    text = "\n".join(render_quick(quick, twice, {"ledger": {"held": 1}}, {"ledger": {"held": 2}}))
    assert "take 2.00x as long" in text and "**30.0 min**" in text and "30 min: met" in text
    assert "at this profile: held 1; at the default (`reports/summary.json`): held 2" in text
    slower = [{"arch": "vit", "steps": 500, "phases": {"fit/steps": ref * 0.9}}]
    assert "30 min: missed" in "\n".join(render_quick(quick, slower, None, None))
    assert render_quick(None, twice, None, None) == []


def test_verdict_changes_between_the_default_and_the_quick_ledger():
    import pandas as pd

    from bench.__main__ import verdict_changes

    default = pd.DataFrame({"id": ["a", "b", "c", "d", "e"],
                            "verdict": ["held", "held", "failed", "underpowered", "equivalent"]})
    quick = pd.DataFrame({"id": ["a", "b", "c", "d"], "verdict": ["held", "underpowered", "held", "failed"]})
    (line,) = verdict_changes(default, quick)
    assert line.startswith("Of its 4 ledger rows, 4 are also the default's (5 rows): 1 with the same verdict;")
    assert "1 decided at the default and not here (b)" in line
    assert "1 decided both ways with another verdict (c: failed -> held)" in line
    assert "1 undecided at the default and decided here (d: failed)" in line
