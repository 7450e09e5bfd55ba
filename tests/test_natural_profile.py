"""The natural profile (issue 30, profiles/natural.yaml): its slice is the same study cut to a CPU, and the
profile's own stages run end to end through ``bias profile`` on a tiny cut of it (a fake CIFAR-10 archive, tiny
models, a few steps): the one end-to-end test of ``bias profile`` (beside the default, in its own experiments)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import tiny_repo
from mlflow.tracking import MlflowClient
from test_natural import fake_python_archive

from pipeline import profiles

ROOT = Path(__file__).resolve().parents[1]
NATURAL, SLICE = ROOT / "profiles/natural.yaml", ROOT / "profiles/natural-slice.yaml"
# What the slice may change: sizes, budgets, seeds, the runtime and its own experiments.
SLICE_EDITS = {("models", "param_target"), ("tasks", "natural", "per_class_train"),
               ("tasks", "natural", "per_class_test"), ("slice",), ("plan",), ("tracking", "experiment_prefix"),
               ("train", "seeds"), ("train", "size"), ("train", "grids"), ("train", "recipe", "steps"),
               ("train", "recipe", "batch_size"), ("train", "recipe", "warmup_steps"), ("train", "runtime"),
               ("distill", "teacher_size"), ("tune", "lrs"), ("finetune", "steps"), ("finetune", "batch_size"),
               ("finetune", "warmup_steps")}


def _drop(doc: dict, paths: set[tuple[str, ...]]) -> dict:
    doc = json.loads(json.dumps(doc))
    for path in paths:
        node = doc
        for key in path[:-1]:
            node = node[key]
        node.pop(path[-1], None)
    return doc


def test_natural_profile_is_the_issue_s_study():
    p = profiles.load(NATURAL)
    assert (p.geometry.image_size, p.geometry.patch_size) == (32, 4) and p.tasks.names == ["natural"]
    assert (p.tasks.natural.per_class_train, p.tasks.natural.per_class_test) == (5000, 1000)
    assert p.tasks.natural.augment.on and p.train.size == max(p.slice.train_sizes)
    assert p.slice.train_sizes[-1] + p.slice.val_size == 50000 and p.slice.test_size == 10000
    assert 1e6 <= p.models.param_target <= 5e6 and len(p.train.seeds) >= 5
    assert (p.train.runtime.accelerator, p.train.runtime.precision) == ("gpu", "bf16-mixed")
    grids = p.train.grids
    assert any(g.augment is False for g in grids.values())  # the views-off minimal pair
    assert any(g.epochs for g in grids.values()) and any(g.sizes and not g.epochs for g in grids.values())
    assert {"vit", "vit_nopos", "vit_sincos", "vit_convstem", "vit_overlap", "swin", "swin_noshift", "resnet"} \
        <= set(p.train.archs)
    assert set(p.report.expected["natural"]) >= {"vit", "resnet"}


def test_the_slice_is_the_profile_cut_to_a_cpu():
    full, cut = profiles.compose(NATURAL), profiles.compose(SLICE)
    assert _drop(cut, SLICE_EDITS) == _drop(full, SLICE_EDITS)
    assert set(cut["train"]["grids"]) == set(full["train"]["grids"])  # the same curves and pairs, smaller
    p = profiles.load(SLICE)
    assert p.train.runtime.accelerator == "cpu" and p.tracking.experiment_prefix == "bias-natural-slice"


@pytest.mark.slow
def test_a_tiny_cut_of_the_profile_runs_through_bias_profile(tmp_path, make_tiny_repo):
    archive = tmp_path / "cifar-10-python.tar.gz"
    fake_python_archive(archive, per_class=30)
    repo = make_tiny_repo("repo")
    raw = profiles.compose(NATURAL)
    archs = ["vit", "vit_nopos", "resnet"]  # a learned, a missing position table and a CNN: the checks below
    tiny = {  # at the CPU default's 16 px: the profile's stages, not its geometry, are what this test runs
        "interface": tiny_repo.TINY["interface"],
        "geometry": {"image_size": 16},
        "models": {"param_target": 20000, "param_tolerance": 0.2, "vit": {"depth": 2}, "resnet": {"layers": [1, 1]},
                   "swin": {"depths": [2, 2], "num_heads": [2, 4]}},
        "tasks": {"natural": {"path": ["data/raw/none.tar.gz", str(archive)], "per_class_train": 28,
                              "per_class_test": 10}},
        "slice": {"train_sizes": [100, 200], "val_size": 40, "test_size": 100},
        "evaluation": {"resolution": {"sizes": [24]}},
        "train": {"seeds": [0], "size": 200,
                  "archs": {a: raw["train"]["archs"][a] for a in archs},
                  "grids": {"views_off": {**raw["train"]["grids"]["views_off"], "seeds": [0]},
                            "size_steps": {**raw["train"]["grids"]["size_steps"], "sizes": [100], "seeds": [0]},
                            "size_epochs": {**raw["train"]["grids"]["size_epochs"], "sizes": [100, 200],
                                            "epochs": 2, "seeds": [0]}},
                  "recipe": {"steps": 20, "batch_size": 16, "warmup_steps": 2},
                  "runtime": {"workers": 1, "threads": 1, "accelerator": "cpu", "precision": "32-true",
                              "val_every_steps": 10, "log_every_steps": 5, "checkpoint_every_steps": 10,
                              "eval_batch_size": 256}},
        "distill": {"teacher_size": 200},
        "tune": {"lrs": [2e-3]},
        "finetune": {"size": 24, "steps": 4, "batch_size": 16, "warmup_steps": 1},
    }
    params = tiny_repo.merge(raw, tiny)
    params["train"]["archs"] = tiny["train"]["archs"]
    params["train"]["grids"] = tiny["train"]["grids"]
    # the tiny repo's params.yaml is tiny_repo's: the overlay gives every section whole, so it runs `params`
    overlay = repo / "profiles/natural.yaml"
    overlay.write_text(profiles.dump({key: profiles.Replace(value) if isinstance(value, dict) else value
                                      for key, value in params.items()}))
    assert profiles.compose(overlay) == params
    profiles.load(overlay)
    tiny_repo.git(repo, "commit", "-q", "-am", "the tiny cut")
    head = tiny_repo.git(repo, "rev-parse", "HEAD").strip()
    proc = subprocess.run([str(tiny_repo.VENV_BIN / "bias"), "profile", "natural"], cwd=repo,
                          env=tiny_repo.env(repo), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # beside the default: only its report is new in the checkout, its runs in its own experiments, tagged
    status = tiny_repo.git(repo, "status", "--porcelain", "--untracked-files=normal").splitlines()
    assert status == ["?? reports/natural/"]
    out = repo / "reports" / "natural"
    for rel in ("README.md", "summary.json", "tables/ledger.csv", "dvc.lock"):
        assert (out / rel).is_file(), rel
    assert not (repo / "data").exists()  # the default's outputs: none made
    client = MlflowClient(tracking_uri=f"sqlite:///{repo / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("bias-natural-train").experiment_id])
    assert runs and {(r.data.tags["profile"], r.data.tags["git_commit"]) for r in runs} == {("natural", head)}
    assert client.get_experiment_by_name("bias-train") is None
    curve = pd.read_csv(out / "tables" / "size_curve.csv")
    assert set(curve.curve) == {"matched steps", "matched epochs (2)"}
    epochs = curve[curve.curve == "matched epochs (2)"].set_index(["arch", "train_size"]).steps
    assert epochs[("vit", 100)] == 13 and epochs[("vit", 200)] == 25  # ceil(2 x size / 16)
    views = pd.read_csv(out / "tables" / "views.csv")
    assert sorted(views.arch) == ["resnet", "vit"] and (views.seeds == 1).all()
    led = pd.read_csv(out / "tables" / "ledger.csv")
    paired = led[(led.task == "natural") & (led.kind == "paired")]  # the pooled bags stand beside the floor
    assert len(paired) and paired.beside_baseline.str.contains("_pooled").all() and paired.beside_floor.notna().all()
    expected = pd.read_csv(out / "tables" / "expected.csv")
    assert set(expected.arch) >= {"vit", "resnet"} and expected["where"].isin(["inside", "below", "above"]).all()
    tuned = pd.read_csv(out / "finetune" / "finetune.csv").set_index("arch")  # trained at 16, fine-tuned at 24
    assert set(tuned.index) == set(archs) and (tuned["size"] == 24).all()
    assert tuned.loc["vit", "position"] == "learned" and tuned.loc["vit_nopos", "position"] == "none"
    assert tuned.finetuned.between(0, 1).all() and tuned.eval_only.between(0, 1).all()
    meta = json.loads((repo / ".profiles/natural/data/tasks/natural/meta.json").read_text())
    assert meta["archive"]["path"] == str(archive)  # the profile's copy read the archive the checkout points at
    runs = list((repo / ".profiles/natural/data/runs").rglob("metrics.json"))
    off = [json.loads(m.read_text()) for m in runs if m.parent.name.endswith("-noaug")]
    assert off and all(m["augment"] is False and m["views"] == {} for m in off)
    on = [json.loads(m.read_text()) for m in runs if not m.parent.name.endswith("-noaug")]
    assert all(m["views"] == {"crop_pad": 4, "flip": True} for m in on)
