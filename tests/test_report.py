"""Report: interval maths, ledger verdicts, predictions from params only, and the stage on synthetic runs."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import yaml

from pipeline.config import Params, parse_params
from pipeline.errors import ConfigError
from pipeline.report import aggregate as agg
from pipeline.report import ledger
from pipeline.stages import report as report_stage

T_975_DF1 = 12.706204736174707  # Student-t 97.5% quantile, 1 degree of freedom (statistical tables)
Z_975 = 1.959963984540054


def test_t_interval_two_seeds_by_hand():
    s = agg.t_interval([0.8, 0.9], 0.95)
    sd = math.sqrt(((0.8 - 0.85) ** 2 + (0.9 - 0.85) ** 2) / 1)  # ddof = 1
    half = T_975_DF1 * sd / math.sqrt(2)
    assert s["n"] == 2 and s["mean"] == pytest.approx(0.85) and s["sd"] == pytest.approx(sd)
    assert (s["ci_lo"], s["ci_hi"]) == pytest.approx((0.85 - half, 0.85 + half))
    assert s["ci_lo"] == pytest.approx(0.21469, abs=1e-5)


def test_one_seed_has_no_interval():
    s = agg.t_interval([0.7])
    assert s["mean"] == 0.7 and math.isnan(s["sd"]) and math.isnan(s["ci_lo"]) and math.isnan(s["ci_hi"])
    table = agg.summarise(pd.DataFrame({"arch": ["a"], "acc": [0.7]}), ["arch"], "acc")
    assert table.n.tolist() == [1] and table.ci_lo.isna().all()


def test_ledger_interval_adds_test_sampling_error():
    one = agg.ledger_interval([0.5], n_test=400)  # binomial only: z * sqrt(0.25 / 400)
    assert one["half"] == pytest.approx(Z_975 * 0.025)
    two = agg.ledger_interval([0.8, 0.9], n_test=400)
    binom = Z_975 * math.sqrt(0.85 * 0.15 / 400)
    assert two["half"] == pytest.approx(math.hypot(T_975_DF1 * 0.05, binom))


def test_parse_slice_and_agreement():
    assert agg.parse_slice("slice/offset=1,2") == ("offset", "1,2")
    assert agg.parse_slice("slice/ood") == ("split", "ood")
    a = np.eye(3, dtype=np.float32)[[0, 1, 2, 0]]
    b = np.eye(3, dtype=np.float32)[[0, 1, 1, 1]]
    # matched by index, not order: b lists the same samples reversed
    assert agg.agreement(np.arange(4), a, np.arange(4)[::-1], b[::-1]) == 0.5


def _iv(mean, lo, hi, half=None):
    return {"n": 2, "mean": mean, "ci_lo": lo, "ci_hi": hi, "half": (hi - lo) / 2 if half is None else half}


@pytest.mark.parametrize("interval, expected", [
    (_iv(0.50, 0.48, 0.52), "held"),
    (_iv(0.55, 0.40, 0.70), "inconclusive"),  # contains 0.5 but wider than decisive_width
    (_iv(0.70, 0.65, 0.75), "failed"),
])
def test_equals_verdicts(interval, expected):
    pred = ledger.Prediction("p", "at chance", "exact", "b", "equals", "t", "a", value=0.5)
    assert ledger.verdict(pred, interval, None, decisive_width=0.1)[0] == expected


@pytest.mark.parametrize("a, b, expected", [
    (_iv(0.9, 0.85, 0.95), _iv(0.6, 0.55, 0.65), "held"),
    (_iv(0.6, 0.55, 0.65), _iv(0.9, 0.85, 0.95), "failed"),
    (_iv(0.7, 0.5, 0.9), _iv(0.6, 0.4, 0.8), "inconclusive"),
])
def test_greater_verdicts(a, b, expected):
    pred = ledger.Prediction("p", "a beats b", "qualitative", "b", "greater", "t", "a", other="b")
    assert ledger.verdict(pred, a, b, 0.1)[0] == expected
    assert ledger.verdict(pred, None, b, 0.1)[0] == "not run"
    untestable = ledger.Prediction("u", "c", "exact", "b", "untestable", reason="why")
    assert ledger.verdict(untestable, a, b, 0.1)[0] == "untestable"


def _reach(reachable: dict[int, float]) -> dict:
    rows = [{"chebyshev": c, "reachable": r} for c, r in reachable.items()]
    return {"archs": {"swin_noshift": {"depth": 1, "layers_for_all_pairs": -1, "by_distance": rows}}}


def test_predictions_come_from_params_and_interface_only():
    params = Params()
    preds = {p.id: p for p in ledger.predictions(params)}
    chance = preds["chance.vit_nopos.arrangement"]
    assert (chance.kind, chance.value, chance.level) == ("equals", 0.5, "exact")
    assert preds["window.swin_vs_noshift"].metric == "slice/window=cross"
    # distances 1 cell (px 1..7) connected, 2 cells (px 5..11) partly, 3 cells (px 9..15) never
    reach = _reach({c: 1.0 if c <= 7 else 0.0 for c in range(16)})
    got = {p.id: p for p in ledger.reachability_predictions(params, reach, ["swin_noshift"])}
    assert got["reach.swin_noshift.d3"].kind == "equals"
    assert got["reach.swin_noshift.d3"].metric == "slice/distance_tokens=3"
    assert "reach.swin_noshift.d2" not in got and got["reach.swin_noshift"].kind == "untestable"
    narrow = ledger.collision_predictions(params, {"vit": 40}, ["vit"])[0]
    wide = ledger.collision_predictions(params, {"vit": 64}, ["vit"])[0]
    assert "holds by algebra" in narrow.reason and "not testable" in wide.reason


def test_bad_report_params_name_the_key():
    raw = Params().model_dump(mode="json")
    raw["report"]["confidence"] = 1.5
    with pytest.raises(ConfigError, match=r"report\.confidence"):
        parse_params(raw)
    raw["report"] = {"confidence": 0.9, "colour": "red"}
    with pytest.raises(ConfigError, match=r"report\.colour: unknown key"):
        parse_params(raw)


# --------------------------------------------------------------------------- the stage on synthetic runs
def _write_run(folder, task, arch, seed, acc, labels_pred, k=2, teacher=None, slices=None):
    folder.mkdir(parents=True, exist_ok=True)
    n = len(labels_pred)
    budget = {"params": 1000, "optimizer_steps": 10, "batch_size": 4, "images_seen": 40, "tokens_per_image": 16,
              "tokens_seen": 640, "forward_flops_per_image": 100, "train_flops": 12000,
              "teacher_forward_flops": 400 if teacher else 0, "teacher_train_flops": 5000 if teacher else 0,
              "total_flops_with_teacher": 17400 if teacher else 12000, "flops_convention": "2 per MAC"}
    metrics = {"task": task, "arch": arch, "model": arch, "seed": seed, "train_size": 40, "test_acc": acc,
               "val_acc": acc, "shift_consistency": 0.9, "slices": {"test": {"acc": acc, "n": n}, **(slices or {})},
               "budget": budget, "measured": {"wall_time_s": 1.0, "images_per_s": 40.0, "peak_rss_mb": 10.0},
               "mlflow_run_id": f"{arch}{seed}", **({"teacher": {"arch": teacher}} if teacher else {})}
    (folder / "metrics.json").write_text(json.dumps(metrics))
    logits = np.eye(k, dtype=np.float32)[np.asarray(labels_pred)]
    np.savez(folder / "predictions.npz", index=np.arange(n, dtype=np.int64), logits=logits)


def test_stage_on_synthetic_runs(tmp_path):
    raw = Params().model_dump(mode="json")
    raw["train"]["archs"] = {"vit": "vit", "vit_nopos": "vit", "resnet": "resnet"}
    raw["distill"]["teachers"] = {"resnet": "resnet"}
    raw["distill"]["students"] = {"deit": "resnet"}
    raw["distill"]["tasks"] = ["arrangement"]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    runs, teachers = tmp_path / "runs", tmp_path / "teachers"
    teacher_pred = [0, 1] * 1000  # 2000 test samples
    _write_run(teachers / "resnet" / "arrangement", "arrangement", "resnet", 0, 0.9, teacher_pred)
    for seed in (0, 1):
        def d(arch: str, seed: int = seed):
            return runs / arch / "arrangement" / "n40" / f"s{seed}"

        _write_run(d("vit_nopos"), "arrangement", "vit_nopos", seed, 0.5, [0] * 2000)
        _write_run(d("vit"), "arrangement", "vit", seed, 0.6 + 0.1 * seed, teacher_pred)
        _write_run(d("resnet"), "arrangement", "resnet", seed, 0.95, teacher_pred,
                   slices={"slice/dcol=1": {"acc": 0.9, "n": 500}})
        _write_run(d("deit"), "arrangement", "deit", seed, 0.7, teacher_pred[:1500] + [0] * 500, teacher="resnet")
    out = tmp_path / "reports"
    rc = report_stage.main(["--params", str(tmp_path / "params.yaml"), "--runs", str(runs), "--curve",
                            str(tmp_path / "absent"), "--teachers", str(teachers), "--out", str(out)])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["test_acc"]["arrangement"]["vit"] == pytest.approx(0.65)
    led = pd.read_csv(out / "tables" / "ledger.csv").set_index("id")
    assert led.loc["chance.vit_nopos.arrangement", "verdict"] == "held"
    assert led.loc["position.vit_vs_nopos", "verdict"] == "inconclusive"  # 0.6/0.7: too wide with 2 seeds
    assert led.loc["distill.deit_vs_vit.arrangement", "verdict"] == "inconclusive"
    dist = pd.read_csv(out / "tables" / "distillation.csv").set_index(["arch", "source"])
    assert dist.loc[("vit", "runs"), "agree_resnet"] == 1.0  # label-only vit, as the baseline
    assert ("vit_nopos", "runs") not in dist.index  # only students and the label-only vit are attributed
    assert dist.loc[("deit", "runs"), "agree_resnet"] == pytest.approx(1750 / 2000)
    assert "not run" in (out / "tables" / "size_curve.md").read_text()
    readme = (out / "README.md").read_text()
    for link in ("tables/ledger.md", "figures/alignment_offset.png", "interface/interface.md", "budget/README.md",
                 "samples/arrangement.png"):
        assert f"]({link})" in readme
    assert "vit_nopos" in readme and "Prediction ledger: " in readme
    for name in ("alignment_offset", "scale_size", "relation_distance", "relation_window", "data_size",
                 "learning_curves"):
        assert (out / "figures" / f"{name}.png").stat().st_size > 0
    plot = pd.read_csv(out / "tables" / "plot_alignment_offset.csv")
    # fixed columns for dvc plots: every configured arch, empty where it was not run on the task
    assert plot.columns[0] == "x" and set(plot.columns[1:]) == {"vit", "vit_nopos", "resnet", "deit"}
    # nothing to report is a one-line error (exit 2), not a traceback
    assert report_stage.main(["--params", str(tmp_path / "params.yaml"), "--runs", str(tmp_path / "none"),
                              "--out", str(tmp_path / "r2")]) == 2
