"""bench.kernels' comparisons: against this machine's default run, and the committed study's one-run cell."""

from __future__ import annotations

import numpy as np
import pandas as pd
import tiny_repo

from bench.kernels import CONTROL, DEFAULT, child_env, committed, compare, keys, summary
from pipeline.config import load_params
from pipeline.executor import ADDRESS_ENV


def run(acc: float, logits: list[list[float]]) -> dict:
    return {"test_acc": acc, "val_acc": acc, "logits": np.array(logits, dtype=np.float32)}


def test_each_run_is_compared_with_the_default_run_at_the_first_seed():
    ref = [[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]]
    runs = {(DEFAULT, "vit", 0): run(0.5, ref),
            (CONTROL, "vit", 0): run(0.5, ref),
            ("MKL_CBWR=COMPATIBLE", "vit", 0): run(0.5, [[1.0, 1e-6], *ref[1:]]),  # rounding only
            (DEFAULT, "vit", 1): run(0.75, [[0.0, 1.0], [1.0, 0.0], *ref[2:]])}  # another seed
    t = compare(runs, seed0=0).set_index("kernels")
    assert t.loc[CONTROL, "logits_identical"] and t.loc[CONTROL, "predictions_differ"] == 0
    kern = t.loc["MKL_CBWR=COMPATIBLE"]
    assert not kern.logits_identical and kern.predictions_differ == 0 and kern.max_logit_diff > 0
    seed = t[t.seed == 1].iloc[0]
    assert seed.predictions_differ == 0.5 and seed.delta_test_acc == 0.25
    line = summary(compare(runs, seed0=0), seed0=0)[0]
    assert "control rerun is bit-identical" in line and "another seed moves it by 0.2500-0.2500" in line


def test_the_committed_number_is_the_draws_cell_at_its_seed_only(tmp_path):
    params = load_params(tiny_repo.ROOT / "params.yaml")
    key = keys(params, ["vit"], "alignment", [0], data_seed=1)[0]
    row = {"task": "alignment", "arch": "vit", "train_size": key.train_size, "steps": key.steps,
           "budget_mode": key.budget_mode, "data_seed": 1, "n": 1, "mean": 0.3695}
    csv = tmp_path / "accuracy.csv"
    pd.DataFrame([row, {**row, "data_seed": 0, "n": 5, "mean": 0.4}]).to_csv(csv, index=False)
    assert committed(csv, params, key) == 0.3695
    other_seed = keys(params, ["vit"], "alignment", [1], data_seed=1)[0]  # the study has no such run
    assert committed(csv, params, other_seed) is None
    main_grid = keys(params, ["vit"], "alignment", [0], data_seed=0)[0]  # a 5-seed cell, not this run
    pd.DataFrame([{**row, "data_seed": 0}]).to_csv(csv, index=False)  # even were it listed as one run
    assert committed(csv, params, main_grid) is None
    assert committed(tmp_path / "missing.csv", params, key) is None


def test_a_setting_process_gets_exactly_its_kernel_variables_and_no_outside_cluster():
    base = {"PATH": "/bin", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2", ADDRESS_ENV: "tcp://10.0.0.1:8786"}
    assert child_env(base, DEFAULT) == {"PATH": "/bin"}  # the user's own kernel choice is not this machine's default
    assert child_env(base, "MKL_CBWR=COMPATIBLE") == {"PATH": "/bin", "MKL_CBWR": "COMPATIBLE"}
