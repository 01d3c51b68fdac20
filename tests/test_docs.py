"""The docs stay readable and their links hold: every page under docs/ is under 400 lines (split a
longer one by topic), every relative link in README.md and the docs reaches a file and, with
`#anchor`, a heading of it, and every `docs/NAME.md` they name exists. Also the rule
docs/benchmarks.md gives for where a benchmark's JSON goes."""

from __future__ import annotations

import re
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote

import pytest

from mavjet.benchmarks.kit import default_json, results_dir

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
MAX_LINES = 400
PAGES = sorted([ROOT / "README.md", *DOCS.rglob("*.md"), *(ROOT / "benchmarks" / "results").glob("*.md")])

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)
_NAMED_DOC = re.compile(r"(?<![\w/.-])docs/([\w-]+\.md)")


def _prose(text: str) -> str:
    """The text without fenced code blocks (links in them are examples, not links)."""
    return _FENCE.sub("", text)


def anchors(path: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens, `-N` for repeats."""
    seen: Counter[str] = Counter()
    out: set[str] = set()
    for heading in _HEADING.findall(_prose(path.read_text(encoding="utf-8"))):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return out


def links(path: Path) -> list[str]:
    return _LINK.findall(_CODE.sub("", _prose(path.read_text(encoding="utf-8"))))


def test_the_anchor_rule_matches_githubs() -> None:
    assert "thin-uplinks-link-adaptive-shaping" in anchors(DOCS / "performance.md")
    assert "storage-1000-vehicles-x-90-days-at-1-hz" in anchors(DOCS / "analytics.md")
    assert "the-same-scenarios-against-a-real-arducopter-testssitl" in anchors(DOCS / "sim-fidelity.md")


@pytest.mark.parametrize("page", sorted(DOCS.rglob("*.md")), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_doc_is_under_400_lines(page: Path) -> None:
    lines = len(page.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{page.relative_to(ROOT)} has {lines} lines: split it by topic (at most {MAX_LINES})"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_reach_a_file_and_a_heading(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:, ...
            continue
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / unquote(file_part)).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and unquote(anchor).lower() not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_doc_named_exists(page: Path) -> None:
    named = set(_NAMED_DOC.findall(page.read_text(encoding="utf-8")))
    missing = sorted(name for name in named if not (DOCS / name).is_file())
    assert not missing, f"{page.relative_to(ROOT)} names docs/{', docs/'.join(missing)}, which do not exist"


def test_benchmark_json_goes_to_results_in_a_checkout_and_the_working_directory_outside(tmp_path: Path) -> None:
    when = datetime(2026, 12, 1, 19, 7, tzinfo=UTC)
    results = ROOT / "benchmarks" / "results"
    assert (results / "README.md").is_file()  # kept in git: what marks a checkout
    assert results_dir(ROOT / "docs") == results
    assert default_json("ingest-1000", cwd=ROOT, now=when) == results / "ingest-1000-20261201T190700Z.json"
    assert default_json("ingest-1000", cwd=tmp_path, now=when) == tmp_path / "bench-ingest-1000-20261201T190700Z.json"
