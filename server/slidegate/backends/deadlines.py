"""Many deadlines on one timer: callbacks due at given loop times, most of which will find nothing to do.

Every call to Redis has two deadlines (its caller's, and its batch's) that almost never expire. A timer of
the loop for each (two ``asyncio.timeout``) cost a lone call about 45 µs of event-loop CPU on the benchmark
machine (measured in one process, calls one after another: 160 µs per call with no deadline at all, 207 µs
with the two timers, 183 µs with this); here a deadline is one push on a heap, and one timer of the loop,
armed for the earliest deadline, runs every callback that is due when it fires. The commonest two, a batch's
bound and the deadline of a caller whose item left alone, are not kept here but while their batch is out
(slidegate.backends.batching): an entry here lives until it is due, and the thousands alive under load cost
more than the heap's work. This heap holds the rest: items waiting for a place, or sent with others.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections.abc import Callable

GRANULARITY = 0.002  # seconds deadlines this close together share one timer (plus the loop's own ~1 ms rounding)
# A timer that fires this many seconds late was held up by this process (a garbage collection, a busy loop, the
# process stopped), not by Redis, whose answer may be waiting unread meanwhile. Deadlines fire 2-4 ms late in the
# normal run of things.
LATE_TIMER = 0.02
COMPACT_AT = 4096  # entries: above this (and twice the live ones last seen), finished ones are dropped


class Alarm:
    """One timer of the loop, armed for the earliest moment asked (GRANULARITY later: moments this close share
    it); when it goes off, ``ring`` runs with the loop, and arms it again for whatever is due next. Its owner
    cancels it before arming it in another event loop (where the old one's timer will never fire)."""

    def __init__(self, ring: Callable[[asyncio.AbstractEventLoop], None]) -> None:
        self._ring = ring
        self._timer: asyncio.TimerHandle | None = None
        self._at = math.inf

    def arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        """Go off at ``when`` (the loop's time) unless set to go off sooner."""
        if when + GRANULARITY < self._at:
            if self._timer is not None:
                self._timer.cancel()
            self._at = when + GRANULARITY
            self._timer = loop.call_at(self._at, self._rang, loop)

    def cancel(self) -> None:
        """Go off at no moment until armed again."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._at = None, math.inf

    def _rang(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer, self._at = None, math.inf
        self._ring(loop)


class Deadlines:
    """Runs each ``add``-ed callback in the loop once its time (``loop.time()`` seconds) has passed, a few ms
    late at most (GRANULARITY and the loop's own timer rounding: 2 to 4 ms measured), unless ``done()`` says
    its work is over. Entries are not removed when their call ends: they are dropped when due, or when the
    heap holds COMPACT_AT entries and twice the live ones it held after the last such sweep."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[], object], Callable[[], bool]]] = []
        self._compact_at = COMPACT_AT
        self._order = itertools.count()  # equal times: first added, first run (never compares callbacks)
        self._alarm = Alarm(self._fire)
        self._loop: asyncio.AbstractEventLoop | None = None

    def add(self, loop: asyncio.AbstractEventLoop, when: float, callback: Callable[[], object],
            done: Callable[[], bool]) -> None:
        """Run ``callback`` in ``loop`` (the running one) at ``when`` unless ``done()`` by then."""
        if loop is not self._loop:
            # used from another event loop (a test's asyncio.run after another): the deadlines of the old one
            # went with it, and its timer will never fire
            self._alarm.cancel()
            self._heap, self._loop = [], loop
        if len(self._heap) >= self._compact_at:
            self._heap = [entry for entry in self._heap if not entry[3]()]
            heapq.heapify(self._heap)
            self._compact_at = max(COMPACT_AT, 2 * len(self._heap))
        heapq.heappush(self._heap, (when, next(self._order), callback, done))
        self._alarm.arm(loop, when)

    def __len__(self) -> int:
        """The entries kept: those not yet due, and finished ones not yet dropped (see the class docstring)."""
        return len(self._heap)

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        while self._heap and self._heap[0][0] <= now:
            _, _, callback, done = heapq.heappop(self._heap)
            if done():
                continue
            try:
                callback()
            except Exception as exc:  # one failing callback must not keep the later deadlines from firing
                loop.call_exception_handler({"message": "deadline callback failed", "exception": exc})
        if self._heap:
            self._alarm.arm(loop, self._heap[0][0])


class LoopWatch:
    """Since when this process's event loop has been running on time, while ``busy()`` (some round trip is out):
    a timer every TICK seconds notes when it fired more than LATE_TIMER late. Time the loop did not run is no
    evidence about Redis: its answer may have come meanwhile and not been read yet."""

    TICK = 0.005
    UNSEEN = TICK + LATE_TIMER  # the longest stall the watch may not have seen (one that did not delay a tick)

    def __init__(self, busy: Callable[[], bool]) -> None:
        self._busy = busy
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last_tick = -math.inf
        self._resumed = -math.inf

    def watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Tick in ``loop`` (the running one) until nothing is busy."""
        if self._timer is None or self._loop is not loop:
            self._loop = loop
            self._last_tick = self._resumed = time.monotonic()
            self._timer = loop.call_later(self.TICK, self._tick)

    def steady_since(self, now: float) -> float:
        """When the loop last resumed from a stall (``now`` when that cannot be told: no tick seen lately)."""
        if now - self._last_tick > self.UNSEEN:
            return now
        return self._resumed

    def _tick(self) -> None:
        now = time.monotonic()
        if now - self._last_tick > self.UNSEEN:
            self._resumed = now
        self._last_tick = now
        assert self._loop is not None
        self._timer = self._loop.call_later(self.TICK, self._tick) if self._busy() else None

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
