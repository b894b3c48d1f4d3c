"""The statsd sink, received on real sockets from a real `slidegate serve`: envoyproxy/ratelimit's stat names and
counts (its src/stats/manager_impl.go names, src/limiter/base_limiter.go counts, src/metrics/metrics.go's
ratelimit_server stats), over TCP as its lyft/gostats client sends them (net_sink.go; tags.go for EXTRA_TAGS), over
UDP, and to DogStatsD as its src/godogstats sink sends them; and when USE_STATSD is on (settings.go)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from slidegate.protos import ratelimit_unit_pb2, rls_pb2_grpc
from slidegate.settings import Settings, SettingsError
from slidegate.stack import free_port
from slidegate.stats import StatsStore
from slidegate.statsd import LineFormat, StatsdSink, Transport
from tests.helpers import OK, OVER_LIMIT, descriptor, request
from tests.served import Served, wait_for

CONFIG = """
domain: s
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: path
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: tenant
    descriptors:
      - key: user
        value: alice
        detailed_metric: true
        rate_limit: {unit: hour, requests_per_unit: 100}
  - key: route
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: hour, requests_per_unit: 100}
"""
CALLS = 15  # the gRPC calls ``traffic`` makes
RL = "ratelimit.service.rate_limit"
# what ``traffic`` counts, under the reference's names (limit 5: hits past floor(5 x 0.8) = 4 are near)
EXPECTED = {
    f"{RL}.s.user.total_hits": 6, f"{RL}.s.user.within_limit": 5, f"{RL}.s.user.near_limit": 1,
    f"{RL}.s.user.over_limit": 1,
    # a shadow rule over its limit counts over_limit and shadow_mode, and answers OK
    f"{RL}.s.shadow.total_hits": 2, f"{RL}.s.shadow.within_limit": 1, f"{RL}.s.shadow.near_limit": 1,
    f"{RL}.s.shadow.over_limit": 1, f"{RL}.s.shadow.shadow_mode": 1,
    f"{RL}.s.path_/a.total_hits": 1, f"{RL}.s.path_/a.within_limit": 1,
    f"{RL}.s.path_/b.total_hits": 1, f"{RL}.s.path_/b.within_limit": 1,
    f"{RL}.s.tenant_t1.user_alice.total_hits": 1, f"{RL}.s.tenant_t1.user_alice.within_limit": 1,
    f"{RL}.s.route_r1.method.total_hits": 1, f"{RL}.s.route_r1.method.within_limit": 1,
    f"{RL}.s.client_c1.total_hits": 1, f"{RL}.s.client_c1.within_limit": 1,
    f"{RL}.nope.domain_not_found": 1,
    "ratelimit.service.config_load_success": 1,
    "ratelimit.service.call.should_rate_limit.service_error": 1,
    "ratelimit_server.ShouldRateLimit.total_requests": CALLS,
}


class Collector:
    """A statsd server on a free port of 127.0.0.1: every line received over TCP (any number of connections)
    or UDP."""

    def __init__(self, transport: str) -> None:
        kind = socket.SOCK_STREAM if transport == "tcp" else socket.SOCK_DGRAM
        self._socket = socket.socket(socket.AF_INET, kind)
        self._socket.bind(("127.0.0.1", 0))
        self.port = self._socket.getsockname()[1]
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._closed = False
        if transport == "tcp":
            self._socket.listen()
            threading.Thread(target=self._accept, daemon=True).start()
        else:
            threading.Thread(target=self._receive, daemon=True).start()

    def _add(self, data: bytes) -> None:
        with self._lock:
            self.lines.extend(line for line in data.decode().split("\n") if line)

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while not self._closed:
                connection, _ = self._socket.accept()
                threading.Thread(target=self._read, args=(connection,), daemon=True).start()

    def _read(self, connection: socket.socket) -> None:
        pending = b""
        with connection, contextlib.suppress(OSError):
            while chunk := connection.recv(65536):
                pending += chunk
                complete, _, pending = pending.rpartition(b"\n")
                if complete:
                    self._add(complete)

    def _receive(self) -> None:
        with contextlib.suppress(OSError):
            while not self._closed:
                datagram = self._socket.recv(65536)
                assert len(datagram) <= 1432  # gostats' datagram size
                self._add(datagram)

    def counters(self) -> dict[str, int]:
        """Every counter's sum over the lines received (``name:N|c`` …)."""
        sums: Counter[str] = Counter()
        with self._lock:
            for line in self.lines:
                name, _, rest = line.partition(":")
                value, kind, *tags = rest.split("|")
                if kind == "c":
                    sums["|".join([name, *tags])] += int(value)
        return dict(sums)

    def timers(self) -> list[str]:
        with self._lock:
            return [line for line in self.lines if "|ms" in line]

    def close(self) -> None:
        self._closed = True
        self._socket.close()


@pytest.fixture
def collector(request: pytest.FixtureRequest) -> Iterator[Collector]:
    found = Collector(getattr(request, "param", "tcp"))
    yield found
    found.close()


def traffic(served: Served) -> None:
    """Within, near and over limit, a shadow rule over its limit, detailed_metric, nested, value_to_metric, an
    override, an unknown domain and an invalid request: CALLS gRPC calls."""
    stub = served.stub()
    codes = [stub.ShouldRateLimit(request("s", descriptor(("user", "u")))).overall_code for _ in range(6)]
    assert codes == [OK] * 5 + [OVER_LIMIT]
    assert [stub.ShouldRateLimit(request("s", descriptor(("shadow", "x")))).overall_code for _ in range(2)] == [OK] * 2
    for path in ("/a", "/b"):
        stub.ShouldRateLimit(request("s", descriptor(("path", path))))
    stub.ShouldRateLimit(request("s", descriptor(("tenant", "t1"), ("user", "alice"))))
    stub.ShouldRateLimit(request("s", descriptor(("route", "r1"), ("method", "GET"))))
    override = descriptor(("client", "c1"))
    override.limit.requests_per_unit, override.limit.unit = 10, ratelimit_unit_pb2.HOUR
    stub.ShouldRateLimit(request("s", override))
    stub.ShouldRateLimit(request("nope", descriptor(("user", "u"))))
    with pytest.raises(grpc.RpcError):
        stub.ShouldRateLimit(request("", descriptor(("user", "u"))))


def statsd_env(collector: Collector, **more: str) -> dict[str, str]:
    return {"STATSD_HOST": "127.0.0.1", "STATSD_PORT": str(collector.port), "STATS_FLUSH_INTERVAL": "100ms", **more}


def test_counts_arrive_over_tcp_as_gostats_sends_them(write_config: Callable[..., Path],
                                                      serve: Callable[..., Served], collector: Collector) -> None:
    """STATSD_HOST alone turns statsd on (the reference's USE_STATSD defaults to true); TCP, its gostats
    client's default; every counter line ``name:N|c`` summed gives the reference's counts."""
    served = serve(write_config(CONFIG), env=statsd_env(collector))
    traffic(served)
    assert wait_for(lambda: collector.counters() == EXPECTED), collector.counters()
    # one ``ratelimit_server.ShouldRateLimit.response_time:<whole ms>|ms`` line per call
    assert wait_for(lambda: len(collector.timers()) == CALLS)
    assert all(line.startswith("ratelimit_server.ShouldRateLimit.response_time:") and line.endswith("|ms")
               and line.split(":")[1].split("|")[0].isdigit() for line in collector.timers())
    # the debug port's /stats: every counter's total, as the reference's debug server prints its stats
    status, text = served.http("/stats", port=served.debug_port)
    assert status == 200
    assert f"{RL}.s.user.total_hits: 6\n" in text and "ratelimit.service.config_load_success: 1\n" in text
    # Prometheus saw the same counts, under the same keys
    metrics = served.http("/metrics", port=served.debug_port)[1]
    assert 'ratelimit_service_rate_limit_shadow_mode_total{domain="s",key="shadow"} 1.0' in metrics
    assert 'ratelimit_service_rate_limit_over_limit_total{domain="s",key="shadow"} 1.0' in metrics
    assert 'ratelimit_service_rate_limit_total_hits_total{domain="s",key="tenant_t1.user_alice"} 1.0' in metrics


@pytest.mark.parametrize("collector", ["udp"], indirect=True)
def test_counts_arrive_over_udp_with_extra_tags(write_config: Callable[..., Path], serve: Callable[..., Served],
                                                collector: Collector) -> None:
    """STATSD_PROTOCOL=udp (read by gostats); EXTRA_TAGS in the name as gostats' tags.go serializes them:
    ``.__key=value`` sorted by key, ``.`` ``:`` ``|`` in a value as ``_``."""
    served = serve(write_config(CONFIG), env=statsd_env(collector, USE_STATSD="true", STATSD_PROTOCOL="udp",
                                                        EXTRA_TAGS="zone:eu.1,app:rl"))
    traffic(served)
    tagged = {f"{name}.__app=rl.__zone=eu_1": n for name, n in EXPECTED.items()}
    assert wait_for(lambda: collector.counters() == tagged), collector.counters()


@pytest.mark.parametrize("collector", ["udp"], indirect=True)
def test_dogstatsd_tags_and_mogrifiers(write_config: Callable[..., Path], serve: Callable[..., Served],
                                       collector: Collector) -> None:
    """USE_DOG_STATSD: UDP, tags after ``|#`` (src/godogstats/dogstatsd_sink.go separateTags); a mogrifier
    (mogrifier_map.go) renames what its pattern matches and adds its tags."""
    served = serve(write_config(CONFIG), env=statsd_env(
        collector, USE_DOG_STATSD="true", EXTRA_TAGS="zone:eu", USE_DOG_STATSD_MOGRIFIERS="LIMITS",
        DOG_STATSD_MOGRIFIER_LIMITS_PATTERN=r"^ratelimit\.service\.rate_limit\.(\w+)\.user\.(\w+)$",
        DOG_STATSD_MOGRIFIER_LIMITS_NAME="ratelimit.user.$2", DOG_STATSD_MOGRIFIER_LIMITS_TAGS="domain:$1"))
    traffic(served)

    def tagged(name: str) -> str:
        mogrified = name.removeprefix(f"{RL}.s.user.")
        if mogrified != name:
            return f"ratelimit.user.{mogrified}|#zone:eu,domain:s"
        return f"{name}|#zone:eu"

    expected = {tagged(name): n for name, n in EXPECTED.items()}
    assert wait_for(lambda: collector.counters() == expected), collector.counters()
    assert wait_for(lambda: len(collector.timers()) == CALLS)
    assert all(line.endswith("|ms|#zone:eu") for line in collector.timers())


def test_workers_each_send_their_counts(write_config: Callable[..., Path], serve: Callable[..., Served],
                                        collector: Collector) -> None:
    """`serve --workers 2`: each worker sends its own counters on its own connection; statsd sums them."""
    served = serve(write_config(CONFIG), "--workers", "2", env=statsd_env(collector))
    assert wait_for(lambda: served.output().count("listening for gRPC") == 2, timeout=15)
    channels = [grpc.insecure_channel(f"127.0.0.1:{served.grpc_port}", options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(20)]
    try:
        def call(channel: grpc.Channel) -> int:
            stub = rls_pb2_grpc.RateLimitServiceStub(channel)
            return int(stub.ShouldRateLimit(request("s", descriptor(("path", "/w"))), timeout=5).overall_code)

        with ThreadPoolExecutor(8) as pool:
            assert list(pool.map(call, channels)) == [OK] * 20
    finally:
        for channel in channels:
            channel.close()
    assert wait_for(lambda: collector.counters() == {
        f"{RL}.s.path_/w.total_hits": 20, f"{RL}.s.path_/w.within_limit": 20,
        "ratelimit_server.ShouldRateLimit.total_requests": 20,
        "ratelimit.service.config_load_success": 2,  # each worker loads the config
    }, timeout=10), collector.counters()


def test_a_statsd_that_is_down_costs_nothing(write_config: Callable[..., Path], serve: Callable[..., Served]) -> None:
    """Nothing listens on the port: calls are answered as usual and the loss is logged."""
    served = serve(write_config(CONFIG), env={"USE_STATSD": "true", "STATSD_PORT": str(free_port()),
                                              "STATS_FLUSH_INTERVAL": "100ms"})
    stub = served.stub()
    assert [stub.ShouldRateLimit(request("s", descriptor(("user", "u")))).overall_code for _ in range(6)] == (
        [OK] * 5 + [OVER_LIMIT])
    assert wait_for(lambda: "stats not sent to statsd tcp://localhost:" in served.output())


def test_when_statsd_is_on() -> None:
    """The reference's USE_STATSD is true by default; slidegate's default sink is Prometheus, so statsd is on
    when USE_STATSD=true, USE_DOG_STATSD=true, or (USE_STATSD unset) a STATSD_HOST is given; DISABLE_STATS
    turns every sink off; the reference refuses two statsd sinks."""
    assert not Settings.load({}).statsd_enabled
    assert Settings.load({"STATSD_HOST": "statsd.local"}).statsd_enabled
    assert Settings.load({"USE_STATSD": "true"}).statsd_enabled
    assert not Settings.load({"USE_STATSD": "false", "STATSD_HOST": "statsd.local"}).statsd_enabled
    assert Settings.load({"USE_DOG_STATSD": "true"}).statsd_enabled
    disabled = Settings.load({"USE_STATSD": "true", "DISABLE_STATS": "true"})
    assert not disabled.statsd_enabled and not disabled.serves_prometheus
    assert Settings.load({}).serves_prometheus
    with pytest.raises(SettingsError, match="set one of them"):
        Settings.load({"USE_STATSD": "true", "USE_DOG_STATSD": "true"})
    with pytest.raises(SettingsError, match="'zone' is not key:value"):
        Settings.load({"EXTRA_TAGS": "zone"})
    assert Settings.load({"EXTRA_TAGS": "a:1,b:x:y"}).extra_tags == (("a", "1"), ("b", "x:y"))


def test_a_mogrifier_without_its_pattern_stops_serve(write_config: Callable[..., Path],
                                                     serve: Callable[..., Served]) -> None:
    """src/godogstats/mogrifier_map.go refuses a mogrifier with no PATTERN or NAME; so does slidegate, at start."""
    served = serve(write_config(CONFIG), wait=False, env={"USE_DOG_STATSD": "true", "USE_DOG_STATSD_MOGRIFIERS": "X"})
    assert served.process.wait(30) == 1
    assert "no DOG_STATSD_MOGRIFIER_X_PATTERN for mogrifier X" in served.output()


def test_counters_are_summed_between_flushes() -> None:
    """gostats' store (stats.go Flush) sends each counter once per flush with what was added since the last one,
    and nothing for a counter that did not change; timers' values go every second, one line each."""
    store = StatsStore(keep_timers=True)
    sink = StatsdSink(store, "127.0.0.1", 8125, Transport.TCP, 10.0, LineFormat(dog=False))
    for _ in range(6):
        store.counter("a.b").add(1)
    store.counter("a.c").add(0)
    store.timer("t").record(3)
    store.timer("t").record(4.5)
    assert sink.lines(counters=False) == ["t:3|ms", "t:4.500000|ms"]
    assert sink.lines(counters=True) == ["a.b:6|c"]
    store.counter("a.b").add(2)
    assert sink.lines(counters=True) == ["a.b:2|c"]
    assert sink.lines(counters=True) == []


def test_a_statsd_that_never_reads_holds_one_connection_at_most(monkeypatch: pytest.MonkeyPatch) -> None:
    """A statsd that accepts and never reads: a write that cannot drain in time aborts its connection (its unsent
    bytes with it) and the next dial waits the retry interval, as gostats does, instead of a new socket and
    megabytes of buffer left behind every flush."""
    monkeypatch.setattr("slidegate.statsd.WRITE_TIMEOUT", 0.05)
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        listener.settimeout(0.01)
        sink = StatsdSink(StatsStore(), "127.0.0.1", listener.getsockname()[1], Transport.TCP, 10.0,
                          LineFormat(dog=False))
        accepted = []

        async def flood() -> None:
            for _ in range(20):
                await sink.send(["x" * 60_000] * 20)  # 1.2 MB a flush, far more than the socket buffers hold
                with contextlib.suppress(TimeoutError):
                    accepted.append(listener.accept()[0])
            await sink.close()

        asyncio.run(flood())
        try:
            assert len(accepted) == 1  # one dial: the retry interval (3 s) outlasts the 20 flushes
            accepted[0].settimeout(1)
            while accepted[0].recv(1 << 20):  # the aborted connection ends, its buffer freed
                pass
        except ConnectionResetError:
            pass  # the abort's RST: ended all the same
        finally:
            for connection in accepted:
                connection.close()
