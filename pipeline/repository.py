"""Where the repository is and which commit it holds: plain git and paths, no MLflow, so task and report code can
ask without importing the tracker."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def repo_root(start: str | Path | None = None) -> Path:
    """The repository that owns ``start`` (default: cwd), seen through DVC's temporary experiment copies."""
    path = Path(start or os.getcwd()).resolve()
    parts = path.parts
    for i in range(len(parts) - 3):
        if parts[i : i + 3] == (".dvc", "tmp", "exps"):
            return Path(*parts[:i])
    for candidate in (path, *path.parents):
        if (candidate / "dvc.yaml").exists() or (candidate / ".git").exists():
            return candidate
    return path


def _git(*args: str, cwd: Path | None = None) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def git_init(folder: Path) -> None:
    """Make ``folder`` a git repository (once): DVC needs one to run in."""
    if not (folder / ".git").exists():
        _git("init", "-q", "-b", "main", cwd=folder)


DECIDING = ("pipeline", "params.yaml", "dvc.yaml", "pyproject.toml", "constraints.txt")


def git_commit() -> str:
    """The checked-out commit, ``+dirty`` when what decides results (the code, params.yaml, dvc.yaml,
    pyproject.toml, the pinned versions in constraints.txt) differs from it, or ``unknown`` outside git. Outputs
    a repro rewrites (dvc.lock, reports/) do not count: a fresh clone's ``dvc repro`` reports the commit it ran.
    ``$BIAS_GIT_COMMIT``, when set, is the answer: ``bias profile`` runs in a copy of a checkout and says which."""
    if os.environ.get("BIAS_GIT_COMMIT"):
        return os.environ["BIAS_GIT_COMMIT"]
    try:
        sha = _git("rev-parse", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no", "--", *DECIDING)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{sha}+dirty" if dirty else sha
