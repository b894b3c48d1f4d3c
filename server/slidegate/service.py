"""The gRPC RateLimitService: reads requests (slidegate.request), asks the limiter, builds Envoy's answer.

``overall_code`` is always OK or OVER_LIMIT (Envoy treats UNKNOWN as OK). Statuses follow the request's
descriptor order, one each, because Envoy matches them to descriptors by position for its x-ratelimit
headers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import grpc
from google.protobuf import struct_pb2
from google.protobuf.message import DecodeError

from slidegate._proto.envoy.service.ratelimit.v3 import rls_pb2
from slidegate.backends.base import BackendUnavailable, DeadlineExceeded, admits
from slidegate.headers import HeaderNames, ResponseHeaders, Shown, envoy_headers
from slidegate.heap import Heap
from slidegate.limiter import Descriptor, InvalidOverride, Limiter, NoConfigLoaded, Plan, Status
from slidegate.metric_keys import override_key, rule_key, same_for_every_request
from slidegate.metrics import Count, LimitCounters, Metrics
from slidegate.request import InvalidRequest, Refusable, RefusedField, Request, RequestPolicy, parse_request
from slidegate.text import printable

log = logging.getLogger(__name__)

OK = rls_pb2.RateLimitResponse.OK
OVER_LIMIT = rls_pb2.RateLimitResponse.OVER_LIMIT
METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

Context = grpc.aio.ServicerContext[bytes, rls_pb2.RateLimitResponse]
PREPARED_REQUESTS = 10_000  # requests remembered by their bytes (see RateLimitService)
# Only requests the size Envoy sends are remembered (measured: about 1.5 KB of objects for a one-descriptor
# request, 9 KB for eight), so the memory stays within about 100 MB; larger requests are matched each time.
# Entries count apart from bytes: empty ones cost two bytes each on the wire and hundreds in memory (8
# descriptors of 64 empty entries in under 1 KiB took 30 KB each, 300 MB in all; 8 of 4 entries take 14 KB).
PREPARED_MAX_BYTES = 1024
PREPARED_MAX_DESCRIPTORS = 8
PREPARED_MAX_ENTRIES = 32

# why a call can go undecided: the caller's request (a bug of theirs), its deadline, the storage failing
# under failure mode ``error``, or no config yet (config over xDS)
Undecided = InvalidRequest | InvalidOverride | BackendUnavailable | NoConfigLoaded
UNDECIDED = (InvalidRequest, InvalidOverride, BackendUnavailable, NoConfigLoaded)


class Refusal(NamedTuple):
    """The gRPC status of a call that went undecided; the HTTP API and the in-process limiter say the same."""

    code: grpc.StatusCode
    details: str


def refusal(exc: Undecided) -> Refusal:
    """The one mapping from why a call went undecided to its answer. Storage failing is UNAVAILABLE, so that
    Envoy's ``failure_mode_deny`` decides; its details name no address (they reach the caller)."""
    if isinstance(exc, DeadlineExceeded):
        return Refusal(grpc.StatusCode.DEADLINE_EXCEEDED, "the call's deadline ran out")
    if isinstance(exc, BackendUnavailable):
        return Refusal(grpc.StatusCode.UNAVAILABLE, "rate limit storage unavailable")
    if isinstance(exc, NoConfigLoaded):
        # envoyproxy/ratelimit returns it as a plain error, which gRPC sends as UNKNOWN
        return Refusal(grpc.StatusCode.UNKNOWN, str(exc))
    return Refusal(grpc.StatusCode.INVALID_ARGUMENT, str(exc))


@dataclass(frozen=True, slots=True)
class AnswerOptions:
    """``dynamic_metadata``: describe the request and the matched rules' ``metadata`` in the response's
    ``dynamic_metadata`` (RESPONSE_DYNAMIC_METADATA); ``headers``: which rate-limit response headers to add
    (LIMIT_RESPONSE_HEADERS_ENABLED / LIMIT_RESPONSE_HEADERS_IETF, see slidegate.headers) and
    ``header_names``: their names (LIMIT_LIMIT_HEADER …)."""

    dynamic_metadata: bool = False
    headers: ResponseHeaders = ResponseHeaders.NONE
    header_names: HeaderNames = field(default_factory=HeaderNames)


def build_response(
    domain: str,
    descriptors: list[Descriptor],
    statuses: list[Status],
    options: AnswerOptions = AnswerOptions(),
    shadow_mode: bool = False,
    hits_addend: int = 0,
    skeleton: bytes | None = None,
) -> rls_pb2.RateLimitResponse:
    """The RateLimitResponse for ``statuses`` (one per request descriptor, in order). A descriptor over its
    limit is OVER_LIMIT unless its rule is in shadow mode (quota mode keeps it); the overall code is OVER_LIMIT
    when the request was rejected (backends.base.admits), except in ``shadow_mode`` (SHADOW_MODE, the
    limiter's): then it is always OK, each descriptor keeps its code. ``skeleton``: ``response_skeleton`` of
    these statuses' limits, serialized, made once for a request answered again and again (read back and filled
    in: a third of the cost of building the response anew; as bytes, some 50 where the message takes 900)."""
    # a request with no limit over is admitted (most are: the admission rule's scans are for the others)
    rejected = False
    if not shadow_mode:
        for status in statuses:
            if status.over:
                rejected = not admits(statuses, [s.over for s in statuses])
                break
    response = response_skeleton(statuses) if skeleton is None else rls_pb2.RateLimitResponse.FromString(skeleton)
    response.overall_code = OVER_LIMIT if rejected else OK
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
        response.dynamic_metadata.CopyFrom(_metadata(domain, descriptors, statuses, hits_addend))
    if options.headers is not ResponseHeaders.NONE:
        shown = [Shown(s.limit.name, tuple(key for key, _ in d.entries), s.limit.requests_per_unit,
                       s.limit.window_seconds, s.remaining, s.reset_us, s.over, rejected and s.over and not s.shadow,
                       s.quota)
                 for d, s in zip(descriptors, statuses, strict=True)
                 if s.limit is not None and s.limit.unit is not None]
        for key, value in envoy_headers(shown, ietf=options.headers is ResponseHeaders.IETF,
                                        names=options.header_names):
            response.response_headers_to_add.add(key=key, value=value)
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


def _metadata(domain: str, descriptors: list[Descriptor], statuses: list[Status],
              hits_addend: int) -> struct_pb2.Struct:
    """{domain, descriptors: [{entries: ["k=v"], metadata?}], hitsAddend?, quotaModeEnabled, quotaModeViolations?},
    as envoyproxy/ratelimit's ratelimitToMetadata (src/service/ratelimit.go): the optional fields only when
    not zero or empty."""
    out = struct_pb2.Struct()
    out["domain"] = printable(domain)
    items: list[Any] = []
    for descriptor, status in zip(descriptors, statuses, strict=True):
        item: dict[str, object] = {"entries": [printable(f"{k}={v}") for k, v in descriptor.entries]}
        if status.rule is not None and status.rule.metadata:
            item["metadata"] = status.rule.metadata
        items.append(item)
    out["descriptors"] = items
    quota = [i for i, s in enumerate(statuses) if s.quota]
    if hits_addend:
        out["hitsAddend"] = hits_addend
    out["quotaModeEnabled"] = bool(quota)
    violations = [i for i in quota if statuses[i].over]
    if violations:
        out["quotaModeViolations"] = violations
    return out


class Prepared(NamedTuple):
    """A validated request matched against the config (``plan``), with the metric counters of each limit
    it names: (index of the descriptor, its counters, its limit's requests_per_unit); for a domain no config
    has, its ``domain_not_found`` count (one per descriptor, as the reference looks each up); for a request
    remembered, the ``skeleton`` of its responses."""

    descriptors: list[Descriptor]
    plan: Plan
    counted: tuple[tuple[int, LimitCounters, int], ...]
    hits_addend: int = 0
    not_found: Count | None = None
    skeleton: bytes | None = None  # of its responses, when it is remembered (build_response)


class RateLimitService:
    """``envoy.service.ratelimit.v3.RateLimitService`` on top of a Limiter; ``metrics`` counts decisions.

    Envoy sends the same few requests again and again (one per route and client), so a request's bytes are
    remembered with their validated, matched form (up to PREPARED_REQUESTS requests of at most
    PREPARED_MAX_BYTES, PREPARED_MAX_DESCRIPTORS and PREPARED_MAX_ENTRIES each, forgotten all at once when full,
    and redone after a config reload): a request seen before goes straight to the storage.
    """

    def __init__(
        self, limiter: Limiter, options: AnswerOptions = AnswerOptions(), metrics: Metrics | None = None,
        heap: Heap | None = None, policy: RequestPolicy | None = None,
    ) -> None:
        self._limiter = limiter
        self._options = options
        self._policy = policy or RequestPolicy()
        self.metrics = metrics or Metrics()
        self._heap = heap  # keeps collection pauses short and memory returned (slidegate.heap), in slidegate serve
        self._prepared: dict[bytes, Prepared] = {}
        self._prepared_config: object = None  # the config every remembered request was matched against
        # the metric key of each rule of the current config whose key is the same for every request (by the rule's
        # id: its config keeps it alive until a reload, when they are forgotten), so that a request never seen
        # before (a new client's address, a new path) does not compose it again
        self._rule_keys: dict[int, str] = {}
        self._rule_keys_config: object = None
        self._outage = OutageLog()
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
            request_deserializer=None,  # the bytes themselves: they key the prepared requests
            response_serializer=rls_pb2.RateLimitResponse.SerializeToString,
        )
        return grpc.method_handlers_generic_handler(
            "envoy.service.ratelimit.v3.RateLimitService", {"ShouldRateLimit": method})

    async def should_rate_limit(self, request: bytes, context: Context) -> rls_pb2.RateLimitResponse:
        # the reference's gRPC interceptor (src/metrics/metrics.go): every call, its time in whole milliseconds
        started = time.perf_counter()
        self.metrics.total_requests.inc()
        try:
            prepared = self._prepared.get(request)
            if prepared is None or not self._limiter.is_current(prepared.plan):
                prepared = self._prepare_bytes(request)
            # answer within the caller's deadline (Envoy sends its filter timeout as the gRPC deadline)
            response = await self.answer(prepared, context.time_remaining())
            if self.on_answer is not None:
                self.on_answer(prepared, response)
            return response
        except UNDECIDED as exc:
            self.refused(exc)
            remaining = context.time_remaining()
            if isinstance(exc, BackendUnavailable) and remaining is not None and remaining <= 0:
                # gRPC ends a call at its deadline itself (DEADLINE_EXCEEDED) and cancels this task; a status
                # sent here races that end and gRPC logs the lost race as an ExecuteBatchError traceback
                raise asyncio.CancelledError from None
            await context.abort(*refusal(exc))
        finally:
            self.metrics.response_time.record(int((time.perf_counter() - started) * 1000))

    def refused(self, exc: Undecided) -> None:
        """Count a call refused as invalid (the reference's ``service_error``; a refused field under its own
        name); storage failures are counted where they happen (``redis_error``)."""
        if isinstance(exc, RefusedField):
            count = (self.metrics.refused_negative_hits if exc.field is Refusable.NEGATIVE_HITS
                     else self.metrics.refused_limit_override)
            count.inc()
        elif isinstance(exc, (InvalidRequest, InvalidOverride, NoConfigLoaded)):
            self.metrics.service_errors.inc()

    def remembered(self) -> dict[bytes, Prepared]:
        """The requests remembered now, by their bytes (a copy; see the class docstring)."""
        return dict(self._prepared)

    def parse(self, request: Request) -> tuple[str, list[Descriptor]]:
        """``parse_request`` under this service's RequestPolicy (for the HTTP API: gRPC calls come as bytes)."""
        return parse_request(request, self._policy)

    def _prepare_bytes(self, data: bytes) -> Prepared:
        try:
            request = Request.FromString(data)
        except DecodeError as exc:
            # protobuf's message may name the type it parsed: our lenient twin, which the caller never heard of
            reason = (str(exc).replace(Request.DESCRIPTOR.full_name, rls_pb2.RateLimitRequest.DESCRIPTOR.full_name)
                      or "not a protobuf message")
            raise InvalidRequest(f"malformed RateLimitRequest: {reason}") from exc
        domain, descriptors = parse_request(request, self._policy)
        remember = (len(data) <= PREPARED_MAX_BYTES and len(descriptors) <= PREPARED_MAX_DESCRIPTORS
                    and sum(len(d.entries) for d in descriptors) <= PREPARED_MAX_ENTRIES)
        prepared = self.prepare(domain, descriptors, request.hits_addend, skeleton=remember)
        if remember:
            # cheaper than tracking use, and only costs a re-match; after a reload the remembered requests of
            # the old config go at once, or each would keep that whole config alive
            if len(self._prepared) >= PREPARED_REQUESTS or prepared.plan.config is not self._prepared_config:
                forgotten, self._prepared = self._prepared, {}
                self._prepared_config = prepared.plan.config
                if self._heap is not None and forgotten:
                    self._heap.forgot(forgotten)
            self._prepared[data] = prepared
            if self._heap is not None:
                self._heap.remembered()
        elif self._heap is not None:
            self._heap.received(len(data))
        return prepared

    def prepare(self, domain: str, descriptors: list[Descriptor], hits_addend: int = 0, *,
                skeleton: bool = False) -> Prepared:
        """Match a validated request (see Limiter.prepare) and find its metric counters; with ``skeleton``, make
        its responses' (for a request that will be answered again). Raises InvalidOverride."""
        plan = self._limiter.prepare(domain, descriptors, hits_addend)
        made = response_skeleton(plan.statuses).SerializeToString() if skeleton else None
        if domain not in plan.config.domains:
            return Prepared(descriptors, plan, (), hits_addend, self.metrics.domain_not_found(domain), made)
        counted = []
        for index, (descriptor, status) in enumerate(zip(descriptors, plan.statuses, strict=True)):
            if status.limit is None:  # no limit, an unlimited one, or one replaced: the reference counts nothing
                continue
            rule = status.rule
            if rule is None:  # the request's own limit
                key = self.metrics.limit_key(domain, "override", override_key(descriptor.entries))
            else:
                if plan.config is not self._rule_keys_config:
                    self._rule_keys, self._rule_keys_config = {}, plan.config
                shown = self._rule_keys.get(id(rule))
                if shown is None:
                    shown = rule_key(descriptor.entries, rule)
                    if same_for_every_request(rule):
                        self._rule_keys[id(rule)] = shown
                key = self.metrics.limit_key(domain, rule.metric_key, shown)
            counted.append((index, self.metrics.counters(domain, key), status.limit.requests_per_unit))
        return Prepared(descriptors, plan, tuple(counted), hits_addend, skeleton=made)

    async def decide(
        self, domain: str, descriptors: list[Descriptor], hits_addend: int, timeout: float | None = None
    ) -> rls_pb2.RateLimitResponse:
        """Decide a validated request (used by the HTTP API and the in-process client). Raises
        BackendUnavailable and InvalidOverride."""
        try:
            return await self.answer(self.prepare(domain, descriptors, hits_addend), timeout)
        except UNDECIDED as exc:
            self.refused(exc)
            raise

    async def answer(self, prepared: Prepared, timeout: float | None = None) -> rls_pb2.RateLimitResponse:
        """Decide ``prepared`` within ``timeout`` seconds, count it in the metrics and build the response.
        Raises BackendUnavailable, and DeadlineExceeded when ``timeout`` ran out first."""
        started = time.perf_counter()
        try:
            statuses = await self._limiter.decide(prepared.plan, timeout)
        except DeadlineExceeded:
            raise  # the caller's own deadline: not a storage failure
        except BackendUnavailable as exc:
            self.metrics.storage_errors.inc()
            self._outage.failed(str(exc))
            raise
        decided = statuses[prepared.plan.counted[0]] if prepared.plan.counted else None
        if decided is not None and decided.degraded:
            self.metrics.degraded.labels(decided.degraded).inc()
            # a caller in a hurry says nothing of the storage's health (its round trip goes on, and the breaker
            # counts it if it fails)
            if not decided.late:
                self.metrics.storage_errors.inc()
                self._outage.failed(f"decided by failure mode {decided.degraded}")
        elif decided is not None and not decided.cached:
            self.metrics.storage_latency.observe(time.perf_counter() - started)
            self._outage.answered()
        domain = prepared.plan.domain
        shadow_mode = self._limiter.shadow_mode
        response = build_response(domain, prepared.descriptors, statuses, self._options, shadow_mode,
                                  prepared.hits_addend, prepared.skeleton)
        if prepared.not_found is not None:
            prepared.not_found.inc(len(prepared.descriptors))
        for index, counters, limit in prepared.counted:
            status = statuses[index]
            counters.record(hits=status.hits, limit=limit, over=status.over, remaining=status.remaining,
                            shadow=status.shadow, cached=status.cached)  # shadow: its rule's shadow_mode
        if shadow_mode and not admits(statuses, [s.over for s in statuses]):
            self.metrics.global_shadow_mode.inc()  # SHADOW_MODE turned this request's OVER_LIMIT into OK
        if log.isEnabledFor(logging.DEBUG):
            self._log_decision(domain, prepared.descriptors, response)
        self.metrics.call_latency.observe(time.perf_counter() - started)
        return response

    @staticmethod
    def _log_decision(domain: str, descriptors: list[Descriptor], response: rls_pb2.RateLimitResponse) -> None:
        fields = {
            "domain": printable(domain),
            "descriptors": [[printable(f"{k}={v}") for k, v in d.entries] for d in descriptors],
            "codes": [rls_pb2.RateLimitResponse.Code.Name(s.code) for s in response.statuses],
            "overall": rls_pb2.RateLimitResponse.Code.Name(response.overall_code),
        }
        log.debug("decision %s", " ".join(f"{k}={v}" for k, v in fields.items()), extra=fields)



class OutageLog:
    """The log of a storage outage: its first failed call at once, then at most one line every LINE_EVERY seconds
    with the count, and one line when the storage itself answers again with no call failing for QUIET seconds
    (an answer from the over-limit cache is not the storage; a cluster with one master down answers and fails
    by turns, and failures a few seconds apart are one outage, not a line each). One line per failed call
    flooded the log (2,624 lines in 40 s)."""

    LINE_EVERY = 10.0
    QUIET = 10.0

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._first: float | None = None  # the first failure since the storage last answered for QUIET s
        self._last = 0.0  # the last failure
        self._failed = 0  # calls failed since the last line
        self._last_line: float | None = None
        self._announced = False  # a line said that this outage began

    def failed(self, reason: str) -> None:
        now = self._clock()
        self._failed += 1
        self._last = now
        if self._first is None:
            self._first = now
        if self._last_line is None or now - self._last_line >= self.LINE_EVERY:
            log.warning("storage unavailable: calls failed or decided by the failure mode%s: %d; last: %s",
                        "" if self._last_line is None else f" in the last {now - self._last_line:.0f} s", self._failed,
                        reason)
            self._failed, self._last_line, self._announced = 0, now, True

    def answered(self) -> None:
        if self._first is None:
            return
        now = self._clock()
        if now - self._last < self.QUIET:
            return
        if self._announced:
            log.warning("storage answering again: no call failed for %.1f s, after failures for %.1f s (calls failed "
                        "since the last line: %d)", now - self._last, self._last - self._first, self._failed)
            # the next outage is told at once
            self._failed, self._announced, self._last_line = 0, False, None
        self._first = None
