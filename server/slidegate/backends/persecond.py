"""REDIS_PERSECOND: the limits of one second kept in a Redis of their own, as envoyproxy/ratelimit keeps its
per-second limits (their keys come and go every second, and the traffic on them is the heaviest) apart from the
others.

A limit goes to the per-second Redis when its window is exactly one second: unit ``second`` (the reference's
rule, which has no unit_multiplier), and with slidegate's ``unit_multiplier`` 1 only: a limit of several seconds
is kept with the others. A request whose limits are all on one side is that Redis's call alone. A request with
limits on both is still all-or-nothing: each side decides its share so that it can be undone, and when one
rejects (or fails), the side that admitted is undone (slidegate.backends.spanning, the same
protocol as a request spanning cluster slots); no limit is ever admitted beyond itself. Each side keeps its own
breaker, batches and connections: a Redis that fails takes the failure mode to the requests that need it, and
only to those.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from slidegate.backends.base import Check, Decision
from slidegate.backends.redis import RedisBackend
from slidegate.backends.spanning import decide_spanning

ONE_SECOND_US = 1_000_000


def is_per_second(check: Check) -> bool:
    """Whether ``check``'s limit belongs in the per-second Redis: a window of exactly one second."""
    return check.window_us == ONE_SECOND_US


class PerSecondBackend:
    """``main`` for every limit but those of one second, which ``per_second`` keeps (see the module docstring).
    Same interface as a backend; closing it closes both."""

    def __init__(self, main: RedisBackend, per_second: RedisBackend) -> None:
        self._main = main
        self._per_second = per_second

    def describe(self) -> str:
        return f"{self._main.describe()}; limits of one second: {self._per_second.describe()}"

    def _side(self, check: Check) -> RedisBackend:
        return self._per_second if is_per_second(check) else self._main

    async def decide(
        self, checks: Sequence[Check], now_us: int | None = None, timeout: float | None = None
    ) -> Decision:
        """Decide ``checks`` in the Redis that keeps them, all-or-nothing across both. Raises BackendUnavailable
        when a Redis they need cannot decide (and no live one rejects), DeadlineExceeded when ``timeout``
        (shorter than the backends' own) ran out."""
        per_second = sum(map(is_per_second, checks))
        if per_second == 0:
            return await self._main.decide(checks, now_us, timeout)
        if per_second == len(checks):
            return await self._per_second.decide(checks, now_us, timeout)
        return await decide_spanning(checks, self._side, now_us, timeout, self.describe())

    async def ping(self) -> None:
        """Raise BackendUnavailable unless both answer: a request may need either."""
        # both asked at once, and both awaited: a ping abandoned half-way would leave its connection unread
        for result in await asyncio.gather(self._main.ping(), self._per_second.ping(), return_exceptions=True):
            if isinstance(result, BaseException):
                raise result

    async def close(self) -> None:
        await asyncio.gather(self._main.close(), self._per_second.close())
