"""bench.repro_breakdown on a hand-written console and two runs: stage times, the stage process's CPU, shares."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from bench import repro_breakdown

LOG = """\
100.0 Running stage 'data@alignment':
102.5 > python -m pipeline.stages.generate ...
103.0 Running stage 'train':
150.0 train: 2 runs; the stage process used 7.5 s of CPU (imports, input checks, writing outputs, MLflow)
160.0 Updating lock file 'dvc.lock'
"""


def run(tmp, arch, run_s, fit, steps, under="runs", cap=400, stop="cap"):
    folder = tmp / "data" / under / arch / "alignment/n1-t1-s0-d0"
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps({"arch": arch, "task": "alignment", "teacher": None,
                                                     "budget": {"optimizer_steps": 400},
                                                     "steps": cap, "stop_reason": stop,
                                                     "measured": {"run_s": run_s, "phases_s": {"fit": fit,
                                                                                               "steps": steps}}}))


def test_breakdown_of_a_small_repro(tmp_path):
    log = tmp_path / "repro.log"
    log.write_text(LOG)
    run(tmp_path, "vit", 50.0, 45.0, 40.0)
    run(tmp_path, "resnet", 60.0, 55.0, 50.0)
    other = tmp_path / "with_tune"
    run(other, "vit", 50.0, 45.0, 40.0)
    run(other, "vit", 9.0, 8.0, 7.0, under="tune/runs/lr0.002")  # a tune trial is the tune stage's, not train's
    assert repro_breakdown.run_rows(other).groupby("stage").size().to_dict() == {"train": 1, "tune": 1}
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
    # the step times measured right after a repro, kept when the breakdown is written again (a profile added later)
    kept = {"steps": 1000, "s": {"vit": 9.5}}
    (tmp_path / "out/repro_timing.json").write_text(json.dumps({**timing, "machine_steps_s": kept}))
    assert repro_breakdown.main(["--log", str(log), "--repo", str(tmp_path), "--out", str(tmp_path / "out"),
                                 "--phases-from", str(tmp_path / "out/repro_timing.json")]) == 0
    assert json.loads((tmp_path / "out/repro_timing.json").read_text())["machine_steps_s"] == kept
    plain = tmp_path / "plain.json"
    plain.write_text("{}")
    with pytest.raises(SystemExit, match="no machine_steps_s"):
        repro_breakdown.main(["--log", str(log), "--repo", str(tmp_path), "--out", str(tmp_path / "o2"),
                              "--phases-from", str(plain)])


def test_cost_per_decided_question_and_what_stops_saved(tmp_path):
    log = tmp_path / "repro.log"
    log.write_text(LOG)
    run(tmp_path, "vit", 50.0, 45.0, 40.0, cap=1000, stop="criterion")  # 600 steps not taken at 0.1 s each
    run(tmp_path, "resnet", 60.0, 55.0, 50.0)  # at its cap: saved nothing
    savings = repro_breakdown.stop_savings(repro_breakdown.run_rows(tmp_path))
    assert savings.saved_min.to_dict() == {"cap": 0.0, "criterion": 1.0}
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports/summary.json").write_text(json.dumps({"informative": {"paired": 3, "floor": 1}}))
    assert repro_breakdown.main(["--log", str(log), "--repo", str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out/repro_breakdown.md").read_text()
    # the train stage's 57 s of wall time on 2 workers: 1.9 worker-minutes over 3 informative paired rows
    assert "**0.6 worker-minutes of the training stages per informative paired ledger row**" in text
    assert "saved 1.0 worker-minutes of optimizer steps against 1.5 spent" in text
    # cost by cell: vit feeds one informative row, resnet only an uninformative one
    (tmp_path / "reports/tables").mkdir()
    pd.DataFrame({"id": ["p.alignment", "f.alignment", "x.alignment"], "kind": ["paired", "floor", "exact"],
                  "task": "alignment", "a": ["vit", "resnet", "vit"], "b": ["resnet", "floor", ""],
                  "verdict": ["held", "uninformative", "held"]}).to_csv(tmp_path / "reports/tables/ledger.csv")
    by_cell = repro_breakdown.cost_by_cell(repro_breakdown.run_rows(tmp_path),
                                           pd.read_csv(tmp_path / "reports/tables/ledger.csv"))
    # per decided paired row: one held paired row buys the 1.9 worker-minutes (the floor and exact rows do not count)
    assert repro_breakdown.main(["--log", str(log), "--repo", str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out/repro_breakdown.md").read_text()
    assert "**1.9 worker-minutes per decided paired row** (1 decided" in text
    decision = json.loads((tmp_path / "out/repro_timing.json").read_text())["per_decision"]
    assert decision["decided_paired"] == 1 and decision["worker_min_per_decided_paired"] == pytest.approx(1.9)
    assert by_cell.loc[("vit", "alignment")].tolist() == [1, 50 / 60, 1, 1, 1]
    assert by_cell.loc[("resnet", "alignment")].tolist() == [1, 1.0, 2, 1, 2]  # the paired row and its floor row
    # a slice whose shortcut floor plus the margin is above 1 closes its paired rows before training (not an
    # agreement row, held to no floor; not a floor row)
    floors = pd.DataFrame({"kind": ["paired", "paired", "paired", "floor"], "floor": [0.97, 0.95, 0.97, 0.97],
                           "margin": [0.04, 0.04, 0.04, 0.04], "expect": ["+", "= 0", "+", "+"], "a": "vit",
                           "b": "resnet", "subset": ["slice/ood", "slice/ood", "agree/ood_teacher_wrong", "slice/ood"]})
    assert repro_breakdown.closed_before_training(floors).tolist() == [True, False, False, False]
    # the seeds each row was judged on, and what an inconclusive one still needs
    ledger = pd.DataFrame({"id": ["p", "q", "f", "x"], "kind": ["paired", "paired", "floor", "exact"],
                           "task": "alignment", "a": "vit", "b": ["resnet", "resnet", "floor", ""],
                           "verdict": ["held", "inconclusive", "held", "held"], "seeds": [3, 12, 3, 3],
                           "look": [1, 2, 1, 1], "needs_seeds": ["", "40", "", ""]})
    seeds = repro_breakdown.seeds_by_row(ledger)
    assert seeds.id.tolist() == ["p", "q", "f"] and seeds.seeds.tolist() == [3, 12, 3]
    assert seeds.needs_seeds.isna().tolist() == [True, False, True] and seeds.needs_seeds[1] == "40"
    ledger.to_csv(tmp_path / "reports/tables/ledger.csv", index=False)
    assert repro_breakdown.main(["--log", str(log), "--repo", str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    section = (tmp_path / "out/repro_breakdown.md").read_text().split("## Seeds per row")[1]
    assert "2 rows at the first look, 1 continued by the plan to a second" in section and "| q " in section
    # another profile's repro beside this one, in the figures that carry across machines
    quick = {"total": 1200.0, "machine_steps_s": {"steps": 1000, "s": {"vit": 20.0}},
             "training": {"runs": 50, "worker_s": 600.0, "ms_per_step": {"vit": 25.0}},
             "per_decision": {"informative_paired": 2, "worker_min_per_paired": 5.0}}
    (tmp_path / "quick.json").write_text(json.dumps(quick))
    out = ["--log", str(log), "--repo", str(tmp_path), "--out", str(tmp_path / "out")]
    assert repro_breakdown.main([*out, "--compare", f"quick={tmp_path / 'quick.json'}"]) == 0
    table = (tmp_path / "out/repro_breakdown.md").read_text().split("## Profiles")[1]
    row = next(line for line in table.splitlines() if line.startswith("| quick"))
    # 600 worker-seconds at 25 ms per ViT step: 24,000 ViT steps, 12 thousand for each of 2 rows
    assert [c.strip() for c in row.split("|")[2:10]] == ["20.0", "20.0", "25.0", "50", "10.0", "2", "5.0", "12.0"]
    assert "| this repro" in table
    with pytest.raises(SystemExit, match="--compare 'quick'"):
        repro_breakdown.main([*out, "--compare", "quick"])


def test_quick_profile_is_estimated_from_its_own_machine_figures():
    from bench.recorded import REFERENCE_STEPS
    from bench.render import render_quick

    ref, n = REFERENCE_STEPS["s"], REFERENCE_STEPS["steps"]
    # its machine: vit steps twice as slow, swin four times; its shared stages three times as slow
    machine = {"steps": n // 2, "s": {"vit": ref["vit"], "swin": ref["swin"] * 2}}
    quick = {"data@alignment": 30.0, "train": 3000.0, "report": 570.0, "total": 3600.0, "machine_steps_s": machine,
             "training": {"runs": 10, "wall_s": 3000.0, "steps_share": 0.8, "steps_share_of_runs": 0.9}}
    default = {"data@alignment": 10.0, "train": 9000.0, "total": 9100.0}
    text = "\n".join(render_quick(quick, default, {"ledger": {"held": 1}}, {"ledger": {"held": 2}}))
    assert "**60.0 min** on the machine that ran it" in text and "vit 2.00x, swin 4.00x faster" in text
    assert "ran 3.00x faster there" in text  # 30 s against 10 s
    # training 3000 s over the mean ratio 3 plus the other 600 s over 3: 1200 s; over 4 and 2: 950 and 1700 s
    assert "**about 20 min** (15.8-28.3 over the per-arch ratios)" in text and "within it, as an estimate" in text
    assert "at this profile: held 1; at the default (`reports/summary.json`): held 2" in text
    assert "machine_steps_s" not in text.split("| **total")[0]  # not a stage row
    unscaled = "\n".join(render_quick({**quick, "machine_steps_s": None}, default, None, None))
    assert "Not scaled to another machine" in unscaled and "Estimated" not in unscaled
    assert render_quick(None, default, None, None) == []


def test_verdict_changes_between_the_default_and_the_quick_ledger():
    import pandas as pd

    from bench.compare import verdict_changes

    default = pd.DataFrame({"id": ["a", "b", "c", "d", "e", "f"],
                            "verdict": ["held", "held", "failed", "inconclusive", "equivalent", "inconclusive"]})
    quick = pd.DataFrame({"id": ["a", "b", "c", "d", "f"],
                          "verdict": ["held", "inconclusive", "held", "failed", "not_run"]})
    (line,) = verdict_changes(default, quick)
    assert line.startswith("Of its 5 ledger rows, 5 are also the default's (6 rows): 1 with the same verdict;")
    assert "1 decided at the default and not here (b)" in line
    assert "1 decided both ways with another verdict (c: failed -> held)" in line
    assert "1 undecided at the default and decided here (d: failed)" in line


def test_estimate_prices_every_run_of_a_profile():
    from bench import estimate
    from bench.tiny import params_with
    from pipeline.config import Params
    from pipeline.grid import Folders, teacher_specs, train_specs

    params = Params.model_validate(params_with())  # 1 worker, 20-step runs, no tune trials
    at = Folders(*[Path(".")] * 5)
    n_train, n_teacher = len(train_specs(params, at)), len(teacher_specs(params, at))
    same = {"ms_per_step": 100.0, "other_s": 1.0, "cap_share": 0.5}
    cells = {f"{a}/{t}": same for a in ("vit", "resnet", "deit") for t in ("alignment", "relation")}
    cells["vit/relation"] = {"ms_per_step": 300.0, "other_s": 1.0, "cap_share": 0.5}
    cells.pop("deit/alignment")  # priced at deit's mean: deit/relation's figures
    timing = {"training": {"worker_s": 150.0, "run_s": 100.0, "cells": cells},  # 1.5 x the runs' own time
              "data@alignment": 4.0, "data@natural": 9.0, "report": 6.0, "train": 999.0, "total": 999.0}
    table = estimate.estimate(params, timing, factor=2.0)
    # each 20-step run: 20 x 0.5 x 0.1 s + 1 s expected, 20 x 0.1 + 1 capped; vit/relation's steps cost 3x
    vit_rel = len([s for s in train_specs(params, at) if (s.key.arch, s.key.task) == ("vit", "relation")])
    assert vit_rel == 1
    expected = ((n_train - 1) * 2.0 + 4.0) * 2.0 * 1.5
    assert table.loc["train", "expected_s"] == expected and table.loc["train", "runs"] == n_train
    assert table.loc["train", "cap_s"] == ((n_train - 1) * 3.0 + 7.0) * 2.0 * 1.5
    assert table.loc["teacher", "expected_s"] == n_teacher * 2.0 * 2.0 * 1.5
    # other stages: the study's seconds x the factor, only for tasks the profile has (tiny: no natural)
    assert table.loc["data@alignment", "expected_s"] == 8.0 and table.loc["report", "expected_s"] == 12.0
    assert "data@natural" not in table.index and "tune" not in table.index


def test_tune_trials_are_priced_from_the_study_trials():
    # raced trials stop earlier than the cell's study runs: a timing file with tune_cells prices them apart
    from bench import estimate
    from pipeline.config import load_params
    from pipeline.grid import Folders, tune_specs

    params = load_params("params.yaml")
    n_tune = len(tune_specs(params, Folders(*[Path(".")] * 5)))
    runs = {"ms_per_step": 10.0, "other_s": 1.0, "cap_share": 1.0}
    trials = {"ms_per_step": 10.0, "other_s": 1.0, "cap_share": 0.1}
    timing = {"training": {"worker_s": 1.0, "run_s": 1.0, "cells": {"vit/scale": runs},
                           "tune_cells": {"vit/scale": trials}}}
    table = estimate.estimate(params, timing, factor=1.0)
    steps = params.train.recipe.steps
    workers = params.train.runtime.workers
    assert table.loc["tune", "expected_s"] == pytest.approx(n_tune * (steps * 0.1 * 0.01 + 1.0) / workers)
    timing["training"].pop("tune_cells")  # an older timing file: trials priced like the runs
    table = estimate.estimate(params, timing, factor=1.0)
    assert table.loc["tune", "expected_s"] == pytest.approx(n_tune * (steps * 0.01 + 1.0) / workers)


def test_early_stops_stay_at_their_step_under_another_cap():
    # a criterion stop happens at a step: doubling the cap moves only the runs that ran to it
    import pandas as pd

    from bench.estimate import expected_steps
    from bench.repro_breakdown import cell_costs

    runs = pd.DataFrame({"arch": "vit", "task": "scale", "mode": ["criterion"] * 4 + ["steps"],
                         "run_s": 10.0, "steps_s": 8.0, "optimizer_steps": [300, 500, 1500, 1500, 4000],
                         "cap": [1500, 1500, 1500, 1500, 4000],
                         "stop_reason": ["criterion", "plateau", "cap", "cap", "cap"]})
    cell = cell_costs(runs)["vit/scale"]
    assert cell["at_cap"] == 0.5 and cell["early_steps"] == 400.0 and cell["runs"] == 5
    assert cell["cap_share"] == round((0.2 + 1 / 3 + 1 + 1) / 4, 3)  # the steps-mode run is not a share of a cap
    assert expected_steps(cell, 3000, "criterion") == 0.5 * 3000 + 0.5 * 400
    assert expected_steps(cell, 200, "criterion") == 200  # a cap below the early stops: every run ends at it
    assert expected_steps(cell, 3000, "steps") == 3000
    assert expected_steps({"cap_share": 0.25}, 3000, "criterion") == 750  # an older timing file: share of the cap
    never = cell_costs(runs.assign(stop_reason="cap"))["vit/scale"]
    assert never["early_steps"] is None and expected_steps(never, 3000, "criterion") == 3000


@pytest.mark.slow  # over a second idle: make test, not test-fast
def test_estimate_all_prices_every_committed_profile(capsys, monkeypatch):
    from bench import estimate

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    assert estimate.main(["--all", "--vit-ms", "10.0", "--timing", "reports/quick/repro_timing.json"]) == 0
    out = capsys.readouterr().out
    from pipeline import profiles

    every = ["params.yaml", *(f"profiles/{name}.yaml" for name in profiles.names(root))]
    cpu = [p for p in every if profiles.load(root / p).train.runtime.accelerator == "cpu"]
    assert len(cpu) >= 5 and all(f"{p}: expected dvc repro" in out for p in cpu)
    gpu = sorted(set(every) - set(cpu))
    assert gpu and all(f"{p}: for an accelerator" in out and f"bench.gpu_estimate --params {p}" in out for p in gpu)
    summary = out.split("Every profile at 10.00 ms per ViT step:")[1]
    assert all(f"| {p} " in summary for p in cpu)


@pytest.mark.slow  # over a second idle: make test, not test-fast
def test_a_profile_of_other_images_or_models_is_scaled_by_flops_per_step():
    from bench import estimate
    from pipeline import profiles
    from pipeline.config import load_params

    root = Path(__file__).resolve().parents[1]
    study, cut = load_params(root / "params.yaml"), profiles.load(root / "profiles/natural-slice.yaml")
    assert estimate.flops_scale(profiles.load(root / "profiles/quick.yaml"), study) == {}  # same models: as measured
    scale = estimate.flops_scale(cut, study)
    assert scale["vit"] > 4  # 64 tokens of 44 wide against 16 of the default's: more work per step
    timing = json.loads((root / "reports/repro_timing.json").read_text())
    plain = estimate.run_table(cut, timing["training"]["cells"])
    scaled = estimate.run_table(cut, timing["training"]["cells"], scale)
    vit = (scaled.arch == "vit") & (plain.arch == "vit")
    assert (scaled.expected_s[vit] > plain.expected_s[vit]).all()


@pytest.mark.slow  # over a second idle: make test, not test-fast
def test_gpu_estimate_counts_each_run_s_work():
    from bench import gpu_estimate
    from bench.estimate import forward_flops
    from pipeline import profiles
    from pipeline.grid import Folders, at_main_budget, train_specs

    root = Path(__file__).resolve().parents[1]
    params = profiles.load(root / "profiles/natural.yaml")
    runs = gpu_estimate.run_table(params)
    specs = train_specs(params, Folders(*[Path(".")] * 5))
    train = runs[runs.stage == "train"].reset_index(drop=True)
    assert len(train) == len(specs) and set(runs.stage) == {"tune", "train"}  # no students: no teachers
    fwd = forward_flops(params, {s.model for s in specs})
    r, rt = params.train.recipe, params.train.runtime
    first = specs[0]
    val = fwd[first.model] * params.slice.val_size * (first.key.steps // rt.val_every_steps)
    assert train.train_flops[0] == 3 * fwd[first.model] * r.batch_size * first.key.steps + val
    main = [at_main_budget(s, params) for s in specs]
    assert (train.eval_flops[main] > 10 * train.eval_flops[[not m for m in main]].max()).all()  # the subgroups
    table = gpu_estimate.estimate(params, tflops=40, step_ms=8, cpu_rate=5e10)
    slower = gpu_estimate.estimate(params, tflops=40, step_ms=16, cpu_rate=5e10)
    assert (slower.gpu_h >= table.gpu_h).all() and slower.gpu_h.sum() > table.gpu_h.sum()
