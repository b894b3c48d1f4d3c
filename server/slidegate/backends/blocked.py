"""A local cache of limits known to be over: requests that would only be rejected are answered without Redis.

When the storage says a limit is over, it also says when this request's hits would fit (``reset_us``, exact
for each algorithm). Until then, a request adding as many hits to the same limit — same key, which
names domain, entries and algorithm, and same parameters, so a reloaded or overridden limit is a different
entry — is over too, and since a rejected request counts nothing, answering it here changes no state. This
is what keeps an attack on one hot key from costing a Redis round trip per request.

Only rejections are cached, never an OK. A request is answered here only when every one of its limits is
cached as over (a request that also names a limit with room must still learn that limit's remaining hits from
the storage); shadow limits, check-only or give-back requests, a different number of hits (whose retry time
differs) and requests naming one limit twice always go to the storage, and a fixed window that counts the hits
of rejected requests (envoyproxy/ratelimit's default) is never cached. Hits counted or given back
(``is_negative_hits``) on a key through this process — under any version of its limit, and also when the call
failed, since the storage may have applied them — forget its remembered rejection. Caveats: hits given back
through another replica, or a Redis that restarted empty, can make room before the cached time, which this
cache learns only when it expires, and hits counted by another replica make the cached retry time early.

Its size is a number of bytes (LOCAL_CACHE_SIZE_IN_BYTES, as envoyproxy/ratelimit's local cache): each limit
remembered is charged ENTRY_BYTES plus its key's own size (sys.getsizeof). A key carries a descriptor's entries,
up to 64 of at most 133 characters each once long ones are digested, so a count of entries alone would let
many-entry descriptors take gigabytes. When a new limit does not fit, the expired ones are forgotten, and when
that leaves more than half the size taken, all are: the cache is only an optimisation, and forgetting is always
correct.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

from slidegate.backends.base import Backend, Check, Decision, Outcome
from slidegate.cache_sizes import DEFAULT_MAX_BYTES, ENTRY_BYTES

Params = tuple[int, int, int | None, bool]


def _params(c: Check) -> Params:
    # the key names domain, entries and algorithm; these name the rest of the limit (a reload may change them)
    return c.limit, c.window_us, c.burst, c.stop_when_over


def entry_bytes(key: str) -> int:
    """What remembering the limit of ``key`` is charged (see the module docstring)."""
    return ENTRY_BYTES + sys.getsizeof(key)


class OverLimitCache:
    """``backend`` with known over-limit answers served locally (see the module docstring), in at most
    ``max_bytes`` (counted as the module docstring says). Same interface as the backend."""

    def __init__(self, backend: Backend, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._backend = backend
        self._max_bytes = max_bytes
        self._bytes = 0  # charged for the remembered limits
        # storage key -> (the limit's parameters, over until in µs, hits it was over for): one entry per key, so
        # that hits counted or given back under any version of a limit forget what another version remembered
        self._blocked: dict[str, tuple[Params, int, int]] = {}

    def describe(self) -> str:
        return self._backend.describe()

    @property
    def backend(self) -> Backend:
        """The storage it answers for."""
        return self._backend

    @property
    def max_bytes(self) -> int:
        """The bytes the remembered limits may be charged at most (LOCAL_CACHE_SIZE_IN_BYTES)."""
        return self._max_bytes

    @property
    def bytes_charged(self) -> int:
        """The bytes charged now for the limits remembered (``entry_bytes`` of each one's key)."""
        return self._bytes

    def remembered(self) -> list[str]:
        """The storage keys of the limits remembered as over (an expired one until it is forgotten)."""
        return list(self._blocked)

    @staticmethod
    def _now(now_us: int | None) -> int:
        # the storage's reset is a duration: measured from our own monotonic clock unless a test sets the time
        return now_us if now_us is not None else time.monotonic_ns() // 1000

    async def decide(
        self, checks: Sequence[Check], now_us: int | None = None, timeout: float | None = None
    ) -> Decision:
        """The backend's decision, or a local rejection when every check is known to be over."""
        now = self._now(now_us)
        # a limit named twice in one request is decided on the sum of its hits: leave that to the storage
        simple = len(checks) < 2 or len({c.key for c in checks}) == len(checks)
        if simple and checks and self._blocked:
            outcomes = []
            for c in checks:
                entry = self._blocked.get(c.key) if c.hits > 0 and not c.shadow else None
                if entry is None or entry[0] != _params(c) or entry[1] <= now or c.hits != entry[2]:
                    break
                outcomes.append(Outcome(over=True, remaining=0, reset_us=entry[1] - now))
            else:
                return Decision(False, outcomes, cached=True)
        try:
            decision = await self._backend.decide(checks, now_us, timeout)
        except BaseException:
            # the storage may have counted or given back these hits all the same (a deadline that ran out
            # after the script was sent)
            if self._blocked:
                for c in checks:
                    if c.hits != 0:
                        self._forget(c.key)
            raise
        for c, outcome in zip(checks, decision.outcomes, strict=True):
            if not outcome.over:
                # hits counted push a remembered rejection's retry time back; hits given back may make room
                # at once
                if self._blocked and c.hits != 0:
                    self._forget(c.key)
                continue
            # more hits than the limit can ever hold are over for good, and reported with a fixed reset; a
            # fixed window that counts denied hits (envoyproxy/ratelimit's) must see every one of them
            if (simple and 0 < c.hits <= c.most_hits() and not c.shadow and outcome.reset_us > 0
                    and not c.counts_denied()):
                if c.key not in self._blocked:
                    cost = entry_bytes(c.key)
                    if cost > self._max_bytes:
                        continue  # larger than the whole cache: not remembered
                    if self._bytes + cost > self._max_bytes:
                        self._forget_expired(now)
                    self._bytes += cost
                self._blocked[c.key] = (_params(c), now + outcome.reset_us, c.hits)
        return decision

    def _forget(self, key: str) -> None:
        if self._blocked.pop(key, None) is not None:
            self._bytes -= entry_bytes(key)

    def _forget_expired(self, now: int) -> None:
        self._blocked = {k: v for k, v in self._blocked.items() if v[1] > now}
        self._bytes = sum(entry_bytes(k) for k in self._blocked)
        if self._bytes > self._max_bytes // 2:
            self._blocked.clear()  # only an optimisation: forgetting everything is always correct
            self._bytes = 0

    async def ping(self) -> None:
        await self._backend.ping()

    async def close(self) -> None:
        await self._backend.close()
