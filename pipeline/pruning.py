"""Removing run folders the configured grid no longer has (and folders a run leaves empty): housekeeping of a
stage's persisted outputs, not part of any run."""

from __future__ import annotations

import shutil
from pathlib import Path


def prune(root: Path, keep: list[Path]) -> None:
    """Delete run folders under ``root`` that the current grid no longer has (persisted outputs stay clean).

    The folders are collected before any is deleted: deleting while ``rglob`` walks them fails.
    """
    if not root.exists():
        return
    keep_set = {k.resolve() for k in keep}
    stale = sorted({m.parent.resolve() for m in root.rglob("metrics.json")} - keep_set)
    for folder in stale:
        if folder.exists():  # else inside a folder already removed
            remove_run_dir(folder, root)


def remove_run_dir(folder: Path, root: Path) -> None:
    """Delete ``folder`` and the folders above it it leaves empty, up to (not including) ``root``."""
    folder, root = folder.resolve(), root.resolve()
    shutil.rmtree(folder, ignore_errors=True)
    for parent in folder.parents:
        if parent == root or not parent.is_relative_to(root) or not parent.exists() or any(parent.iterdir()):
            break
        parent.rmdir()
