"""Decisions count in plain integers, given to Prometheus when the registry is collected (slidegate.metrics): what
a scrape shows is what prometheus_client's own counters and histograms show for the same counts."""

from __future__ import annotations

import threading

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from slidegate.metrics import _LATENCY_BUCKETS, LimitStat, Metrics, _Latencies


def _without_created(text: bytes) -> list[str]:
    # the _created samples are the time each series was made, which differs between two registries
    return [line for line in text.decode().splitlines() if "_created" not in line]


def test_a_deferred_histogram_shows_what_a_histogram_shows() -> None:
    values = [0.0, 0.0005, 0.00051, 0.001, 0.003, 0.02, 0.25, 0.9999, 1.0, 1.5, 30.0, 0.0025]
    direct_registry, deferred_registry = CollectorRegistry(), CollectorRegistry()
    direct = Histogram("h_seconds", "h", buckets=_LATENCY_BUCKETS, registry=direct_registry)
    deferred = _Latencies("h_seconds", "h", buckets=_LATENCY_BUCKETS, registry=deferred_registry)
    for value in values:
        direct.observe(value)
        deferred.observe(value)
    deferred.flush()
    assert _without_created(generate_latest(deferred_registry)) == _without_created(generate_latest(direct_registry))
    # flushed again after more observations: totals, not amounts added twice
    direct.observe(0.004)
    deferred.observe(0.004)
    deferred.flush()
    deferred.flush()
    assert _without_created(generate_latest(deferred_registry)) == _without_created(generate_latest(direct_registry))


def test_counts_reach_prometheus_on_every_collection_and_only_once() -> None:
    metrics = Metrics()
    counters = metrics.counters("d", "d_k")
    counters.record(hits=3, limit=10, over=False, shadow=False, remaining=7)
    metrics.total_requests.inc()
    metrics.call_latency.observe(0.002)
    registry = metrics.registry
    labels = {"domain": "d", "key": "d_k"}
    assert registry.get_sample_value("ratelimit_service_rate_limit_total_hits_total", labels) == 3
    assert registry.get_sample_value("ratelimit_service_total_requests_total", {"grpc_method": "ShouldRateLimit"}) == 1
    assert registry.get_sample_value("ratelimit_should_rate_limit_latency_seconds_count") == 1
    counters.record(hits=2, limit=10, over=True, shadow=False, remaining=0)
    assert registry.get_sample_value("ratelimit_service_rate_limit_total_hits_total", labels) == 5
    assert registry.get_sample_value("ratelimit_service_rate_limit_over_limit_total", labels) == 2
    assert b"ratelimit_service_rate_limit_total_hits_total{" in metrics.render()
    assert registry.get_sample_value("ratelimit_service_rate_limit_total_hits_total", labels) == 5
    # the stats store counts the same, at once
    assert dict(metrics.store.totals())["ratelimit.service.rate_limit.d.d_k.total_hits"] == 5


def test_a_series_appears_with_its_first_count_as_before() -> None:
    metrics = Metrics()
    counters = metrics.counters("d", "d_k")
    text = metrics.render()
    assert b"ratelimit_service_rate_limit_total_hits_total{" not in text
    counters.record(hits=1, limit=10, over=False, shadow=False, remaining=9)
    assert b'ratelimit_service_rate_limit_total_hits_total{domain="d",key="d_k"} 1.0' in metrics.render()


def test_a_scrape_from_another_thread_loses_no_count() -> None:
    metrics = Metrics()
    count = metrics.limit_count(LimitStat.TOTAL_HITS, "d", "d_k")
    stop = threading.Event()

    def scrape() -> None:
        while not stop.is_set():
            metrics.render()

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        for _ in range(200_000):
            count.inc()
    finally:
        stop.set()
        scraper.join()
    assert metrics.registry.get_sample_value("ratelimit_service_rate_limit_total_hits_total",
                                             {"domain": "d", "key": "d_k"}) == 200_000


def test_under_workers_every_count_goes_to_prometheus_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "/nonexistent")  # only read: nothing is written here
    metrics = Metrics()
    assert type(metrics.call_latency) is Histogram
    family = Counter("c", "c", registry=CollectorRegistry())
    count = metrics._count(family, (), "c")
    count.inc(4)
    assert family._value.get() == 4
