"""The strict params loader, the worker-only limits checked with the params, and JSON files read with a shape
(pipeline.config.load_params, Params._worker_limits, pipeline.io.read_json). No workspace: each test is ms."""

from __future__ import annotations

import ast
import copy
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import tiny_repo
import yaml

from pipeline import schemas
from pipeline.config import SEED_MAX, load_params, parse_params
from pipeline.errors import ConfigError, StageError
from pipeline.io import read_json
from pipeline.report.sources import read_metrics

ROOT = Path(__file__).resolve().parents[1]


def loaded(tmp_path: Path, text: str | bytes):
    path = tmp_path / "p.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return load_params(path)


def test_repository_params_load_with_the_strict_loader():
    load_params(ROOT / "params.yaml")  # no duplicate key, UTF-8, within every worker limit


def test_duplicate_key_names_the_key_and_both_lines(tmp_path):
    with pytest.raises(ConfigError, match=r"p\.yaml: duplicate key 'b' at lines 2 and 4$"):
        loaded(tmp_path, "a:\n  b: 1\n  c: 2\n  b: 3\n")


def test_merge_key_override_is_not_a_duplicate(tmp_path):
    # YAML's `<<` lets a mapping override what it merges: refused only later, by the schema (unknown keys)
    with pytest.raises(ConfigError, match="unknown key|missing") as err:
        loaded(tmp_path, "base: &b {k: 1}\nc:\n  <<: *b\n  k: 2\n")
    assert "duplicate" not in str(err.value)


@pytest.mark.parametrize(("content", "needle"), [
    (b"\xff\xfes\x00e\x00", "UTF-16"), (b"seed: 0\x00\n", "NUL bytes"), (b"seed: \xe9\n", "not UTF-8 text (byte 6)"),
    ("[" * 5000, "malformed YAML"),
])
def test_undecodable_params_are_one_line_naming_the_file(tmp_path, content, needle):
    with pytest.raises(ConfigError, match="p.yaml") as err:
        loaded(tmp_path, content)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_directory_and_missing_params(tmp_path):
    with pytest.raises(ConfigError, match="not a file"):
        load_params(tmp_path)
    with pytest.raises(ConfigError, match="file not found"):
        load_params(tmp_path / "nope.yaml")


def test_every_stage_loads_params_through_load_params():
    """No stage parses a params file itself: each calls parse_stage (-> load_params) or load_params, and only
    stage_names (a progress line, never fatal) reads YAML directly."""
    for module in sorted((ROOT / "pipeline/stages").glob("*.py")):
        tree = ast.parse(module.read_text())
        calls = {n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
                 for n in ast.walk(tree) if isinstance(n, ast.Call)}
        if "stage_main" in {getattr(d, "id", "") for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                            for d in f.decorator_list}:
            assert calls & {"parse_stage", "load_params"}, module.name
        direct = [n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                  and getattr(n.func.value, "id", "") == "yaml"]
        assert not direct or module.name == "common.py", (module.name, direct)


def tiny(**changes) -> dict:
    params = tiny_repo.params_with()
    for key, value in changes.items():
        *parents, last = key.split("__")
        node = params
        for k in parents:
            node = node[k]
        node[last] = value
    return params


def test_limits_are_inclusive():
    base = tiny()
    smallest = min(base["train"]["size"], *(s for g in base["train"]["grids"].values() for s in g.get("sizes", [])))
    parse_params(tiny(train__recipe__batch_size=smallest, seed=SEED_MAX, distill__teacher_seeds=[SEED_MAX],
                      train__seeds=[0, SEED_MAX]))
    with pytest.raises(ConfigError, match="train.recipe.batch_size"):
        parse_params(tiny(train__recipe__batch_size=smallest + 1))


def test_teacher_set_ignored_without_teachers():
    raw = tiny(slice__train_sizes=[64, 128, 160], distill__teacher_size=160, train__recipe__batch_size=40)
    with pytest.raises(ConfigError, match="distill.teacher_size - train.size = 32"):
        parse_params(copy.deepcopy(raw))
    raw["distill"].update(teachers={}, students={})
    parse_params(raw)


SHAPE = {"task": str, "seed": int, "acc": float, "sha256.images": str}


@pytest.mark.parametrize(("content", "message"), [
    (None, "m.json: missing"),
    (b"{", "m.json: not JSON (Expecting property name enclosed in double quotes at line 1)"),
    (b"\xff\x00\x01", "m.json: not JSON ("),
    (b"[1, 2]", "m.json: should hold a JSON object (a mapping), not a list"),
    (b'{"task": "a", "seed": 0, "acc": 0.5}', "m.json: missing key 'sha256'"),
    (b'{"task": "a", "seed": 0, "acc": 0.5, "sha256": []}', "m.json: 'sha256' should be a mapping"),
    (b'{"task": "a", "seed": 0, "acc": 0.5, "sha256": {}}', "m.json: missing key 'sha256.images'"),
    (b'{"task": "a", "seed": true, "acc": 0.5, "sha256": {"images": "x"}}',
     "m.json: 'seed' should be an integer, not true or false"),
    (b'{"task": "a", "seed": 0, "acc": null, "sha256": {"images": "x"}}', "m.json: 'acc' should be a number, not null"),
    (b'{"task": "a", "seed": 0, "acc": NaN, "sha256": {"images": "x"}}',
     "m.json: 'acc' should be a finite number, not nan"),
    (b'{"task": "a", "seed": 0, "acc": -Infinity, "sha256": {"images": "x"}}',
     "m.json: 'acc' should be a finite number, not -inf"),
])
def test_read_json_refuses_each_shape_in_one_line(tmp_path, content, message):
    path = tmp_path / "m.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(StageError) as err:
        read_json(path, SHAPE)
    assert str(err.value).startswith(str(tmp_path / message)) and "\n" not in str(err.value), err.value


@pytest.mark.parametrize("reader", ["json", "params", "hash", "store"])
def test_a_fifo_in_place_of_an_input_is_one_line_not_a_hang(tmp_path, reader):
    """A named pipe with no writer blocks open() for good: every reader checks the kind of file first (the MLflow
    store too: sqlite would block opening it)."""
    import os

    from pipeline.io import sha256_file
    from pipeline.mlflow_store import check_store

    path = tmp_path / "meta.json"
    os.mkfifo(path)
    store = parse_params(tiny_repo.params_with({"tracking": {"tracking_uri": f"sqlite:///{path}"}}))
    read = {"json": lambda: read_json(path), "params": lambda: load_params(path), "hash": lambda: sha256_file(path),
            "store": lambda: check_store(store)}
    with pytest.raises((StageError, ConfigError), match=r"meta.json: not a file \(a FIFO \(named pipe\); reading"):
        read[reader]()


def test_wildcard_fields_are_checked_under_every_entry(tmp_path):
    path = tmp_path / "floors.json"
    good = {"chance": 0.5, "floor": 0.6, "floor_baseline": "a",
            "baselines": {"a": {"acc": 0.6, "n": 64}, "b": {"acc": 0.5, "n": 64}}}
    path.write_text(json.dumps(good))
    assert read_json(path, schemas.SHORTCUT_FLOORS) == good
    path.write_text(json.dumps({**good, "baselines": {"a": {"acc": 0.6, "n": 64}, "b": {"acc": "0.3", "n": 64}}}))
    with pytest.raises(StageError, match=r"'baselines.b.acc' should be a number in \[0, 1\], not a string"):
        read_json(path, schemas.SHORTCUT_FLOORS)


def test_an_output_where_no_folder_can_be_made_is_one_line():
    """``/proc`` makes no folders (mkdir says not found): the user's path, not a traceback."""
    from pipeline.io import write_text

    with pytest.raises(StageError, match=r"cannot write /proc/bias-nowhere: no folder can be made there"):
        write_text("/proc/bias-nowhere/validated.txt", "x")


def test_read_json_returns_the_mapping(tmp_path):
    rec = {"task": "a", "seed": 1, "acc": 1, "sha256": {"images": "x"}, "extra": [1]}
    (tmp_path / "m.json").write_text(json.dumps(rec))
    assert read_json(tmp_path / "m.json", SHAPE) == rec
    with pytest.raises(StageError, match=r"not a file \(a folder\)"):
        read_json(tmp_path, SHAPE)


@pytest.mark.parametrize(("metrics", "message"), [
    ({"task": "alignment", "arch": "vit", "seed": 0, "train_size": 128}, "missing key 'test_acc'"),
    ({"task": "alignment", "arch": "vit", "seed": "0", "train_size": 128, "test_acc": 0.5},
     "'seed' should be an integer, not a string"),
    ([], "should hold a JSON object"),
    ({"task": "alignment", "arch": "vit", "seed": 0, "train_size": 128, "test_acc": 1.7},
     "'test_acc' should be a number in \\[0, 1\\], not 1.7"),
    ({"task": "alignment", "arch": "vit", "seed": 0, "train_size": 128, "test_acc": float("nan")},
     "'test_acc' should be a number in \\[0, 1\\], not nan"),
])
def test_report_refuses_metrics_of_the_wrong_shape(tmp_path, metrics, message):
    path = tmp_path / "vit/alignment/n128/metrics.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(metrics))
    with pytest.raises(StageError, match=message) as err:
        read_metrics(tmp_path, "runs")
    assert str(path) in str(err.value)


class JsonReaders(ast.NodeVisitor):
    """(function, line) of every json.load/json.loads call, named by its innermost function."""

    def __init__(self):
        self.stack, self.found = ["<module>"], []

    def visit_FunctionDef(self, node):
        self.stack.append(node.name)
        self.generic_visit(node)
        self.stack.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Call(self, node):
        f = node.func
        if isinstance(f, ast.Attribute) and getattr(f.value, "id", "") == "json" and f.attr in ("load", "loads"):
            self.found.append((self.stack[-1], node.lineno))
        self.generic_visit(node)


SHAPE_ARG = {"read_json": 1, "read_checked": 1, "read_new_lines": 2}  # reader -> position of its shape argument


def test_every_json_reader_checks_a_shape():
    """JSON is parsed in one place (io.read_json), and every call names a shape from pipeline.schemas: a new
    reader that parses on its own, or passes no shape, fails here."""
    shapes = {name for name in vars(schemas) if name.isupper()} | {"shape"}  # "shape": a wrapper's parameter
    parsers, unshaped = set(), []
    for module in sorted((ROOT / "pipeline").rglob("*.py")):
        tree, rel = ast.parse(module.read_text()), str(module.relative_to(ROOT))
        visitor = JsonReaders()
        visitor.visit(tree)
        parsers |= {(rel, name) for name, _ in visitor.found}
        for node in ast.walk(tree):
            name = getattr(node, "func", None) and getattr(node.func, "id", getattr(node.func, "attr", ""))
            if name in SHAPE_ARG and rel != "pipeline/io.py":
                at = SHAPE_ARG[name]
                given = node.args[at:at + 1] + [k.value for k in node.keywords if k.arg in ("shape", "required")]
                if not (given and isinstance(given[0], ast.Name) and given[0].id in shapes):
                    unshaped.append(f"{rel}:{node.lineno}")
    assert parsers == {("pipeline/io.py", "read_json"), ("pipeline/io.py", "read_new_lines")}, \
        "read JSON with pipeline.io.read_json(path, <shape>) or read_new_lines(path, offset, <shape>)"
    assert not unshaped, f"pass a shape from pipeline.schemas: {unshaped}"


@pytest.mark.parametrize("content", [b"[]", b'{"identity": 3, "mlflow_run_id": null}', b'{"mlflow_run_id": "x"}'])
def test_checkpoint_config_of_the_wrong_shape_is_discarded_in_one_line(tmp_path, capsys, content):
    """The checkpoint folder is the stage's scratch space: an untrusted config.json costs the run its
    checkpoint (it starts over), never a traceback."""
    from pipeline.experiment import prepare_ckpt

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_bytes(content)
    (ckpt / "last.ckpt").write_bytes(b"not trusted")
    assert prepare_ckpt(ckpt, "abc", "sqlite:///unused.db") == (None, None)
    assert list(ckpt.iterdir()) == []
    (line,) = capsys.readouterr().out.splitlines()
    assert str(ckpt / "config.json") in line and "discarded" in line


@pytest.mark.parametrize("content", [b"[]", b'{"identity": "abc"}', b"{"])
def test_metrics_that_are_not_a_finished_record_rerun_the_run(tmp_path, content):
    from types import SimpleNamespace

    from pipeline.experiment import WEIGHTS, finished

    (tmp_path / "metrics.json").write_bytes(content)
    (tmp_path / WEIGHTS).write_bytes(b"w")
    assert finished(SimpleNamespace(out_dir=tmp_path), "abc") is None


def test_interrupted_stage_is_one_line(capsys):
    from pipeline.stages.common import stage_main

    @stage_main
    def main(argv):
        raise KeyboardInterrupt

    assert main([]) == 130
    assert capsys.readouterr().err.splitlines() == [
        "error: interrupted (every output is written whole or not at all; rerun to finish)"]


def test_a_terminated_stage_ends_like_an_interrupted_one():
    """SIGTERM to a stage process (kill, timeout, a scheduler's stop) goes the Ctrl-C way: one line, its MLflow
    runs KILLED (stage_run treats it as KeyboardInterrupt), exit 143, instead of dying with runs RUNNING."""
    import subprocess

    code = ("import os, signal, time\n"
            "from pipeline.stages.common import stage_main\n"
            "@stage_main\n"
            "def main(argv):\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    time.sleep(30)\n"
            "raise SystemExit(main())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 143 and done.stderr.strip().splitlines()[-1] == (
        "error: terminated (every output is written whole or not at all; rerun to finish)")


def test_a_divergence_names_every_recipe_value_that_can_cause_it():
    from types import SimpleNamespace

    from pipeline.experiment import _diverged

    params = parse_params(tiny_repo.small_params())
    says = str(_diverged(FloatingPointError("loss is nan at step 3"), SimpleNamespace(lr=None), params))
    for key in ("train.recipe.lr", "train.recipe.weight_decay", "warmup_steps", "grad_clip"):
        assert key in says, says


@pytest.mark.parametrize(("override", "says"), [
    ({"interface": {"embed_dim": 2**20}}, "interface.embed_dim: 1048576 is too large"),
    ({"interface": {"pair_counts": {"extra_image_sizes": [2**24]}}},
     "interface.pair_counts.extra_image_sizes: 16777216 is too large"),
    ({"evaluation": {"resolution": {"sizes": [16, 2**20]}}}, "evaluation.resolution.sizes: 1048576 is too large"),
    ({"finetune": {"tasks": ["alignment"], "size": 2**16}}, "finetune.size: 65536 is too large"),
    ({"models": {"reference_classes": 10**9}}, "models.reference_classes: 1000000000 classes need a head larger"),
    ({"models": {"resnet": {"layers": [10**6]}}}, "models.resnet.layers: [1000000] are 1000000 blocks"),
])
def test_a_key_that_sizes_an_allocation_is_bounded_with_the_params(override, says):
    """Refused when the params are read, naming the key and the estimate, not as an allocator traceback or
    minutes of building inside a stage."""
    raw = tiny_repo.merge(yaml.safe_load((tiny_repo.ROOT / "params.yaml").read_text()), override)
    with pytest.raises(ConfigError, match=re.escape(says)):
        parse_params(raw)


def _forged(shape: tuple[int, ...]) -> bytes:
    """A .npy whose header declares ``shape`` of uint8 but holds 16 bytes."""
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "|u1", "fortran_order": False, "shape": shape})
    return buf.getvalue() + bytes(16)


def test_an_array_header_is_checked_against_its_bytes_before_anything_allocates(tmp_path):
    import zipfile

    from pipeline.io import checked_arrays

    ok = tmp_path / "ok.npy"
    ok.write_bytes(_forged((16,)))
    assert np.array_equal(np.load(checked_arrays(ok)), np.zeros(16, np.uint8))
    big = tmp_path / "images.npy"
    big.write_bytes(_forged((2**38,)))  # 256 GiB declared
    with pytest.raises(StageError, match=r"images.npy: unreadable \(its header declares \(274877906944,\) uint8"):
        checked_arrays(big)
    npz = tmp_path / "indices.npz"
    with zipfile.ZipFile(npz, "w") as z:
        z.writestr("test.npy", _forged((16,)))
        z.writestr("val.npy", _forged((2**38, 8)))
    with pytest.raises(StageError, match=r"indices.npz \(val.npy\): unreadable \(its header declares"):
        checked_arrays(npz)
    pickled = tmp_path / "labels.npy"
    np.save(pickled, np.array([1, "a"], dtype=object), allow_pickle=True)
    with pytest.raises(StageError, match="labels.npy: an object array"):
        checked_arrays(pickled)
