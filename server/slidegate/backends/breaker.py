"""A circuit breaker around a backend: while the storage is failing, calls fail at once instead of each
waiting for its timeout, and a trial call now and then finds out when it is back.

Closed: calls go through; ``failures`` failures in a row, or a failed ping (the health check's, every second),
open it. Open: calls raise BackendUnavailable
immediately for ``cooldown`` seconds. Then one call is let through (half-open): success closes the breaker,
failure opens it again.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from slidegate.backends.base import Backend, BackendUnavailable, Check, DeadlineExceeded, Decision


class CircuitBreaker:
    """``backend`` behind a breaker (see the module docstring). Same interface as the backend."""

    def __init__(self, backend: Backend, *, failures: int = 3, cooldown: float = 1.0) -> None:
        self._backend = backend
        self._threshold = failures
        self._cooldown = cooldown
        self._failures = 0
        self._open_until = 0.0
        self._trial = False  # a half-open trial call is in flight

    @property
    def is_open(self) -> bool:
        return self._failures >= self._threshold

    def describe(self) -> str:
        return self._backend.describe()

    async def decide(
        self, checks: Sequence[Check], now_us: int | None = None, timeout: float | None = None
    ) -> Decision:
        """The backend's decision, or BackendUnavailable at once while the breaker is open."""
        if self.is_open:
            if time.monotonic() < self._open_until or self._trial:
                raise BackendUnavailable("storage circuit open after repeated failures")
            self._trial = True
        try:
            decision = await self._backend.decide(checks, now_us, timeout)
        except DeadlineExceeded:
            raise  # the caller was in a hurry: not the storage's fault
        except BackendUnavailable:
            self._failures += 1
            if self.is_open:
                self._open_until = time.monotonic() + self._cooldown
            raise
        finally:
            self._trial = False
        self._failures = 0
        return decision

    async def ping(self) -> None:
        """The backend's ping. A failed ping opens the breaker at once: it had the backend's whole timeout, so
        the storage is down or hung, even when every caller's own deadline is too short to tell (Envoy's 20 ms
        against REDIS_TIMEOUT's 250)."""
        try:
            await self._backend.ping()
        except BackendUnavailable:
            self._failures = max(self._failures, self._threshold)
            self._open_until = time.monotonic() + self._cooldown
            raise

    async def close(self) -> None:
        await self._backend.close()
