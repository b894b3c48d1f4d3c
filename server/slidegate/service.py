"""The gRPC RateLimitService: the decider's edge for Envoy. It reads a call's bytes (slidegate.request), asks the
decider (slidegate.decider) and writes the Decision as Envoy's RateLimitResponse.

``overall_code`` is always OK or OVER_LIMIT (Envoy treats UNKNOWN as OK). Statuses follow the request's
descriptor order, one each, because Envoy matches them to descriptors by position for its x-ratelimit
headers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import struct_pb2
from google.protobuf.message import DecodeError

from slidegate._proto.envoy.service.ratelimit.v3 import rls_pb2
from slidegate.backends.base import BackendUnavailable
from slidegate.decider import UNDECIDED, Decider, Decision, LimitRequest, Prepared, Refused, refusal, rule_of
from slidegate.headers import HeaderNames, ResponseHeaders, envoy_headers
from slidegate.heap import Heap
from slidegate.limiter import Descriptor, Limiter, Status
from slidegate.metrics import Metrics
from slidegate.request import InvalidRequest, Request, RequestPolicy, parse_request
from slidegate.text import printable

OK = rls_pb2.RateLimitResponse.OK
OVER_LIMIT = rls_pb2.RateLimitResponse.OVER_LIMIT
METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

Context = grpc.aio.ServicerContext[bytes, rls_pb2.RateLimitResponse]


@dataclass(frozen=True, slots=True)
class AnswerOptions:
    """``dynamic_metadata``: describe the request and the matched rules' ``metadata`` in the response's
    ``dynamic_metadata`` (RESPONSE_DYNAMIC_METADATA); ``headers``: which rate-limit response headers to add
    (LIMIT_RESPONSE_HEADERS_ENABLED / LIMIT_RESPONSE_HEADERS_IETF, see slidegate.headers) and
    ``header_names``: their names (LIMIT_LIMIT_HEADER …); ``rule_header``: the header naming to the client the
    rules that rejected its request (LIMIT_RULE_HEADER; empty: none)."""

    dynamic_metadata: bool = False
    headers: ResponseHeaders = ResponseHeaders.NONE
    header_names: HeaderNames = field(default_factory=HeaderNames)
    rule_header: str = ""


def build_response(decision: Decision, options: AnswerOptions = AnswerOptions()) -> rls_pb2.RateLimitResponse:
    """The RateLimitResponse for ``decision``. A descriptor over its limit is OVER_LIMIT unless its rule is in
    shadow mode (quota mode keeps it); the overall code is the decision's. A remembered request's
    ``skeleton`` (response_skeleton of its statuses' limits, serialized, made once for a request answered
    again and again) is read back and filled in: a third of the cost of building the response anew; as bytes,
    some 50 where the message takes 900."""
    statuses, skeleton = decision.statuses, decision.prepared.skeleton
    response = response_skeleton(statuses) if skeleton is None else rls_pb2.RateLimitResponse.FromString(skeleton)
    response.overall_code = OVER_LIMIT if decision.rejected else OK
    for out, status in zip(response.statuses, statuses, strict=True):
        over = status.over
        out.code = OVER_LIMIT if over and not status.shadow else OK
        out.limit_remaining = status.remaining
        limit = status.limit
        if limit is None or limit.unit is None:
            continue
        reset = out.duration_until_reset  # each access makes a new wrapper of the field
        if over:
            # when this request would fit, rounded up: Envoy drops the fraction (x-ratelimit-reset,
            # retry-after), so 0.4 s would tell its clients to retry at once and be refused again
            reset.seconds = -(-status.reset_us // 1_000_000)
        else:
            seconds, micros = divmod(status.reset_us, 1_000_000)
            reset.seconds = seconds
            reset.nanos = micros * 1000
    if options.dynamic_metadata:
        response.dynamic_metadata.CopyFrom(_metadata(decision))
    if options.headers is not ResponseHeaders.NONE:
        for key, value in envoy_headers(decision.shown(), ietf=options.headers is ResponseHeaders.IETF,
                                        names=options.header_names):
            response.response_headers_to_add.add(key=key, value=value)
    if options.rule_header and decision.rejected:
        response.response_headers_to_add.add(key=options.rule_header, value=", ".join(decision.rejecting_rules()))
    return response


def response_skeleton(statuses: Sequence[Status]) -> rls_pb2.RateLimitResponse:
    """What a response to these statuses says whatever the decision: one status each, with its limit
    (``current_limit``) when it has one (build_response fills in the rest)."""
    response = rls_pb2.RateLimitResponse()
    for status in statuses:
        out = response.statuses.add()
        limit = status.limit
        if limit is None or limit.unit is None:
            continue
        out.current_limit.requests_per_unit = limit.requests_per_unit
        out.current_limit.unit = limit.unit.wire  # type: ignore[assignment]
        if limit.unit_multiplier != 1:
            out.current_limit.unit_multiplier.value = limit.unit_multiplier
        if limit.name:
            out.current_limit.name = limit.name
    return response


def _serialized_skeleton(statuses: Sequence[Status]) -> bytes:
    return response_skeleton(statuses).SerializeToString()


def _metadata(decision: Decision) -> struct_pb2.Struct:
    """{domain, descriptors: [{entries: ["k=v"], limit?, hitsAddend?}], hitsAddend?, metadata?}, as
    envoyproxy/ratelimit's ratelimitToMetadata (src/service/ratelimit.go, since its #1112): ``metadata`` is the
    rules' ``metadata`` of the descriptors that passed (answered OK, unlimited ones aside), merged, the first
    one's key winning unless both are mappings; the optional fields only when set."""
    statuses = decision.statuses
    out = struct_pb2.Struct()
    out["domain"] = printable(decision.domain)
    items: list[Any] = []
    merged: dict[str, Any] = {}
    for descriptor, status in zip(decision.prepared.descriptors, statuses, strict=True):
        item: dict[str, object] = {"entries": [printable(f"{k}={v}") for k, v in descriptor.entries]}
        override = descriptor.override
        if override is not None:  # Go's prototext of the request's RateLimitOverride
            item["limit"] = f"requests_per_unit:{override.requests_per_unit} unit:{override.unit.name}"
        if descriptor.hits_addend is not None:
            item["hitsAddend"] = descriptor.hits_addend
        items.append(item)
        limit = None if status.rule is None else status.rule.rate_limit
        passed = not (status.over and not status.shadow)  # its code OK (a limit's, not an unlimited one's)
        if passed and limit is not None and not limit.unlimited and status.rule is not None and status.rule.metadata:
            _merge(merged, status.rule.metadata)
    out["descriptors"] = items
    if decision.prepared.hits_addend:
        out["hitsAddend"] = decision.prepared.hits_addend
    if merged:
        out["metadata"] = merged
    # beyond the reference's fields: each descriptor's answer and rule, and the rules behind a rejection (for an
    # access log's %DYNAMIC_METADATA(envoy.filters.http.ratelimit:rejectedBy)%)
    out["statuses"] = [_answered(d, s) for d, s in zip(decision.prepared.descriptors, statuses, strict=True)]
    if decision.rejected:
        out["rejectedBy"] = ", ".join(decision.rejecting_rules())
    return out


def _merge(into: dict[str, Any], metadata: dict[str, Any]) -> None:
    """The reference's mergeMetadata: a key already there stays, unless both values are mappings (merged)."""
    for key, value in metadata.items():
        there = into.get(key)
        if there is None and key not in into:
            into[key] = value
        elif isinstance(there, dict) and isinstance(value, dict):
            there = into[key] = dict(there)  # the rule's own mapping is its config's: never changed
            _merge(there, value)


def _answered(descriptor: Descriptor, status: Status) -> dict[str, Any]:
    answered: dict[str, Any] = {"code": "OVER_LIMIT" if status.over and not status.shadow else "OK"}
    if status.limit is not None or status.rule is not None:
        answered["rule"] = rule_of(descriptor, status)
    if status.limit is not None and status.limit.unit is not None:
        answered.update(limit=status.limit.requests_per_unit, remaining=status.remaining)
    return answered


def grpc_status(code: Refused) -> grpc.StatusCode:
    """The gRPC status a refusal is answered with (each Refused is named after one)."""
    return grpc.StatusCode[code.name]


class RateLimitService:
    """``envoy.service.ratelimit.v3.RateLimitService`` on top of a Limiter: a call's bytes key the requests the
    decider remembers (slidegate.decider), so a request seen before goes straight to the storage; ``metrics``
    counts decisions (the decider's)."""

    def __init__(
        self, limiter: Limiter, options: AnswerOptions = AnswerOptions(), metrics: Metrics | None = None,
        heap: Heap | None = None, policy: RequestPolicy | None = None,
    ) -> None:
        self.decider = Decider(limiter, metrics, heap, policy, skeleton=_serialized_skeleton)
        self.metrics = self.decider.metrics
        self._options = options
        # told each answer of a gRPC call with its request (slidegate.tracing sets it to describe the call's span);
        # None, its default, costs the call one test
        self.on_answer: Callable[[Prepared, rls_pb2.RateLimitResponse], None] | None = None

    def handler(
        self, call: Callable[[bytes, Context], Awaitable[rls_pb2.RateLimitResponse]] | None = None,
    ) -> grpc.GenericRpcHandler[Any, Any]:
        """The gRPC handler to add to a server (reads requests leniently, see the module docstring); ``call``
        answers in place of ``should_rate_limit`` (slidegate.tracing's wraps it)."""
        method = grpc.unary_unary_rpc_method_handler(
            call or self.should_rate_limit,
            request_deserializer=None,  # the bytes themselves: they key the remembered requests
            response_serializer=rls_pb2.RateLimitResponse.SerializeToString,
        )
        return grpc.method_handlers_generic_handler(
            "envoy.service.ratelimit.v3.RateLimitService", {"ShouldRateLimit": method})

    async def should_rate_limit(self, request: bytes, context: Context) -> rls_pb2.RateLimitResponse:
        # the reference's gRPC interceptor (src/metrics/metrics.go): every call, its time in whole milliseconds
        started = time.perf_counter()
        ended = 0.0
        self.metrics.total_requests.inc()
        decider = self.decider
        try:
            # answer within the caller's deadline (Envoy sends its filter timeout as the gRPC deadline): what is
            # left of it from ``started`` on, and (for the decision) from now
            deadline = remaining = context.time_remaining()
            prepared = decider.recall(request)
            if prepared is None:
                prepared = self._prepare_bytes(request)
                if remaining is not None:  # matching took some of it (a request seen before: none worth a clock)
                    remaining -= time.perf_counter() - started
            response = build_response(await decider.decide_prepared(prepared, remaining), self._options)
            if self.on_answer is not None:
                self.on_answer(prepared, response)
            ended = time.perf_counter()
            if deadline is not None and ended - started >= deadline:
                raise asyncio.CancelledError  # decided as the deadline passed: gRPC ends the call (see below)
            return response
        except UNDECIDED as exc:
            decider.refused(exc)
            remaining = context.time_remaining()
            if isinstance(exc, BackendUnavailable) and remaining is not None and remaining <= 0:
                # gRPC ends a call at its deadline itself (DEADLINE_EXCEEDED) and cancels this task; a status
                # sent here races that end and gRPC logs the lost race as an ExecuteBatchError traceback
                raise asyncio.CancelledError from None
            code, details = refusal(exc)
            await context.abort(grpc_status(code), details)
        finally:
            self.metrics.response_time.record(int(((ended or time.perf_counter()) - started) * 1000))

    def _prepare_bytes(self, data: bytes) -> Prepared:
        try:
            request = Request.FromString(data)
        except DecodeError as exc:
            # protobuf's message may name the type it parsed: our lenient twin, which the caller never heard of
            reason = (str(exc).replace(Request.DESCRIPTOR.full_name, rls_pb2.RateLimitRequest.DESCRIPTOR.full_name)
                      or "not a protobuf message")
            raise InvalidRequest(f"malformed RateLimitRequest: {reason}") from exc
        domain, descriptors = parse_request(request, self.decider.policy)
        return self.decider.prepare_keyed(data, domain, descriptors, request.hits_addend)

    def response(self, decision: Decision) -> rls_pb2.RateLimitResponse:
        """The RateLimitResponse this service answers ``decision`` with (the HTTP API's, in JSON)."""
        return build_response(decision, self._options)

    async def decide(self, domain: str, descriptors: list[Descriptor], hits_addend: int,
                     timeout: float | None = None) -> rls_pb2.RateLimitResponse:
        """The response to a validated request. Raises BackendUnavailable and InvalidOverride."""
        return self.response(await self.decider.decide(LimitRequest(domain, descriptors, hits_addend, timeout)))
