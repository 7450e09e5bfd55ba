"""The "Compare experiments" commands of docs/usage.md (README links there) are the ones documented; that each works
as printed is checked on the repository of tests/test_sweeps.py after its two experiments (one tiny reproduced
repository serves both: a sweep is what the commands compare)."""

from __future__ import annotations

import re

import tiny_repo


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
