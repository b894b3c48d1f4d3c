"""A small typed client for any Envoy-compatible rate-limit service (envoy.service.ratelimit.v3), and the same
``Decision`` from slidegate's own limiter in this process (no gRPC hop).

    client = RateLimitClient("127.0.0.1:8081", timeout=0.05)           # or AsyncRateLimitClient
    decision = client.should_rate_limit("web", [[("remote_address", ip)], {"path": "/login"}])
    if not decision.allowed: ...  decision.retry_after, decision.headers()

Descriptors are sequences of (key, value) pairs, or mappings (entries in their order). Every call has a deadline
(``timeout`` seconds); channels are made once and reused. A service that cannot answer raises
``RateLimitUnavailable`` — what to do then (fail open or closed) is the caller's choice.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc

from slidegate._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

DescriptorSpec = Sequence[tuple[str, str]] | Mapping[str, str]
T = TypeVar("T")
_WINDOWS = {"SECOND": 1, "MINUTE": 60, "HOUR": 3600, "DAY": 86400, "WEEK": 604800, "MONTH": 2592000,
            "YEAR": 31536000}


class RateLimitUnavailable(Exception):
    """The rate-limit service (or storage) did not answer within the deadline, or refused the request."""


class InvalidRateLimitRequest(RateLimitUnavailable):
    """The service refused the request as invalid (gRPC INVALID_ARGUMENT; in process, the same reasons): a
    bug of the caller's, not an outage. A RateLimitUnavailable, so that one handler can still catch both."""


def _unavailable(exc: grpc.RpcError) -> RateLimitUnavailable:
    code = exc.code()  # every RpcError a call raises is also a grpc.Call
    kind = InvalidRateLimitRequest if code == grpc.StatusCode.INVALID_ARGUMENT else RateLimitUnavailable
    return kind(f"{code.name}: {exc.details()}")


@dataclass(frozen=True, slots=True)
class DescriptorDecision:
    """One descriptor's answer. ``limit`` (requests per ``window_seconds``) is None when no limit applies;
    ``reset_seconds``: time until the limit resets (over limit: until this request would fit)."""

    over: bool
    limit: int | None
    window_seconds: int | None
    name: str
    remaining: int
    reset_seconds: float


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer to one request. ``allowed`` is the overall code (OK or OVER_LIMIT)."""

    allowed: bool
    descriptors: list[DescriptorDecision]

    @property
    def retry_after(self) -> int | None:
        """Whole seconds (at least 1) until a rejected request would fit; None when allowed."""
        if self.allowed:
            return None
        waits = [d.reset_seconds for d in self.descriptors if d.over] or [1.0]
        return max(1, math.ceil(max(waits)))

    def headers(self) -> list[tuple[str, str]]:
        """``X-RateLimit-Limit/Remaining/Reset`` from the limited descriptor with the least remaining (an
        over-limit one first), the IETF draft's ``RateLimit-Policy`` and ``RateLimit`` fields, and
        ``Retry-After`` when rejected. Empty when no descriptor had a limit."""
        limited = [(i, d) for i, d in enumerate(self.descriptors) if d.limit is not None]
        if not limited:
            return []
        index, chosen = min(limited, key=lambda item: (not item[1].over, item[1].remaining))
        reset = math.ceil(chosen.reset_seconds)
        names = {i: policy_name(d.name, i) for i, d in limited}
        headers = [
            ("X-RateLimit-Limit", str(chosen.limit)),
            ("X-RateLimit-Remaining", str(chosen.remaining)),
            ("X-RateLimit-Reset", str(reset)),
            ("RateLimit-Policy", ", ".join(f'"{names[i]}";q={d.limit};w={d.window_seconds}' for i, d in limited)),
            ("RateLimit", f'"{names[index]}";r={chosen.remaining};t={reset}'),
        ]
        if self.retry_after is not None:
            headers.append(("Retry-After", str(self.retry_after)))
        return headers


def policy_name(name: str, index: int) -> str:
    """A limit's name as a structured-field string's content: printable ASCII, quotes and backslashes
    escaped, anything else ``_`` (a config name must not break or inject response headers)."""
    text = name or f"descriptor{index}"
    safe = "".join(c if " " <= c <= "~" else "_" for c in text)
    return safe.replace("\\", "\\\\").replace('"', '\\"')


def build_request(domain: str, descriptors: Sequence[DescriptorSpec], hits_addend: int = 0) -> rls_pb2.RateLimitRequest:
    """The RateLimitRequest for ``descriptors`` (each pairs or a mapping)."""
    request = rls_pb2.RateLimitRequest(domain=domain, hits_addend=hits_addend)
    for spec in descriptors:
        pairs = spec.items() if isinstance(spec, Mapping) else spec
        entries = request.descriptors.add().entries
        for key, value in pairs:
            entries.add(key=key, value=value)
    return request


def decision_from_response(response: rls_pb2.RateLimitResponse) -> Decision:
    """The Decision a RateLimitResponse carries."""
    out = []
    for status in response.statuses:
        limit = window = None
        name = ""
        if status.HasField("current_limit"):
            current = status.current_limit
            unit = rls_pb2.RateLimitResponse.RateLimit.Unit.Name(current.unit)
            multiplier = current.unit_multiplier.value if current.HasField("unit_multiplier") else 1
            limit, window, name = current.requests_per_unit, _WINDOWS.get(unit, 0) * multiplier, current.name
        reset = status.duration_until_reset.seconds + status.duration_until_reset.nanos / 1e9
        out.append(DescriptorDecision(status.code == rls_pb2.RateLimitResponse.OVER_LIMIT, limit, window, name,
                                      status.limit_remaining, reset))
    return Decision(response.overall_code != rls_pb2.RateLimitResponse.OVER_LIMIT, out)


class RateLimitClient:
    """A blocking client for one service at ``target`` (host:port); ``timeout``: default deadline in seconds;
    ``credentials``: TLS (``grpc.ssl_channel_credentials(...)``), None for plaintext."""

    def __init__(self, target: str, *, timeout: float = 0.05,
                 credentials: grpc.ChannelCredentials | None = None) -> None:
        self._channel = grpc.secure_channel(target, credentials) if credentials else grpc.insecure_channel(target)
        self._stub = rls_pb2_grpc.RateLimitServiceStub(self._channel)
        self._timeout = timeout

    def should_rate_limit(self, domain: str, descriptors: Sequence[DescriptorSpec], hits_addend: int = 0,
                          timeout: float | None = None) -> Decision:
        """Ask the service. Raises InvalidRateLimitRequest when it refuses the request as invalid,
        RateLimitUnavailable on any other gRPC error, the deadline included."""
        try:
            response = self._stub.ShouldRateLimit(build_request(domain, descriptors, hits_addend),
                                                  timeout=self._timeout if timeout is None else timeout)
        except grpc.RpcError as exc:
            raise _unavailable(exc) from exc
        return decision_from_response(response)

    def close(self) -> None:
        self._channel.close()


class AsyncRateLimitClient:
    """The asyncio twin of RateLimitClient (same arguments, same answers)."""

    def __init__(self, target: str, *, timeout: float = 0.05,
                 credentials: grpc.ChannelCredentials | None = None) -> None:
        self._target, self._credentials, self._timeout = target, credentials, timeout
        self._stub: Any = None
        self._channel: grpc.aio.Channel | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def should_rate_limit(self, domain: str, descriptors: Sequence[DescriptorSpec], hits_addend: int = 0,
                                timeout: float | None = None) -> Decision:
        """Ask the service. Raises InvalidRateLimitRequest when it refuses the request as invalid,
        RateLimitUnavailable on any other gRPC error, the deadline included."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # an aio channel belongs to the loop it was made on: made on first use
            self._channel = (grpc.aio.secure_channel(self._target, self._credentials) if self._credentials
                             else grpc.aio.insecure_channel(self._target))
            self._stub = rls_pb2_grpc.RateLimitServiceStub(self._channel)
            self._loop = loop
        try:
            response = await self._stub.ShouldRateLimit(build_request(domain, descriptors, hits_addend),
                                                        timeout=self._timeout if timeout is None else timeout)
        except grpc.RpcError as exc:
            raise _unavailable(exc) from exc
        return decision_from_response(response)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close(None)


class InProcessLimiter:
    """slidegate's own limiter in this process: the config in ``config_dir``, counters in the Redis at
    ``redis_url`` (shared with slidegate services using the same ``key_prefix``) or, with None, in memory.
    ``should_rate_limit`` is a coroutine; ``should_rate_limit_blocking`` serves synchronous code (Django) by
    running it on a private event loop thread. ``clock`` (microseconds) is for tests."""

    def __init__(self, config_dir: str | Path, redis_url: str | None = None, *, key_prefix: str = "",
                 timeout: float = 0.05, clock: Callable[[], int] | None = None) -> None:
        from slidegate.backends.base import Backend
        from slidegate.backends.memory import MemoryBackend
        from slidegate.backends.redis import RedisBackend
        from slidegate.config import load_directory
        from slidegate.limiter import Limiter, LimiterOptions
        from slidegate.service import RateLimitService

        config = load_directory(config_dir)
        self._backend: Backend = RedisBackend(redis_url, timeout=timeout) if redis_url else MemoryBackend()
        limiter = Limiter(lambda: config, self._backend, LimiterOptions(key_prefix=key_prefix), clock=clock)
        self._service = RateLimitService(limiter)
        self._timeout = timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    async def should_rate_limit(self, domain: str, descriptors: Sequence[DescriptorSpec], hits_addend: int = 0,
                                timeout: float | None = None) -> Decision:
        """Decide in this process. Raises InvalidRateLimitRequest for a request the service would refuse,
        RateLimitUnavailable when the storage does not answer."""
        from slidegate._proto.slidegate.wire.v1 import lenient_pb2
        from slidegate.backends.base import BackendUnavailable
        from slidegate.limiter import InvalidOverride
        from slidegate.service import InvalidRequest, parse_request

        raw = build_request(domain, descriptors, hits_addend).SerializeToString()
        try:
            parsed_domain, parsed = parse_request(lenient_pb2.LenientRateLimitRequest.FromString(raw))
            response = await self._service.decide(parsed_domain, parsed, hits_addend,
                                                  self._timeout if timeout is None else timeout)
        except (InvalidRequest, InvalidOverride) as exc:
            raise InvalidRateLimitRequest(f"INVALID_ARGUMENT: {exc}") from exc
        except BackendUnavailable as exc:
            raise RateLimitUnavailable(str(exc)) from exc
        return decision_from_response(response)

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
