"""Faults during writes: SIGKILL each kind of stage at a random moment, then ``dvc repro``; a full disk.

The kill test works on a copy of ``reproduced_repo`` (the uninterrupted reference) in another folder and goes
down the pipeline in order. For each kind of stage it deletes the stage's outputs, starts ``dvc repro --force
--single-item <stage>`` (so DVC runs the stage instead of checking its outputs out of the cache), kills it
and everything it started a random time after the stage's work began (the delay is in the failure message; a
stage that ends first is left to finish, since DVC's own rewrite of dvc.lock is not atomic), reruns it, and
requires the outputs to equal the reference's: data and slices byte for byte (their DVC hashes), runs by
accuracies and predictions (every train, teacher and DeiT student run), the report by its accuracy tables.
"Began": the stage's process appeared, for the light stages (their imports take under a second); for the
training and report stages, whose imports take most of a tiny stage's life, their first output (a run's
checkpoint folder, the report's first table), so the kill lands in the work, not in the imports.

So it is also the determinism test: each of these stages recomputed from scratch in another folder (killed and
resumed on the way) gives the results of the first pipeline.
"""

from __future__ import annotations

import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tiny_repo
import yaml

pytestmark = pytest.mark.slow

# (stage kind, dvc target, the stage's module, its outputs: deleted first, the first one compared, the glob that
# marks the stage's work begun: None for its process appearing)
KINDS = [
    ("data", "data@alignment", "generate", ["data/tasks/alignment"], None),
    ("slice", "slice@alignment", "slice", ["data/slices/alignment"], None),
    ("teacher", "teacher", "teacher", ["data/teachers", "data/ckpt/teachers"], "data/ckpt/teachers/**/config.json"),
    # one architecture's runs (the outputs persist): the stage resumes among finished runs, at a third of the cost
    ("train", "train", "train", ["data/runs/vit", "data/ckpt/train/vit"], "data/ckpt/train/vit/**/config.json"),
    ("report", "report", "report", ["reports/tables", "reports/figures"], "reports/tables/*"),
]
MAX_DELAY_S = 1.5  # after the process appears (a light stage: ~0.7 s of imports, then its work) or its marker
# Run the stage itself: its outputs are in the copied DVC cache, and a plain repro would check them out.
REPRO = ("repro", "--force", "--single-item")


def kill_during(repo: Path, target: str, module: str, delay: float, began: str | None = None) -> int | None:
    """Start ``dvc repro target``; ``delay`` s after the stage's process appears (with ``began``: after a path
    matching that glob exists too), SIGKILL the whole group, if the stage still runs then (returns the exit code);
    else let DVC finish (returns None): after the stage, DVC rewrites dvc.lock in place, and a kill there
    truncates it, DVC's own limit (docs/usage.md)."""
    proc = subprocess.Popen([str(tiny_repo.VENV_BIN / "dvc"), *REPRO, target], cwd=repo, env=tiny_repo.env(repo),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    while not tiny_repo.stage_running(proc.pid, module):
        assert proc.poll() is None, f"dvc repro {target} ended (rc {proc.returncode}) before its stage started"
        assert time.monotonic() < deadline, f"{target}: the stage did not start"
        time.sleep(0.05)
    while began is not None and not any(repo.glob(began)):
        if not tiny_repo.stage_running(proc.pid, module):
            assert proc.wait() == 0, f"dvc repro {target} failed after its stage ran"
            return None
        assert time.monotonic() < deadline, f"{target}: no {began} appeared"
        time.sleep(0.02)
    kill_at = time.monotonic() + delay
    while time.monotonic() < kill_at:
        if not tiny_repo.stage_running(proc.pid, module):
            assert proc.wait() == 0, f"dvc repro {target} failed after its stage ran"
            return None
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    return proc.wait()


def lock_outs(repo: Path, target: str) -> dict[str, str]:
    entry = yaml.safe_load((repo / "dvc.lock").read_text())["stages"][target]
    return {o["path"]: o.get("md5") for o in entry.get("outs", [])}


def test_sigkill_then_repro_equals_uninterrupted(subtests, copy_reproduced_repo, reproduced_repo):
    """One test (one repository going down the pipeline), a subtest per kind of stage."""
    for kind, target, module, outs, began in KINDS:
        with subtests.test(kind):
            kill_and_resume(kind, target, module, outs, began, copy_reproduced_repo, reproduced_repo)


def kill_and_resume(kind: str, target: str, module: str, outs: list[str], began: str | None, repo: Path,
                    reference: Path) -> None:
    for out in outs:
        shutil.rmtree(repo / out)
    delay = random.uniform(0, MAX_DELAY_S)
    rc = kill_during(repo, target, module, delay, began)
    after = f"{began} appeared" if began else "the stage started"
    if rc is None:  # nothing was interrupted: its outputs are already the run to compare
        context = f"{kind}: the stage finished before its kill ({delay:.2f} s after {after})"
    else:
        context = f"{kind}: killed {delay:.2f} s after {after} (rc {rc})"
        proc = tiny_repo.dvc(repo, *REPRO, target, check=False)
        assert proc.returncode == 0, f"{context}\n{proc.stdout}\n{proc.stderr}"
    assert "changed" not in tiny_repo.dvc(repo, "status", target).stdout, context
    if kind in ("data", "slice"):  # byte-identical arrays
        assert lock_outs(repo, target) == lock_outs(reference, target), context
    elif kind == "report":
        for name in ("accuracy.csv", "slices.csv", "distillation.csv"):
            got, want = repo / "reports/tables" / name, reference / "reports/tables" / name
            assert got.read_bytes() == want.read_bytes(), f"{context}: {name}"
    else:
        tiny_repo.assert_same_runs(repo / outs[0], reference / outs[0])


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
