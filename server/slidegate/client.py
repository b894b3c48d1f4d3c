"""A small typed client for any Envoy-compatible rate-limit service (envoy.service.ratelimit.v3). Its
``Decision`` is also what slidegate.inprocess answers, from slidegate's own limiter in this process.

    client = RateLimitClient("127.0.0.1:8081", timeout=0.05)           # or AsyncRateLimitClient
    decision = client.should_rate_limit("web", [[("remote_address", ip)], {"path": "/login"}])
    if not decision.allowed: ...  decision.retry_after, decision.headers()

Descriptors are sequences of (key, value) pairs, or mappings (entries in their order). Every call has a deadline
(``timeout`` seconds); channels are made once and reused. A service that cannot answer raises
``RateLimitUnavailable`` — what to do then (fail open or closed) is the caller's choice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from slidegate._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from slidegate.headers import Shown, middleware_headers, retry_after
from slidegate.units import Unit

DescriptorSpec = Sequence[tuple[str, str]] | Mapping[str, str]


class RateLimitUnavailable(Exception):
    """The rate-limit service (or storage) did not answer within the deadline, or refused the request."""


class InvalidRateLimitRequest(RateLimitUnavailable):
    """The service refused the request as invalid (gRPC INVALID_ARGUMENT; in process, the same reasons): a
    bug of the caller's, not an outage. A RateLimitUnavailable, so that one handler can still catch both."""


def refused(code: grpc.StatusCode, details: str) -> RateLimitUnavailable:
    """The exception for a call answered with gRPC status ``code``, remote or in process."""
    kind = InvalidRateLimitRequest if code == grpc.StatusCode.INVALID_ARGUMENT else RateLimitUnavailable
    return kind(f"{code.name}: {details}")


def _unavailable(exc: grpc.RpcError) -> RateLimitUnavailable:
    return refused(exc.code(), exc.details() or "")  # every RpcError a call raises is also a grpc.Call


@dataclass(frozen=True, slots=True)
class DescriptorDecision:
    """One descriptor's answer. ``limit`` (requests per ``window_seconds``) is None when no limit applies;
    ``reset_seconds``: time until the limit resets (over limit: until this request would fit); ``keys``: the
    descriptor's entry keys (they name an unnamed limit in the headers)."""

    over: bool
    limit: int | None
    window_seconds: int | None
    name: str
    remaining: int
    reset_seconds: float
    keys: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer to one request. ``allowed`` is the overall code (OK or OVER_LIMIT)."""

    allowed: bool
    descriptors: list[DescriptorDecision]

    def _shown(self) -> list[Shown]:
        return [Shown(d.name, d.keys, d.limit, d.window_seconds or 0, d.remaining, round(d.reset_seconds * 1e6),
                      d.over, d.over and not self.allowed, over_code=d.over)
                for d in self.descriptors if d.limit is not None]

    @property
    def retry_after(self) -> int | None:
        """Whole seconds (at least 1) until a rejected request would fit; None when allowed."""
        if self.allowed:
            return None
        return retry_after(self._shown()) or 1

    def headers(self) -> list[tuple[str, str]]:
        """``X-RateLimit-Limit/Remaining/Reset`` from the limited descriptor with the least remaining (an
        over-limit one first), the IETF draft's ``RateLimit-Policy`` and ``RateLimit`` fields, and
        ``Retry-After`` when rejected (slidegate.headers). Empty when no descriptor had a limit."""
        return middleware_headers(self._shown())


def build_request(domain: str, descriptors: Sequence[DescriptorSpec], hits_addend: int = 0) -> rls_pb2.RateLimitRequest:
    """The RateLimitRequest for ``descriptors`` (each pairs or a mapping)."""
    request = rls_pb2.RateLimitRequest(domain=domain, hits_addend=hits_addend)
    for spec in descriptors:
        pairs = spec.items() if isinstance(spec, Mapping) else spec
        entries = request.descriptors.add().entries
        for key, value in pairs:
            entries.add(key=key, value=value)
    return request


def decision_from_response(response: rls_pb2.RateLimitResponse,
                           request: rls_pb2.RateLimitRequest | None = None) -> Decision:
    """The Decision a RateLimitResponse carries (``request``: the request it answers, for the keys)."""
    keys = [tuple(e.key for e in d.entries) for d in request.descriptors] if request is not None else []
    out = []
    for i, status in enumerate(response.statuses):
        limit = window = None
        name = ""
        if status.HasField("current_limit"):
            current = status.current_limit
            multiplier = current.unit_multiplier.value if current.HasField("unit_multiplier") else 1
            unit = Unit.from_wire(current.unit)
            limit, window, name = current.requests_per_unit, unit.seconds * multiplier if unit else 0, current.name
        reset = status.duration_until_reset.seconds + status.duration_until_reset.nanos / 1e9
        out.append(DescriptorDecision(status.code == rls_pb2.RateLimitResponse.OVER_LIMIT, limit, window, name,
                                      status.limit_remaining, reset, keys[i] if i < len(keys) else ()))
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
        request = build_request(domain, descriptors, hits_addend)
        try:
            response = self._stub.ShouldRateLimit(request, timeout=self._timeout if timeout is None else timeout)
        except grpc.RpcError as exc:
            raise _unavailable(exc) from exc
        return decision_from_response(response, request)

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
        request = build_request(domain, descriptors, hits_addend)
        try:
            response = await self._stub.ShouldRateLimit(request, timeout=self._timeout if timeout is None else timeout)
        except grpc.RpcError as exc:
            raise _unavailable(exc) from exc
        return decision_from_response(response, request)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close(None)
