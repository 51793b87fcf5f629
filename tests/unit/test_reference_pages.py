"""The reference pages held to the code: every setting key and environment variable
``fairqueue.conf`` accepts is in docs/configuration.md, every metric family fairqueue serves is
in a metrics table of docs/operations.md, every check id the code can report is in
docs/checks.md, and every docs page is reachable from the docs index (docs/README.md),
directly or through pages it links."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from fairqueue import conf
from fairqueue.metrics import initialize_queue_fair_metrics
from fairqueue.redis_metrics import RedisStateCollector

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _text(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def test_configuration__every_key_and_variable_conf_accepts():
    page = _text("configuration.md")
    table = page.split("## Settings", 1)[1]
    # Each key has its own row, not only a mention; each variable is named.
    assert [key for key in conf.DEFAULTS if f"\n| `{key}` |" not in table] == []
    variables = [*conf.ENV_VARS.values(), *conf.RETENTION_ENV_VARS.values()]
    assert [name for name in variables if f"`{name}`" not in table] == []


def served_metric_names() -> list[str]:
    """The metric names /metrics shows (a counter with its ``_total``)."""
    registry = CollectorRegistry()
    initialize_queue_fair_metrics(registry)
    families = [
        family
        for collector in [*registry._collector_to_names, RedisStateCollector()]
        for family in collector.describe()
    ]
    assert len(families) > 20  # the enumeration found the families, not nothing
    return [f"{f.name}_total" if f.type == "counter" else f.name for f in families]


def test_metrics__every_served_family_has_a_row_in_a_metrics_table():
    page = _text("operations.md")
    assert [name for name in served_metric_names() if f"\n| `{name}` |" not in page] == []


def code_check_ids() -> set[str]:
    """Every check id written in fairqueue's source (the checks module, the backend's)."""
    source = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "fairqueue").rglob("*.py"))
    return set(re.findall(r"fairqueue\.[EW]\d{3}", source))


def test_checks__every_id_in_the_code_has_its_section():
    sections = set(re.findall(r"^## (fairqueue\.[EW]\d{3})$", _text("checks.md"), re.MULTILINE))
    ids = code_check_ids()
    assert len(ids) > 25
    assert sorted(ids - sections) == []


def _linked_pages(page: Path) -> set[Path]:
    text = page.read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", text)
    return {(page.parent / target).resolve() for target in targets}


def test_index__every_docs_page_is_reachable_from_the_docs_index():
    index = (DOCS / "README.md").resolve()
    seen, todo = {index}, [index]
    while todo:
        for page in _linked_pages(todo.pop()):
            if page.parent == DOCS.resolve() and page not in seen and page.exists():
                seen.add(page)
                todo.append(page)
    pages = {page.resolve() for page in DOCS.glob("*.md")}
    assert sorted(p.name for p in pages - seen) == []
    # The index itself links every page directly: one place lists them all.
    assert sorted(p.name for p in pages - _linked_pages(index) - {index}) == []
