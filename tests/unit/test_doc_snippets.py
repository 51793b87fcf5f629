"""Every code block a reader copies from the README or docs/ is run by a test, or says it
is an excerpt on its first line: a block that only looks runnable is how a snippet that
does nothing (a beat schedule without its function, a URL line without its imports)
reaches users. The settings blocks and the README's /metrics lines run here."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.test import override_settings
from django.urls import resolve

from fairqueue import conf
from fairqueue.metrics import metrics_view
from tests.helpers.doc_snippets import ROOT, code_blocks, named_block

PAGES = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]
COPIED = ("python", "js")

REPORTER_LINE = (
    "DEFAULT_EXCEPTION_REPORTER_FILTER = "
    '"fairqueue.reporting.CredentialSafeExceptionReporterFilter"'
)
#: (page, first line) -> the test module that runs the block as written.
RUN_BY = {
    ("README.md", "# settings.py"): "tests/e2e/test_quickstart.py",
    ("README.md", "# yourapp/apps.py"): "tests/e2e/test_quickstart.py",
    ("README.md", "# yourapp/jobs.py"): "tests/e2e/test_quickstart.py",
    ("README.md", "# yourapp/views.py"): "tests/e2e/test_quickstart.py",
    ("README.md", "# mysite/urls.py (append)"): "tests/e2e/test_quickstart.py",
    ("README.md", "# mysite/urls.py (metrics)"): "tests/unit/test_doc_snippets.py",
    ("docs/configuration.md", "FAIRQUEUE = {"): "tests/unit/test_doc_snippets.py",
    ("docs/limits.md", "FAIRQUEUE = {"): "tests/unit/test_doc_snippets.py",
    ("docs/usage.md", "FAIRQUEUE = {"): "tests/unit/test_doc_snippets.py",
    ("docs/operations.md", "# One server:"): "tests/unit/test_doc_snippets.py",
    ("docs/operations.md", "# mysite/celery.py"): "tests/e2e/test_celery_beat.py",
    ("docs/operations.md", "# mysite/__init__.py"): "tests/e2e/test_celery_beat.py",
    ("docs/operations.md", "# settings.py (Celery)"): "tests/e2e/test_celery_beat.py",
    ("docs/operations.md", "// worker.mjs: node worker.mjs"): "tests/redis/test_operations_docs.py",
    ("docs/operations.md", REPORTER_LINE): "tests/unit/test_doc_snippets.py",
    ("docs/tasks.md", "# settings.py"): "tests/redis/test_tasks_backend.py",
}


def copied_blocks() -> list[tuple[str, str]]:
    return [
        (page, body.split("\n", 1)[0])
        for page in PAGES
        for language, body in code_blocks(page)
        if language in COPIED
    ]


def test_every_copied_block__is_run_by_a_test_or_says_it_is_an_excerpt():
    unmarked = [
        (page, first)
        for page, first in copied_blocks()
        if (page, first) not in RUN_BY and "excerpt" not in first.lower()
    ]
    assert unmarked == []


def test_run_by__each_listed_block_exists_and_its_test_reads_its_page():
    blocks = set(copied_blocks())
    assert sorted(set(RUN_BY) - blocks) == []
    for (page, _), test in RUN_BY.items():
        assert Path(page).name in (ROOT / test).read_text(encoding="utf-8"), (page, test)


def _settings_of(block: str) -> dict:
    """``block`` run as a settings module; ``{...}`` (the reader's own queues) filled."""
    namespace: dict = {}
    exec(block.replace('"QUEUES": {...}', '"QUEUES": {"email": "email"}'), namespace)  # noqa: S102
    return namespace


@pytest.mark.parametrize(
    ("page", "first"),
    [
        ("docs/configuration.md", "FAIRQUEUE = {"),
        ("docs/limits.md", "FAIRQUEUE = {"),
        ("docs/usage.md", "FAIRQUEUE = {"),
        ("docs/operations.md", "# One server:"),
    ],
)
def test_settings_blocks__valid_settings_as_written(page, first, monkeypatch):
    for variable in [*conf.ENV_VARS.values(), *conf.RETENTION_ENV_VARS.values()]:
        monkeypatch.delenv(variable, raising=False)
    fairqueue = _settings_of(named_block(page, first))["FAIRQUEUE"]
    with override_settings(FAIRQUEUE=fairqueue):
        conf.reload_settings()
        try:
            assert conf.setting_errors() == []
        finally:
            conf.reload_settings()


def test_readme_metrics_lines__serve_fairqueues_view_at_metrics():
    namespace: dict = {"urlpatterns": []}
    exec(named_block("README.md", "# mysite/urls.py (metrics)"), namespace)  # noqa: S102
    with override_settings(ROOT_URLCONF=_Urls(namespace["urlpatterns"])):
        assert resolve("/metrics").func is metrics_view


def test_reporter_filter_line__names_fairqueues_filter():
    from django.utils.module_loading import import_string
    from django.views.debug import SafeExceptionReporterFilter

    namespace: dict = {}
    exec(named_block("docs/operations.md", REPORTER_LINE), namespace)  # noqa: S102
    filter_class = import_string(namespace["DEFAULT_EXCEPTION_REPORTER_FILTER"])
    assert issubclass(filter_class, SafeExceptionReporterFilter)


class _Urls:
    """A URLconf object holding ``urlpatterns``."""

    def __init__(self, urlpatterns: list) -> None:
        self.urlpatterns = urlpatterns


def test_node_worker_install_line__pins_what_the_tests_run():
    """The Node worker's `npm install` pins the majors (bullmq's minor) of
    tests/node/package.json, so a reader gets what the tests ran, not npm's newest."""
    import json
    import re

    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    (line,) = re.findall(r"`npm install ([^`]+)`", text)
    pinned = dict(item.split("@", 1) for item in line.split())
    package = json.loads((ROOT / "tests" / "node" / "package.json").read_text())
    wanted = {name: spec.lstrip("~^") for name, spec in package["dependencies"].items()}
    assert set(pinned) == set(wanted)
    for name, version in pinned.items():
        assert wanted[name].startswith(f"{version}."), (name, version, wanted[name])
