"""The circuit breaker of the Redis backend: while Redis itself is failing, calls fail at once instead of each
waiting for its timeout, and one call now and then (a probe) finds out when Redis is back.

It opens on evidence that Redis is failing, never on one accident: at least ``failures`` failed round trips (a
script call carrying a batch of requests, or a health ping: each counts once, however many requests it carried)
and no script answered for at least ``open_after`` seconds. A failed round trip is a connection that could not
be made, or no answer within REDIS_TIMEOUT while this process ran (a deadline that fired late because the
process itself was paused — a garbage collection, a busy loop — gives the round trip a grace instead,
slidegate.backends.batching). A connection that breaks under a call (CLIENT KILL, a restart) fails the calls it
carried, but is no evidence: the next call connects afresh, and if that fails, it counts. Measured before this
rule: one killed connection, or one batch of three calls cut off, opened the breaker for a second, and every
call of that second failed (100 of 400 at 100 calls/s).

Open: calls raise BackendUnavailable at once, except one every ``cooldown`` seconds (the probe), which goes to
Redis; any script answer closes it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from slidegate.logs import Repeated

log = logging.getLogger(__name__)


class Breaker:
    """The breaker's state (see the module docstring). ``clock``: seconds, monotonic (tests replace it)."""

    def __init__(self, *, failures: int = 3, open_after: float = 0.5, cooldown: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._threshold = failures
        self._open_after = open_after
        self._cooldown = cooldown
        self._clock = clock
        self._failures = 0  # failed round trips since the last answer
        self._first_failure = 0.0  # when the first of them failed
        self._opened_at: float | None = None
        self._next_probe = 0.0
        self.reason = ""  # the last failure's
        # no round trip failed since Redis last answered: allow() says yes and answered() has nothing to undo (read
        # before calling them, a call fewer on each of a healthy Redis's calls)
        self.clear = True
        self._opened = Repeated(log, "%s")  # a Redis that flaps opens it every few seconds

    @property
    def is_open(self) -> bool:
        return self._opened_at is not None

    def allow(self) -> bool:
        """Whether a call may go to Redis now: always while closed; while open, one call each ``cooldown``."""
        if self._opened_at is None:
            return True
        now = self._clock()
        if now < self._next_probe:
            return False
        self._next_probe = now + self._cooldown
        return True

    def answered(self) -> None:
        """Redis answered a script call (an error reply too: it is running). The service says so in its log."""
        self._failures, self._opened_at = 0, None
        self.clear = True

    def failed(self, reason: str) -> None:
        """A round trip failed for ``reason`` (a connection that could not be made, no answer in time)."""
        now = self._clock()
        self.clear = False
        if self._failures == 0:
            self._first_failure = now
        self._failures += 1
        self.reason = reason
        if (self._opened_at is None and self._failures >= self._threshold
                and now - self._first_failure >= self._open_after):
            self._opened_at = now
            self._next_probe = now + self._cooldown
            self._opened(f"storage failing for {now - self._first_failure:.1f} s ({self._failures} failed round "
                         f"trips, the last: {reason}): calls skip it (the failure mode answers them) until a probe "
                         f"every {self._cooldown:.0f} s gets an answer")
