"""PROMETHEUS_ADDR and PROMETHEUS_PATH: the metrics on a listener of their own (Envoy Gateway sets
USE_PROMETHEUS=true PROMETHEUS_ADDR=:19001 and scrapes that port), besides /metrics of the HTTP and debug ports;
PROMETHEUS_MAPPER_YAML accepted with a start-up line saying the names are fixed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from slidegate import stack
from slidegate.settings import Settings, SettingsError
from tests.helpers import descriptor, request
from tests.served import Served, wait_for

CONFIG = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5}\n"


@pytest.mark.parametrize(("text", "address"), [
    ("", None), (":19001", ("", 19001)), ("127.0.0.1:9090", ("127.0.0.1", 9090)), ("[::1]:9090", ("::1", 9090)),
    ("localhost:0", ("localhost", 0)),
])
def test_the_address_takes_go_forms(text: str, address: tuple[str, int] | None) -> None:
    assert Settings.load({"PROMETHEUS_ADDR": text}).prometheus_addr == address


@pytest.mark.parametrize(("variable", "text", "message"), [
    ("PROMETHEUS_ADDR", "9090", "is not host:port"),
    ("PROMETHEUS_ADDR", "::1:9090", "IPv6 address goes in brackets"),
    ("PROMETHEUS_ADDR", ":70000", "is not a port"),
    ("PROMETHEUS_PATH", "metrics", "is not a URL path"),
    ("PROMETHEUS_PATH", "/metrics?x=1", "is not a URL path"),
])
def test_malformed_values_are_refused(variable: str, text: str, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        Settings.load({variable: text})


def test_no_listener_unless_metrics_are_served() -> None:
    assert Settings.load({"PROMETHEUS_ADDR": ":9090"}).prometheus_listener == ("", 9090)
    assert Settings.load({"PROMETHEUS_ADDR": ":9090", "USE_PROMETHEUS": "false"}).prometheus_listener is None
    assert Settings.load({"PROMETHEUS_ADDR": ":9090", "DISABLE_STATS": "true"}).prometheus_listener is None
    with pytest.raises(SettingsError, match=r"PROMETHEUS_ADDR.*is 0"):
        Settings.load({"PROMETHEUS_ADDR": ":0", "WORKERS": "2"})


def _decide(served: Served) -> None:
    served.stub().ShouldRateLimit(request("d", descriptor(("k", "v"))), timeout=5)


def test_serve_as_envoy_gateway_sets_it(write_config: Callable[..., Path], serve: Callable[..., Served]) -> None:
    port = stack.free_port()
    served = serve(write_config(CONFIG), env={
        "USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": f":{port}", "PROMETHEUS_PATH": "/stats/prometheus",
        "PROMETHEUS_MAPPER_YAML": "/etc/statsd-exporter/conf.yaml"})
    _decide(served)
    status, body = served.http("/stats/prometheus", port=port)  # ":port" is every address: loopback too
    assert status == 200
    assert 'ratelimit_service_rate_limit_total_hits_total{domain="d",key="k"} 1.0' in body
    assert served.http("/metrics", port=port)[0] == 404  # only PROMETHEUS_PATH there
    assert served.http("/healthcheck", port=port)[0] == 404
    # the other ports keep theirs
    assert 'key="k"} 1.0' in served.http("/metrics", port=served.debug_port)[1]
    assert served.http("/metrics")[0] == 200
    assert wait_for(lambda: f"metrics on :{port}/stats/prometheus" in served.output())
    assert "PROMETHEUS_MAPPER_YAML (mapped: the Prometheus names are fixed" in served.output()


def test_no_listener_with_use_prometheus_false(write_config: Callable[..., Path],
                                               serve: Callable[..., Served]) -> None:
    port = stack.free_port()
    served = serve(write_config(CONFIG), env={"USE_PROMETHEUS": "false", "PROMETHEUS_ADDR": f"127.0.0.1:{port}"})
    assert served.http("/healthcheck")[0] == 200
    assert served.http("/metrics", port=port)[0] == 0  # nothing listens
    assert served.http("/metrics")[0] == 404
