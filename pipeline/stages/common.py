"""What every stage entry point shares: one-line errors, a clean exit code, and CPU threading."""

from __future__ import annotations

import errno
import functools
import sys
from collections.abc import Callable

from pipeline.config import ConfigError


class StageError(RuntimeError):
    """A problem with inputs (a missing or corrupt file, a tampered checkpoint): reported as one line."""


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
    logging.getLogger("lightning.pytorch.utilities.rank_zero").setLevel(logging.WARNING)
