"""The test settings for ``benchmarks/bench_cost.py``'s ``rebalance_fair`` loop, with the
usage ledger off when ``FQBENCH_LEDGER=0`` (section 2's run "fairqueue + loop, ledger
off", beside the same run with it on)."""

import os

from tests.settings import *  # noqa: F403
from tests.settings import FAIRQUEUE as _TEST_FAIRQUEUE

FAIRQUEUE = {**_TEST_FAIRQUEUE, "USAGE_LEDGER": os.environ.get("FQBENCH_LEDGER", "1") != "0"}
