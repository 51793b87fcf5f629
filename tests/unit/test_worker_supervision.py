"""The rules a supervisor and its worker processes follow, without processes: restart
delays, recycling bounds and how an exit status reads."""

from __future__ import annotations

import signal

import pytest

from fairqueue.worker.recycling import (
    GRACE_EXPIRED_EXIT,
    RECYCLED_EXIT,
    STOPPED_EXIT,
    Recycling,
    exit_reason,
    resident_mb,
)
from fairqueue.worker.supervisor import (
    MAX_RESTART_DELAY_S,
    ChildSpec,
    Supervisor,
    restart_delay_s,
)


def test_restart_delay__at_once_for_a_healthy_child_then_doubling_to_a_cap():
    assert restart_delay_s(0) == 0
    assert [restart_delay_s(n) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]
    assert restart_delay_s(12) == restart_delay_s(1_000) == MAX_RESTART_DELAY_S


def test_recycling__max_jobs_says_why_once():
    recycling = Recycling(max_jobs=3)
    assert [recycling.job_finished() for _ in range(2)] == [None, None]
    assert recycling.job_finished() == "3 jobs done (--max-jobs-per-child 3)"
    assert recycling.job_finished() is None  # said once; the process is stopping
    assert recycling.jobs_done == 4 and recycling.reason is not None


def test_recycling__memory_over_the_bound_and_under_it():
    assert resident_mb() > 1
    over = Recycling(max_memory_mb=1)  # this test process is far above 1 MiB
    assert "MiB resident (--max-memory-mb 1)" in (over.job_finished() or "")
    under = Recycling(max_memory_mb=1_000_000)
    assert under.job_finished() is None


def test_recycling__no_bound_never_recycles_but_counts():
    recycling = Recycling()
    assert not recycling.active
    assert all(recycling.job_finished() is None for _ in range(100))
    assert recycling.jobs_done == 100


def test_exit_reason__statuses_and_signals():
    assert exit_reason(STOPPED_EXIT) == "stopped"
    assert exit_reason(RECYCLED_EXIT) == "recycled"
    assert "stalled check" in exit_reason(GRACE_EXPIRED_EXIT)
    assert exit_reason(-signal.SIGKILL) == "killed by SIGKILL"
    assert exit_reason(1) == "exit status 1"
    assert exit_reason(None) == "still running"


@pytest.mark.parametrize("processes", [0, 257, True])
def test_supervisor__process_count_out_of_range_names_value_and_range(processes):
    with pytest.raises(ValueError, match=rf"processes={processes!r} is not allowed: .* 1..256"):
        Supervisor(ChildSpec(["email"]), processes)
