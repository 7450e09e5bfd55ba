"""Where one run's wall time goes: ``python -m bench.overheads [--arch vit] [--steps 200] [--repeat 2]``.

One run built from the pipeline's own pieces (``pipeline.learner``'s DataModule, Classifier, Curves and
:class:`~pipeline.learner.PhaseTimer`; the Trainer of ``pipeline.learner.trainer``, which has no
logger; a throwaway sqlite MLflow store written before and after the fit, as the stage process writes it) on
random 16-px data of the task's shape, timed by phase:
imports (a fresh interpreter), data loading (``np.load`` + tensor conversion), model build, the fit split by
:class:`PhaseTimer` (training steps, validation, checkpoints, loop/logging, setup), evaluation (test predictions
and the one-pixel-shift predictions), MLflow (logger, hyperparams, final metrics, artifact).
``--repeat 2`` also checks the final weights are bit-identical between two runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# the package first, as in a stage or worker process: its start-up GC thresholds (pipeline/__init__.py) apply
IMPORTS = ("import pipeline; import lightning, timm, torch, mlflow; import pipeline.experiment, pipeline.learner, "
           "pipeline.models; from lightning.pytorch.loggers import MLFlowLogger")


def import_seconds() -> float:
    """Seconds a fresh interpreter spends importing what a training process imports."""
    code = f"import time; t = time.perf_counter(); {IMPORTS}; print(time.perf_counter() - t)"
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def fake_task(folder: Path, params, n_train: int, n_val: int, n_test: int, classes: int = 4) -> None:
    """Random uint8 images and labels on disk, shaped like a task (the data stage's files)."""
    g = params.geometry
    n = n_train + n_val + n_test
    rng = np.random.default_rng(0)
    np.save(folder / "images.npy", rng.integers(0, 256, (n, g.image_size, g.image_size, g.channels), np.uint8))
    np.save(folder / "labels.npy", rng.integers(0, classes, n).astype(np.int64))


def one_run(params, arch: str, steps: int, folder: Path, n_train: int, n_val: int,
            fit_logger: bool = False) -> dict:
    """Phase seconds and final weights of one run (see the module docstring); MLflow only before and after the
    fit, as the pipeline does (workers return results, the stage process logs them); ``fit_logger=True`` also
    attaches the MLflow logger to the Trainer (a cost the pipeline's runs do not pay)."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import MLFlowLogger

    from pipeline import learner
    from pipeline.learner import ArrayData, Classifier, Curves, PhaseTimer
    from pipeline.models import build_model
    from pipeline.predict import predict
    from pipeline.split import Split

    r, rt = params.train.recipe, params.train.runtime
    phases = {}
    t = time.perf_counter()
    images, labels = np.load(folder / "images.npy"), np.load(folder / "labels.npy")
    idx = np.arange(len(labels))
    split = Split(images, labels, {f"train_{n_train}": idx[:n_train], "val": idx[n_train:n_train + n_val],
                                   "test": idx[n_train + n_val:]}, 4)
    data = ArrayData(split, f"train_{n_train}", r.batch_size, rt.eval_batch_size, 0, total_steps=steps)
    phases["data"] = time.perf_counter() - t

    t = time.perf_counter()
    L.seed_everything(0, workers=True, verbose=False)
    model = build_model(arch, params, 4)
    module = Classifier(model, lr=r.lr, weight_decay=r.weight_decay, warmup_steps=min(r.warmup_steps, steps - 1),
                        total_steps=steps, min_lr_ratio=r.min_lr_ratio, label_smoothing=r.label_smoothing)
    phases["model"] = time.perf_counter() - t

    t = time.perf_counter()
    # artifacts beside the store: with no location MLflow puts them in ./mlruns of the caller's working tree
    logger = MLFlowLogger(experiment_name="bench", tracking_uri=f"sqlite:///{folder / 'mlflow.db'}",
                          run_name=f"{arch}", log_model=False, artifact_location=(folder / "artifacts").as_uri())
    logger.log_hyperparams({"arch": arch, "steps": steps, **r.model_dump(mode="json")})
    phases["mlflow"] = time.perf_counter() - t

    timer = PhaseTimer()
    ckpt_dir = folder / f"ckpt_{time.monotonic_ns()}"
    ckpt = ModelCheckpoint(dirpath=ckpt_dir, filename="last", save_top_k=1,
                           every_n_train_steps=rt.checkpoint_every_steps, enable_version_counter=False)
    trainer = learner.trainer(rt, r.grad_clip, steps, rt.val_every_steps, accelerator="cpu", devices=1,
                              logger=logger if fit_logger else False,
                              callbacks=[timer, ckpt, Curves(arch, steps, rt.log_every_steps, rt.checkpoint_every_steps,
                                                             ckpt_dir / "last.ckpt")])
    trainer.fit(module, datamodule=data)
    phases.update({f"fit/{k}": v for k, v in timer.seconds.items()})

    t = time.perf_counter()
    test = split.images[split.indices["test"]]
    predict(model, test, rt.eval_batch_size)
    predict(model, np.roll(test, 1, axis=2), rt.eval_batch_size)
    phases["evaluation"] = time.perf_counter() - t

    t = time.perf_counter()
    client = logger.experiment
    for k in range(20):  # about as many final metrics as a run logs
        client.log_metric(logger.run_id, f"test/m{k}", float(k))
    (folder / "metrics.json").write_text(json.dumps(phases))
    client.log_artifact(logger.run_id, str(folder / "metrics.json"))
    client.set_terminated(logger.run_id)
    phases["mlflow"] += time.perf_counter() - t
    return {"phases": phases, "steps": timer.steps, "state": {k: v.clone() for k, v in model.state_dict().items()}}


def breakdown(arch: str, steps: int, repeat: int, n_train: int = 4000, n_val: int = 1000,
              n_test: int = 2000, fit_logger: bool = False, time_imports: bool = True) -> dict:
    """Per-phase seconds of the last of ``repeat`` runs, the step share, and bit-identity across the runs.
    ``time_imports=False`` leaves out the imports phase (a fresh interpreter, ~5 s) where only steps are wanted."""
    import torch
    import yaml

    from bench.tiny import ROOT
    from pipeline.config import Params
    from pipeline.executor import cheap_cuda_check
    from pipeline.learner import quiet_lightning, training_threads
    from pipeline.mlflow_store import NOISY

    quiet_lightning()
    for name, level in NOISY.items():  # "Creating initial MLflow database tables..." and the like
        logging.getLogger(name).setLevel(level)
    cheap_cuda_check()  # as every run does (pipeline.executor._call)
    training_threads(1)
    params = Params.model_validate(yaml.safe_load((ROOT / "params.yaml").read_text()))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        fake_task(folder, params, n_train, n_val, n_test)
        # the first MLflow run in a fresh sqlite store creates its tables (~3 s, once per repository)
        t = time.perf_counter()
        import mlflow

        mlflow.MlflowClient(f"sqlite:///{folder / 'mlflow.db'}").search_experiments()
        store_s = time.perf_counter() - t
        runs = [one_run(params, arch, steps, folder, n_train, n_val, fit_logger) for _ in range(repeat)]
    states = [r["state"] for r in runs]
    identical = all(torch.equal(states[0][k], s[k]) for s in states[1:] for k in states[0])
    phases = ({"imports": import_seconds()} if time_imports else {}) | runs[-1]["phases"]
    total = sum(v for k, v in phases.items() if not k.startswith("fit/")) + phases["fit/fit"]
    return {"arch": arch, "steps": steps, "phases": phases, "mlflow_store_s": store_s, "total_s": total,
            "step_share": phases["fit/steps"] / total, "identical": identical if repeat > 1 else None,
            "steps_s": [r["phases"]["fit/steps"] for r in runs]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="vit")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--fit-logger", action="store_true",
                    help="also an MLflow logger inside the fit (the pipeline's runs have none)")
    args = ap.parse_args(argv)
    out = breakdown(args.arch, args.steps, args.repeat, fit_logger=args.fit_logger)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
