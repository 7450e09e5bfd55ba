"""A run's code identity follows what its code computes, not how the code is written.

Each test edits real module files in a copy of the package (never a monkeypatch) and compares every
architecture's identity before and after: the copy hashes as the package itself, so any difference is the edit's.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import shutil
from pathlib import Path

import pytest

from pipeline import provenance
from pipeline.archs import ARCHS
from pipeline.families import source
from pipeline.provenance import CODE, OUT_OF_IDENTITY, behaviour, code_parts, code_sha256

PACKAGE = Path(__file__).resolve().parents[1] / "pipeline"


@pytest.fixture
def copy(tmp_path) -> Path:
    root = tmp_path / "pipeline"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def identities(root: Path | None = None) -> dict[str, str]:
    provenance._code_sha256.cache_clear()  # a stage hashes once per process; these tests edit between calls
    return {arch: code_sha256([arch], root) for arch in ARCHS}


def _edit_layout(text: str) -> str:
    """Comments, blank lines and docstrings added, changed or removed; not one token of code."""
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    doc = tree.body[0] if tree.body and isinstance(tree.body[0], ast.Expr) else None
    if doc is not None:  # rewrite the module docstring
        lines[doc.lineno - 1:doc.end_lineno] = ['"""Another wording of this module\'s docstring."""\n']
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.ClassDef)]
    out = "".join(lines) + "\n\n# a trailing comment\n"
    if functions and doc is None:  # no module docstring: add one instead
        out = '"""A new module docstring."""\n' + out
    return out.replace("\n\n\n", "\n\n\n# a comment between definitions\n\n", 1)


def test_the_copy_hashes_as_the_package_itself(copy):
    assert identities(copy) == identities()


def test_comments_docstrings_and_layout_move_no_identity(copy):
    edited = []
    for path in sorted(copy.rglob("*.py")):
        new = _edit_layout(path.read_text())
        assert behaviour(new) == behaviour(path.read_text()), path  # the edit is layout only ...
        path.write_text(new)
        edited.append(path)
    identity_bearing = {f"{name}.py" for name in CODE} | {source(a).relative_to(PACKAGE).as_posix() for a in ARCHS}
    assert identity_bearing <= {p.relative_to(copy).as_posix() for p in edited}  # ... of every module that counts
    assert identities(copy) == identities()


def test_a_function_docstring_edit_moves_no_identity(copy):
    path = copy / "learner.py"
    tree = ast.parse(path.read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and ast.get_docstring(n))
    lines = path.read_text().splitlines(keepends=True)
    body = fn.body[0]
    indent = " " * body.col_offset
    lines[body.lineno - 1:body.end_lineno] = [f'{indent}"""Reworded."""\n']
    path.write_text("".join(lines))
    assert identities(copy) == identities()


def _bump_first_number(text: str) -> str:
    """A one-token behaviour change: the first integer literal of the module's code (the constants out of identity
    skipped), plus one."""
    code = [s for s in ast.parse(text).body if not (isinstance(s, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id in OUT_OF_IDENTITY for t in s.targets))]
    node = next(n for s in code for n in ast.walk(s) if isinstance(n, ast.Constant) and type(n.value) is int)
    lines = text.splitlines(keepends=True)
    line = lines[node.lineno - 1]
    lines[node.lineno - 1] = line[:node.col_offset] + str(node.value + 1) + line[node.end_col_offset:]
    return "".join(lines)


@pytest.mark.parametrize("name", CODE)
def test_one_token_in_a_shared_module_moves_every_identity(copy, name):
    path = copy / f"{name}.py"
    path.write_text(_bump_first_number(path.read_text()))
    before, after = identities(), identities(copy)
    assert all(after[a] != before[a] for a in ARCHS), name


def test_one_token_in_a_family_module_moves_that_familys_identities_only(copy):
    path = copy / "families/swin.py"
    path.write_text(_bump_first_number(path.read_text()))
    before, after = identities(), identities(copy)
    changed = {a for a in ARCHS if after[a] != before[a]}
    assert changed == {a for a, info in ARCHS.items() if info.family == "swin"}


def test_scheduling_and_reporting_constants_move_no_identity(copy):
    path = copy / "families/vit.py"
    path.write_text(path.read_text() + "".join(f"\n{name} = {{'vit': 1.5}}\n" for name in sorted(OUT_OF_IDENTITY)))
    assert identities(copy) == identities()
    path.write_text(path.read_text() + "\n_SOMETHING_ELSE = 1.5\n")  # any other top-level name is code
    before, after = identities(), identities(copy)
    assert {a for a in ARCHS if after[a] != before[a]} == {a for a, i in ARCHS.items() if i.family == "vit"}


def test_adding_a_family_module_and_its_registry_line_moves_no_existing_identity(copy):
    # a new family: a module (here a renamed copy of an existing one) and its line in the registry
    text = (copy / "families/convmixer.py").read_text()
    (copy / "families/toy.py").write_text(re.sub(r'name="convmixer"', 'name="toy"', text))
    registry = copy / "families/__init__.py"
    registry.write_text(registry.read_text().replace("from pipeline.families import ",
                                                     "from pipeline.families import toy, ", 1)
                        .replace("_MODULES = (", "_MODULES = (toy, ", 1))
    assert "toy" in registry.read_text()
    assert identities(copy) == identities()


def test_a_rows_label_moves_no_identity_but_its_options_do(monkeypatch):
    before = identities()
    monkeypatch.setitem(ARCHS, "resnet_s1", dataclasses.replace(ARCHS["resnet_s1"], description="reworded",
                                                                isolates="reworded too"))
    assert identities() == before
    monkeypatch.setitem(ARCHS, "resnet_s1", dataclasses.replace(ARCHS["resnet_s1"], options={"downsample": "blur"}))
    assert {a for a in ARCHS if identities()[a] != before[a]} == {"resnet_s1"}


def test_a_run_hashes_only_its_own_family_module_and_rows():
    parts = code_parts(["vit_nopos"])
    assert {k for k in parts if k.startswith("families/")} == {"families/common.py", "families/vit.py"}
    assert {k for k in parts if k.startswith("archs:")} == {"archs:vit_nopos", "archs:vit"}  # its width's row too
    assert "archs.py" not in parts and "families/__init__.py" not in parts and "families/resnet.py" not in parts
