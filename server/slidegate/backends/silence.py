"""Whether a Redis answers: the round trips at it now, when it last answered, and its breaker. A call that cannot
wait as long as Redis has already been silent is refused at once, so that its failure mode answers in time."""

from __future__ import annotations

import asyncio
import itertools
import time

from slidegate.backends.base import BackendUnavailable
from slidegate.backends.breaker import Breaker
from slidegate.backends.deadlines import LoopWatch


class Silence:
    """One Redis's round trips (``ask`` when one starts, ``forget`` when it ends), its answers (``answered``,
    error replies included: Redis is there) and failures (``failed``: evidence for the ``breaker``)."""

    def __init__(self, name: str, breaker: Breaker | None) -> None:
        self._name = name
        self._breaker = breaker
        # round trips at Redis now (their start, by a number of their own) and Redis's last answer: how long it
        # has been silent while asked
        self._asked: dict[int, float] = {}
        self._asking = itertools.count()
        self._last_answer = 0.0
        self._watch = LoopWatch(lambda: bool(self._asked))

    def ask(self, loop: asyncio.AbstractEventLoop) -> int:
        """A round trip starts on ``loop``: its number, for ``forget``."""
        asking = next(self._asking)
        self._asked[asking] = time.monotonic()
        self._watch.watch(loop)
        return asking

    def forget(self, asking: int) -> None:
        """Round trip ``asking`` is over (answered, failed, or given up with its event loop)."""
        self._asked.pop(asking, None)

    def answered(self) -> None:
        self._last_answer = time.monotonic()
        breaker = self._breaker
        if breaker is not None and not breaker.clear:
            breaker.answered()

    def failed(self, reason: str) -> None:
        if self._breaker is not None:
            self._breaker.failed(reason)

    def refusal(self, timeout: float | None) -> BackendUnavailable | None:
        """Why a call must not go to Redis now (its failure mode answers at once), or None: the breaker is open,
        or Redis has been silent for longer than the call can wait."""
        breaker = self._breaker
        if breaker is not None and not breaker.clear and not breaker.allow():
            return BackendUnavailable(f"{self._name}: failing ({breaker.reason}); calls fail at once "
                                      "until Redis answers again")
        if timeout is None or not self._asked:
            return None
        # a call does not queue behind a Redis that has already been silent longer than the call can wait
        # (Envoy's 20 ms): its failure mode answers at once instead of just before the deadline, when the
        # answer may no longer make it (measured: 15% late under load with CLIENT PAUSE). Silent while this
        # process ran, that is: an answer may be waiting unread after a pause of our own.
        now = time.monotonic()
        # a stall of ours shorter than the watch can tell (LoopWatch.UNSEEN) may hide in that silence
        longest = timeout + LoopWatch.UNSEEN
        if now - self._last_answer < longest:
            return None  # an answer came lately (under load, nearly always): silent for less than that
        oldest = next(iter(self._asked.values()))  # round trips are kept in the order they began
        silent = now - max(self._last_answer, oldest, self._watch.steady_since(now))
        if silent >= longest:
            return BackendUnavailable(f"{self._name}: silent for {silent * 1000:.0f} ms, longer than the "
                                      f"call can wait ({timeout * 1000:.0f} ms)")
        return None

    def stop(self) -> None:
        self._watch.stop()
