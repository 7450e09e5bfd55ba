"""The tune stage: equal trials per cell, chosen on validation only, and the train stage trains at the choice."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from conftest import mlflow_store

from pipeline import tune
from pipeline.config import load_params, parse_params
from pipeline.errors import StageError
from pipeline.grid import Folders, cells, train_specs, tune_specs
from pipeline.stages import train as train_stage
from pipeline.stages import tune as tune_stage
from tests import tiny_repo


def trials(rows):
    return pd.DataFrame(rows, columns=["arch", "task", "lr", "val_acc", "steps_done", "stop_reason"])


def test_choice_is_fewest_steps_to_criterion_then_best_validation_then_first_listed():
    t = trials([("vit", "a", 5e-4, 0.80, 1000, "cap"), ("vit", "a", 2e-3, 0.90, 1000, "cap"),
                ("resnet", "a", 5e-4, 0.97, 300, "criterion"), ("resnet", "a", 2e-3, 0.99, 500, "criterion"),
                ("swin", "a", 5e-4, 0.99, 3000, "plateau"), ("swin", "a", 2e-3, 0.96, 900, "criterion"),
                ("mixer", "a", 5e-4, 0.97, 400, "criterion"), ("mixer", "a", 2e-3, 0.98, 400, "criterion"),
                ("deit", "a", 5e-4, 0.60, 400, "race"), ("deit", "a", 2e-3, 0.96, 400, "criterion"),
                ("nomix", "a", 5e-4, 0.50, 500, "plateau"), ("nomix", "a", 2e-3, 0.50, 500, "plateau")])
    chosen = tune.choose(t, [5e-4, 2e-3]).set_index("arch").lr
    # none held: best validation; held: fewer steps, even at a lower accuracy; held beats a higher accuracy that
    # did not hold; equal steps: the higher accuracy; a raced trial lost
    assert chosen.to_dict() == {"vit": 2e-3, "resnet": 5e-4, "swin": 2e-3, "mixer": 2e-3, "deit": 2e-3,
                                "nomix": 5e-4}
    assert tune.choose(t, [2e-3, 5e-4]).set_index("arch").lr["nomix"] == 2e-3  # the listed order breaks a full tie


def test_race_step_is_the_fewest_steps_to_criterion_of_the_cell_so_far():
    t = trials([("vit", "a", 2e-3, 0.96, 700, "criterion"), ("vit", "a", 1e-3, 0.97, 500, "criterion"),
                ("resnet", "a", 2e-3, 0.90, 3000, "cap"), ("vit", "b", 2e-3, 0.99, 300, "criterion")])
    assert tune.race_steps(t) == {("vit", "a"): 500, ("vit", "b"): 300}  # resnet held nothing: its trials run on
    assert tune.race_steps(trials([])) == {}


def test_a_cell_missing_a_trial_is_refused():
    t = trials([("vit", "a", 5e-4, 0.8, 10, "cap"), ("vit", "a", 2e-3, 0.9, 10, "cap"),
                ("resnet", "a", 5e-4, 0.9, 10, "cap")])
    with pytest.raises(StageError, match="resnet/a has 1 of 2 trials"):
        tune.choose(t, [5e-4, 2e-3])


def test_trials_cover_every_cell_once_per_lr_on_an_unused_seed(tmp_path):
    params = load_params("params.yaml")
    at = Folders(tmp_path / "t", tmp_path / "s", tmp_path / "out", tmp_path / "ckpt", tmp_path / "teachers")
    specs = tune_specs(params, at)
    assert len(specs) == len(cells(params)) * len(params.tune.lrs)
    assert {(s.key.arch, s.key.task, s.lr) for s in specs} == {
        (a, t, lr) for a, t in cells(params) for lr in params.tune.lrs}
    assert {s.key.seed for s in specs} == {params.tune.seed}
    assert params.tune.seed not in params.train.seeds
    assert all(s.teacher_dir is not None for s in specs if s.key.arch in params.distill.students)
    assert len({s.out_dir for s in specs}) == len(specs)  # trials never share a folder


def test_a_tune_seed_the_study_trains_with_is_refused():
    raw = tiny_repo.params_with({"tune": {"seed": 0}})
    with pytest.raises(Exception, match="tune.seed: 0 is also a training seed"):
        parse_params(raw)


def test_choice_file_missing_a_cell_is_one_line(tmp_path):
    params = load_params("params.yaml")
    path = tmp_path / "choice.json"
    path.write_text(json.dumps({"lrs": {"vit/alignment": params.tune.lrs[0]}}))
    with pytest.raises(StageError, match="no tuned learning rate for"):
        tune.read_choice(path, params)
    path.write_text(json.dumps({"lrs": {f"{a}/{t}": 1e300 for a, t in cells(params)}}))
    with pytest.raises(StageError, match=r"is 1e\+300, not one of tune.lrs"):  # before any run diverges on it
        tune.read_choice(path, params)
    path.write_text(json.dumps({"lrs": {f"{a}/{t}": "fast" for a, t in cells(params)}}))
    with pytest.raises(StageError, match="choice.json"):
        tune.read_choice(path, params)


def test_tune_stage_trains_every_trial_and_train_uses_the_choice(copy_workspace):
    ws = copy_workspace
    # criterion 0: every trial holds it at its second validation, so round 2 races round 1's steps to criterion
    raw = tiny_repo.params_with({"tasks": {"names": ["alignment"]}, "tune": {"lrs": [1e-3, 3e-3], "seed": 7},
                                 "train": {"archs": {"vit": {"models": "vit", "tasks": ["alignment"]}}, "grids": {},
                                           "seeds": [0], "criterion": {"accuracy": 0.0, "hold": 2},
                                           "recipe": {"budget_mode": "criterion"}},
                                 "distill": {"students": {}}})
    tiny_repo.write_params(ws / "params.yaml", raw)
    params = load_params(ws / "params.yaml")
    argv = ["--params", str(ws / "params.yaml"), "--data", str(ws / "data/tasks"), "--slices", str(ws / "data/slices"),
            "--teachers", str(ws / "data/teachers")]
    with mlflow_store(ws):
        assert tune_stage.main([*argv, "--out", str(ws / "data/tune/runs"), "--ckpt", str(ws / "data/ckpt/tune"),
                                "--choice", str(ws / "data/tune/choice.json"),
                                "--report", str(ws / "reports/tune")]) == 0
    table = pd.read_csv(ws / "reports/tune/trials.csv")
    assert sorted(table.lr) == [1e-3, 3e-3] and set(table.arch) == {"vit"}
    assert set(table.stop_reason) == {"criterion"} and table.steps_done.nunique() == 1  # held at the same step
    best = table.sort_values(["val_acc", "lr"], ascending=[False, True]).iloc[0]  # equal steps: accuracy, order
    races = {m["lr"]: m.get("race") for m in map(json.loads, map(Path.read_text,
                                                                 (ws / "data/tune/runs").rglob("metrics.json")))}
    assert races == {1e-3: None, 3e-3: int(table.steps_done.iloc[0])}  # round 2 raced round 1
    choice = json.loads((ws / "data/tune/choice.json").read_text())
    assert choice["lrs"] == {"vit/alignment": best.lr} and choice["trials_per_cell"] == 2
    assert "vit" in (ws / "reports/tune/tuning.md").read_text()
    trial = json.loads(next((ws / "data/tune/runs").rglob("metrics.json")).read_text())
    assert trial["seed"] == 7 and "subgroups" not in trial  # a trial is a validation number, nothing more
    specs = train_specs(params, Folders(ws / "data/tasks", ws / "data/slices", ws / "r", ws / "c"),
                        tune.read_choice(ws / "data/tune/choice.json", params))
    assert {s.lr for s in specs} == {best.lr}
    with mlflow_store(ws):
        assert train_stage.main([*argv, "--tune", str(ws / "data/tune/choice.json"), "--out", str(ws / "data/runs"),
                                 "--ckpt", str(ws / "data/ckpt/train")]) == 0
    run = json.loads(next((ws / "data/runs").rglob("metrics.json")).read_text())
    assert run["lr"] == best.lr
