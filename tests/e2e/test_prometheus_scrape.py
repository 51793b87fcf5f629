"""A real scrape: Debian's Prometheus, on a free port, scrapes a running
``rebalance_fair --metrics-port`` while a stock BullMQ worker drains jobs, and its HTTP
API returns what the loop reported: the wait histogram per level and the leader gauge.
The same server loads the shipped rules and evaluates every query of the shipped board.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import textwrap
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fairqueue.enqueue.api import enqueue_jobs
from tests.helpers import free_port, stock_worker_until, wait_until
from tests.helpers.operator_files import BOARD, EXPECTED_ALERTS, RULES, board_expressions
from tests.helpers.processes import spawn

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = shutil.which("prometheus")
LEVELS = ("critical", "high", "normal", "low")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        PROMETHEUS is None, reason="prometheus not installed (apt-get install prometheus)"
    ),
]


#: Straight to 127.0.0.1, whatever proxy the environment names.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _get(url: str, timeout: float = 5.0) -> str:
    with _OPENER.open(url, timeout=timeout) as response:
        return response.read().decode()


def _exported(port: int) -> dict[tuple[str, tuple], float]:
    """The rebalancer's exposition, as (sample name, sorted labels) -> value; empty while
    it does not answer yet."""
    try:
        text = _get(f"http://127.0.0.1:{port}/metrics")
    except OSError:
        return {}
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def _query(base: str, promql: str) -> dict:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    try:
        return json.loads(_get(url))
    except urllib.error.HTTPError as exc:  # a bad query: 400 with the reason in the body
        return json.loads(exc.read().decode())


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_prometheus_scrapes_the_rebalancer_and_returns_its_waits_and_leader(fq_prefix, tmp_path):
    metrics_port, prometheus_port = free_port(), free_port()
    rebalancer = spawn(
        ["rebalance_fair", "--queue", "email", "--interval-ms", "500"]
        + ["--metrics-port", str(metrics_port)],
        fq_prefix,
    )
    prometheus = None
    try:
        assert wait_until(
            lambda: (
                _exported(metrics_port).get(("queue_fair_leader", (("queue", "email"),))) == 1
                if rebalancer.poll() is None
                else True
            ),
            30,
        ), "the rebalancer did not lead"
        assert rebalancer.poll() is None, rebalancer.stdout.read()
        time.sleep(1.0)  # a pass recorded the history's cursor: starts from here count

        for level in LEVELS:
            enqueue_jobs("email", [{"i": i} for i in range(5)], tenant_id="t", priority_level=level)
        time.sleep(0.3)  # waits of at least 300 ms
        asyncio.run(stock_worker_until(fq_prefix, "email", lambda job: None, 20))

        def counts() -> dict[str, float]:
            exported = _exported(metrics_port)
            return {
                level: exported.get(
                    (
                        "queue_fair_wait_seconds_count",
                        (("priority_level", level), ("queue", "email")),
                    ),
                    0,
                )
                for level in LEVELS
            }

        assert wait_until(lambda: counts() == dict.fromkeys(LEVELS, 5.0), 30), counts()
        reported = _exported(metrics_port)  # what the loop reports, now settled

        config = tmp_path / "prometheus.yml"
        config.write_text(
            textwrap.dedent(
                f"""
                global:
                  scrape_interval: 1s
                  evaluation_interval: 1s
                rule_files:
                  - {RULES}
                scrape_configs:
                  - job_name: fairqueue-rebalancer
                    static_configs:
                      - targets: ["127.0.0.1:{metrics_port}"]
                """
            )
        )
        prometheus = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{prometheus_port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        base = f"http://127.0.0.1:{prometheus_port}"

        def scraped(promql: str) -> list:
            try:
                reply = _query(base, promql)
            except (OSError, ValueError):
                return []
            return (
                reply.get("data", {}).get("result", []) if reply.get("status") == "success" else []
            )

        assert wait_until(lambda: scraped('up{job="fairqueue-rebalancer"} == 1'), 60), (
            prometheus.poll() is None or prometheus.stderr.read()
        )
        # The leader gauge, as the loop reported it.
        assert wait_until(lambda: scraped('queue_fair_leader{queue="email"} == 1'), 30)
        # The wait histogram per level: count and sum exactly as the loop reported them.
        (count_rows, sum_rows) = (
            scraped(f'sum by (priority_level) (queue_fair_wait_seconds_{kind}{{queue="email"}})')
            for kind in ("count", "sum")
        )
        got_count = {row["metric"]["priority_level"]: float(row["value"][1]) for row in count_rows}
        got_sum = {row["metric"]["priority_level"]: float(row["value"][1]) for row in sum_rows}
        for level in LEVELS:
            labels = (("priority_level", level), ("queue", "email"))
            assert got_count[level] == reported[("queue_fair_wait_seconds_count", labels)] == 5
            assert got_sum[level] == pytest.approx(
                reported[("queue_fair_wait_seconds_sum", labels)], rel=1e-9
            )
            assert got_sum[level] >= 5 * 0.3  # every job waited at least the pause
        # A bucket query works on the scraped histogram (the board's p99 panel).
        p99 = scraped(
            'histogram_quantile(0.99, sum by (le) (queue_fair_wait_seconds_bucket{queue="email"}))'
        )
        assert p99 and float(p99[0]["value"][1]) >= 0.3

        # The shipped rules load, and every query of the shipped board evaluates.
        rules = json.loads(_get(f"{base}/api/v1/rules"))["data"]["groups"]
        loaded = [rule for group in rules for rule in group["rules"]]
        assert len(loaded) == len(EXPECTED_ALERTS), loaded
        assert all(rule["health"] != "err" for rule in loaded), loaded
        for expr in board_expressions():
            if expr.startswith("label_values("):
                continue  # a Grafana variable, not PromQL
            promql = expr.replace("$__rate_interval", "1m").replace("$queue", ".*")
            reply = _query(base, promql)
            assert reply.get("status") == "success", (expr, reply)
        assert BOARD.is_file()
    finally:
        if prometheus is not None:
            _stop(prometheus)
        _stop(rebalancer)
