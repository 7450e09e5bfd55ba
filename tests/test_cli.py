"""``bias`` (pipeline/cli.py): ``run-one`` trains a cell through the train stage's code and reproduces the stage's
own numbers without recording anything; ``pair`` does so for both arms of a ledger row and reproduces the ledger's
estimate; ``smoke`` runs the DAG in a throwaway copy; bad arguments are one line."""

from __future__ import annotations

import json
import re
import subprocess

import pandas as pd
import pytest
import tiny_repo

from pipeline import cli

BIAS = str(tiny_repo.VENV_BIN / "bias")


def bias(cwd, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([BIAS, *args], cwd=cwd, env=tiny_repo.env(cwd), capture_output=True, text=True,
                          timeout=600)


def tree(repo) -> dict[str, int]:
    """Every file under ``repo`` with its size and mtime: what "nothing written" is checked against (Python's
    bytecode caches aside: the interpreter's, not the command's)."""
    return {str(p.relative_to(repo)): (p.stat().st_size, p.stat().st_mtime_ns) for p in repo.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


def test_run_one_reproduces_the_train_stage_and_records_nothing(copy_reproduced_repo):
    repo = copy_reproduced_repo
    before = tree(repo)
    proc = bias(repo, "run-one", "--arch", "vit", "--task", "alignment", "--seed", "0")
    assert proc.returncode == 0, proc.stderr
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    stage = json.loads((repo / "data/runs/vit/alignment/n64-t10-s0-d0-criterion/metrics.json").read_text())
    assert line["run"] == "train/vit/alignment/n64-t10-s0-d0-criterion"
    assert (line["steps_done"], line["stop_reason"]) == (stage["steps_done"], stage["stop_reason"])
    assert line["test"] == stage["test_acc"] and line["val_acc"] == stage["val_acc"]
    said = next(x for x in proc.stdout.splitlines() if x.startswith("run-one: "))
    assert said.startswith("run-one: train/vit/alignment/n64-t10-s0-d0-criterion at lr 0.002 (tuned, ") or \
        "(train.recipe.lr" in said, said  # where the learning rate came from
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
        code = cli.main(["run-one", *args, "--no-build"])
        err = capsys.readouterr().err
        assert code == 2 and err.startswith("error: ") and says in err, (args, err)
        assert len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]  # nothing written


@pytest.mark.slow  # dvc repro of two stages and a training process
def test_run_one_on_a_fresh_clone_builds_the_stages_its_cell_reads(make_tiny_repo):
    """After `make` alone (nothing reproduced), run-one runs the cell's data and slice stages through DVC, then
    trains; the study's other stages stay unrun."""
    repo = make_tiny_repo("fresh")
    proc = bias(repo, "run-one", "--arch", "vit", "--task", "alignment", "--steps", "2")  # all warm-up: said
    assert proc.returncode == 0 and "warning: 2 steps <= train.recipe.warmup_steps 2" in proc.stderr, proc.stderr
    assert "run-one: building what it reads first: dvc repro slice@alignment" in proc.stdout
    assert json.loads(proc.stdout.strip().splitlines()[-1])["steps_done"] == 2
    assert (repo / "data/slices/alignment/indices.npz").is_file() and not (repo / "data/runs").exists()
    assert not (repo / "data/tasks/relation").exists()  # only what the cell reads


def test_pair_reproduces_the_ledger_row_and_records_nothing(copy_reproduced_repo):
    """Seed 0 is the study's own run of both arms: its difference is the tiny ledger's estimate (one seed); seed 1
    is new, and the interval comes from both."""
    repo = copy_reproduced_repo
    before = tree(repo)
    proc = bias(repo, "pair", "alignment.resnet_vs_vit", "--seeds", "2")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert out[0].startswith("pair alignment.resnet_vs_vit.alignment: resnet - vit on slice/ood of alignment"), out[0]
    started = [x for x in out if re.match(r"\[\d\d:\d\d:\d\d\] run \d of 4 started: ", x)]
    assert [x.split(": ")[1].split(",")[0] for x in started] == [
        f"train/{arm}/alignment/n64-t10-s{seed}-d0-criterion" for seed in (0, 1) for arm in ("resnet", "vit")]
    assert len([x for x in out if re.match(r"\[\d\d:\d\d:\d\d\] run \d of 4 done in [\d.]+ s", x)]) == 4
    table = out[out.index(next(x for x in out if x.split()[:1] == ["seed"])) + 1:][:2]
    diffs = [float(x.split()[3]) for x in table]
    ledger = pd.read_csv(repo / "reports/tables/ledger.csv").set_index("id").loc["alignment.resnet_vs_vit.alignment"]
    assert ledger.seeds == 1 and diffs[0] == pytest.approx(ledger.estimate, abs=5e-5)  # printed to 4 decimals
    mean = next(x for x in out if x.startswith("mean "))
    assert float(mean.split()[1].rstrip(",")) == pytest.approx(sum(diffs) / 2, abs=1e-4)
    assert "95% interval [" in mean and f"{int(ledger['items'])} items" in mean
    assert out[-1].startswith(f"committed ledger (reports/tables/ledger.csv): {ledger.estimate:+.4f} no interval "
                              "over 1 seed(s)"), out[-1]
    assert tree(repo) == before  # no MLflow run, no DVC output, no checkpoint left behind


def test_pair_refuses_what_is_not_a_trainable_row_in_one_line(tmp_path, monkeypatch, capsys):
    """In-process (``cli.main``): a row is found from params alone, and refused before anything trains."""
    archs = {arch: {"models": model, "tasks": ["alignment", "relation"]}
             for arch, model in (("vit", "vit"), ("resnet", "resnet"), ("nomix", "vit"))}
    tiny_repo.write_params(tmp_path / "params.yaml", tiny_repo.params_with({"train": {"archs": archs}}))
    monkeypatch.chdir(tmp_path)  # pair reads params.yaml, data/ and the committed ledger relative to the root
    for args, says in [(("nope",), "row nope: no such ledger row (paired rows here: "),
                       (("alignment.resnet_vs_vitt",), "did you mean alignment.resnet_vs_vit.alignment?"),
                       (("floor.nomix.alignment",), "row floor.nomix.alignment: a floor row (nomix against the "
                                                    "task's shortcut floor)"),
                       (("alignment.stride",), "row alignment.stride: resnet_s1 vs resnet is a contrast of "
                                               "pipeline/report/contrasts.csv, but this configuration does not"),
                       (("budget.resnet.alignment.flops3000",), "a budget row pairs one cell with itself"),
                       (("alignment.resnet_vs_vit.alignment",),
                        "row alignment.resnet_vs_vit.alignment: its arms cannot train from what is on disk "
                        "(data/tasks/alignment: missing); run `dvc repro slice@alignment` first"),
                       (("alignment.resnet_vs_vit", "--seeds", "0"), "--seeds 0: must be at least 1")]:
        code = cli.main(["pair", *args])
        err = capsys.readouterr().err
        assert code == 2 and err.startswith("error: ") and says in err, (args, err)
        assert len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]  # nothing written


def test_smoke_where_no_copy_can_go_is_one_line(tmp_path, monkeypatch, capsys):
    """A --keep folder that cannot be made, or a TMPDIR that takes no folder: one line, not a traceback."""
    assert cli.main(["smoke", "--keep", "/proc/bias-smoke"]) == 2
    assert capsys.readouterr().err == ("error: --keep /proc/bias-smoke: cannot copy the working tree there (No such "
                                       "file or directory)\n")
    monkeypatch.setattr(cli.tempfile, "tempdir", "/proc")  # what tempfile.gettempdir() answers for TMPDIR=/proc
    assert cli.main(["smoke"]) == 2
    assert capsys.readouterr().err.startswith("error: cannot make a temporary folder in /proc (")


def test_smoke_runs_the_dag_in_a_copy_and_leaves_the_repository_alone(smoke_run, reproduced_repo):
    """``reproduced_repo`` is ``bias smoke --keep``'s copy (tests/conftest.py): its output is read here."""
    assert smoke_run["returncode"] == 0, smoke_run["stderr"]
    out = smoke_run["stdout"]
    assert "smoke: the whole DAG ran in" in out and "ledger rows:" in out
    progress = [x for x in out.splitlines() if re.match(r"smoke \[ *\d+ s\] ", x)]
    stages = [x.split("] ")[1] for x in progress if "] stage " in x]
    assert stages[0] == f"stage 1 of {len(stages)}: validate" and stages[-1].endswith(": report"), progress
    assert any(re.search(r"\] +run 1 of \d+ done: train/", x) for x in progress), progress  # runs as they end
    assert (reproduced_repo / "reports/README.md").exists() and (reproduced_repo / "dvc.lock").exists()
    assert smoke_run["after"] == smoke_run["before"]  # the checkout it copied: untouched


