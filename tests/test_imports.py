"""The package's import structure, read statically (``ast``) from every ``pipeline/**/*.py``: imports sit at the
top of their module, except the heavy libraries in :data:`LAZY`; no pipeline module imports itself through others;
each imports only modules placed before it in :data:`LAYERS`, the picture of docs/design.md §6, "Layers"; and no
module grows past :data:`MAX_LINES` (one job per module)."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pipeline"
DESIGN = PACKAGE.parent / "docs" / "design.md"

# Imported inside functions on purpose (docs/design.md §6, "Layers"): seconds of import that a module needs only on
# some paths (`bias --help`, a stage's input checks, the stage process that never fits): torch, Lightning, timm,
# MLflow and the libraries its store errors come from, matplotlib, Dask; and the training stack as a whole
# (pipeline.experiment, and pipeline.learner, which imports Lightning), which a training stage imports after its
# worker pool has started, so the workers import it meanwhile; the families (torch and timm), whose step costs
# the report's seed plan reads; the fine-tuning (torch and timm), which the finetune stage needs only with tasks;
# and provenance (it builds models), which a run's input checks need only once they read a teacher.
LAZY = ("torch", "torchvision", "lightning", "timm", "mlflow", "requests", "sqlalchemy", "matplotlib", "dask",
        "distributed", "pipeline.experiment", "pipeline.learner", "pipeline.families", "pipeline.finetune",
        "pipeline.provenance")

MAX_LINES = 500  # a module this long holds more than one job: split it along its seams

# The layer picture of docs/design.md §6, in reading order: a module imports only modules before it (the layers
# above, and those to its left on its own layer). ``name/`` is a whole package, one place (its modules import each
# other freely: a new family or task module needs no line here); ``pkg/mod`` is one module. The inits of packages
# listed module by module (``pipeline``, ``report``) come before everything: they may import nothing of the package.
LAYERS = (
    ("params and data", ("errors", "io", "schemas", "repository", "environment", "shapes", "sections", "archs",
                         "tasks/", "config/", "profiles", "families/",
                         "slicing")),
    ("which runs", ("grid", "tune")),
    ("one run's code", ("meta_device", "split", "predict", "models", "budget", "resolution", "subgroups",
                        "provenance", "learner", "evaluation")),
    ("around the runs", ("run_inputs", "pruning", "trained", "executor", "mlflow_store", "mlflow_models", "tracking",
                         "live_runs", "experiment")),
    ("beside the runs", ("shortcut_bags", "shortcuts", "interface/", "finetune")),
    ("the report", tuple(f"report/{m}" for m in (
        "sources", "sequential", "stats", "aggregate", "cells", "inputs", "learnability", "contrasts", "gate",
        "measure", "ledger", "seeds", "markdown", "figures", "dvc_plots", "natural", "finetune", "collisions",
        "pages"))),
    ("entry points", ("stages/", "pair", "cli", "readme")),
)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def named(node: ast.Import | ast.ImportFrom, module: str, package: bool, modules: set[str]) -> list[str]:
    """The modules an import statement loads: ``from a import b`` loads ``a.b`` where that is a module, else ``a``."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = module if package else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        base = base.rpartition(".")[0]
    source = node.module if not node.level else ".".join(filter(None, [base, node.module]))
    return list(dict.fromkeys(f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source
                              for a in node.names))


def imports() -> dict[str, tuple[Path, list[tuple[int, bool, list[str]]]]]:
    """``module -> (its file, [(line, at the top, modules loaded)])`` for every import of the package, wherever
    it sits (an ``if`` at the top counts as the top). Imports under ``if TYPE_CHECKING:`` never run: annotations
    only, left out."""
    paths = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    out = {}
    for module, path in paths.items():
        tree = ast.parse(path.read_text(), str(path))
        top = {id(n) for n in tree.body} | {id(n) for n in tree.body if isinstance(n, ast.If) for n in n.body}
        typing = {id(n) for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
                  for n in n.body}
        out[module] = (path, [(n.lineno, id(n) in top, named(n, module, path.name == "__init__.py", set(paths)))
                              for n in ast.walk(tree)
                              if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in typing])
    return out


def lazy(name: str) -> bool:
    return any(name == m or name.startswith(f"{m}.") for m in LAZY)


def test_imports_sit_at_the_top_unless_heavy():
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}: {name}"
             for path, rows in imports().values()
             for line, at_top, names in rows for name in names if not at_top and not lazy(name)]
    assert not found, "imports inside functions (move them to the top, or add the library to LAZY):\n" + \
        "\n".join(found)


def test_no_import_cycle():
    found = imports()  # every import, in functions too: a deferred one would hide a cycle until it runs
    graph = {module: {name for _, _, names in rows for name in names if name in found and name != module}
             for module, (_, rows) in found.items()}
    cycles, state = [], {}  # state: 1 on the current path, 2 done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for nxt in sorted(graph[module]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*path[path.index(nxt):], nxt]))
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles among pipeline modules:\n" + "\n".join(cycles)


def test_the_check_sees_a_cycle_and_an_inner_import(tmp_path, monkeypatch):
    """The two checks above fail where they should: on a toy package with one of each."""
    pkg = tmp_path / "pipeline"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pipeline import b\n")
    (pkg / "b.py").write_text("def f():\n    from pipeline.a import x\n    import json\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", pkg)
    rows = imports()
    assert rows["pipeline.b"][1] == [(2, False, ["pipeline.a"]), (3, False, ["json"])]
    for check in (test_no_import_cycle, test_imports_sit_at_the_top_unless_heavy):
        try:
            check()
        except AssertionError as err:
            assert "pipeline.a" in str(err) or "pipeline/b.py:2" in str(err)
        else:
            raise AssertionError(f"{check.__name__} passed on a package with a cycle and an inner import")


def places(layers, modules) -> tuple[dict[str, tuple[int, int, str]], list[str]]:
    """``module -> (layer, place on it, the picture's token)`` for every module, and what is wrong with the
    picture (a module placed nowhere or twice, a token naming no module)."""
    tokens = [(i, j, t) for i, (_, names) in enumerate(layers) for j, t in enumerate(names)]

    def covers(token: str, module: str) -> bool:
        name = "pipeline." + token.rstrip("/").replace("/", ".")
        return module == name or token.endswith("/") and module.startswith(name + ".")

    out, problems = {}, []
    for module in sorted(modules):
        found = [t for t in tokens if covers(t[2], module)]
        inside = module.removeprefix("pipeline").lstrip(".").replace(".", "/")
        listed_inside = modules[module].name == "__init__.py" and any(
            t.startswith(f"{inside}/" if inside else "") for *_, t in tokens)
        if len(found) == 1:
            out[module] = found[0]
        elif not found and listed_inside:  # the init of a package listed module by module
            out[module] = (-1, -1, "")
        else:
            where = f"placed {len(found)} times ({', '.join(t[2] for t in found)})" if found else "placed nowhere"
            problems.append(f"{modules[module].relative_to(PACKAGE.parent)}: {where} in LAYERS")
    problems += [f"LAYERS: {t!r} names no module of pipeline/" for *_, t in tokens
                 if not any(covers(t, m) for m in modules)]
    return out, problems


def misplaced(layers, found) -> list[str]:
    """Every import (in functions too) of a pipeline module placed at or after the importer, outside its package."""
    where, _ = places(layers, {m: path for m, (path, _) in found.items()})

    def one_package(a: str, b: str) -> bool:  # two modules of a package placed whole (``name/``)
        return a == b and a.endswith("/")

    def label(module: str) -> str:
        layer, _, token = where[module]
        return f"{layers[layer][0]}: {token}" if token else "a package init, before every layer"

    return [f"{path.relative_to(PACKAGE.parent)}:{line}: imports {name} ({label(name)}), which the picture places "
            f"after it ({label(module)})"
            for module, (path, rows) in found.items() if module in where
            for line, _, names in rows for name in names if name in where and name != module
            if where[name][:2] >= where[module][:2] and not one_package(where[name][2], where[module][2])]


def picture(text: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The layers of the fenced block after "**Layers.**": a line naming a layer in its first 19 columns starts
    one, an indented line continues it; parenthesised notes and arrows are dropped."""
    block = text.split("**Layers.**", 1)[1].split("```\n", 2)[1]
    layers = []
    for line in block.splitlines():
        name, rest = line[:19].strip(), re.sub(r"\([^)]*\)", " ", line[19:])
        if name:
            layers.append((name, []))
        layers[-1][1].extend(re.findall(r"[\w/]+", rest))
    return tuple((name, tuple(tokens)) for name, tokens in layers)


def test_every_module_has_one_place_in_the_layers():
    _, problems = places(LAYERS, {m: path for m, (path, _) in imports().items()})
    assert not problems, "\n".join(problems)


def test_imports_follow_the_layers():
    found = misplaced(LAYERS, imports())
    assert not found, "imports against the layer picture (docs/design.md §6, LAYERS here):\n" + "\n".join(found)


def test_the_design_picture_is_the_layers():
    assert picture(DESIGN.read_text()) == LAYERS, "docs/design.md §6's layer picture differs from LAYERS"


def test_the_layer_checks_see_a_misplaced_import_and_an_unplaced_module(tmp_path, monkeypatch):
    """On a toy package: a lower module importing a higher one, a module missing from the picture, a package's
    modules importing each other, and a picture parsed back from its text."""
    pkg = tmp_path / "pipeline"
    (pkg / "fam").mkdir(parents=True)
    for name, text in {"__init__.py": "", "low.py": "from pipeline import high\n", "high.py": "import pipeline.low\n",
                       "stray.py": "", "fam/__init__.py": "from pipeline.fam import a\n",
                       "fam/a.py": "from pipeline import low\n"}.items():
        (pkg / name).write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", pkg)
    layers = (("base", ("low", "fam/")), ("top", ("high",)))
    found = imports()
    assert misplaced(layers, found) == [
        "pipeline/low.py:1: imports pipeline.high (top: high), which the picture places after it (base: low)"]
    assert places(layers, {m: p for m, (p, _) in found.items()})[1] == ["pipeline/stray.py: placed nowhere in LAYERS"]
    text = ("**Layers.** words\n```\nbase               low (note)  fam/\n"
            "                   -> more\ntop                high\n```\n")
    assert picture(text) == (("base", ("low", "fam/", "more")), ("top", ("high",)))


def test_no_module_is_over_the_line_limit():
    long = {p.relative_to(PACKAGE.parent).as_posix(): n for p in sorted(PACKAGE.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines (split along the module's seams): {long}"
