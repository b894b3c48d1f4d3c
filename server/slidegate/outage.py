"""The log of a storage outage (OutageLog): told of every decision the storage made or failed to make."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

# the logger the service always logged outages under, which operators filter by
log = logging.getLogger("slidegate.service")


class OutageLog:
    """The log of a storage outage: its first failed call at once, then at most one line every LINE_EVERY seconds
    with the count, and one line when the storage itself answers again with no call failing for QUIET seconds
    (an answer from the over-limit cache is not the storage; a cluster with one master down answers and fails
    by turns, and failures a few seconds apart are one outage, not a line each). One line per failed call
    flooded the log (2,624 lines in 40 s)."""

    LINE_EVERY = 10.0
    QUIET = 10.0

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._first: float | None = None  # the first failure since the storage last answered for QUIET s
        self._last = 0.0  # the last failure
        self._failed = 0  # calls failed since the last line
        self._last_line: float | None = None
        self._announced = False  # a line said that this outage began
        # whether an outage is being followed (answered has something to do): a decision asks it before telling
        # the log of each answer, a call fewer on every call of a healthy service
        self.failing = False

    def failed(self, reason: str) -> None:
        now = self._clock()
        self._failed += 1
        self._last = now
        if self._first is None:
            self._first = now
            self.failing = True
        if self._last_line is None or now - self._last_line >= self.LINE_EVERY:
            log.warning("storage unavailable: calls failed or decided by the failure mode%s: %d; last: %s",
                        "" if self._last_line is None else f" in the last {now - self._last_line:.0f} s", self._failed,
                        reason)
            self._failed, self._last_line, self._announced = 0, now, True

    def answered(self) -> None:
        if self._first is None:
            return
        now = self._clock()
        if now - self._last < self.QUIET:
            return
        if self._announced:
            log.warning("storage answering again: no call failed for %.1f s, after failures for %.1f s (calls failed "
                        "since the last line: %d)", now - self._last, self._last - self._first, self._failed)
            # the next outage is told at once
            self._failed, self._announced, self._last_line = 0, False, None
        self._first = None
        self.failing = False
