"""Training to a criterion (``budget_mode: criterion``): the stop rule ends a real Lightning run where it says,
records why, charges only the steps taken, and an interrupted run stops where an uninterrupted one does."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import mlflow_store
from test_train import Interrupt, interrupting, train

from pipeline import experiment, learner
from pipeline.config import Params
from pipeline.executor import RunFailed
from pipeline.grid import Folders, RunKey, specs_for

torch.set_num_threads(1)
pytestmark = pytest.mark.slow  # trains
CAP = 40  # tiny runs validate every 10 steps
KEY = RunKey("alignment", "vit", 0, 128, CAP, "criterion")


def params_with(workspace: Path, tmp: Path, **criterion) -> Params:
    raw = yaml.safe_load((workspace / "params.yaml").read_text())
    raw["train"]["criterion"].update(criterion)
    raw["train"]["recipe"]["budget_mode"] = "criterion"
    path = tmp / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    return Params.model_validate(yaml.safe_load(path.read_text()))


def test_criterion_held_stops_the_run_and_charges_only_its_steps(workspace, tmp_path):
    # accuracy 0 is reached at every validation: held twice at step 20, half the cap
    params = params_with(workspace, tmp_path, accuracy=0.0, hold=2, min_steps=CAP)
    with mlflow_store(tmp_path):
        m = train(workspace, tmp_path / "run", params, key=KEY)
    assert (m["stop_reason"], m["criterion_step"], m["steps_done"]) == ("criterion", 20, 20)
    assert m["steps"] == CAP and m["budget"]["optimizer_steps"] == 20
    assert m["budget"]["images_seen"] == 20 * params.train.recipe.batch_size
    assert [r["step"] for r in m["curve"]] == [10, 20]


def test_plateau_stops_a_run_that_no_longer_improves(workspace, tmp_path):
    # no rise can reach min_delta 1.0: the best is set at the first validation, two more without a rise stop it
    params = params_with(workspace, tmp_path, accuracy=1.0, min_delta=1.0, patience=2, min_steps=0,
                         plateau_above=0.0)
    with mlflow_store(tmp_path):
        m = train(workspace, tmp_path / "run", params, key=KEY)
    assert (m["stop_reason"], m["criterion_step"], m["steps_done"]) == ("plateau", None, 30)


def test_a_flat_run_near_chance_trains_on_to_the_cap(workspace, tmp_path):
    # the same flat curve, but its best never clears chance + 0.99 x (1 - chance): the plateau rule stays off
    params = params_with(workspace, tmp_path, accuracy=1.0, min_delta=1.0, patience=2, min_steps=0,
                         plateau_above=0.99)
    with mlflow_store(tmp_path):
        m = train(workspace, tmp_path / "run", params, key=KEY)
    assert max(r["val_acc"] for r in m["curve"]) < 0.5 + 0.99 * 0.5  # alignment: 2 classes
    assert (m["stop_reason"], m["criterion_step"], m["steps_done"]) == ("cap", None, CAP)


def test_cap_ends_a_run_the_rules_never_stop(workspace, tmp_path):
    params = params_with(workspace, tmp_path, accuracy=1.0, min_steps=CAP)
    with mlflow_store(tmp_path):
        m = train(workspace, tmp_path / "run", params, key=KEY)
    assert (m["stop_reason"], m["steps_done"]) == ("cap", CAP)


def test_a_raced_trial_stops_at_its_race_step_on_the_unraced_path(workspace, tmp_path):
    # tune racing: a trial that has not held the criterion by its race step stops there; up to that step it is
    # the run it would have been (the schedule still runs to the cap), and it is a run of its own identity
    params = params_with(workspace, tmp_path, accuracy=1.0, min_steps=CAP)
    at = Folders(workspace / "data/tasks", workspace / "data/slices", tmp_path / "raced/runs",
                 tmp_path / "raced/ckpt", workspace / "data/teachers")
    (spec,) = specs_for("train", [KEY], at)
    with mlflow_store(tmp_path):
        whole = train(workspace, tmp_path / "whole", params, key=KEY)
        (raced,) = experiment.execute([replace(spec, race=20)], params, "train", tmp_path / "raced/ckpt")
    assert (raced["stop_reason"], raced["steps_done"], raced["race"]) == ("race", 20, 20)
    assert raced["criterion_step"] is None and whole["stop_reason"] == "cap"
    assert raced["curve"] == whole["curve"][:2] and len(whole["curve"]) == CAP // 10
    assert raced["identity"] != whole["identity"]


def test_interrupted_run_stops_where_an_uninterrupted_one_does(workspace, tmp_path):
    params = params_with(workspace, tmp_path, accuracy=1.0, min_delta=1.0, patience=2, min_steps=0,
                         plateau_above=0.0)
    with mlflow_store(tmp_path):
        whole = train(workspace, tmp_path / "whole", params, key=KEY)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(learner, "Curves", interrupting(20))  # after the second validation: one left before the stop
            with pytest.raises(RunFailed, match=Interrupt.__name__):
                train(workspace, tmp_path / "cut", params, key=KEY)
        resumed = train(workspace, tmp_path / "cut", params, key=KEY)
    assert resumed["measured"]["resumed"] and resumed["steps_done"] == whole["steps_done"] == 30
    assert resumed["stop_reason"] == "plateau" and resumed["curve"] == whole["curve"]
    assert np.array_equal(logits_of(tmp_path / "whole"), logits_of(tmp_path / "cut"))


def logits_of(out: Path) -> np.ndarray:
    with np.load(out / "runs" / KEY.arch / KEY.folder / "predictions.npz") as z:
        return z["logits"]
