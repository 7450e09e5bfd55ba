"""Fan independent training runs out to workers; results come back to the stage process.

Contract (what stages rely on): ``map_runs(fn, items, workers=...)`` calls the picklable top-level ``fn`` once
per item in worker processes and yields ``(item, result)`` in completion order. Workers compute and return;
they never write DVC outputs or talk to MLflow: the stage process alone does (so a multi-node run leaves
nothing on disks DVC cannot see). A worker exception reaches the caller as :class:`RunFailed`, which names the
item and the log file holding the full traceback.

This first version uses a local ``multiprocessing`` pool; the scale-out engine replaces the body, not the
contract.
"""

from __future__ import annotations

import multiprocessing
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from pipeline.errors import StageError


class RunFailed(StageError):
    """One run raised in a worker: one line for the user, the traceback in ``log``."""

    def __init__(self, name: str, summary: str, log: Path | None):
        self.name, self.summary, self.log = name, summary, log
        where = f" (traceback: {log})" if log else ""
        super().__init__(f"run {name} failed: {summary}{where}")


def _call(fn: Callable, item: Any) -> tuple[bool, Any]:
    try:
        return True, fn(item)
    except BaseException as err:  # noqa: BLE001 - reported to the stage process, which decides
        return False, (f"{type(err).__name__}: {err}".splitlines()[0], traceback.format_exc())


def map_runs(fn: Callable[[Any], Any], items: Iterable[Any], *, workers: int = 1,
             describe: Callable[[Any], str] = str, log_dir: Path | None = None) -> Iterator[tuple[Any, Any]]:
    """Yield ``(item, fn(item))`` as runs finish, printing "run k of n" with an ETA; raise :class:`RunFailed`."""
    items = list(items)
    n, t0 = len(items), time.monotonic()

    def report(k: int, item: Any) -> None:
        elapsed = time.monotonic() - t0
        eta = elapsed / k * (n - k)
        print(f"[{datetime.now():%H:%M:%S}] run {k} of {n} done: {describe(item)} "
              f"(elapsed {elapsed:.0f} s, ETA {eta:.0f} s)", flush=True)

    def fail(item: Any, payload: tuple[str, str]) -> RunFailed:
        summary, tb = payload
        log = None
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
            log = log_dir / f"{describe(item).replace('/', '_')}.log"
            log.write_text(tb)
        return RunFailed(describe(item), summary, log)

    if workers <= 1 or n <= 1:
        for k, item in enumerate(items, 1):
            ok, out = _call(fn, item)
            if not ok:
                raise fail(item, out)
            report(k, item)
            yield item, out
        return
    with multiprocessing.get_context("fork").Pool(min(workers, n)) as pool:
        pending = [(item, pool.apply_async(_call, (fn, item))) for item in items]
        done = 0
        while pending:
            for pair in list(pending):
                item, res = pair
                if res.ready():
                    pending.remove(pair)
                    ok, out = res.get()
                    if not ok:
                        pool.terminate()
                        raise fail(item, out)
                    done += 1
                    report(done, item)
                    yield item, out
            time.sleep(0.05)
