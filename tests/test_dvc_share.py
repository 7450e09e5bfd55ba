"""DVC as a team uses it, with the real ``dvc``: a study's outputs pushed to a remote come back byte-identical
into a clone, which then has nothing to rerun; and ``dvc plots show`` draws no series without data (what DVC's
own page draws, computed headless with the vega builds the page inlines)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import tiny_repo
import yaml

ROOT = Path(__file__).resolve().parents[1]
DRAW = Path(__file__).parent / "fixtures/vega_draw.js"
STAGES = ("slice@alignment",)  # with what it needs (validate, data@alignment): seconds, no training


def locked_outs(repo: Path, cached: bool) -> list[Path]:
    """The outputs of the stages dvc.lock records: those DVC caches (and pushes), or all of them (the others,
    ``cache: false``, are committed to git)."""
    from dvc.repo import Repo

    locked = set(yaml.safe_load((repo / "dvc.lock").read_text())["stages"])
    with Repo(str(repo)) as dvc:
        return [repo / o.def_path for stage in dvc.index.stages if stage.name in locked
                for o in stage.outs if o.use_cache or not cached]


def outputs(repo: Path, cached: bool = True) -> dict[str, str]:
    """sha256 of every file under the outputs dvc.lock records (see :func:`locked_outs`), by path."""
    found = {}
    for path in locked_outs(repo, cached):
        for f in sorted([path] if path.is_file() else path.rglob("*")):
            if f.is_file():
                found[str(f.relative_to(repo))] = hashlib.sha256(f.read_bytes()).hexdigest()
    return found


@pytest.mark.slow
def test_pushed_outputs_come_back_byte_identical_and_a_clone_reruns_nothing(make_tiny_repo, tmp_path):
    repo = make_tiny_repo("repo")
    tiny_repo.dvc(repo, "repro", *STAGES)
    tiny_repo.dvc(repo, "remote", "add", "-d", "shared", str(tmp_path / "remote"))
    tiny_repo.git(repo, "add", "-A")
    tiny_repo.git(repo, "commit", "-qm", "a study and its remote")
    made = outputs(repo)
    assert len(made) > 5 and any(p.startswith("data/slices/alignment/") for p in made)
    assert "pushed" in tiny_repo.dvc(repo, "push").stdout

    # the cache and the outputs gone: pull brings back the same bytes
    shutil.rmtree(repo / ".dvc/cache")
    for path in locked_outs(repo, cached=True):
        (shutil.rmtree if path.is_dir() else Path.unlink)(path)
    assert outputs(repo) == {}
    tiny_repo.dvc(repo, "pull", "--with-deps", *STAGES)  # what ran: the rest of this tiny study never did
    assert outputs(repo) == made

    # a teammate's fresh clone: pull, then nothing to rerun (an ablation reruns only what it changes)
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True, capture_output=True)
    tiny_repo.dvc(clone, "pull", "--with-deps", *STAGES)
    assert outputs(clone, cached=False) == outputs(repo, cached=False)  # reports/ (uncached) came with git
    again = tiny_repo.dvc(clone, "repro", *STAGES).stdout
    assert "Running stage" not in again, again
    params = yaml.safe_load((clone / "params.yaml").read_text())
    params["slice"]["val_size"] -= 8  # an ablation of the slicing alone: the pulled data stage is kept
    tiny_repo.write_params(clone / "params.yaml", params)
    ran = tiny_repo.dvc(clone, "repro", *STAGES).stdout
    assert "Running stage 'slice@alignment'" in ran and "Running stage 'data@alignment'" not in ran, ran


# The filter DVC's template needs so an empty value (an architecture a profile does not train: its column is
# empty) is not drawn: vega-lite reads '' as 0, a flat line at the bottom of the plot. pipeline/report/dvc_plots.py
# generates the template (frozen while a study runs): the integrator adds this transform first there.
DROP_EMPTY = {"filter": "isValid(datum['<DVC_METRIC_Y>']) && datum['<DVC_METRIC_Y>'] !== ''"}


def drawn(tmp_path: Path, template: dict) -> dict[str, list[dict]]:
    """Every line ``dvc plots show`` draws from the committed reports/ data with ``template``, per plot."""
    repo = tmp_path / "plots"
    plots = yaml.safe_load((ROOT / "dvc.yaml").read_text())["plots"]
    files = {f for p in plots if isinstance(p, dict) for spec in p.values() for f in spec["y"]}
    for rel in ["dvc.yaml", "params.yaml", ".dvc/config", ".dvc/plots/offline.html", *sorted(files)]:
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, repo / rel)
    for folder in (p for p in plots if isinstance(p, str)):  # image plots (reports/figures): not drawn by vega
        (repo / folder).mkdir(parents=True, exist_ok=True)
    (repo / ".dvc/plots/arch_lines.json").write_text(json.dumps(template))
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    shown = json.loads(tiny_repo.dvc(repo, "plots", "show", "--json").stdout)
    assert "errors" not in shown, shown["errors"]
    specs = {title: views[0]["content"] for title, views in shown["data"].items()
             if views[0].get("type") == "vega"}
    assert len(specs) == len(files)  # one per CSV plot of dvc.yaml
    (repo / "specs.json").write_text(json.dumps(specs))
    proc = subprocess.run(["node", str(DRAW), str(repo / ".dvc/plots/offline.html"), str(repo / "specs.json")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


class DrawnWithoutData(AssertionError):
    """Lines drawn through points that have no number."""


def without_data(lines: dict[str, list[dict]]) -> list[str]:
    """``plot: series`` of each line drawn through a point that has no number."""
    def number(v) -> bool:
        try:
            return float(v) == float(v)
        except (TypeError, ValueError):
            return False
    return [f"{title}: {line['series']}" for title, found in lines.items() for line in found
            if not all(number(y) for _, y, _ in line["points"])]


def series_with_data() -> dict[str, set[str]]:
    """Per plot file, the series its committed CSV has at least one number for (the declared columns, or the
    long table's ``series`` column)."""
    import pandas as pd

    out = {}
    for p in yaml.safe_load((ROOT / "dvc.yaml").read_text())["plots"]:
        if not isinstance(p, dict):
            continue
        ((title, spec),) = p.items()
        ((path, cols),) = spec["y"].items()
        table = pd.read_csv(ROOT / path)
        out[title] = (set(table.dropna(subset=[cols]).series) if isinstance(cols, str)
                      else {c for c in cols if table[c].notna().any()})
    return out


needs_node = pytest.mark.skipif(shutil.which("node") is None, reason="needs node (apt-get install nodejs)")


@pytest.mark.slow  # runs dvc and node (seconds)
@needs_node
def test_the_drop_empty_filter_draws_every_series_with_data_and_no_other(tmp_path):
    template = json.loads((ROOT / ".dvc/plots/arch_lines.json").read_text())
    template["transform"] = [DROP_EMPTY, *template["transform"]]
    lines = drawn(tmp_path, template)
    assert without_data(lines) == []
    assert {t: {ln["series"] for ln in found} for t, found in lines.items()} == series_with_data()


@pytest.mark.slow
@needs_node
def test_dvc_plots_draw_no_series_without_data(tmp_path):
    lines = drawn(tmp_path, json.loads((ROOT / ".dvc/plots/arch_lines.json").read_text()))
    assert lines and all(lines.values())
    if bad := without_data(lines):
        raise DrawnWithoutData(bad)
