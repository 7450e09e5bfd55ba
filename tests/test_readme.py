"""The "Compare experiments" commands of docs/usage.md (README links there) work as printed: each runs on a tiny
reproduced repository with one experiment, exits 0, and an ``exp show`` table has columns beyond ``Experiment`` and
a row per revision."""

from __future__ import annotations

import csv
import io
import re
import shlex
import subprocess

import pytest
import tiny_repo

pytestmark = pytest.mark.slow


def readme_commands(section: str = "## Compare experiments") -> list[str]:
    """The shell commands of the code block that follows ``section`` in docs/usage.md (comments dropped)."""
    text = (tiny_repo.ROOT / "docs" / "usage.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text[text.index(section):], re.S).group(1)
    lines = [line.split("  #")[0].strip() for line in block.splitlines()]
    return [part.strip() for line in lines if line for part in line.split("&&")]


def test_the_docs_name_the_commands_they_document():
    assert "docs/usage.md" in (tiny_repo.ROOT / "README.md").read_text(), "README.md no longer links docs/usage.md"
    commands = readme_commands()
    assert len(commands) == 5 and sum(c.startswith("dvc exp show") for c in commands) == 3


def test_every_comparing_command_prints_a_table(copy_reproduced_repo):
    repo = copy_reproduced_repo
    env = tiny_repo.env(repo)
    tiny_repo.git(repo, "add", "-A")
    tiny_repo.git(repo, "commit", "-q", "-m", "baseline reproduced")
    # one experiment that reruns only the report (a report-only param), so --only-changed has something to show
    tiny_repo.dvc(repo, "exp", "run", "-S", "report.confidence=0.9")
    for command in readme_commands():
        argv = shlex.split(command)
        assert argv[0] == "dvc", command
        exp_show = argv[1:3] == ["exp", "show"]
        proc = subprocess.run([str(tiny_repo.VENV_BIN / "dvc"), *argv[1:], *(["--csv"] if exp_show else [])],
                              cwd=repo, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"{command}: {proc.stderr}"
        if exp_show:
            header, *rows = list(csv.reader(io.StringIO(proc.stdout)))
            assert len(header) > 1 and "Experiment" in header, f"{command}: an empty table ({header})"
            assert len(rows) >= 2, f"{command}: no revision rows"
            values = [v for row in rows for name, v in zip(header, row, strict=False) if name != "Experiment"]
            assert any(v not in ("", "-") for v in values), f"{command}: every value empty"
