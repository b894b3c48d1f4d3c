"""Prometheus metrics, named as envoyproxy/ratelimit's stats (``ratelimit.service.rate_limit.<domain>.<key>``
becomes ``ratelimit_service_rate_limit_<stat>{domain, key}``).

Label values come from the config (a rule's path of keys and values), never from request values, so the number
of series is bounded by the config: request overrides share the key ``override``, wildcard and key-only rules
count under their pattern, and ``detailed_metric``/``value_to_metric`` add at most ``DETAILED_VALUES`` request
values per rule (later ones count under ``_other``), each at most MAX_TEXT_CHARS long (a longer one is shown
as its digest).
"""

from __future__ import annotations

import math
import os

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, multiprocess

from slidegate.text import MAX_TEXT_CHARS, digest, printable

DETAILED_VALUES = 100
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class Metrics:
    """The service's metrics in their own registry (so several servers can live in one process)."""

    def __init__(self, near_limit_ratio: float = 0.8) -> None:
        self.registry = CollectorRegistry()
        self.near_limit_ratio = near_limit_ratio
        labels = ("domain", "key")

        def counter(stat: str, doc: str) -> Counter:
            return Counter(f"ratelimit_service_rate_limit_{stat}", doc, labels, registry=self.registry)

        self.total_hits = counter("total_hits", "hits asked for by requests that matched a limit")
        self.over_limit = counter("over_limit", "hits over their limit")
        self.near_limit = counter("near_limit", "hits admitted past NEAR_LIMIT_RATIO of their limit")
        self.within_limit = counter("within_limit", "hits admitted")
        self.shadow_mode = counter("shadow_mode", "hits over a limit in shadow or quota mode, admitted anyway")
        self.config_load_success = Counter("ratelimit_config_load_success", "config (re)loads that worked",
                                           registry=self.registry)
        self.config_load_error = Counter("ratelimit_config_load_error", "config (re)loads that failed; the "
                                         "previous config stays", registry=self.registry)
        self.degraded = Counter("ratelimit_degraded_decisions", "requests decided by the failure mode because "
                                "the storage could not, or not before the caller's deadline", ["mode"],
                                registry=self.registry)
        self.storage_errors = Counter("ratelimit_storage_errors", "decisions the storage did not answer in time",
                                      registry=self.registry)
        self.storage_latency = Histogram("ratelimit_storage_latency_seconds", "one storage decision",
                                         buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.call_latency = Histogram("ratelimit_should_rate_limit_latency_seconds", "one ShouldRateLimit call",
                                      buckets=_LATENCY_BUCKETS, registry=self.registry)
        self._detailed: dict[str, set[str]] = {}

    def key(self, domain: str, rule_key: str, value: str, detailed: bool) -> str:
        """The ``key`` label of one decision: the rule's config path, plus the request value when the rule
        asks for detailed metrics and fewer than DETAILED_VALUES values were seen for it in its domain.
        Request bytes that are not UTF-8 are shown as ``\\xNN``, a value longer than MAX_TEXT_CHARS as its
        digest."""
        if not detailed:
            return rule_key
        value = digest(value) if len(value) > MAX_TEXT_CHARS else printable(value)
        seen = self._detailed.setdefault(f"{domain}\0{rule_key}", set())
        if value in seen or len(seen) < DETAILED_VALUES:
            seen.add(value)
            return f"{rule_key}_{value}"
        return f"{rule_key}__other"

    def counters(self, domain: str, key: str) -> LimitCounters:
        """The counters of one (domain, key) label pair, found once so that each decision only adds."""
        return LimitCounters((self.total_hits, self.over_limit, self.shadow_mode, self.within_limit, self.near_limit),
                             (printable(domain), key), self.near_limit_ratio)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric; under several workers (PROMETHEUS_MULTIPROC_DIR,
        set by slidegate.workers), the sums over every worker."""
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
            return bytes(generate_latest(registry))
        return bytes(generate_latest(self.registry))


class LimitCounters:
    """One limit's counters (a rule's, or the requests' overrides in one domain). A series is created on its
    first count, as prometheus_client does when labels are looked up per decision."""

    __slots__ = ("_children", "_labels", "_near_ratio", "_parents")

    def __init__(self, parents: tuple[Counter, Counter, Counter, Counter, Counter], labels: tuple[str, str],
                 near_ratio: float) -> None:
        self._parents = parents  # total, over, shadow, within, near
        self._labels = labels
        self._children: list[Counter | None] = [None] * len(parents)
        self._near_ratio = near_ratio

    def _add(self, which: int, hits: int) -> None:
        child = self._children[which]
        if child is None:
            child = self._children[which] = self._parents[which].labels(*self._labels)
        child.inc(hits)

    def record(self, *, hits: int, limit: int, over: bool, shadow: bool, remaining: int) -> None:
        """Count one decision of this limit (``hits`` asked for, ``remaining`` after it); hits given back
        or check-only requests count nothing."""
        if hits <= 0:
            return
        self._add(_TOTAL, hits)
        if over:
            self._add(_SHADOW if shadow else _OVER, hits)
            return
        self._add(_WITHIN, hits)
        near = math.floor(limit * self._near_ratio)
        used = limit - remaining
        if used > near:
            self._add(_NEAR, min(hits, used - near))


_TOTAL, _OVER, _SHADOW, _WITHIN, _NEAR = range(5)
