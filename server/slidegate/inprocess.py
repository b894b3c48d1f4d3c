"""slidegate's own limiter in the caller's process (no gRPC hop), answering with the client's ``Decision``: for
middleware that wants the limits without running a service (slidegate.contrib).

    limiter = InProcessLimiter("config/", "redis://127.0.0.1:6379/0")   # None: counters in memory
    decision = await limiter.should_rate_limit("web", [{"remote_address": ip}])
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from slidegate import decider
from slidegate.application import build
from slidegate.client import Decision, DescriptorDecision, DescriptorSpec, RateLimitUnavailable, refused
from slidegate.decider import UNDECIDED, LimitRequest, refusal
from slidegate.limiter import Descriptor
from slidegate.service import grpc_status
from slidegate.settings import Settings

T = TypeVar("T")
MAX_HITS = 0xFFFFFFFF  # hits_addend is a uint32 on the wire: the same bound in process


def descriptor(spec: DescriptorSpec) -> Descriptor:
    """``spec`` as the decider's Descriptor. Raises TypeError for an entry that is not two strings and
    UnicodeEncodeError for text that is not Unicode (a lone surrogate), as a call could not carry them."""
    pairs = spec.items() if isinstance(spec, Mapping) else spec
    entries = tuple([(key, value) for key, value in pairs])
    for key, value in entries:
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"a descriptor entry is two strings, not ({type(key).__name__}, {type(value).__name__})")
        key.encode()
        value.encode()
    return Descriptor(entries)


def client_decision(decision: decider.Decision) -> Decision:
    """The client's Decision for the decider's: what a call would have answered (slidegate.client reads the
    same from a RateLimitResponse)."""
    out = []
    for d, status in zip(decision.prepared.descriptors, decision.statuses, strict=True):
        limit = status.limit
        keys = tuple(key for key, _ in d.entries)
        over = status.over and not status.shadow
        if limit is None or limit.unit is None:
            out.append(DescriptorDecision(over, None, None, "", status.remaining, 0.0, keys))
            continue
        if status.over:  # rounded up, as the service answers it (slidegate.service.build_response)
            reset = float(-(-status.reset_us // 1_000_000))
        else:
            seconds, micros = divmod(status.reset_us, 1_000_000)
            reset = seconds + micros * 1000 / 1e9
        out.append(DescriptorDecision(over, limit.requests_per_unit, limit.window_seconds, limit.name,
                                      status.remaining, reset, keys))
    return Decision(not decision.rejected, out)


class InProcessLimiter:
    """slidegate's own limiter in this process: the config in ``config_dir``, counters in the Redis at
    ``redis_url`` (shared with slidegate services using the same ``key_prefix``) or, with None, in memory.
    ``should_rate_limit`` is a coroutine; ``should_rate_limit_blocking`` serves synchronous code (Django) by
    running it on a private event loop thread. ``clock`` (microseconds) is for tests. Raises ConfigError for an
    invalid config and SettingsError for a malformed Redis URL or a timeout outside 1 ms to 60 s."""

    def __init__(self, config_dir: str | Path, redis_url: str | None = None, *, key_prefix: str = "",
                 timeout: float = 0.05, clock: Callable[[], int] | None = None) -> None:
        # the settings `slidegate serve` would have with these flags and nothing from the environment: the
        # same storage, limiter and answers as a service
        settings = Settings.load({}, {"config_dir": str(config_dir), "backend_type": "redis" if redis_url else "memory",
                                      "redis_url": redis_url, "redis_timeout": str(timeout),
                                      "cache_key_prefix": key_prefix})
        app = build(settings, clock=clock)
        self._backend, self._decider = app.backend, app.service.decider
        self._timeout = timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    async def should_rate_limit(self, domain: str, descriptors: Sequence[DescriptorSpec], hits_addend: int = 0,
                                timeout: float | None = None) -> Decision:
        """Decide in this process. Raises InvalidRateLimitRequest for a request the service would refuse,
        RateLimitUnavailable when the storage does not answer."""
        if not 0 <= hits_addend <= MAX_HITS:
            raise ValueError(f"Value out of range: {hits_addend}")
        request = LimitRequest(domain, [descriptor(spec) for spec in descriptors], hits_addend,
                               self._timeout if timeout is None else timeout)
        try:
            decision = await self._decider.decide(request)
        except UNDECIDED as exc:
            # the service's status, with the whole reason: this process is the one whose storage failed
            raise refused(grpc_status(refusal(exc).code), str(exc)) from exc
        return client_decision(decision)

    def should_rate_limit_blocking(self, domain: str, descriptors: Sequence[DescriptorSpec], hits_addend: int = 0,
                                   timeout: float | None = None) -> Decision:
        """``should_rate_limit`` for synchronous callers."""
        return self._run(self.should_rate_limit(domain, descriptors, hits_addend, timeout))

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, daemon=True, name="slidegate-limiter").start()
        # the coroutine has its own deadline; this one only guards against a loop that is gone (after fork)
        try:
            return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(self._timeout + 5)
        except TimeoutError as exc:
            raise RateLimitUnavailable("the in-process limiter's event loop does not answer") from exc

    async def close(self) -> None:
        await self._backend.close()
