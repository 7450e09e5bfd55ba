"""Live MLflow runs of a training stage: each run's MLflow run opens when its worker starts (not when the stage
queues it), and its curve points stream from the worker's ``live.jsonl`` while it trains. Scheduling and tracking
only: nothing here decides a run's numbers (docs/design.md §6).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline import tracking
from pipeline.io import read_json, read_new_lines, write_json
from pipeline.schemas import CURVE_POINT, RUN_STARTED

LIVE = "live.jsonl"  # in a run's checkpoint folder: its curve points, appended by the worker as they exist

STARTED = "started.json"  # in a run's checkpoint folder: when its worker began (written by fit)

LIVE_EVERY_S = 2.0  # how often the stage process looks for started runs and streams their points to MLflow


@dataclass
class Opening:
    """What a run's MLflow run is opened with once its worker starts."""

    name: str
    folder: Path  # the run's checkpoint folder: its start stamp, live points and config.json
    identity: str
    tags: dict[str, str]
    params: dict
    resume: str | None = None  # the MLflow run of the checkpoint it resumes: reopened, not replaced
    run_id: str | None = None


class LiveRuns:
    """From a thread of the stage process, every ``every_s`` seconds: opens the MLflow run of each run whose worker
    has started (stamped with the worker's start time, so a run queued behind others does not count its wait), and
    streams each open run's curve points (``<ckpt>/live.jsonl``), so the UI shows curves while runs train.

    Streaming is best effort: a point it could not log is logged with the run's final record (which skips the
    ``streamed`` ones), so a store fault here loses nothing."""

    def __init__(self, tracker: tracking.StageRun, every_s: float | None = None):
        self.tracker, self.every_s = tracker, LIVE_EVERY_S if every_s is None else every_s
        self.runs: dict[str, Opening] = {}
        self.offsets: dict[str, int] = {}  # run name -> bytes of its live file read
        self.logged: dict[str, set[tuple[int, str]]] = {}
        # held by whoever talks to the store: the stage's own calls and this thread's never overlap
        self.lock, self.stop = threading.RLock(), threading.Event()
        self.thread = threading.Thread(target=self._loop, name="live-runs", daemon=True)

    def __enter__(self) -> LiveRuns:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()

    def watch(self, opening: Opening) -> None:
        with self.lock:
            self.runs[opening.name], self.offsets[opening.name], self.logged[opening.name] = opening, 0, set()

    def run_id(self, name: str) -> str:
        """The run's MLflow run, opened now if the thread has not yet (a run shorter than a poll, a failed one)."""
        with self.lock:
            run = self.runs[name]
            if run.run_id is None:
                self._open(run, started_at(run.folder) or time.time())
            return run.run_id

    def opened(self, name: str) -> str | None:
        return self.runs[name].run_id

    def done(self, name: str) -> tuple[str, frozenset[tuple[int, str]]]:
        """Stop watching ``name``: its MLflow run and the points already logged to it."""
        with self.lock:
            run_id = self.run_id(name)
            self.runs.pop(name), self.offsets.pop(name)
            return run_id, frozenset(self.logged.pop(name))

    def _open(self, run: Opening, started: float) -> None:
        run.run_id = self.tracker.open(run.name, run.tags, run.params, run.resume, start_time=started)
        write_json(run.folder / "config.json", {"identity": run.identity, "mlflow_run_id": run.run_id})

    def _loop(self) -> None:
        while not self.stop.wait(self.every_s):
            try:
                self.poll()
            except Exception:  # noqa: BLE001  the final record opens and logs what this missed; the stage goes on
                return

    def poll(self) -> None:
        with self.lock:
            for name, run in list(self.runs.items()):
                if run.run_id is None:
                    if (started := started_at(run.folder)) is None:
                        continue  # still waiting for a worker
                    self._open(run, started)
                points, self.offsets[name] = read_new_lines(run.folder / LIVE, self.offsets[name], CURVE_POINT)
                if points:
                    self.tracker.log(run.run_id, series=points)
                    self.logged[name] |= {(p["step"], k) for p in points for k in p if k != "step"}


def started_at(folder: Path) -> float | None:
    """When the run's worker began (seconds since the epoch), or None before it has."""
    path = folder / STARTED
    return read_json(path, RUN_STARTED)["started"] if path.exists() else None
