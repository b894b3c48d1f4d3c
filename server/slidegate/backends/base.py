"""The backend contract: decide the limited descriptors of one request at once, all-or-nothing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from slidegate.algorithms import MAX_EXACT, Algorithm, token_bucket_ticks


class BackendUnavailable(Exception):
    """The backend did not answer in time or at all (Redis down, timeout). The service maps it to gRPC
    UNAVAILABLE so that Envoy's ``failure_mode_deny`` decides."""


class DeadlineExceeded(BackendUnavailable):
    """The caller's deadline, shorter than the backend's own timeout, ran out: says nothing about the
    backend's health (a circuit breaker does not count it)."""


@dataclass(frozen=True, slots=True)
class Check:
    """One limited descriptor of a request.

    ``key``: storage key of the limit; ``algorithm``: how it is counted; ``limit``: hits allowed per window
    (requests_per_unit); ``window_us``: window length in microseconds; ``hits``: hits this request adds
    (0 = check only; negative = give hits back, Envoy's ``is_negative_hits``); ``burst``: token-bucket
    capacity (None = ``limit``); ``stop_when_over``: fixed window only — do not count hits of a request that
    is over limit (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT); ``shadow``: being over does not reject the
    request (shadow or quota mode).
    """

    key: str
    limit: int
    window_us: int
    hits: int
    algorithm: Algorithm = Algorithm.SLIDING_WINDOW_LOG
    burst: int | None = None
    stop_when_over: bool = False
    shadow: bool = False

    def params(self) -> tuple[int, int, int]:
        """The algorithm's three parameters, as lua/<algorithm>.lua and the memory backend take them."""
        if self.algorithm is Algorithm.TOKEN_BUCKET:
            return (self.limit if self.burst is None else self.burst, *token_bucket_ticks(self.limit, self.window_us))
        return self.limit, self.window_us, int(self.stop_when_over)

    def clamped_hits(self) -> int:
        """``hits`` bounded so every implementation computes exactly (in Lua doubles): any number of hits
        above what the limit (or bucket) can ever hold is equally over limit, and giving back more than was
        ever counted empties the limit either way."""
        if self.hits < 0:
            return max(self.hits, -(MAX_EXACT // 4))
        if self.algorithm is Algorithm.FIXED_WINDOW:
            return min(self.hits, MAX_EXACT // 4)  # fixed windows count denied hits too: keep their number
        return min(self.hits, (self.limit if self.burst is None else max(self.limit, self.burst)) + 1)


@dataclass(frozen=True, slots=True)
class Outcome:
    """The decision for one Check. ``remaining``: hits left in the window after this request;
    ``reset_us``: microseconds until the oldest counted hit leaves the window (within limit) or until this
    request's hits would fit (over limit)."""

    over: bool
    remaining: int
    reset_us: int


@dataclass(frozen=True, slots=True)
class Decision:
    """``admitted``: every check had room, so every check's hits were recorded; otherwise none were.
    ``cached``: answered from what this process remembers (slidegate.backends.blocked), not by the storage."""

    admitted: bool
    outcomes: list[Outcome]
    cached: bool = False


class Backend(Protocol):
    """Storage for the limiter."""

    async def decide(
        self, checks: Sequence[Check], now_us: int | None = None, timeout: float | None = None
    ) -> Decision:
        """Decide ``checks`` together, all-or-nothing. ``now_us`` overrides the backend's clock (tests);
        None uses the backend's own clock (Redis TIME). ``timeout`` (seconds) shortens the backend's own
        time limit, e.g. to the caller's gRPC deadline. Raises BackendUnavailable."""
        ...

    async def ping(self) -> None:
        """Raise BackendUnavailable unless the backend answers."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...

    def describe(self) -> str:
        """A short human description (e.g. ``redis://127.0.0.1:6379/0``), never containing a password."""
        ...
