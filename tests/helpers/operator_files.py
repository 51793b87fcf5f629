"""The operator's files fairqueue ships (Prometheus rules, the Grafana board) and the
queries in them, for the tests that check them against the exported metrics."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

CONTRIB = Path(str(resources.files("fairqueue.contrib")))


RULES = CONTRIB / "prometheus" / "rules.yml"


BOARD = CONTRIB / "grafana" / "fairqueue.json"


#: The rules the issue asked for, by what they watch.
EXPECTED_ALERTS = {
    "FairQueueLevelOverdue",
    "FairQueueAgedBoostsClimbing",
    "FairQueueNoLeader",
    "FairQueueRebalancerAbsent",
    "FairQueueNoRecentPass",
    "FairQueueOutboxStuck",
    "FairQueueLevelStarved",
    "FairQueueNoisyTenant",
    "FairQueueBreakerOpen",
}


def board_expressions() -> list[str]:
    board = json.loads(BOARD.read_text())
    exprs = [
        target["expr"]
        for panel in board["panels"]
        for target in panel.get("targets", [])
        if "expr" in target
    ]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            exprs.append(variable["definition"])
    return exprs
