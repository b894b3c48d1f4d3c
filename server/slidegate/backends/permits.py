"""Permits: at most ``n`` script calls at Redis at once (REDIS_POOL_SIZE), with a way to take one without waiting.

asyncio.Semaphore can only be taken by awaiting it; the Redis backend's common path writes a batch from a
callback, with no task to await in, and goes the slower way (a task that waits) only when no permit is free.
"""

from __future__ import annotations

import asyncio
from collections import deque


class Permits:
    """``n`` permits; a permit given back goes to the longest waiter first."""

    def __init__(self, n: int) -> None:
        self._free = n
        self._waiters: deque[asyncio.Future[None]] = deque()

    def take_now(self) -> bool:
        """Take a permit if one is free and nobody waits for one (a waiter is never overtaken)."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return True
        return False

    async def take(self) -> None:
        """Take a permit, waiting for one."""
        if self.take_now():
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.give()  # handed a permit just as the waiter gave up: it goes to the next
            raise
        finally:
            if not waiter.done():
                waiter.cancel()

    def give(self) -> None:
        """Give a permit back."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1
