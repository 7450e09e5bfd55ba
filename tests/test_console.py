"""The console of a long repro: each stage says which of how many it is (pipeline.stages.common)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_stage_names_follow_dvc_own_expansion():
    """The console's "stage k of n" counts the stages DVC itself lists (matrix and foreach expanded)."""
    from dvc.repo import Repo

    from pipeline.stages.common import stage_names

    assert stage_names(ROOT) == [s.addressing for s in Repo(str(ROOT)).index.stages]


def test_a_stage_under_dvc_says_which_of_how_many(monkeypatch, capsys):
    from pipeline.stages.common import announce_stage, stage_names

    names = stage_names(ROOT)
    monkeypatch.setenv("DVC_ROOT", str(ROOT))
    monkeypatch.setenv("DVC_STAGE", "slice@alignment")
    announce_stage()
    out = capsys.readouterr().out
    assert f"stage {names.index('slice@alignment') + 1} of {len(names)} (dvc.yaml order): slice@alignment" in out
    monkeypatch.delenv("DVC_STAGE")
    announce_stage()  # outside dvc repro: silent
    assert capsys.readouterr().out == ""
