"""Decisions count in plain integers, given to Prometheus when the registry is collected (slidegate.metrics): what
a scrape shows is what prometheus_client's own counters and histograms show for the same counts."""

from __future__ import annotations

import threading

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from slidegate.metrics import LimitStat, Metrics


def _latency_lines(registry: CollectorRegistry) -> list[str]:
    # the storage latency's samples, without the _created ones: the time each series was made differs
    return [line for line in generate_latest(registry).decode().splitlines()
            if line.startswith(f"{LATENCY}_") and "_created" not in line]


LATENCY = "ratelimit_storage_latency_seconds"


def test_a_deferred_histogram_shows_what_a_histogram_shows() -> None:
    values = [0.0, 0.0005, 0.00051, 0.001, 0.003, 0.02, 0.25, 0.9999, 1.0, 1.5, 30.0, 0.0025]
    metrics = Metrics()
    # a plain Histogram of the same buckets, read from what the service's own shows
    bounds = [float(sample.labels["le"]) for family in metrics.registry.collect() if family.name == LATENCY
              for sample in family.samples if sample.name == f"{LATENCY}_bucket"]
    assert len(bounds) > 5
    direct_registry = CollectorRegistry()
    direct = Histogram(LATENCY, "one storage decision", buckets=bounds, registry=direct_registry)
    for value in values:
        direct.observe(value)
        metrics.storage_latency.observe(value)
    assert _latency_lines(metrics.registry) == _latency_lines(direct_registry)
    # collected again after more observations: totals, not amounts added twice
    direct.observe(0.004)
    metrics.storage_latency.observe(0.004)
    metrics.render()
    assert _latency_lines(metrics.registry) == _latency_lines(direct_registry)


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
    metrics.total_requests.inc(4)
    # read without a collection of the whole registry, whose first collector gives the deferred counts: only the
    # series itself, as prometheus_client's files hold it for the other processes
    series = metrics.registry.restricted_registry(["ratelimit_service_total_requests_total"])
    [family] = series.collect()
    assert [s.value for s in family.samples if s.name.endswith("_total")] == [4]
