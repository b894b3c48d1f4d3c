"""``slidegate simulate``: the same traffic through each algorithm, to see how they differ.

Each workload is a list of request times; each algorithm decides them in order with the in-memory backend on a
simulated clock, one hit per request against one limit. What comes out per algorithm: which requests were
admitted, and the most admitted in any rolling window of the limit's length — the number a client can really
get through, which a fixed window lets reach twice the limit at a window boundary. The table always prints; with
matplotlib installed (``pip install -e '.[plot]'`` in a checkout) the same results are drawn into one PNG.
"""

from __future__ import annotations

import asyncio
import bisect
from dataclasses import dataclass
from pathlib import Path

from slidegate.algorithms import Algorithm
from slidegate.backends.base import Check
from slidegate.backends.memory import MemoryBackend

SAMPLES = 600  # points of each drawn line


@dataclass(frozen=True, slots=True)
class Workload:
    """Request times in microseconds from the start of a window, in order; ``windows``: how long it runs."""

    name: str
    times_us: tuple[int, ...]
    windows: int


@dataclass(frozen=True, slots=True)
class Outcome:
    """One algorithm's decisions on one workload (``admitted[i]`` for ``workload.times_us[i]``)."""

    workload: Workload
    algorithm: Algorithm
    admitted: tuple[bool, ...]
    most_in_window: int  # the most admitted requests in any rolling window of the limit's length


def workloads(limit: int, window_us: int) -> list[Workload]:
    """Three workloads for a limit of ``limit`` requests per ``window_us``: a burst of ``limit`` requests just
    before a window boundary and another just after it; steady traffic at twice the limit; bursts of
    ``limit`` requests every three quarters of a window."""
    def burst(start: float, count: int, length: float) -> list[int]:  # start and length in windows
        return [round((start + length * i / count) * window_us) for i in range(count)]

    return [
        Workload("burst across a window boundary", tuple(burst(0.9, limit, 0.1) + burst(1.0, limit, 0.1)), 3),
        Workload("steady at twice the limit", tuple(burst(0.0, 6 * limit, 3.0)), 3),
        Workload("on/off bursts", tuple(t for k in range(4) for t in burst(0.45 + 0.75 * k, limit, 0.1)), 3),
    ]


def most_in_window(times_us: list[int], window_us: int) -> int:
    """The most of ``times_us`` (sorted) in any half-open interval of length ``window_us``."""
    most, first = 0, 0
    for last, t in enumerate(times_us):
        while times_us[first] <= t - window_us:
            first += 1
        most = max(most, last - first + 1)
    return most


def rolling_count(times_us: list[int], window_us: int, at_us: int) -> int:
    """How many of ``times_us`` (sorted) fall in the window of length ``window_us`` that ends at ``at_us``."""
    return bisect.bisect_right(times_us, at_us) - bisect.bisect_right(times_us, at_us - window_us)


async def replay(workload: Workload, algorithm: Algorithm, limit: int, window_us: int) -> Outcome:
    """``workload`` through ``algorithm`` (a limit of ``limit`` hits per ``window_us``), on the memory backend at a
    simulated clock: what it admitted, and the most admitted in any rolling window."""
    backend = MemoryBackend()
    # windows of the fixed-window algorithm start at multiples of the window: so does the simulated time
    start = 1000 * window_us
    admitted = []
    for t in workload.times_us:
        decision = await backend.decide([Check("simulated", limit, window_us, 1, algorithm)], start + t)
        admitted.append(decision.admitted)
    times = [t for t, ok in zip(workload.times_us, admitted, strict=True) if ok]
    return Outcome(workload, algorithm, tuple(admitted), most_in_window(times, window_us))


def simulate(limit: int, window_us: int) -> list[Outcome]:
    """Every workload through every algorithm."""
    async def run_all() -> list[Outcome]:
        return [await replay(w, a, limit, window_us) for w in workloads(limit, window_us) for a in Algorithm]

    return asyncio.run(run_all())


def table(outcomes: list[Outcome], limit: int, window_seconds: float) -> str:
    """The outcomes as a text table, a row each."""
    most = f"most in any {window_seconds:g} s"
    rows = [("workload", "algorithm", "sent", "admitted", most)]
    for o in outcomes:
        rows.append((o.workload.name, o.algorithm.value, str(len(o.admitted)), str(sum(o.admitted)),
                     f"{o.most_in_window}" + (f"  ({o.most_in_window / limit:g}x the limit)"
                                              if o.most_in_window > limit else "")))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(r, widths, strict=False)) + "  " + r[4] for r in rows]
    return "\n".join([f"limit: {limit} requests per {window_seconds:g} s", *lines])


def draw(outcomes: list[Outcome], limit: int, window_us: int, path: Path) -> None:
    """Draw ``outcomes`` into the PNG at ``path``: a row per workload, a column per algorithm; in each, the
    requests admitted (green) and rejected (red) over time, and the admitted count of the rolling window
    against the limit. Raises ImportError without matplotlib."""
    import matplotlib  # noqa: PLC0415  # optional (slidegate[plot]): only this command needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    names = list(dict.fromkeys(o.workload.name for o in outcomes))
    algorithms = list(dict.fromkeys(o.algorithm for o in outcomes))
    fig, axes = plt.subplots(len(names), len(algorithms), figsize=(4.2 * len(algorithms), 2.7 * len(names)),
                             sharey=True, squeeze=False)
    for o in outcomes:
        ax = axes[names.index(o.workload.name)][algorithms.index(o.algorithm)]
        span = o.workload.windows * window_us
        kept = [t for t, ok in zip(o.workload.times_us, o.admitted, strict=True) if ok]
        refused = [t for t, ok in zip(o.workload.times_us, o.admitted, strict=True) if not ok]
        grid = [span * i // SAMPLES for i in range(SAMPLES + 1)]
        ax.step([g / window_us for g in grid], [rolling_count(kept, window_us, g) for g in grid], where="post",
                color="#1f77b4", label="admitted in the last window")
        ax.axhline(limit, color="black", linestyle="--", linewidth=1, label="limit")
        ax.eventplot([[t / window_us for t in kept], [t / window_us for t in refused]],
                     lineoffsets=[-0.06 * limit, -0.16 * limit], linelengths=0.08 * limit,
                     colors=["#2ca02c", "#d62728"], linewidths=0.8)
        for boundary in range(1, o.workload.windows):
            ax.axvline(boundary, color="#bbbbbb", linewidth=0.6, zorder=0)
        over = o.most_in_window > limit
        ax.set_title(f"{o.algorithm.value}: most {o.most_in_window}", fontsize=10,
                     color="#d62728" if over else "black", fontweight="bold" if over else "normal")
        ax.set_xlim(0, o.workload.windows)
        ax.set_ylim(-0.25 * limit, 2.2 * limit)
        if o.algorithm is algorithms[0]:
            ax.set_ylabel(o.workload.name, fontsize=9)
        if o.workload.name == names[-1]:
            ax.set_xlabel("time (windows)")
    axes[0][0].legend(loc="upper left", fontsize=7)
    fig.suptitle(f"{limit} requests per window: admitted (green) and rejected (red) requests, and the most "
                 "admitted in any rolling window", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
