"""Profiles by composition (pipeline/profiles.py): each profile is a short overlay laid over params.yaml, its rules
refuse what they cannot compose, and each overlay's header cites its last committed run as reports/<name>/ has it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from bench.repro_breakdown import profile_row
from pipeline import cli, profiles
from pipeline.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
NAMES = profiles.names(ROOT)


@pytest.fixture
def repo(tmp_path):
    """A repository with the real params.yaml and an empty profiles/ (write overlays into it)."""
    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    (tmp_path / profiles.DIR).mkdir()
    return tmp_path


def overlay(repo: Path, text: str, name: str = "mine") -> Path:
    path = repo / profiles.DIR / f"{name}.yaml"
    path.write_text(text)
    return path


def test_mappings_merge_lists_and_scalars_replace_and_replace_gives_a_mapping_whole(repo):
    base = yaml.safe_load((repo / "params.yaml").read_text())
    composed = profiles.compose(overlay(repo, "seed: 3\ntrain:\n  seeds: [5]\n  recipe: {lr: 0.01}\n"
                                              "  grids: !replace {one: {archs: [vit], tasks: [scale]}}\n"))
    assert composed["seed"] == 3 and composed["train"]["seeds"] == [5]
    assert composed["train"]["recipe"] == {**base["train"]["recipe"], "lr": 0.01}  # the rest of recipe kept
    assert composed["train"]["grids"] == {"one": {"archs": ["vit"], "tasks": ["scale"]}}  # the base's grids gone
    assert {k: v for k, v in composed.items() if k not in ("seed", "train")} == \
        {k: v for k, v in base.items() if k not in ("seed", "train")}
    assert list(composed) == list(base) and list(composed["train"]) == list(base["train"])  # the base's order
    assert type(composed["train"]["grids"]) is dict  # no marker reaches the schema
    profiles.load(repo / profiles.DIR / "mine.yaml")


@pytest.mark.parametrize(("text", "says"), [
    ("train:\n  recipe: {lrr: 0.01}\n", "train.recipe.lrr: not a key of params.yaml"),
    ("trian: {seeds: [1]}\n", "trian: not a key of params.yaml"),
    ("train: {seeds: !replace [1]}\n", "!replace tags a mapping only"),
    ("- 1\n", "an overlay is a mapping"),
    ("seed: 1\nseed: 2\n", "duplicate key 'seed'"),
])
def test_what_cannot_compose_is_one_line_naming_the_overlay(repo, text, says):
    path = overlay(repo, text)
    with pytest.raises(ConfigError) as err:
        profiles.compose(path)
    assert str(err.value).startswith(str(path)) and says in str(err.value) and "\n" not in str(err.value)


def test_a_composed_profile_is_validated_naming_the_overlay(repo):
    path = overlay(repo, "train: {seeds: [-1]}\n")
    with pytest.raises(ConfigError, match=re.escape(str(path)) + ".*train.seeds"):
        profiles.load(path)


@pytest.mark.parametrize("name", NAMES)
def test_each_profile_is_a_short_overlay_that_composes_into_valid_params(name):
    path = ROOT / profiles.DIR / f"{name}.yaml"
    assert len(path.read_text().splitlines()) < 100, f"{path.name}: an overlay holds what it changes, nothing else"
    params = profiles.load(path)
    assert params.tracking.experiment_prefix == f"bias-{name}"  # its runs apart in the MLflow store
    assert profiles.headline(path)


def test_bias_profile_without_a_name_lists_the_profiles(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    assert cli.main(["profile"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == NAMES
    for name, line in zip(NAMES, lines, strict=True):
        assert line.endswith(profiles.headline(ROOT / profiles.DIR / f"{name}.yaml"))


def test_a_bad_profile_is_refused_before_anything_is_copied(repo, monkeypatch, capsys):
    overlay(repo, "tracking: {experiment_prefix: bias-mine}\ntrain: {sedes: [1]}\n")
    monkeypatch.chdir(repo)
    assert cli.main(["profile", "mine"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: profiles/mine.yaml: train.sedes: not a key") and len(err.splitlines()) == 1
    assert cli.main(["profile", "../params"]) == 2  # a name, not a path to any YAML file
    assert capsys.readouterr().err == "error: profiles/../params.yaml: no such profile (have: mine)\n"
    overlay(repo, "train: {seeds: [1]}\n")  # valid, but its runs would mix with the default's in the store
    assert cli.main(["profile", "mine"]) == 2
    assert capsys.readouterr().err.startswith(
        "error: profiles/mine.yaml: tracking.experiment_prefix 'bias' is the default's")
    assert not (repo / cli.PROFILES).exists()


# The header line each overlay carries about its last committed run (reports/<name>/), e.g.
#   # last run: 45.6 min of dvc repro at 12.1 ms/ViT step (reports/quick/, commit 492dbde, 2026-12-05);
#   #   1 of 5 findings supported; ledger 11 held, 0 failed, 0 equivalent, 32 underpowered, 4 uninformative, 0 not run.
LAST_RUN = re.compile(
    r"last run: (?:(?P<min>[\d.]+) min of dvc repro at (?P<ms>[\d.]+) ms/ViT step|dvc repro time not recorded) "
    r"\(reports/(?P<name>[^/]+)/, commit (?P<commit>[0-9a-f]{7}), (?P<date>[\d-]+)\); (?P<supported>\d+) of "
    r"(?P<findings>\d+) findings supported; ledger (?P<ledger>\d+ [a-z ]+(?:, \d+ [a-z ]+)*)\.")
VERDICT = re.compile(r"(\d+) ([a-z ]+)")  # "7 held", "0 not equivalent": the report's verdicts, in its words
FINDING = re.compile(r"^\d+\. \*\*[^:*]+: (supported|contradicted|no effect|undecided)\b", re.MULTILINE)
GENERATED = re.compile(r"from commit `([0-9a-f]{7})[0-9a-f]*` on (\d{4}-\d{2}-\d{2})")


def header(path: Path) -> str:
    """The overlay's leading comment block as one line (a figure may wrap onto the next comment line)."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(lines)


def measured(report: Path) -> dict[str, str]:
    """What ``reports/<name>/`` records of the run, in the header's terms (minutes and ViT step only where
    ``bench.repro_breakdown`` wrote its ``repro_timing.json``)."""
    readme, summary = (report / "README.md").read_text(), json.loads((report / "summary.json").read_text())
    commit, date = GENERATED.search(readme).groups()
    statuses = FINDING.findall(readme.split("## Findings", 1)[1].split("\n## ", 1)[0])
    ledger = {k.replace("_", " "): int(v) for k, v in summary["ledger"].items()}
    out = {"name": report.name, "commit": commit, "date": date, "supported": str(statuses.count("supported")),
           "findings": str(len(statuses)), "ledger": ledger, "min": None, "ms": None}
    if (report / "repro_timing.json").is_file():
        row = profile_row(report.name, json.loads((report / "repro_timing.json").read_text()))
        out |= {"min": f"{row['dvc_repro_min']:.1f}", "ms": f"{row['vit_ms_per_step']:.1f}"}
    return out


@pytest.mark.parametrize("name", NAMES)
def test_each_overlay_cites_its_last_committed_run(name):
    """The header's figures are reports/<name>/'s (its README, summary.json and repro_timing.json); a profile
    with no committed run there says "not yet run", and only then."""
    text, report = header(ROOT / profiles.DIR / f"{name}.yaml"), ROOT / "reports" / name
    if not (report / "summary.json").is_file():
        assert "last run: not yet run." in text, f"{name}: no reports/{name}/summary.json, so 'not yet run'"
        return
    found = LAST_RUN.search(text)
    assert found, f"profiles/{name}.yaml: no 'last run: ...' line in its header (see {LAST_RUN.pattern!r})"
    got = found.groupdict() | {"ledger": {word: int(n) for n, word in VERDICT.findall(found["ledger"])}}
    assert got == measured(report), f"profiles/{name}.yaml's header against reports/{name}/"
