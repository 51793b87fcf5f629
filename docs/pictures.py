"""Draws the pictures of docs/concepts.md from fairqueue's own placement model.

    python docs/pictures.py              # writes docs/concepts-*.png
    python docs/pictures.py --out DIR    # elsewhere (tests/unit/test_docs.py does)

The run orders come from ``fairqueue.scheduling.fair_clock.FairClock``, the rule the add script
follows (docs/design.md, "The rule"): jobs run in finish-tag order, ties to the higher
weight. Needs matplotlib (requirements-dev.txt).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fairqueue.scheduling.fair_clock import FairClock  # noqa: E402
from fairqueue.scheduling.levels import LEVELS_BY_RANK, PriorityLevel  # noqa: E402

LEVEL_COLOURS = {
    PriorityLevel.CRITICAL: "#c0392b",
    PriorityLevel.HIGH: "#e67e22",
    PriorityLevel.NORMAL: "#2e86c1",
    PriorityLevel.LOW: "#7f8c8d",
}
TENANT_COLOURS = {"acme": "#2e86c1", "initech": "#f1c40f", "globex": "#27ae60"}
DPI = 100
#: PNGs without the matplotlib version in them: the same picture gives the same bytes.
PNG_METADATA = {"Software": None}


def run_order(arrivals: list[tuple[PriorityLevel, str, float]]) -> list[tuple]:
    """Jobs added in this order before any runs: (level, tenant, cost in turns) each, in
    the order a worker takes them."""
    clock = FairClock()
    placed = []
    for index, (level, tenant, cost) in enumerate(arrivals):
        tag = clock.place(level, tenant, cost=cost)
        placed.append((tag, LEVELS_BY_RANK.index(level), index, level, tenant, cost))
    return [job[3:] for job in sorted(placed)]


def _strip(ax, y: float, jobs: list, colour_of, *, widths=None) -> None:
    x = 0.0
    for number, job in enumerate(jobs):
        width = widths[number] if widths else 1.0
        ax.add_patch(Rectangle((x, y), width * 0.92, 0.8, color=colour_of(job), linewidth=0))
        x += width


def _axes(width_in: float, rows: list[str], length: float):
    fig, ax = plt.subplots(figsize=(width_in, 0.55 * len(rows) + 0.75), dpi=DPI)
    ax.set_xlim(0, length)
    ax.set_ylim(-0.2, len(rows))
    ax.set_yticks([len(rows) - 1 - i + 0.4 for i in range(len(rows))], rows)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.tick_params(axis="y", length=0)
    return fig, ax


def levels(out: Path) -> None:
    """All four levels with a backlog, added together: the first 30 jobs run."""
    arrivals = [(level, "t", 1.0) for level in LEVELS_BY_RANK for _ in range(30)]
    fair = run_order(arrivals)[:30]
    plain = arrivals[:30]  # BullMQ's priority: critical until it is empty
    fig, ax = _axes(7.0, ["fairqueue", "plain BullMQ"], 30)
    _strip(ax, 1, fair, lambda job: LEVEL_COLOURS[job[0]])
    _strip(ax, 0, plain, lambda job: LEVEL_COLOURS[job[0]])
    ax.set_xlabel("jobs run, in order (30 waiting at each level)")
    ax.legend(
        handles=[
            Patch(color=LEVEL_COLOURS[level], label=f"{level.value} (weight {w})")
            for level, w in zip(LEVELS_BY_RANK, (4, 3, 2, 1), strict=True)
        ],
        loc="upper center",
        bbox_to_anchor=(0.5, 1.45),
        ncol=4,
        frameon=False,
        fontsize=8,
    )
    _save(fig, out / "concepts-levels.png")


def tenants(out: Path) -> None:
    """One level: acme adds 16 jobs, then initech adds 4 and globex 2."""
    normal = PriorityLevel.NORMAL
    arrivals = (
        [(normal, "acme", 1.0)] * 16
        + [(normal, "initech", 1.0)] * 4
        + [(normal, "globex", 1.0)] * 2
    )
    fair = run_order(arrivals)
    fig, ax = _axes(7.0, ["fairqueue", "plain BullMQ"], len(arrivals))
    _strip(ax, 1, fair, lambda job: TENANT_COLOURS[job[1]])
    _strip(ax, 0, arrivals, lambda job: TENANT_COLOURS[job[1]])
    ax.set_xlabel("jobs run, in order (acme's 16 added first, then initech's 4, globex's 2)")
    ax.legend(
        handles=[Patch(color=colour, label=name) for name, colour in TENANT_COLOURS.items()],
        loc="upper center",
        bbox_to_anchor=(0.5, 1.45),
        ncol=3,
        frameon=False,
        fontsize=8,
    )
    _save(fig, out / "concepts-tenants.png")


def max_min(out: Path) -> None:
    """The max-min share: three flows asking 0.4, 0.4 and 2.0 of the workers' capacity
    (docs/design.md, "The wait bound")."""
    names = ["critical\n(weight 4)", "normal\n(weight 2)", "low\n(weight 1)"]
    asked = [0.4, 0.4, 2.0]
    share = [0.4, 0.4, 0.2]
    fig, ax = plt.subplots(figsize=(5.6, 2.6), dpi=DPI)
    ax.bar(names, asked, width=0.6, color="none", edgecolor="#555", hatch="//", label="asked")
    ax.bar(
        names,
        share,
        width=0.6,
        color=[
            LEVEL_COLOURS[level]
            for level in (PriorityLevel.CRITICAL, PriorityLevel.NORMAL, PriorityLevel.LOW)
        ],
        label="fair share (served)",
    )
    ax.set_ylabel("share of the workers")
    ax.set_ylim(0, 2.2)
    ax.text(0, 0.45, "all it asks:\nwithin the bound", ha="center", fontsize=8)
    ax.text(1, 0.45, "all it asks:\nwithin the bound", ha="center", fontsize=8)
    ax.text(
        2,
        1.2,
        "0.2 served;\nits own jobs wait",
        ha="center",
        fontsize=8,
        bbox={"facecolor": "white", "edgecolor": "none"},
    )
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.legend(frameon=False, fontsize=8, loc="upper left")
    _save(fig, out / "concepts-max-min.png")


def worker_time(out: Path) -> None:
    """One worker, one level: acme's jobs take 1 s, initech's 4 s. Counted in jobs they
    alternate and initech gets 80% of the worker; counted in worker time, 50% each."""
    normal = PriorityLevel.NORMAL
    by_jobs = run_order([(normal, "acme", 1.0)] * 16 + [(normal, "initech", 1.0)] * 16)
    by_time = run_order([(normal, "acme", 1.0)] * 16 + [(normal, "initech", 4.0)] * 16)
    seconds = {"acme": 1.0, "initech": 4.0}
    fig, ax = _axes(7.0, ['FAIRNESS_BY="jobs"', 'FAIRNESS_BY="time"'], 30)
    _strip(
        ax, 1, by_jobs, lambda job: TENANT_COLOURS[job[1]], widths=[seconds[j[1]] for j in by_jobs]
    )
    _strip(
        ax, 0, by_time, lambda job: TENANT_COLOURS[job[1]], widths=[seconds[j[1]] for j in by_time]
    )
    ax.set_xlabel("one worker's first 30 s (acme's jobs take 1 s, initech's 4 s)")
    ax.legend(
        handles=[Patch(color=TENANT_COLOURS[name], label=name) for name in seconds],
        loc="upper center",
        bbox_to_anchor=(0.5, 1.45),
        ncol=2,
        frameon=False,
        fontsize=8,
    )
    _save(fig, out / "concepts-worker-time.png")


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, metadata=PNG_METADATA)
    plt.close(fig)


PICTURES = (levels, tenants, max_min, worker_time)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    out = parser.parse_args(argv).out
    out.mkdir(parents=True, exist_ok=True)
    for draw in PICTURES:
        draw(out)


if __name__ == "__main__":
    main()
