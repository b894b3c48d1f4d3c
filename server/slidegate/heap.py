"""Keeping `slidegate serve`'s heap in shape: short garbage-collection pauses from the first call on and while
the service remembers thousands of requests, and the memory of large requests given back to the system.

A remembered request (slidegate.decider) holds about 34 objects the collector tracks; 10,000 of them made each
full collection walk 340,000 objects, a pause of 170-250 ms measured on a 2-core machine — the whole of
REDIS_TIMEOUT, and ten times Envoy's default deadline, for every call in flight. Frozen objects
(``gc.freeze``) are left out of collections: the remembered requests are frozen as they accumulate, and when
the service forgets them all at once, everything is unfrozen and collected while little is left to walk (7 ms
measured). Objects are still freed by reference counting while frozen; only garbage cycles among frozen objects
wait, for a collection once there are STRAY_FROZEN of them. Young garbage is collected before each freeze, so
that few cycles are frozen at all. Freeing the forgotten requests is spread over turns
of the event loop too: dropping 10,000 requests of 8 descriptors at once held the loop 60-70 ms.

A large request's pieces are smaller than glibc's mmap threshold (slidegate.allocator) and come from its heap,
which it keeps when they are freed: 256 concurrent requests of 1 MB left 300 MB behind, and ``malloc_trim``
gave back all but 8 of them. So the heap is trimmed a second after a large request, and again a second later
as long as large requests keep coming (once a second at most).

Used by ``slidegate serve`` only: ``gc.freeze`` is process-wide, and a program embedding the service may freeze
for its own reasons.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from slidegate.allocator import trim

FREEZE_EVERY = 1000  # remembered requests between freezes (each one costs microseconds)
FREE_PER_TURN = 200  # forgotten requests freed in one turn of the event loop (about a millisecond)
# Frozen objects that are not freed with the requests (garbage cycles that were alive when frozen) are left for
# a collection once they are this many: each such collection walks every object again, startup's included
# (10-20 ms), so it is kept rare; the leak it bounds grew by about 10,000 objects per 12,000 distinct requests
# before young garbage was collected ahead of each freeze (Heap.remembered), 40 times fewer since.
STRAY_FROZEN = 100_000
# seconds between two counts of the frozen objects: gc.get_freeze_count walks them all, 93,000 after startup, and held
# the loop 9-12 ms, after every reload when counted each time the service forgot its requests (a config reloaded
# every second under load raised ShouldRateLimit's p99); strays grow by some 250 objects per 12,000 distinct
# requests, so a count a minute at most still bounds them
COUNT_FROZEN_EVERY = 60.0
LARGE_REQUEST = 8 * 1024  # bytes: a request this large has its memory given back a second later
TRIM_AFTER = 1.0  # seconds


class Heap:
    """Told by the service when it remembers a request, when it forgets them all, and of large requests."""

    def __init__(self, freeze_every: int = FREEZE_EVERY) -> None:
        self._freeze_every = freeze_every
        self._since = 0
        self._trim: asyncio.TimerHandle | None = None
        self._more_large = False  # a large request came after the trim was set
        self._forgotten: list[dict[Any, Any]] = []  # being freed, a slice a turn
        self._freeing: asyncio.Handle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # of the handles above
        self._frozen = 0  # objects frozen after the last full collection
        self._counted = -COUNT_FROZEN_EVERY  # when the frozen objects were last counted (the loop's time)

    @property
    def frozen(self) -> int:
        """How many objects the last full collection left frozen (gc.freeze): what is kept out of the next ones."""
        return self._frozen

    def started(self) -> None:
        """The process has set itself up: what it made (the imported modules, about 100,000 objects) is frozen,
        or the first full collection, a few calls in, walked it all (16 ms, most of Envoy's default deadline)."""
        self._collect()

    def remembered(self) -> None:
        self._since += 1
        if self._since >= self._freeze_every:
            self._since = 0
            # garbage cycles not yet collected would be frozen with the requests, and stay until STRAY_FROZEN:
            # grpc.aio leaves one cycle of 7 objects per call (its _find_method_handler closure), so a run of new
            # requests at 500 calls/s froze about 150 objects a second; collected young first (about 1 ms,
            # 5 ms at most, measured), 40 times fewer are frozen
            gc.collect(1)
            gc.freeze()

    def forgot(self, remembered: dict[Any, Any]) -> None:
        """The service forgot every request in ``remembered`` (in the running event loop): they are freed a
        slice a turn, then frozen garbage is collected if there is much of it."""
        self._since = 0
        self._forgotten.append(remembered)
        self._in_this_loop()
        if self._freeing is None:
            self._freeing = asyncio.get_running_loop().call_soon(self._free_some)

    def _free_some(self) -> None:
        left = FREE_PER_TURN
        while self._forgotten and left:
            if self._forgotten[-1]:
                self._forgotten[-1].popitem()
                left -= 1
            else:
                self._forgotten.pop()
        if self._forgotten:
            self._freeing = asyncio.get_running_loop().call_soon(self._free_some)
            return
        self._freeing = None
        now = asyncio.get_running_loop().time()
        if now - self._counted >= COUNT_FROZEN_EVERY:
            self._counted = now
            if gc.get_freeze_count() > self._frozen + STRAY_FROZEN:
                self._collect()

    def _collect(self) -> None:
        """Collect every garbage cycle, frozen or not, and freeze what is left."""
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self._frozen = gc.get_freeze_count()

    def received(self, size: int) -> None:
        """A request of ``size`` bytes came (in the running event loop)."""
        if size < LARGE_REQUEST:
            return
        self._in_this_loop()
        if self._trim is None:
            self._trim = asyncio.get_running_loop().call_later(TRIM_AFTER, self._trimmed)
        else:
            self._more_large = True

    def _trimmed(self) -> None:
        trim()
        # what large requests that came since took is freed after this trim: once more, a second later
        self._trim = asyncio.get_running_loop().call_later(TRIM_AFTER, self._trimmed) if self._more_large else None
        self._more_large = False

    def _in_this_loop(self) -> None:
        """Handles of another event loop (one that ended) will never run: start afresh in this one."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._trim, self._freeing, self._more_large = loop, None, None, False
