"""README.md answers first, from reports/: its generated block is what ``python -m pipeline.readme`` writes now
(rerun it after the study), it stays under 1,000 words, and its prose names no commit and no issue number."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from pipeline import readme

ROOT = Path(__file__).resolve().parents[1]
# a 7-40 digit hex string with a letter and a digit (a commit); "issue 12" or "#12" (an issue number)
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
ISSUE = re.compile(r"\bissues? #?\d+|(?<![\w&])#\d+\b", re.IGNORECASE)


def test_the_readme_block_is_what_the_generator_writes_now(tmp_path):
    """From the working tree's reports/ (after `python -m pipeline.readme`, before a commit), or from the committed
    ones: `make repro` on another machine rewrites reports/ but not README.md, and the tests must pass after it."""
    text = (ROOT / "README.md").read_text()
    fresh = [ROOT] + ([head] if (head := committed_tree(tmp_path)) else [])
    assert any(readme.splice(text, readme.block(root)) == text for root in fresh), (
        "README.md's generated block is stale: run `python -m pipeline.readme` (it reads reports/ and profiles/)")


def committed_tree(dest: Path) -> Path | None:
    """reports/ and profiles/ as HEAD commits them, under ``dest``; None outside a git checkout."""
    tar = dest / "head.tar"
    if subprocess.run(["git", "archive", "-o", str(tar), "HEAD", "reports", "profiles"], cwd=ROOT).returncode:
        return None
    subprocess.run(["tar", "-xf", str(tar), "-C", str(dest)], check=True)
    return dest


def test_the_readme_is_short_and_names_no_commit_or_issue():
    text = (ROOT / "README.md").read_text()
    assert len(text.split()) < 1000, f"README.md has {len(text.split())} words (wc -w), over 1,000"
    assert not COMMIT.findall(text), f"commit hashes in README.md: {COMMIT.findall(text)} (docs/history.md holds them)"
    assert not ISSUE.findall(text), f"issue numbers in README.md: {ISSUE.findall(text)}"


def test_check_fails_on_a_changed_number_and_the_rewrite_restores_it(tmp_path, capsys):
    for name in ("reports", "profiles"):
        (tmp_path / name).symlink_to(ROOT / name)
    good = (ROOT / "README.md").read_text()
    start = good.index(readme.BEGIN)
    number = re.compile(r"[+-]\d\.\d{3}").search(good, start)
    assert number, "no signed estimate in the generated block"
    bad = good[:number.start()] + "+9.999" + good[number.end():]
    (tmp_path / "README.md").write_text(bad)
    assert readme.main(["--root", str(tmp_path), "--check"]) == 1
    assert "+9.999" in capsys.readouterr().out
    assert readme.main(["--root", str(tmp_path)]) == 0
    assert (tmp_path / "README.md").read_text() == good
    assert readme.main(["--root", str(tmp_path), "--check"]) == 0


def test_a_profile_never_run_says_so(tmp_path):
    (tmp_path / "summary-less").mkdir()
    assert "not yet run" in readme.profile_row("x", "a purpose", tmp_path / "summary-less", "reports/x/README.md")


def test_the_block_reads_every_committed_profile_report(tmp_path):
    """Each profile's committed report as if it were the study's (an uninformative lead, an exact lead, a row
    asking for more than the seed cap): one line per finding, every estimate a number or "no estimate"."""
    reports = sorted(p.parent.parent for p in (ROOT / "reports").glob("*/tables/ledger.csv"))
    assert reports, "no profile report under reports/"
    for report in reports:
        root = tmp_path / report.name
        root.mkdir()
        (root / "reports").symlink_to(report)
        (root / "profiles").symlink_to(ROOT / "profiles")
        lines = [line for line in readme.block(root).splitlines() if line.startswith("- **")]
        assert lines, report.name
        assert not any("nan" in line.lower().split() or "[nan" in line for line in lines), (report.name, lines)
        labelled = re.compile(r"\*\*(supported|undecided|contradicted|no effect|not run|smoke)")
        assert all(labelled.search(line) for line in lines), lines
