"""Report: the ledger, cells, floors and the stage on synthetic metrics.json/predictions.npz trees (no training)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from pipeline import profiles
from pipeline.archs import ARCHS
from pipeline.config import ArchEntry, load_params
from pipeline.grid import configured_cells
from pipeline.report import cells, contrasts, gate, ledger, markdown, measure, natural, pages, sources
from pipeline.stages import report as report_stage

ROOT = Path(__file__).resolve().parents[1]
N_POOL, TEST = 400, np.arange(200, 400)  # test items: pool indices 200..399 (complete twin pairs 2i, 2i + 1)
OOD = TEST[TEST % 4 == 0]  # "unseen offsets": a quarter of the test items
CROSS = TEST[TEST % 2 == 0]  # relation marks in different windows


def _pool(root: Path, task: str) -> np.ndarray:
    """labels (twins have opposite labels), factors and slices for one task; returns the labels."""
    labels = (np.arange(N_POOL) % 2).astype(np.int64)
    (root / "tasks" / task).mkdir(parents=True, exist_ok=True)
    np.save(root / "tasks" / task / "labels.npy", labels)
    dx, dy = np.arange(N_POOL) % 4, (np.arange(N_POOL) // 4) % 4
    pd.DataFrame({"dx": dx, "dy": dy, "id": (dx < 2) & (dy < 2)}).to_csv(root / "tasks" / task / "factors.csv",
                                                                         index=False)
    (root / "slices" / task).mkdir(parents=True, exist_ok=True)
    np.savez(root / "slices" / task / "indices.npz", test=TEST, **{"slice/ood": OOD, "slice/window=cross": CROSS,
                                                                   "slice/id": np.setdiff1d(TEST, OOD),
                                                                   "slice/window=same": np.setdiff1d(TEST, CROSS)})
    return labels


def _run(root: Path, task: str, arch: str, seed: int, correct: np.ndarray, labels: np.ndarray, steps: int = 1000,
         logits: np.ndarray | None = None, train_size: int = 40) -> None:
    """One run folder: predictions right exactly on ``correct`` (bool over TEST), metrics.json to match."""
    folder = root / "runs" / arch / task / f"n{train_size}-t{steps}-s{seed}-d0"
    folder.mkdir(parents=True, exist_ok=True)
    pred = np.where(correct, labels[TEST], 1 - labels[TEST])
    if logits is None:
        logits = np.eye(2, dtype=np.float32)[pred]
    acc = float((logits.argmax(-1) == labels[TEST]).mean())
    curve = [{"step": s, "train_loss": 1.0, "val_acc": acc * s / steps, "lr": 1e-3} for s in (steps // 2, steps)]
    metrics = {"task": task, "arch": arch, "model": arch, "teacher": None, "seed": seed, "data_seed": 0,
               "train_size": train_size, "steps": steps, "budget_mode": "steps", "num_classes": 2, "test_acc": acc,
               "val_acc": acc, "slices": {"test": {"acc": acc, "n": len(TEST)}}, "curve": curve,
               "budget": {"params": 1000, "optimizer_steps": steps}, "measured": {"wall_time_s": 1.0}}
    (folder / "metrics.json").write_text(json.dumps(metrics))
    np.savez(folder / "predictions.npz", index=TEST, logits=logits)


def _correct(share: float, rng: np.random.Generator) -> np.ndarray:
    return rng.random(len(TEST)) < share


def _tree(root: Path) -> None:
    """alignment: resnet = vit on id, resnet wins every ood item; arrangement: vit bimodal over seeds,
    vit_sincos identical to vit, vit_nopos with equal twin logits; relation: swin_local_shift vs swin_local noisy."""
    rng = np.random.default_rng(0)
    lab = {t: _pool(root, t) for t in ("alignment", "arrangement", "relation")}
    ood = np.isin(TEST, OOD)
    for seed in (0, 1):
        base = _correct(0.9, rng)
        _run(root, "alignment", "vit", seed, base & ~ood, lab["alignment"])
        _run(root, "alignment", "resnet", seed, base | ood, lab["alignment"])
        arr = _correct(0.97 if seed == 0 else 0.5, rng)  # seed 0 escapes, seed 1 does not: bimodal
        _run(root, "arrangement", "vit", seed, arr, lab["arrangement"])
        _run(root, "arrangement", "vit_sincos", seed, arr, lab["arrangement"])
        _run(root, "arrangement", "vit_nopos", seed, None, lab["arrangement"],
             logits=np.tile(np.array([[2.0, -1.0]], dtype=np.float32), (len(TEST), 1)))
        rel = _correct(0.7, rng)
        _run(root, "relation", "swin_local_shift", seed, rel, lab["relation"])
        _run(root, "relation", "swin_local", seed, rel ^ (_correct(0.3, rng) if seed else False),
             lab["relation"])
    floors = {"task": "relation", "chance": 0.5, "floor": 0.70, "floor_baseline": "nomix",
              "baselines": {"one_mark": {"acc": 0.62, "n": 200, "uses": "mark A alone", "ci": [0.55, 0.68]},
                            "nomix": {"acc": 0.70, "n": 200, "uses": "no token mixing", "ci": [0.63, 0.76]}}}
    (root / "shortcuts" / "relation").mkdir(parents=True)
    (root / "shortcuts" / "relation" / "floors.json").write_text(json.dumps(floors))


@pytest.fixture
def params_path(tmp_path):
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    tree = {"vit": ["alignment", "arrangement"], "resnet": ["alignment"], "vit_sincos": ["arrangement"],
            "vit_nopos": ["arrangement"], "swin_local_shift": ["relation"],
            "swin_local": ["relation"]}  # the cells _tree runs
    raw["train"]["archs"] = {a: {"models": ARCHS[a].section, "tasks": t} for a, t in tree.items()}
    raw["train"]["grids"] = {}
    raw["distill"]["students"], raw["distill"]["teachers"] = {}, {}
    raw["report"]["bootstrap_samples"] = 300
    raw["train"]["criterion"]["accuracy"] = 0.85  # the synthetic runs' curves end at their accuracy (~0.9 here)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _stage(tmp_path, params_path, out="reports") -> Path:
    _tree(tmp_path)
    args = ["--params", str(params_path), "--out", str(tmp_path / out)]
    for name in ("runs", "tasks", "slices", "shortcuts"):
        args += [f"--{name}", str(tmp_path / name)]
    assert report_stage.main(args) == 0
    return tmp_path / out


@pytest.mark.slow  # a stage, a store, a browser or a long fit: make test, not test-fast
def test_ledger_rows_decided_on_item_paired_differences(tmp_path, params_path):
    out = _stage(tmp_path, params_path)
    led = pd.read_csv(out / "tables" / "ledger.csv").set_index("id")
    # resnet wins exactly the ood items vit loses: +1 on ood on every item where base was right, paired
    row = led.loc["alignment.resnet_vs_vit.alignment"]
    assert row.verdict == "held" and row.ci_lo > 0.5 and row.p_holm < 0.05
    assert row.reason != row.reason and row.ci_method.startswith("seed-level paired t")  # decided: no reason
    # identical predictions (difference exactly 0), but vit is bimodal (0.97 and 0.5): mean in distribution
    # below chance + half the span, so neither arm learned and the row is not a decision
    same = led.loc["arrangement.sincos.arrangement"]
    assert (same.estimate, same.ci_lo, same.ci_hi, same.verdict) == (0.0, 0.0, 0.0, "uninformative")
    assert "vit_sincos did not learn: in-distribution" in same.reason and "(needs >= 0.750)" in same.reason
    noisy = led.loc["relation.shift.relation"]  # 0.7 against relation's analytic additive bound 0.75
    assert noisy.verdict == "uninformative"
    assert noisy.reason.startswith("swin_local_shift did not learn: slice/window=same")
    assert noisy.analytic_floor == 0.75 and noisy.learn_at == pytest.approx(0.875)
    exact = led.loc["exact.vit_nopos.twins"]
    assert exact.verdict == "held" and exact.estimate == 0.5 and exact.max_logit_diff == 0.0
    assert set(led.verdict) <= set(ledger.VERDICTS) - {"not run"}
    assert "untestable" not in (out / "tables" / "ledger.md").read_text()
    # pairs not configured are not rows (no resnet_s1, no students)
    assert not any(i.startswith(("alignment.stride", "distill.")) for i in led.index)
    assert "0.700" in (out / "tables" / "ledger.md").read_text()  # the relation floor beside its rows


@pytest.mark.slow  # a stage, a store, a browser or a long fit: make test, not test-fast
def test_cells_flag_bimodal_and_count_escapes(tmp_path, params_path):
    out = _stage(tmp_path, params_path)
    acc = pd.read_csv(out / "tables" / "accuracy.csv").set_index(["task", "arch"])
    vit = acc.loc[("arrangement", "vit")]
    assert (vit.n, vit.k_escaped, bool(vit.bimodal)) == (2, 1, True) and "needs more seeds" in vit.note
    assert 0 <= vit.ci_lo < vit["mean"] < vit.ci_hi <= 1 and 0 < vit.k_ci_lo < 0.5 < vit.k_ci_hi < 1
    assert "1/2 escaped; needs more seeds" in (out / "tables" / "accuracy.md").read_text()
    assert "Shortcut floors" in (out / "tables" / "accuracy.md").read_text()
    summary = json.loads((out / "summary.json").read_text())
    flat = pd.json_normalize(summary).columns
    # narrow enough for `dvc exp show`: verdicts, informative / uninformative per row type, leads, floors
    assert len(flat) <= 30 and summary["floor"]["relation"] == 0.70 and summary["bimodal_cells"] >= 1
    assert summary["informative"]["paired"] + summary["uninformative"]["paired"] <= summary["ledger"]["held"] + \
        summary["ledger"]["failed"] + summary["ledger"]["equivalent"] + summary["ledger"]["inconclusive"] + \
        summary["ledger"]["uninformative"]
    readme = (out / "README.md").read_text()
    findings = readme.split("## Findings")[1].split("Shortcut floors")[0]
    listed = [line for line in findings.splitlines() if re.match(r"\d\. \*\*", line)]  # one numbered line each
    assert 1 <= len(listed) <= 5 and "Minimal pair resnet vs vit" in findings
    for name in ("ledger", "accuracy", "alignment_offset", "relation_window", "learning_curves"):
        assert (out / "figures" / f"{name}.png").stat().st_size > 0
    for name in ("scale_size", "relation_distance", "data_size"):  # no such slices or grid here: no empty canvas
        assert not (out / "figures" / f"{name}.png").exists()
    assert readme.index("figures/ledger.png") < readme.index("figures/accuracy.png")
    assert "Not run in this profile (no figure): Accuracy vs object size" in readme
    plot = pd.read_csv(out / "tables" / "plot_alignment_offset.csv")  # fixed columns for dvc plots
    # every architecture of the table has its column (empty where not run): dvc.yaml's lists serve every profile
    assert plot.columns[0] == "x" and list(plot.columns[1:]) == list(ARCHS)
    assert plot.vit_nopos.isna().all() and plot.resnet.notna().all()
    learn = pd.read_csv(out / "tables" / "learnability.csv").set_index(["task", "arch"])
    resnet, swin = learn.loc[("alignment", "resnet")], learn.loc[("relation", "swin_local_shift")]
    assert resnet.k_criterion >= 1 and (resnet.median_steps_to_criterion, resnet.stop_reasons) == (1000, "cap 2")
    # relation's analytic bound 0.75 is above its fitted floor 0.70: swin at ~0.7 has not learned it (0.75 + 0.5 x 0.25)
    assert swin.k_criterion == 0 and swin.learned == "no" and swin.learn_at == 0.875
    assert "Rows decided, by type: paired:" in readme and "'undecided' when the lead" in readme


def test_floor_rows_and_budget_pairs(tmp_path, params_path):
    """swin_local at cross-window pairs vs the floor; nomix vs its floor without itself; a steps contrast."""
    _tree(tmp_path)
    labels = sources.read_pool(tmp_path / "tasks", tmp_path / "slices", "relation")["labels"]
    rng = np.random.default_rng(1)
    for seed in (0, 1, 2, 3):
        _run(tmp_path, "relation", "swin_local", seed, _correct(0.3, rng), labels)
        _run(tmp_path, "relation", "nomix", seed, np.ones(len(TEST), bool), labels)
        # the budget pair needs several seeds: a seed-level t test on two seeds (1 df) decides nothing here
        _run(tmp_path, "relation", "swin", seed, np.ones(len(TEST), bool), labels, steps=4000)
        if seed < 2:
            _run(tmp_path, "relation", "swin", seed, np.ones(len(TEST), bool), labels, train_size=80)
        _run(tmp_path, "relation", "swin", seed, _correct(0.7, rng), labels)
    params = load_params(params_path)
    archs = {**params.train.archs, "swin_local": ArchEntry(models="swin", tasks=["relation"]),
             "swin": ArchEntry(models="swin", tasks=["relation"]),
             "nomix": ArchEntry(models="vit", tasks=["relation"])}
    # the four seeds written above (the committed first look has three)
    train = params.train.model_copy(update={"archs": archs, "seeds": [0, 1, 2, 3]})
    params = params.model_copy(update={"train": train})
    records = sources.read_metrics(tmp_path / "runs", "runs")
    inp = pages.load(params, records, tmp_path / "tasks", tmp_path / "slices", tmp_path / "shortcuts", None, {})
    led = ledger.judge(params, inp.runs, inp.items, inp.floors, {}, 0).set_index("id")
    local = led.loc["reach.swin_local.relation"]
    # swin_local below chance everywhere: at the floor across windows, but not for reachability's reason
    assert local.kind == "floor" and local.verdict == "uninformative" and local.floor == 0.70
    assert local.reason.startswith("swin_local did not learn: slice/window=same 0.")
    nomix = led.loc["floor.nomix.relation"]
    assert nomix.floor_baseline == "one_mark" and nomix.verdict == "failed"  # 1.0 far above the floor
    assert measure.floor_of(inp.floors, "relation") == (0.70, "nomix")
    sizes = cells.size_cells(cells.cell_table(inp.runs, inp.items, params.report, 0), cells.main_config(inp.runs))
    assert sorted(sizes.train_size.unique()) == [40, 80] and set(sizes.arch) == {"swin"}
    budget = led.loc["budget.swin.relation.steps4000"]  # swin again at 4000 steps, right on every item
    assert (budget.a, budget.b, budget.kind, budget.verdict) == ("swin", "swin", "paired", "held")
    assert "4000 steps: step 4000" in budget.context and "1000 steps: not reached" in budget.context


def test_floor_never_comes_from_a_baseline_that_sees_the_factor():
    floors = {"arrangement": {"floor": 0.5, "floor_baseline": "tokens_bag", "baselines": {
        "tokens_bag": {"acc": 0.5, "uses_factor": False},
        "tokens_pos": {"acc": 1.0, "uses_factor": True},  # sees the layout: the task's own factor
        "nomix": {"acc": 0.6, "uses_factor": False}}}}
    assert measure.floor_of(floors, "arrangement") == (0.6, "nomix")
    assert measure.floor_of(floors, "arrangement", exclude=("nomix",)) == (0.5, "tokens_bag")


def test_twin_check_is_exact():
    labels = np.array([0, 1, 0, 1])
    index = np.array([0, 1, 2, 3])
    equal = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    got = cells.twin_check(index, equal, labels, index // 2)
    assert got == {"pairs": 2, "max_logit_diff": 0.0, "pair_acc": 0.5, "equal": True}
    unequal = equal.copy()
    unequal[1] = [0.0, 1.0]
    assert cells.twin_check(index, unequal, labels, index // 2)["pair_acc"] == 0.75
    lone = cells.twin_check(index[:3], equal[:3], labels, (index // 2)[:3])  # the last pair incomplete
    assert lone["pairs"] == 1


def test_natural_tables_read_subgroups_and_resolution():
    recs = [{"task": "natural", "arch": "vit", "source": "runs", "seed": s,
             "subgroups": {"alignment": {"dx=1": {"acc": 0.5, "consistency": 0.8, "n": 100}}},
             "resolution": {"24": {"acc": 0.4, "n": 100}}} for s in (0, 1)]
    sub = natural.subgroup_table(recs, 0.95).iloc[0]
    assert (sub.seeds, sub["mean"], sub.n, sub.consistency) == (2, 0.5, 200, 0.8)
    assert sub.ci_lo == sub.ci_hi == 0.5  # seed-level t: two equal seeds, no spread
    res = natural.resolution_table(recs, 0.95).iloc[0]
    assert (res.size_px, res["mean"]) == (24, 0.4)
    assert all(a["source"] and ("Table" in a["source"] or "Figure" in a["source"]) for a in natural.ANCHORS)


def test_floor_flags_and_markdown_one_way():
    floors = {"scale": {"floor": 0.95, "floor_baseline": "area", "chance": 0.25},
              "relation": {"floor": 0.6, "floor_baseline": "one_mark", "chance": 0.5}}
    assert markdown.floor_flags(floors) == ["scale"]
    assert "relation 0.600 (one_mark; chance 0.500)" in markdown.floors_line(floors)
    floors["natural"] = {"floor": 0.53, "floor_baseline": "kmeans_global", "chance": 0.1, "beside_floor": 0.6,
                         "beside_baseline": "kmeans_pooled"}
    assert "natural 0.530 (kmeans_global; chance 0.100; beside it, not counted: kmeans_pooled 0.600)" in \
        markdown.floors_line(floors)
    assert markdown.md_table(pd.DataFrame()) == "_not run_"


def test_escape_threshold_is_read_against_the_best_one_object_rule():
    # arrangement: one glyph's cell alone scores 0.848, so a seed at >= 0.9 used both glyphs; a threshold below
    # such a rule is flagged, and a task without one-object baselines is not listed
    floors = {"arrangement": {"baselines": {"position_a_alone": {"acc": 0.848}, "position_b_alone": {"acc": 0.84},
                                            "tokens_bag": {"acc": 0.95}}},
              "natural": {"baselines": {"raw_pixels": {"acc": 0.37}}}}
    line = markdown.escape_line(floors, 0.9)
    assert line == ("Escape threshold 0.9 against each task's best one-object baseline: "
                    "arrangement 0.848 (position_a_alone; above it).")
    assert "NOT above it" in markdown.escape_line(floors, 0.8) and markdown.escape_line({}, 0.9) == ""


def test_nothing_to_report_is_one_line_error(tmp_path, params_path):
    assert report_stage.main(["--params", str(params_path), "--runs", str(tmp_path / "none"),
                              "--out", str(tmp_path / "r")]) == 2


def test_teacher_disagreement_read_from_provenance(tmp_path):
    """One rate per teacher type and task: the mean over its teachers (one folder per teacher seed)."""
    for seed, rate in ((0, 0.125), (1, 0.375)):
        folder = tmp_path / "teachers" / "resnet" / f"s{seed}" / "alignment"
        folder.mkdir(parents=True)
        (folder / "provenance.json").write_text(json.dumps({"arch": "resnet", "model": "resnet", "task": "alignment",
                                                            "seed": seed, "checkpoint_sha256": "ab" * 32,
                                                            "student_train_disagreement": rate}))
    assert sources.teacher_disagreement(tmp_path / "teachers") == {("resnet", "alignment"): 0.25}
    assert sources.teacher_disagreement(tmp_path / "absent") == {}


def test_findings_report_contradicted_and_cap_at_five():
    def row(i, finding, verdict):
        return {"id": f"{finding}.{i}", "finding": finding, "kind": "paired", "task": "t", "a": "a", "b": "b",
                "subset": "test", "isolates": "x", "estimate": 0.1, "ci_lo": 0.05, "ci_hi": 0.15, "floor": np.nan,
                "floor_baseline": "", "verdict": verdict, "needs_seeds": None}
    led = pd.DataFrame([row(0, "alignment", "held"), row(1, "alignment", "failed"), row(0, "arrangement", "failed"),
                        *(row(0, f, "held") for f in ("relation", "distillation", "natural", "scale"))])
    got = markdown.findings(led)
    assert len(got) == 5 and got[0].startswith("**alignment: contradicted.**") and "contradicted by `alignment.1`" \
        in got[0]
    assert got[1].startswith("**arrangement: contradicted.**") and not any("scale" in g for g in got)


def test_markdown_cells_escape_the_column_separator():
    from pipeline.report.markdown import md_table

    lines = md_table(pd.DataFrame({"claim": ["max |diff| small"], "x": [0.5]})).splitlines()
    assert lines[2].count("|") - lines[2].count(r"\|") == 3  # three column borders, the cell's pipes escaped


# Rows the CPU default leaves to the large profile, each for a measured reason (docs/methods.md): at 16 px
# CIFAR-10 no ViT-family arm clears the learn threshold (reports/quick), so only the references train there; on
# relation the position arms sit at the ceiling (reports/tasks); the DeiT students sit at chance on arrangement.
DEFAULT_LEAVES_OUT = {
    *(f"natural.{c}.natural" for c in ("position", "sincos", "pyramid", "antialias", "convstem", "overlap", "shift",
                                        "hierarchy")),
    "relation.position.relation", "relation.sincos.relation",
    "relation.sincos_init.relation", "floor.nomix.natural",
    *(f"natural.{c}.natural" for c in ("hybrid", "swin_vs_vit", "attention_vs_mixer")),  # profiles/natural-cpu.yaml
}
# MLP-Mixer has no mapping to another token grid, and the large profile sweeps CIFAR-10's resolution: its
# natural row runs in profiles/natural-cpu.yaml, which has no sweep.
LARGE_LEAVES_OUT = {"natural.attention_vs_mixer.natural"}


@pytest.mark.parametrize("profile", ["params.yaml", "profiles/large.yaml"])
def test_every_predicted_contrast_is_run_at_the_default_params(profile):
    """The ledger's pre-registered pairs and the profiles agree: each contrast has both arms configured on each of
    its tasks in the large profile, and in the default except the rows it leaves out on purpose (a pair missing
    from the grid would silently drop its row)."""
    params = profiles.load(ROOT / profile)
    planned = {row["id"] for row in contrasts.plan(params)}
    default = configured_cells(load_params(ROOT / "params.yaml"))
    # a distill.* row is planned wherever both arms train: the default's such tasks, in both profiles
    every = {f"{c['id']}.{t}" for c in contrasts.CONTRASTS
             for t in c["tasks"] or sorted(default.get(c["a"], set()) & default.get(c["b"], set()))}
    every |= {f"{f['id']}.{t}" for f in contrasts.FLOOR_ROWS for t in f["tasks"]}
    left_out = DEFAULT_LEAVES_OUT if profile == "params.yaml" else LARGE_LEAVES_OUT
    assert left_out <= every and sorted(every - left_out - planned) == []
    assert not left_out & planned  # a row the default runs again comes off the list


@pytest.mark.parametrize("profile", ["params.yaml", "profiles/large.yaml"])
def test_every_grid_cell_has_a_main_grid_partner(profile):
    """A grid run (more steps, another size, draw or budget mode) is judged against the same arch and task in the
    main grid; a grid cell whose arch does not run that task in the main grid would be a pair with one arm."""
    params = profiles.load(ROOT / profile)
    conf = configured_cells(params)
    for name, grid in params.train.grids.items():
        for arch in grid.archs:
            missing = set(grid.tasks or ()) - conf[arch]
            assert not missing, f"train.grids.{name}: {arch} on {sorted(missing)} has no main-grid cell"


def test_a_tied_floor_names_the_shortcut_stage_pick():
    floors = {"relation": {"floor": 0.53, "floor_baseline": "tokens_bag", "baselines": {
        "a_plus_b": {"acc": 0.53}, "tokens_bag": {"acc": 0.53}, "colour_a_alone": {"acc": 0.51}}}}
    assert measure.floor_of(floors, "relation") == (0.53, "tokens_bag")
    assert measure.floor_of(floors, "relation", exclude=("tokens_bag",)) == (0.53, "a_plus_b")


def test_agreement_where_the_teacher_is_wrong_separates_inheritance_from_accuracy(tmp_path):
    # A teacher wrong on pool items 2 and 3; a student that copies it agrees there, one that learned the labels
    # does not, though both agree with the teacher on every item it gets right.
    from pipeline.report import aggregate
    from pipeline.report.cells import Items

    labels = np.array([0, 1, 0, 1, 0, 1])
    index = np.arange(6)

    def logits(pred):
        return np.eye(2, dtype=np.float32)[pred]

    teacher = np.array([0, 1, 1, 0, 0, 1])
    folders = {}
    for name, pred in {"teacher": teacher, "copy": teacher, "labels": labels, "constant": np.ones(6, int)}.items():
        folders[name] = tmp_path / name
        folders[name].mkdir()
        np.savez(folders[name] / "predictions.npz", index=index, logits=logits(pred))
    runs = pd.DataFrame([
        {"task": "t", "arch": "resnet", "source": "teachers", "seed": 0, "dir": str(folders["teacher"])},
        {"task": "t", "arch": "deit", "source": "runs", "seed": 0, "dir": str(folders["copy"])},
        {"task": "t", "arch": "vit", "source": "runs", "seed": 0, "dir": str(folders["labels"])},
        {"task": "t", "arch": "deit", "source": "runs", "seed": 1, "dir": str(folders["constant"])}])
    items = Items(pools={"t": {"labels": labels, "subsets": {"slice/ood": np.array([2, 3, 4])}}})
    every = sources.agreements(runs, ["deit", "vit"], ["t"], items)
    # a student that says class 1 for every item agrees with the teacher on its wrong item 2, inheriting nothing:
    # the distillation table counts it (once per seed, whatever the teachers it is compared with)
    constant = every[(every.arch == "deit") & (every.seed == 1)].iloc[0]
    assert constant.classes == 1 and constant.agree_teacher_wrong == 0.5
    table = aggregate.distillation_table(runs.assign(test_acc=0.5, teacher_arch=None),
                                         pd.concat([every, every.assign(teacher="vit")])).set_index("arch")
    assert (table.loc["deit", "constant_seeds"], table.loc["vit", "constant_seeds"]) == (1, 0)
    got = every[every.seed == 0].set_index("arch")
    assert got.loc["deit", "agree_teacher_wrong"] == 1.0 and got.loc["vit", "agree_teacher_wrong"] == 0.0
    assert got.loc["vit", "agreement"] == pytest.approx(4 / 6)
    assert got.loc["vit", "agree_ood"] == pytest.approx(1 / 3) and got.loc["deit", "agree_ood"] == 1.0
    wrong_ood = np.intersect1d([2, 3, 4], np.flatnonzero(teacher != labels))  # where a transferred bias shows
    assert len(wrong_ood) and got.loc["deit", "agree_ood_teacher_wrong"] == 1.0
    assert got.loc["vit", "agree_ood_teacher_wrong"] == 0.0


def test_distillation_table_reads_one_configuration_with_seed_intervals_and_the_teachers_disagreement():
    """Per arm: accuracy in and out of distribution with a seed-level t interval, the teacher's disagreement
    rate; the arms of the distill rows only (deit_labels included), and no run of another training size."""
    from pipeline.report import aggregate
    from pipeline.report.cells import Items, slice_accuracy

    labels = np.arange(8) % 2
    items = Items({"scale": {"labels": labels, "subsets": {"slice/id": np.arange(4), "slice/ood": np.arange(4, 8)},
                             "factors": None}})
    runs, agree = [], []
    right = {"deit": [[1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0, 0, 0]],
             "deit_labels": [[1, 1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0, 0, 0]]}
    for arch, per_seed in right.items():
        for seed, ok in enumerate(per_seed):
            d = f"{arch}/{seed}"
            items.add(d, "scale", np.arange(8), np.eye(2)[np.where(np.array(ok) == 1, labels, 1 - labels)])
            runs.append({"task": "scale", "arch": arch, "source": "runs", "seed": seed, "dir": d,
                         "test_acc": float(np.mean(ok)), "teacher_arch": "resnet" if arch == "deit" else None})
            agree.append({"task": "scale", "arch": arch, "source": "runs", "seed": seed, "teacher": "resnet",
                          "agreement": 0.5, "agree_ood": math.nan, "agree_teacher_wrong": math.nan})
    runs = pd.DataFrame(runs)
    acc = slice_accuracy(runs, items, ("slice/id", "slice/ood"), 0.95)
    table = aggregate.distillation_table(runs, pd.DataFrame(agree), acc, {("resnet", "scale"): 0.2}).set_index("arch")
    assert table.loc["deit", "acc_ood"] == pytest.approx(0.375) and table.loc["deit", "acc_id"] == 1.0
    assert table.loc["deit_labels", "acc_id"] == pytest.approx(0.875)
    lo, hi = table.loc["deit", ["acc_ood_lo", "acc_ood_hi"]]  # seeds 0.5 and 0.25: t(1) interval, clipped to [0, 1]
    assert lo == 0.0 and 0.375 < hi <= 1.0
    assert table.loc["deit", "teacher_disagrees"] == 0.2 and math.isnan(table.loc["deit_labels", "teacher_disagrees"])
    transfer = aggregate.distillation_table(runs, pd.DataFrame(agree), acc, {}, {("resnet", "scale"): 0.3})
    assert transfer.set_index("arch").loc["deit", "teacher_disagrees_transfer"] == 0.3
    # the agreements in long form, one seed-level interval per arm, teacher and where
    long = aggregate.agreement_table(pd.DataFrame(agree).assign(agreement=[0.4, 0.6, 0.5, 0.5]), 0.95)
    row = long.set_index(["arch", "where"]).loc[("deit", "test")]
    assert (row.seeds, row["mean"]) == (2, pytest.approx(0.5)) and row.ci_lo < 0.5 < row.ci_hi
    assert set(long["where"]) == {"test"}  # NaN rates (no ood slice here) are left out, not averaged as 0


def test_a_winner_below_its_slice_floor_is_not_decided():
    """A row decides on a slice only when the arm its estimate favours clears that slice's strongest shortcut by
    the margin (an "= 0" row: both arms); the losing arm of a "+" row may sit below it (that is the finding)."""
    slice_floors = {"scale": {"chance": 0.5, "floor": 0.88, "floor_baseline": "tokens_bag",
                              "floor_slice_baselines": {"slice/ood": "bag3b_global"}, "baselines": {
                                  "tokens_bag": {"acc": 0.88, "n": 100, "slices": {"slice/ood": {"acc": 0.82, "n": 50},
                                                                                  "slice/id": {"acc": 0.97, "n": 50}}},
                                  "bag3b_global": {"acc": 1.0, "n": 100, "slices": {"slice/ood": {"acc": 1.0, "n": 50},
                                                                                   "slice/id": {"acc": 1.0, "n": 50}}},
                                  "size_alone": {"acc": 1.0, "n": 100, "uses_factor": True,
                                                 "slices": {"slice/ood": {"acc": 1.0, "n": 50}}}}}}
    assert measure.floor_of(slice_floors, "scale", subset="slice/ood") == (1.0, "bag3b_global")
    assert measure.floor_of(slice_floors, "scale", ("bag3b_global",), "slice/ood") == (0.82, "tokens_bag")
    assert measure.floor_of(slice_floors, "scale", subset="slice/window=cross") == (1.0, "bag3b_global")  # test's
    assert measure.learning_floor(slice_floors, "scale") == 1.0  # the in-distribution slice's floor
    row = {"kind": "paired", "finding": "scale", "a": "resnet", "b": "vit", "subset": "slice/ood", "expect": "+",
           "margin": 0.04}
    m = {"seeds": 3, "acc_a": 0.95, "acc_b": 0.70, "in_a": 1.0, "in_b": 1.0, "learn_at": 0.75, "chance": 0.5,
         "floor": 1.0, "floor_baseline": "bag3b_global"}
    reason = gate.gate(row, m, 0.01)
    assert reason.startswith("a shortcut reaches slice/ood: bag3b_global 1.000") and "resnet 0.950" in reason
    assert "vit" not in reason  # the loser below the floor is the finding, not a reason
    above = {**m, "floor": 0.82, "floor_baseline": "tokens_bag"}
    assert gate.gate(row, above, 0.01) == ""  # 0.95 clears 0.82 + 0.04; vit at 0.70 below it does not matter
    assert gate.gate(row, {**above, "acc_a": 0.85}, 0.01).startswith("a shortcut reaches slice/ood: tokens_bag")
    # where the other arm came out ahead, that arm is the winner held to the floor: a failure above the floor
    # is decided (not hidden behind the predicted winner's level), one at the floor's level is not
    ahead_b = {**above, "acc_a": 0.80, "acc_b": 0.95, "estimate": -0.15}
    assert gate.gate(row, ahead_b, 0.01) == ""
    reason = gate.gate(row, {**ahead_b, "acc_b": 0.84, "estimate": -0.04}, 0.01)
    assert reason.startswith("a shortcut reaches slice/ood: tokens_bag") and "vit 0.840" in reason
    assert "resnet" not in reason
    same = {**row, "expect": "0"}
    assert "vit 0.700" in gate.gate(same, above, 0.01)  # an equivalence needs both arms above the floor
    assert gate.gate(same, {**above, "acc_b": 0.9}, 0.01) == ""
    # a speed row (how soon each arm reached the criterion) holds its arms' test accuracy to the floor too
    speed = {**row, "subset": gate.SPEED}
    reason = gate.gate(speed, {**m, "floor_slice": "test"}, 0.01)  # measure_speed scores the arms on test
    assert reason.startswith("a shortcut reaches test: bag3b_global 1.000") and "resnet 0.950" in reason
    assert gate.gate(speed, {**above, "acc_a": 0.99, "acc_b": 0.99}, 0.01) == ""  # at the ceiling: still a question
    solved = gate.gate(row, {**above, "learn_at": 1.0, "in_a": 0.99}, 0.01)
    assert "resnet did not learn" in solved and "a shortcut solves it" in solved  # a learn base at 1.0, named
    # a budget row (one arch under two budgets) is held to the floor too: a longer budget at a shortcut's level
    budget = {**row, "finding": "budget", "b": "resnet"}
    assert gate.gate(budget, {**m, "acc_b": 0.9}, 0.01).startswith("a shortcut reaches slice/ood: bag3b_global")
    assert gate.gate(budget, {**above, "acc_b": 0.9}, 0.01) == ""


def test_budget_table_averages_counts_that_differ_by_seed_and_keeps_configurations_apart():
    """Runs that stop at the criterion take different steps per seed: the table gives their mean and range, not
    the first seed's; a FLOPs-matched grid and another data draw of the same cell are rows of their own (a referee
    found ViT teachers printed at 3,000 steps where one seed took 1,300, and resnet's wall time averaged over 8 runs
    of 3 configurations)."""
    from pipeline.report import aggregate

    def run(seed: int, steps: int, wall: float, mode: str = "criterion", draw: int = 0) -> dict:
        return {"source": "runs", "task": "alignment", "arch": "resnet", "train_size": 4000, "steps": 3000,
                "budget_mode": mode, "data_seed": draw, "seed": seed, "params": 100, "optimizer_steps": steps,
                "batch_size": 64, "images_seen": 64 * steps, "tokens_per_image": 16, "tokens_seen": 1024 * steps,
                "forward_flops_per_image": 10, "train_flops": 30 * 64 * steps, "teacher_forward_flops": 0,
                "teacher_train_flops": 0, "total_flops_with_teacher": 30 * 64 * steps, "wall_time_s": wall,
                "images_per_s": 1.0, "peak_rss_mb": 1.0, "teacher_arch": None}

    runs = pd.DataFrame([run(0, 700, 24.0), run(1, 600, 21.0), run(2, 600, 21.0), run(0, 940, 34.0, "flops"),
                         run(1, 940, 29.0, "flops"), run(0, 600, 21.0, draw=1)])
    table = aggregate.budget_table(runs).set_index(["budget_mode", "data_seed"])
    main = table.loc[("criterion", 0)]
    assert (main.seeds, main.optimizer_steps_min, main.optimizer_steps_max) == (3, 600, 700)
    assert (main.optimizer_steps, main.train_flops) == (633, 1216000)  # seed means, to whole counts
    assert main.wall_time_s == pytest.approx(22.0) and main.params == 100  # the main grid's 3 runs only
    assert table.loc[("flops", 0)].optimizer_steps == 940 and table.loc[("criterion", 1)].seeds == 1
