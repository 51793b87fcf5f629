"""The operator's files fairqueue ships (``fairqueue/contrib/prometheus/rules.yml`` with its
promtool unit tests, ``fairqueue/contrib/grafana/fairqueue.json``): Prometheus's own tool
checks and tests the rules, and every query of the rules and the board names only
metrics fairqueue exports (a renamed metric would leave an alert that never fires)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import yaml
from prometheus_client import CollectorRegistry

from fairqueue.metrics import initialize_queue_fair_metrics
from fairqueue.redis_metrics import RedisStateCollector
from tests.helpers.operator_files import BOARD, CONTRIB, EXPECTED_ALERTS, RULES, board_expressions

RULES_TEST = CONTRIB / "prometheus" / "rules_test.yml"
#: A metric name in PromQL: fairqueue's all start with queue_ (a label is `queue` alone).
METRIC = re.compile(r"\bqueue_[a-z_]+\b")


def exported_sample_names() -> set[str]:
    """The sample names fairqueue's families expose (a counter's ``_total``, a
    histogram's ``_bucket``/``_sum``/``_count``), from the families themselves."""
    registry = CollectorRegistry()
    initialize_queue_fair_metrics(registry, job_types=["email"], queues=["email"])
    names = set()
    for family in registry.collect():
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names.update(f"{family.name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
        else:
            names.add(family.name)
    names.update(family.name for family in RedisStateCollector().describe())
    return names


def rule_expressions() -> dict[str, str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["alert"]: rule["expr"] for group in groups for rule in group["rules"]}


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool not installed (apt-get install prometheus; .ci/run does)")
    return found


def test_rules__promtool_checks_them():
    done = subprocess.run(
        [_promtool(), "check", "rules", str(RULES)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(EXPECTED_ALERTS)} rules found" in done.stdout


def test_rules__promtool_unit_tests_pass():
    done = subprocess.run(
        [_promtool(), "test", "rules", RULES_TEST.name],
        cwd=RULES_TEST.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_rules__every_alert_is_unit_tested():
    tested = {
        case["alertname"]
        for test in yaml.safe_load(RULES_TEST.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert set(rule_expressions()) == EXPECTED_ALERTS
    assert tested == EXPECTED_ALERTS


def test_rules_and_board__every_query_names_only_metrics_fairqueue_exports():
    exported = exported_sample_names()
    queries = [*rule_expressions().values(), *board_expressions()]
    assert len(queries) > len(EXPECTED_ALERTS)
    for query in queries:
        named = set(METRIC.findall(query))
        assert named, query
        assert named <= exported, (sorted(named - exported), query)


#: A metric selector in PromQL: its name and its label matchers, if any.
SELECTOR = re.compile(r"\b(queue_[a-z_]+)\b(\{[^}]*\})?")


def test_board__every_panel_follows_the_queue_variable():
    """Every selector of every panel's every query is filtered by ``$queue``, and the
    variable's values come from a family every process exports for every configured
    queue: picking a queue narrows the whole board, not half of it."""
    board = json.loads(BOARD.read_text())
    panels = [panel for panel in board["panels"] if panel["type"] != "row"]
    assert len(panels) >= 10
    for panel in panels:
        for target in panel["targets"]:
            selectors = SELECTOR.findall(target["expr"])
            assert selectors, (panel["title"], target["expr"])
            for name, matchers in selectors:
                assert 'queue=~"$queue"' in matchers, (panel["title"], name, target["expr"])
    (variable,) = [v for v in board["templating"]["list"] if v["name"] == "queue"]
    assert variable["definition"] == "label_values(queue_fair_level_weight, queue)"
    registry = CollectorRegistry()
    initialize_queue_fair_metrics(registry, job_types=["email"])
    assert registry.get_sample_value(
        "queue_fair_level_weight", {"queue": "email", "priority_level": "low"}
    )


def test_board__covers_shares_waits_overdue_passes_and_the_outbox():
    board = json.loads(BOARD.read_text())
    assert board["uid"] == "fairqueue"
    used = {name for query in board_expressions() for name in METRIC.findall(query)}
    for metric in (
        "queue_fair_jobs_started_total",
        "queue_fair_level_weight",
        "queue_fair_wait_seconds_bucket",
        "queue_fair_max_wait_seconds",
        "queue_fair_level_overdue_waiting",
        "queue_fair_overdue_waiting",
        "queue_fair_aged_boosts_total",
        "queue_fair_pass_duration_seconds_bucket",
        "queue_fair_pass_errors_total",
        "queue_fair_last_pass_success_timestamp_seconds",
        "queue_fair_leader",
        "queue_fair_outbox_pending",
    ):
        assert metric in used, metric
    for panel in board["panels"]:
        if panel["type"] != "row":
            assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}"
