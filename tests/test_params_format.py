"""params.yaml in DVC's form: a `dvc exp run -S` edit (DVC's own writer, in process) changes exactly one line; each
profile (params.yaml with its overlay profiles/<name>.yaml laid over it) is the study it says it is."""

import difflib
import subprocess
from pathlib import Path

import pytest
import yaml
from dvc.utils.hydra import apply_overrides

from bench.params_format import dvc_form, main
from pipeline import profiles
from pipeline.config import load_params

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ("params.yaml", *(f"{profiles.DIR}/{name}.yaml" for name in profiles.names(ROOT)))


def changed_lines(before: str, after: str) -> list[str]:
    diff = difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
    return [line for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---")]


@pytest.fixture
def formatted(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text(dvc_form((ROOT / "params.yaml").read_text()))
    return path


def test_format_keeps_values_and_comments(formatted):
    original = (ROOT / "params.yaml").read_text()
    text = formatted.read_text()
    assert yaml.safe_load(text) == yaml.safe_load(original)
    comments = [line.split("#", 1)[1].strip() for line in original.splitlines() if "#" in line]
    missing = [c for c in comments if c not in text]
    assert not missing, f"comments lost by the rewrite: {missing}"
    assert dvc_form(text) == text, "the DVC form is not a fixed point"


@pytest.mark.parametrize("override", ["models.vit.depth=2", "train.recipe.lr=0.003", "seed=3"])
def test_set_param_is_one_line_diff(formatted, override):
    before = formatted.read_text()
    apply_overrides(formatted, [override])  # what `dvc exp run -S` runs on params.yaml
    lines = changed_lines(before, formatted.read_text())
    assert len(lines) == 2, f"-S {override} changed more than one line:\n" + "\n".join(lines)
    key, value = override.split("=")
    assert lines[1][1:].split("#")[0].strip() == f"{key.rsplit('.', 1)[-1]}: {value}"


def test_check_flag(tmp_path, formatted, capsys):
    assert main([str(formatted), "--check"]) == 0
    raw = tmp_path / "raw.yaml"
    raw.write_text("a: [1, 2]   # a list\n")
    assert main([str(raw), "--check"]) == 1
    assert main([str(raw)]) == 0 and raw.read_text().split() == ["a:", "#", "a", "list", "-", "1", "-", "2"]
    assert main([str(tmp_path / "missing.yaml")]) == 2


def test_committed_params_are_in_dvc_form():
    """params.yaml is what `dvc exp run -S` would write back: an -S edit is a one-line diff (the profiles are
    overlays composed onto it, never edited by DVC)."""
    assert main([str(ROOT / "params.yaml"), "--check"]) == 0


def _profile(name: str) -> dict:
    """The composed params of ``profiles/<name>.yaml``, validated (a ConfigError names the overlay and key)."""
    profiles.load(ROOT / profiles.DIR / f"{name}.yaml")
    return profiles.compose(ROOT / profiles.DIR / f"{name}.yaml")


def _outside(doc: dict, grid: set[str], distill: set[str]) -> tuple[dict, dict, dict]:
    """What a profile must share with params.yaml: everything but the grid keys of train and distill, and
    its MLflow experiments' prefix (its own, so `bias profile` keeps its runs apart: checked below)."""
    tracking = {k: v for k, v in doc["tracking"].items() if k != "experiment_prefix"}
    # plan.max_seeds sizes the second look to the profile's seeds (the quick one has none)
    shared = {k: v for k, v in doc.items() if k not in ("train", "distill", "tracking", "plan")}
    return (shared | {"tracking": tracking},
            {k: v for k, v in doc["train"].items() if k not in grid},
            {k: v for k, v in doc["distill"].items() if k not in distill})


def test_large_profile_validates_and_differs_only_in_the_grid():
    """The large profile: the same study with more cells; every other key follows params.yaml."""
    base, large = yaml.safe_load((ROOT / "params.yaml").read_text()), _profile("large")
    grid, distill = {"seeds", "archs", "grids"}, {"tasks"}
    assert _outside(large, grid, distill) == _outside(base, grid, distill)
    assert len(large["train"]["seeds"]) >= 10
    assert large["tracking"]["experiment_prefix"] == "bias-large" != base["tracking"]["experiment_prefix"]
    assert _runs("params.yaml") < _runs("profiles/large.yaml")  # every default cell, and more


def _runs(name: str) -> set[Path]:
    """Every run a profile trains (teachers, main grid, grids, students), by its output folder."""
    from pipeline.grid import Folders, teacher_specs, train_specs

    params, at = profiles.load(ROOT / name), Folders(Path("tasks"), Path("slices"), Path("runs"), Path("ckpt"),
                                                   Path("teachers"))
    return {s.out_dir for s in [*train_specs(params, at), *teacher_specs(params, at)]}


def test_quick_profile_is_the_default_with_fewer_cells():
    """The quick profile: the default's architectures on a subset of its cells; every other key follows it."""
    base, quick = yaml.safe_load((ROOT / "params.yaml").read_text()), _profile("quick")
    grid, distill = {"seeds", "archs", "grids"}, {"tasks"}
    assert _outside(quick, grid, distill) == _outside(base, grid, distill)
    # the default's first look at most, with no extra axes
    assert set(quick["train"]["seeds"]) <= set(base["train"]["seeds"]) and not quick["train"]["grids"]
    assert quick["plan"]["max_seeds"] <= len(quick["train"]["seeds"]) < base["plan"]["max_seeds"]  # one look
    assert quick["tracking"]["experiment_prefix"] == "bias-quick"
    assert set(quick["distill"]["tasks"]) <= set(base["distill"]["tasks"])
    archs, base_archs = quick["train"]["archs"], base["train"]["archs"]
    assert list(archs) == list(base_archs)  # every architecture, each on some of its default tasks
    for arch, spec in archs.items():
        assert {**spec, "tasks": None} == {**base_archs[arch], "tasks": None}, arch
        assert spec["tasks"] and set(spec["tasks"]) <= set(base_archs[arch]["tasks"]), arch
    assert _runs("profiles/quick.yaml") < _runs("params.yaml")


def test_tasks_profile_is_the_quick_one_on_the_redesigned_tasks():
    """The tasks profile: the quick one on alignment, scale and relation only (issue 27's redesigns). It is the
    record of reports/tasks/, so its cells stay as they ran: every arch on every redesigned task it trained on
    then, including the relation cells the default has since dropped (docs/methods.md)."""
    quick, tasks = _profile("quick"), _profile("tasks")
    kept = ["alignment", "scale", "relation"]
    assert tasks["tasks"]["names"] == kept and tasks["tracking"]["experiment_prefix"] == "bias-tasks"
    expect = yaml.safe_load(yaml.safe_dump(quick))
    expect["tasks"]["names"] = kept
    expect["tracking"]["experiment_prefix"] = "bias-tasks"
    expect["evaluation"]["resolution"]["tasks"] = [t for t in quick["evaluation"]["resolution"]["tasks"] if t in kept]
    expect["train"]["archs"] = tasks["train"]["archs"]
    expect["distill"]["tasks"] = tasks["distill"]["tasks"]
    assert tasks == expect
    assert set(tasks["distill"]["tasks"]) <= set(kept)
    for arch, spec in tasks["train"]["archs"].items():
        assert spec["tasks"] and set(spec["tasks"]) <= set(kept), arch
        if arch in quick["train"]["archs"]:  # the quick profile's cells on these tasks are all here
            assert {t for t in quick["train"]["archs"][arch]["tasks"] if t in kept} <= set(spec["tasks"]), arch


def committed(tmp_path: Path, rel: str) -> Path:
    """``rel`` as the checkout's HEAD commits it, not as the working tree has it: a legitimate ``make repro`` on
    another machine rewrites the study's outputs, and a test must not depend on results a rerun may change."""
    try:
        text = subprocess.run(["git", "show", f"HEAD:{rel}"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"{rel}: needs the committed version (git show HEAD:{rel}), and this is not a git checkout")
    (tmp_path / Path(rel).name).write_text(text)
    return tmp_path / Path(rel).name


def test_large_profile_gives_every_inconclusive_row_its_seeds(tmp_path, capsys):
    """The large profile trains, for every inconclusive row of the committed ledger within ``report.max_seeds``,
    the seeds its power calculation asks for, on every arm (bench/seed_plan.py; `--write` updates the overlay)."""
    from bench import seed_plan

    ledger, large = committed(tmp_path, "reports/tables/ledger.csv"), ROOT / "profiles/large.yaml"
    assert seed_plan.main(["--ledger", str(ledger), "--params", str(large), "--check"]) == 0, capsys.readouterr().out


def test_seed_plan_writes_an_overlay_s_power_grids_and_nothing_else(tmp_path):
    """``--write`` on an overlay replaces its power_* grids (flow style, comments kept): the committed large
    profile is its own fixed point on the committed ledger, and a stale grid is dropped."""
    from bench import seed_plan

    ledger = committed(tmp_path, "reports/tables/ledger.csv")
    (tmp_path / "profiles").mkdir()
    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    overlay, committed_text = tmp_path / "profiles/large.yaml", (ROOT / "profiles/large.yaml").read_text()
    overlay.write_text(committed_text.replace("  grids: !replace\n", "  grids: !replace\n"
                                              "    power_stale: {archs: [vit], tasks: [scale], seeds: [0, 1]}\n"))
    assert seed_plan.main(["--ledger", str(ledger), "--params", str(overlay), "--write"]) == 0
    assert overlay.read_text() == committed_text


def test_seed_plan_counts_each_arm_and_writes_what_is_missing(tmp_path):
    import pandas as pd

    from bench import seed_plan
    from pipeline.config import load_params

    ledger = pd.DataFrame([  # a paired row short of seeds, a floor row, one out of reach, one decided
        {"id": "natural.resnet_vs_vit.natural", "kind": "paired", "task": "natural", "a": "resnet", "b": "vit",
         "verdict": "inconclusive", "seeds_needed": 12, "needs_seeds": "12"},
        {"id": "floor.nomix.scale", "kind": "floor", "task": "scale", "a": "nomix", "b": "floor",
         "verdict": "inconclusive", "seeds_needed": 7, "needs_seeds": "7"},
        {"id": "arrangement.sincos.arrangement", "kind": "paired", "task": "arrangement", "a": "vit_sincos",
         "b": "vit", "verdict": "inconclusive", "seeds_needed": None, "needs_seeds": ">200"},
        {"id": "alignment.stride.alignment", "kind": "paired", "task": "alignment", "a": "resnet_s1", "b": "resnet",
         "verdict": "held", "seeds_needed": None, "needs_seeds": None},
        # a student trains on train.seeds: no grid can give its row seeds (nor its partner, uselessly)
        {"id": "distill.transfer.scale", "kind": "paired", "task": "scale", "a": "deit_transfer", "b": "deit_labels",
         "verdict": "inconclusive", "seeds_needed": 20, "needs_seeds": "20"}])
    (tmp_path / "ledger.csv").write_text(ledger.to_csv(index=False))
    profile = tmp_path / "params.yaml"
    profile.write_text((ROOT / "params.yaml").read_text())  # 3 seeds per main cell (the first look)
    table = seed_plan.plan(ledger, load_params(profile)).set_index("id")
    assert table.loc["natural.resnet_vs_vit.natural", ["needed", "given", "missing"]].tolist() == [12, 3, 9]
    assert table.loc["floor.nomix.scale", "missing"] == 4 and pd.isna(table.loc["arrangement.sincos.arrangement",
                                                                                    "missing"])
    args = ["--ledger", str(tmp_path / "ledger.csv"), "--params", str(profile)]
    assert seed_plan.main([*args, "--check"]) == 1
    assert seed_plan.main([*args, "--write"]) == 0 and seed_plan.main([*args, "--check"]) == 0
    grids = load_params(profile).train.grids
    assert {g for g in grids if g.startswith("power_")} == {"power_resnet_natural", "power_vit_natural",
                                                            "power_nomix_scale"}
    assert grids["power_resnet_natural"].seeds == list(range(12))
    assert main([str(profile), "--check"]) == 0  # still in the form DVC writes


def _figure_archs() -> dict[str, set[str]]:
    """task -> the archs a per-factor plot of dvc.yaml draws (the plot CSV's name says its task)."""
    out: dict[str, set[str]] = {}
    for entry in yaml.safe_load((ROOT / "dvc.yaml").read_text())["plots"]:
        for spec in (entry.values() if isinstance(entry, dict) else []):
            for csv, cols in (spec.get("y") or {}).items():
                if isinstance(cols, list):
                    out.setdefault(Path(csv).stem.split("_")[1], set()).update(cols)
    return out


@pytest.mark.parametrize("profile", PROFILES)
def test_every_main_grid_cell_has_a_reader(profile):
    # A cell that no ledger row, budget row or per-factor figure reads costs seeds and decides nothing: drop it
    # from train.archs or give it a row (pipeline/report/contrasts.csv).
    from pipeline.report.contrasts import cell_readers

    readers = cell_readers(profiles.load(ROOT / profile), _figure_archs())
    assert not sorted(cell for cell, who in readers.items() if not who)


def test_seed_plan_never_asks_for_the_tune_seed():
    # tune.seed is the trials' own seed: a power grid that trained it would be refused by the params schema
    from bench import seed_plan

    params = load_params(ROOT / "params.yaml")
    seeds = seed_plan.training_seeds(params, params.tune.seed + 2)
    assert params.tune.seed not in seeds and len(seeds) == params.tune.seed + 2 == len(set(seeds))


def test_every_plotted_column_exists_in_every_profile():
    # A y column dvc.yaml lists but a plot CSV lacks makes DVC draw that plot blank; the report writes a column
    # for every architecture of the table and every configured student, so the lists may name only those.
    from pipeline.archs import ARCHS

    figures = _figure_archs()
    assert set().union(*figures.values())
    for profile in PROFILES:  # a plot of a task the profile does not run is blank by rights
        params = profiles.load(ROOT / profile)
        listed = set().union(*(cols for task, cols in figures.items() if task in params.tasks.names))
        columns = set(ARCHS) | set(params.distill.students)
        assert sorted(listed - columns) == [], profile
