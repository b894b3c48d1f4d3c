"""The gRPC RateLimitService: validates requests, asks the limiter, builds Envoy's answer.

``overall_code`` is always OK or OVER_LIMIT (Envoy treats UNKNOWN as OK). Statuses follow the request's
descriptor order, one each, because Envoy matches them to descriptors by position for its x-ratelimit headers.
"""

from __future__ import annotations

import logging

import grpc

from slidegate._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from slidegate.backends.base import BackendUnavailable
from slidegate.limiter import Descriptor, Limiter, Status

log = logging.getLogger(__name__)

OK = rls_pb2.RateLimitResponse.OK
OVER_LIMIT = rls_pb2.RateLimitResponse.OVER_LIMIT


Context = grpc.aio.ServicerContext[rls_pb2.RateLimitRequest, rls_pb2.RateLimitResponse]


class InvalidRequest(ValueError):
    """A request the service cannot decide; the message is sent back with INVALID_ARGUMENT."""


def parse_request(request: rls_pb2.RateLimitRequest) -> tuple[str, list[Descriptor]]:
    """Validate ``request``; return (domain, descriptors). Raises InvalidRequest with the reason."""
    if not request.domain:
        raise InvalidRequest("rate limit domain must not be empty")
    if not request.descriptors:
        raise InvalidRequest("rate limit descriptor list must not be empty")
    descriptors = [
        Descriptor(
            entries=tuple((e.key, e.value) for e in d.entries),
            hits_addend=d.hits_addend.value if d.HasField("hits_addend") else None,
        )
        for d in request.descriptors
    ]
    return request.domain, descriptors


def build_response(statuses: list[Status]) -> rls_pb2.RateLimitResponse:
    """The RateLimitResponse for ``statuses`` (one per request descriptor, in order)."""
    response = rls_pb2.RateLimitResponse(overall_code=OK)
    for status in statuses:
        out = response.statuses.add(code=OVER_LIMIT if status.over else OK)
        if status.over:
            response.overall_code = OVER_LIMIT
        out.limit_remaining = status.remaining
        limit = status.limit
        if limit is None or limit.unit is None:
            continue
        out.current_limit.requests_per_unit = limit.requests_per_unit
        out.current_limit.unit = limit.unit.wire  # type: ignore[assignment]
        if limit.name:
            out.current_limit.name = limit.name
        seconds, micros = divmod(status.reset_us, 1_000_000)
        out.duration_until_reset.seconds = seconds
        out.duration_until_reset.nanos = micros * 1000
    return response


class RateLimitService(rls_pb2_grpc.RateLimitServiceServicer):
    """``envoy.service.ratelimit.v3.RateLimitService`` on top of a Limiter."""

    def __init__(self, limiter: Limiter) -> None:
        self._limiter = limiter

    async def ShouldRateLimit(  # noqa: N802 - the gRPC method name
        self, request: rls_pb2.RateLimitRequest, context: Context
    ) -> rls_pb2.RateLimitResponse:
        try:
            domain, descriptors = parse_request(request)
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            statuses = await self._limiter.should_rate_limit(domain, descriptors, request.hits_addend)
        except BackendUnavailable as exc:
            log.warning("backend unavailable: %s", exc)
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"rate limit storage unavailable: {exc}")
        return build_response(statuses)
