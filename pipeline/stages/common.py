"""What every stage entry point shares: one-line errors, a clean exit code, and CPU threading."""

from __future__ import annotations

import errno
import functools
import sys
from collections.abc import Callable

from pipeline.errors import ConfigError, StageError


def stage_main(fn: Callable[[list[str] | None], None]) -> Callable[[list[str] | None], int]:
    """Wrap a stage ``main``: known input problems print one line on stderr and exit 2, no traceback."""

    @functools.wraps(fn)
    def wrapper(argv: list[str] | None = None) -> int:
        try:
            fn(argv)
        except (ConfigError, StageError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        except PermissionError as err:
            print(f"error: cannot write {err.filename}: permission denied", file=sys.stderr)
            return 2
        except OSError as err:
            if err.errno != errno.EROFS:  # a read-only output folder is the same user error as a denied one
                raise
            print(f"error: cannot write {err.filename}: read-only file system", file=sys.stderr)
            return 2
        return 0

    return wrapper


def quiet_lightning() -> None:
    """Keep stage logs to what a reader needs: Lightning's banners and tips say nothing about the run."""
    import logging
    import warnings

    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*(LeafSpec|logging interval|does not have many workers).*")
    # Safe here: a run's batches are a function of the global step (pipeline.train.StepBatches), so a
    # mid-epoch resume with a fresh dataloader continues the exact batch sequence.
    warnings.filterwarnings("ignore", message=".*dataloader is not resumable.*")
    # The checkpoint folder holds the run's identity stamp (config.json) beside last.ckpt by design.
    warnings.filterwarnings("ignore", message=".*Checkpoint directory .* exists and is not empty.*")
    # A DeiT student's frozen teacher is a submodule kept in eval mode on purpose.
    warnings.filterwarnings("ignore", message=".*module\\(s\\) in eval mode at the start of training.*")
    logging.getLogger("lightning.pytorch.utilities.rank_zero").setLevel(logging.WARNING)


def add_run_paths(parser) -> None:
    """The folders every training stage (train, teacher, distill) reads and writes; values come from dvc.yaml."""
    from pathlib import Path

    parser.add_argument("--data", type=Path, required=True, help="data/tasks (one folder per task)")
    parser.add_argument("--slices", type=Path, required=True, help="data/slices (one folder per task)")
    parser.add_argument("--out", type=Path, required=True, help="results: one folder per run")
    parser.add_argument("--ckpt", type=Path, required=True, help="checkpoints (persisted, for resume)")
