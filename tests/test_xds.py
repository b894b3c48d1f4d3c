"""Config over xDS (CONFIG_TYPE=GRPC_XDS_SOTW) against a real ADS server (tests/ads_server.py): the first config,
updates, a domain removed, a NACK with its reason, the server going down and back, mutual TLS, and `slidegate
serve` end to end."""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from slidegate.config import Config, ConfigError, LoadOptions
from slidegate.config.describe import describe_config
from slidegate.config.from_xds import TYPE_URL, load_resources
from slidegate.metrics import Metrics
from slidegate.protos import discovery_pb2, rls_pb2
from slidegate.protos import rls_conf_pb2 as conf
from slidegate.reload import ConfigHolder
from slidegate.settings import Settings, SettingsError
from slidegate.xds import XdsConfigSource, backoff
from tests.ads_server import AdsServer
from tests.certs import Authority
from tests.served import Served, wait_for


def limit(domain: str, key: str, requests: int, name: str = "") -> conf.RateLimitConfig:
    return conf.RateLimitConfig(name=name or domain, domain=domain, descriptors=[conf.RateLimitDescriptor(
        key=key, rate_limit=conf.RateLimitPolicy(unit=conf.MINUTE, requests_per_unit=requests))])


def invalid(name: str = "broken") -> conf.RateLimitConfig:
    # no unit and not unlimited: invalid, as the same limit in a file is
    return conf.RateLimitConfig(name=name, domain="d9", descriptors=[conf.RateLimitDescriptor(
        key="k", rate_limit=conf.RateLimitPolicy(requests_per_unit=5))])


def xds_env(port: int, **more: str) -> dict[str, str]:
    return {"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": f"127.0.0.1:{port}",
            "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "100ms", "XDS_CLIENT_BACKOFF_MAX_INTERVAL": "200ms",
            "XDS_CLIENT_BACKOFF_JITTER": "false", "BACKEND_TYPE": "memory", **more}


@pytest.fixture
def ads() -> Iterator[AdsServer]:
    server = AdsServer()
    server.start()
    yield server
    server.stop()


class Following:
    """An XdsConfigSource running on the test's loop, with its holder and metrics."""

    def __init__(self, settings: Settings) -> None:
        self.holder = ConfigHolder(Config(domains={}, loaded=False))
        self.metrics = Metrics()
        self.source = XdsConfigSource(settings, LoadOptions(), self.holder, self.metrics)
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(self.source.run(self.stop))

    async def until(self, condition: Callable[[], bool], timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, "not within the time"
            await asyncio.sleep(0.02)

    def count(self, name: str) -> int:
        return dict(self.metrics.store.totals())[f"ratelimit.service.{name}"]

    def domains(self) -> set[str]:
        return set(self.holder.current.domains)

    async def close(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 5)


async def test_first_config_updates_and_removal(ads: AdsServer) -> None:
    ads.set([limit("d1", "k", 5)])
    settings = Settings.load(xds_env(ads.port, CONFIG_GRPC_XDS_NODE_ID="rls-1",
                                     CONFIG_GRPC_XDS_NODE_METADATA="zone=a,role=x=y",
                                     CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS="X-Token:secret"))
    following = Following(settings)
    try:
        await following.until(lambda: following.source.first.is_set())
        assert following.domains() == {"d1"} and following.holder.current.version == "1"
        await following.until(lambda: len(ads.requests()) >= 2)
        first, ack = ads.requests()[:2]
        assert first.type_url == TYPE_URL and list(first.resource_names) == [] and first.version_info == ""
        assert first.node.id == "rls-1"
        assert {k: v.string_value for k, v in first.node.metadata.fields.items()} == {"zone": "a", "role": "x=y"}
        assert ads.received[0].metadata["x-token"] == "secret"
        assert (ack.version_info, ack.response_nonce, ack.HasField("error_detail")) == ("1", ads.sent[0][1].nonce,
                                                                                       False)
        ads.set([limit("d1", "k", 5), limit("d2", "k", 7)])
        await following.until(lambda: following.domains() == {"d1", "d2"})
        ads.set([limit("d2", "k", 8)])  # d1 removed: the whole config is replaced
        await following.until(lambda: following.domains() == {"d2"})
        assert following.holder.current.version == "3"
        assert "xds version 3" in describe_config(following.holder.current)
        assert following.count("config_load_success") == 3
        ads.set([])  # no resource: an empty config, accepted
        await following.until(lambda: following.holder.current.version == "4")
        assert following.domains() == set() and ads.requests()[-1].version_info == "4"
    finally:
        await following.close()


async def test_an_invalid_snapshot_is_nacked_and_the_config_kept(ads: AdsServer) -> None:
    ads.set([limit("d1", "k", 5)])
    following = Following(Settings.load(xds_env(ads.port)))
    try:
        await following.until(lambda: following.source.first.is_set())
        ads.set([limit("d2", "k", 5), invalid("broken"), limit("d2", "other", 1, name="again")])
        await following.until(lambda: any(r.HasField("error_detail") for r in ads.requests()))
        nack = next(r for r in ads.requests() if r.HasField("error_detail"))
        assert nack.version_info == "1" and nack.response_nonce == ads.sent[-1][1].nonce
        message = nack.error_detail.message
        assert "broken: descriptors[0].rate_limit.unit: is required" in message
        assert "again: domain: duplicate domain 'd2' (also in d2)" in message
        assert following.domains() == {"d1"} and following.holder.current.version == "1"
        assert following.count("config_load_error") == 1
        ads.set([limit("d3", "k", 5)], foreign=[discovery_pb2.DiscoveryRequest(type_url="x")])  # not a RateLimitConfig
        await following.until(lambda: len([r for r in ads.requests() if r.HasField("error_detail")]) == 2)
        assert ads.requests()[-1].error_detail.message == (
            "resource 1: type_url 'type.googleapis.com/envoy.service.discovery.v3.DiscoveryRequest' is not "
            f"{TYPE_URL}")
        assert following.domains() == {"d1"} and following.count("config_load_error") == 2
        ads.set([limit("d3", "k", 5)])  # a valid one after them is taken
        await following.until(lambda: following.domains() == {"d3"})
        # the config is swapped before the ACK goes out: wait for it
        await following.until(lambda: ads.requests()[-1].version_info == "4")
        assert not ads.requests()[-1].HasField("error_detail")
    finally:
        await following.close()


async def test_the_server_down_and_back(ads: AdsServer, caplog: pytest.LogCaptureFixture) -> None:
    ads.set([limit("d1", "k", 5)])
    following = Following(Settings.load(xds_env(ads.port, XDS_CLIENT_BACKOFF_MAX_INTERVAL="400ms")))

    def waits() -> list[str]:
        return re.findall(r"dialling again in (\S+) s", caplog.text)

    try:
        with caplog.at_level(logging.WARNING, logger="slidegate.xds"):
            await following.until(lambda: following.source.first.is_set())
            ads.stop()
            await following.until(lambda: len(waits()) >= 4)  # several redials fail meanwhile
            assert waits()[:4] == ["0.1", "0.2", "0.4", "0.4"]  # doubled up to the most
            assert following.domains() == {"d1"} and following.holder.current.loaded
            ads.set([limit("d2", "k", 5)])
            ads.start()
            await following.until(lambda: following.domains() == {"d2"})
            streams = {r.stream for r in ads.received}
            assert len(streams) >= 2
            # the new stream asks afresh and gets the whole set
            assert ads.requests(max(streams))[0].version_info == ""
            caplog.clear()
            ads.stop()
            await following.until(lambda: len(waits()) >= 1)
            assert waits()[0] == "0.1"  # a stream that worked starts the waits again from the first
    finally:
        await following.close()


async def test_a_response_over_the_message_size_is_not_taken(ads: AdsServer) -> None:
    many = conf.RateLimitConfig(name="big", domain="big", descriptors=[conf.RateLimitDescriptor(
        key=f"key-{n}", rate_limit=conf.RateLimitPolicy(unit=conf.SECOND, requests_per_unit=1)) for n in range(1000)])
    assert many.ByteSize() > 8192
    ads.set([many])
    small = Following(Settings.load(xds_env(ads.port, XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES="4096")))
    large = Following(Settings.load(xds_env(ads.port, XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES="65536")))
    try:
        await large.until(lambda: large.domains() == {"big"})
        await asyncio.sleep(0.3)
        assert not small.source.first.is_set() and not small.holder.current.loaded
    finally:
        await small.close()
        await large.close()


async def test_mutual_tls_with_a_san(tmp_path: Path) -> None:
    ca = Authority(tmp_path, "xds-ca")
    server_cert, server_key = ca.issue("xds-server", sans=("envoy-gateway",))
    client_cert, client_key = ca.issue("rls-client")
    credentials = grpc.ssl_server_credentials([(server_key.read_bytes(), server_cert.read_bytes())],
                                              root_certificates=ca.ca_file.read_bytes(), require_client_auth=True)
    ads = AdsServer(credentials)
    ads.start()
    ads.set([limit("d1", "k", 5)])
    tls = {"CONFIG_GRPC_XDS_SERVER_USE_TLS": "true", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT": str(ca.ca_file),
           "CONFIG_GRPC_XDS_SERVER_TLS_SAN": "envoy-gateway"}
    without_cert = Following(Settings.load(xds_env(ads.port, **tls)))
    with_cert = Following(Settings.load(xds_env(ads.port, **tls, CONFIG_GRPC_XDS_CLIENT_TLS_CERT=str(client_cert),
                                                CONFIG_GRPC_XDS_CLIENT_TLS_KEY=str(client_key))))
    try:
        await with_cert.until(lambda: with_cert.domains() == {"d1"})
        await asyncio.sleep(0.3)
        assert not without_cert.source.first.is_set()  # the server asks for a client certificate
    finally:
        await with_cert.close()
        await without_cert.close()
        ads.stop()


def test_the_resource_maps_as_the_file_would() -> None:
    descriptor = conf.RateLimitDescriptor(
        key="k", value="v", shadow_mode=True, detailed_metric=True, quota_mode=True,
        rate_limit=conf.RateLimitPolicy(unit=conf.WEEK, requests_per_unit=3, name="n",
                                        replaces=[conf.RateLimitReplace(name="m")]),
        descriptors=[conf.RateLimitDescriptor(key="free", rate_limit=conf.RateLimitPolicy(unlimited=True))])
    descriptor.metadata.update({"team": "a", "n": 2})
    config = load_resources([conf.RateLimitConfig(name="res", domain="d", descriptors=[descriptor])], "7",
                            LoadOptions())
    assert config.version == "7"
    assert describe_config(config) == (
        "xds version 7\n"
        "domain d (res):\n"
        "  [k=v] 3/week sliding_window_log name=n replaces=m shadow_mode quota_mode detailed_metric "
        'metadata={"n": 2.0, "team": "a"}\n'
        "  [k=v, free] unlimited\n")
    with pytest.raises(ConfigError) as caught:
        load_resources([invalid("broken")], "8", LoadOptions())
    assert [str(i) for i in caught.value.issues] == [
        "broken: descriptors[0].rate_limit.unit: is required (one of: second, minute, hour, day, week, month, year)"]


def test_backoff_doubles_up_to_the_most() -> None:
    settings = Settings.load({"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "10s", "XDS_CLIENT_BACKOFF_MAX_INTERVAL": "60s"})
    assert [backoff(n, settings, lambda: 0.5) for n in range(4)] == [10, 20, 40, 60]
    assert backoff(0, settings, lambda: 0.0) == 5 and backoff(0, settings, lambda: 1.0) == 15


@pytest.mark.parametrize(("env", "message"), [
    ({"CONFIG_GRPC_XDS_NODE_METADATA": "zone:a"}, "'zone:a' is not key=value"),
    ({"CONFIG_GRPC_XDS_CLIENT_TLS_CERT": "c.pem"},
     "CONFIG_GRPC_XDS_CLIENT_TLS_CERT and CONFIG_GRPC_XDS_CLIENT_TLS_KEY go together"),
    ({"CONFIG_GRPC_XDS_SERVER_TLS_SAN": "x"}, "need --config-grpc-xds-server-use-tls"),
    ({"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "2m"}, "must be at least XDS_CLIENT_BACKOFF_INITIAL_INTERVAL"),
    ({"XDS_CLIENT_BACKOFF_RANDOM_FACTOR": "2"}, "2.0 must be between 0 and 1"),
])
def test_malformed_xds_settings_are_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Settings.load({"CONFIG_TYPE": "GRPC_XDS_SOTW", **env})


def should_rate_limit(served: Served, domain: str, key: str) -> rls_pb2.RateLimitResponse:
    request = rls_pb2.RateLimitRequest(domain=domain)
    request.descriptors.add().entries.add(key=key, value="x")
    response: rls_pb2.RateLimitResponse = served.stub().ShouldRateLimit(request, timeout=5)
    return response


def test_serve_end_to_end(ads: AdsServer, serve: Callable[..., Served]) -> None:
    ads.set([limit("d1", "k", 2)])
    served = serve(None, env=xds_env(ads.port, BACKEND_TYPE="redis"))  # waits for SERVING: the config came first
    codes = [should_rate_limit(served, "d1", "k").overall_code for _ in range(3)]
    assert codes == [rls_pb2.RateLimitResponse.OK] * 2 + [rls_pb2.RateLimitResponse.OVER_LIMIT]
    assert served.http("/rlconfig")[1].startswith("xds version 1\ndomain d1 (d1):\n")
    ads.set([limit("d2", "k", 1)])
    assert wait_for(lambda: served.http("/rlconfig")[1].startswith("xds version 2\ndomain d2 (d2):\n"))
    assert should_rate_limit(served, "d1", "k").overall_code == rls_pb2.RateLimitResponse.OK  # d1 is gone
    ads.set([invalid()])
    assert wait_for(lambda: "xDS config version 3 refused (NACK), keeping version 2" in served.output())
    assert served.http("/rlconfig")[1].startswith("xds version 2\n")
    assert "ratelimit_config_load_error_total 1.0" in served.http("/metrics")[1]
    served.process.send_signal(signal.SIGHUP)  # nothing to reload, and the process goes on
    assert wait_for(lambda: "SIGHUP: the config comes over xDS, nothing to reload" in served.output())
    assert served.process.poll() is None and served.http("/rlconfig")[1].startswith("xds version 2\n")


def test_serve_waits_for_the_first_config_unless_forced(ads: AdsServer, serve: Callable[..., Served]) -> None:
    waiting = serve(None, env=xds_env(ads.port), wait=False)
    assert wait_for(lambda: "waiting for the first config from the xDS server" in waiting.output(), 20)
    assert waiting.http("/healthcheck") == (0, "")  # not listening
    forced = serve(None, env=xds_env(ads.port, FORCE_START_WITHOUT_INITIAL_CONFIG="true",
                                     HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED="true"), wait=False)
    assert wait_for(lambda: forced.http("/healthcheck") == (503, "NOT SERVING"), 20)  # listening, no config
    body = b'{"domain": "d1", "descriptors": [{"entries": [{"key": "k", "value": "x"}]}]}'
    assert forced.http("/json", body) == (500, '{"error": "no rate limit configuration loaded"}')
    with pytest.raises(grpc.RpcError) as caught:
        should_rate_limit(forced, "d1", "k")
    assert caught.value.code() == grpc.StatusCode.UNKNOWN
    assert caught.value.details() == "no rate limit configuration loaded"
    assert forced.http("/rlconfig") == (200, "no rate limit configuration loaded\n")
    ads.set([limit("d1", "k", 1)])
    assert wait_for(lambda: waiting.http("/healthcheck") == (200, "OK"), 20)
    assert wait_for(lambda: forced.http("/rlconfig")[1].startswith("xds version 1\n"), 10)
    assert wait_for(lambda: forced.http("/healthcheck") == (200, "OK"), 10)
    assert should_rate_limit(forced, "d1", "k").overall_code == rls_pb2.RateLimitResponse.OK


async def test_the_same_resources_under_a_new_version_are_acked_without_a_load(ads: AdsServer) -> None:
    ads.set([limit("d1", "k", 5)])
    following = Following(Settings.load(xds_env(ads.port)))
    try:
        await following.until(lambda: following.source.first.is_set())
        domains = following.holder.current.domains
        ads.set([limit("d1", "k", 5)])  # a server pushing its snapshot again
        await following.until(lambda: following.holder.current.version == "2")
        assert ads.requests()[-1].version_info == "2" and not ads.requests()[-1].HasField("error_detail")
        assert following.holder.current.domains is domains  # not loaded again
        assert following.count("config_load_success") == 1
        ads.set([limit("d1", "k", 6)])  # changed: loaded
        await following.until(lambda: following.holder.current.version == "3")
        assert following.count("config_load_success") == 2
    finally:
        await following.close()


def test_a_unit_the_enum_does_not_name_is_a_config_error() -> None:
    # envoyproxy/ratelimit src/config/config_xds.go writes pb.Unit.String(), a number for an unknown value, which
    # its loader refuses as any unknown unit
    resource = limit("d", "k", 5)
    resource.descriptors[0].rate_limit.unit = 99  # type: ignore[assignment]
    with pytest.raises(ConfigError, match=r"descriptors\[0\]\.rate_limit\.unit: unknown unit '99'"):
        load_resources([resource], "1", LoadOptions())


def test_a_snapshot_past_the_bound_is_refused_before_it_is_converted() -> None:
    resource = conf.RateLimitConfig(name="huge", domain="d")
    for i in range(60_000):
        resource.descriptors.add(key=f"k{i}").rate_limit.requests_per_unit = 1
    with pytest.raises(ConfigError) as caught:
        load_resources([resource], "1", LoadOptions())
    # counted on the message, not by the loader (whose words add "after expanding YAML aliases")
    assert [str(i) for i in caught.value.issues] == ["huge: more than 100000 descriptors and limits"]
