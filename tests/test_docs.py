"""The documentation's links hold: every relative link of README.md and docs/*.md names a file that exists, and
every ``#anchor`` a heading of that file (GitHub's slugs); commit hashes stay in docs/history.md."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link targets and code marks dropped, lower case, punctuation out, spaces -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slug(m.group(1).strip()) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


def broken(page: Path) -> list[str]:
    out = []
    for target in LINK.findall(re.sub(r"```.*?```", "", page.read_text(), flags=re.S)):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked offline
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            out.append(f"{page.name}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            out.append(f"{page.name}: {target} (no such heading in {dest.name})")
    return out


def test_every_link_of_the_docs_resolves():
    found = [b for page in PAGES for b in broken(page)]
    assert not found, "\n".join(found)


def test_the_link_check_sees_a_missing_file_and_a_missing_heading(tmp_path):
    page = tmp_path / "a.md"
    page.write_text("# Top `x`: y\n[ok](#top-x-y) [gone](b.md) [bad](#nowhere)\n")
    assert broken(page) == ["a.md: b.md (no such file)", "a.md: #nowhere (no such heading in a.md)"]


def test_commit_hashes_only_in_the_history():
    found = {page.name: COMMIT.findall(page.read_text()) for page in PAGES if page.name != "history.md"}
    assert not any(found.values()), f"commit hashes outside docs/history.md: {found}"
