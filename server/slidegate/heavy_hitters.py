"""The heaviest items of a stream in bounded memory: Metwally, Agrawal and El Abbadi's Space-Saving ("Efficient
computation of frequent and top-k elements in data streams", 2005) over its Stream-Summary, so that counting an
item costs a few dictionary operations whatever the number of distinct items seen.

At most ``capacity`` items are counted. An item not counted takes the place of one of the least counted, with
that count plus one, the count it took over kept as its ``error``: an item's true count lies between
``count - error`` and ``count``, and every item whose true count exceeds the least count kept is kept. On a
skewed stream (a few callers doing most of the over-limit calls) the heaviest items are kept with exact or
nearly exact counts.

Summaries merge (``merge``) by adding counts; an item absent from a full summary may have been seen there up to
that summary's least count, which its merged count and error add.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Generic, NamedTuple, TypeVar

T = TypeVar("T", bound=Hashable)


class Counted(NamedTuple, Generic[T]):
    """One item of a summary: ``seen``, at least its true count, and ``error``, at most seen - its true count."""

    item: T
    seen: int
    error: int


class SpaceSaving(Generic[T]):
    """A Space-Saving summary of at most ``capacity`` items (see the module docstring)."""

    __slots__ = ("_buckets", "_counts", "_errors", "_least", "capacity")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a summary holds at least one item, not {capacity}")
        self.capacity = capacity
        self._counts: dict[T, int] = {}
        self._errors: dict[T, int] = {}
        # the Stream-Summary: the items of each count (dicts as ordered sets), and the least count kept
        self._buckets: dict[int, dict[T, None]] = {}
        self._least = 0

    def __len__(self) -> int:
        return len(self._counts)

    @property
    def least(self) -> int:
        """The least count kept once full (an item not kept was seen at most this often), 0 before."""
        return self._least if len(self._counts) >= self.capacity else 0

    def add(self, item: T) -> None:
        """Count one occurrence of ``item``. In every over-limit call's path: the moves are written out here."""
        counts, buckets = self._counts, self._buckets
        count = counts.get(item)
        if count is None:
            if len(counts) < self.capacity:
                self._errors[item] = count = 0
                self._least = 1
            else:
                count = self._evict()
                self._errors[item] = count
        else:
            bucket = buckets[count]
            if len(bucket) == 1:  # the item alone at its count: its bucket moves up with it when none is there
                del buckets[count]
                if count == self._least:
                    self._least = count + 1
                if count + 1 not in buckets:
                    counts[item] = count + 1
                    buckets[count + 1] = bucket
                    return
            else:
                del bucket[item]
        counts[item] = count + 1
        above = buckets.get(count + 1)
        if above is None:
            buckets[count + 1] = {item: None}
        else:
            above[item] = None

    def _evict(self) -> int:
        """Drop one of the least counted items; return its count."""
        least = self._least
        bucket = self._buckets[least]
        evicted = next(iter(bucket))
        del bucket[evicted], self._counts[evicted], self._errors[evicted]
        if not bucket:
            del self._buckets[least]
            self._least = least + 1  # the new item goes to least + 1
        return least

    def top(self, n: int | None = None) -> list[Counted[T]]:
        """The ``n`` (None: all) most counted items, most first (ties in the order they reached their count)."""
        ranked = sorted(self._counts.items(), key=lambda pair: -pair[1])
        return [Counted(item, count, self._errors[item]) for item, count in ranked[:n]]


def merge(summaries: Iterable[tuple[Iterable[Counted[T]], int]], n: int) -> list[Counted[T]]:
    """The ``n`` most counted items of several summaries, each given as its items and its ``least`` (0 when not
    full): counts and errors added, an item absent from a full summary counted there as that summary's least, in
    its count and its error, so that as in one summary its true count lies between ``seen - error`` and ``seen``."""
    counts: dict[T, int] = {}
    errors: dict[T, int] = {}
    seen: list[tuple[set[T], int]] = []
    for items, least in summaries:
        present = set()
        for item, count, error in items:
            counts[item] = counts.get(item, 0) + count
            errors[item] = errors.get(item, 0) + error
            present.add(item)
        if least:
            seen.append((present, least))
    for present, least in seen:
        for item in counts.keys() - present:
            counts[item] += least
            errors[item] += least
    ranked = sorted(counts.items(), key=lambda pair: -pair[1])[:n]
    return [Counted(item, count, errors[item]) for item, count in ranked]
