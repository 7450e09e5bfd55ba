"""Fan independent training runs out to workers; results come back to the stage process.

Contract (what stages rely on): ``map_runs(fn, items, workers=...)`` calls the picklable top-level ``fn`` once
per item in worker processes and yields ``(item, result)`` in completion order. Workers compute and return;
they never write DVC outputs or talk to MLflow: the stage process alone does (so a multi-node run leaves
nothing on disks DVC cannot see). A worker exception reaches the caller as :class:`RunFailed`, which names the
item and the log file holding the full traceback; an interrupted worker (SIGINT) reaches it as
``KeyboardInterrupt``, so the stage ends as an interrupted one (runs KILLED and resumable, exit 130).

The engine is Dask distributed. With no address it starts a ``LocalCluster`` of ``workers`` single-thread
worker processes bound to 127.0.0.1 (no dashboard); given an address (``scheduler=`` or the engine's own
``DASK_SCHEDULER_ADDRESS``) it submits to that cluster instead. ``workers <= 1`` without an address runs in
this process (tests, debugging, a profiler). :func:`worker_pool` starts the cluster before the stage process has
prepared its runs, the workers importing the training stack meanwhile, so the two start-ups overlap. A worker
process that dies (SIGKILL, OOM, ``os._exit``) is replaced by its nanny and its run is retried; a run that keeps
killing workers is a :class:`RunFailed`.
"""

from __future__ import annotations

import gc
import importlib
import logging
import os
import socket
import struct
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from pipeline import PYTHON_GC
from pipeline.environment import differences, environment
from pipeline.errors import StageError, Terminated

# How a run cut short by SIGTERM comes back from a worker: our own handler's exception, or Lightning's (its signal
# connector turns SIGTERM during fit into SIGTERMException, a SystemExit, which would otherwise read as a failure).
TERMINATED = ("Terminated", "SIGTERMException")

LOOPBACK = "127.0.0.1"
ADDRESS_ENV = "DASK_SCHEDULER_ADDRESS"  # Dask's own variable (dask config `scheduler-address`)
MAX_HANDSHAKE = 2**24  # bytes: a Dask scheduler's first message is far smaller
# A run whose worker dies is retried until it has seen this many deaths (runs queued on a dying worker count
# too, so 1 would fail innocent bystanders).
ALLOWED_WORKER_DEATHS = 2
SCHEDULER_TIMEOUT_S = 30  # a named cluster that does not answer: one line after this, not a traceback
MALLOC_TRIM_KEY = "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_"
NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"  # set by lightning.fabric's import


class RunFailed(StageError):
    """One run raised in a worker: one line for the user, the traceback in ``log``."""

    def __init__(self, name: str, summary: str, log: Path | None):
        self.name, self.summary, self.log = name, summary, log
        where = f" (traceback: {log})" if log else ""
        super().__init__(f"run {name} failed: {summary}{where}")


def cheap_cuda_check() -> None:
    """Make ``torch.cuda.is_available()`` cheap where there is no GPU.

    Lightning's import sets ``PYTORCH_NVML_BASED_CUDA_CHECK=1``; then, while CUDA is not initialised, every call
    tries to load NVML anew (a failed ``dlopen``: 0.1-1.3 ms on a busy 2-core machine), and AdamW asks once per
    step (its CUDA-graph capture check). Without a GPU there is no CUDA to poison a fork with, and the runtime's
    own count (~2 us) gives the same answer (bench/worker_env.py ``cuda_check``). Called before
    every run (and after a warm worker's imports): a process's first run may still pay the slow check, when
    Lightning is first imported inside it. The variable stays off for this process and those it starts, which
    without a GPU changes no answer they get.
    """
    import torch

    if os.environ.get(NVML_CHECK) == "1" and not torch.cuda.is_initialized() and torch.cuda.device_count() == 0:
        os.environ[NVML_CHECK] = "0"


def _call(fn: Callable, item: Any, threads: int) -> tuple[bool, Any]:
    """Run ``fn(item)`` on ``threads`` torch threads and Python's own GC thresholds (:mod:`pipeline` raises them for
    the rest of the process); an exception comes back as data, not as a raise."""
    import torch

    cheap_cuda_check()
    before = torch.get_num_threads(), gc.get_threshold()
    torch.set_num_threads(threads)
    gc.set_threshold(*PYTHON_GC)
    try:
        return True, fn(item)
    except BaseException as err:  # noqa: BLE001 - reported to the stage process, which decides
        return False, (f"{type(err).__name__}: {err}".splitlines()[0], traceback.format_exc())
    finally:
        torch.set_num_threads(before[0])
        gc.set_threshold(*before[1])


def longest_first(items: list[Any], cost: Callable[[Any], float] | None) -> list[Any]:
    """Items by decreasing ``cost`` (stable), so no worker idles at the end behind one long run."""
    return items if cost is None else sorted(items, key=cost, reverse=True)


def scheduler_address(scheduler: str | None = None) -> str | None:
    """The cluster to use: the explicit address, else ``$DASK_SCHEDULER_ADDRESS``, else None (start one)."""
    return scheduler or os.environ.get(ADDRESS_ENV) or None


def _freeze_at_close():
    """A worker plugin: freeze the GC when the worker closes, so its process exits without the interpreter's last
    collections walking every object torch and Lightning made (as :func:`pipeline.stages.common.stage_main`)."""
    from distributed import WorkerPlugin

    class FreezeAtClose(WorkerPlugin):
        def teardown(self, worker) -> None:
            gc.freeze()

    return FreezeAtClose()


def _connected(client_class, scheduler: str):
    """A client of the cluster at ``scheduler``, or one line naming the address (before any MLflow run opens).

    A plain TCP connect first: a Client that failed to connect leaves an event loop whose ``__del__`` prints a
    traceback at exit."""
    try:
        if reason := _unreachable(scheduler):
            raise OSError(reason)
        return client_class(scheduler, timeout=SCHEDULER_TIMEOUT_S)
    except (OSError, TimeoutError, ValueError) as err:
        raise StageError(f"train.runtime.scheduler / ${ADDRESS_ENV}: no Dask scheduler at {scheduler} "
                         f"({_first_line(err)})") from None


def _unreachable(scheduler: str) -> str | None:
    """Why no Dask scheduler can answer at ``scheduler`` (an unknown scheme, no port, nothing listening on a TCP
    port), else None; schemes other than tcp are left to Dask."""
    from distributed.comm.registry import backends

    scheme, _, rest = scheduler.rpartition("://")
    if (scheme := scheme or "tcp") not in backends:
        return f"unknown address scheme {scheme!r} (known: {', '.join(sorted(backends))})"
    host, sep, port = rest.rpartition(":")
    if scheme == "tls":  # Dask needs a security context for it, which would fail as a TypeError deep inside
        return ("tls:// needs a TLS security context (distributed.security.Security), which this pipeline does not "
                "configure; use tcp:// on a trusted network or through an SSH tunnel")
    if scheme != "tcp":
        return None
    if not sep or not port.isdigit():
        return "no port in the address (tcp://host:port)"
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=SCHEDULER_TIMEOUT_S) as sock:
            # A Dask scheduler speaks first (its handshake, right after accepting); a peer that stays silent
            # would hold Client() in its handshake for good.
            head = b""
            while len(head) < 8 and (chunk := sock.recv(8 - len(head))):
                head += chunk
            if len(head) < 8:
                return "the peer closed the connection without a Dask handshake"
            # Dask's TCP framing opens with the message's size (native uint64): a handshake is a few hundred
            # bytes; a banner (SSH, HTTP, SMTP) read as one declares exabytes, which Client() would allocate
            if (size := struct.unpack("Q", head)[0]) > MAX_HANDSHAKE:
                return f"not a Dask scheduler: it opened with {head!r} (as a Dask message: {size} bytes)"
            return None
    except TimeoutError:
        return f"something listens there but sent no Dask handshake within {SCHEDULER_TIMEOUT_S} s"
    except OSError as err:
        return f"cannot connect within {SCHEDULER_TIMEOUT_S} s: {err.strerror or err}"


def _first_line(err: BaseException) -> str:
    return (str(err).splitlines() or [type(err).__name__])[0]


@contextmanager
def dask_client(workers: int, scheduler: str | None = None):
    """A Dask client: on an existing cluster at ``scheduler``, or on a loopback-only local cluster."""
    import dask
    from distributed import Client, LocalCluster

    if scheduler is not None:
        with _connected(Client, scheduler) as client:
            yield client
        return
    os.environ.pop("MALLOC_TRIM_THRESHOLD_", None)  # workers inherit it (an earlier Dask cluster leaves it set)
    with dask.config.set({"distributed.scheduler.allowed-failures": ALLOWED_WORKER_DEATHS,
                          # Dask's nanny sets MALLOC_TRIM_THRESHOLD_=65536, which also turns off glibc's dynamic mmap
                          # threshold: every activation buffer is mmapped and faulted in afresh, and a training step
                          # takes twice as long (bench/worker_env.py). Unset, workers step as fast as a plain process.
                          MALLOC_TRIM_KEY: None}), \
            LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host=LOOPBACK,
                         # a worker's heartbeat racing the scheduler's shutdown logs an ERROR with a traceback;
                         # real failures reach the stage as RunFailed (one line, the traceback in a log file)
                         dashboard_address=None, memory_limit=0, silence_logs=logging.CRITICAL,
                         # without a dashboard the scheduler still serves its health routes over HTTP, on 8787 by
                         # default; a second pool at once (dvc queue --jobs 2) then falls back to another port with a
                         # "Port 8787 is already in use" warning. A free loopback port from the start warns nobody
                         scheduler_kwargs={"dashboard_address": f"{LOOPBACK}:0"}) as cluster, \
            Client(cluster) as client:
        client.register_plugin(_freeze_at_close(), name="freeze-at-close")
        yield client


def _import(modules: tuple[str, ...]) -> dict[str, str]:
    """Import ``modules``; returns this worker's :func:`pipeline.environment.environment`."""
    for name in modules:
        importlib.import_module(name)
    cheap_cuda_check()  # after Lightning's import, which sets the slow check
    return environment()


def _warn_if_other(here: dict[str, str], worker: str):
    """A done-callback for a warm-up future: one warning line when that worker's environment differs from ours
    (its runs may then not reproduce bit for bit in this process, nor on another worker)."""
    def check(future) -> None:
        try:
            there = future.result() if future.status == "finished" else None
        except Exception:  # noqa: BLE001 - the pool closed meanwhile: nothing left to warn about
            there = None
        if there is not None and (diff := differences(here, there)):
            print(f"warning: worker {worker} computes in another environment than this process "
                  f"({'; '.join(diff)}): its runs may not reproduce bit for bit elsewhere", flush=True)
    return check


@contextmanager
def worker_pool(workers: int, scheduler: str | None = None, warm: tuple[str, ...] = ()):
    """The Dask client that :func:`map_runs` can use, started now; its workers import ``warm`` in the background
    (a worker's imports take ~6 s, as long as the stage process's own). None where runs stay in this process."""
    address = scheduler_address(scheduler)
    if address is None and workers <= 1:
        yield None
        return
    with dask_client(workers, address) as client:
        # before any run on its worker (the highest priority); the futures are held while the pool is open, since
        # Dask forgets a task whose future is dropped
        warming = {w: client.submit(_import, warm, workers=[w], pure=False, priority=2**31)
                   for w in client.scheduler_info()["workers"]} if warm else {}
        if warming:
            here = environment()
            for w, future in warming.items():
                future.add_done_callback(_warn_if_other(here, w))
        try:
            yield client
        finally:
            warming.clear()


def eta(elapsed: float, done: float, total: float) -> float:
    """Seconds left when ``done`` of ``total`` expected cost took ``elapsed`` seconds (costs, not run counts: the
    longest runs start first, so a count-based rate would promise too early an end)."""
    return elapsed * (total - done) / done if done > 0 else float("nan")


def hms(seconds: float) -> str:
    """h:mm:ss (``?`` before anything finished)."""
    if seconds != seconds:
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def map_runs(fn: Callable[[Any], Any], items: Iterable[Any], *, workers: int = 1,
             describe: Callable[[Any], str] = str, log_dir: Path | None = None, threads: int = 1,
             scheduler: str | None = None, cost: Callable[[Any], float] | None = None, pool=None,
             ) -> Iterator[tuple[Any, Any]]:
    """Yield ``(item, fn(item))`` as runs finish, printing "run k of n" with a cost-weighted ETA; raise
    :class:`RunFailed`.

    ``threads``: torch threads per run; ``scheduler``: a Dask scheduler address (else ``$DASK_SCHEDULER_ADDRESS``,
    else a local cluster of ``workers`` processes); ``cost``: a run's expected cost, to start the longest first
    and weight the ETA;
    ``pool``: a client from :func:`worker_pool` to run on (it stays open after this).
    """
    items = longest_first(list(items), cost)
    n, t0 = len(items), time.monotonic()
    weight = cost or (lambda item: 1.0)
    total, done = sum(weight(item) for item in items), 0.0

    def report(k: int, item: Any) -> None:
        nonlocal done
        elapsed, done = time.monotonic() - t0, done + weight(item)
        print(f"[{datetime.now():%H:%M:%S}] run {k} of {n} done: {describe(item)} "
              f"(elapsed {hms(elapsed)}, ETA {hms(eta(elapsed, done, total))})", flush=True)

    def fail(item: Any, payload: tuple[str, str]) -> RunFailed:
        summary, tb = payload
        log = None
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
            log = log_dir / f"{describe(item).replace('/', '_')}.log"
            log.write_text(tb)
        return RunFailed(describe(item), summary, log)

    address = scheduler_address(scheduler)
    if pool is not None:
        outcomes = _as_completed(pool, fn, items, threads)
    elif address is None and (workers <= 1 or n <= 1):
        outcomes = _in_process(fn, items, threads)
    else:
        outcomes = _on_cluster(fn, items, threads, min(workers, n), address)
    try:
        for k, (item, ok, out) in enumerate(outcomes, 1):
            if not ok and out[0].startswith("KeyboardInterrupt"):  # Ctrl-C reached a worker: cut short, not wrong
                raise KeyboardInterrupt(f"run {describe(item)} interrupted")
            if not ok and out[0].startswith(TERMINATED):  # SIGTERM reached a worker: the same, exit 143
                raise Terminated(f"run {describe(item)} terminated")
            if not ok:
                raise fail(item, out)
            report(k, item)
            yield item, out
    finally:
        outcomes.close()  # a failure (or a caller that stops early) shuts the cluster down now


def _in_process(fn: Callable, items: list[Any], threads: int) -> Iterator[tuple[Any, bool, Any]]:
    for item in items:
        yield (item, *_call(fn, item, threads))


def _on_cluster(fn: Callable, items: list[Any], threads: int, workers: int,
                address: str | None) -> Iterator[tuple[Any, bool, Any]]:
    with dask_client(workers, address) as client:
        yield from _as_completed(client, fn, items, threads)


def _as_completed(client, fn: Callable, items: list[Any], threads: int) -> Iterator[tuple[Any, bool, Any]]:
    """``(item, ok, result or (summary, traceback))`` in completion order; a dead worker's run is retried by the
    scheduler (``allowed-failures``) and reported as failed after that."""
    from distributed import as_completed

    # priority keeps the (longest-first) order when more runs than workers wait for a slot
    futures = {client.submit(_call, fn, item, threads, pure=False, priority=n - i): item
               for n in [len(items)] for i, item in enumerate(items)}
    try:
        for future in as_completed(futures):
            item = futures.pop(future)  # dropped once read: the cluster frees the result (weights, logits)
            try:
                ok, out = future.result()
            except Exception as err:  # noqa: BLE001 - KilledWorker and friends: the process itself died
                ok, out = False, (f"{type(err).__name__}: worker process died "
                                  f"({str(err).splitlines()[0] if str(err) else 'no message'})",
                                  traceback.format_exc())
            yield item, ok, out
    finally:
        client.cancel(list(futures))
