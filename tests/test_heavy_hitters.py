"""Space-Saving (slidegate.heavy_hitters): its guarantees on any stream, the true heaviest items of a seeded Zipf
stream, its bounded memory, and merged summaries."""

from __future__ import annotations

import random
import tracemalloc
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from slidegate.heavy_hitters import SpaceSaving, merge


def zipf_stream(draws: int, distinct: int, exponent: float, seed: int) -> list[int]:
    """``draws`` items of ``distinct``, the k-th most likely with weight 1/k**exponent, shuffled by ``seed``."""
    weights = [1 / (k ** exponent) for k in range(1, distinct + 1)]
    return random.Random(seed).choices(range(distinct), weights=weights, k=draws)


@given(st.lists(st.integers(0, 30), max_size=300), st.integers(1, 12))
def test_every_count_bounds_its_items_true_count(stream: list[int], capacity: int) -> None:
    summary: SpaceSaving[int] = SpaceSaving(capacity)
    for item in stream:
        summary.add(item)
    true = Counter(stream)
    kept = summary.top()
    assert len(kept) == min(capacity, len(true))
    assert sum(c.seen for c in kept) == len(stream)  # Space-Saving's counts always add up to the stream
    for item, seen, error in kept:
        assert seen - error <= true[item] <= seen
    # whatever was seen more often than the least count kept is kept
    assert {item for item, n in true.items() if n > summary.least} <= {c.item for c in kept}


def test_the_top_of_a_zipf_stream_is_its_true_heaviest_items() -> None:
    stream = zipf_stream(200_000, 100_000, 1.1, seed=38)
    summary: SpaceSaving[int] = SpaceSaving(64)
    for item in stream:
        summary.add(item)
    true = Counter(stream).most_common(10)
    shown = summary.top(10)
    assert [c.item for c in shown] == [item for item, _ in true]
    for (_, count), counted in zip(true, shown, strict=True):
        assert counted.seen - counted.error <= count <= counted.seen


def test_memory_stays_flat_whatever_the_number_of_distinct_items() -> None:
    summary: SpaceSaving[str] = SpaceSaving(64)
    tracemalloc.start()
    try:
        for n in range(10_000):
            summary.add(f"caller-{n}")
        after_10k = tracemalloc.get_traced_memory()[0]
        for n in range(10_000, 100_000):
            summary.add(f"caller-{n}")
        after_100k = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(summary) == 64
    assert after_100k - after_10k < 4096  # the same 64 entries; a few bytes of dict slack, never per caller


def test_merged_summaries_find_the_heaviest_items_of_the_whole_stream() -> None:
    stream = zipf_stream(60_000, 20_000, 1.2, seed=7)
    parts: list[SpaceSaving[int]] = [SpaceSaving(64) for _ in range(3)]
    for n, item in enumerate(stream):
        parts[n % 3].add(item)
    merged = merge(((p.top(), p.least) for p in parts), 5)
    true = Counter(stream)
    assert [c.item for c in merged] == [item for item, _ in true.most_common(5)]
    for item, seen, error in merged:
        assert seen - error <= true[item] <= seen
