"""The MLflow store a stage tracks to: where it is (params, ``$MLFLOW_TRACKING_URI``, else the repository's
``mlflow.db``), whether it is usable before any run starts, a client whose store faults read as one line, and the
lock under which the store and experiments are created."""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
import sqlite3
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from pipeline.config import Params
from pipeline.errors import ConfigError, StageError
from pipeline.io import check_kind
from pipeline.repository import repo_root

STORE_NAME = "mlflow.db"


SQLITE_MAGIC = b"SQLite format 3\x00"


HTTP_TIMEOUT_S = 5


LOCK_TIMEOUT_S = 120  # store creation takes seconds; a lock held longer belongs to a stuck process


# MLflow's answers about a run or an experiment (deleted, a bad value), which callers handle (StageRun.open starts
# a new run for a deleted one); any other MlflowException is the store or server failing.
ANSWERS = {"RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "RESOURCE_ALREADY_EXISTS", "INVALID_STATE"}


# Loggers that print a store fault's whole traceback (logger.exception) before MLflow re-raises it: the one-line
# StageError says it instead.
NOISY = {"mlflow.store.db.utils": "CRITICAL", "alembic": "WARNING", "mlflow.system_metrics": "ERROR",
         "mlflow.utils.rest_utils": "CRITICAL"}


def tracking_uri(params: Params | None = None, start: str | Path | None = None) -> str:
    """params ``tracking.tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///<repo>/mlflow.db``."""
    if params is not None and params.tracking.tracking_uri:
        return params.tracking.tracking_uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{repo_root(start) / STORE_NAME}"


# MLflow's tracking stores (database back ends through SQLAlchemy, or a tracking server).
# What sqlite says when a write finds no room: the disk is full or a file-size limit (ulimit -f) is reached.
FULL = ("database or disk is full", "disk I/O error", "File too large")
STORE_SCHEMES = ("sqlite", "http", "https", "postgresql", "mysql", "mssql")


def check_store(params: Params) -> str:
    """The tracking URI, once it is known to work: refuses a corrupt sqlite file or an unreachable server.

    Runs before any training, so a bad store costs seconds, not a stage's worth of runs left unrecorded.
    Never writes to a bad store (the file is kept for forensics).
    """
    uri = tracking_uri(params)
    key = "tracking.tracking_uri" if params.tracking.tracking_uri else "MLFLOW_TRACKING_URI / mlflow.db"
    scheme = uri.split("://", 1)[0] if "://" in uri else ""
    if scheme not in STORE_SCHEMES:
        raise ConfigError(f"{key}: {uri!r} is not a tracking URI this pipeline can use "
                          f"(scheme one of {', '.join(STORE_SCHEMES)}; e.g. sqlite:///<path>/mlflow.db)")
    if scheme == "sqlite" and (not uri.startswith("sqlite:///") or ":memory:" in uri or uri == "sqlite:///"):
        raise ConfigError(f"{key}: {uri!r} keeps no runs after the stage exits (in-memory or no file); "
                          "use sqlite:///<absolute path>/mlflow.db")
    if uri.startswith("sqlite:///"):
        path = Path(uri.removeprefix("sqlite:///"))
        if blocker := next((d for d in path.parents if d.exists() and not d.is_dir()), None):
            raise StageError(f"{blocker}: not a folder, so it cannot hold the MLflow store {path} ({key})")
        if path.is_dir():
            raise StageError(f"{path}: a folder, not an SQLite MLflow store ({key}); move it aside and rerun")
        check_kind(path)  # a FIFO or a device would block sqlite's open; a loop of links, MLflow retries for minutes
        if path.exists() and path.stat().st_size and path.read_bytes()[:16] != SQLITE_MAGIC:
            raise StageError(f"{path}: not an SQLite MLflow store (corrupt?); move it aside and rerun "
                             "(a fresh store is created)")
        if reason := _unwritable(path):
            raise StageError(f"tracking store {uri}: {reason}")
        if path.exists() and path.stat().st_size and (damage := _damage(path)):
            raise StageError(f"tracking store {uri}: damaged (sqlite quick_check: {damage}); nothing was written "
                             f"to it: move {path} aside and rerun (a fresh store is created)")
    elif scheme in ("postgresql", "mysql", "mssql"):
        from sqlalchemy.engine import make_url

        try:
            make_url(uri).get_dialect().import_dbapi()
        except ModuleNotFoundError as err:
            raise ConfigError(f"{key}: {scheme} store {uri.split('@')[-1]!r} needs the database driver "
                              f"{err.name!r}, which is not installed in this environment (pip install it, or use "
                              "sqlite:///<path>/mlflow.db)") from None
    elif uri.startswith(("http://", "https://")):
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")  # MLflow's default retries for minutes
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
        try:
            with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=HTTP_TIMEOUT_S):  # noqa: S310
                pass
        except (urllib.error.URLError, OSError, ValueError) as err:
            raise ConfigError(f"{key}: MLflow server {uri} not reachable within {HTTP_TIMEOUT_S} s "
                              f"({getattr(err, 'reason', err)})") from None
    with _store_lock(uri):  # a new sqlite store is created here, once
        _client(uri).search_experiments(max_results=1)  # a store MLflow cannot open fails here, before training
    return uri


def _damage(path: Path) -> str | None:
    """What sqlite's ``PRAGMA quick_check`` finds wrong with the store (opened read-only: a damaged store is never
    written to), else None. Seconds on a large store; a page of garbage in the middle otherwise goes unnoticed
    until runs have logged into it."""
    try:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as con:
            rows = [r[0] for r in con.execute("PRAGMA quick_check(3)")]
    except sqlite3.OperationalError as err:  # locked or busy: another writer, not damage (reported when it lasts)
        return None if "locked" in str(err) or "busy" in str(err) else str(err)
    except sqlite3.DatabaseError as err:
        return str(err)
    return None if rows == ["ok"] else "; ".join(rows)


def _unwritable(path: Path) -> str | None:
    """Why MLflow could not write the sqlite store ``path`` (read-only file, or a folder where sqlite cannot put
    its journal), else None. Checked before any run opens: reading works, so MLflow would fail at the first run."""
    folder = next((d for d in (path.parent, *path.parent.parents) if d.exists()), None)
    if path.exists() and not os.access(path, os.W_OK):
        return f"{path} is read-only"
    if folder is not None and not os.access(folder, os.W_OK):
        return f"{folder} is read-only (sqlite writes its journal beside the store)"
    return None


def _client(uri: str) -> Guarded:
    from mlflow.exceptions import MlflowException

    for name, level in NOISY.items():  # "Creating initial MLflow database tables...", fault tracebacks
        logging.getLogger(name).setLevel(level)
    from mlflow.tracking import MlflowClient

    try:
        with store_faults(uri):
            return Guarded(MlflowClient(tracking_uri=uri), uri)
    except MlflowException as err:
        raise StageError(f"{uri}: MLflow cannot open the store ({str(err).splitlines()[0]})") from None


def fault_reason(err: BaseException) -> str | None:
    """The one-line reason when ``err`` is the store or server failing (locked, corrupt, read-only, gone, not
    MLflow), else None: MLflow's answers about runs (:data:`ANSWERS`) and bugs pass through unchanged."""
    import requests
    import sqlalchemy.exc
    from mlflow.exceptions import MlflowException

    if isinstance(err, MlflowException):
        if err.error_code in ANSWERS:
            return None
        text = err.message  # MLflow wraps SQLAlchemy's text (a full disk included)
    elif isinstance(err, (sqlalchemy.exc.SQLAlchemyError, requests.RequestException, OSError, json.JSONDecodeError)):
        text = str(err)
    else:
        return None
    # SQLAlchemy's own start "(sqlite3.DatabaseError) ...", after its note on autoflush when a query flushed
    line = _first_line("\n".join(x for x in text.splitlines() if not x.startswith(AUTOFLUSH)))
    if any(says in line for says in FULL) or getattr(err, "errno", None) in (errno.ENOSPC, errno.EFBIG):
        return f"no room to write (disk full or a file-size limit): {line}"
    return line if line.startswith("(") or isinstance(err, MlflowException) else f"{type(err).__name__}: {line}"


AUTOFLUSH = "(raised as a result of Query-invoked autoflush"


def _first_line(message: object, limit: int = 300) -> str:
    line = next((x.strip() for x in str(message).splitlines() if x.strip()), "no message")
    return line if len(line) <= limit else f"{line[:limit]}..."


@contextmanager
def store_faults(uri: str) -> Iterator[None]:
    """The boundary of every MLflow call: a store or server fault becomes ``tracking store <uri>: <reason>``."""
    try:
        yield
    except StageError:
        raise
    except Exception as err:
        if (reason := fault_reason(err)) is None:
            raise
        raise StageError(f"tracking store {uri}: {reason}") from None


class Guarded:
    """An ``MlflowClient`` whose every method call runs inside :func:`store_faults`."""

    def __init__(self, client, uri: str):
        self._client, self.uri = client, uri

    def __getattr__(self, name: str):
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        @functools.wraps(attr)
        def call(*args, **kwargs):
            with store_faults(self.uri):
                return attr(*args, **kwargs)
        return call


@contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """MLflow's sqlite store creation, under a lock with a bounded wait that names the lock file."""
    if uri.startswith("sqlite:///"):
        lock = Path(uri.removeprefix("sqlite:///") + ".lock")
        lock.parent.mkdir(parents=True, exist_ok=True)
        try:  # FileLock would retry a lock file it can never create for LOCK_TIMEOUT_S, then blame another process
            lock.touch(exist_ok=True)
        except OSError as err:
            raise StageError(f"tracking store {uri}: cannot create the lock {lock}: "
                             f"{os.strerror(err.errno).lower() if err.errno else err}") from None
        try:
            with FileLock(lock, timeout=LOCK_TIMEOUT_S):
                yield
        except Timeout:
            raise StageError(f"tracking store {uri}: {lock} held by another process for {LOCK_TIMEOUT_S} s "
                             "(another stage creating the store, or a stuck one)") from None
    else:
        yield
