"""Training through Lightning on the tiny workspace: MLflow record, provenance, exact resume, distillation."""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import tiny_repo
import torch
import yaml
from conftest import mlflow_store
from test_mlflow_models import scalars
from torch.utils.data import DataLoader, TensorDataset

from pipeline import experiment, learner, pruning, split, tracking
from pipeline.config import load_params
from pipeline.errors import StageError
from pipeline.executor import RunFailed
from pipeline.grid import Folders, RunKey, at_main_budget, specs_for
from pipeline.io import sha256_file
from pipeline.learner import Classifier, distillation_loss
from pipeline.models import build_model
from pipeline.provenance import CODE, WEIGHTS, behaviour, load_teacher, row_behaviour

torch.set_num_threads(1)
KEY = RunKey("alignment", "vit", 0, 128, 20, "criterion")  # the main grid's budget mode


def train(ws: Path, out: Path, params, kind: str = "train", key: RunKey = KEY, **teacher) -> dict:
    """One run through the stage path (prepare -> fit -> evaluate -> record) with one in-process worker."""
    at = Folders(ws / "data/tasks", ws / "data/slices", out / "runs", out / "ckpt", ws / "data/teachers")
    if teacher:
        teacher["teacher_of"] = params.distill.teacher_of
    (m,) = experiment.execute(specs_for(kind, [key], at, **teacher), params, "train", out / "ckpt")
    return m


def folder(out: Path, key: RunKey = KEY) -> Path:
    return out / "runs" / key.arch / key.folder


def logits(out: Path) -> np.ndarray:
    with np.load(folder(out) / "predictions.npz") as z:
        return z["logits"]


class Interrupt(Exception):
    """Stands in for a crash in the middle of a run."""


def interrupting(at_step: int, before_validation: bool = False):
    """Curves that stop the run at ``at_step``: after its validation, or between the step and its validation."""
    class Interrupting(learner.Curves):
        def on_validation_start(self, trainer, pl_module):
            if before_validation and trainer.global_step >= at_step:
                raise Interrupt(f"stopped before the validation at step {trainer.global_step}")

        def on_validation_end(self, trainer, pl_module):
            super().on_validation_end(trainer, pl_module)
            if trainer.global_step >= at_step:
                raise Interrupt(f"stopped at step {trainer.global_step}")
    return Interrupting


@pytest.fixture(scope="module")
def runs(workspace, tmp_path_factory):
    """Runs of one key: a, b (same seed, fresh), c (interrupted at step 10, then rerun), gap (interrupted between
    step 10, a checkpoint step, and its validation, then rerun), last (interrupted after its last step's
    validation, then rerun) and a DeiT student."""
    params = load_params(workspace / "params.yaml")
    root = tmp_path_factory.mktemp("train_runs")
    out = {name: root / name for name in ("a", "b", "c", "gap", "last", "student", "draw")}
    with mlflow_store(root):
        metrics = {name: train(workspace, out[name], params) for name in "ab"}
        for name, step, before in (("c", 10, False), ("gap", 10, True), ("last", KEY.steps, False)):
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(learner, "Curves", interrupting(step, before))
                with pytest.raises(RunFailed, match="Interrupt"):
                    train(workspace, out[name], params)
        ckpt = out["c"] / "ckpt" / KEY.arch / KEY.folder
        stamp = json.loads((ckpt / "config.json").read_text())
        interrupted_files = sorted(p.name for p in ckpt.iterdir())
        metrics["c"] = train(workspace, out["c"], params)
        metrics["gap"] = train(workspace, out["gap"], params)
        metrics["last"] = train(workspace, out["last"], params)
        metrics["draw"] = train(workspace, out["draw"], params, key=RunKey("alignment", "vit", 0, 128, 20, "steps", 1))
        metrics["student"] = train(workspace, out["student"], params, "distill", RunKey(
            "alignment", "deit", 0, 128, 20, "steps"), model="deit", teacher="resnet")
    return {"params": params, "root": root, "out": out, "metrics": metrics, "stamp": stamp,
            "interrupted_files": interrupted_files, "uri": f"sqlite:///{root / 'mlflow.db'}"}


def client(runs):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=runs["uri"])


def test_run_is_tracked_with_budget_slices_and_curves(runs):
    m = runs["metrics"]["a"]
    assert {"params", "optimizer_steps", "images_seen", "tokens_seen", "train_flops"} <= set(m["budget"])
    assert m["budget"]["optimizer_steps"] == 20 and m["budget"]["images_seen"] == 20 * 16
    assert any(k.startswith("slice/") for k in m["slices"])
    assert (folder(runs["out"]["a"]) / WEIGHTS).exists() and m["num_classes"] == 2
    c = client(runs)
    rec = c.get_run(m["mlflow_run_id"])
    assert rec.info.status == "FINISHED" and rec.info.run_name == "train/vit/alignment/s0 n128-t20-d0-criterion"
    assert rec.data.metrics["train_flops"] == m["budget"]["train_flops"]  # once: the headline's, not budget/
    assert rec.data.metrics["test_acc"] == m["test_acc"]
    # the headline columns every run has (the MLflow view's): in and out of distribution
    assert rec.data.metrics["acc/id"] == m["slices"]["slice/id"]["acc"]
    assert rec.data.metrics["acc/ood"] == m["slices"]["slice/ood"]["acc"]
    assert rec.data.params["train.recipe.lr"] == str(runs["params"].train.recipe.lr)
    # every slice's accuracy is a row of the run's table, none a metric (a bar chart of one bar each)
    assert not [k for k in rec.data.metrics if k.startswith(tracking.TABLE_PREFIXES)]
    table = scalars(c, m["mlflow_run_id"])
    assert {f"slice/{n}": v for (s, n), v in table.items() if s == "slice"} == {
        k: v["acc"] for k, v in m["slices"].items() if k.startswith("slice/")}
    assert table[("budget", "images_seen")] == m["budget"]["images_seen"]
    assert rec.data.tags["identity"] == m["identity"]
    lr = c.get_metric_history(m["mlflow_run_id"], "lr")
    assert len(lr) >= 3 and len({p.step for p in lr}) == len(lr)  # a per-step curve, not one value
    parent = c.get_run(rec.data.tags["mlflow.parentRunId"])
    assert parent.info.run_name == "train" and parent.info.status == "FINISHED"
    for run in (rec, parent):  # what the numbers depend on besides code, params and data
        assert run.data.tags["env.torch"] == torch.__version__
        assert run.data.tags["env.cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    exp = c.get_experiment(rec.info.experiment_id)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"


def test_every_provenance_field_matches_the_files(runs, workspace):
    from pipeline.provenance import run_params
    from pipeline.split import load_split, training_indices

    m, student = runs["metrics"]["a"], runs["metrics"]["student"]
    data, slices = workspace / "data/tasks/alignment", workspace / "data/slices/alignment"
    params = load_params(workspace / "params.yaml")
    spec = specs_for("train", [KEY], Folders(data.parent, slices.parent, Path("o"), Path("c")))[0]
    train_idx = training_indices(spec, load_split(spec)[0], params)  # the seed's own draw (train.draw: per_seed)
    with np.load(slices / "indices.npz") as z:
        assert np.isin(train_idx, z["pool"]).all() and len(train_idx) == len(z["train_128"])
    expected = {
        "data_sha256": hashlib.sha256(np.load(data / "images.npy").tobytes()).hexdigest(),
        "train_slice_sha256": hashlib.sha256(train_idx.astype(np.int64).tobytes()).hexdigest(),
        # the behaviour of the shared modules, of the ViT family's module and of the vit row, read from disk here
        "code_sha256": hashlib.sha256(json.dumps({
            **{f"{n}.py": behaviour((Path(experiment.__file__).parent / f"{n}.py").read_text()) for n in CODE},
            "families/vit.py": behaviour((Path(experiment.__file__).parent / "families/vit.py").read_text()),
            "archs:vit": row_behaviour("vit")}, sort_keys=True).encode()).hexdigest(),
    }
    read = json.dumps(run_params(params, spec), sort_keys=True)
    expected["params_sha256"] = hashlib.sha256(read.encode()).hexdigest()
    for key, value in expected.items():
        assert m["provenance"][key] == value, key
    tags = client(runs).get_run(m["mlflow_run_id"]).data.tags
    assert tags["data_sha256"] == expected["data_sha256"] and tags["params_sha256"] == expected["params_sha256"]

    teacher = student["provenance"]["teacher"]
    weights = workspace / "data/teachers/resnet/s0/alignment" / WEIGHTS
    assert teacher["checkpoint_sha256"] == sha256_file(weights)
    assert teacher["data_sha256"] == expected["data_sha256"]
    assert all(v not in ("", None) for v in teacher.values())
    stags = client(runs).get_run(student["mlflow_run_id"]).data.tags
    assert stags["teacher.checkpoint_sha256"] == teacher["checkpoint_sha256"]
    assert stags["teacher.artifact_uri"] == teacher["artifact_uri"].replace("runs:/", "runs:/")


def test_teacher_trains_on_a_disjoint_teacher_set(runs, workspace):
    from mlflow.artifacts import download_artifacts

    folder_ = workspace / "data/teachers/resnet/s0/alignment"
    m = json.loads((folder_ / "metrics.json").read_text())
    with np.load(workspace / "data/slices/alignment/indices.npz") as z:
        transfer = np.setdiff1d(z["train_256"], z["train_128"])
    assert m["provenance"]["train_slice_sha256"] == hashlib.sha256(transfer.astype(np.int64).tobytes()).hexdigest()
    assert m["student_train"]["n"] == 128
    assert m["student_train"]["disagreement"] == pytest.approx(1 - m["student_train"]["acc"])
    record = json.loads((folder_ / "provenance.json").read_text())
    with mlflow_store(workspace):
        got = download_artifacts(record["artifact_uri"])
    assert sha256_file(got) == record["checkpoint_sha256"]
    assert runs["metrics"]["student"]["provenance"]["teacher"]["teacher_set"] == "train_256 minus train_128"


def test_same_seed_same_metrics(runs):
    a, b = runs["metrics"]["a"], runs["metrics"]["b"]
    assert a["slices"] == b["slices"] and a["val_acc"] == b["val_acc"]
    assert np.array_equal(logits(runs["out"]["a"]), logits(runs["out"]["b"]))


def test_resume_continues_from_checkpoint(runs):
    c = runs["metrics"]["c"]
    assert "last.ckpt" in runs["interrupted_files"]
    assert c["measured"]["resumed"] and 0 < c["measured"]["steps_this_process"] < 20
    assert c["mlflow_run_id"] == runs["stamp"]["mlflow_run_id"]  # the interrupted run continues
    assert client(runs).get_run(c["mlflow_run_id"]).info.status == "FINISHED"
    assert np.array_equal(logits(runs["out"]["a"]), logits(runs["out"]["c"]))
    assert c["slices"] == runs["metrics"]["a"]["slices"] and c["curve"] == runs["metrics"]["a"]["curve"]
    assert not any((runs["out"]["c"] / "ckpt" / KEY.arch / KEY.folder).iterdir())  # a finished run keeps no checkpoints


def test_a_run_cut_between_a_checkpoint_step_and_its_validation_resumes_to_the_same_record(runs):
    """Step 10 saves a checkpoint and validates; killed between the two, the run resumes from a checkpoint that
    holds no step without its validation (step 5's), so step 10's validation runs again: the same curve, stop rule
    and predictions as the uninterrupted run."""
    a, gap = runs["metrics"]["a"], runs["metrics"]["gap"]
    assert gap["measured"]["resumed"] and gap["measured"]["steps_this_process"] == KEY.steps - 5
    assert gap["curve"] == a["curve"] and any(row["step"] == 10 for row in gap["curve"])
    assert (gap["stop_reason"], gap["criterion_step"]) == (a["stop_reason"], a["criterion_step"])
    assert gap["slices"] == a["slices"] and np.array_equal(logits(runs["out"]["a"]), logits(runs["out"]["gap"]))


def test_a_run_cut_after_its_last_validation_resumes_to_the_same_record(runs):
    """Resumed from its last step's checkpoint, a run trains and validates nothing more: its final validation,
    curve and stop rule's verdict come back from the checkpoint, so its record equals the uninterrupted one's."""
    a, last = runs["metrics"]["a"], runs["metrics"]["last"]
    assert last["measured"]["resumed"] and last["measured"]["steps_this_process"] == 0
    assert last["val_acc"] == a["val_acc"] is not None
    assert last["curve"] == a["curve"] and last["curve"][-1]["step"] == KEY.steps
    assert (last["stop_reason"], last["criterion_step"]) == (a["stop_reason"], a["criterion_step"])
    assert last["slices"] == a["slices"] and np.array_equal(logits(runs["out"]["a"]), logits(runs["out"]["last"]))


def test_regenerated_data_is_a_new_run(copy_workspace, capsys):
    """A finished run is kept only for the data it was trained on: regenerate the task (other noise; the params
    the run reads are the same) and the run trains again instead of being kept."""
    from pipeline.stages import generate, slice

    ws, params = copy_workspace, load_params(copy_workspace / "params.yaml")
    with mlflow_store(ws):
        first = train(ws, ws / "out", params)
        assert train(ws, ws / "out", params)["identity"] == first["identity"]  # unchanged data: kept
        assert "already finished with this configuration, kept" in capsys.readouterr().out
        raw = yaml.safe_load((ws / "params.yaml").read_text())
        raw["tasks"]["alignment"]["noise"] += 8
        tiny_repo.write_params(ws / "params.yaml", raw)
        p, task = str(ws / "params.yaml"), ws / "data/tasks/alignment"
        assert generate.main(["--params", p, "--task", "alignment", "--out", str(task)]) == 0
        assert slice.main(["--params", p, "--task", "alignment", "--data", str(task),
                           "--out", str(ws / "data/slices/alignment")]) == 0
        again = train(ws, ws / "out", load_params(ws / "params.yaml"))
    assert "kept" not in capsys.readouterr().out
    assert again["identity"] != first["identity"]
    assert again["provenance"]["data_sha256"] != first["provenance"]["data_sha256"]


@pytest.mark.parametrize(("key", "value", "vit_changes"), [
    ("models.swin.mlp_ratio", 3.0, False),  # another architecture's section
    ("models.vit.depth", 3, True),  # its own
    ("train.runtime.workers", 4, False),  # where runs execute, not what they compute
    ("train.recipe.lr", 0.01, True),
    ("evaluation.resolution.sizes", [16], True),  # a main-grid run is evaluated with these
])
def test_identity_follows_what_a_run_reads(workspace, key, value, vit_changes):
    """The one training stage reruns on any train/models edit; a run retrains only when its identity changes."""
    from pipeline.config import Params

    at = Folders(workspace / "data/tasks", workspace / "data/slices", Path("o"), Path("c"))
    base = yaml.safe_load((workspace / "params.yaml").read_text())
    vit, off_grid = specs_for("train", [KEY, replace(KEY, train_size=64)], at)
    *path, last = key.split(".")
    raw = copy.deepcopy(base)
    functools.reduce(dict.__getitem__, path, raw)[last] = value
    before, after = Params.model_validate(base), Params.model_validate(raw)
    assert (experiment.identity(vit, before) != experiment.identity(vit, after)) == vit_changes
    if key.startswith("evaluation"):  # off the main grid: no factor evaluations, identity unchanged
        assert experiment.identity(off_grid, before) == experiment.identity(off_grid, after)


def test_another_data_seed_draws_another_balanced_subset():
    labels = np.repeat(np.arange(4), 50)
    pool = np.arange(200)
    official = np.concatenate([np.arange(c * 50, c * 50 + 10) for c in range(4)])
    a, b = (split.redraw(pool, official, labels, s) for s in (1, 2))
    assert not np.array_equal(a, b) and not np.array_equal(a, official)
    for draw in (a, b):
        assert np.array_equal(np.bincount(labels[draw]), np.bincount(labels[official]))
        assert len(np.unique(draw)) == len(official)
    assert np.array_equal(a, split.redraw(pool, official, labels, 1))


def test_a_data_seed_trains_on_another_draw(runs):
    a, draw = runs["metrics"]["a"], runs["metrics"]["draw"]
    assert draw["data_seed"] == 1 and draw["provenance"]["data_sha256"] == a["provenance"]["data_sha256"]
    assert draw["provenance"]["train_slice_sha256"] != a["provenance"]["train_slice_sha256"]
    assert draw["slices"]["test"]["n"] == a["slices"]["test"]["n"]  # the same test items


def test_prune_removes_stale_nested_runs(tmp_path):
    for rel in ("keep/x", "gone/a", "gone/a/b", "gone/c"):
        (tmp_path / rel).mkdir(parents=True, exist_ok=True)
        (tmp_path / rel / "metrics.json").write_text("{}")
    pruning.prune(tmp_path, [tmp_path / "keep/x"])
    assert (tmp_path / "keep/x/metrics.json").exists() and not (tmp_path / "gone").exists()


def test_distillation_loss_by_hand():
    cls = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 0.0]])
    dist = torch.tensor([[0.0, 1.0, 0.0], [1.0, -1.0, 2.0]])
    labels = torch.tensor([0, 1])
    teacher = torch.tensor([[0.1, 3.0, 0.2], [2.0, 1.0, 0.0]])  # argmax: 1, 0

    def log_softmax(row, t=1.0):
        z = [v / t for v in row]
        lse = math.log(sum(math.exp(v) for v in z))
        return [v - lse for v in z]

    def ce(rows, targets):
        return -sum(log_softmax(r)[t] for r, t in zip(rows, targets, strict=True)) / len(rows)

    c, d, t = cls.tolist(), dist.tolist(), teacher.tolist()
    hard = 0.5 * ce(c, [0, 1]) + 0.5 * ce(d, [1, 0])
    assert distillation_loss(cls, dist, labels, teacher).item() == pytest.approx(hard, rel=1e-6)

    tau = 2.0
    kl = sum(math.exp(lt) * (lt - ls) for tr, sr in zip(t, d, strict=True)
             for lt, ls in zip(log_softmax(tr, tau), log_softmax(sr, tau), strict=True)) / len(t)
    soft = 0.5 * ce(c, [0, 1]) + 0.5 * tau * tau * kl
    got = distillation_loss(cls, dist, labels, teacher, soft=True, tau=tau).item()
    assert got == pytest.approx(soft, rel=1e-6)

    # a transfer image (label -1) trains the distillation head only; a batch of them, only that head at all
    unlabelled = torch.tensor([0, -1])
    mixed = 0.5 * ce(c[:1], [0]) + 0.5 * ce(d, [1, 0])
    assert distillation_loss(cls, dist, unlabelled, teacher).item() == pytest.approx(mixed, rel=1e-6)
    none = torch.tensor([-1, -1])
    cls_grad = cls.clone().requires_grad_(True)
    loss = distillation_loss(cls_grad, dist, none, teacher)
    assert loss.item() == pytest.approx(0.5 * ce(d, [1, 0]), rel=1e-6)
    loss.backward()
    assert torch.count_nonzero(cls_grad.grad) == 0


def test_students_train_on_targets_computed_once(workspace):
    """A student's batches carry the teacher's logits (computed before training): the module holds no teacher,
    the student's distillation head learns from the targets, and a row labelled -1 is never scored."""
    params = load_params(workspace / "params.yaml")
    student = build_model("deit", params, 4)
    student.set_distilled_training(True)
    module = Classifier(student, lr=1e-3, weight_decay=0.0, warmup_steps=0, total_steps=2)
    x, y = torch.randn(8, 3, 16, 16), torch.tensor([0, 1, 2, 3, -1, -1, -1, -1])
    targets = torch.nn.functional.one_hot(torch.arange(8) % 4, 4).float()
    data = DataLoader(TensorDataset(x, y, targets), batch_size=8)
    L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
              enable_model_summary=False, accelerator="cpu").fit(module, data)
    assert not [n for n, _ in module.named_children() if n != "model"]
    assert any(p.grad is not None for p in student.parameters())  # the step did backpropagate
    with pytest.raises(RuntimeError, match="targets"):
        module.training_step((x, y.clamp(min=0)), 0)


def test_transfer_students_see_the_transfer_set_only_through_their_targets(workspace, tmp_path):
    """A transfer student trains on its own images plus the transfer set (unseen offsets, labels withheld); the
    noise control's targets there disagree with the truth exactly as often as the teacher does (its predictions
    permuted within factor x class cells), the oracle's never; all record the set's hash and the teacher's rate,
    in metrics.json and in MLflow."""
    from pipeline.config import parse_params

    raw = tiny_repo.params_with({"tasks": {"names": ["alignment"]}, "distill": {"students": {
        "deit_t": {"teacher": "resnet", "tasks": ["alignment"], "transfer": True},
        "deit_r": {"teacher": "resnet", "tasks": ["alignment"], "transfer": True, "targets": "relabel"},
        "deit_o": {"teacher": "resnet", "tasks": ["alignment"], "transfer": True, "targets": "truth"}}},
        "train": {"archs": {"vit": {"models": "vit", "tasks": ["alignment"]}}, "grids": {}}})
    params = parse_params(raw)
    with np.load(workspace / "data/slices/alignment/indices.npz") as z:
        transfer, seen = z["transfer"], np.concatenate([z["train_256"], z["val"], z["test"]])
    assert len(transfer) == 48 and not np.intersect1d(transfer, seen).size  # no training, val or test image
    with mlflow_store(tmp_path):
        m = {name: train(workspace, tmp_path / name, params, "distill", RunKey("alignment", name, 0, 128, 20, "steps"),
                         model="deit", teacher="resnet") for name in ("deit_t", "deit_r", "deit_o")}
        from mlflow.tracking import MlflowClient

        tags = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(
            m["deit_r"]["mlflow_run_id"]).data.tags
    rec_t, rec_r, rec_o = (m[n]["provenance"]["transfer"] for n in ("deit_t", "deit_r", "deit_o"))
    teacher = json.loads((workspace / "data/teachers/resnet/s0/alignment/provenance.json").read_text())
    assert rec_t["transfer_n"] == 48 and rec_t["transfer_sha256"] == rec_r["transfer_sha256"]
    assert rec_t["teacher_transfer_disagreement"] == pytest.approx(teacher["transfer_disagreement"], abs=1e-6)
    assert rec_r["target_disagreement"] == pytest.approx(rec_t["teacher_transfer_disagreement"], abs=1e-9)
    assert rec_o["target_disagreement"] == 0.0 and rec_r["relabel_within"] == "offset x class"
    assert tags["transfer.transfer_sha256"] == rec_r["transfer_sha256"] and tags["transfer.targets"] == "relabel"
    assert m["deit_t"]["provenance"]["train_slice_sha256"] == m["deit_r"]["provenance"]["train_slice_sha256"]


def test_the_noise_control_keeps_each_cells_confusion_and_moves_the_errors():
    """Within each (factor value, true class) cell the permuted predictions have the teacher's counts exactly, the
    draw is the same for the same stream, and the errors land on other images than the teacher's."""
    from pipeline.split import shaped_relabel

    rng = np.random.default_rng(0)
    truth, cells = rng.integers(0, 4, 2000), rng.integers(0, 5, 2000)
    said = np.where(rng.random(2000) < 0.3 + 0.1 * cells, (truth + 1 + cells % 3) % 4, truth)  # errors by cell
    a, b = shaped_relabel(said, truth, cells, (0, 1)), shaped_relabel(said, truth, cells, (0, 1))
    assert (a == b).all() and not (a == shaped_relabel(said, truth, cells, (0, 2))).all()
    for v in range(5):
        for c in range(4):
            cell = (cells == v) & (truth == c)
            assert np.array_equal(np.bincount(a[cell], minlength=4), np.bincount(said[cell], minlength=4))
    wrong_t, wrong_a = said != truth, a != truth
    assert wrong_a.sum() == wrong_t.sum() and (wrong_a & wrong_t).sum() < 0.7 * wrong_t.sum()


def test_tampered_teacher_is_refused(workspace, tmp_path):
    params = load_params(workspace / "params.yaml")
    teachers = tmp_path / "teachers"
    shutil.copytree(workspace / "data/teachers/resnet", teachers)
    weights = teachers / "s0" / "alignment" / WEIGHTS
    state = torch.load(weights, weights_only=True)
    key = next(iter(state))
    state[key] = state[key] + 1e-3  # a loadable checkpoint, different weights
    torch.save(state, weights)
    with pytest.raises(StageError, match="sha256"):
        load_teacher(teachers / "s0", "alignment", params, 4)



def test_grids_extend_the_main_grid_once(workspace):
    from pipeline.config import parse_params
    from pipeline.grid import train_keys

    raw = yaml.safe_load((workspace / "params.yaml").read_text())
    raw["train"]["seeds"] = [0, 1]
    raw["train"]["recipe"]["budget_mode"] = "steps"  # a budget grid's steps 20 is then the main run itself
    raw["train"]["grids"] = {
        "again": {"archs": ["vit"]},  # the main grid itself: nothing new
        "budget": {"archs": ["vit"], "steps": [20, 40], "seeds": [0]},  # steps 20 at seed 0 is a main run
        "draws": {"data_seeds": [1]},  # every arch, its own tasks
        "flops": {"archs": ["resnet"], "budget_mode": "flops"},
    }
    params = parse_params(raw)
    vit = train_keys(params, "vit")
    assert vit == [RunKey("alignment", "vit", s, 128, 20, "steps") for s in (0, 1)] + [
        RunKey("alignment", "vit", 0, 128, 40, "steps"),
        *(RunKey("alignment", "vit", s, 128, 20, "steps", 1) for s in (0, 1))]
    resnet = train_keys(params, "resnet")
    assert {k.budget_mode for k in resnet} == {"steps", "flops"} and len(resnet) == 2 + 2 + 2
    assert len({k.folder for k in vit + resnet if k.arch == "vit"}) == len(vit)  # one folder per run
    raw["train"]["grids"] = {"bad": {"archs": ["swin"]}}
    with pytest.raises(Exception, match="train.grids.bad.archs"):
        parse_params(raw)


def test_only_main_grid_runs_get_the_factor_evaluations(tmp_path):
    """Subgroup and resolution tables pool seeds of one cell; curve, budget and draw runs stay out of them."""
    from pipeline.config import Params

    params = Params.model_validate(tiny_repo.params_with())
    t, r = params.train, params.train.recipe
    main = RunKey("alignment", "vit", 0, t.size, r.steps, r.budget_mode, 0)
    others = [replace(main, train_size=t.size // 2), replace(main, steps=2 * r.steps),
              replace(main, budget_mode="flops"), replace(main, data_seed=1)]
    specs = specs_for("train", [main, *others], Folders(tmp_path, tmp_path, tmp_path, tmp_path))
    assert [at_main_budget(s, params) for s in specs] == [True, False, False, False, False]


def test_training_numerics_keep_the_function(workspace):
    """A run trains its convolutions in channels-last layout and with denormal floats flushed to zero (pipeline
    .learner: CPU speed); neither changes what the network computes beyond float rounding, and the layout is the
    module's own (the caller's model, converted in place)."""
    params = load_params(workspace / "params.yaml")
    model = build_model("resnet", params, 4).eval()
    plain = copy.deepcopy(model)
    x = torch.randn(16, 3, 16, 16)
    module = Classifier(model, lr=1e-3, weight_decay=0.0, warmup_steps=0, total_steps=2)
    convs = [m.weight for m in module.model.modules() if isinstance(m, torch.nn.Conv2d) and m.kernel_size != (1, 1)]
    assert convs and all(w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous() for w in convs)
    assert module.model is model
    with torch.no_grad():
        torch.testing.assert_close(module(x), plain(x), rtol=1e-5, atol=1e-5)
    try:
        torch.set_flush_denormal(False)
        tiny = torch.tensor([1e-39])  # below float32's smallest normal (1.18e-38)
        assert (tiny * 0.5).item() > 0.0
        learner.training_threads(1)
        assert torch.get_num_threads() == 1 and (tiny * 0.5).item() == 0.0
    finally:
        torch.set_flush_denormal(False)
