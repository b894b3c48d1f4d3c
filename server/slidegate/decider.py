"""The decider: one request (domain, descriptors, hits) in, one Decision out, whatever carried it. The gRPC
service, the HTTP API and the in-process limiter each translate their own format to a LimitRequest and the
Decision back; the metrics, the stats and the outage log are told here, once, of every decision.

Envoy sends the same few requests again and again (one per route and client), so an edge may have a request
remembered by its own key (the gRPC service: the request's bytes) with its validated, matched form (up to
PREPARED_REQUESTS requests of at most PREPARED_MAX_BYTES, PREPARED_MAX_DESCRIPTORS and PREPARED_MAX_ENTRIES
each, forgotten all at once when full, and redone after a config reload): a request seen before goes straight
to the storage.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from enum import Enum
from typing import NamedTuple

from slidegate.backends.base import BackendUnavailable, DeadlineExceeded, admits
from slidegate.config.model import Config
from slidegate.explain import Explanation, explain
from slidegate.failure_modes import FailureMode
from slidegate.headers import Shown
from slidegate.heap import Heap
from slidegate.limiter import Descriptor, InvalidOverride, Limiter, NoConfigLoaded, Plan, Status
from slidegate.metric_keys import override_key, rule_key, same_for_every_request
from slidegate.metrics import Count, LimitCounters, Metrics
from slidegate.outage import OutageLog
from slidegate.request import InvalidRequest, Refusable, RefusedField, RequestPolicy, check_entries, check_outline
from slidegate.rule_names import rule_name
from slidegate.text import printable

# the logger decisions were always logged under, which operators filter by
log = logging.getLogger("slidegate.service")

PREPARED_REQUESTS = 10_000  # requests remembered by an edge's key (see the module docstring)
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
_tuple_new = tuple.__new__
RULE_NAME_CHARS = 200  # of an override's name (rule_of)


class Refused(Enum):
    """Why a call went undecided, named as the gRPC status each edge answers it with (the HTTP API maps each to
    its HTTP status): the decider itself knows no transport."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    UNAVAILABLE = "UNAVAILABLE"
    UNKNOWN = "UNKNOWN"


class Refusal(NamedTuple):
    """The answer to a call that went undecided; gRPC, the HTTP API and the in-process limiter say the same."""

    code: Refused
    details: str


def refusal(exc: Undecided) -> Refusal:
    """The one mapping from why a call went undecided to its answer. Storage failing is UNAVAILABLE, so that
    Envoy's ``failure_mode_deny`` decides; its details name no address (they reach the caller)."""
    if isinstance(exc, DeadlineExceeded):
        return Refusal(Refused.DEADLINE_EXCEEDED, "the call's deadline ran out")
    if isinstance(exc, BackendUnavailable):
        return Refusal(Refused.UNAVAILABLE, "rate limit storage unavailable")
    if isinstance(exc, NoConfigLoaded):
        # envoyproxy/ratelimit returns it as a plain error, which gRPC sends as UNKNOWN
        return Refusal(Refused.UNKNOWN, str(exc))
    return Refusal(Refused.INVALID_ARGUMENT, str(exc))


class LimitRequest(NamedTuple):
    """A request as every edge hands it over: ``hits_addend`` the request-level value (0 ⇒ 1), ``timeout`` the
    seconds left of the caller's deadline (None: none)."""

    domain: str
    descriptors: Sequence[Descriptor]
    hits_addend: int = 0
    timeout: float | None = None


class Prepared(NamedTuple):
    """A validated request matched against the config (``plan``), with the metric counters of each limit
    it names: (index of the descriptor, its counters, its limit's requests_per_unit); for a domain no config
    has, its ``domain_not_found`` count (one per descriptor, as the reference looks each up); for a request
    remembered, the edge's ``skeleton`` of its answers (Decider's ``skeleton``)."""

    descriptors: Sequence[Descriptor]
    plan: Plan
    counted: tuple[tuple[int, LimitCounters, int], ...]
    hits_addend: int = 0
    not_found: Count | None = None
    skeleton: bytes | None = None


class Decision(NamedTuple):
    """The answer to one request: a Status per descriptor in the request's order (each with its matched
    ``rule``, None for none or the request's own limit) and ``rejected``, the overall code (OVER_LIMIT; never
    under SHADOW_MODE). ``prepared``: the request as matched (domain, descriptors, hits_addend); ``degraded``,
    ``late`` and ``cached``: how it was decided (limiter.Decided)."""

    prepared: Prepared
    statuses: list[Status]
    rejected: bool
    degraded: FailureMode | None = None
    late: bool = False
    cached: bool = False

    @property
    def domain(self) -> str:
        return self.prepared.plan.domain

    def codes(self) -> list[bool]:
        """For each descriptor, whether its own code is OVER_LIMIT: over, unless its rule is in shadow mode."""
        return [s.over and not s.shadow for s in self.statuses]

    def rejecting(self) -> list[tuple[Descriptor, Status]]:
        """The descriptors that rejected this request, none when it was admitted: every one over its limit and not
        in shadow mode, its quota-mode ones only when no other rejected it (then all of them were over)."""
        if not self.rejected:
            return []
        over = [(d, s) for d, s in zip(self.prepared.descriptors, self.statuses, strict=True)
                if s.over and not s.shadow]
        return [(d, s) for d, s in over if not s.quota] or over

    def rejecting_rules(self) -> list[str]:
        """The names of the rules that rejected this request (``rejecting``, named by rule_of), each once."""
        return list(dict.fromkeys(rule_of(d, s) for d, s in self.rejecting()))

    def shown(self) -> list[Shown]:
        """What the rate-limit response headers tell: each descriptor with a limit of a unit."""
        rejected = self.rejected
        return [Shown(s.limit.name, tuple(key for key, _ in d.entries), s.limit.requests_per_unit,
                      s.limit.window_seconds, s.remaining, s.reset_us, s.over, rejected and s.over and not s.shadow,
                      s.quota, s.over and not s.shadow)
                for d, s in zip(self.prepared.descriptors, self.statuses, strict=True)
                if s.limit is not None and s.limit.unit is not None]


def rejects(statuses: Sequence[Status]) -> bool:
    """Whether the admission rule (backends.base.admits) rejects a request of these statuses."""
    # a request with no limit over is admitted (most are: the admission rule's scans are for the others)
    for status in statuses:
        if status.over:
            return not admits(statuses, [s.over for s in statuses])
    return False


def rule_of(descriptor: Descriptor, status: Status) -> str:
    """The name of the rule ``status`` was decided by (rule_names.rule_name); a request's own limit (an override)
    by its descriptor's keys, its values left out (they are the caller's)."""
    if status.rule is not None:
        return rule_name(status.rule)
    # cut short: a caller's keys may be any length, and the name goes into logs, headers and metadata
    return ("override of " + ".".join(printable(key) for key, _ in descriptor.entries))[:RULE_NAME_CHARS]


def check_shape(domain: str, descriptors: Sequence[Descriptor]) -> None:
    """The bounds a request of any edge is held to, as slidegate.request holds a call's. Raises InvalidRequest."""
    check_outline(domain, descriptors)
    for index, d in enumerate(descriptors):
        check_entries(index, d.entries)


class Decider:
    """Decides requests with ``limiter`` and tells ``metrics`` and the outage log of each decision. ``policy``:
    what callers may ask (the edges read requests under it); ``heap``: told of remembered requests (slidegate.heap,
    in slidegate serve); ``skeleton``: what an edge keeps with each remembered request to answer it faster (the
    gRPC service: its responses' skeleton, serialized)."""

    def __init__(self, limiter: Limiter, metrics: Metrics | None = None, heap: Heap | None = None,
                 policy: RequestPolicy | None = None,
                 skeleton: Callable[[Sequence[Status]], bytes] | None = None) -> None:
        self._limiter = limiter
        self.metrics = metrics or Metrics()
        self.policy = policy or RequestPolicy()
        self._heap = heap
        self._skeleton = skeleton
        self._prepared: dict[bytes, Prepared] = {}
        # the metric key of each rule whose key is the same for every request (by the rule's id: its config keeps
        # it alive), so that a request never seen before (a new client's address, a new path) does not compose it
        self._rule_keys: dict[int, str] = {}
        # the config everything above was matched against: a reload forgets it all at once, here only
        self._epoch: Config | None = None
        self._outage = OutageLog()
        self._watchers: list[Callable[[Decision], object]] = []

    def watch(self, watcher: Callable[[Decision], object]) -> None:
        """Tell ``watcher`` of every decision from now on, as it is made (in the event loop: it must be quick and
        must not raise), after the metrics; a call refused or undecided is not a decision."""
        self._watchers.append(watcher)

    def remembered(self) -> dict[bytes, Prepared]:
        """The requests remembered now, by their edge's key (a copy; see the module docstring)."""
        return dict(self._prepared)

    def recall(self, key: bytes) -> Prepared | None:
        """The request remembered under ``key``, if it was matched against the config in force."""
        prepared = self._prepared.get(key)
        if prepared is None or not self._limiter.is_current(prepared.plan):
            return None
        return prepared

    def prepare_keyed(self, key: bytes, domain: str, descriptors: Sequence[Descriptor],
                      hits_addend: int = 0) -> Prepared:
        """Prepare a validated request, remembered under ``key`` (bytes of its edge's format, which bound its
        size) when it is small enough (see the module docstring). Raises InvalidOverride and NoConfigLoaded."""
        remember = (len(key) <= PREPARED_MAX_BYTES and len(descriptors) <= PREPARED_MAX_DESCRIPTORS
                    and sum(len(d.entries) for d in descriptors) <= PREPARED_MAX_ENTRIES)
        prepared = self.prepare(domain, descriptors, hits_addend, skeleton=remember)
        if remember:
            # cheaper than tracking use, and only costs a re-match
            if len(self._prepared) >= PREPARED_REQUESTS:
                self._forget()
            self._prepared[key] = prepared
            if self._heap is not None:
                self._heap.remembered()
        elif self._heap is not None:
            self._heap.received(len(key))
        return prepared

    def _forget(self) -> None:
        forgotten, self._prepared = self._prepared, {}
        if self._heap is not None and forgotten:
            self._heap.forgot(forgotten)

    def _in_epoch(self, config: Config) -> None:
        """After a reload the old config's remembered requests and rule keys go at once, or they would keep
        that whole config alive."""
        if config is not self._epoch:
            self._epoch = config
            self._forget()
            self._rule_keys = {}

    def prepare(self, domain: str, descriptors: Sequence[Descriptor], hits_addend: int = 0, *,
                skeleton: bool = False) -> Prepared:
        """Match a validated request (see Limiter.prepare) and find its metric counters; with ``skeleton``, make
        the edge's skeleton of its answers (for a request that will be answered again). Raises InvalidOverride
        and NoConfigLoaded."""
        plan = self._limiter.prepare(domain, descriptors, hits_addend)
        self._in_epoch(plan.config)
        made = self._skeleton(plan.statuses) if skeleton and self._skeleton is not None else None
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
                shown = self._rule_keys.get(id(rule))
                if shown is None:
                    shown = rule_key(descriptor.entries, rule)
                    if same_for_every_request(rule):
                        self._rule_keys[id(rule)] = shown
                key = self.metrics.limit_key(domain, rule.metric_key, shown)
            counted.append((index, self.metrics.counters(domain, key), status.limit.requests_per_unit))
        return Prepared(descriptors, plan, tuple(counted), hits_addend, skeleton=made)

    async def decide(self, request: LimitRequest) -> Decision:
        """Decide a request of any edge: its shape checked (check_shape), matched, decided. Raises InvalidRequest,
        InvalidOverride, NoConfigLoaded, BackendUnavailable (DeadlineExceeded), each counted as refused."""
        try:
            check_shape(request.domain, request.descriptors)
            prepared = self.prepare(request.domain, request.descriptors, request.hits_addend)
            return await self.decide_prepared(prepared, request.timeout)
        except UNDECIDED as exc:
            self.refused(exc)
            raise

    async def explain(self, request: LimitRequest) -> Explanation:
        """Explain a request of any edge without deciding it (slidegate.explain): nothing counted, nothing told to
        the metrics. Raises as ``decide`` does, BackendUnavailable whatever the failure mode."""
        check_shape(request.domain, request.descriptors)
        return await explain(self._limiter, request.domain, request.descriptors, request.hits_addend,
                             request.timeout)

    def refused(self, exc: Undecided) -> None:
        """Count a call refused as invalid (the reference's ``service_error``; a refused field under its own
        name); storage failures are counted where they happen (``redis_error``)."""
        if isinstance(exc, RefusedField):
            count = (self.metrics.refused_negative_hits if exc.field is Refusable.NEGATIVE_HITS
                     else self.metrics.refused_limit_override)
            count.inc()
        elif isinstance(exc, (InvalidRequest, InvalidOverride, NoConfigLoaded)):
            self.metrics.service_errors.inc()

    async def decide_prepared(self, prepared: Prepared, timeout: float | None = None) -> Decision:
        """Decide ``prepared`` within ``timeout`` seconds and count it in the metrics. Raises
        BackendUnavailable, and DeadlineExceeded when ``timeout`` ran out first."""
        started = time.perf_counter()
        try:
            decided = await self._limiter.decide(prepared.plan, timeout)
        except DeadlineExceeded:
            raise  # the caller's own deadline: not a storage failure
        except BackendUnavailable as exc:
            self.metrics.storage_errors.inc()
            self._outage.failed(str(exc))
            raise
        statuses, degraded, late, cached = decided
        rejected = False
        for status in statuses:  # most requests have no limit over: rejects' scans are for the others
            if status.over:
                rejected = rejects(statuses)
                break
        if rejected and self._limiter.shadow_mode:
            rejected = False
            self.metrics.global_shadow_mode.inc()  # SHADOW_MODE turned this request's OVER_LIMIT into OK
        decision: Decision = _tuple_new(Decision, (prepared, statuses, rejected, degraded, late, cached))
        # the metrics, the stats and the outage log are told of the decision here, and only here
        if degraded:
            self.metrics.degraded.labels(degraded).inc()
            # a caller in a hurry says nothing of the storage's health (its round trip goes on, and the breaker
            # counts it if it fails)
            if not late:
                self.metrics.storage_errors.inc()
                self._outage.failed(f"decided by failure mode {degraded}")
        elif prepared.plan.counted and not cached:  # the storage answered (a request of no limit never asks it)
            self.metrics.storage_latency.observe(time.perf_counter() - started)
            if self._outage.failing:
                self._outage.answered()
        if prepared.not_found is not None:
            prepared.not_found.inc(len(prepared.descriptors))
        for index, counters, limit in prepared.counted:
            status = statuses[index]
            counters.record(hits=status.hits, limit=limit, over=status.over, remaining=status.remaining,
                            shadow=status.shadow, cached=cached)  # shadow: its rule's shadow_mode
        if log.isEnabledFor(logging.DEBUG):
            _log_decision(decision)
        if self._watchers:
            for watcher in self._watchers:
                watcher(decision)
        self.metrics.call_latency.observe(time.perf_counter() - started)
        return decision


def _log_decision(decision: Decision) -> None:
    fields = {
        "domain": printable(decision.domain),
        "descriptors": [[printable(f"{k}={v}") for k, v in d.entries] for d in decision.prepared.descriptors],
        "codes": ["OVER_LIMIT" if over else "OK" for over in decision.codes()],
        "overall": "OVER_LIMIT" if decision.rejected else "OK",
    }
    log.debug("decision %s", " ".join(f"{k}={v}" for k, v in fields.items()), extra=fields)
