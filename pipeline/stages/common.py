"""What every stage entry point shares: ``--params`` and its loading, one-line errors, a clean exit code."""

from __future__ import annotations

import argparse
import errno
import functools
import gc
import os
import resource
import signal
import sys
import tempfile
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import yaml

from pipeline.config import Params, load_params
from pipeline.errors import ConfigError, StageError, Terminated
from pipeline.executor import worker_pool
from pipeline.grid import Folders
from pipeline.io import check_kind
from pipeline.pruning import prune

# An output that cannot be written is a user's problem (read-only folder, full disk, size limit), not a bug.
UNWRITABLE = {errno.EROFS, errno.ENOSPC, errno.EFBIG, errno.EDQUOT}
# An output or input path of the wrong kind (a file where a folder goes, or the reverse): the user's path, not a bug.
WRONG_KIND = {errno.ENOTDIR: "a file stands where a folder is needed on its path",
              errno.EEXIST: "a file stands where a folder is needed", errno.EISDIR: "a folder, not a file"}


def wrong_kind(err: OSError) -> str | None:
    """The one-line error for a path of the wrong kind, else None (any other OSError is not the user's path)."""
    if err.errno in WRONG_KIND and err.filename:
        return f"error: {err.filename}: {WRONG_KIND[err.errno]}"
    return None


def stage_main(fn: Callable[[list[str] | None], None]) -> Callable[[list[str] | None], int]:
    """Wrap a stage ``main``: known input problems print one line on stderr and exit 2, no traceback."""

    @functools.wraps(fn)
    def wrapper(argv: list[str] | None = None) -> int:
        announce_stage()
        if argv is None:  # a program (not a test): `kill`, `timeout` or a scheduler's stop ends it like Ctrl-C
            signal.signal(signal.SIGTERM, _terminate)
        try:
            return _run(fn, argv)
        finally:
            if argv is None:  # a program about to exit (tests pass argv and keep their process)
                # the interpreter's last collections walk every object torch, timm and MLflow created: ~1.5 s of
                # each stage process's exit. Frozen objects are skipped; atexit handlers still run, and every
                # output is written and closed by now.
                gc.freeze()

    return wrapper


def _terminate(signum, frame) -> None:
    raise Terminated


def _run(fn: Callable[[list[str] | None], None], argv: list[str] | None) -> int:
    try:
        fn(argv)
    except (ConfigError, StageError) as err:
        print(f"error: {one_line(str(err))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:  # Ctrl-C or SIGTERM: outputs are atomic and MLflow runs ended KILLED
        what = "terminated" if isinstance(err, Terminated) else "interrupted"
        print(f"error: {what} (every output is written whole or not at all; rerun to finish)", file=sys.stderr)
        return 143 if isinstance(err, Terminated) else 130
    except PermissionError as err:
        print(f"error: cannot write {err.filename}: permission denied", file=sys.stderr)
        return 2
    except OSError as err:
        if line := wrong_kind(err):
            print(line, file=sys.stderr)
            return 2
        if err.errno not in UNWRITABLE:  # anything else is a bug: keep its traceback
            raise
        print(f"error: cannot write {err.filename}: {os.strerror(err.errno).lower()}", file=sys.stderr)
        return 2
    return 0


def stage_names(root: Path) -> list[str]:
    """Every stage of ``<root>/dvc.yaml`` in file order, ``matrix``/``foreach`` entries expanded from the values
    in ``params.yaml`` and named as DVC names them (``data@scale``)."""
    spec = yaml.safe_load(check_kind(root / "dvc.yaml").read_text())
    params = yaml.safe_load(check_kind(root / "params.yaml").read_text())
    names = []
    for name, stage in spec["stages"].items():
        source = stage.get("foreach", next(iter(stage.get("matrix", {}).values()), None))
        if source is None:
            names.append(name)
            continue
        if isinstance(source, str):  # "${tasks.names}": a params list, or a mapping's keys
            source = functools.reduce(_child, source.strip("${} ").split("."), params)
        names += [f"{name}@{value}" for value in source]
    return names


def announce_stage() -> None:
    """Under ``dvc repro`` (DVC sets DVC_STAGE and DVC_ROOT): one line saying which stage of how many this is,
    so a long repro's console shows where it stands. A progress line never fails a stage."""
    name, root = os.environ.get("DVC_STAGE"), os.environ.get("DVC_ROOT")
    if not name or not root:
        return
    try:
        names = stage_names(Path(root))
    except (OSError, KeyError, TypeError, AttributeError, yaml.YAMLError, StageError):  # load_params says it
        names = []
    where = f"stage {names.index(name) + 1} of {len(names)} (dvc.yaml order)" if name in names else "stage"
    print(f"[{datetime.now():%H:%M:%S}] {where}: {name}", flush=True)


def one_line(message: str) -> str:
    """A message that embeds a library's multi-line error (tarfile lists every method it tried) as one line."""
    return "; ".join(part.strip() for part in message.splitlines() if part.strip())


def training_parser(doc: str | None, students: bool = True) -> argparse.ArgumentParser:
    """The parser of a training stage: the folders it reads and writes (values from dvc.yaml); ``students``: it
    trains DeiT students, so it reads the teacher stage's output (every training stage but ``teacher``)."""
    p = argparse.ArgumentParser(description=doc)
    if students:
        p.add_argument("--teachers", type=Path, required=True, help="data/teachers: the teacher stage's output")
    p.add_argument("--data", type=Path, required=True, help="data/tasks (one folder per task)")
    p.add_argument("--slices", type=Path, required=True, help="data/slices (one folder per task)")
    p.add_argument("--out", type=Path, required=True, help="results: one folder per arch, then per run")
    p.add_argument("--ckpt", type=Path, required=True, help="checkpoints (persisted, for resume)")
    return p


def run_folders(args: argparse.Namespace):
    """The :class:`pipeline.grid.Folders` of a training stage's parsed arguments."""
    return Folders(args.data, args.slices, args.out, args.ckpt, getattr(args, "teachers", None))


# What a training worker imports before its first run (pipeline.executor.worker_pool).
WORKER_IMPORTS = ("torch", "lightning", "timm", "pipeline.experiment", "pipeline.learner", "pipeline.models")


# What a multi-node launcher (torchrun, SLURM, an MPI runner) sets: Lightning's cluster environments read them.
LAUNCHERS = ("MASTER_ADDR", "WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def check_launch(rt) -> None:
    """``num_nodes > 1`` without a launcher would wait for peer nodes that never come (a silent hang)."""
    if rt.num_nodes > 1 and not any(os.environ.get(k) for k in LAUNCHERS):
        raise ConfigError(f"train.runtime.num_nodes: {rt.num_nodes} nodes need a multi-node launcher "
                          f"(torchrun or SLURM set one of {', '.join(LAUNCHERS)}); none is set here, so the "
                          "run would wait for peers forever. Use 1, or spread runs over machines with "
                          "train.runtime.scheduler")


def check_writable(folder: Path) -> None:
    """A scratch folder made and removed in ``folder`` (an output), or in its nearest existing parent: a read-only
    or full file system, or no permission, raises the OSError (naming ``folder``) that :func:`stage_main` prints
    as one line, before any run trains rather than when its first result is written. Nothing is left behind."""
    where = next(p for p in (folder, *folder.parents) if p.exists())
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".writable-", dir=where))
    except OSError as err:
        raise OSError(err.errno, err.strerror, str(folder)) from None


_cpu_reported = 0.0  # this process's CPU seconds already printed by run_training


def run_training(stage: str, specs: list, params: Params, args: argparse.Namespace,
                 keep: tuple[Path, ...] = (), name: str | None = None) -> list[dict]:
    """Run ``specs`` as the runs of ``stage`` in one worker pool (finished ones are kept, interrupted ones resume),
    then drop the outputs of runs no longer configured (``keep``: other run folders of the stage, e.g. an
    earlier round's); ``name``: the parent MLflow run's, default ``stage`` (the runs of tasks at another zoom go
    under a second one, named with their canvas). Returns every run's metrics.

    The workers start first and import the training stack while this process imports its own, checks the
    inputs and opens the stage's parent MLflow run (each run's own opens when its worker starts it,
    :class:`pipeline.live_runs.LiveRuns`); Lightning is imported only where a run fits (a worker, or this process
    without workers)."""
    rt = params.train.runtime
    check_launch(rt)
    for folder in (args.out, args.ckpt):  # a file there, or no write access, would fail after the runs trained
        check_kind(folder, folder=True, error=StageError)
        check_writable(folder)
    results = []
    if specs:  # nothing configured: no worker, no MLflow run, none of the training stack's seconds of imports
        with worker_pool(rt.workers if len(specs) > 1 else 1, rt.scheduler, WORKER_IMPORTS) as pool:
            from pipeline.experiment import execute  # after the pool started: the workers import meanwhile

            # a zoomed task's runs build and read its canvas (Params.for_task): one parent MLflow run per zoom
            zooms: dict[int, list] = {}
            for spec in specs:
                zooms.setdefault(getattr(params.tasks, spec.key.task).zoom, []).append(spec)
            for k, group in sorted(zooms.items()):  # the study's own canvas first, under the stage's name
                at = params.for_task(group[0].key.task)
                results += execute(group, at, stage, args.ckpt, pool,
                                   name if k == min(zooms) else f"{name or stage} at {at.geometry.image_size} px")
    prune(args.out, [*keep, *(s.out_dir for s in specs)])  # after success: a failed stage changes nothing
    for folder in (args.out, args.ckpt):  # the DVC output, and the checkpoints' folder, even with no run configured
        folder.mkdir(parents=True, exist_ok=True)
    # what this process took from the cores the workers train on (bench.repro_breakdown reads this line)
    # (since the previous call: a stage that trains in rounds prints one line per round, and they add up)
    global _cpu_reported
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    used, _cpu_reported = cpu.ru_utime + cpu.ru_stime - _cpu_reported, cpu.ru_utime + cpu.ru_stime
    print(f"{stage}: {len(specs)} runs; the stage process used {used:.1f} s of CPU "
          "(imports, input checks, writing outputs, MLflow)", flush=True)
    return results


def parse_stage(parser: argparse.ArgumentParser, argv: list[str] | None,
                names: dict[str, str] | None = None) -> tuple[argparse.Namespace, Params]:
    """Add ``--params`` to ``parser``, parse ``argv``, load and validate the params, and check that each CLI
    name the stage was called with exists in params.

    ``names`` maps an option's dest to the dotted params key whose entries it must name, e.g.
    ``{"task": "tasks.names"}`` or ``{"arch": "train.archs"}`` (a list or a mapping's keys). A name that is
    not there is the same one-line :class:`ConfigError` as a bad value in ``params.yaml``. A stage of one task
    (``--task`` checked against ``tasks.names``) gets that task's params (:meth:`Params.for_task`).
    """
    parser.add_argument("--params", default="params.yaml", help="params file (validated before any work)")
    args = parser.parse_args(argv)
    params = load_params(args.params)
    for dest, key in (names or {}).items():
        allowed = functools.reduce(_child, key.split("."), params)
        if getattr(args, dest) not in allowed:
            raise ConfigError(f"{args.params}: {key}: {getattr(args, dest)!r} is not one of {sorted(allowed)}")
    if (names or {}).get("task") == "tasks.names":  # a stage of one task reads that task's canvas (its zoom)
        params = params.for_task(args.task)
    return args, params


def _child(node, key: str):
    return node[key] if isinstance(node, dict) else getattr(node, key)
