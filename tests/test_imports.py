"""The package's import structure, read statically (``ast``) from every ``pipeline/**/*.py``: imports sit at the
top of their module, except the heavy libraries in :data:`LAZY`, and no pipeline module imports itself through
others (docs/design.md §6, "Layers")."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pipeline"

# Imported inside functions on purpose (docs/design.md §6, "Layers"): seconds of import that a module needs only on
# some paths (`bias --help`, a stage's input checks, the stage process that never fits): torch, Lightning, timm,
# MLflow and the libraries its store errors come from, matplotlib, Dask; and the training stack as a whole
# (pipeline.experiment, and pipeline.learner, which imports Lightning), which a training stage imports after its
# worker pool has started, so the workers import it meanwhile.
LAZY = ("torch", "torchvision", "lightning", "timm", "mlflow", "requests", "sqlalchemy", "matplotlib", "dask",
        "distributed", "pipeline.experiment", "pipeline.learner")

# Modules owned by work not merged yet that still import inside functions (config package, families, the
# position study, tasks, provenance): empty this once they are untangled.
NOT_YET_UNTANGLED = {"pipeline/interface/study.py", "pipeline/resolution.py",
                     "pipeline/tasks/natural.py", "pipeline/tasks/preview.py"}


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
    it sits (an ``if`` at the top, e.g. ``if TYPE_CHECKING:``, counts as the top)."""
    paths = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    out = {}
    for module, path in paths.items():
        tree = ast.parse(path.read_text(), str(path))
        top = {id(n) for n in tree.body} | {id(n) for n in tree.body if isinstance(n, ast.If) for n in n.body}
        out[module] = (path, [(n.lineno, id(n) in top, named(n, module, path.name == "__init__.py", set(paths)))
                              for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))])
    return out


def lazy(name: str) -> bool:
    return any(name == m or name.startswith(f"{m}.") for m in LAZY)


def test_imports_sit_at_the_top_unless_heavy():
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}: {name}"
             for path, rows in imports().values() if str(path.relative_to(PACKAGE.parent)) not in NOT_YET_UNTANGLED
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
