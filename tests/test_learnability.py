"""The learnability table, how old runs read, and how a finding is labelled (hand-built frames, no files but
one metrics.json)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from pipeline import readme
from pipeline.report import aggregate as agg
from pipeline.report import learnability as learn
from pipeline.report import markdown, sources

CONFIG = {"train_size": 40, "steps": 1000, "budget_mode": "criterion"}
FLOORS = {"alignment": {"chance": 0.25, "floor": 0.385}}


def _metrics(arch: str, seed: int, id_acc: float, ood_acc: float | None = None, task: str = "alignment",
             curve_hit: int | None = None, **new) -> dict:
    """A metrics.json record; ``new``: the keys training to a criterion adds (left out: an old run)."""
    slices = {"test": {"acc": id_acc, "n": 100}}
    if ood_acc is not None:
        slices |= {"slice/id": {"acc": id_acc, "n": 50}, "slice/ood": {"acc": ood_acc, "n": 50}}
    curve = [{"step": s, "train_loss": 1.0, "val_acc": 0.95 if curve_hit and s >= curve_hit else 0.3}
             for s in (250, 500, 750, 1000)]
    return {"task": task, "arch": arch, "seed": seed, "data_seed": 0, "train_size": 40, "steps": 1000,
            "budget_mode": "criterion", "num_classes": 4, "test_acc": id_acc, "val_acc": id_acc, "slices": slices,
            "curve": curve, "budget": {"optimizer_steps": 1000}, "source": "runs", "dir": f"{arch}/{task}/{seed}",
            **new}


def _runs() -> pd.DataFrame:
    """resnet learns (criterion at 300/400/500); vit stays at chance (criterion never held); resnet_s1 is an old
    run (no new keys; its curve crosses 0.9 at step 500 for two seeds of three); relation: one seed, no slices."""
    recs = [_metrics("resnet", s, acc, 0.4 + s / 10, steps_done=step, criterion_step=step, stop_reason="criterion",
                      lr=2e-3)
            for s, (acc, step) in enumerate([(0.95, 300), (0.97, 400), (0.96, 500)])]
    recs += [_metrics("vit", s, acc, 0.2, steps_done=1000 if s else 600, criterion_step=None,
                      stop_reason="cap" if s else "plateau") for s, acc in enumerate([0.26, 0.24, 0.25])]
    recs += [_metrics("resnet_s1", s, 0.9, 0.85, curve_hit=500 if s < 2 else None) for s in range(3)]
    recs += [_metrics("swin", 0, 0.5, task="relation", curve_hit=None)]
    return agg.runs_frame(recs)


def _table(runs: pd.DataFrame) -> pd.DataFrame:
    floor = {"alignment": 0.385, "relation": math.nan}
    return learn.learnability_table(runs, CONFIG, FLOORS, floor, 0.9, 0.5, 0.95).set_index(["task", "arch"])


def test_learn_threshold_from_chance_or_floor_and_per_task_fraction():
    assert learn.learn_threshold(0.25, math.nan, 0.5) == 0.625
    assert learn.learn_threshold(0.25, 0.385, 0.5) == pytest.approx(0.6925)  # the floor is the higher base
    assert learn.learn_threshold(0.5, 0.2, 0.5) == 0.75
    assert learn.learned(0.6925, 0.25, 0.385, 0.5) and not learn.learned(math.nan, 0.25, 0.385, 0.5)
    rp = SimpleNamespace(learn_fraction=0.6, learn_fraction_tasks={"scale": 0.3})
    assert (learn.learn_fraction(rp, "scale"), learn.learn_fraction(rp, "alignment")) == (0.3, 0.6)
    assert learn.learn_fraction(SimpleNamespace(), "scale") == 0.5  # params without the keys: the default


def test_learnability_table_learned_chance_and_not_reached():
    t = _table(_runs())
    assert list(t.index) == [("alignment", "resnet"), ("alignment", "resnet_s1"), ("alignment", "vit"),
                             ("relation", "swin")]  # task, then arch
    res, vit, old, one = (t.loc[k] for k in [("alignment", "resnet"), ("alignment", "vit"),
                                              ("alignment", "resnet_s1"), ("relation", "swin")])
    half = sps.t.ppf(0.975, 2) * np.std([0.95, 0.97, 0.96], ddof=1) / math.sqrt(3)
    assert res.id_mean == pytest.approx(0.96) and res.id_lo == pytest.approx(0.96 - half)
    assert (res.learned, res.k_criterion, res.median_steps_to_criterion) == ("yes", 3, 400.0)
    assert res.stop_reasons == "criterion 3" and res.ood_mean == pytest.approx(0.5)
    assert res.learn_at == pytest.approx(0.6925) and res.chance == 0.25
    assert (res.lr, old.lr) == ("0.002", "-")  # the cell's tuned rate; a run that recorded none
    # at chance, criterion recorded as never held: "not reached", whatever its curve says
    assert (vit.learned, vit.k_criterion) == ("no", 0) and math.isnan(vit.median_steps_to_criterion)
    assert vit.stop_reasons == "cap 2, plateau 1"
    # an old run: read off the curve (two seeds cross 0.9 at step 500), stopped by the cap
    assert (old.k_criterion, old.median_steps_to_criterion, old.stop_reasons) == (2, 500.0, "cap 3")
    # one seed, a task without id/ood slices: test accuracy, no interval, no ood; chance from num_classes
    assert one.id_mean == 0.5 and math.isnan(one.id_lo) and math.isnan(one.ood_mean) and one.chance == 0.25
    view = learn.learnability_view(t.reset_index())
    assert view.iloc[0]["reached criterion"] == "3 of 3, median step 400"
    assert view.iloc[2]["reached criterion"] == "0 of 3 (not reached)"
    assert "(one seed)" in view.iloc[3]["in-distribution acc (seed CI)"]


def test_old_metrics_without_criterion_keys_are_read(tmp_path):
    old = _metrics("vit", 0, 0.7)
    for key in ("source", "dir"):
        old.pop(key)
    (tmp_path / "vit").mkdir()
    (tmp_path / "vit" / "metrics.json").write_text(json.dumps(old))
    runs = agg.runs_frame(sources.read_metrics(tmp_path, "runs"))
    r = runs.iloc[0]
    assert (r.stop_reason, r.steps_done, bool(r.criterion_recorded)) == ("cap", 1000.0, False)
    assert math.isnan(r.criterion_step) and r.id_acc == 0.7 and math.isnan(r.ood_acc)
    new = sources.run_outcome({"steps": 1000, "steps_done": 420, "criterion_step": None, "stop_reason": "plateau"})
    assert (new["steps_done"], new["criterion_recorded"], new["stop_reason"]) == (420.0, True, "plateau")
    assert math.isnan(new["criterion_step"])  # recorded as null: not reached (no curve fallback)


# --------------------------------------------------------------------------- finding labels
def _row(rid: str, verdict: str, kind: str = "paired", **extra) -> dict:
    return {"id": rid, "finding": rid.split(".")[0], "kind": kind, "task": "alignment", "a": "a", "b": "b",
            "subset": "slice/ood", "isolates": "x", "estimate": 0.1, "ci_lo": 0.05, "ci_hi": 0.15,
            "floor": np.nan, "floor_baseline": "", "verdict": verdict, "needs_seeds": None, **extra}


def _status(rows: list[dict]) -> dict:
    g = pd.DataFrame(rows)
    return markdown.finding_status("alignment", g, g.iloc[0])


def test_held_lead_with_an_explained_failure_stays_supported():
    st = _status([_row("alignment.stride.alignment", "held"), _row("alignment.resnet_vs_vit.alignment", "failed")])
    assert st["label"] == "supported" and st["contradicts"] == [] and st["supports"] == ["alignment.stride.alignment"]
    assert "stride" in st["explained"]["alignment.resnet_vs_vit.alignment"]
    assert markdown.explains("scale", "alignment.resnet_vs_vit.alignment") is None  # only its own finding


def test_held_lead_with_an_unexplained_informative_failure_is_contradicted():
    rows = [_row("alignment.stride.alignment", "held", reason="", uninformative=False),
            _row("alignment.overlap.alignment", "failed", reason="", uninformative=False),
            _row("alignment.antialias.alignment", "failed", reason="resnet_aa did not learn", uninformative=True)]
    st = _status(rows)
    assert st["label"] == "contradicted" and st["contradicts"] == ["alignment.overlap.alignment"]
    assert st["uninformative"] == ["alignment.antialias.alignment"]  # flagged: never contradicts


def test_uninformative_or_inconclusive_lead_is_undecided():
    why = "resnet_s1 did not learn: in-distribution 0.287 (needs >= 0.650)"
    st = _status([_row("alignment.stride.alignment", "uninformative", reason=why),
                  _row("alignment.overlap.alignment", "held", reason="")])
    assert st["label"] == f"undecided (lead uninformative: {why})" and st["supports"] == ["alignment.overlap.alignment"]
    st = _status([_row("alignment.stride.alignment", "inconclusive", needs_seeds=9)])
    assert st["label"] == "undecided (inconclusive: needs 9 seeds)"
    # with the row's detectable effect and SESOI: what it could see, and what its effect of interest asks for
    st = _status([_row("alignment.stride.alignment", "inconclusive", needs_seeds=">200", seeds=3, detectable=0.21,
                       sesoi=0.06)])
    assert st["label"] == "undecided (inconclusive: could detect 0.21 at 3 seeds; >200 seeds for its effect of " \
                          "interest 0.06)"
    st = _status([_row("alignment.stride.alignment", "inconclusive", needs_seeds=">200", seeds=3, detectable=1.99,
                       sesoi=0.06)])  # a power too low to see even the whole scale says so, not "could detect 1.99"
    assert "no effect within the accuracy scale detectable at 3 seeds" in st["label"]
    text = markdown.findings(pd.DataFrame([_row("alignment.stride.alignment", "uninformative", reason=why)]))[0]
    assert text.startswith("**alignment: undecided.** alignment.stride.alignment: not stated") and \
        f"Why undecided: lead uninformative: {why}." in text  # plain words first, the reason after


def test_natural_reads_smoke_when_no_row_is_informative_and_names_arms_below_the_pooled_floor():
    """Natural images: no informative row reads "smoke" (no finding: the FINDING pattern of the profile headers
    does not count it); an informative lead whose arm sits below the pooled floor shown beside says so."""
    why = "a shortcut reaches test: kmeans_global 0.462 (vit 0.402; needs >= 0.522)"
    rows = [_row("natural.position.natural", "uninformative", reason=why, task="natural"),
            _row("natural.resnet_vs_vit.natural", "uninformative", reason=why, task="natural")]
    g = pd.DataFrame(rows)
    st = markdown.finding_status("natural", g, g.iloc[0])
    assert st["label"].startswith("smoke (") and "natural profiles" in st["label"] and st["beside"] == ""
    text = markdown.findings(g)[0]
    assert text.startswith("**natural: smoke.**") and "not stated" in text
    other = pd.DataFrame([_row("alignment.stride.alignment", "uninformative", reason=why)])
    assert markdown.finding_status("alignment", other, other.iloc[0])["label"].startswith("undecided")
    seen = dict(task="natural", acc_a=0.70, acc_b=0.59, beside_floor=0.60, beside_baseline="kmeans_pooled")
    g = pd.DataFrame([_row("natural.resnet_vs_vit.natural", "held", a="resnet", b="vit", **seen)])
    st = markdown.finding_status("natural", g, g.iloc[0])
    assert st["label"] == "supported" and st["beside"] == "below the pooled floor kmeans_pooled 0.600: vit 0.590"
    assert markdown.findings(g)[0].startswith(
        "**natural: supported (below the pooled floor kmeans_pooled 0.600: vit 0.590).**")
    g = pd.DataFrame([_row("natural.resnet_vs_vit.natural", "held", **{**seen, "acc_b": 0.61})])
    assert markdown.finding_status("natural", g, g.iloc[0])["beside"] == ""  # both clear it: nothing to say


def test_a_lead_whose_arms_learned_in_all_and_none_of_their_seeds_says_what_its_p_assumes():
    """3 of 3 seeds learned against 0 of 3: the lead's t test (p ~ 1e-5) reads that as normal spread, and the exact
    test on the counts (Fisher: 0.10) does not reach alpha, so both README writers say so beside "supported"
    (docs/methods.md, Error rates); not where the exact test reaches alpha, the counts agree, the lead decides
    nothing, or no alpha is asked for (the label's own callers)."""
    def lead(verdict: str = "held", **extra) -> pd.DataFrame:
        return pd.DataFrame([_row("arrangement.sincos.arrangement", verdict, task="arrangement", subset="test",
                                  **{"seeds": 3, "learned_a": 3, "learned_b": 0, **extra})])

    g = lead()
    st = markdown.finding_status("arrangement", g, g.iloc[0], 0.05)
    assert st["label"] == "supported" and st["caveat"] == "its arms learned in 3 and 0 of 3 seeds (Fisher's exact " \
                                                          "p = 0.10)"
    assert f"(3 seeds). But {st['caveat']}: its t test assumes normal spread (docs/methods.md, Error rates)." \
        in markdown.findings(g, 0.05)[0]
    assert readme.finding_lines(g, "95")[0].endswith(
        f"**supported**: the lead contrast held its Holm-corrected test on 3 seeds; but {st['caveat']}.")
    assert readme.finding_lines(g, "")[0].endswith("on 3 seeds.")  # no level recorded: no alpha to compare with
    assert markdown.finding_status("arrangement", g, g.iloc[0])["caveat"] == ""
    for g in (lead(seeds=10, learned_a=10),  # 10 of 10 against 0 of 10: Fisher 1e-5, the counts decide it too
              lead(learned_b=3), lead("inconclusive"), lead(kind="floor")):
        assert markdown.finding_status("arrangement", g, g.iloc[0], 0.05)["caveat"] == "", g.iloc[0].to_dict()


def test_row_counts_per_type_and_in_words():
    led = pd.DataFrame([_row("alignment.stride.alignment", "held"), _row("alignment.x.alignment", "inconclusive"),
                        _row("alignment.overlap.alignment", "uninformative"),
                        _row("reach.x.relation", "held", kind="floor"), _row("exact.x", "failed", kind="exact"),
                        _row("budget.vit.a.steps4000", "not run")])
    rows = markdown.row_counts(led)
    assert rows["paired"] == {"rows": 3, "informative": 2, "uninformative": 1, "decided": 1, "inconclusive": 1,
                              "not run": 0}
    assert list(rows) == ["paired", "floor", "exact", "budget"] and rows["budget"]["not run"] == 1
    assert "paired: 1 of 3 decided" in markdown.counts_text(rows)
    assert markdown.verdict_counts(led)["uninformative"] == 1


def test_a_lead_is_never_explained_away():
    st = _status([_row("alignment.resnet_vs_vit.alignment", "failed")])  # an explained id, but here the lead
    assert st["label"] == "contradicted" and st["contradicts"] == ["alignment.resnet_vs_vit.alignment"]
