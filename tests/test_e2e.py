"""The whole pipeline on a tiny repository: ``dvc repro`` succeeds, every output exists, MLflow has the
runs with their budgets, and a second ``dvc repro`` does nothing. Runs whatever ``dvc.yaml`` holds."""

from __future__ import annotations

import hashlib
import json

import pytest
import tiny_repo
import yaml
from test_mlflow_models import scalars

pytestmark = pytest.mark.slow


def test_every_stage_ran_and_wrote_its_outputs(reproduced_repo):
    repo = reproduced_repo
    stages = tiny_repo.dvc(repo, "stage", "list", "--name-only").stdout.split()
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    assert set(stages) == set(lock)
    for name, entry in lock.items():
        for out in entry.get("outs", []):
            assert (repo / out["path"]).exists(), f"{name}: {out['path']} missing"
    metrics = sorted((repo / "data/runs").rglob("metrics.json"))
    assert {m.relative_to(repo / "data/runs").parts[0] for m in metrics} == {"vit", "resnet", "deit"}
    student = json.loads((repo / "data/runs/deit/alignment/n64-t10-s0-d0-criterion/metrics.json").read_text())
    teacher = student["provenance"]["teacher"]  # the verified teacher the student was distilled from
    assert student["teacher"] == teacher["arch"] == "resnet" and teacher["checkpoint"] == "weights.pt"
    weights = (repo / "data/teachers/resnet/s0/alignment/weights.pt").read_bytes()
    assert teacher["checkpoint_sha256"] == hashlib.sha256(weights).hexdigest()
    assert student["budget"]["teacher_train_flops"] == teacher["train_flops"] > 0


def test_mlflow_has_the_runs_with_budgets(reproduced_repo):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{reproduced_repo / 'mlflow.db'}")
    parents, children = {}, {}
    for stage in ("interface", "train", "teacher"):
        exp = client.get_experiment_by_name(f"bias-{stage}")
        assert exp is not None, stage
        found = client.search_runs([exp.experiment_id])
        assert found and all(r.info.status == "FINISHED" for r in found), stage
        children[stage] = [r for r in found if "mlflow.parentRunId" in r.data.tags]
        parents[stage] = sorted(r.info.run_name for r in found if "mlflow.parentRunId" not in r.data.tags)
    for run in children["train"] + children["teacher"]:
        for key in ("params", "optimizer_steps", "train_flops"):
            assert key in run.data.metrics, (run.info.run_name, key)  # the headline's key
        budget = {name for section, name in scalars(client, run.info.run_id) if section == "budget"}
        assert {"images_seen", "tokens_seen"} <= budget, run.info.run_name  # the rest: the run's table
    # one parent run per stage invocation and canvas: the smoke draws alignment at zoom 2 (bench.tiny.SMOKE)
    assert (parents["train"], parents["teacher"]) == (["train", "train at 32 px"], ["teacher"])
    canvas = {(r.data.tags.get("task"), r.data.params.get("geometry.image_size")) for r in children["train"]}
    assert canvas == {("alignment", "32"), ("relation", "16")}
    # train: 2 tasks x (vit, resnet) + the curve grid (resnet on alignment at n=32) + one student; one teacher
    names = sorted(r.info.run_name.split("/")[0] for r in children["train"])
    assert (names, len(children["teacher"])) == (["distill"] + ["train"] * 5, 1)


def test_second_repro_is_a_noop(reproduced_repo):
    out = tiny_repo.dvc(reproduced_repo, "repro").stdout
    assert "Running stage" not in out
    assert "Data and pipelines are up to date" in out


def test_files_beside_the_code_that_are_not_code_change_no_stage(copy_reproduced_repo):
    """Stages depend on whole folders of code (pipeline/report, pipeline/families, ...): bytecode caches, macOS's
    .DS_Store and editors' backups there are not code (.dvcignore), while any other new file is a change."""
    repo = copy_reproduced_repo
    for junk in ("pipeline/families/__pycache__/vit.cpython-311.pyc", "pipeline/report/.DS_Store",
                 "pipeline/tasks/scale.py~", "pipeline/interface/.study.py.swp"):
        (repo / junk).parent.mkdir(exist_ok=True)
        (repo / junk).write_bytes(b"not code")
    assert "up to date" in tiny_repo.dvc(repo, "status").stdout
    (repo / "pipeline/report/notes.csv").write_text("a,b\n")
    status = tiny_repo.dvc(repo, "status").stdout
    assert "report:" in status and "pipeline/report" in status
