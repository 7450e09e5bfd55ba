"""The Dask executor: identical results to the in-process path, a dead worker retried or reported, loopback only."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import pytest
import torch

import pipeline
from pipeline import executor
from pipeline.executor import RunFailed, map_runs

# Spawned Dask workers cannot import this file (pytest puts tests/ on sys.path only here): ship it by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def fit_tiny(seed: int) -> dict[str, torch.Tensor]:
    """A few AdamW steps of a small MLP on seeded data: its exact weights depend on every float op."""
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(256, 16, generator=gen), torch.randint(0, 3, (256,), generator=gen)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for i in range(20):
        xb, yb = x[i % 4 * 64:(i % 4 + 1) * 64], y[i % 4 * 64:(i % 4 + 1) * 64]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
    return {k: v.clone() for k, v in model.state_dict().items()}


def die_once(marker: str) -> int:
    """Kill this worker process the first time (no Python cleanup, like SIGKILL/OOM), succeed on the retry."""
    path = Path(marker)
    if path.name == "die" and not path.exists():
        path.write_text("died")
        os._exit(1)
    return os.getpid()


def always_die(_item) -> None:
    os._exit(1)


def interrupt(item: int) -> int:
    if item == 2:
        raise KeyboardInterrupt
    return item


def lightning_sigterm(item: int) -> int:
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    if item == 2:
        raise SIGTERMException  # what Lightning's fit loop raises after a SIGTERM
    return item


def raise_value(item: int) -> int:
    if item == 2:
        raise ValueError(f"bad item {item}\nsecond line")
    return item


def imported(name: str) -> bool:
    return name in sys.modules


def nvml_check(_item=None) -> str | None:
    return os.environ.get(executor.NVML_CHECK)


def gc_threshold(_item=None) -> tuple[int, int, int]:
    return gc.get_threshold()


no_gpu = pytest.mark.skipif(torch.cuda.device_count() > 0, reason="with a GPU the check is cached, and kept")


@no_gpu
def test_runs_skip_lightnings_nvml_probe_without_a_gpu(monkeypatch):
    monkeypatch.setenv(executor.NVML_CHECK, "1")  # as lightning.fabric's import leaves it
    assert dict(map_runs(nvml_check, [0], workers=1)) == {0: "0"}


def test_a_run_trains_at_pythons_own_gc_thresholds():
    """A process importing the package raises the collector's thresholds (its imports' objects are long-lived); a
    run gets Python's own, so the cycles a training step leaves go at the usual pace, and the process its own after."""
    fresh = subprocess.run([sys.executable, "-c", "import gc; d = gc.get_threshold(); import pipeline; "
                            "print(*d, *gc.get_threshold())"], capture_output=True, text=True, check=True)
    assert [int(x) for x in fresh.stdout.split()] == [*pipeline.PYTHON_GC, *pipeline.RAISED_GC]
    assert pipeline.RAISED_GC[0] > pipeline.PYTHON_GC[0]
    before = gc.get_threshold()
    gc.set_threshold(*pipeline.RAISED_GC)
    try:
        assert dict(map_runs(gc_threshold, [0], workers=1)) == {0: pipeline.PYTHON_GC}
        assert gc.get_threshold() == pipeline.RAISED_GC
    finally:
        gc.set_threshold(*before)


@pytest.mark.slow  # starts a local Dask cluster (worker processes)
def test_pool_started_first_imports_on_every_worker_and_matches_in_process(monkeypatch, capsys):
    """Warm-up imports reach every worker before any run, and the runs on the cluster equal the in-process ones
    bit for bit (every weight of every seed)."""
    seeds = [0, 1, 2]
    local = dict(map_runs(fit_tiny, seeds, workers=1))
    monkeypatch.setenv(executor.NVML_CHECK, "1")  # workers inherit it, as after the stage process imports Lightning
    with executor.worker_pool(2, warm=("tabnanny",)) as pool:
        workers = list(pool.scheduler_info()["workers"])
        assert not imported("tabnanny") and len(workers) == 2  # a module nothing else imports
        if torch.cuda.device_count() == 0:  # the warm-up imports (before any run) turned the slow check off
            assert all(pool.submit(nvml_check, workers=[w], pure=False).result() == "0" for w in workers)
        remote = dict(map_runs(fit_tiny, seeds, workers=2, pool=pool))  # after the warm-ups (top priority)
        assert all(pool.submit(imported, "tabnanny", workers=[w], pure=False).result() for w in workers)
    time.sleep(1)  # the warm-ups' done-callbacks run on Dask's callback thread
    assert "warning" not in capsys.readouterr().out  # workers in this process's environment
    assert sorted(remote) == seeds
    for s in seeds:
        assert local[s].keys() == remote[s].keys()
        for k in local[s]:
            assert torch.equal(local[s][k], remote[s][k]), f"seed {s} {k} differs between in-process and cluster"
    with executor.worker_pool(1, warm=("tabnanny",)) as pool:
        assert pool is None  # one worker and no address: runs stay in this process


@pytest.mark.slow  # starts a local Dask cluster (worker processes)
def test_a_worker_in_another_environment_is_named_in_one_warning(capsys):
    import dask
    import distributed  # noqa: F401 - registers its config defaults first: a dask.config.set that created the
    # "distributed" section would delete it on exit, defaults included, for every later test in this process

    # the workers' nannies set a variable that picks MKL's kernels: their runs may round otherwise
    with dask.config.set({"distributed.nanny.environ.MKL_CBWR": "COMPATIBLE"}), \
            executor.worker_pool(2, warm=("tabnanny",)) as pool:
        workers = list(pool.scheduler_info()["workers"])
        out, deadline = "", time.monotonic() + 60
        while out.count("warning") < 2 and time.monotonic() < deadline:
            time.sleep(0.2)  # the warm-up's done-callback prints from Dask's thread
            out += capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("warning")]
    assert sorted(line.split()[2] for line in lines) == sorted(workers), lines
    assert all("MKL_CBWR: unset here, COMPATIBLE there" in line for line in lines), lines


@pytest.mark.slow  # starts a local Dask cluster (worker processes)
def test_killed_worker_is_retried(tmp_path):
    out = dict(map_runs(die_once, [str(tmp_path / "die"), str(tmp_path / "live")], workers=2))
    assert (tmp_path / "die").read_text() == "died" and len(out) == 2
    assert all(pid != os.getpid() for pid in out.values())  # ran in worker processes, not here


@pytest.mark.slow  # starts a local Dask cluster (worker processes)
def test_worker_that_keeps_dying_fails_in_one_line(tmp_path):
    with pytest.raises(RunFailed) as err:
        list(map_runs(always_die, ["x", "y"], workers=2, describe=lambda i: f"task/{i}", log_dir=tmp_path))
    message = str(err.value)
    assert "\n" not in message and message.startswith("run task/") and "worker process died" in message
    assert err.value.log is not None and err.value.log.exists()


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_exception_names_the_run_and_logs_the_traceback(tmp_path, workers):
    with pytest.raises(RunFailed) as err:
        list(map_runs(raise_value, [1, 2, 3], workers=workers, describe=lambda i: f"run{i}", log_dir=tmp_path))
    assert str(err.value).startswith("run run2 failed: ValueError: bad item 2 (traceback: ")
    assert "raise ValueError" in (tmp_path / "run2.log").read_text()


def worker_env() -> dict[str, str]:
    return dict(os.environ)


def http_addresses(dask_scheduler) -> list[tuple]:
    """Where the scheduler's HTTP server (health and metrics routes, even without a dashboard) listens: every
    socket, IPv6 too (tornado's private map; distributed's own helper lists IPv4 only)."""
    return [sock.getsockname() for sock in dask_scheduler.http_server._sockets.values()]


@pytest.mark.slow  # starts a local Dask cluster (worker processes)
def test_local_cluster_binds_loopback_only(monkeypatch):
    monkeypatch.delenv(executor.ADDRESS_ENV, raising=False)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")  # as an earlier plain Dask cluster leaves it
    assert executor.scheduler_address(None) is None
    with executor.dask_client(2) as client:
        info = client.scheduler_info()
        addresses = [info["address"], *info["workers"]]
        assert len(info["workers"]) == 2
        assert all(a.startswith(f"tcp://{executor.LOOPBACK}:") for a in addresses), addresses
        assert client.cluster.dashboard_link is None or "127.0.0.1" in client.cluster.dashboard_link
        http = client.run_on_scheduler(http_addresses)
        assert http and all(host == executor.LOOPBACK and port != 8787 for host, port, *_ in http), http
        # Dask's default MALLOC_TRIM_THRESHOLD_ doubles a training step's time (bench.overheads): not set here
        env = client.submit(worker_env, pure=False).result()
        assert "MALLOC_TRIM_THRESHOLD_" not in env and env["OMP_NUM_THREADS"] == "1"


def test_given_address_is_used(monkeypatch):
    monkeypatch.setenv(executor.ADDRESS_ENV, "tcp://127.0.0.1:1")
    assert executor.scheduler_address(None) == "tcp://127.0.0.1:1"
    assert executor.scheduler_address("tcp://127.0.0.1:2") == "tcp://127.0.0.1:2"


def test_longest_runs_start_first(capsys):
    items = [("short", 1), ("long", 9), ("mid", 5)]
    done = [name for (name, _), _ in map_runs(lambda i: i, items, cost=lambda i: i[1])]
    assert done == ["long", "mid", "short"]
    assert "run 3 of 3 done: ('short', 1)" in capsys.readouterr().out


@pytest.mark.parametrize(("address", "reason"), [("tcp://127.0.0.1:9", "cannot connect within"),
                                                 ("bogus://host:1", "unknown address scheme 'bogus'"),
                                                 ("host-without-port", "no port in the address")])
def test_named_cluster_that_cannot_answer_is_one_line(address, reason, monkeypatch):
    """Refused before any MLflow run opens, and without a half-made Client whose __del__ prints at exit."""
    from pipeline.errors import StageError

    monkeypatch.setattr(executor, "SCHEDULER_TIMEOUT_S", 2)
    with pytest.raises(StageError) as err, executor.dask_client(1, address):
        pass
    assert str(err.value).startswith(f"train.runtime.scheduler / $DASK_SCHEDULER_ADDRESS: no Dask scheduler at "
                                     f"{address} (") and reason in str(err.value)


def test_named_cluster_that_answers_is_used():
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, processes=False, protocol="tcp", host=executor.LOOPBACK,
                      dashboard_address=None) as cluster, \
            executor.dask_client(1, cluster.scheduler_address) as client:
        assert client.submit(sum, [1, 2]).result() == 3


def test_the_eta_weights_runs_by_their_expected_cost():
    from pipeline.executor import eta, hms

    # one of two runs done, but it was the 3-unit one of 4 units: a third of the time it took is left
    assert eta(90.0, 3.0, 4.0) == pytest.approx(30.0)
    assert eta(90.0, 1.0, 4.0) == pytest.approx(270.0)
    assert hms(3725.4) == "1:02:05" and hms(float("nan")) == "?"


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_an_interrupted_run_interrupts_the_stage(workers):
    """SIGINT in a worker is an interruption, not a failure: the caller sees KeyboardInterrupt (the stage then
    ends its runs KILLED, resumable, with exit 130), never a RunFailed that would mark the run FAILED."""
    with pytest.raises(KeyboardInterrupt, match="run run2 interrupted"):
        list(map_runs(interrupt, [1, 2, 3], workers=workers, describe=lambda i: f"run{i}"))


def test_a_run_terminated_inside_lightning_terminates_the_stage():
    """SIGTERM during fit comes back from Lightning as SIGTERMException (a SystemExit): the stage sees Terminated
    (runs KILLED, exit 143, as tests/test_checked_inputs.py runs for real), never a RunFailed."""
    from pipeline.errors import Terminated

    with pytest.raises(Terminated, match="run run2 terminated"):
        list(map_runs(lightning_sigterm, [1, 2, 3], workers=1, describe=lambda i: f"run{i}"))


def test_a_peer_that_speaks_another_protocol_is_one_line(monkeypatch):
    """A loopback server that greets with a banner (SSH here) once made Client() allocate 2.8 EiB: the first
    message's size is read and checked first."""
    import socket
    import threading

    from pipeline.errors import StageError

    monkeypatch.setattr(executor, "SCHEDULER_TIMEOUT_S", 2)
    with socket.create_server(("127.0.0.1", 0)) as server:
        def greet():
            conn, _ = server.accept()
            with conn:
                conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
                time.sleep(1)
        threading.Thread(target=greet, daemon=True).start()
        address = f"tcp://127.0.0.1:{server.getsockname()[1]}"
        with pytest.raises(StageError, match=r"not a Dask scheduler: it opened with b'SSH-2.0-'"), \
                executor.dask_client(1, address):
            pass


def test_a_tls_address_without_a_security_context_is_one_line():
    from pipeline.errors import StageError

    with pytest.raises(StageError, match=r"no Dask scheduler at tls://127.0.0.1:9 \(tls:// needs a TLS security"), \
            executor.dask_client(1, "tls://127.0.0.1:9"):
        pass


def test_a_silent_peer_at_the_scheduler_address_is_one_line(monkeypatch):
    """Something that accepts TCP but never speaks Dask (a web server, a stuck process) held Client() in its
    handshake for good; now one line after SCHEDULER_TIMEOUT_S."""
    import socket

    from pipeline.errors import StageError

    monkeypatch.setattr(executor, "SCHEDULER_TIMEOUT_S", 1)
    with socket.create_server(("127.0.0.1", 0)) as server:  # the kernel accepts; nobody ever writes
        address = f"tcp://127.0.0.1:{server.getsockname()[1]}"
        t0 = time.monotonic()
        with pytest.raises(StageError, match="sent no Dask handshake within 1 s"), executor.dask_client(1, address):
            pass
    assert time.monotonic() - t0 < 10
