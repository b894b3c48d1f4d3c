"""The service's counts, counted once and seen by both sinks: the stats store under envoyproxy/ratelimit's stat
names (sent over statsd by slidegate.statsd, shown on ``/stats``) and Prometheus (``/metrics``), where
``ratelimit.service.rate_limit.<domain>.<key>.<stat>`` becomes ``ratelimit_service_rate_limit_<stat>{domain,
key}``.

Keys are composed as the reference composes them (slidegate.metric_keys). Where a key carries request values
(``detailed_metric``, ``value_to_metric``, overrides) a rule has at most DETAILED_VALUES keys in its domain (and
a domain's overrides as many): later ones count under ``<rule's config path>__other`` (``override__other``),
and unknown domains under ``_other`` past DETAILED_VALUES of them, so that neither statsd nor Prometheus
receives a series per client. The reference has no such bound.
"""

from __future__ import annotations

import bisect
import enum
import functools
import math
import os
import struct
import threading
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, multiprocess
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from slidegate.metric_keys import sanitize, shown
from slidegate.stats import StatCounter, StatsStore

DETAILED_VALUES = 100
OTHER = "__other"
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
# the reference's scopes (src/stats/manager_impl.go, src/metrics/metrics.go)
SERVICE_SCOPE = "ratelimit.service"
RATE_LIMIT_SCOPE = "ratelimit.service.rate_limit"
SHOULD_RATE_LIMIT_SCOPE = "ratelimit.service.call.should_rate_limit"
SERVER_SCOPE = "ratelimit_server.ShouldRateLimit"


class LimitStat(enum.IntEnum):
    """The stats of one limit, named as the reference's RateLimitStats."""

    TOTAL_HITS = 0
    OVER_LIMIT = 1
    NEAR_LIMIT = 2
    WITHIN_LIMIT = 3
    SHADOW_MODE = 4
    OVER_LIMIT_WITH_LOCAL_CACHE = 5

    @property
    def stat(self) -> str:
        return self.name.lower()


# the stats a decision within its limit counts, as plain ints: looking up an enum's member costs about 80 ns
_TOTAL_HITS = LimitStat.TOTAL_HITS.value
_WITHIN_LIMIT = LimitStat.WITHIN_LIMIT.value

_HELP = {
    LimitStat.TOTAL_HITS: "hits asked for by requests that matched a limit",
    LimitStat.OVER_LIMIT: "hits over their limit (shadow-mode rules' too)",
    LimitStat.NEAR_LIMIT: "hits admitted past NEAR_LIMIT_RATIO of their limit",
    LimitStat.WITHIN_LIMIT: "hits admitted",
    LimitStat.SHADOW_MODE: "hits over the limit of a shadow_mode rule, admitted anyway",
    LimitStat.OVER_LIMIT_WITH_LOCAL_CACHE: "hits over their limit answered from the over-limit cache, without Redis",
}


def _float32(value: float) -> float:
    return float(struct.unpack("f", struct.pack("f", value))[0])


@functools.lru_cache(maxsize=4096)
def near_threshold(limit: int, ratio: float) -> int:
    """Hits of ``limit`` past which a hit is near the limit: floor(limit x ratio) computed in float32, as the
    reference's ``float32(limit) * nearLimitRatio`` (so the same limits are near at the same count)."""
    return math.floor(_float32(_float32(limit) * _float32(ratio)))


class _Series:
    """One Prometheus series of a Count, and what decisions added to it: a plain integer, given to the series
    when the registry is collected (``flush``), since prometheus_client's own ``inc`` takes a lock and several
    calls per decision. ``total`` is written by the event loop only and ``given`` by ``flush`` only (under the
    Metrics' lock), so a scrape from another thread loses nothing."""

    __slots__ = ("child", "family", "given", "labels", "total")

    def __init__(self, family: Counter, labels: tuple[str, ...]) -> None:
        self.family = family
        self.labels = labels
        self.child: Counter | None = None  # created on the first count, as prometheus_client does on a label lookup
        self.total = 0
        self.given = 0

    def flush(self) -> None:
        total = self.total
        if total != self.given and self.child is not None:
            self.child.inc(total - self.given)
            self.given = total


class Count:
    """One count for both sinks: a Prometheus series (created on its first count, as prometheus_client does
    when labels are looked up per decision) and the stats store's counter. ``direct``: every count goes to the
    series at once (prometheus_client's multiprocess mode, whose files other processes read)."""

    __slots__ = ("_cell", "_direct", "_series")

    def __init__(self, series: _Series, cell: StatCounter, direct: bool) -> None:
        self._series = series
        self._cell = cell
        self._direct = direct

    def inc(self, amount: int = 1) -> None:
        series = self._series
        if series.child is None:
            series.child = series.family.labels(*series.labels) if series.labels else series.family
        series.total += amount
        self._cell.total += amount  # StatCounter.add, without a call: this runs a few times a decision
        if self._direct:
            series.flush()


class _Latencies(Histogram):
    """A Histogram (unlabelled) whose observations are counted in plain integers per bucket and given to it when
    the registry is collected (``flush``): prometheus_client's ``observe`` takes a lock and walks the buckets.
    Its series are the same (tests/test_metrics_deferred.py compares them with a Histogram's)."""

    def _metric_init(self) -> None:
        super()._metric_init()
        self._counts = [0] * len(self._upper_bounds)
        self._total = 0.0

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        if exemplar is not None:
            raise ValueError("exemplars are not kept")
        # the first bucket whose bound is at least ``amount``, as Histogram.observe finds it
        self._counts[bisect.bisect_left(self._upper_bounds, amount)] += 1
        self._total += amount

    def flush(self) -> None:
        self._sum.set(self._total)
        for bucket, count in zip(self._buckets, self._counts, strict=True):
            bucket.set(count)


class _Flush(Collector):
    """Registered first in a Metrics' registry, so that every collection (a scrape, ``get_sample_value``) finds
    the counts given to their series."""

    def __init__(self, flush: Callable[[], None]) -> None:
        self._flush = flush

    def collect(self) -> Iterable[Metric]:
        self._flush()
        return ()


class Metrics:
    """The service's counts, in their own Prometheus registry (so several servers can live in one process) and
    ``store``."""

    def __init__(self, near_limit_ratio: float = 0.8, store: StatsStore | None = None) -> None:
        self.registry = CollectorRegistry()
        self.store = store if store is not None else StatsStore()
        self.near_limit_ratio = near_limit_ratio
        registry = self.registry
        # under several workers (slidegate.workers) each count goes to prometheus_client's files at once
        self._direct = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        self._series: dict[tuple[int, tuple[str, ...]], _Series] = {}
        self._flush_lock = threading.Lock()
        registry.register(_Flush(self.flush))
        self._limit_families = {
            stat: Counter(f"ratelimit_service_rate_limit_{stat.stat}", _HELP[stat], ("domain", "key"),
                          registry=registry)
            for stat in LimitStat
        }
        not_found = Counter("ratelimit_service_rate_limit_domain_not_found", "descriptors of requests for a domain "
                            "no config has", ("domain",), registry=registry)
        errors = Counter("ratelimit_service_should_rate_limit_error", "calls refused as invalid (service_error), "
                         "or for a field the settings refuse (refused_negative_hits, refused_limit_override)",
                         ("err_type",), registry=registry)
        requests = Counter("ratelimit_service_total_requests", "gRPC calls", ("grpc_method",), registry=registry)
        self._not_found = not_found
        self.config_load_success = self._count(
            Counter("ratelimit_config_load_success", "config (re)loads that worked", registry=registry), (),
            f"{SERVICE_SCOPE}.config_load_success")
        self.config_load_error = self._count(
            Counter("ratelimit_config_load_error", "config (re)loads that failed; the previous config stays",
                    registry=registry), (), f"{SERVICE_SCOPE}.config_load_error")
        self.global_shadow_mode = self._count(
            Counter("ratelimit_service_global_shadow_mode", "requests over limit answered OK because of SHADOW_MODE",
                    registry=registry), (), f"{SERVICE_SCOPE}.global_shadow_mode")
        # the reference's redis_error: a decision the storage did not make
        self.storage_errors = self._count(
            Counter("ratelimit_storage_errors", "decisions the storage did not answer in time", registry=registry),
            (), f"{SHOULD_RATE_LIMIT_SCOPE}.redis_error")
        self.service_errors = self._count(errors, ("service_error",), f"{SHOULD_RATE_LIMIT_SCOPE}.service_error")
        # calls refused for a field the operator turned off (service.RequestPolicy), apart from service_error
        self.refused_negative_hits = self._count(errors, ("refused_negative_hits",),
                                                 f"{SHOULD_RATE_LIMIT_SCOPE}.refused_negative_hits")
        self.refused_limit_override = self._count(errors, ("refused_limit_override",),
                                                  f"{SHOULD_RATE_LIMIT_SCOPE}.refused_limit_override")
        self.total_requests = self._count(requests, ("ShouldRateLimit",), f"{SERVER_SCOPE}.total_requests")
        self.response_time = self.store.timer(f"{SERVER_SCOPE}.response_time")  # ms; Prometheus: call_latency
        self.degraded = Counter("ratelimit_degraded_decisions", "requests decided by the failure mode because "
                                "the storage could not, or not before the caller's deadline", ["mode"],
                                registry=registry)
        latencies = Histogram if self._direct else _Latencies
        self.storage_latency = latencies("ratelimit_storage_latency_seconds", "one storage decision",
                                         buckets=_LATENCY_BUCKETS, registry=registry)
        self.call_latency = latencies("ratelimit_should_rate_limit_latency_seconds", "one ShouldRateLimit call",
                                      buckets=_LATENCY_BUCKETS, registry=registry)
        self._keys: dict[tuple[str, str], set[str]] = {}
        # bounded as the keys are (limit_key): DETAILED_VALUES a rule, then the rule's __other
        self._counters: dict[tuple[str, str], LimitCounters] = {}
        self._unknown_domains: set[str] = set()

    def _count(self, family: Counter, labels: tuple[str, ...], name: str) -> Count:
        series = self._series.get((id(family), labels))
        if series is None:
            series = self._series[id(family), labels] = _Series(family, labels)
        return Count(series, self.store.counter(name), self._direct)

    def flush(self) -> None:
        """Give every series the counts added since the last flush (a collection of the registry does)."""
        with self._flush_lock:
            for series in list(self._series.values()):
                series.flush()
            for latencies in (self.storage_latency, self.call_latency):
                if isinstance(latencies, _Latencies):
                    latencies.flush()

    def limit_key(self, domain: str, group: str, key: str) -> str:
        """``key`` (a limit's key, without the domain), or ``<group>__other`` once ``group`` (the rule's config
        path, or ``override``) has DETAILED_VALUES other keys in ``domain``."""
        if key == group:
            return key
        seen = self._keys.setdefault((domain, group), set())
        if key in seen or len(seen) < DETAILED_VALUES:
            seen.add(key)
            return key
        return group + OTHER

    def counters(self, domain: str, key: str) -> LimitCounters:
        """The counters of one limit's key in ``domain`` (found once, so that each decision only adds)."""
        counters = self._counters.get((domain, key))
        if counters is None:
            counters = self._counters[domain, key] = LimitCounters(self, domain, key)
        return counters

    def limit_count(self, stat: LimitStat, domain: str, key: str) -> Count:
        """One stat of a limit: ``ratelimit.service.rate_limit.<domain>.<key>.<stat>``, sanitized as the
        reference's ``NewStats``."""
        shown_domain = shown(domain)
        name = sanitize(f"{shown_domain}.{key}")
        # the key label is the name's key part: sanitizing replaces one character for one
        labels = (shown_domain, name[len(shown_domain) + 1:])
        return self._count(self._limit_families[stat], labels, f"{RATE_LIMIT_SCOPE}.{name}.{stat.stat}")

    def domain_not_found(self, domain: str) -> Count:
        """``ratelimit.service.rate_limit.<domain>.domain_not_found``; past DETAILED_VALUES unknown domains,
        ``_other``'s."""
        shown_domain = shown(domain)
        if shown_domain not in self._unknown_domains:
            if len(self._unknown_domains) >= DETAILED_VALUES:
                shown_domain = "_other"
            else:
                self._unknown_domains.add(shown_domain)
        return self._count(self._not_found, (shown_domain,),
                           f"{RATE_LIMIT_SCOPE}.{sanitize(shown_domain)}.domain_not_found")

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric; under several workers (PROMETHEUS_MULTIPROC_DIR,
        set by slidegate.workers), the sums over every worker."""
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
            return bytes(generate_latest(registry))
        return bytes(generate_latest(self.registry))

    def render_stats(self) -> str:
        """Every counter's total as ``name: value`` lines, as the reference's debug ``/stats`` prints its stats
        (this process's counts only: each worker has its own)."""
        return "".join(f"{name}: {total}\n" for name, total in self.store.totals())


class LimitCounters:
    """One limit key's counters (a rule's, or an override's). Each stat is found on its first count."""

    __slots__ = ("_counts", "_domain", "_key", "_metrics")

    def __init__(self, metrics: Metrics, domain: str, key: str) -> None:
        self._metrics = metrics
        self._domain = domain
        self._key = key
        self._counts: list[Count | None] = [None] * len(LimitStat)

    def _add(self, stat: int, hits: int) -> None:
        count = self._counts[stat]
        if count is None:
            count = self._counts[stat] = self._metrics.limit_count(LimitStat(stat), self._domain, self._key)
        count.inc(hits)

    def record(self, *, hits: int, limit: int, over: bool, shadow: bool, remaining: int, cached: bool = False) -> None:
        """Count one decision of this limit as the reference's base limiter does: ``hits`` asked for,
        ``remaining`` after them; ``shadow``: the rule's shadow_mode (an over-limit decision then counts in
        ``shadow_mode`` besides ``over_limit``); ``cached``: answered from the over-limit cache. Hits given back
        or check-only requests count nothing. A request over its limit counts every hit over the limit (nothing
        of it was admitted: the reference, which counts the hits that still fit, puts those in near_limit)."""
        if hits <= 0:
            return
        self._add(_TOTAL_HITS, hits)
        if over:
            self._add(LimitStat.OVER_LIMIT, hits)
            if cached:
                self._add(LimitStat.OVER_LIMIT_WITH_LOCAL_CACHE, hits)
            if shadow:
                self._add(LimitStat.SHADOW_MODE, hits)
            return
        near = near_threshold(limit, self._metrics.near_limit_ratio)
        used = limit - remaining
        if used > near:
            self._add(LimitStat.NEAR_LIMIT, min(hits, used - near))
        self._add(_WITHIN_LIMIT, hits)
