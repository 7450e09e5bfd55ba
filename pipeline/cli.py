"""``bias``: the inner loop around the pipeline, in one console command (``[project.scripts]``).

- ``bias repro [DVC ARGS]``: ``dvc repro`` of this repository (what ``make repro`` runs).
- ``bias smoke [--keep DIR]``: the whole DAG on a tiny config (:data:`bench.tiny.SMOKE` over
  :data:`bench.tiny.TINY`) in a throwaway copy of the working tree, uncommitted edits included; about 90 s on
  two idle cores, a line per stage and per run as they go. It leaves this repository, its outputs and its
  MLflow store untouched and ends with the copy's ledger counts.
- ``bias run-one --arch vit --task alignment [--seed 0] [--steps N] [--lr X]``: one run of the main grid
  through the train stage's own code (:func:`pipeline.experiment.fit`), in this process, on the data the data
  and slice stages wrote (on a fresh clone it runs those stages first, and the teachers for a student: DVC
  outputs like any ``dvc repro``; ``--no-build`` refuses instead); it prints what the run measured and writes
  nothing else the pipeline reads (no MLflow run, no run folder). The cell's tuned learning rate is used when the
  tune stage has run.
- ``bias profile [NAME [DVC ARGS]]``: ``params.yaml`` with ``profiles/NAME.yaml`` laid over it, its whole study
  in ``.profiles/NAME/``, its report in ``reports/NAME/``; with no name, every profile and what it is.
- ``bias ui [--port 5000]``: the MLflow UI on this repository's store, after each experiment's link on its address.

Errors in the arguments or missing inputs are one line and exit 2, as in the stages.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import replace
from pathlib import Path

from bench import tiny
from pipeline import pair, profiles, tracking
from pipeline.config import load_params, parse_params
from pipeline.errors import ConfigError, StageError
from pipeline.grid import Folders, at_main_budget, train_specs
from pipeline.io import atomic_dir, read_json
from pipeline.repository import git_commit, git_init, repo_root
from pipeline.schemas import REPORT_SUMMARY
from pipeline.stages.common import wrong_kind
from pipeline.tracking import tracking_uri
from pipeline.tune import read_choice


def _bin(name: str) -> str:
    """A console script of this environment (dvc, mlflow), found beside the running interpreter."""
    return str(Path(sys.executable).parent / name)


def _env() -> dict[str, str]:
    """The stages call ``python`` from PATH: this environment's first."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def repro(args: argparse.Namespace) -> int:
    return subprocess.run([_bin("dvc"), "repro", *args.dvc_args], cwd=repo_root(), env=_env()).returncode


# One BLAS/OpenMP thread per stage process: the stages run one at a time, and on tiny matrices OpenBLAS's second
# thread mostly spins; when the two cores are busy it made the shortcut stage 4x slower (6 s -> 23-29 s wall,
# 3 -> 13-17 s CPU, measured). Torch's own threads are set by each stage. The smoke's numbers are not the study's.
SMOKE_ENV = {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
PROGRESS = re.compile(r"\] (stage \d+ of \d+) \(dvc\.yaml order\): (\S+)|\] (run \d+ of \d+ done: \S+)")


def smoke(args: argparse.Namespace) -> int:
    try:  # a folder that cannot be made (under /proc, a full or read-only TMPDIR) is the user's path, not a bug
        dest = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bias-smoke-"))
    except OSError as err:
        raise StageError(f"cannot make a temporary folder in {tempfile.gettempdir()} ({err.strerror or err}); "
                         "set TMPDIR to a folder with room, or use --keep DIR") from None
    if args.keep and dest.exists() and not dest.is_dir():
        raise StageError(f"--keep {dest}: a file, not a folder")
    if args.keep and dest.exists() and any(dest.iterdir()):
        raise StageError(f"--keep {dest}: not an empty folder (the smoke copy needs its own)")
    t0 = time.perf_counter()
    try:
        try:
            tiny.make_repo(dest, tiny.SMOKE)
        except OSError as err:
            raise StageError(f"{'--keep ' if args.keep else ''}{dest}: cannot copy the working tree there "
                             f"({err.strerror or err})") from None
        print(f"smoke: tiny copy of the working tree in {dest}; dvc repro ...", flush=True)
        code, tail = _stream_progress([_bin("dvc"), "repro"], dest, t0)
        if code:
            sys.stderr.write("".join(tail))
            print(f"smoke: dvc repro failed (exit {code}) in {dest}", file=sys.stderr)
            return code
        ledger = read_json(dest / "reports" / "summary.json", REPORT_SUMMARY)["ledger"]
        counts = ", ".join(f"{n} {verdict}" for verdict, n in ledger.items() if n)
        where = f"; report {dest / 'reports' / 'README.md'}" if args.keep else ""
        print(f"smoke: the whole DAG ran in {time.perf_counter() - t0:.0f} s; ledger rows: {counts}{where}",
              flush=True)
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(dest, ignore_errors=True)


def _stream_progress(cmd: list[str], cwd: Path, t0: float, timeout: float = 1800) -> tuple[int, deque]:
    """Run ``cmd`` in the tiny copy, printing one line per stage started and per run done (the stages' own
    progress lines, :mod:`pipeline.stages.common` and :mod:`pipeline.executor`) with the seconds since ``t0``;
    returns the exit code and the output's last lines (what a failure shows)."""
    tail: deque = deque(maxlen=80)
    proc = subprocess.Popen(cmd, cwd=cwd, env={**tiny.env(cwd), **SMOKE_ENV}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace")
    timer = threading.Timer(timeout, proc.kill)  # a hung stage ends the smoke rather than the terminal session
    timer.start()
    try:
        for line in proc.stdout:
            tail.append(line)
            if m := PROGRESS.search(line):
                said = f"{m[1]}: {m[2]}" if m[1] else f"  {m[3]}"
                print(f"smoke [{time.perf_counter() - t0:4.0f} s] {said}", flush=True)
        return proc.wait(), tail
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


PROFILES = ".profiles"  # gitignored: each profile's working copy, its data and DVC cache (reruns are incremental)


def profile(args: argparse.Namespace) -> int:
    """``profiles/<name>.yaml``'s whole study, composed beside the default rather than copied over it.

    The overlay is laid over ``params.yaml`` (:mod:`pipeline.profiles`) and validated; the working tree is then
    copied to ``.profiles/<name>/`` (outputs it already has stay, so a rerun is incremental) with the composed
    file as its ``params.yaml``; ``dvc repro`` runs there, logging to this repository's MLflow store (the
    profile's own experiments, by its ``tracking.experiment_prefix``) with this checkout's commit and the
    profile's name on every run; its ``reports/`` and ``dvc.lock`` then replace ``reports/<name>/``.
    ``params.yaml``, the default ``reports/`` and ``dvc.lock`` are never touched. Without a name: the profiles."""
    root = repo_root()
    have = profiles.names(root)
    if args.name is None:
        for name in have:
            print(f"{name:<14} {profiles.headline(profiles.overlay_path(root, name))}")
        return 0
    overlay = Path(os.path.relpath(profiles.overlay_path(root, args.name)))  # errors name it as the user would
    if args.name not in have:  # a name, not a path: "../params" is no profile
        raise ConfigError(f"{profiles.DIR}/{args.name}.yaml: no such profile (have: {', '.join(have)})")
    composed = profiles.compose(overlay)  # a bad profile is refused before anything is copied
    params = parse_params(composed, str(overlay))
    if params.tracking.experiment_prefix == load_params(root / "params.yaml").tracking.experiment_prefix:
        raise ConfigError(f"{overlay}: tracking.experiment_prefix "
                          f"{params.tracking.experiment_prefix!r} is the default's: give the profile its own, so "
                          f"its runs stay apart in the MLflow store")
    work = root / PROFILES / args.name
    for rel in tiny.source_files(root):
        if not rel.startswith("reports/"):  # outputs of the profile's own report stage
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / rel, work / rel)
    profiles.write(_anchor_archives(composed, params, root), work / "params.yaml", overlay)
    git_init(work)  # DVC wants a git repository; its history is not the source of record
    env = {**_env(), "MLFLOW_TRACKING_URI": tracking_uri(None, root),
           "BIAS_GIT_COMMIT": git_commit(), "BIAS_PROFILE": args.name}
    print(f"profile {args.name}: params.yaml + {overlay} in {work.relative_to(root)}; "
          f"dvc repro ...", flush=True)
    t0 = time.perf_counter()
    code = subprocess.run([_bin("dvc"), "repro", *args.dvc_args], cwd=work, env=env).returncode
    if code:
        print(f"profile {args.name}: dvc repro failed (exit {code}); reports/{args.name}/ left as it was",
              file=sys.stderr)
        return code
    with atomic_dir(root / "reports" / args.name) as tmp:
        shutil.copytree(work / "reports", tmp, dirs_exist_ok=True)
        shutil.copy2(work / "dvc.lock", tmp / "dvc.lock")
    print(f"profile {args.name}: done in {(time.perf_counter() - t0) / 60:.1f} min; report "
          f"reports/{args.name}/README.md", flush=True)
    return 0


def _anchor_archives(raw: dict, params, root: Path) -> dict:
    """The profile's copy reads CIFAR-10 where this checkout does: relative ``tasks.natural.path`` candidates are
    relative to the repository root, which for the copy is ``.profiles/<name>``."""
    natural = {**raw["tasks"]["natural"], "path": [p if Path(p).is_absolute() else str(root / p)
                                                   for p in params.tasks.natural.path]}
    return {**raw, "tasks": {**raw["tasks"], "natural": natural}}


def run_spec(params, arch: str, task: str, seed: int, out: Path, lrs: dict):
    """The main-grid run of (arch, task, seed), its outputs moved under ``out``; refuses what the grid lacks."""
    root = Path("data")
    specs = [s for s in train_specs(params, Folders(root / "tasks", root / "slices", out / "runs", out / "ckpt",
                                                    root / "teachers"), lrs)
             if (s.key.arch, s.key.task) == (arch, task) and at_main_budget(s, params)]
    if not specs:
        cells = sorted({(s.key.arch, s.key.task) for s in train_specs(params, Folders(*[root] * 5))})
        raise ConfigError(f"--arch {arch} --task {task}: not a cell of the main grid (train.archs, "
                          f"distill.students); cells: {', '.join(f'{a}/{t}' for a, t in cells)}")
    by_seed = {s.key.seed: s for s in specs}
    if seed not in by_seed:
        raise ConfigError(f"--seed {seed}: not in train.seeds {sorted(by_seed)}")
    return by_seed[seed]


def build(targets: list[str], who: str, missing: Path) -> None:
    """Run the DVC stages a command reads (a task's data and slices: seconds; the teachers: minutes), with their
    own output; a one-line error naming what was missing if DVC fails."""
    print(f"{who}: building what it reads first: dvc repro {' '.join(targets)}", flush=True)
    done = subprocess.run([_bin("dvc"), "repro", *targets], env=_env())
    if done.returncode:
        raise StageError(f"{missing}: missing, and dvc repro {' '.join(targets)} failed (exit {done.returncode}; "
                         "its output is above)")


def run_one(args: argparse.Namespace) -> int:
    from pipeline.experiment import Job, fit
    params = load_params(args.params)
    choice = Path("data/tune/choice.json")
    lrs = read_choice(choice, params) if choice.exists() else {}
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="bias-run-one-"))
    try:
        spec = run_spec(params, args.arch, args.task, args.seed, out, lrs)
        # the DVC targets that write what the cell reads: seconds, not the whole study's repro
        needs = [(spec.data_dir, f"slice@{args.task}"), (spec.slices_dir, f"slice@{args.task}")]
        needs += [(spec.teacher_dir, "teacher")] if spec.teacher_dir else []
        if missing := [(need, target) for need, target in needs if not need.exists()]:
            targets = list(dict.fromkeys(target for _, target in missing))
            if args.no_build:
                raise StageError(f"{missing[0][0]}: missing; run `dvc repro {' '.join(targets)}` first (the stages "
                                 "this cell reads, not the whole study)")
            build(targets, "run-one", missing[0][0])
        if args.steps:
            spec = replace(spec, key=replace(spec.key, steps=args.steps))
        if args.lr:
            spec = replace(spec, lr=args.lr)
        source = ("--lr" if args.lr else f"tuned, {choice}" if spec.lr else
                  "train.recipe.lr: no tune choice yet (dvc repro tune)" if not choice.exists() else "train.recipe.lr")
        warmup = params.train.recipe.warmup_steps
        if spec.key.steps <= warmup:
            print(f"warning: {spec.key.steps} steps <= train.recipe.warmup_steps {warmup}: the run ends inside the "
                  "warm-up, before its learning rate peaks (expect chance)", file=sys.stderr, flush=True)
        print(f"run-one: {spec.name} at lr {spec.lr or params.train.recipe.lr:g} ({source}), cap {spec.key.steps} "
              "steps", flush=True)
        t0 = time.perf_counter()
        result = fit(Job(spec, params.for_task(args.task), "run-one", None))
        slices = result["evaluation"]["slices"]
        line = {"run": spec.name, "steps_done": result["steps_done"], "stop_reason": result["stop_reason"],
                "criterion_step": result["criterion_step"], "val_acc": result["val_acc"],
                **{k: v["acc"] for k, v in slices.items() if k in ("test", "slice/id", "slice/ood")},
                "wall_s": round(time.perf_counter() - t0, 1)}
        print(json.dumps(line), flush=True)
        if args.out:
            (out / "summary.json").write_text(json.dumps({**line, "curve": result["curve"]}, indent=1) + "\n")
        return 0
    finally:
        if not args.out:
            shutil.rmtree(out, ignore_errors=True)


def pair_cmd(args: argparse.Namespace) -> int:
    return pair.run(args.row, args.seeds, load_params(args.params))


def ui(args: argparse.Namespace) -> int:
    """The MLflow UI, after the link to each experiment's runs table on the address it serves."""
    path = repo_root() / "mlflow.db"
    store, base = f"sqlite:///{path}", f"http://127.0.0.1:{args.port}"
    print(f"MLflow UI at {base} ({path})", flush=True)
    if path.is_file():
        for name, link in tracking.experiment_links(store, base):
            print(f"  {name}: {link}", flush=True)
    return subprocess.run([_bin("mlflow"), "ui", "--host", "127.0.0.1", "--port", str(args.port),
                           "--backend-store-uri", store]).returncode


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bias", description="The inner loop around the pipeline (pipeline/cli.py).")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("repro", help="dvc repro of this repository (extra arguments pass to dvc)")
    r.add_argument("dvc_args", nargs=argparse.REMAINDER)
    r.set_defaults(fn=repro)
    s = sub.add_parser("smoke", help="the whole DAG on a tiny config in a throwaway copy (~90 s)")
    s.add_argument("--keep", help="an empty folder to keep the tiny copy in (default: a temporary one, removed)")
    s.set_defaults(fn=smoke)
    o = sub.add_parser("run-one", help="one main-grid run through the train stage's code, nothing recorded")
    o.add_argument("--arch", required=True)
    o.add_argument("--task", required=True)
    o.add_argument("--seed", type=int, default=0)
    o.add_argument("--steps", type=int, help="the cap (or fixed steps) instead of train.recipe.steps")
    o.add_argument("--lr", type=float, help="instead of the cell's tuned learning rate")
    o.add_argument("--params", default="params.yaml")
    o.add_argument("--out", help="keep the run's checkpoints and summary.json here (default: discarded)")
    o.add_argument("--no-build", action="store_true", help="refuse instead of running the DVC stages (data, "
                   "slices, teachers) the cell reads when they are missing")
    o.set_defaults(fn=run_one)
    d = sub.add_parser("pair", help="one paired ledger row's two arms for N seeds, nothing recorded: the paired "
                                     "difference per seed, its mean and interval, beside the committed ledger's")
    d.add_argument("row", help="a ledger row id (reports/tables/ledger.csv), e.g. alignment.resnet_vs_vit.alignment")
    d.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 of both arms (default 3)")
    d.add_argument("--params", default="params.yaml")
    d.set_defaults(fn=pair_cmd)
    f = sub.add_parser("profile", help="params.yaml + profiles/<name>.yaml's study in .profiles/<name>, its report "
                                       "in reports/<name>/ (params.yaml and the default reports/ untouched); "
                                       "no name: list the profiles")
    f.add_argument("name", nargs="?", help="quick, large, ...: the overlay profiles/<name>.yaml")
    f.add_argument("dvc_args", nargs=argparse.REMAINDER, help="passed to dvc repro")
    f.set_defaults(fn=profile)
    u = sub.add_parser("ui", help="the MLflow UI on this repository's store (localhost)")
    u.add_argument("--port", type=int, default=5000)
    u.set_defaults(fn=ui)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if getattr(args, "seeds", 1) < 1:
        print(f"error: --seeds {args.seeds}: must be at least 1", file=sys.stderr)
        return 2
    for name in ("steps", "lr"):
        value = getattr(args, name, None)
        if value is not None and not (math.isfinite(value) and value > 0):  # nan > 0 is False, but so is nan <= 0
            print(f"error: --{name.replace('_', '-')} {value}: must be a positive finite number", file=sys.stderr)
            return 2
    try:
        return args.fn(args)
    except (ConfigError, StageError, FloatingPointError) as err:  # FloatingPointError: a run diverged (named)
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        if line := wrong_kind(err):
            print(line, file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    raise SystemExit(main())
