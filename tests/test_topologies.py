"""Beyond one Redis: Redis Cluster and Sentinel, and staying correct and responsive while Redis fails.

Every server here is a private redis-server started by the test; traffic runs while nodes die, fail over,
move slots or lose their scripts.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
import redis
import redis.asyncio
from redis.crc import key_slot

from slidegate.backends.base import BackendUnavailable, Check
from slidegate.backends.breaker import Breaker
from slidegate.backends.redis import RedisBackend, Topology
from slidegate.backends.redis_cluster import unusable
from slidegate.config import Config, load_directory
from slidegate.failure_modes import FailureMode
from slidegate.keys import limit_key
from slidegate.limiter import Descriptor, Limiter, LimiterOptions, Status
from slidegate.settings import Settings, SettingsError
from slidegate.stack import free_port
from tests.certs import Authority
from tests.helpers import OK, OVER_LIMIT, decided, descriptor, request
from tests.redis_servers import RedisServer
from tests.redis_topologies import Cluster, SentinelGroup, wait_for
from tests.served import Served

PASSWORD = "cluster-secret"
K_LIMIT = 1_000_000
CONFIG = f"""
domain: t
descriptors:
  - key: tenant
    rate_limit:
      unit: hour
      requests_per_unit: 30
  - key: user
    rate_limit:
      unit: hour
      requests_per_unit: 1000
  - key: k  # more than a fast machine's traffic in a test: every call of it must be admitted
    rate_limit:
      unit: hour
      requests_per_unit: {K_LIMIT}
"""


def d(key: str, value: str, hits: int | None = None) -> Descriptor:
    return Descriptor(((key, value),), hits_addend=hits)


def slot(key: str) -> int:
    return key_slot(key.encode())


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """Three masters with a replica each, with AUTH, shared by the tests that do not break it."""
    c = Cluster(password=PASSWORD)
    yield c
    c.cleanup()


@pytest.fixture
def config(write_config: Callable[..., Path]) -> Config:
    return load_directory(write_config(CONFIG))


def make_limiter(config: Config, topology: Topology, *, timeout: float = 2.0, domain_slot: bool = False,
                 breaker: bool = False) -> tuple[Limiter, RedisBackend]:
    backend = RedisBackend(topology, timeout=timeout, breaker=Breaker(cooldown=0.2) if breaker else None)
    prefix = f"test-{uuid.uuid4().hex[:8]}:"
    limiter = Limiter(lambda: config, backend, LimiterOptions(key_prefix=prefix, domain_slot=domain_slot))
    return limiter, backend


def key_of(limiter: Limiter, domain: str, key: str, value: str) -> str:
    """The Redis key ``limiter`` counts the descriptor (key, value) of ``domain`` under (Limiter.prepare's)."""
    [check] = limiter.prepare(domain, [Descriptor(((key, value),))]).checks
    return check.key



def errorstat(node: redis.Redis, error: str) -> int:
    """How many ``error`` replies (MOVED, ASK, …) ``node`` has sent (INFO errorstats)."""
    return int(node.info("errorstats").get(f"errorstat_{error}", {}).get("count", 0))


def calls(node: redis.Redis, command: str) -> int:
    """How many times ``node`` ran ``command`` (INFO commandstats)."""
    return int(node.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))

def admitted(statuses: list[Status]) -> bool:
    return not any(s.over and not s.shadow for s in statuses)


async def test_cluster_admits_exactly_the_limit_with_limits_in_several_slots(cluster: Cluster, config: Config) -> None:
    limiter, backend = make_limiter(config, Topology("cluster", cluster.url, auth=(None, PASSWORD)))
    try:
        answers = await asyncio.gather(*(
            limiter.should_rate_limit("t", [d("tenant", "acme"), d("user", f"u{i}")]) for i in range(100)))
        assert sum(admitted(a) for a in answers) == 30
        [tenant] = await limiter.should_rate_limit("t", [d("tenant", "acme", hits=0)])
        assert (tenant.over, tenant.remaining) == (False, 0)
        users = [await limiter.should_rate_limit("t", [d("user", f"u{i}", hits=0)]) for i in range(100)]
        # all-or-nothing across slots: the user's hit of a request the tenant's slot rejected was taken back
        assert sorted(s.remaining for [s] in users) == [999] * 30 + [1000] * 70
    finally:
        await backend.close()
    keys = {limit_key("", "sliding_window_log", "t", [("user", f"u{i}")]) for i in range(100)}
    assert len({slot(k) for k in keys}) > 50  # the limits really are spread: no CROSSSLOT was possible


async def test_a_cluster_connection_closed_while_idle_is_not_used_again(cluster: Cluster) -> None:
    # a connection a node closed while idle (CLIENT KILL, its `timeout`, a restart) was nothing of the call's:
    # it is replaced before the call is written, not used to fail it (redis-py's Cluster client checks nothing)
    backend = RedisBackend(Topology("cluster", cluster.url, auth=(None, PASSWORD)), timeout=1.0)
    checks = [Check(f"idle-{uuid.uuid4().hex}", 100, 60_000_000, 1)]
    try:
        assert (await backend.decide(checks)).admitted
        await backend.ping()
        for node in cluster.live():
            with cluster.client(node) as admin:
                admin.execute_command("CLIENT", "KILL", "TYPE", "normal")
        await asyncio.sleep(0.05)  # the end of file reaches the idle connections' streams
        assert (await backend.decide(checks)).outcomes[0].remaining == 98
        await backend.ping()
    finally:
        await backend.close()


async def test_an_idle_connection_closed_by_redis_or_left_unread_is_unusable(redis_url: str) -> None:
    # the check ClusterRouter makes before each command, on one Redis: redis-py's can_read answers True for a
    # connection Redis closed up to 8.1 and raises from 8.2 on; either way it is unusable, and nothing is raised
    pool = redis.asyncio.ConnectionPool.from_url(redis_url)
    fresh, killed, unread = (pool.make_connection() for _ in range(3))
    try:
        assert not await unusable(fresh)  # never opened: it connects when a command is sent
        for connection in (fresh, killed, unread):
            await connection.connect()
        assert not await unusable(fresh)
        await killed.send_command("CLIENT", "ID")
        victim = await killed.read_response()
        await fresh.send_command("CLIENT", "KILL", "ID", victim)
        assert await fresh.read_response() == 1
        await unread.send_command("PING")
        await asyncio.sleep(0.05)  # the end of file and the reply reach their streams
        assert await unusable(killed)
        assert await unusable(unread)
        assert not await unusable(fresh)
    finally:
        for connection in (fresh, killed, unread):
            await connection.disconnect()
        await pool.aclose()


async def test_domain_hash_tag_makes_a_request_one_all_or_nothing_call(cluster: Cluster, config: Config) -> None:
    limiter, backend = make_limiter(config, Topology("cluster", cluster.url, auth=(None, PASSWORD)),
                                    domain_slot=True)
    try:
        answers = await asyncio.gather(*(
            limiter.should_rate_limit("t", [d("tenant", "acme"), d("user", f"u{i}")]) for i in range(100)))
        assert sum(admitted(a) for a in answers) == 30
        users = [await limiter.should_rate_limit("t", [d("user", f"u{i}", hits=0)]) for i in range(100)]
        # a rejected request counted nothing: exactly the 30 admitted users have a hit
        assert sorted(s.remaining for [s] in users) == [999] * 30 + [1000] * 70
    finally:
        await backend.close()
    keys = {limit_key("p:", "sliding_window_log", "t", [("user", f"u{i}")], domain_slot=True) for i in range(100)}
    assert len({slot(k) for k in keys}) == 1


async def test_cluster_follows_a_slot_moving_under_traffic(cluster: Cluster, config: Config) -> None:
    limiter, backend = make_limiter(config, Topology("cluster", cluster.url, auth=(None, PASSWORD)))
    key = key_of(limiter, "t", "k", "moving")
    source = cluster.master_of(key)
    target = next(n for n in cluster.masters() if n is not source)
    errors: list[BaseException] = []
    sent = 0
    stop = asyncio.Event()

    async def traffic() -> None:
        nonlocal sent
        while not stop.is_set():
            try:
                [s] = await limiter.should_rate_limit("t", [d("k", "moving")])
                assert not s.over
                sent += 1
            except Exception as exc:  # every failure is the test's finding
                errors.append(exc)
                return

    workers = [asyncio.create_task(traffic()) for _ in range(4)]
    try:
        while sent < 50:
            await asyncio.sleep(0.01)
        await asyncio.to_thread(cluster.move_slot, slot(key), source, target)
        moved_at = sent
        while sent < moved_at + 50 and not errors:
            await asyncio.sleep(0.01)
    finally:
        stop.set()
        await asyncio.gather(*workers)
    try:
        assert errors == [], [repr(e) for e in errors]
        assert cluster.master_of(key) is target
        [s] = await limiter.should_rate_limit("t", [d("k", "moving", hits=0)])
        assert s.remaining == K_LIMIT - sent  # every hit counted once, before, during and after the move
        # MOVED taught the client the new owner: later calls go straight there (the old owner answers no more
        # MOVED, the new one runs each script call)
        old, new = cluster.client(source), cluster.client(target)
        try:
            moved, ran = errorstat(old, "MOVED"), calls(new, "evalsha")
            for _ in range(10):
                await limiter.should_rate_limit("t", [d("k", "moving", hits=0)])
            assert errorstat(old, "MOVED") == moved and calls(new, "evalsha") == ran + 10
        finally:
            old.close()
            new.close()
    finally:
        await backend.close()


async def test_a_domain_slot_moving_with_many_keys_fails_no_call(cluster: Cluster, config: Config) -> None:
    # REDIS_HASH_TAG=domain: every key of the domain in one slot, and a migration keeps a call's keys split for as
    # long as it takes to move them all (TRYAGAIN), far longer than sixteen quick tries
    limiter, backend = make_limiter(config, Topology("cluster", cluster.url, auth=(None, PASSWORD)), domain_slot=True)
    key = key_of(limiter, "t", "k", "moving")
    for u in range(300):
        await limiter.should_rate_limit("t", [d("k", f"u{u}")])
    source = cluster.master_of(key)
    target = next(n for n in cluster.masters() if n is not source)
    errors: list[BaseException] = []
    sent = 0
    stop = asyncio.Event()

    async def traffic(worker: int) -> None:
        nonlocal sent
        while not stop.is_set():
            try:
                await limiter.should_rate_limit("t", [d("k", "moving"), d("k", f"u{(sent + worker) % 300}")])
                sent += 1
            except Exception as exc:  # every failure is the test's finding
                errors.append(exc)
                return

    workers = [asyncio.create_task(traffic(w)) for w in range(4)]
    try:
        await asyncio.to_thread(cluster.move_slot, slot(key), source, target)
    finally:
        stop.set()
        await asyncio.gather(*workers)
        await backend.close()
    assert errors == [], [repr(e) for e in errors]
    assert sent > 20


@dataclass
class Traffic:
    """Requests sent one after another by a few workers, each answer's time and kind recorded."""

    limiter: Limiter
    descriptors: list[Descriptor]
    answers: list[tuple[float, float, str]] = field(default_factory=list)  # (start, seconds, ok|over|error)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def worker(self) -> None:
        while not self.stop.is_set():
            start = time.monotonic()
            try:
                statuses = await self.limiter.should_rate_limit("t", self.descriptors)
                kind = "ok" if admitted(statuses) else "over"
            except BackendUnavailable:
                kind = "error"
                await asyncio.sleep(0.005)
            self.answers.append((start, time.monotonic() - start, kind))

    def kinds_since(self, t: float) -> list[str]:
        return [kind for start, _, kind in self.answers if start >= t]

    def slowest(self) -> float:
        return max(seconds for _, seconds, _ in self.answers)


async def run_until(traffic: Traffic, condition: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "traffic did not recover in time"
        await asyncio.sleep(0.02)


def moved_off(cluster: Cluster, key: str, victim: RedisServer) -> bool:
    """Whether a node other than ``victim`` serves ``key``'s slot (mid-failover, none may serve it yet)."""
    try:
        return cluster.master_of(key) is not victim
    except LookupError:
        return False


async def test_cluster_master_killed_replica_promoted_under_traffic(config: Config) -> None:
    c = Cluster()  # a cluster of its own: this test breaks it
    try:
        limiter, backend = make_limiter(config, Topology("cluster", c.url), timeout=0.2, breaker=True)
        traffic = Traffic(limiter, [d("k", "hot")])
        workers = [asyncio.create_task(traffic.worker()) for _ in range(4)]
        try:
            await run_until(traffic, lambda: len(traffic.answers) > 100, 10)
            key = key_of(limiter, "t", "k", "hot")
            victim = c.master_of(key)
            killed_at = time.monotonic()
            victim.stop()
            # the replica takes over after the node timeout (1 s); until then the failure mode answers
            await run_until(traffic, lambda: "error" in traffic.kinds_since(killed_at), 5)
            await run_until(traffic, lambda: traffic.kinds_since(time.monotonic() - 0.3)[-20:] == ["ok"] * 20, 15)
            recovered = time.monotonic() - killed_at
            # the node asked learns of the promotion by gossip, which may come after slidegate's answers (seen on CI)
            await run_until(traffic, lambda: moved_off(c, key, victim), 5)
        finally:
            traffic.stop.set()
            await asyncio.gather(*workers)
        assert traffic.slowest() < 0.5  # bounded answers while the master was gone: 0.2 s timeout each
        assert recovered < 12
        # correct limits after: a fresh limit on the promoted master admits exactly its limit
        answers = [await limiter.should_rate_limit("t", [d("tenant", "after-failover")]) for _ in range(35)]
        assert sum(admitted(a) for a in answers) == 30
        await backend.close()
    finally:
        c.cleanup()


async def test_standalone_redis_killed_and_restarted_under_load(private_redis: RedisServer, config: Config) -> None:
    limiter, backend = make_limiter(config, Topology("single", private_redis.url), timeout=0.2, breaker=True)
    traffic = Traffic(limiter, [d("k", "load")])
    workers = [asyncio.create_task(traffic.worker()) for _ in range(8)]
    try:
        await run_until(traffic, lambda: len(traffic.answers) > 100, 10)
        private_redis.stop()
        down_at = time.monotonic()
        await asyncio.sleep(1.5)
        private_redis.start()
        up_at = time.monotonic()
        await run_until(traffic, lambda: traffic.kinds_since(up_at)[-20:] == ["ok"] * 20, 10)
    finally:
        traffic.stop.set()
        await asyncio.gather(*workers)
    while_down = [a for a in traffic.answers if down_at + 0.05 < a[0] < up_at]
    assert while_down and {kind for _, _, kind in while_down} == {"error"}
    assert traffic.slowest() < 0.5
    # the breaker answers at once while open: most calls cost nothing like the 0.2 s timeout
    assert sorted(seconds for _, seconds, _ in while_down)[len(while_down) // 2] < 0.01
    # a restarted Redis is empty: a fresh count admits exactly the limit
    answers = [await limiter.should_rate_limit("t", [d("tenant", "after-restart")]) for _ in range(35)]
    assert sum(admitted(a) for a in answers) == 30
    await backend.close()


async def test_script_flush_under_load_fails_no_call(private_redis: RedisServer, config: Config) -> None:
    limiter, backend = make_limiter(config, Topology("single", private_redis.url), timeout=2)
    traffic = Traffic(limiter, [d("k", "flushed")])
    workers = [asyncio.create_task(traffic.worker()) for _ in range(8)]
    flusher = redis.Redis.from_url(private_redis.url)
    try:
        for _ in range(20):
            await asyncio.sleep(0.02)
            flusher.script_flush()
    finally:
        traffic.stop.set()
        await asyncio.gather(*workers)
        flusher.close()
    assert len(traffic.answers) > 100
    assert {kind for _, _, kind in traffic.answers} == {"ok"}
    [s] = await limiter.should_rate_limit("t", [d("k", "flushed", hits=0)])
    assert s.remaining == K_LIMIT - len(traffic.answers)  # each call counted once, retried or not
    await backend.close()


SENTINEL_CONFIG = """
domain: t
descriptors:
  - key: k
    rate_limit:
      unit: hour
      requests_per_unit: 100000
  - key: tenant
    rate_limit:
      unit: hour
      requests_per_unit: 30
"""


def server_tls(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(certificate, key, CA) for Redis servers on 127.0.0.1."""
    authority = Authority(tmp_path, "redis-ca")
    cert, key = authority.issue("redis")
    return cert, key, authority.ca_file


async def test_sentinel_failover_during_traffic(write_config: Callable[..., Path], serve: Callable[..., Served],
                                                tmp_path: Path) -> None:
    # AUTH for Redis and for the Sentinel, TLS for both: the whole wiring of REDIS_TYPE=sentinel
    tls = server_tls(tmp_path)
    group = SentinelGroup(password="redis-secret", sentinel_password="sentinel-secret", tls=tls)
    try:
        served = serve(write_config(SENTINEL_CONFIG), url=group.url, env={
            "REDIS_TYPE": "sentinel", "REDIS_AUTH": "redis-secret", "REDIS_SENTINEL_AUTH": "sentinel-secret",
            "REDIS_TLS": "true", "REDIS_TLS_CACERT": str(tls[2]), "REDIS_TIMEOUT": "200ms"})
        answers: list[tuple[float, float, str]] = []
        stop = asyncio.Event()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{served.grpc_port}") as channel:
            call = channel.unary_unary("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
                                       request_serializer=lambda m: m.SerializeToString(),
                                       response_deserializer=lambda b: b)

            async def worker() -> None:
                while not stop.is_set():
                    start = time.monotonic()
                    try:
                        await call(request("t", descriptor(("k", "v"))), timeout=5)
                        kind = "ok"
                    except grpc.aio.AioRpcError as exc:
                        kind = exc.code().name
                        await asyncio.sleep(0.005)
                    answers.append((start, time.monotonic() - start, kind))

            workers = [asyncio.create_task(worker()) for _ in range(4)]
            try:
                deadline = time.monotonic() + 10
                while len(answers) < 100:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.02)
                old_master = group.master_port()
                failover_at = time.monotonic()
                await asyncio.to_thread(group.failover)
                await asyncio.to_thread(wait_for, lambda: group.master_port() != old_master, 10, "the failover")
                promoted = time.monotonic()
                deadline = promoted + 5
                while [k for s, _, k in answers if s > promoted][-20:] != ["ok"] * 20:
                    assert time.monotonic() < deadline, "slidegate did not follow the new master"
                    await asyncio.sleep(0.02)
                followed = time.monotonic() - failover_at
            finally:
                stop.set()
                await asyncio.gather(*workers)
        assert group.master_port() == group.replica.port
        assert followed < 8
        assert {k for _, _, k in answers} <= {"ok", "UNAVAILABLE"}
        assert max(seconds for _, seconds, _ in answers) < 1.0
        deadline = time.monotonic() + 5  # the Sentinel names the promoted replica before it announces the switch
        while "(+switch-master from sentinel 127.0.0.1:" not in served.output():  # heard through TLS and AUTH
            assert time.monotonic() < deadline, "slidegate did not hear +switch-master"
            await asyncio.sleep(0.05)
        stub = served.stub()
        codes = [stub.ShouldRateLimit(request("t", descriptor(("tenant", "after")))).overall_code for _ in range(35)]
        assert codes == [OK] * 30 + [OVER_LIMIT] * 5
    finally:
        group.cleanup()


def test_cluster_with_tls_and_auth_through_the_server(write_config: Callable[..., Path],
                                                      serve: Callable[..., Served], tmp_path: Path) -> None:
    tls = server_tls(tmp_path)
    c = Cluster(password=PASSWORD, tls=tls)
    try:
        served = serve(write_config(CONFIG), url=c.url, env={
            "REDIS_TYPE": "cluster", "REDIS_AUTH": PASSWORD, "REDIS_TLS": "true", "REDIS_TLS_CACERT": str(tls[2]),
            "REDIS_HASH_TAG": "domain"})
        stub = served.stub()
        many = request("t", descriptor(("tenant", "served")), descriptor(("user", "x")), descriptor(("k", "y")))
        try:
            codes = [stub.ShouldRateLimit(many).overall_code for _ in range(32)]
        except grpc.RpcError as exc:
            raise AssertionError(served.output()) from exc
        assert codes == [OK] * 30 + [OVER_LIMIT] * 2
        assert "redis cluster via 127.0.0.1:" in served.output()
        # REDIS_HASH_TAG=domain: a rejected request counted nothing, on any of its limits
        [user] = stub.ShouldRateLimit(request("t", descriptor(("user", "x"), hits=0))).statuses
        assert user.limit_remaining == 1000 - 30
    finally:
        c.cleanup()


@pytest.mark.parametrize(("env", "message"), [
    ({"REDIS_TYPE": "sentinel"}, "sentinel REDIS_URL 'redis://127.0.0.1:6379/0' must be master_name,host:port"),
    ({"REDIS_TYPE": "sentinel", "REDIS_URL": "mymaster"}, "names no Sentinel"),
    ({"REDIS_TYPE": "sentinel", "REDIS_URL": "mymaster,host"}, "Sentinel address 'host' is not host:port"),
    ({"REDIS_TYPE": "cluster", "REDIS_URL": "a:1,b:x"}, "cluster node 'b:x' is not host:port"),
    ({"REDIS_TYPE": "cluster", "REDIS_URL": "redis://a:1"}, "cluster REDIS_URL 'redis://a:1' must be host:port"),
    ({"REDIS_HASH_TAG": "slot"}, "'slot' is not one of limit, domain"),
    ({"REDIS_TYPE": "cluster", "REDIS_URL": "redis://:pw@a:1"}, "cluster REDIS_URL 'redis://:***@a:1' must be"),
    ({"REDIS_TYPE": "cluster", "REDIS_URL": "u:pw@a:1"}, "cluster node 'a:1' comes with credentials: put them in"),
    ({"REDIS_TYPE": "cluster", "REDIS_URL": "::1:6379"}, "cluster node '::1:6379' is not host:port"),
    ({"REDIS_TYPE": "sentinel", "REDIS_URL": "my master,a:1"}, "must be master_name,host:port"),
])
def test_topology_settings_errors_are_precise(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=re.escape(message)):
        Settings.load(env)


@pytest.mark.parametrize("topology", [
    Topology("cluster", "127.0.0.1:6379"),  # a Redis that is not a cluster
    Topology("cluster", f"127.0.0.1:{free_port()}"),  # nothing listening
    Topology("sentinel", "mymaster,127.0.0.1:6379"),  # a Redis that is not a Sentinel
    Topology("sentinel", f"mymaster,127.0.0.1:{free_port()}"),
])
async def test_a_wrong_topology_is_unavailable_and_gets_the_failure_mode(topology: Topology, config: Config) -> None:
    backend = RedisBackend(topology, timeout=0.2)
    limiter = Limiter(lambda: config, backend, LimiterOptions(key_prefix=f"test-{uuid.uuid4().hex[:8]}:",
                                                              failure_mode=FailureMode.DENY))
    try:
        started = time.monotonic()
        with pytest.raises(BackendUnavailable):
            await backend.ping()
        [s], degraded = await decided(limiter, "t", [d("k", "v")])
        assert (s.over, degraded) == (True, "deny")
        assert time.monotonic() - started < 1
    finally:
        await backend.close()


def test_topology_urls_are_accepted() -> None:
    sentinel = Settings.load({"REDIS_TYPE": "SENTINEL", "REDIS_URL": "mymaster,[::1]:26379,s2:26380"})
    assert sentinel.redis.type == "sentinel"
    assert (Topology("sentinel", sentinel.redis.url).describe()
            == "redis master 'mymaster' via sentinel [::1]:26379,s2:26380")
    assert Topology("cluster", "n1:7000, n2:7001").describe() == "redis cluster via n1:7000,n2:7001"
