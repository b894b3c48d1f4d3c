"""What docs/algorithms.md's tables claim, measured: the sliding-window counter's error, and the memory of a
full key per algorithm."""

from __future__ import annotations

import bisect
import random
import re
from pathlib import Path

import pytest

from bench.memory_per_key import measure
from slidegate.algorithms import Algorithm
from slidegate.backends.base import Backend, Check
from slidegate.backends.memory import MemoryBackend

ROOT = Path(__file__).resolve().parent.parent
S = 1_000_000
WINDOW = 10 * S
LIMIT = 100
T0 = 1_700_000_000 * S


async def busiest_window(algorithm: Algorithm, times: list[int], backend: Backend, key: str) -> int:
    """The most hits admitted in any rolling window (t - WINDOW, t] when requests come at ``times``."""
    admitted = []
    for t in times:
        if (await backend.decide([Check(key, LIMIT, WINDOW, 1, algorithm)], t)).admitted:
            admitted.append(t)
    return max(i - bisect.bisect_right(admitted, t - WINDOW) + 1 for i, t in enumerate(admitted))


ADVERSARIAL = [T0 + WINDOW - 1000] * LIMIT + [T0 + WINDOW + k * S // 10 for k in range(LIMIT)]


@pytest.mark.parametrize(("algorithm", "worst"), [
    (Algorithm.SLIDING_WINDOW_LOG, LIMIT),
    (Algorithm.SLIDING_WINDOW_COUNTER, 2 * LIMIT - 1),  # the documented bound, reached
    (Algorithm.FIXED_WINDOW, 2 * LIMIT),
    (Algorithm.TOKEN_BUCKET, 2 * LIMIT - 1),  # a full bucket, then its refill within one window
])
async def test_worst_case_rolling_window(backend: Backend, key_prefix: str, algorithm: Algorithm,
                                         worst: int) -> None:
    # a full limit just before a window edge, then a request every 0.1 s after it
    assert await busiest_window(algorithm, ADVERSARIAL, backend, f"{key_prefix}adv") == worst


@pytest.mark.parametrize(("rate", "at_most"), [(1.2, 112), (2.0, 106), (5.0, 102)])
async def test_counter_error_under_random_traffic(rate: float, at_most: int) -> None:
    # Poisson arrivals at `rate` times the limit for 10 minutes (seeded): the busiest rolling window holds
    # a few percent more than the limit, as docs/algorithms.md says
    rng = random.Random(1)
    times, t = [], T0
    while t < T0 + 600 * S:
        t += int(rng.expovariate(rate * LIMIT / WINDOW))
        times.append(t)
    backend = MemoryBackend()
    busiest = await busiest_window(Algorithm.SLIDING_WINDOW_COUNTER, times, backend, "k")
    await backend.close()
    assert LIMIT < busiest <= at_most


async def test_the_memory_table_is_measured(redis_url: str) -> None:
    sizes = await measure(redis_url)
    page = (ROOT / "docs" / "algorithms.md").read_text()
    for algorithm in Algorithm:
        row = re.search(rf"^\| `{algorithm.value}` \| (\d+) \| (\d+) \|$", page, re.MULTILINE)
        assert row, f"docs/algorithms.md has no memory row for {algorithm.value}"
        small, large = int(row.group(1)), int(row.group(2))
        assert small == pytest.approx(sizes[(algorithm, 100)], rel=0.15), algorithm
        assert large == pytest.approx(sizes[(algorithm, 1000)], rel=0.15), algorithm
