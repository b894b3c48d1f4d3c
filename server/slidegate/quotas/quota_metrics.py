"""The quota service's Prometheus metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


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
        self.degraded = Counter("ratelimit_quota_degraded_assignments", "quota buckets answered by the failure "
                                "mode (FAILURE_MODE) for a report the storage did not book", ("mode",),
                                registry=registry)
        for reason in ("malformed", "too_many"):  # shown from the start, at 0
            self.refused.labels(reason)
