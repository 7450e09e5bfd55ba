"""Faults during writes: SIGKILL each kind of stage at a random moment, then ``dvc repro``; a full disk.

The kill tests share one tiny repository (the same params as ``reproduced_repo``, which is the uninterrupted
reference) and go down the pipeline in order, so each reuses the stages the previous ones finished. Each
kills ``dvc repro <stage>`` and everything it started a random time after the stage's own process appeared
(the delay is in the failure message), reruns ``dvc repro <stage>``, and requires the outputs to equal the
reference's: every data and slice output byte for byte (their DVC hashes), runs by accuracies and
predictions (every train, teacher and DeiT student run), the report by its accuracy tables.

So they are also the determinism test: a second pipeline from scratch in another folder (killed and resumed
on the way) gives results identical to the first.
"""

from __future__ import annotations

import os
import random
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tiny_repo
import yaml

pytestmark = pytest.mark.slow

# (stage kind, dvc target, the stage's module, the outputs compared with the reference)
KINDS = [
    ("data", "data@alignment", "generate", ["data/tasks/alignment"]),
    ("slice", "slice@alignment", "slice", ["data/slices/alignment"]),
    ("teacher", "teacher", "teacher", ["data/teachers"]),
    ("train", "train", "train", ["data/runs"]),
    ("report", "report", "report", ["reports/tables"]),
]
MAX_DELAY_S = 3.0  # the tiny stages run a few seconds after their imports


def kill_during(repo: Path, target: str, module: str, delay: float) -> int:
    """Start ``dvc repro target``; ``delay`` s after the stage's process appears, SIGKILL the whole group."""
    proc = subprocess.Popen([str(tiny_repo.VENV_BIN / "dvc"), "repro", target], cwd=repo, env=tiny_repo.env(repo),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    while not tiny_repo.stage_running(proc.pid, module):
        assert proc.poll() is None, f"dvc repro {target} ended (rc {proc.returncode}) before its stage started"
        assert time.monotonic() < deadline, f"{target}: the stage did not start"
        time.sleep(0.05)
    time.sleep(delay)
    os.killpg(proc.pid, signal.SIGKILL)
    return proc.wait()


def lock_outs(repo: Path, target: str) -> dict[str, str]:
    entry = yaml.safe_load((repo / "dvc.lock").read_text())["stages"][target]
    return {o["path"]: o.get("md5") for o in entry.get("outs", [])}


@pytest.mark.reproduced
def test_sigkill_then_repro_equals_uninterrupted(subtests, tmp_path, request):
    """One test (one worker, one repository going down the pipeline), a subtest per kind of stage.

    The reference is asked for only once the first stage has been killed and rerun: this test starts early,
    beside the reference's background build, instead of waiting for it (tests/conftest.py)."""
    repo = tiny_repo.make_repo(tmp_path / "repo")
    for kind, target, module, outs in KINDS:
        with subtests.test(kind):
            kill_and_resume(kind, target, module, outs, repo, lambda: request.getfixturevalue("reproduced_repo"))


def kill_and_resume(kind: str, target: str, module: str, outs: list[str], repo: Path, reference) -> None:
    delay = random.uniform(0, MAX_DELAY_S)
    rc = kill_during(repo, target, module, delay)
    context = f"{kind}: killed {delay:.2f} s after the stage started (rc {rc})"
    proc = tiny_repo.dvc(repo, "repro", target, check=False)
    assert proc.returncode == 0, f"{context}\n{proc.stdout}\n{proc.stderr}"
    assert "changed" not in tiny_repo.dvc(repo, "status", target).stdout, context
    reproduced_repo = reference()
    ran = [s for s in yaml.safe_load((repo / "dvc.lock").read_text())["stages"] if s.startswith(("data@", "slice@"))]
    assert ran, context
    for stage in ran:  # whatever this repro ran of the data and slice stages: byte-identical arrays
        assert lock_outs(repo, stage) == lock_outs(reproduced_repo, stage), f"{context}: {stage}"
    if kind == "report":
        for name in ("accuracy.csv", "slices.csv", "distillation.csv"):
            got, want = repo / "reports/tables" / name, reproduced_repo / "reports/tables" / name
            assert got.read_bytes() == want.read_bytes(), f"{context}: {name}"
    elif kind not in ("data", "slice"):
        for out in outs:
            tiny_repo.assert_same_runs(repo / out, reproduced_repo / out)


def _limit_file_size(limit: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, not a signal
    return apply


def test_full_disk_during_write_keeps_previous_outputs(copy_workspace):
    """A write that runs out of space (RLIMIT_FSIZE: the same EFBIG/ENOSPC path) fails with one line, and the
    previous output folder is untouched."""
    ws = copy_workspace
    out = ws / "data/tasks/alignment"
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    limit = min(len(b) for b in before.values() if len(b) > 4096) // 2  # images.npy cannot be written whole
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{ws / 'mlflow.db'}"}
    proc = subprocess.run([sys.executable, "-m", "pipeline.stages.generate", "--params", str(ws / "params.yaml"),
                           "--task", "alignment", "--out", str(out)], env=env, capture_output=True, text=True,
                          timeout=120, preexec_fn=_limit_file_size(limit))
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(out) in lines[0], proc.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")], "temporary folder left behind"
