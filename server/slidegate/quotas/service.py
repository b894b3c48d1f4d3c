"""``envoy.service.rate_limit_quota.v3.RateLimitQuotaService``: Envoy's quota filter streams usage reports of
its buckets; slidegate answers each report with every reported bucket's assignment.

A bucket's id, its entries sorted by key, is a descriptor of the stream's domain, matched against the config as
an RLS request's descriptor (slidegate.limiter): no limit, ``unlimited`` or a shadow_mode rule → ALLOW_ALL;
``requests_per_unit: 0`` → DENY_ALL; any other limit is a global quota, shared out among every Envoy's bucket of
it by the ledger in the storage (slidegate.quotas.ledger), each answered with its own token bucket. Assignments
live TTL_MS, renewed by every answer. A bucket without requests for a while is abandoned (Envoy forgets it; a
later request makes it again), a stream holds at most ``max_buckets`` buckets (later ones are denied), and
a stream that ends gives its shares back (or, of an Envoy that names itself, keeps them for its next stream).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc
from prometheus_client import CollectorRegistry

from slidegate._proto.envoy.service.rate_limit_quota.v3 import rlqs_pb2
from slidegate.config import Config
from slidegate.failure_modes import FailureMode
from slidegate.limiter import Descriptor, Limiter, NoConfigLoaded
from slidegate.logs import Repeated
from slidegate.quotas.fallback import Fallback
from slidegate.quotas.ledger import SLACK_MS, TTL_MS, Assignment, HolderTaken, share_of
from slidegate.quotas.messages import (
    ALLOW_ALL,
    DENY_ALL,
    MalformedReports,
    Reports,
    Response,
    abandoned,
    assigned,
    blanket,
    bucket_entries,
    parse_reports,
)
from slidegate.quotas.quota_metrics import QuotaMetrics
from slidegate.quotas.storage import Departure, Quota, QuotaStorage

__all__ = ["SERVICE", "QuotaMetrics", "QuotaService"]

log = logging.getLogger("slidegate.quotas")

SERVICE = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService"

# a bucket without requests for this long (or its quota's window, if longer) is abandoned
IDLE_MS = 60_000
# the stream metadata an Envoy names itself with (the filter's rlqs_server.initial_metadata), so that its holders
# outlive its streams
INSTANCE_HEADER = "x-rlqs-instance"
_INSTANCE = re.compile(r"[A-Za-z0-9._:@/-]{1,128}")
# metric labels of this many domains at most
DOMAIN_LABELS = 100
# how many buckets of one report go to the storage at once
CONCURRENT_REPORTS = 64


@dataclass(slots=True)
class Bucket:
    """One bucket of a stream: its id as sent, what it matched (``quota`` None: a blanket ``rule``) under which
    config, its holder's name in the ledger, when it last had requests (monotonic ms) and the assignments sent
    within a TTL (monotonic ms, share), newest last."""

    bucket_id: rlqs_pb2.BucketId
    entries: tuple[tuple[str, str], ...]
    config: Config | None
    quota: Quota | None
    rule: int
    holder: str
    active: float
    sent: list[tuple[float, int]] = field(default_factory=list)
    local: str = ""  # its holder in the failure mode's ledger (FAILURE_MODE=local), once it needed one

    def unsure(self, *, last_too: bool) -> int:
        """The largest share of a bucket Envoy may hold other than the one the ledger knows it holds: any sent
        within a TTL that differs from the last one sent (whose replacement may not have reached Envoy when the
        stream broke), and the last one too when the ledger may have replaced it unbeknown to Envoy."""
        now = time.monotonic() * 1000
        recent = [share for at, share in self.sent if now - at < TTL_MS + SLACK_MS]
        if not recent:
            return 0
        last = recent[-1]
        others = [share for share in recent if share != last]
        return max([*others, last] if last_too else others, default=0)

    def record(self, share: int) -> None:
        now = time.monotonic() * 1000
        self.sent = [(at, s) for at, s in self.sent if now - at < TTL_MS + SLACK_MS and s != share]
        self.sent.append((now, share))


class QuotaService:
    """The Rate Limit Quota Service on top of a Limiter (for matching) and a QuotaStorage (for the ledgers);
    ``max_buckets`` per stream (RLQS_MAX_BUCKETS_PER_STREAM); a bucket idle for ``idle_ms`` (or its quota's
    window, if longer) is abandoned.

    A holder in a ledger is one Envoy's bucket. Envoy sends nothing that says which Envoy it is, so a holder is
    named after its stream, and a stream that ends gives its holders back: booked until their Envoy can no
    longer be enforcing them (the assignment's TTL). An Envoy that names itself in the stream's metadata
    (INSTANCE_HEADER, the filter's ``rlqs_server.initial_metadata``) keeps its holders across its streams, on
    any replica: a reconnect picks up where it left off."""

    def __init__(self, limiter: Limiter, storage: QuotaStorage, registry: CollectorRegistry, *,
                 max_buckets: int = 10_000, idle_ms: int = IDLE_MS, fallback: Fallback | None = None) -> None:
        self.limiter = limiter
        self.storage = storage
        self.fallback = fallback or Fallback()
        self.metrics = QuotaMetrics(registry)
        self.max_buckets = max_buckets
        self.idle_ms = idle_ms
        # streams are named per process, so that replicas sharing one Redis never mix their holders up
        self._process = uuid.uuid4().hex[:12]
        self._streams = itertools.count(1)
        self.malformed = Repeated(log, "a quota report named a malformed bucket, not tracked: %s")
        self._labels: set[str] = set()
        self.storage_failed = Repeated(log, "the storage did not take a quota report (the failure mode answers "
                                        "the bucket, and its holder starts again): %s")
        self.taken = Repeated(log, "two streams report as the same Envoy instance (%s): the later one's buckets "
                               "are its own, as if it had not named itself")
        self.refused_stream = Repeated(log, "a quota stream ended with INVALID_ARGUMENT: %s")

    async def close(self) -> None:
        await self.storage.close()

    async def warm(self) -> None:
        """Get the storage ready for a first report (called by each new stream, not at start, where a cluster's
        client of its own made the rate-limit service's first calls miss their deadline): until a new bucket's
        first answer arrives, Envoy lets its requests through."""
        try:
            await self.storage.warm()
        except Exception as exc:  # the reports will say so again, with the reason
            self.storage_failed(repr(exc))

    def failure_mode(self, config: Config | None, domain: str) -> FailureMode:
        """The failure mode of ``domain``'s quotas: its own ``failure_mode``, else FAILURE_MODE."""
        own = config.domains[domain].failure_mode if config is not None and domain in config.domains else None
        return own or self.fallback.mode

    def label(self, domain: str) -> str:
        """``domain`` as a metric label: Envoy names it, so past DOMAIN_LABELS of them, ``_other``."""
        if domain not in self._labels:
            if len(self._labels) >= DOMAIN_LABELS:
                return "_other"
            self._labels.add(domain)
        return domain

    def blanket(self, bucket_id: rlqs_pb2.BucketId, rule: int, label: str) -> Response.BucketAction:
        self.metrics.assignments.labels(label, "allow_all" if rule == ALLOW_ALL else "deny_all").inc()
        return blanket(bucket_id, rule)

    def handler(self) -> grpc.GenericRpcHandler[Any, Any]:
        # reports arrive as bytes (no request_deserializer): gRPC would answer one it cannot parse with UNKNOWN,
        # naming its own exception, and log a traceback
        method = grpc.stream_stream_rpc_method_handler(self.stream, response_serializer=Response.SerializeToString)
        return grpc.method_handlers_generic_handler(SERVICE, {"StreamRateLimitQuotas": method})

    async def stream(self, reports: AsyncIterator[bytes], context: Any) -> AsyncIterator[Response]:
        """One Envoy's stream: an answer to every report, in parts for a large one, until Envoy goes; bytes that
        are not a report end it with INVALID_ARGUMENT."""
        stream = _Stream(self, f"{self._process}-{next(self._streams)}", _instance(context), context.peer())
        self.metrics.streams.inc()
        try:
            log.info("quota stream %s opened by %s%s", stream.name, stream.peer,
                     f" (instance {stream.instance})" if stream.instance else "")
            await self.warm()
            async for data in reports:
                try:
                    message = parse_reports(data)
                except MalformedReports as exc:
                    self.refused_stream(f"{stream.name} ({stream.peer}): {exc}")
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))  # raises: the stream ends
                async for response in stream.answer(message):
                    yield response
        finally:
            # shielded: a stream is ended by cancelling its handler, and the shares must go back all the same
            await asyncio.shield(stream.close())


# a stream's bucket: its domain and its id's entries
_Key = tuple[str, tuple[tuple[str, str], ...]]


@dataclass(slots=True)
class _Sorted:
    """One report's buckets, sorted: the actions to send at once, the buckets to give back once Envoy has been
    told, and the counts of the quota buckets to book (bucket → [allowed, denied, elapsed ms])."""

    actions: list[Response.BucketAction] = field(default_factory=list)
    leaving: list[Bucket] = field(default_factory=list)
    pending: dict[_Key, list[int]] = field(default_factory=dict)


class _Stream:
    """The buckets of one stream (by domain too: Envoy opens a stream per domain, and a client that mixes them
    gets what each says) and how each report is answered."""

    def __init__(self, service: QuotaService, name: str, instance: str, peer: str) -> None:
        self.service = service
        self.name = name
        self.instance = instance
        self.peer = peer
        self.buckets: dict[_Key, Bucket] = {}
        self._numbers = itertools.count(1)
        self._over_bound = False

    def _holder(self, domain: str, entries: tuple[tuple[str, str], ...]) -> str:
        """A new bucket's holder: the Envoy's own across its streams when it named itself, else this stream's."""
        if self.instance:
            digest = hashlib.sha256(repr((domain, entries)).encode()).hexdigest()[:32]
            return f"i:{self.instance}:{digest}"
        return f"{self.name}/{next(self._numbers)}"

    async def answer(self, message: Reports) -> AsyncIterator[Response]:
        """The answers to one report: the blanket and abandoned buckets' at once, then the quota buckets' as the
        storage books them (CONCURRENT_REPORTS at a time, each part sent as soon as it is booked: the ledger
        allows an answer SLACK_MS to reach Envoy)."""
        label = self.service.label(message.domain)
        report = _Sorted()
        for usage in message.bucket_quota_usages:
            await self._sort(message.domain, label, usage, report)
        if report.actions:
            yield Response(bucket_action=report.actions)
        # the abandoned buckets' holders go back once Envoy has been told, before the next report is read
        await self._give_back(report.leaving)
        keys = list(report.pending)
        for start in range(0, len(keys), CONCURRENT_REPORTS):
            answered = await self._book_part(label, keys[start:start + CONCURRENT_REPORTS], report.pending)
            if answered:
                yield Response(bucket_action=answered)

    async def _sort(self, domain: str, label: str, usage: Reports.BucketQuotaUsage, report: _Sorted) -> None:
        """Take one bucket's usage into ``report``: an action to send at once, or its counts to book."""
        service, metrics = self.service, self.service.metrics
        entries = bucket_entries(usage.bucket_id)
        if isinstance(entries, str):
            metrics.refused.labels("malformed").inc()
            service.malformed(entries)
            return
        allowed, denied = usage.num_requests_allowed, usage.num_requests_denied
        metrics.reported.labels(label, "allowed").inc(allowed)
        metrics.reported.labels(label, "denied").inc(denied)
        key = (domain, entries)
        if key in report.pending:  # the same bucket twice in one report: one report of both counts
            report.pending[key][0] += allowed
            report.pending[key][1] += denied
            return
        bucket = self._bucket(key, usage.bucket_id)
        if bucket is None:
            report.actions.append(self._untracked(usage.bucket_id, label, idle=not allowed and not denied))
            return
        if self._idle(bucket, allowed + denied):
            report.actions.append(self._abandon(key, label, report.leaving))
            return
        try:
            changed = await self._match(domain, bucket)
        except NoConfigLoaded:
            return  # no config yet (xDS): Envoy keeps its no-assignment behaviour meanwhile
        if changed:
            # a reload changed the bucket's limit: Envoy would keep its token bucket (and its refill) were the
            # new one's max_tokens and tokens_per_fill the same, so it forgets it, and starts afresh
            report.actions.append(self._abandon(key, label, report.leaving))
        elif bucket.quota is None:
            report.actions.append(service.blanket(usage.bucket_id, bucket.rule, label))
        else:
            report.pending[key] = [allowed, denied, usage.time_elapsed.seconds * 1000]

    def _bucket(self, key: _Key, bucket_id: rlqs_pb2.BucketId) -> Bucket | None:
        """The stream's bucket ``key``: a new one while the stream holds fewer than max_buckets, else None."""
        bucket = self.buckets.get(key)
        if bucket is None and len(self.buckets) < self.service.max_buckets:
            bucket = Bucket(bucket_id, key[1], None, None, ALLOW_ALL, self._holder(*key), 0.0)
            self.buckets[key] = bucket
            self.service.metrics.buckets.inc()
        return bucket

    def _idle(self, bucket: Bucket, requests: int) -> bool:
        """Whether ``bucket``, reported with ``requests`` (allowed and denied), had none for idle_ms (or its
        quota's window, if longer). One with requests, or new, is active from now."""
        now = time.monotonic() * 1000
        if requests or not bucket.active:
            bucket.active = now
            return False
        return now - bucket.active >= max(self.service.idle_ms, bucket.quota.window_ms if bucket.quota else 0)

    async def _book_part(self, label: str, keys: list[_Key], pending: dict[_Key, list[int]],
                         ) -> list[Response.BucketAction]:
        """The assignments of the buckets ``keys`` once the storage booked their counts (``pending``), together;
        for a bucket whose booking failed, the failure mode's (none for ``error``)."""
        chunk = [self.buckets[k] for k in keys]
        booked = await asyncio.gather(*(self._book(b, k[0], *pending[k]) for b, k in zip(chunk, keys, strict=True)))
        answered = []
        for bucket, answer in zip(chunk, booked, strict=True):
            if isinstance(answer, Assignment):
                answered.append(assigned(bucket.bucket_id, answer))
                # no_share: no room for this Envoy now (deny_all is a rule's requests_per_unit: 0)
                action = "no_share" if answer.denies else "token_bucket"
                self.service.metrics.assignments.labels(label, action).inc()
                assert bucket.quota is not None
                bucket.record(share_of(answer, bucket.quota.window_ms))
            elif answer is not None:
                answered.append(answer)
        return answered

    async def _book(self, bucket: Bucket, domain: str, allowed: int, denied: int, elapsed_ms: int,
                    ) -> Assignment | Response.BucketAction | None:
        """``bucket``'s report, booked: its assignment, or when the storage failed the failure mode's answer."""
        assert bucket.quota is not None
        storage = self.service.storage
        try:
            try:
                return await storage.report(bucket.quota, bucket.holder, allowed, denied, elapsed_ms, self.name)
            except HolderTaken:  # another stream reports as this Envoy instance: this one's bucket is its own
                self.service.taken(self.instance)
                bucket.holder = f"{self.name}/{next(self._numbers)}"
                return await storage.report(bucket.quota, bucket.holder, allowed, denied, elapsed_ms, self.name)
        except Exception as exc:
            # the script may have run and changed the bucket without Envoy hearing of it: the holder is given
            # back (booked for what its bucket may still let through) and the bucket starts again under a new one
            self.service.metrics.storage_errors.inc()
            self.service.storage_failed(repr(exc))
            await self._leave(bucket, unsure=bucket.unsure(last_too=True))
            bucket.holder = f"{self.name}/{next(self._numbers)}"
        return await self._degraded(bucket, domain, (allowed, denied, elapsed_ms))

    async def _degraded(self, bucket: Bucket, domain: str, usage: tuple[int, int, int],
                        ) -> Assignment | Response.BucketAction | None:
        """The failure mode's answer for ``bucket`` (slidegate.quotas.fallback), counted."""
        assert bucket.quota is not None
        mode = self.service.failure_mode(bucket.config, domain)
        if mode is FailureMode.ERROR:
            return None
        bucket.local = bucket.local or f"local:{self.name}/{next(self._numbers)}"
        self.service.metrics.degraded.labels(mode.value).inc()
        return await self.service.fallback.answer(mode, bucket.bucket_id, bucket.quota, bucket.local, usage,
                                                  self.name)

    async def _match(self, domain: str, bucket: Bucket) -> bool:
        """What ``bucket`` is under the current config (matched again after a reload; a quota it no longer has
        gets its holder back); whether a reload changed its quota to another. Raises NoConfigLoaded."""
        plan = self.service.limiter.prepare(domain, [Descriptor(bucket.entries)])
        if plan.config is bucket.config:
            return False
        bucket.config = plan.config
        quota = None
        rule = ALLOW_ALL  # no limit, or unlimited
        if plan.checks and not plan.checks[0].shadow:  # a shadow rule (or SHADOW_MODE) never rejects
            check = plan.checks[0]
            if check.limit == 0:
                rule = DENY_ALL
            else:
                window_ms = check.window_us // 1000
                # a limit's ledger is its own: a reload that changes the limit or window starts a new one
                quota = Quota(f"{check.key}:quota:{check.limit}:{window_ms}", check.limit, window_ms)
        changed = bucket.quota is not None and quota is not None and quota != bucket.quota
        if bucket.quota is not None and quota is None:
            await self._leave(bucket)
        bucket.rule, bucket.quota = rule, quota if not changed else bucket.quota
        return changed

    def _untracked(self, bucket_id: rlqs_pb2.BucketId, label: str, *, idle: bool) -> Response.BucketAction:
        """A bucket past the stream's bound: denied at every report, abandoned once idle (Envoy forgets it; a
        request makes it again, and its first passes as any new bucket's does)."""
        metrics = self.service.metrics
        if idle:
            metrics.assignments.labels(label, "abandon").inc()
            return abandoned(bucket_id)
        if not self._over_bound:
            self._over_bound = True
            log.warning("quota stream %s (%s) reported more than %d buckets (RLQS_MAX_BUCKETS_PER_STREAM): each "
                        "further bucket is denied", self.name, self.peer, self.service.max_buckets)
        metrics.refused.labels("too_many").inc()
        return self.service.blanket(bucket_id, DENY_ALL, label)

    def _abandon(self, key: _Key, label: str, leaving: list[Bucket]) -> Response.BucketAction:
        """Forget the bucket: its holder goes in ``leaving``, to be given back."""
        bucket = self.buckets.pop(key)
        self.service.metrics.buckets.dec()
        self.service.metrics.assignments.labels(label, "abandon").inc()
        leaving.append(bucket)
        return abandoned(bucket.bucket_id)

    async def _leave(self, bucket: Bucket, unsure: int | None = None) -> None:
        """Give ``bucket``'s holder back (its Envoy may enforce it until its TTL: the ledger keeps that booked,
        and ``unsure``, by default what Envoy may hold besides, see Bucket.unsure)."""
        if bucket.quota is None:
            return
        try:
            await self.service.storage.release(bucket.quota, bucket.holder,
                                                bucket.unsure(last_too=False) if unsure is None else unsure)
        except Exception as exc:  # the ledger retires a holder not heard from within its lease anyway
            self.service.metrics.storage_errors.inc()
            self.service.storage_failed(repr(exc))

    async def _give_back(self, buckets: Iterable[Bucket]) -> None:
        """Give the holders of ``buckets`` back, as _leave would each; those of an Envoy that named itself are
        detached instead, for its next stream to take up."""
        departures = []
        buckets = list(buckets)
        await self.service.fallback.give_back([(b.quota, b.local) for b in buckets if b.quota and b.local])
        for b in buckets:
            if b.quota is not None:
                owner = self.name if b.holder.startswith("i:") else ""
                departures.append(Departure(b.quota, b.holder, b.unsure(last_too=False), owner))
        if not departures:
            return
        failed = await self.service.storage.give_back(departures)
        if failed:  # a holder not heard from within its lease is retired all the same
            self.service.metrics.storage_errors.inc(len(failed))
            self.service.storage_failed(repr(failed[0]))

    async def close(self) -> None:
        """The stream ended: its holders go back, or, of an Envoy that named itself, wait for its next stream."""
        metrics = self.service.metrics
        await self._give_back(self.buckets.values())
        metrics.buckets.dec(len(self.buckets))
        metrics.streams.dec()
        log.info("quota stream %s closed (%d buckets %s)", self.name, len(self.buckets),
                 f"kept for instance {self.instance}'s next stream" if self.instance else "given back")


def _instance(context: Any) -> str:
    """The Envoy instance the stream's metadata names (INSTANCE_HEADER), "" for none or a malformed one."""
    for key, value in context.invocation_metadata() or ():
        if key == INSTANCE_HEADER:
            text = value if isinstance(value, str) else ""
            if _INSTANCE.fullmatch(text):
                return text
            log.warning("ignored %s %r from %s: 1 to 128 letters, digits and ._:@/- expected", INSTANCE_HEADER,
                        text[:200], context.peer())
    return ""
