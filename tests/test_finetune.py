"""The ``finetune`` stage (pipeline/finetune.py): a trained run mapped to another size, scored, fine-tuned there and
scored again; a fixed-grid family skipped with its reason; finished results kept; bad settings refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tiny_repo
import torch
import yaml

from pipeline import finetune
from pipeline.config import Params, load_params
from pipeline.errors import ConfigError
from pipeline.grid import Folders
from pipeline.models import build_model
from pipeline.report import finetune as page
from pipeline.stages import finetune as stage


def _fake_runs(ws: Path, params: Params) -> list:
    """Weights of freshly built models and a metrics.json with a test accuracy, where the train stage writes them:
    the fine-tuning reads nothing else of a run."""
    specs = finetune.specs(params, Folders(ws / "data/tasks", ws / "data/slices", ws / "data/runs", ws / "ckpt"))
    for s in specs:
        s.out_dir.mkdir(parents=True)
        torch.manual_seed(s.key.seed)
        torch.save(build_model(s.model, params, 2).state_dict(), s.out_dir / "weights.pt")
        (s.out_dir / "metrics.json").write_text(json.dumps({
            "task": s.key.task, "arch": s.key.arch, "seed": s.key.seed, "train_size": s.key.train_size,
            "test_acc": 0.25, "val_acc": 0.25, "slices": {"test": {"acc": 0.25}}}))
    return specs


def _argv(ws: Path) -> list[str]:
    return ["--params", str(ws / "params.yaml"), "--data", str(ws / "data/tasks"), "--slices", str(ws / "data/slices"),
            "--runs", str(ws / "data/runs"), "--out", str(ws / "data/finetune"), "--report", str(ws / "reports/ft")]


def test_runs_are_fine_tuned_at_the_size_and_a_fixed_grid_is_skipped(copy_workspace, capsys):
    ws = copy_workspace
    raw = yaml.safe_load((ws / "params.yaml").read_text())
    raw["train"]["archs"] = {a: {"models": "vit", "tasks": ["alignment"]} for a in ("vit", "vit_nopos", "mixer")}
    raw["finetune"] = {"tasks": ["alignment"], "size": 24, "steps": 12, "lr": 1e-3, "batch_size": 16,
                       "warmup_steps": 2}
    tiny_repo.write_params(ws / "params.yaml", raw)
    specs = _fake_runs(ws, load_params(ws / "params.yaml"))
    assert sorted(s.key.arch for s in specs) == ["mixer", "vit", "vit_nopos"]

    assert stage.main(_argv(ws)) == 0
    results = {p.parent.parent.parent.name: json.loads(p.read_text())
               for p in (ws / "data/finetune").rglob("metrics.json")}
    vit = results["vit"]
    assert (vit["position"], vit["size"], vit["trained_size"], vit["n"]) == ("learned", 24, 16, 64)
    assert 0 <= vit["eval_only_acc"] <= 1 and 0 <= vit["finetuned_acc"] <= 1
    assert vit["steps"] == 12 and vit["val_acc"] is not None  # it trained, and validated, at 24 px
    assert results["vit_nopos"]["position"] == "none"
    assert "fixed token grid" in results["mixer"]["skipped"] and "finetuned_acc" not in results["mixer"]
    page = (ws / "reports/ft/finetune.md").read_text()
    assert "at 24 px, fine-tuned" in page and "skipped: " in page and "| vit_nopos |" in page

    # a second stage keeps every finished result; the same job from scratch gives the same numbers
    before = {p: p.stat().st_mtime_ns for p in (ws / "data/finetune").rglob("metrics.json")}
    assert stage.main(_argv(ws)) == 0
    assert "(3 already done)" in capsys.readouterr().out
    assert before == {p: p.stat().st_mtime_ns for p in (ws / "data/finetune").rglob("metrics.json")}
    # a result of another shape (a half-written file) is fine-tuned again, not trusted
    broken = next((ws / "data/finetune/vit_nopos").rglob("metrics.json"))
    broken.write_text('{"identity": 3}')
    assert stage.main(_argv(ws)) == 0 and "(2 already done)" in capsys.readouterr().out
    assert json.loads(broken.read_text())["position"] == "none"
    job = next(j for j in finetune.jobs(load_params(ws / "params.yaml"),
                                        Folders(ws / "data/tasks", ws / "data/slices", ws / "data/runs", ws / "ckpt"),
                                        ws / "data/finetune") if j.spec.key.arch == "vit")
    again = finetune.fine_tune(job)
    assert (again["eval_only_acc"], again["finetuned_acc"]) == (vit["eval_only_acc"], vit["finetuned_acc"])


def test_table_pairs_seeds_and_marks_skipped_families():
    rows = [{"task": "natural", "arch": "vit", "position": "learned", "size": 48, "run": f"train/vit/s{s}",
             "eval_only_acc": e, "finetuned_acc": f} for s, e, f in ((0, 0.50, 0.70), (1, 0.52, 0.74))]
    rows.append({"task": "natural", "arch": "mixer", "position": "grid", "size": 48, "run": "train/mixer/s0",
                 "skipped": "a fixed token grid"})
    tab = page.table(rows, {"train/vit/s0": 0.8, "train/vit/s1": 0.82}, 0.95).set_index("arch")
    assert tab.loc["vit", "seeds"] == 2 and tab.loc["vit", "gain"] == pytest.approx(0.21)
    assert tab.loc["vit", "trained"] == pytest.approx(0.81) and tab.loc["vit", "gain_lo"] < 0.21
    assert tab.loc["mixer", "skipped"] == "a fixed token grid"
    worse = [{**r, "finetuned_acc": r["eval_only_acc"] - 0.01 * (i + 1)} for i, r in enumerate(rows[:2])]
    worse = page.table(worse, {}, 0.95).set_index("arch")
    assert worse.loc["vit", "gain"] == pytest.approx(-0.015) and worse.loc["vit", "gain_lo"] < -0.015 < 0  # not clipped
    assert page.table([], {}, 0.95).empty


def test_finetune_settings_are_checked_by_name():
    def bad(**over):
        raw = tiny_repo.params_with({"finetune": {"tasks": ["alignment"], **over}})
        with pytest.raises(ConfigError) as err:
            from pipeline.config import parse_params

            parse_params(raw)
        return str(err.value)

    assert "finetune.size" in bad(size=22)  # not a multiple of the patch
    assert "finetune.size" in bad(size=16)  # the training size: nothing to map
    assert "finetune.warmup_steps" in bad(steps=10, warmup_steps=10)
    assert "finetune.tasks" in bad(tasks=["natural"])  # not a task of the tiny profile
    off = load_params(Path(__file__).resolve().parents[1] / "params.yaml").finetune
    assert off.tasks == []  # the CPU default fine-tunes nothing
