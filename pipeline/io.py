"""Atomic file and folder output, deterministic archives, content hashes: a reader never sees a half-written
file, and equal content gives equal bytes."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import math
import os
import shutil
import stat
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import StageError


@contextmanager
def _naming(path: Path) -> Iterator[None]:
    """A write error without a file name (``write()`` hitting a full disk) names the output being written.

    numpy reports a short write (full disk, file size limit) as an ``OSError`` with no errno at all."""
    try:
        yield
    except OSError as err:
        if err.filename is not None:
            raise
        if err.errno is None:
            raise StageError(f"cannot write {path}: {err} (disk full or file size limit?)") from None
        raise OSError(err.errno, err.strerror, str(path)) from err


def _make_folder(folder: Path) -> None:
    """``mkdir -p folder``. Not found while making folders means the filesystem there makes none (``/proc``,
    ``/sys``): the user's path, one line (other errors, read-only or a file on the way, are the stage's to say)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileNotFoundError as err:
        raise StageError(f"cannot write {folder}: no folder can be made there ({err.strerror})") from None


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it over ``path`` only if the block succeeds."""
    path = Path(path)
    _make_folder(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    try:
        with _naming(path):
            yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``path``; it replaces ``path`` only if the block succeeds.

    A file (not a folder) at ``path`` is refused before anything is written: it is the user's, not an earlier
    output of this stage, and replacing it would lose it."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FileExistsError(errno.EEXIST, "a file stands where the output folder goes", str(path))
    _make_folder(path.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    os.chmod(tmp, 0o755)  # noqa: S103  mkdtemp makes it private; the final folder should read like any other
    try:
        with _naming(path):
            yield tmp
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old.", dir=path.parent))
            os.replace(path, old / path.name)
            shutil.rmtree(old)
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def save_npz(path: str | Path, arrays: dict[str, Any]) -> None:
    """Like ``np.savez`` (``np.load`` reads it) but with fixed zip timestamps, so equal arrays give equal
    bytes and DVC sees an unchanged output when nothing changed."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        for name in sorted(arrays):
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            with zf.open(info, "w", force_zip64=True) as fh:
                np.lib.format.write_array(fh, np.ascontiguousarray(arrays[name]), allow_pickle=False)


def write_text(path: str | Path, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_json(path: str | Path, obj: Any) -> Path:
    return write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_jsonable) + "\n")


def write_with(path: str | Path, writer: Callable[[Path], None]) -> Path:
    """Atomically write ``path`` with ``writer(tmp_path)`` (e.g. ``df.to_csv``, ``np.savez``)."""
    with atomic_path(path) as tmp:
        writer(tmp)
    return Path(path)


def save_figure(fig, path: str | Path) -> Path:
    """PNG without a software/version stamp, so an identical figure gives identical bytes."""
    import matplotlib.pyplot as plt

    write_with(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight",
                                             metadata={"Software": None}))
    plt.close(fig)
    return Path(path)


def sha256_file(path: str | Path) -> str:
    with open(check_kind(path), "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def sha256_bytes(*arrays: bytes) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(a)
    return h.hexdigest()


def index_sha256(idx: np.ndarray) -> str:
    """The slice stage's hash of an index array (``manifest.json`` ``arrays.<name>.sha256``)."""
    return sha256_bytes(np.ascontiguousarray(idx, dtype=np.int64).tobytes())


# What a path is when it is not a regular file or a folder: opening one to read could block (a FIFO with no writer,
# a socket, a terminal) or never end (a device).
SPECIAL = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
           (stat.S_ISBLK, "a block device"))


def check_kind(path: str | Path, folder: bool = False, error: type[Exception] = StageError) -> Path:
    """``path``, once it is known to be a regular file (a folder if ``folder``), checked before anything opens it;
    else one ``error`` line naming it. A missing path passes: each reader says what a missing input means."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return path
    except OSError as err:  # a loop of links, a name too long, no permission on the way
        raise error(f"{path}: cannot inspect ({err.strerror or err})") from None
    if folder and not stat.S_ISDIR(mode):
        raise error(f"{path}: not a folder ({_what(mode)})")
    if not folder and not stat.S_ISREG(mode):
        blocks = "" if stat.S_ISDIR(mode) else "; reading it could block"
        raise error(f"{path}: not a file ({_what(mode)}{blocks})")
    return path


def _what(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISDIR(mode):
        return "a folder"
    return next((name for test, name in SPECIAL if test(mode)), "a special file")


def checked_arrays(path: str | Path) -> Path:
    """``path`` (a ``.npy``, or a ``.npz`` whose members are), once every array header's declared shape and dtype
    agree with the bytes that follow it, before anything allocates them: a forged or damaged header that
    declares 2**38 values is one :class:`StageError` line naming the file (and member), not a 2 TiB allocation.
    Object arrays (pickles) are refused too. A missing file passes: each reader says what a missing input means."""
    path = check_kind(path)
    if not path.exists():
        return path
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                for info in z.infolist():
                    with z.open(info) as f:
                        _check_header(f, info.file_size, f"{path} ({info.filename})")
        else:
            with open(path, "rb") as f:
                _check_header(f, path.stat().st_size, str(path))
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise StageError(f"{path}: unreadable ({type(err).__name__}: {err})") from None
    return path


def _check_header(f, size: int, where: str) -> None:
    version = np.lib.format.read_magic(f)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _, dtype = read(f)
    if dtype.hasobject:
        raise StageError(f"{where}: an object array (a pickle), not numbers; regenerate it")
    declared, held = math.prod(shape) * dtype.itemsize, size - f.tell()
    if declared != held:
        raise StageError(f"{where}: unreadable (its header declares {shape} {dtype}, {declared} bytes, but {held} "
                         "bytes follow: truncated or damaged; regenerate it: dvc repro)")


class Unit(float):
    """In a :data:`Shape`: a finite number in [0, 1] (an accuracy, a rate), not just any number."""


# What a field of a JSON file should be, as said in an error ("'seed' should be an integer").
KINDS = {dict: "a mapping", list: "a list", str: "a string", int: "an integer", float: "a number",
         bool: "true or false", type(None): "null", Unit: "a number in [0, 1]"}
# dotted key -> the type(s) its value may have; a ``*`` part stands for every key of the mapping there
Shape = dict[str, type | tuple[type, ...]]


def read_json(path: str | Path, required: Shape | None = None) -> dict:
    """The JSON mapping in ``path``, its ``required`` fields checked; one-line :class:`StageError` otherwise.

    ``required`` maps a dotted key (``"sha256.images"``) to a type or tuple of types; ``float`` admits an int,
    and a bool is never a number (JSON's ``true`` would pass ``isinstance(True, int)``)."""
    path = check_kind(path)
    if not path.exists():
        raise StageError(f"{path}: missing")
    try:
        obj = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        where = f" at line {err.lineno}" if isinstance(err, json.JSONDecodeError) else ""
        raise StageError(f"{path}: not JSON ({getattr(err, 'msg', 'not UTF-8 text')}{where})") from None
    except RecursionError:
        raise StageError(f"{path}: not a file this pipeline wrote (nested deeper than JSON's parser goes)") from None
    except OSError as err:  # a folder, or no permission
        raise StageError(f"{path}: unreadable ({err.strerror or err})") from None
    if not isinstance(obj, dict):
        raise StageError(f"{path}: should hold a JSON object (a mapping), not {_kind(obj)}")
    for key, kinds in (required or {}).items():
        check_field(path, obj, key, kinds)
    return obj


def read_new_lines(path: str | Path, offset: int, required: Shape) -> tuple[list[dict], int]:
    """The complete JSON lines of ``path`` after byte ``offset`` (each a mapping of ``required`` shape), and
    the offset after them; a line still being written waits for the next call. No file yet: nothing."""
    path = check_kind(path)
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    complete = data[: data.rfind(b"\n") + 1]
    out = []
    for line in complete.splitlines():
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise StageError(f"{path}: a line is not JSON ({getattr(err, 'msg', 'not UTF-8 text')})") from None
        if not isinstance(obj, dict):
            raise StageError(f"{path}: a line should hold a JSON object (a mapping), not {_kind(obj)}")
        for key, kinds in required.items():
            check_field(path, obj, key, kinds)
        out.append(obj)
    return out, offset + len(complete)


def check_field(path: Path, obj: dict, key: str, kinds: type | tuple[type, ...]) -> Any:
    """The value at dotted ``key`` of ``obj`` (read from ``path``), if it has one of ``kinds``; a ``*`` part
    checks the rest of the key under every entry of the mapping there."""
    node: Any = obj
    for i, part in enumerate(parts := key.split(".")):
        if not isinstance(node, dict):
            raise StageError(f"{path}: {'.'.join(parts[:i])!r} should be a mapping")
        if part == "*":
            for name in node:
                check_field(path, obj, ".".join([*parts[:i], name, *parts[i + 1:]]), kinds)
            return node
        if part not in node:
            raise StageError(f"{path}: missing key {'.'.join(parts[:i + 1])!r}")
        node = node[part]
    wanted = kinds if isinstance(kinds, tuple) else (kinds,)
    accepted = (*wanted, int, float) if float in wanted or Unit in wanted else wanted
    if not isinstance(node, accepted) or (isinstance(node, bool) and bool not in wanted) or (
            Unit in wanted and isinstance(node, (int, float)) and not isinstance(node, bool)
            and not 0 <= node <= 1):  # NaN fails too
        names = " or ".join(KINDS.get(k, k.__name__) for k in wanted)
        shown = f"{node!r}" if isinstance(node, (int, float)) and not isinstance(node, bool) else _kind(node)
        raise StageError(f"{path}: {key!r} should be {names}, not {shown}")
    if isinstance(node, float) and not math.isfinite(node):  # json reads NaN and Infinity as floats
        raise StageError(f"{path}: {key!r} should be a finite number, not {node!r}")
    return node


def _kind(value: Any) -> str:
    return "null" if value is None else KINDS.get(type(value), type(value).__name__)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


@contextmanager
def exclusive(folder: Path, what: str) -> Iterator[None]:
    """Hold a lock on ``folder`` while a stage writes into it; a second holder is refused in one line.

    The lock file lives in the system temp folder (keyed by the folder's resolved path), not in the folder:
    a DVC output must hold only what the stage writes. The kernel releases the lock when its process dies,
    so a killed stage never leaves one behind.
    """
    key = hashlib.sha256(str(Path(folder).resolve()).encode()).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / f"bias-{key}.lock"
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise StageError(f"{folder}: {what} is already running on it ({holder}; lock {path})") from None
        with _naming(path):  # unbuffered: a full temp folder fails here, naming the lock, not again at close
            os.ftruncate(handle.fileno(), 0)
            os.write(handle.fileno(), f"pid {os.getpid()}".encode())
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)

