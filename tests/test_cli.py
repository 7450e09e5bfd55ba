"""``bias`` (pipeline/cli.py): ``run-one`` trains a cell through the train stage's code and reproduces the stage's
own numbers without recording anything; ``smoke`` runs the DAG in a throwaway copy; bad arguments are one line."""

from __future__ import annotations

import json
import subprocess

import pytest
import tiny_repo

from pipeline import cli

BIAS = str(tiny_repo.VENV_BIN / "bias")


def bias(cwd, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([BIAS, *args], cwd=cwd, env=tiny_repo.env(cwd), capture_output=True, text=True,
                          timeout=600)


def tree(repo) -> dict[str, int]:
    """Every file under ``repo`` with its size and mtime: what "nothing written" is checked against."""
    return {str(p.relative_to(repo)): (p.stat().st_size, p.stat().st_mtime_ns) for p in repo.rglob("*")
            if p.is_file()}


def test_run_one_reproduces_the_train_stage_and_records_nothing(copy_reproduced_repo):
    repo = copy_reproduced_repo
    before = tree(repo)
    proc = bias(repo, "run-one", "--arch", "vit", "--task", "alignment", "--seed", "0")
    assert proc.returncode == 0, proc.stderr
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    stage = json.loads((repo / "data/runs/vit/alignment/n128-t20-s0-d0-criterion/metrics.json").read_text())
    assert line["run"] == "train/vit/alignment/n128-t20-s0-d0-criterion"
    assert (line["steps_done"], line["stop_reason"]) == (stage["steps_done"], stage["stop_reason"])
    assert line["test"] == stage["test_acc"] and line["val_acc"] == stage["val_acc"]
    said = next(x for x in proc.stdout.splitlines() if x.startswith("run-one: "))
    assert said.startswith("run-one: train/vit/alignment/n128-t20-s0-d0-criterion at lr 0.002 (tuned, ") or \
        "(train.recipe.lr" in said, said  # where the learning rate came from
    short = bias(repo, "run-one", "--arch", "vit", "--task", "alignment", "--steps", "2")  # warm-up: 2 steps
    assert short.returncode == 0 and "warning: 2 steps <= train.recipe.warmup_steps 2" in short.stderr, short.stderr
    assert tree(repo) == before  # no MLflow run, no DVC output, no checkpoint left behind


def test_run_one_refuses_what_the_grid_lacks_in_one_line(tmp_path, monkeypatch, capsys):
    """Validation only, so in-process (``cli.main``): the console script itself runs in the test above."""
    tiny_repo.write_params(tmp_path / "params.yaml", tiny_repo.params_with())
    monkeypatch.chdir(tmp_path)  # run-one reads params.yaml and data/ relative to the repository root
    for args, says in [(("--arch", "vit", "--task", "scale"), "--arch vit --task scale: not a cell"),
                       (("--arch", "vit", "--task", "alignment", "--seed", "9"), "--seed 9: not in train.seeds"),
                       (("--arch", "vit", "--task", "alignment"),
                        "data/tasks/alignment: missing; run `dvc repro slice@alignment` first"),
                       (("--arch", "vit", "--task", "alignment", "--steps", "0"), "--steps 0: must be a positive"),
                       (("--arch", "vit", "--task", "alignment", "--lr", "nan"), "--lr nan: must be a positive"),
                       (("--arch", "vit", "--task", "alignment", "--lr", "inf"), "--lr inf: must be a positive")]:
        code = cli.main(["run-one", *args])
        err = capsys.readouterr().err
        assert code == 2 and err.startswith("error: ") and says in err, (args, err)
        assert len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]  # nothing written


@pytest.mark.slow
def test_smoke_runs_the_dag_in_a_copy_and_leaves_the_repository_alone(tmp_path):
    status = ["git", "status", "--porcelain", "--untracked-files=all"]
    before = subprocess.run(status, cwd=tiny_repo.ROOT, capture_output=True, text=True, check=True).stdout
    proc = bias(tiny_repo.ROOT, "smoke", "--keep", str(tmp_path / "copy"))
    assert proc.returncode == 0, proc.stderr
    assert "smoke: the whole DAG ran in" in proc.stdout and "ledger rows:" in proc.stdout
    assert (tmp_path / "copy/reports/README.md").exists() and (tmp_path / "copy/dvc.lock").exists()
    after = subprocess.run(status, cwd=tiny_repo.ROOT, capture_output=True, text=True, check=True).stdout
    assert after == before


