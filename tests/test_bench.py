"""CI runs the benchmark suite's small mode, so ``python -m bench`` cannot rot (its figures are not asserted)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import tiny_repo

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
