"""The ledger's inference: seed-level coverage in simulation, TOST/Holm/power against statsmodels, the
informativeness gate on a tiny in-memory ledger, and the declared margins."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import TTestPower
from statsmodels.stats.weightstats import ttost_paired

from pipeline.archs import ARCHS
from pipeline.config import parse_params
from pipeline.errors import ConfigError
from pipeline.report import cells, contrasts, gate, ledger, stats

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- (a) coverage
def _coverage(seeds: int, sims: int = 3000, items: int = 2000, seed_sd: float = 0.05, chunk: int = 250) -> float:
    """Share of simulated studies whose seed-level paired t interval (the ledger's functions, twin pairs
    averaged first) covers the true difference. Per study: each arm's per-seed accuracy is its true accuracy
    plus a seed effect (sd ``seed_sd``), and every item is a 0/1 draw at that accuracy."""
    rng = np.random.default_rng(seeds)
    true_a, true_b = 0.70, 0.66
    twins = np.arange(items) // 2
    hits = []
    for _ in range(sims // chunk):
        pa = true_a + rng.normal(0, seed_sd, (chunk, seeds, 1))
        pb = true_b + rng.normal(0, seed_sd, (chunk, seeds, 1))
        a = rng.random((chunk, seeds, items)) < pa
        b = rng.random((chunk, seeds, items)) < pb
        d = stats.unit_means(a, twins) - stats.unit_means(b, twins)
        lo, hi = stats.t_bounds(d, 0.95)
        hits.append((lo <= true_a - true_b) & (true_a - true_b <= hi))
    return float(np.concatenate(hits).mean())


def test_seed_level_interval_covers_at_nominal_level():
    assert 0.93 <= _coverage(5) <= 0.97
    assert _coverage(3) >= 0.92


def test_one_seed_gives_no_interval():
    got = stats.seed_interval([0.7])
    assert got["estimate"] == 0.7 and math.isnan(got["ci_lo"]) and math.isnan(got["ci_hi"]) and math.isnan(got["sd"])
    assert math.isnan(stats.tost([0.7], [0.6], 0.05))


def test_twin_pairs_count_once():
    m = np.array([[1.0, 1.0, 0.0, 1.0, 1.0]])  # pairs {0, 1}, {2, 3} and a lone item 4
    assert stats.unit_means(m, np.array([0, 0, 1, 1, 2]))[0] == pytest.approx((1 + 0.5 + 1) / 3)


def test_paired_interval_matches_scipy():
    rng = np.random.default_rng(3)
    a, b = rng.random((5, 300)) < 0.8, rng.random((5, 300)) < 0.7
    got = stats.paired_seeds(a, b)
    d = a.mean(axis=1) - b.mean(axis=1)
    ref = sps.ttest_rel(a.mean(axis=1), b.mean(axis=1))
    assert got["p"] == pytest.approx(ref.pvalue) and got["estimate"] == pytest.approx(d.mean())
    ci = sps.ttest_1samp(d, 0).confidence_interval(0.95)
    assert (got["ci_lo"], got["ci_hi"]) == pytest.approx((ci.low, ci.high))


# --------------------------------------------------------------------------- (b) TOST, Holm, power
def test_tost_against_statsmodels_and_two_one_sided_tests():
    a = np.array([0.712, 0.701, 0.695, 0.720, 0.708])
    b = np.array([0.705, 0.699, 0.701, 0.711, 0.700])
    for margin in (0.005, 0.014, 0.03):
        p = stats.tost(a, b, margin)
        assert p == pytest.approx(ttost_paired(a, b, -margin, margin)[0])
        d = a - b  # TOST = the larger of the two one-sided p-values
        two = max(sps.ttest_1samp(d, -margin, alternative="greater").pvalue,
                  sps.ttest_1samp(d, margin, alternative="less").pvalue)
        assert p == pytest.approx(two)
    assert stats.tost(a, a, 0.01) == 0.0  # identical arms: zero spread strictly inside the margin


def test_holm_against_statsmodels():
    p = np.array([0.01, 0.04, 0.03, 0.005, np.nan, 0.2])
    got = stats.holm(p)
    ok = ~np.isnan(p)
    assert got[ok] == pytest.approx(multipletests(p[ok], method="holm")[1]) and np.isnan(got[4])
    assert got[ok] == pytest.approx([0.04, 0.09, 0.09, 0.025, 0.2])  # 0.005 x 5, 0.01 x 4, 0.03 x 3, ...
    assert stats.holm_levels(p, 0.05)[ok] == pytest.approx([0.05 / 4, 0.05 / 2, 0.05 / 3, 0.05 / 5, 0.05])


def test_seeds_for_power_is_the_smallest_that_reaches_it():
    n = stats.seeds_for_power(0.02, 0.03, 0.01)
    power = TTestPower()
    assert power.power(0.02 / 0.03, n, 0.01, alternative="larger") >= 0.8
    assert power.power(0.02 / 0.03, n - 1, 0.01, alternative="larger") < 0.8
    assert stats.seeds_for_power(-0.01, 0.03, 0.05) is None  # wrong direction: no number of seeds helps
    # an effect 1000 sds wide: statsmodels' root finder returns NaN there (the study's report stage crashed on it);
    # two seeds already give the power
    assert stats.seeds_for_power(10.0, 0.01, 0.001) == 2
    assert stats.seeds_for_power(0.05, 1e-14, 0.001) == 2  # an sd zero but for rounding: as sd == 0
    assert stats.seeds_for_power(1e-4, 0.05, 1e-3) is None  # beyond the cap
    assert stats.seeds_for_tost(0.0, 0.014, 0.01, 0.05) == stats.seeds_for_power(0.014, 0.01, 0.05, 0.9)


def test_pilot_sd_is_median_unbiased_for_the_variance():
    # Simulated 3-seed pilots (true sd 1): half their scaled variances fall below the truth, 63% of the raw ones.
    raw = np.random.default_rng(0).normal(0.0, 1.0, size=(4000, 3)).std(axis=1, ddof=1)
    scaled = np.array([stats.pilot_sd(s, 3) for s in raw])
    assert np.mean(raw**2 < 1) == pytest.approx(sps.chi2.cdf(2, 2), abs=0.03)
    assert np.mean(scaled**2 < 1) == pytest.approx(0.5, abs=0.03)
    assert stats.pilot_sd(1.0, 3) == pytest.approx(1.2011, abs=1e-4) and stats.pilot_sd(1.0, 200) < 1.01
    assert np.isnan(stats.pilot_sd(1.0, 1)) and np.isnan(stats.pilot_sd(math.nan, 5))


# --------------------------------------------------------------------------- (c) the gate on a tiny ledger
N = 400


def _params(archs: dict[str, list[str]]):
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["train"]["archs"] = {a: {"models": ARCHS[a].section, "tasks": t} for a, t in archs.items()}
    raw["train"]["grids"] = {}
    raw["train"]["seeds"] = list(range(5))  # _tiny's, not the committed first look's
    raw["distill"]["students"], raw["distill"]["teachers"] = {}, {}
    raw["report"]["bootstrap_samples"] = 200
    return parse_params(raw)


def _tiny(task: str, share: dict[str, float], subsets: dict[str, np.ndarray], seeds: int = 5):
    """runs frame + Items for one task: each arch right on a ``share`` of the test items, independently per
    seed (two classes, twins = adjacent items)."""
    rng = np.random.default_rng(0)
    labels = np.arange(N) % 2
    items = cells.Items({task: {"labels": labels, "subsets": {"test": np.arange(N), **subsets}, "factors": None}})
    rows = []
    for arch, p in share.items():
        for s in range(seeds):
            right = rng.random(N) < p
            logits = np.eye(2)[np.where(right, labels, 1 - labels)]
            run = f"{arch}/{task}/s{s}"
            items.add(run, task, np.arange(N), logits)
            rows.append({"source": "runs", "task": task, "arch": arch, "seed": s, "train_size": 4000,
                         "steps": 1000, "budget_mode": "steps", "data_seed": 0, "dir": run, "num_classes": 2,
                         "test_acc": float(right.mean()), "curve": []})
    return pd.DataFrame(rows), items


def test_an_arm_at_chance_makes_the_row_uninformative():
    ood = np.arange(0, N, 4)
    runs, items = _tiny("alignment", {"resnet": 0.5, "vit": 0.95}, {"slice/ood": ood,
                                                                   "slice/id": np.setdiff1d(np.arange(N), ood)})
    floors = {"alignment": {"chance": 0.5, "floor": 0.55, "floor_baseline": "tokens_bag",
                            "baselines": {"tokens_bag": {"acc": 0.55, "n": N}}}}
    led = ledger.judge(_params({"resnet": ["alignment"], "vit": ["alignment"]}), runs, items, floors, {}, 0)
    row = led.set_index("id").loc["alignment.resnet_vs_vit.alignment"]
    assert row.verdict == "uninformative"
    # base = max(chance 0.5, floor 0.55) = 0.55; learned at 0.55 + 0.5 x 0.45 = 0.775
    assert row.reason.startswith("resnet did not learn: in-distribution 0.") and "(needs >= 0.775)" in row.reason
    assert "vit" not in row.reason and np.isnan(row.p_holm) and row.needs_seeds == ""
    assert ledger.counts(led)["uninformative"] == 1


def test_both_arms_at_the_ceiling_make_the_row_uninformative():
    cross = np.arange(0, N, 2)
    runs, items = _tiny("relation", {"swin_local_shift": 1.0, "swin_local": 1.0}, {"slice/window=cross": cross})
    led = ledger.judge(_params({"swin_local_shift": ["relation"], "swin_local": ["relation"]}), runs, items, {},
                       {}, 0)
    row = led.set_index("id").loc["relation.shift.relation"]
    assert (row.verdict, row.reason) == ("uninformative", "both at ceiling on slice/window=cross: 1.000 and 1.000")
    assert (row.estimate, row.ci_lo, row.ci_hi) == (0.0, 0.0, 0.0)


def test_a_pair_at_the_ceiling_is_decided_on_how_soon_it_learned():
    """relation.attention_vs_mixer: both arms at 1.000 in accuracy, so the row compares the share of the step cap
    each left unused at the criterion, per seed; a seed that never reached the criterion makes it uninformative."""
    runs, items = _tiny("relation", {"vit": 1.0, "mixer": 1.0}, {})
    steps = {"vit": [100, 200, 100, 300, 100], "mixer": [600, 900, 500, 800, 700]}  # cap 1,000
    runs["criterion_step"] = [float(steps[a][s]) for a, s in zip(runs.arch, runs.seed, strict=True)]
    params = _params({"vit": ["relation"], "mixer": ["relation"]})
    row = ledger.judge(params, runs, items, {}, {}, 0).set_index("id").loc["relation.attention_vs_mixer.relation"]
    speed = 1 - np.array(steps["vit"]) / 1000 - (1 - np.array(steps["mixer"]) / 1000)
    assert row.subset == gate.SPEED and row.reason == "" and row.verdict == "held"
    assert row.estimate == pytest.approx(speed.mean()) and row.seed_sd == pytest.approx(speed.std(ddof=1))
    assert row.p == pytest.approx(sps.ttest_1samp(speed, 0).pvalue)
    assert (row.speed_a, row.speed_b) == pytest.approx((0.84, 0.30))  # the mean shares of the cap left
    assert (row.acc_a, row.acc_b) == (1.0, 1.0)  # and the arms' test accuracy, what a shortcut floor is held to
    runs.loc[(runs.arch == "mixer") & (runs.seed == 1), "criterion_step"] = math.nan  # stopped by the cap
    row = ledger.judge(params, runs, items, {}, {}, 0).set_index("id").loc["relation.attention_vs_mixer.relation"]
    assert (row.verdict, row.reason) == ("uninformative", "mixer did not reach train.criterion in 1 of 5 seeds")


def test_gate_rules():
    row = {"kind": "paired", "finding": "scale", "a": "x", "b": "y", "subset": "slice/ood"}
    m = {"seeds": 5, "in_a": 0.9, "in_b": 0.9, "learn_at": 0.75, "acc_a": 0.51, "acc_b": 0.50, "chance": 0.5}
    assert gate.gate(row, m, 0.01) == "both at chance on slice/ood: 0.510 and 0.500 (chance 0.500)"
    # budget rows need no learned arm (ceiling and chance rules only): off chance under one budget, decided
    assert gate.gate({**row, "finding": "budget"}, {**m, "in_a": 0.1, "acc_a": 0.7}, 0.01) == ""
    assert gate.gate({**row, "kind": "floor"}, {**m, "in_a": 0.1}, 0.01) == ""  # floors are not gated
    assert gate.gate(row, {**m, "acc_a": 0.7}, 0.01) == ""


def test_gate_where_learning_is_the_question():
    """In distribution a "+" row is decided when one arm learned (which one is the finding); an "= 0" row needs
    both; out of distribution both arms must have learned where the row says (``learned_on``)."""
    m = {"seeds": 5, "in_a": 0.98, "in_b": 0.50, "learn_at": 0.75, "acc_a": 0.98, "acc_b": 0.50, "chance": 0.5}
    plus = {"kind": "paired", "finding": "arrangement", "a": "vit_sincos", "b": "vit", "subset": "test",
            "expect": "+"}
    assert gate.gate(plus, m, 0.01) == ""
    assert gate.gate(plus, {**m, "in_a": 0.5, "acc_a": 0.52}, 0.01) == (
        "vit_sincos did not learn: in-distribution 0.500 (needs >= 0.750); "
        "vit did not learn: in-distribution 0.500 (needs >= 0.750)")
    assert gate.gate({**plus, "expect": "0"}, m, 0.01) == "vit did not learn: in-distribution 0.500 (needs >= 0.750)"
    cross = {**plus, "a": "swin_local_shift", "b": "swin_local", "subset": "slice/window=cross",
             "learned_on": "slice/window=same"}
    assert gate.gate(cross, m, 0.01) == "swin_local did not learn: slice/window=same 0.500 (needs >= 0.750)"
    assert gate.gate(cross, {**m, "in_b": 0.9}, 0.01) == ""


def test_learned_on_judges_learning_on_its_own_slice():
    """relation.shift: swin_local learned where its windows reach (same window) and not across them, so the row
    is decided on the cross-window slice; judged on the whole test set it would read "did not learn"."""
    same, cross = np.arange(0, N, 2), np.arange(1, N, 2)
    runs, items = _tiny("relation", {"swin_local_shift": 0.97, "swin_local": 0.5},
                        {"slice/window=cross": cross, "slice/window=same": same})
    labels = items.pools["relation"]["labels"]
    for run in runs[runs.arch == "swin_local"].dir:  # right on every same-window item, a coin flip across
        index, _, logits = items.runs[run]
        logits[same] = np.eye(2)[labels[same]]
        items.add(run, "relation", index, logits)
    led = ledger.judge(_params({"swin_local_shift": ["relation"], "swin_local": ["relation"]}), runs, items, {},
                       {}, 0)
    row = led.set_index("id").loc["relation.shift.relation"]
    assert row.reason == "" and row.in_b == 1.0 and row.verdict == "held"


def test_learn_fraction_is_validated():
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["report"]["learn_fraction_tasks"] = {"natural": 1.5}
    with pytest.raises(ConfigError, match="learn_fraction_tasks"):
        parse_params(raw)


# --------------------------------------------------------------------------- (d) margins
def test_every_contrast_declares_a_margin_within_its_anchor():
    frame = pd.read_csv(ROOT / "pipeline" / "report" / "contrasts.csv")
    assert frame.margin.notna().all() and (frame.margin > 0).all()
    assert frame.margin_reason.str.len().gt(0).all()
    anchored = frame[frame.anchor.notna()]
    assert len(anchored) and (anchored.margin <= anchored.anchor).all()
    default = _params({}).report.equivalence_margin
    contrasts.check_margins(contrasts.CONTRASTS, default)  # the default does not exceed the smallest anchor
    assert default <= anchored.anchor.min()
    with pytest.raises(ValueError, match="smallest anchored effect"):
        contrasts.check_margins(contrasts.CONTRASTS, 0.03)  # the old single margin contained Swin's +0.011


def test_learned_arms_are_decided_in_one_family():
    ood = np.arange(0, N, 4)
    runs, items = _tiny("alignment", {"resnet": 0.97, "vit": 0.85}, {"slice/ood": ood,
                                                                    "slice/id": np.setdiff1d(np.arange(N), ood)})
    led = ledger.judge(_params({"resnet": ["alignment"], "vit": ["alignment"]}), runs, items, {}, {}, 0)
    row = led.set_index("id").loc["alignment.resnet_vs_vit.alignment"]
    assert row.reason == "" and row.verdict == "held" and row.ci_lo > 0 and row.p_holm < 0.05
    # the family: this row's directional t and its TOST, nothing else (Holm: the smaller x 2, the larger x 1)
    assert row.p_holm == pytest.approx(min(1.0, 2 * row.p))
    assert row.p_tost_holm == pytest.approx(max(row.p_holm, row.p_tost))
    assert row.item_se > 0 and row.ci_method == "seed-level paired t (5 seeds)"
    assert (row.learned_a, row.learned_b) == (5, 5)  # seeds at or above the learn threshold (the plan reads them)
    assert {"margin", "margin_reason", "reason", "ci_method", "p_tost", "seeds_needed", "needs_seeds", "floor_lo",
            "floor_hi", "analytic_floor", "in_a", "in_b", "item_se"} <= set(led.columns)


def test_one_seed_rows_are_inconclusive_without_an_invented_number():
    ood = np.arange(0, N, 4)
    runs, items = _tiny("alignment", {"resnet": 0.97, "vit": 0.85}, {"slice/ood": ood}, seeds=1)
    led = ledger.judge(_params({"resnet": ["alignment"], "vit": ["alignment"]}), runs, items, {}, {}, 0)
    row = led.set_index("id").loc["alignment.resnet_vs_vit.alignment"]
    assert row.verdict == "inconclusive" and row.needs_seeds.startswith("2+ (one seed")
    assert np.isnan(row.ci_lo) and np.isnan(row.p) and pd.isna(row.seeds_needed)


def test_budget_row_at_chance_under_both_budgets_is_uninformative():
    """More steps that leave an arch at chance decide nothing about "cannot" vs "not yet"; a budget row whose
    main-budget arm is at chance but whose longer budget learned is still decided (that is its question)."""
    from pipeline.report.gate import gate

    row = {"kind": "paired", "finding": "budget", "subset": "test", "a": "vit", "b": "vit"}
    base = {"seeds": 3, "in_a": 0.49, "in_b": 0.48, "learn_at": 0.78, "chance": 0.5}
    assert gate(row, {**base, "acc_a": 0.49, "acc_b": 0.48}, 0.01).startswith("both at chance on test")
    assert gate(row, {**base, "in_a": 0.95, "acc_a": 0.95, "acc_b": 0.48}, 0.01) == ""


def test_reachability_floor_row_needs_the_arm_to_learn_where_its_windows_reach():
    """reach.swin_local ("at the floor across windows") is a reachability finding only if swin_local learned
    the relation inside one window; at chance everywhere it sits at the floor across windows for another reason."""
    same, cross = np.arange(0, N, 2), np.arange(1, N, 2)
    floors = {"relation": {"chance": 0.5, "floor": 0.53, "floor_baseline": "tokens_bag",
                           "baselines": {"tokens_bag": {"acc": 0.53, "n": N}}}}
    subsets = {"slice/window=cross": cross, "slice/window=same": same}
    params = _params({"swin_local": ["relation"]})

    runs, items = _tiny("relation", {"swin_local": 0.5}, subsets)
    row = ledger.judge(params, runs, items, floors, {}, 0).set_index("id").loc["reach.swin_local.relation"]
    # learn_at = base + 0.5 x (1 - base), base = max(chance, floor, analytic 0.75) = 0.75 -> 0.875
    assert row.verdict == "uninformative" and row.reason.startswith("swin_local did not learn: slice/window=same 0.")
    assert row.reason.endswith("(needs >= 0.875)")

    labels = items.pools["relation"]["labels"]
    for run in runs.dir:  # right on every same-window item, a coin flip across windows
        index, _, logits = items.runs[run]
        logits[same] = np.eye(2)[labels[same]]
        items.add(run, "relation", index, logits)
    row = ledger.judge(params, runs, items, floors, {}, 0).set_index("id").loc["reach.swin_local.relation"]
    assert row.reason == "" and row.in_a == 1.0 and row.verdict == "held"


def test_an_agreement_row_scores_the_students_against_their_teacher():
    """``agree/ood_teacher_wrong``: agreement with the a-arm's teacher on the out-of-distribution items it gets
    wrong. A student that copies the teacher there beats one given random labels at the same rate, while both
    learned in distribution (the gate reads accuracy, not agreement)."""
    rng = np.random.default_rng(1)
    labels = np.arange(N) % 2
    ood = np.arange(0, N, 4)
    items = cells.Items({"alignment": {"labels": labels, "factors": None, "subsets": {
        "test": np.arange(N), "slice/ood": ood, "slice/id": np.setdiff1d(np.arange(N), ood)}}})
    teacher = labels.copy()
    teacher[ood[::2]] = 1 - teacher[ood[::2]]  # wrong on half of the unseen items, right elsewhere
    items.add("teacher", "alignment", np.arange(N), np.eye(2)[teacher])
    rows = [{"source": "teachers", "task": "alignment", "arch": "vit", "seed": 0, "dir": "teacher",
             "train_size": 4000, "steps": 1000, "budget_mode": "steps", "data_seed": 0, "num_classes": 2,
             "test_acc": float((teacher == labels).mean()), "curve": []}]
    for arch in ("deit_vit_transfer", "deit_vit_relabel"):
        for s in range(5):
            said = np.where(rng.random(N) < 0.97, labels, 1 - labels)
            said[ood] = teacher[ood] if arch == "deit_vit_transfer" else rng.integers(0, 2, len(ood))
            items.add(f"{arch}/{s}", "alignment", np.arange(N), np.eye(2)[said])
            rows.append({**rows[0], "source": "runs", "arch": arch, "seed": s, "dir": f"{arch}/{s}",
                         "test_acc": float((said == labels).mean())})
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["train"]["archs"], raw["train"]["grids"] = {"vit": {"models": "vit", "tasks": ["alignment"]}}, {}
    raw["distill"]["teachers"] = {"vit": "vit"}
    raw["distill"]["students"] = {a: {"teacher": "vit", "tasks": ["alignment"], "transfer": True, **extra}
                                  for a, extra in (("deit_vit_transfer", {}),
                                                   ("deit_vit_relabel", {"targets": "relabel"}))}
    raw["report"]["bootstrap_samples"] = 200
    raw["tasks"]["alignment"]["transfer_n"] = 100  # the students' transfer set (here only its name matters)
    raw["train"]["seeds"], raw["plan"]["max_seeds"] = list(range(5)), 5  # one look at the whole alpha
    led = ledger.judge(parse_params(raw), pd.DataFrame(rows), items, {}, {}, 0)
    row = led.set_index("id").loc["distill.inherit.alignment"]
    assert row["items"] == len(ood) // 2 and row.acc_a == 1.0 and 0.3 < row.acc_b < 0.7
    assert row.in_a > 0.95 and row.verdict == "held" and row.reason == ""


def test_with_several_teachers_each_student_is_scored_against_its_own():
    """Three teachers per type, students paired by seed (seed s: teacher s % 3). ``agree/ood_teacher_wrong`` is
    where every ViT teacher is wrong (the type's shared errors), each student scored against its own teacher's
    predictions there; ``teachers/ood`` is where the CNN teachers are right and the ViT teachers wrong by
    majority, and the CNN-teacher students, copying theirs, win there."""
    rng = np.random.default_rng(2)
    labels = np.arange(N) % 2
    ood = np.arange(0, N, 4)
    items = cells.Items({"alignment": {"labels": labels, "factors": None, "subsets": {
        "test": np.arange(N), "slice/ood": ood, "slice/id": np.setdiff1d(np.arange(N), ood)}}})
    shared, base = ood[::2], {"task": "alignment", "train_size": 4000, "steps": 1000, "budget_mode": "steps",
                              "data_seed": 0, "num_classes": 2, "curve": []}
    said, rows = {}, []
    for arch in ("vit", "resnet"):
        for k in range(3):
            t = labels.copy()
            if arch == "vit":
                t[shared] = 1 - t[shared]  # every ViT teacher wrong on the shared items
                own = ood[1::2][k::3]  # and each on a few of its own
                t[own] = 1 - t[own]
            said[arch, k] = t
            items.add(f"t/{arch}/{k}", "alignment", np.arange(N), np.eye(2)[t])
            rows.append({**base, "source": "teachers", "arch": arch, "seed": k, "dir": f"t/{arch}/{k}",
                         "test_acc": float((t == labels).mean()), "teacher_seed": math.nan})
    for arch, teacher in (("deit_vit_transfer", "vit"), ("deit_vit_relabel", "vit"), ("deit_transfer", "resnet")):
        for s in range(6):
            out = np.where(rng.random(N) < 0.97, labels, 1 - labels)
            copy = said[teacher, s % 3]
            out[ood] = rng.integers(0, 2, len(ood)) if arch == "deit_vit_relabel" else copy[ood]
            items.add(f"{arch}/{s}", "alignment", np.arange(N), np.eye(2)[out])
            rows.append({**base, "source": "runs", "arch": arch, "seed": s, "dir": f"{arch}/{s}",
                         "test_acc": float((out == labels).mean()), "teacher_seed": float(s % 3)})
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["train"]["archs"], raw["train"]["grids"] = {"vit": {"models": "vit", "tasks": ["alignment"]}}, {}
    raw["distill"]["teachers"] = {"vit": "vit", "resnet": "resnet"}
    raw["distill"]["students"] = {a: {"teacher": t, "tasks": ["alignment"], "transfer": True, **extra}
                                  for a, t, extra in (("deit_vit_transfer", "vit", {}),
                                                      ("deit_vit_relabel", "vit", {"targets": "relabel"}),
                                                      ("deit_transfer", "resnet", {}))}
    raw["report"]["bootstrap_samples"] = 200
    raw["tasks"]["alignment"]["transfer_n"] = 100
    raw["train"]["seeds"], raw["plan"]["max_seeds"] = list(range(6)), 6
    led = ledger.judge(parse_params(raw), pd.DataFrame(rows), items, {}, {}, 0).set_index("id")
    inherit = led.loc["distill.inherit.alignment"]
    assert inherit["items"] == len(shared) and inherit.acc_a == 1.0 and 0.3 < inherit.acc_b < 0.7
    split = led.loc["distill.type_split_vit.alignment"]  # ViT right, CNN wrong: no such item here
    assert split["items"] == 0 or split.seeds == 0
    cnn = led.loc["distill.type_split_cnn.alignment"]  # CNN right, ViT wrong by majority: the shared items
    assert cnn["items"] == len(shared) and cnn.acc_a == 1.0 and cnn.acc_b == 0.0 and cnn.estimate == 1.0


def test_the_chance_rule_reads_accuracy_not_agreement():
    """Both arms agreeing with a wrong teacher at or below a random guess's rate is two students mostly right where
    the teacher is wrong: a measurement, not two arms that learned nothing (the rule that gates accuracy rows)."""
    row = {"kind": "paired", "finding": "distillation", "a": "x", "b": "y", "subset": "agree/ood_teacher_wrong",
           "expect": "+"}
    m = {"seeds": 5, "in_a": 0.96, "in_b": 0.96, "learn_at": 0.9, "acc_a": 0.505, "acc_b": 0.394, "chance": 0.5}
    assert gate.gate(row, m, 0.01) == ""
    assert gate.gate({**row, "subset": "slice/ood"}, m, 0.01).startswith("both at chance on slice/ood")
    assert gate.gate(row, {**m, "acc_a": 1.0, "acc_b": 0.995}, 0.01).startswith("both at ceiling")
