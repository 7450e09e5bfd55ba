"""CI runs the benchmark suite's small mode, so ``python -m bench`` cannot rot (its figures are not asserted)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import tiny_repo
import yaml

pytestmark = pytest.mark.slow


def test_bench_small_mode_writes_the_report(reproduced_repo, tmp_path):
    out = tmp_path / "performance.md"
    proc = subprocess.run([sys.executable, "-m", "bench", "--small", "--archs", "vit", "resnet",
                           "--repo", str(reproduced_repo), "--out", str(out)],
                          cwd=tiny_repo.ROOT, env=tiny_repo.env(reproduced_repo), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text()
    for heading in ("Lightning vs a plain PyTorch loop", "Data generation", "## DVC", "wall time by stage"):
        assert heading in text
    assert "| vit |" in text and "| resnet |" in text and "| alignment |" in text
    assert "No-op `dvc repro`" in text and "stages run: none" in text  # the repo was up to date
    # editing the report setting the fewest other stages read retrains nothing
    assert "Report param edit (`" in text and "training stages changed: none (goal: none)" in text


def test_the_report_param_edited_is_the_one_the_fewest_other_stages_read(tmp_path):
    """From dvc.lock (a matrix stage's templated keys expanded): a report section another stage reads part of
    offers its other keys; ties go to the report section."""
    from bench.dvc_figures import report_param

    lock = {"schema": "2.0", "stages": {
        "data@a": {"params": {"params.yaml": {"seed": 0, "tasks.a": {"x": 1}}}},
        "plan": {"params": {"params.yaml": {"report.confidence": 0.95, "report.power": 0.8}}},
        "finetune": {"params": {"params.yaml": {"report.confidence": 0.95}}},
        "report": {"params": {"params.yaml": {"seed": 0, "report": {}, "tasks.a.x": 1}}}}}
    (tmp_path / "dvc.lock").write_text(yaml.safe_dump(lock))
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(
        {"seed": 0, "tasks": {"a": {"x": 1}}, "report": {"confidence": 0.95, "power": 0.8, "margin": 0.01}},
        sort_keys=False))
    assert report_param(tmp_path) == "report.margin"  # read by the report stage alone
    lock["stages"]["plan"]["params"]["params.yaml"] = {"report": {}}  # now plan reads every report key
    (tmp_path / "dvc.lock").write_text(yaml.safe_dump(lock))
    assert report_param(tmp_path) == "report.power"  # one other reader, like seed and tasks.a.x: report's first


def test_the_step_measurement_writes_nothing_where_it_is_run(tmp_path, monkeypatch):
    """``bench.estimate`` measures this machine's ViT step through ``bench.overheads``: its MLflow store and
    artifacts stay in a temporary folder (artifacts once landed in ./mlruns of the working tree)."""
    from bench import overheads

    monkeypatch.chdir(tmp_path)
    out = overheads.breakdown("vit", 4, repeat=2, n_train=64, n_val=32, n_test=32, time_imports=False)
    assert len(out["steps_s"]) == 2 and all(s > 0 for s in out["steps_s"])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("load", "warns"), [(99.0, True), (0.0, False)])
def test_the_estimate_warns_when_the_machine_is_busy(monkeypatch, load, warns):
    import os

    from bench import estimate

    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    line = estimate.load_warning()
    assert (line is not None) == warns
    if warns:
        assert line.startswith(f"warning: load average {load:.1f} on ") and "inflated" in line
