"""The ``validate`` stage runs before every other: a bad value given with ``dvc exp run -S`` is refused before
DVC removes any stage's outputs (DVC deletes a stage's outputs just before running that stage)."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest
import tiny_repo

pytestmark = pytest.mark.slow


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_refused_set_value_leaves_every_output_and_dvc_status(make_tiny_repo):
    repo = make_tiny_repo()
    tiny_repo.dvc(repo, "repro", "slice@alignment")
    tiny_repo.git(repo, "add", "-A")
    tiny_repo.git(repo, "commit", "-q", "-m", "data and slices")
    before, status = digest(repo / "data"), tiny_repo.dvc(repo, "status").stdout
    # one value, the one DVC would act on: seed is read by the data stage, whose outputs DVC deletes before running
    # it (every other bad value is refused by the same stage: tests/test_bad_input.py, in process)
    for value, says in [("seed=abc", "error: params.yaml: seed")]:
        proc = subprocess.run([str(tiny_repo.VENV_BIN / "dvc"), "exp", "run", "-S", value, "slice@alignment"],
                              cwd=repo, env=tiny_repo.env(repo), capture_output=True, text=True, timeout=300)
        assert proc.returncode != 0 and says in proc.stdout + proc.stderr, (value, proc.stdout, proc.stderr)
        assert "Running stage 'data@alignment'" not in proc.stdout  # stopped at the first stage
        assert digest(repo / "data") == before, value
        tiny_repo.git(repo, "checkout", "params.yaml")  # DVC leaves the -S edit in the workspace
        assert tiny_repo.dvc(repo, "status").stdout == status, value
