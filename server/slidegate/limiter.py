"""The limiter: which limits a request's descriptors hit, and the backend's all-or-nothing decision on them.

Transport-neutral: the gRPC service translates protobuf to ``Descriptor`` and ``Status`` back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from slidegate.algorithms import Algorithm
from slidegate.backends.base import Backend, Check
from slidegate.config.model import Config, RateLimit
from slidegate.keys import limit_key

UNLIMITED_REMAINING = 4294967295  # what envoyproxy/ratelimit reports for unlimited rules (uint32 max)


@dataclass(frozen=True, slots=True)
class Descriptor:
    """A request descriptor: ordered (key, value) ``entries`` and the descriptor's own ``hits_addend``
    (None when unset; an explicit 0 means check only)."""

    entries: tuple[tuple[str, str], ...]
    hits_addend: int | None = None


@dataclass(frozen=True, slots=True)
class Status:
    """The answer for one descriptor. ``limit`` is None when no limit applies (then ``over`` is False).
    ``remaining`` is hits left (uint32 max for unlimited); ``reset_us`` microseconds until reset."""

    limit: RateLimit | None
    over: bool = False
    remaining: int = 0
    reset_us: int = 0


NO_LIMIT = Status(limit=None)


class Limiter:
    """Decides requests against the config returned by ``config()`` (read once per request, so a reload
    swaps it atomically) using ``backend``.

    ``key_prefix`` starts every storage key; ``clock`` (microseconds since the epoch) replaces the backend's
    clock — for tests; production uses Redis TIME so every replica shares one clock.
    """

    def __init__(
        self,
        config: Callable[[], Config],
        backend: Backend,
        *,
        key_prefix: str = "",
        clock: Callable[[], int] | None = None,
    ) -> None:
        self._config = config
        self._backend = backend
        self._prefix = key_prefix
        self._clock = clock

    async def should_rate_limit(
        self, domain: str, descriptors: Sequence[Descriptor], hits_addend: int = 0
    ) -> list[Status]:
        """One Status per descriptor, in order. ``hits_addend`` is the request-level value (0 ⇒ 1).
        Raises BackendUnavailable when the backend cannot decide."""
        domain_config = self._config().domains.get(domain)
        if domain_config is None:
            return [NO_LIMIT] * len(descriptors)
        default_hits = hits_addend or 1
        statuses: list[Status] = [NO_LIMIT] * len(descriptors)
        checks: list[Check] = []
        limited: list[tuple[int, RateLimit]] = []
        for index, descriptor in enumerate(descriptors):
            limit = domain_config.match(list(descriptor.entries))
            if limit is None:
                continue
            if limit.unlimited:
                statuses[index] = Status(limit=None, remaining=UNLIMITED_REMAINING)
                continue
            hits = default_hits if descriptor.hits_addend is None else descriptor.hits_addend
            key = limit_key(self._prefix, Algorithm.SLIDING_WINDOW_LOG.value, domain, descriptor.entries)
            checks.append(Check(key, limit.requests_per_unit, limit.window_seconds * 1_000_000, hits))
            limited.append((index, limit))
        if not checks:
            return statuses
        decision = await self._backend.decide(checks, self._clock() if self._clock else None)
        for (index, limit), outcome in zip(limited, decision.outcomes, strict=True):
            statuses[index] = Status(limit, outcome.over, outcome.remaining, outcome.reset_us)
        return statuses
