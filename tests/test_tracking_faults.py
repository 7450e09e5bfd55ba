"""Tracking faults after the store check passes (pipeline.tracking): a truncated, locked or read-only sqlite store,
a held store lock, a server that is not MLflow or goes away: one ``error: tracking store <uri>: <reason>`` line,
exit 2, no traceback; and a failing stage leaves no MLflow run RUNNING. Real temporary sqlite stores, no training."""

from __future__ import annotations

import http.server
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import tiny_repo

from pipeline import mlflow_store, tracking
from pipeline.config import Params, parse_params
from pipeline.errors import ConfigError, StageError
from pipeline.stages.common import stage_main

ROOT = Path(__file__).resolve().parents[1]


def params_for(uri: str) -> Params:
    raw = tiny_repo.params_with()
    raw["tracking"]["tracking_uri"] = uri
    return parse_params(raw)


def statuses(uri: str, params: Params) -> dict[str, list[str]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(tracking.experiment_name(params, "train"))
    out: dict[str, list[str]] = {}
    for run in client.search_runs([exp.experiment_id]):
        out.setdefault(run.info.run_name, []).append(run.info.status)
    return {name: sorted(found) for name, found in out.items()}


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """A real store holding one finished stage run with one finished nested run (made once: seconds)."""
    folder = tmp_path_factory.mktemp("store")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    with tracking.stage_run(params_for(uri), "train", "train") as run:
        run.finish(run.open("done", {}, {"x": 1}))
    return folder


@pytest.fixture
def store(template, tmp_path) -> tuple[Path, str, Params]:
    db = tmp_path / "store" / "mlflow.db"
    shutil.copytree(template, db.parent)
    uri = f"sqlite:///{db}"
    return db, uri, params_for(uri)


def run_stage(params: Params, body=lambda run: None) -> int:
    """A stage entry point that opens its MLflow runs like the training stages, then runs ``body``."""
    @stage_main
    def main(argv):
        with tracking.stage_run(params, "train", "train") as run:
            body(run)
    return main([])


def one_error_line(capfd) -> str:
    err = capfd.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: tracking store "), err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.slow  # over a second idle: make test, not test-fast
def test_truncated_store_is_one_line(store, capfd):
    db, uri, params = store
    db.write_bytes(db.read_bytes()[: db.stat().st_size // 3])  # the SQLite header survives, quick_check does not
    before = db.read_bytes()
    assert run_stage(params) == 2
    assert one_error_line(capfd).startswith(f"error: tracking store {uri}: damaged (sqlite quick_check: database "
                                            "disk image is malformed); nothing was written to it")
    assert db.read_bytes() == before


@pytest.mark.slow
def test_locked_store_is_one_line_after_sqlites_wait(store, capfd):
    db, uri, params = store
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another process mid-write (MLflow's sqlite wait is 20 s)
    try:
        assert run_stage(params) == 2
    finally:
        holder.close()
    assert one_error_line(capfd).endswith(f"{uri}: (sqlite3.OperationalError) database is locked")
    assert statuses(uri, params) == {"train": ["FINISHED"], "done": ["FINISHED"]}


@pytest.mark.slow  # over a second idle: make test, not test-fast
def test_held_store_lock_waits_a_bounded_time_and_names_it(store, capfd, monkeypatch):
    db, uri, params = store
    monkeypatch.setattr(mlflow_store, "LOCK_TIMEOUT_S", 0.3)
    lock = Path(f"{db}.lock")
    # the lock held by another process (flock locks are per open file, so a second process is the honest test)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from filelock import FileLock; "
                               "l = FileLock(sys.argv[1]); l.acquire(); print('held', flush=True); time.sleep(60)",
                               str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert run_stage(params) == 2
    finally:
        holder.kill()
        holder.wait()
    line = one_error_line(capfd)
    assert f"{lock} held by another process for 0.3 s" in line


def _read_only_prefix(folder: Path) -> tuple[str, ...]:
    """A command prefix under which ``folder`` is read-only (as root: a read-only bind mount of its own)."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return ()
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"]).returncode:
        pytest.skip("running as root without user namespaces: cannot make a folder read-only")
    return ("unshare", "-rm", "sh", "-c", f'mount --bind -o ro "{folder}" "{folder}" && exec "$0" "$@"')


@pytest.mark.slow  # over a second idle: make test, not test-fast
def test_read_only_store_is_refused_before_any_run(store):
    db, uri, params = store
    before = db.read_bytes()
    script = ("import sys; sys.path[:0] = [sys.argv[2], sys.argv[2] + '/tests']; import test_tracking_faults as t; "
              "sys.exit(t.run_stage(t.params_for(sys.argv[1])))")
    prefix = _read_only_prefix(db.parent)
    try:
        proc = subprocess.run([*prefix, sys.executable, "-c", script, uri, str(ROOT)], capture_output=True,
                              text=True, timeout=120, cwd=ROOT)
    finally:
        db.parent.chmod(0o755)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [f"error: tracking store {uri}: {db} is read-only"], proc.stderr
    assert db.read_bytes() == before


@pytest.mark.parametrize("uri", ["sqlite://", "sqlite:///:memory:"])
def test_uri_that_keeps_nothing_is_refused(uri, capfd):
    assert run_stage(params_for(uri)) == 2
    err = capfd.readouterr().err
    assert err.splitlines() == [f"error: tracking.tracking_uri: {uri!r} keeps no runs after the stage exits "
                                "(in-memory or no file); use sqlite:///<absolute path>/mlflow.db"]


class NotMLflow(http.server.BaseHTTPRequestHandler):
    """Answers ``/health`` (so the store check passes); any other request gets HTML or a dropped connection."""

    drop = False

    def do_GET(self):
        if self.drop and not self.path.endswith("/health"):
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(b"<html>a login page</html>")

    do_POST = do_GET

    def log_message(self, *args):
        pass


@pytest.mark.parametrize(("drop", "reason"), [(False, "the response body was not in a valid JSON format"),
                                              (True, "Max retries exceeded")])
def test_server_that_is_not_mlflow_or_drops_requests(drop, reason, capfd, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0")  # seconds, not a minute of backoff
    handler = type("Handler", (NotMLflow,), {"drop": drop})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_port}"
    try:
        assert run_stage(params_for(uri)) == 2
    finally:
        server.shutdown()
    line = one_error_line(capfd)
    assert line.startswith(f"error: tracking store {uri}: ") and reason in line


@pytest.mark.parametrize(("error", "status"), [(StageError("cannot write x: disk full"), "FAILED"),
                                               (RuntimeError("a bug"), "FAILED"), (KeyboardInterrupt(), "KILLED")])
@pytest.mark.slow  # over a second idle: make test, not test-fast
def test_failing_stage_leaves_no_run_running(store, error, status):
    db, uri, params = store

    def body(run):
        run.finish(run.open("finished", {}, {}))
        run.open("pending", {}, {})
        run.fail(run.open("failed", {}, {}))
        resumed = run.open("resumed", {}, {})
        run.kill(resumed)
        run.open("resumed", {}, {}, run_id=resumed)  # reopened: RUNNING again until the stage ends it
        raise error

    with pytest.raises(type(error)):
        with tracking.stage_run(params, "train", "train") as run:
            body(run)
    assert statuses(uri, params) == {"train": sorted([status, "FINISHED"]), "done": ["FINISHED"],
                                     "finished": ["FINISHED"], "pending": [status], "failed": ["FAILED"],
                                     "resumed": [status]}


def test_answers_about_runs_are_not_store_faults(store):
    """A deleted run is MLflow's answer, which StageRun.open handles by starting a new run: not a fault."""
    db, uri, params = store
    with tracking.stage_run(params, "train", "train") as run:
        new = run.open("again", {}, {}, run_id="0" * 32)
        assert new != "0" * 32
        run.finish(new)
    tracking.end_stale_run("f" * 32, uri)  # nothing to end: no error


def test_garbage_inside_the_store_is_found_before_any_write(store):
    """Garbage in the middle of mlflow.db once went unnoticed (runs kept logging, exit 0): the stage-start check
    runs sqlite's quick_check, read-only, and refuses the store untouched."""
    db, uri, params = store
    data = bytearray(db.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 8192] = os.urandom(8192)
    db.write_bytes(bytes(data))
    with pytest.raises(StageError, match=r"mlflow.db: damaged \(sqlite quick_check: "):
        mlflow_store.check_store(params)
    assert db.read_bytes() == bytes(data)


@pytest.mark.parametrize("uri", ["postgresql://bias:secret@db.example/mlflow", "mysql://bias@db.example/mlflow"])
def test_a_server_store_without_its_driver_is_one_line(uri):
    with pytest.raises(ConfigError, match=r"tracking.tracking_uri: (postgresql|mysql) store 'db.example/mlflow' "
                                          r"needs the database driver '\w+', which is not installed") as err:
        mlflow_store.check_store(params_for(uri))
    assert "secret" not in str(err.value)  # the password stays out of the message


def test_a_full_disk_says_so_and_names_the_store():
    import sqlalchemy.exc

    full = sqlalchemy.exc.OperationalError("INSERT INTO metrics", {}, sqlite3.OperationalError(
        "database or disk is full"))
    assert mlflow_store.fault_reason(full).startswith("no room to write (disk full or a file-size limit): ")
    assert mlflow_store.fault_reason(OSError(27, "File too large")).startswith("no room to write")


def test_a_full_disk_inside_mlflow_says_so_not_sqlalchemys_autoflush_note():
    """MLflow wraps SQLAlchemy's text, which opens with a note on autoflush when a query flushed the failing write
    (what a file-size limit gave in the bad-input table's full-disk-store case)."""
    from mlflow.exceptions import MlflowException

    wrapped = MlflowException("(raised as a result of Query-invoked autoflush; consider using a session.no_autoflush "
                              "block if this flush is occurring prematurely)\n(sqlite3.OperationalError) disk I/O "
                              "error\n[SQL: INSERT INTO runs (run_uuid) VALUES (?)]")
    assert mlflow_store.fault_reason(wrapped) == ("no room to write (disk full or a file-size limit): "
                                                  "(sqlite3.OperationalError) disk I/O error")
