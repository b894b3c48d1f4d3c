"""``envoy.service.rate_limit_quota.v3.RateLimitQuotaService``: Envoy's quota filter streams usage reports of
its buckets; slidegate answers each report with every reported bucket's assignment.

A bucket's id, its entries sorted by key, is a descriptor of the stream's domain, matched against the config as
an RLS request's descriptor (slidegate.limiter): no limit, ``unlimited`` or a shadow_mode rule → ALLOW_ALL;
``requests_per_unit: 0`` → DENY_ALL; any other limit is a global quota, shared out among every Envoy's bucket of
it by the ledger in the storage (slidegate.quotas.ledger), each answered with its own token bucket. Assignments
live TTL_MS, renewed by every answer. A bucket without requests for a while is abandoned (Envoy forgets it; a
later request makes it again), a stream holds at most ``max_buckets`` buckets (later ones are denied), and
a stream that ends gives its shares back.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge

from slidegate._proto.envoy.service.rate_limit_quota.v3 import rlqs_pb2
from slidegate._proto.envoy.type.v3 import ratelimit_strategy_pb2
from slidegate.config import Config
from slidegate.limiter import Descriptor, Limiter, NoConfigLoaded
from slidegate.logs import Repeated
from slidegate.quotas.ledger import TTL_MS, Assignment
from slidegate.quotas.storage import Quota, QuotaStorage

log = logging.getLogger("slidegate.quotas")

SERVICE = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService"
Reports = rlqs_pb2.RateLimitQuotaUsageReports
Response = rlqs_pb2.RateLimitQuotaResponse
ALLOW_ALL = ratelimit_strategy_pb2.RateLimitStrategy.ALLOW_ALL
DENY_ALL = ratelimit_strategy_pb2.RateLimitStrategy.DENY_ALL

# a bucket without requests for this long (or its quota's window, if longer) is abandoned
IDLE_MS = 60_000
# a bucket id beyond these is malformed: Envoy's builders make a few short entries
MAX_ENTRIES = 32
MAX_ID_BYTES = 8192
# metric labels of this many domains at most
DOMAIN_LABELS = 100
# how many buckets of one report go to the storage at once
CONCURRENT_REPORTS = 64


class QuotaMetrics:
    """The quota service's counts, in the service's Prometheus registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.streams = Gauge("ratelimit_quota_streams", "quota streams open (Envoys connected)",
                             registry=registry, multiprocess_mode="livesum")
        self.buckets = Gauge("ratelimit_quota_buckets", "quota buckets the open streams hold",
                             registry=registry, multiprocess_mode="livesum")
        self.assignments = Counter("ratelimit_quota_assignments_sent", "bucket actions sent to Envoys",
                                   ("domain", "action"), registry=registry)
        self.reported = Counter("ratelimit_quota_reported_requests", "requests Envoys reported, by outcome",
                                ("domain", "outcome"), registry=registry)
        self.refused = Counter("ratelimit_quota_refused_buckets", "buckets not tracked: malformed ids, or past a "
                               "stream's bound", ("reason",), registry=registry)
        self.storage_errors = Counter("ratelimit_quota_storage_errors", "reports the storage did not take",
                                      registry=registry)


@dataclass(slots=True)
class Bucket:
    """One bucket of a stream: what it matched (``quota`` None: a blanket ``rule``), under which config, its
    holder name in the ledger and when it last had requests (monotonic ms)."""

    entries: tuple[tuple[str, str], ...]
    config: Config | None
    quota: Quota | None
    rule: int
    holder: str
    active: float


class QuotaService:
    """The Rate Limit Quota Service on top of a Limiter (for matching) and a QuotaStorage (for the ledgers);
    ``max_buckets`` per stream (RLQS_MAX_BUCKETS_PER_STREAM); a bucket idle for ``idle_ms`` (or its quota's
    window, if longer) is abandoned."""

    def __init__(self, limiter: Limiter, storage: QuotaStorage, registry: CollectorRegistry, *,
                 max_buckets: int = 10_000, idle_ms: int = IDLE_MS) -> None:
        self._limiter = limiter
        self._storage = storage
        self.metrics = QuotaMetrics(registry)
        self._max_buckets = max_buckets
        self._idle_ms = idle_ms
        # holders are named per process and stream, so that replicas sharing one Redis never mix theirs up
        self._process = uuid.uuid4().hex[:12]
        self._streams = itertools.count(1)
        self._malformed = Repeated(log, "a quota report named a malformed bucket, not tracked: %s")
        self._labels: set[str] = set()
        self._storage_failed = Repeated(log, "the storage did not take a quota report (assignments stay as they "
                                        "were until their TTL): %s")

    async def close(self) -> None:
        await self._storage.close()

    async def warm(self) -> None:
        """Get the storage ready for a first report (called at start and by each new stream): until a new
        bucket's first answer arrives, Envoy lets its requests through."""
        try:
            await self._storage.warm()
        except Exception as exc:  # the reports will say so again, with the reason
            self._storage_failed(repr(exc))

    def _label(self, domain: str) -> str:
        """``domain`` as a metric label: Envoy names it, so past DOMAIN_LABELS of them, ``_other``."""
        if domain not in self._labels:
            if len(self._labels) >= DOMAIN_LABELS:
                return "_other"
            self._labels.add(domain)
        return domain

    def handler(self) -> grpc.GenericRpcHandler[Any, Any]:
        method = grpc.stream_stream_rpc_method_handler(
            self.stream, request_deserializer=Reports.FromString,
            response_serializer=Response.SerializeToString)
        return grpc.method_handlers_generic_handler(SERVICE, {"StreamRateLimitQuotas": method})

    async def stream(self, reports: AsyncIterator[Reports], context: Any) -> AsyncIterator[Response]:
        """One Envoy's stream: an answer to every report, until Envoy goes."""
        name = f"{self._process}-{next(self._streams)}"
        # by domain too: Envoy opens a stream per domain, and a client that mixes them gets what each says
        buckets: dict[tuple[str, tuple[tuple[str, str], ...]], Bucket] = {}
        numbers = itertools.count(1)
        over_bound = False
        self.metrics.streams.inc()
        log.info("quota stream %s opened by %s", name, context.peer())
        await self.warm()
        try:
            async for message in reports:
                domain = message.domain
                label = self._label(domain)
                actions: list[Response.BucketAction] = []
                pending: list[tuple[Bucket, int, int, int]] = []
                for usage in message.bucket_quota_usages:
                    entries = _entries(usage.bucket_id)
                    if isinstance(entries, str):
                        self.metrics.refused.labels("malformed").inc()
                        self._malformed(entries)
                        continue
                    allowed, denied = usage.num_requests_allowed, usage.num_requests_denied
                    self.metrics.reported.labels(label, "allowed").inc(allowed)
                    self.metrics.reported.labels(label, "denied").inc(denied)
                    bucket = buckets.get((domain, entries))
                    if bucket is None:
                        if len(buckets) >= self._max_buckets:
                            # untracked: denied at every report, abandoned once idle (Envoy forgets it; a request
                            # makes it again, and its first passes as any new bucket's does)
                            if not allowed and not denied:
                                actions.append(self._abandon(usage.bucket_id, label, tracked=False))
                                continue
                            if not over_bound:
                                over_bound = True
                                log.warning("quota stream %s (%s) reported more than %d buckets "
                                            "(RLQS_MAX_BUCKETS_PER_STREAM): each further bucket is denied",
                                            name, context.peer(), self._max_buckets)
                            self.metrics.refused.labels("too_many").inc()
                            actions.append(self._blanket(usage.bucket_id, DENY_ALL, label))
                            continue
                        bucket = Bucket(entries, None, None, ALLOW_ALL, f"{name}/{next(numbers)}", 0.0)
                        buckets[domain, entries] = bucket
                        self.metrics.buckets.inc()
                    now = time.monotonic() * 1000
                    if allowed or denied or not bucket.active:
                        bucket.active = now
                    elif now - bucket.active >= max(self._idle_ms, bucket.quota.window_ms if bucket.quota else 0):
                        actions.append(self._abandon(usage.bucket_id, label))
                        await self._leave(buckets.pop((domain, entries)))
                        continue
                    try:
                        await self._match(domain, bucket)
                    except NoConfigLoaded:
                        continue  # no config yet (xDS): Envoy keeps its no-assignment behaviour meanwhile
                    if bucket.quota is None:
                        actions.append(self._blanket(usage.bucket_id, bucket.rule, label))
                    else:
                        pending.append((bucket, allowed, denied, usage.time_elapsed.seconds * 1000))
                        actions.append(Response.BucketAction(bucket_id=usage.bucket_id))
                await self._assign(pending, actions, label)
                answered = [a for a in actions if a.WhichOneof("bucket_action") is not None]
                if answered:
                    yield Response(bucket_action=answered)
        finally:
            # shielded: a stream is ended by cancelling its handler, and the shares must go back all the same
            await asyncio.shield(self._close(name, list(buckets.values())))

    async def _close(self, name: str, buckets: list[Bucket]) -> None:
        for bucket in buckets:
            await self._leave(bucket)
        self.metrics.buckets.dec(len(buckets))
        self.metrics.streams.dec()
        log.info("quota stream %s closed (%d buckets given back)", name, len(buckets))

    async def _match(self, domain: str, bucket: Bucket) -> None:
        """What ``bucket`` is under the current config (matched again after a reload; a quota it no longer
        matches gets its share back). Raises NoConfigLoaded."""
        plan = self._limiter.prepare(domain, [Descriptor(bucket.entries)])
        if plan.config is bucket.config:
            return
        bucket.config = plan.config
        quota = None
        rule = ALLOW_ALL  # no limit, unlimited, or a shadow rule: never rejects
        if plan.checks:
            check = plan.checks[0]
            if check.limit == 0:
                rule = DENY_ALL
            elif not check.shadow:
                window_ms = check.window_us // 1000
                # a limit's ledger is its own: a reload that changes the limit or window starts a new one
                quota = Quota(f"{check.key}:quota:{check.limit}:{window_ms}", check.limit, window_ms)
        bucket.rule = rule
        if bucket.quota is not None and quota != bucket.quota:
            await self._leave(bucket)
        bucket.quota = quota

    async def _assign(self, pending: list[tuple[Bucket, int, int, int]], actions: list[Response.BucketAction],
                      domain: str) -> None:
        """Book each quota bucket's report and fill its action (left empty, so not sent, when the storage
        failed)."""
        slots = [a for a in actions if not a.HasField("quota_assignment_action") and not a.HasField(
            "abandon_action")]
        for start in range(0, len(pending), CONCURRENT_REPORTS):
            chunk = pending[start:start + CONCURRENT_REPORTS]
            answers = await asyncio.gather(
                *(self._storage.report(b.quota, b.holder, allowed, denied, elapsed)  # type: ignore[arg-type]
                  for b, allowed, denied, elapsed in chunk), return_exceptions=True)
            for action, answer in zip(slots[start:start + CONCURRENT_REPORTS], answers, strict=True):
                if isinstance(answer, BaseException):
                    if not isinstance(answer, Exception):
                        raise answer
                    self.metrics.storage_errors.inc()
                    self._storage_failed(repr(answer))
                    continue
                _fill(action, answer)
                self.metrics.assignments.labels(domain, "deny_all" if answer.denies else "token_bucket").inc()

    def _blanket(self, bucket_id: rlqs_pb2.BucketId, rule: int, domain: str) -> Response.BucketAction:
        action = Response.BucketAction(bucket_id=bucket_id)
        assignment = action.quota_assignment_action
        assignment.assignment_time_to_live.FromMilliseconds(TTL_MS)
        assignment.rate_limit_strategy.blanket_rule = rule  # type: ignore[assignment]  # an int of the enum
        self.metrics.assignments.labels(domain, "allow_all" if rule == ALLOW_ALL else "deny_all").inc()
        return action

    def _abandon(self, bucket_id: rlqs_pb2.BucketId, domain: str, *, tracked: bool = True) -> Response.BucketAction:
        action = Response.BucketAction(bucket_id=bucket_id)
        action.abandon_action.SetInParent()
        self.metrics.assignments.labels(domain, "abandon").inc()
        if tracked:
            self.metrics.buckets.dec()
        return action

    async def _leave(self, bucket: Bucket) -> None:
        """Give ``bucket``'s share back (its Envoy may enforce it until its TTL: the ledger keeps it booked)."""
        if bucket.quota is None:
            return
        try:
            await self._storage.release(bucket.quota, bucket.holder)
        except Exception as exc:  # the ledger retires a holder not heard from within its lease anyway
            self.metrics.storage_errors.inc()
            self._storage_failed(repr(exc))


def _fill(action: Response.BucketAction, assignment: Assignment) -> None:
    quota = action.quota_assignment_action
    quota.assignment_time_to_live.FromMilliseconds(TTL_MS)
    if assignment.denies:
        quota.rate_limit_strategy.blanket_rule = DENY_ALL
        return
    bucket = quota.rate_limit_strategy.token_bucket
    bucket.max_tokens = assignment.max_tokens
    bucket.tokens_per_fill.value = assignment.tokens_per_fill
    bucket.fill_interval.FromMilliseconds(assignment.fill_interval_ms)


def _entries(bucket_id: rlqs_pb2.BucketId) -> tuple[tuple[str, str], ...] | str:
    """The descriptor entries of ``bucket_id`` (sorted by key), or why it is malformed."""
    entries = tuple(sorted(bucket_id.bucket.items()))
    if not entries:
        return "an empty bucket id"
    if len(entries) > MAX_ENTRIES:
        return f"a bucket id of {len(entries)} entries (at most {MAX_ENTRIES})"
    size = sum(len(k) + len(v) for k, v in entries)
    if size > MAX_ID_BYTES:
        return f"a bucket id of {size} characters (at most {MAX_ID_BYTES})"
    if any(not key for key, _ in entries):
        return "a bucket id entry without a key"
    return entries
