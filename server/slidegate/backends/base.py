"""The backend contract: decide the limited descriptors of one request at once, all-or-nothing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from slidegate.algorithms import MAX_EXACT, RULES, Algorithm


class BackendUnavailable(Exception):
    """The backend did not answer in time or at all (Redis down, timeout). The service maps it to gRPC
    UNAVAILABLE so that Envoy's ``failure_mode_deny`` decides."""


class DeadlineExceeded(BackendUnavailable):
    """The caller's deadline, shorter than the backend's own timeout, ran out: says nothing about the
    backend's health (a circuit breaker does not count it)."""


# Check, Outcome and Decision (and the limiter's Descriptor, Status and Plan, the service's Prepared) are
# NamedTuples, not frozen dataclasses: some are made on every call, the others for every new request, and a frozen
# dataclass of Status's eleven fields took 2.7 µs to make against 0.5 µs (its __init__ sets each field through
# object.__setattr__); a request never seen before was prepared in 9 µs against 15 µs (limiter.prepare). Being
# tuples, they equal any tuple of the same values: compare them with their own kind only.
class Check(NamedTuple):
    """One limited descriptor of a request.

    ``key``: storage key of the limit; ``algorithm``: how it is counted; ``limit``: hits allowed per window
    (requests_per_unit); ``window_us``: window length in microseconds; ``hits``: hits this request adds
    (0 = check only; negative = give hits back, Envoy's ``is_negative_hits``); ``burst``: token-bucket
    capacity (None = ``limit``); ``stop_when_over``: fixed window only — do not count hits of a request that
    is over limit (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT); ``shadow``: being over does not reject the
    request (shadow mode); ``quota``: quota mode, a shadow limit except that a request whose every quota limit
    is over is rejected (see ``admits``).
    """

    key: str
    limit: int
    window_us: int
    hits: int
    algorithm: Algorithm = Algorithm.SLIDING_WINDOW_LOG
    burst: int | None = None
    stop_when_over: bool = False
    shadow: bool = False
    quota: bool = False

    def params(self) -> tuple[int, int, int]:
        """The algorithm's three parameters, as lua/<algorithm>.lua and the memory backend take them."""
        return RULES[self.algorithm].params(self.limit, self.window_us, self.burst, self.stop_when_over)

    def clamped_hits(self) -> int:
        """``hits`` bounded so every implementation computes exactly (in Lua doubles): any number of hits
        above what the limit (or bucket) can ever hold is equally over limit, and giving back more than was
        ever counted empties the limit either way."""
        if self.hits < 0:
            return max(self.hits, -(MAX_EXACT // 4))
        rules = RULES[self.algorithm]
        if rules.counts_denied(self.stop_when_over):
            return min(self.hits, MAX_EXACT // 4)  # denied hits are counted too: keep their number
        return min(self.hits, rules.most_hits(self.limit, self.burst) + 1)

    def most_hits(self) -> int:
        """The most hits that can ever fit: a request of more is over limit for good."""
        return RULES[self.algorithm].most_hits(self.limit, self.burst)

    def counts_denied(self) -> bool:
        """Whether this limit counts the hits of a rejected request (envoyproxy/ratelimit's fixed window)."""
        return RULES[self.algorithm].counts_denied(self.stop_when_over)


class Checks(tuple[Check, ...]):
    """A plan's checks (slidegate.limiter): one tuple for every call of a request the service remembers, on which
    the storage keeps what it made of them (``packed``: the backend that packed their script call, and the call),
    so that it lives and is freed with the remembered request."""

    packed: tuple[object, bytes] | None = None


class Mode(Protocol):
    """How a limit's being over counts (a Check, or the limiter's Status of one)."""

    @property
    def shadow(self) -> bool: ...

    @property
    def quota(self) -> bool: ...


def admits(checks: Sequence[Mode], over: Sequence[bool]) -> bool:
    """The admission rule (lua/decide.lua has its twin): a request is admitted unless a limit that is neither
    shadow nor quota is over, or it has quota limits and every one of them is over (envoyproxy/ratelimit's
    quota mode: src/service/ratelimit.go)."""
    # one pass, no lists: an attack's every call is over and is answered by this rule (from the over-limit cache)
    quotas = quotas_over = 0
    for c, o in zip(checks, over, strict=True):
        if c.quota:
            quotas += 1
            quotas_over += o
        elif o and not c.shadow:
            return False
    return quotas == 0 or quotas_over < quotas


class Outcome(NamedTuple):
    """The decision for one Check. ``remaining``: hits left in the window after this request;
    ``reset_us``: microseconds until the oldest counted hit leaves the window (within limit) or until this
    request's hits would fit (over limit)."""

    over: bool
    remaining: int
    reset_us: int


class Decision(NamedTuple):
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
