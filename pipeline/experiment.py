"""Training runs as four named steps: ``prepare`` (stage process) -> ``fit`` -> ``evaluate`` (worker) -> ``record``.

* ``prepare``: a run's identity, skip it if finished, keep its checkpoint only if made by this identity. Its MLflow
  run is opened (or reopened) when its worker starts (:class:`pipeline.live_runs.LiveRuns`), so a run's duration
  is its own and not its wait in the pool.
* ``fit``: load the data, build the model, train with Lightning (resuming exactly from the last checkpoint).
* ``evaluate``: pure: logits in, accuracies out (:mod:`pipeline.evaluation`).
* ``record``: the stage process writes ``weights.pt``, ``predictions.npz`` and last ``metrics.json``, and logs
  params, per-step curves and final metrics to MLflow (:mod:`pipeline.tracking`).

Workers (:func:`pipeline.executor.map_runs`) compute and return; only the stage process writes and tracks. The
inputs are checked before (:mod:`pipeline.run_inputs`), stale run folders pruned after (:mod:`pipeline.pruning`).
"""

from __future__ import annotations

import hashlib
import json
import pickle
import resource
import shutil
import time
import zlib
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from pipeline import budget, tracking
from pipeline.config import Params
from pipeline.errors import StageError
from pipeline.evaluation import evaluate, evaluate_factors
from pipeline.executor import RunFailed, map_runs
from pipeline.families import STEP_COST
from pipeline.grid import RunSpec, training_views
from pipeline.io import exclusive, index_sha256, read_json, write_json, write_with
from pipeline.live_runs import LIVE, STARTED, LiveRuns, Opening
from pipeline.models import build_model
from pipeline.predict import predict, to_tensor
from pipeline.provenance import (
    PROVENANCE,
    WEIGHTS,
    code_sha256,
    data_provenance,
    load_teacher,
    params_sha256,
    read_teacher,
    run_archs,
    run_params,
    teacher_record,
)
from pipeline.pruning import remove_run_dir
from pipeline.run_inputs import check_inputs
from pipeline.schemas import CHECKPOINT_CONFIG, RUN_METRICS
from pipeline.split import load_split, read_factors, shaped_relabel, subset, training_indices, transfer_set
from pipeline.tasks import TASKS


@dataclass(frozen=True)
class Job:
    """What a worker receives (picklable): the run, the params, its identity and where to resume from."""

    spec: RunSpec
    params: Params
    identity: str
    resume_from: Path | None


def identity(spec: RunSpec, params: Params) -> str:
    """Identity of a run: what it trains, the params it reads, the data it reads, the code, its teacher's weights.

    The data is the slice manifest, which holds the hashes of the pool (images, labels, factors) and of every
    index array: regenerated data or new slices make every run new, though its key and params are the same.
    A checkpoint or finished result made under any other identity is never resumed or reused.
    """
    teacher = read_teacher(spec.teacher_dir, spec.key.task)[0]["checkpoint_sha256"] if spec.teacher_dir else None
    data = hashlib.sha256((spec.slices_dir / "manifest.json").read_bytes()).hexdigest()
    code = code_sha256(run_archs(params, spec))
    race = {"race": spec.race} if spec.race is not None else {}  # a trial stopped earlier is another run
    blob = json.dumps({"key": spec.key.__dict__, "kind": spec.kind, "model": spec.model, "teacher": teacher,
                       "data": data, "params": run_params(params, spec), "code": code, **race}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def finished(spec: RunSpec, ident: str) -> dict | None:
    """The metrics of an identical run that already finished (an interrupted stage skips it on rerun)."""
    path = spec.out_dir / "metrics.json"
    if not path.exists():
        return None
    try:
        metrics = read_json(path, RUN_METRICS)
    except StageError:  # not a finished run's record (cut short, or edited): the run trains again
        return None
    return metrics if metrics.get("identity") == ident and (spec.out_dir / WEIGHTS).exists() else None


def _readable(ckpt: Path) -> bool:
    """A checkpoint a kill did not cut short (loads with ``weights_only=True``; one torch refuses to unpickle is
    not resumed from either: it is replaced by a fresh start, never loaded with the protection off)."""
    import torch

    try:
        return "global_step" in torch.load(ckpt, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError):
        return False


def prepare_ckpt(ckpt_dir: Path, ident: str, uri: str) -> tuple[Path | None, str | None]:
    """Keep a checkpoint (and the MLflow run it belongs to) only if it was made under this identity.

    A run killed before its first checkpoint, or whose identity changed, is marked KILLED in MLflow
    instead of being left RUNNING forever. A ``config.json`` of the wrong shape (the folder is the stage's
    own scratch space) makes the checkpoint untrusted: it is discarded, with one line naming the field.
    """
    stamp = ckpt_dir / "config.json"
    if stamp.exists():
        try:
            saved = read_json(stamp, CHECKPOINT_CONFIG)
        except StageError as err:
            print(f"  warning: {err}; its checkpoint is discarded and the run starts over", flush=True)
            saved = {"identity": None, "mlflow_run_id": None}
        last = ckpt_dir / "last.ckpt"
        if saved["identity"] == ident and _readable(last):
            return last, saved["mlflow_run_id"]
        if saved["mlflow_run_id"]:
            tracking.end_stale_run(saved["mlflow_run_id"], uri)
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    return None, None


def run_tags(spec: RunSpec, ident: str, params: Params) -> dict[str, str]:
    k = spec.key
    tags = {"task": k.task, "arch": k.arch, "model": spec.model, "seed": k.seed, "data_seed": k.data_seed,
            "train_size": k.train_size, "steps": k.steps, "budget_mode": k.budget_mode, "identity": ident,
            "augment": ",".join(f"{x}={v}" for x, v in training_views(spec, params).items()) or "off",
            "params_sha256": params_sha256(run_params(params, spec)),
            "code_sha256": code_sha256(run_archs(params, spec)),
            **({"race": spec.race} if spec.race is not None else {})}
    if spec.teacher_dir is not None:
        record = read_teacher(spec.teacher_dir, k.task)[0]
        tags.update({f"teacher.{x}": record.get(x) for x in
                     ("arch", "mlflow_run_id", "artifact_uri", "checkpoint_sha256", "test_acc",
                      "student_train_disagreement", "transfer_acc", "transfer_disagreement") if x in record})
    return {key: str(v) for key, v in tags.items()}


# --------------------------------------------------------------------------- fit (worker)
def learning_rate(spec: RunSpec, params: Params) -> float:
    """The run's learning rate: its cell's tuned one (or a trial's own), else ``train.recipe.lr``."""
    return params.train.recipe.lr if spec.lr is None else spec.lr


def _diverged(err: FloatingPointError, spec: RunSpec, params: Params) -> FloatingPointError:
    r = params.train.recipe
    lr = f"train.recipe.lr={r.lr}" if spec.lr is None else f"lr={spec.lr} (tune.lrs)"
    return FloatingPointError(f"{err}: training diverged; likely causes {lr}, train.recipe.weight_decay="
                              f"{r.weight_decay}, warmup_steps={r.warmup_steps}, grad_clip={r.grad_clip}")


def _module(model, spec: RunSpec, params: Params, steps: int):
    """The LightningModule of one run: its model, the recipe (the cell's learning rate), a student's loss."""
    from pipeline.learner import Classifier

    r, d = params.train.recipe, params.distill
    views = training_views(spec, params)
    return Classifier(model, lr=learning_rate(spec, params), weight_decay=r.weight_decay,
                      warmup_steps=r.warmup_steps, total_steps=steps, min_lr_ratio=r.min_lr_ratio,
                      label_smoothing=r.label_smoothing,
                      soft_distillation=spec.teacher is not None and d.is_soft(spec.key.arch),
                      distillation_tau=d.tau, crop_pad=views.get("crop_pad", 0), flip=views.get("flip", False),
                      seed=spec.key.seed)


def distillation_targets(spec: RunSpec, split, params: Params, teacher, train_idx: np.ndarray) -> tuple:
    """A student's training rows, their labels, the distillation head's targets, and the transfer set's record.

    Rows: its own images (true label and the teacher's logits), then, with ``transfer: true``, the task's transfer
    set (label -1: never seen) with the teacher's logits, or one-hot targets: ``relabel`` the teacher's own
    predictions permuted within each (factor value, true class) cell (its confusion matrix per factor value, kept
    exactly; which image carries an error, random), ``truth`` the true labels. The teacher runs once, here."""
    entry, bs = params.distill.students[spec.key.arch], params.train.runtime.eval_batch_size
    rows, labels = train_idx, split.labels[train_idx]
    if entry.transfer:
        transfer = transfer_set(split.indices, spec.key.task, spec.slices_dir / "indices.npz")
        rows = np.concatenate([train_idx, transfer])
        labels = np.concatenate([labels, np.full(len(transfer), -1, dtype=np.int64)])
    logits = predict(teacher, split.images[rows], bs)
    if not entry.transfer:
        return rows, labels, logits, {}
    truth, said = split.labels[transfer], logits[len(train_idx):].argmax(-1)
    rate = float((said != truth).mean())
    record = {"transfer_sha256": index_sha256(transfer), "transfer_n": int(len(transfer)),
              "teacher_transfer_acc": 1.0 - rate, "teacher_transfer_disagreement": rate, "targets": entry.targets}
    if entry.targets != "teacher":
        factor = TASKS[spec.key.task].slice_factors[0]
        cells = read_factors(spec.data_dir, factor)[transfer]
        stream = (params.seed, zlib.crc32(f"relabel/{spec.key.task}".encode()),
                  params.distill.teacher_of(spec.key.seed))
        hard = truth if entry.targets == "truth" else shaped_relabel(said, truth, cells, stream)
        logits[len(train_idx):] = np.eye(split.num_classes, dtype=logits.dtype)[hard]
        record.update({"target_disagreement": float((hard != truth).mean()), "relabel_within": f"{factor} x class"})
    return rows, labels, logits, record


def _measured(job: Job, steps: int, wall: float, timer) -> dict:
    """What this process measured of the fit (a resumed run counts only its own steps)."""
    return {"wall_time_s": wall, "resumed": job.resume_from is not None, "steps_this_process": steps,
            "images_per_s": steps * job.params.train.recipe.batch_size / wall if wall > 0 else 0.0,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "phases_s": timer.seconds, "step_share": timer.step_share}


def fit(job: Job) -> dict:
    """Train (or resume) one run in this process and evaluate it; returns everything :func:`record` writes."""
    import lightning as L
    import torch

    from pipeline import learner

    learner.quiet_lightning()
    t_run = time.perf_counter()
    spec, params = job.spec, job.params
    write_json(spec.ckpt_dir / STARTED, {"started": time.time()})  # the stage process opens its MLflow run now
    recipe, rt = params.train.recipe, params.train.runtime
    split, manifest = load_split(spec)
    train_idx = training_indices(spec, split, params)
    split.indices["fit"] = train_idx
    L.seed_everything(spec.key.seed, workers=True, verbose=False)
    learner.training_threads(rt.threads)
    teacher, record, labels, targets, transfer = _student_rows(spec, split, params, train_idx)
    model = build_model(spec.model, params, split.num_classes)
    if hasattr(model, "set_distilled_training"):
        model.set_distilled_training(teacher is not None)
    steps = budget.optimizer_steps(model, params, split.num_classes, spec.key.budget_mode, spec.key.steps)
    module = _module(model, spec, params, steps)
    data = learner.ArrayData(split, "fit", recipe.batch_size, rt.eval_batch_size, spec.key.seed, total_steps=steps,
                     labels=labels, targets=targets)
    timer, stop, curves, callbacks = _callbacks(spec, params, steps, split.num_classes)
    trainer = learner.trainer(rt, recipe.grad_clip, steps, rt.val_every_steps, callbacks)
    start = int(torch.load(job.resume_from, weights_only=True)["global_step"]) if job.resume_from else 0
    t0 = time.perf_counter()
    try:
        trainer.fit(module, datamodule=data, ckpt_path=job.resume_from)
    except FloatingPointError as err:
        raise _diverged(err, spec, params) from None
    wall = time.perf_counter() - t0
    val = curves.rows[-1].get("val_acc") if curves.rows else None  # restored too where a resume validates no more
    done = trainer.global_step  # criterion runs may stop before `steps`, the cap
    measured = _measured(job, trainer.global_step - start, wall, timer)
    t_eval = time.perf_counter()
    evaluation = _evaluation(model, spec, split, params)
    # the run's whole time in the worker (data, model, fit, evaluation): what its steps are a share of
    measured.update(evaluate_s=time.perf_counter() - t_eval, run_s=time.perf_counter() - t_run)
    return {"evaluation": evaluation,
            "val_acc": val, "curve": curves.rows, "series": curves.series,
            "budget": budget.count_budget(spec.model, model, params, done, record), "measured": measured,
            "steps_done": done, "criterion_step": stop.reached_step if stop else None,
            "stop_reason": stop.stop_reason if stop else "cap",
            "provenance": {**data_provenance(manifest, train_idx), "teacher": record,
                           **({"transfer": transfer} if transfer else {})},
            "num_classes": split.num_classes, "state_dict": {k: v.detach().cpu().contiguous() for k, v in
                                                              model.state_dict().items()},
            # one test image as the network sees it: the MLflow model's input example
            "example": to_tensor(split.images[split.indices["test"][:1]]).numpy()}


def _student_rows(spec: RunSpec, split, params: Params, train_idx: np.ndarray) -> tuple:
    """``(teacher, its record, labels, targets, transfer record)`` of a distilled student (its training rows become
    ``split.indices["fit"]``); ``(None, None, None, None, {})`` for every other run."""
    if not spec.teacher_dir:
        return None, None, None, None, {}
    teacher, record = load_teacher(spec.teacher_dir, spec.key.task, params, split.num_classes)
    split.indices["fit"], labels, targets, transfer = distillation_targets(spec, split, params, teacher, train_idx)
    return teacher, record, labels, targets, transfer


def _evaluation(model, spec: RunSpec, split, params: Params) -> dict:
    """A trained run's evaluation: its slices (a teacher's also where students learn) and the factor evaluations."""
    extra = {}
    if spec.kind == "teacher":  # its labels where students learn: their own images and the transfer set
        extra["student_train"] = subset(split.indices, params.train.size, spec.slices_dir)
        extra.update({k: split.indices[k] for k in ("transfer",) if k in split.indices})
    return {**evaluate(model, split, params.train.runtime.eval_batch_size, extra),
            **evaluate_factors(model, spec, split, params)}


def _callbacks(spec: RunSpec, params: Params, steps: int, num_classes: int) -> tuple:
    """``(phase timer, stop rule or None, curves, every callback in order)`` of one run."""
    from pipeline.learner import Criterion, Curves, PhaseTimer, StepCheckpoint

    rt, c = params.train.runtime, params.train.criterion
    ckpt = StepCheckpoint(spec.ckpt_dir, rt.checkpoint_every_steps, min(rt.val_every_steps, steps))
    curves = Curves(spec.name, steps, rt.log_every_steps, rt.checkpoint_every_steps, spec.ckpt_dir / "last.ckpt",
                    live=spec.ckpt_dir / LIVE)
    timer = PhaseTimer()
    stop = (Criterion(c.accuracy, c.hold, c.patience, c.min_delta, c.min_steps, c.plateau_above,
                      chance=1 / num_classes, race=spec.race)
            if spec.key.budget_mode == "criterion" else None)
    # the stop rule before the curves: its state is in the checkpoint Curves saves after a validation
    return timer, stop, curves, [timer, *([stop] if stop else []), ckpt, curves]


# --------------------------------------------------------------------------- record (stage process)
def compose(job: Job, result: dict, run_id: str) -> dict:
    """``metrics.json``: what analysis reads (one flat record per run)."""
    spec, k, ev = job.spec, job.spec.key, result["evaluation"]
    metrics = {
        "task": k.task, "arch": k.arch, "model": spec.model, "teacher": spec.teacher, "seed": k.seed,
        "data_seed": k.data_seed, "train_size": k.train_size, "steps": k.steps, "budget_mode": k.budget_mode,
        "augment": k.augment, "views": training_views(spec, job.params), "lr": learning_rate(spec, job.params),
        "steps_done": result["steps_done"],
        "criterion_step": result["criterion_step"],
        "stop_reason": result["stop_reason"],
        **({"race": spec.race} if spec.race is not None else {}),  # a tune trial's step to beat
        "num_classes": result["num_classes"], "test_acc": ev["slices"]["test"]["acc"], "val_acc": result["val_acc"],
        "shift_consistency": ev["shift_consistency"], "slices": ev["slices"], "curve": result["curve"],
        "budget": result["budget"], "measured": result["measured"], "identity": job.identity,
        "mlflow_run_id": run_id,
        "provenance": {**result["provenance"], "code_sha256": code_sha256(run_archs(job.params, spec)),
                       "params_sha256": params_sha256(run_params(job.params, spec))},
        **ev["sets"],
        **{k: ev[k] for k in ("subgroups", "resolution") if k in ev},
    }
    if spec.kind == "teacher":
        p = job.params
        metrics["teacher_set"] = f"train_{p.distill.teacher_size} minus train_{p.train.size}" + (
            f", a draw of {p.distill.teacher_train} by its seed" if p.distill.teacher_train else "")
    return metrics


def _headline(metrics: dict) -> dict:
    """Final MLflow metrics: headline numbers unprefixed (shown first), detail grouped by prefix."""
    b = metrics["budget"]
    out = {"test_acc": metrics["test_acc"], "val_acc": metrics["val_acc"],
           "shift_consistency": metrics["shift_consistency"], "params": b["params"],
           "train_flops": b["train_flops"], "optimizer_steps": b["optimizer_steps"]}
    if metrics.get("criterion_step") is not None:  # steps to criterion: the learnability table's number
        out["criterion_step"] = metrics["criterion_step"]
    out.update({k: v["acc"] for k, v in metrics["slices"].items() if k != "test"})  # "slice/<factor>=<v>"
    # columns every run has: in distribution is slice/id where the task holds values out, else the whole test set
    out["acc/id"] = metrics["slices"].get("slice/id", metrics["slices"]["test"])["acc"]
    if "slice/ood" in metrics["slices"]:
        out["acc/ood"] = metrics["slices"]["slice/ood"]["acc"]
    out.update({f"budget/{k}": v for k, v in b.items() if isinstance(v, (int, float))})
    m = metrics["measured"]
    out.update({f"measured/{k}": float(v) for k, v in m.items() if isinstance(v, (int, float))})
    out.update({f"measured/phase_s/{k}": float(v) for k, v in m.get("phases_s", {}).items()})
    out.update({f"{name}/{k}": v for name in ("student_train", "transfer") if name in metrics
                for k, v in metrics[name].items() if v is not None})
    return out


def run_datasets(spec: RunSpec, metrics: dict) -> list[dict]:
    """The run's MLflow dataset inputs: its training subset (by the hash of its indices) drawn from the task's
    pool (by the hash of its images and labels); the test set is the slice stage's, one per pool."""
    prov, k = metrics["provenance"], spec.key
    pool = {"pool_sha256": prov["data_sha256"], "task": k.task}
    return [{"name": f"{k.task}/train_{k.train_size}" + (f"-d{k.data_seed}" if k.data_seed else ""),
             "context": "training", "digest": prov["train_slice_sha256"], "source": str(spec.slices_dir),
             "profile": {**pool, "train_slice_sha256": prov["train_slice_sha256"], "images": k.train_size}},
            {"name": f"{k.task}/pool", "context": "source", "digest": prov["data_sha256"],
             "source": str(spec.data_dir), "profile": pool}]


def trained_model(job: Job, result: dict):
    """The trained network, rebuilt from its weights in the stage process (strict: a mismatch is an error)."""
    model = build_model(job.spec.model, job.params, result["num_classes"])
    model.load_state_dict(result["state_dict"])
    return model.eval()


def record(job: Job, result: dict, tracker: tracking.StageRun, run_id: str,
           streamed: frozenset[tuple[int, str]] = frozenset()) -> dict:
    """Write the run's files (``metrics.json`` last: its presence marks the run finished) and log it.

    ``streamed``: the (step, metric) points :class:`LiveRuns` already logged while it trained."""
    import torch

    from pipeline.learner import val_point

    spec, ev = job.spec, result["evaluation"]
    metrics = compose(job, result, run_id)
    series = [{k: v for k, v in p.items() if k == "step" or (p["step"], k) not in streamed}
              for p in [*result["series"], *map(val_point, result["curve"])]]
    transfer = metrics["provenance"].get("transfer", {})  # a transfer student's set, its teacher's rate there
    tracker.log(run_id, metrics=_headline(metrics), series=series,
                tags={"data_sha256": metrics["provenance"]["data_sha256"],
                      "train_slice_sha256": metrics["provenance"]["train_slice_sha256"],
                      **{f"transfer.{k}": str(v) for k, v in transfer.items()}})
    tracker.datasets(run_id, run_datasets(spec, metrics))
    tracker.model(run_id, trained_model(job, result), example=result["example"])
    weights = write_with(spec.out_dir / WEIGHTS, lambda tmp: torch.save(result["state_dict"], tmp))
    write_with(spec.out_dir / "predictions.npz",
               lambda tmp: np.savez_compressed(tmp.open("wb"), index=ev["test_idx"], logits=ev["logits"]))
    if spec.kind == "teacher":
        uri = tracker.artifact(weights, run_id, "model")
        rec = teacher_record(metrics, weights, run_id, uri, metrics["teacher_set"])
        tracker.log(run_id, tags={f"teacher.{k}": v for k, v in rec.items()})
        write_json(spec.out_dir / PROVENANCE, rec)
    write_json(spec.out_dir / "metrics.json", metrics)
    tracker.artifact(spec.out_dir / "metrics.json", run_id)
    tracker.finish(run_id)
    for f in spec.ckpt_dir.iterdir():  # checkpoints only serve a resume; the result is complete
        f.unlink()
    return metrics


# --------------------------------------------------------------------------- orchestration
def _log_dir(ckpt_root: Path) -> Path:
    """Tracebacks of failed runs: ``.dvc/tmp/logs`` in a DVC repository, else beside the checkpoints."""
    dvc = tracking.repo_root(ckpt_root) / ".dvc"
    return dvc / "tmp" / "logs" if dvc.is_dir() else ckpt_root / "logs"


def _prepare(specs: list[RunSpec], params: Params) -> tuple[list[Job], list[Opening], list[dict]]:
    """prepare: skip finished runs; of every other one, what its MLflow run is opened with when its worker starts."""
    jobs, openings, done = [], [], []
    uri = tracking.tracking_uri(params)
    for spec in specs:
        ident = identity(spec, params)
        if (m := finished(spec, ident)) is not None:
            print(f"  {spec.name}: already finished with this configuration, kept", flush=True)
            spec.ckpt_dir.mkdir(parents=True, exist_ok=True)  # a declared DVC out: must exist
            done.append(m)
            continue
        resume_from, run_id = prepare_ckpt(spec.ckpt_dir, ident, uri)
        (spec.ckpt_dir / STARTED).unlink(missing_ok=True)  # an interrupted worker's: this one stamps its own
        read = run_params(params, spec)
        params_log = {**read, "run": {**spec.key.__dict__, "model": spec.model, "teacher": spec.teacher,
                                      **({"race": spec.race} if spec.race is not None else {})}}
        # the MLflow run a resumable checkpoint belongs to stays named here until the run reopens it
        write_json(spec.ckpt_dir / "config.json", {"identity": ident, "mlflow_run_id": run_id})
        openings.append(Opening(spec.name, spec.ckpt_dir, ident, run_tags(spec, ident, params), params_log, run_id))
        jobs.append(Job(spec, params, ident, resume_from))
    return jobs, openings, done


def run_cost(job: Job) -> float:
    steps = min(job.spec.key.steps, job.spec.race or job.spec.key.steps)  # a trial stops at its race step at most
    return steps * STEP_COST[job.spec.model]  # the pool starts the longest runs first


def execute(specs: list[RunSpec], params: Params, stage: str, ckpt_root: Path, pool=None,
            name: str | None = None) -> list[dict]:
    """Run every spec (finished ones are kept) under one parent MLflow run named ``name`` (default ``stage``), in
    the stage's MLflow experiment; returns every run's metrics.

    ``pool``: a started :func:`pipeline.executor.worker_pool` (else the runtime params decide where runs go)."""
    print(f"[{datetime.now():%H:%M:%S}] == {stage}: {len(specs)} runs on {params.train.runtime.workers} worker(s)",
          flush=True)
    check_inputs(specs, params)
    with exclusive(ckpt_root, f"the {stage} stage"), tracking.stage_run(params, stage, name or stage) as tracker:
        jobs, openings, results = _prepare(specs, params)
        pending = {j.spec.name: j for j in jobs}
        live = LiveRuns(tracker)
        for opening in openings:
            live.watch(opening)
        try:
            rt = params.train.runtime
            with live:
                for job, result in map_runs(fit, jobs, workers=rt.workers, threads=rt.threads,
                                            scheduler=rt.scheduler, describe=lambda j: j.spec.name,
                                            log_dir=_log_dir(ckpt_root), cost=run_cost, pool=pool):
                    with live.lock:
                        results.append(m := record(job, result, tracker, *live.done(job.spec.name)))
                    pending.pop(job.spec.name)
                    print(f"  {job.spec.name}: test acc {m['test_acc']:.3f}", flush=True)
        except RunFailed as err:
            for run_name, job in pending.items():  # the failed run: FAILED; the started others can resume
                if run_name != err.name:
                    if (run_id := live.opened(run_name)) is not None:
                        tracker.kill(run_id)
                    continue
                tracker.fail(live.run_id(run_name))
                if err.summary.startswith("FloatingPointError"):  # a diverged run's checkpoints are worthless
                    remove_run_dir(job.spec.ckpt_dir, ckpt_root)
            raise
    return results


