"""What a failover may lose: following Sentinel's announcement at once, READONLY and ROLE telling a demoted
master, and REDIS_WAIT_REPLICAS's confirmation by replicas.

Every server is a private redis-server (and Sentinel) started by the test, stopped by its PID.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest
import redis
import redis.asyncio
from redis.asyncio.sentinel import SentinelConnectionPool

from slidegate.backends.base import BackendUnavailable, Check
from slidegate.backends.redis import RedisBackend, Topology
from slidegate.backends.redis_connect import make_client
from slidegate.config import Config, load_directory
from slidegate.keys import limit_key
from slidegate.limiter import Descriptor, Limiter, LimiterOptions
from slidegate.settings import Settings, SettingsError
from tests.helpers import OK, OVER_LIMIT, descriptor, request
from tests.redis_servers import RedisServer
from tests.redis_topologies import SentinelGroup, wait_for
from tests.served import Served

LIMIT = 1_000_000
CONFIG = f"""
domain: t
descriptors:
  - key: k
    rate_limit:
      unit: hour
      requests_per_unit: {LIMIT}
"""
# calls that reached the old master before slidegate read the announcement (Redis executes a call within a
# millisecond of its sending; the test's own subscriber and slidegate's read the same message)
IN_FLIGHT_US = 50_000


@pytest.fixture
def config(write_config: Callable[..., Path]) -> Config:
    return load_directory(write_config(CONFIG))


@pytest.fixture
def group() -> Iterator[SentinelGroup]:
    g = SentinelGroup()
    yield g
    g.cleanup()


async def test_a_sentinel_connection_closed_while_idle_is_not_used_again(group: SentinelGroup) -> None:
    # the Sentinels' own clients (master discovery, announcements) retry nothing either: one a Sentinel closed
    # while idle must be replaced, not fail the next question (with one Sentinel: no master found at all)
    client = make_client(Topology("sentinel", group.url), timeout=1.0, pool_size=2)
    assert isinstance(client, redis.asyncio.Redis)
    assert isinstance(client.connection_pool, SentinelConnectionPool)
    manager = client.connection_pool.sentinel_manager
    try:
        assert await manager.discover_master(group.name) == ("127.0.0.1", group.master.port)
        with group.sentinel_client() as sentinel:
            assert sentinel.execute_command("CLIENT", "KILL", "TYPE", "normal") >= 1
        await asyncio.sleep(0.05)  # the end of file reaches the idle connection's stream
        assert await manager.discover_master(group.name) == ("127.0.0.1", group.master.port)
    finally:
        for sentinel in manager.sentinels:
            await sentinel.aclose()
        await client.aclose(close_connection_pool=True)


def sentinel_limiter(config: Config, group: SentinelGroup) -> tuple[Limiter, RedisBackend, str]:
    """A limiter on ``group``'s master, and the storage key of its limit k=x."""
    backend = RedisBackend(Topology("sentinel", group.url), timeout=0.5)
    prefix = f"test-{uuid.uuid4().hex[:8]}:"
    limiter = Limiter(lambda: config, backend, LimiterOptions(key_prefix=prefix))
    return limiter, backend, limit_key(prefix, "sliding_window_log", "t", [("k", "x")])


def hits(port: int, key: str, after_us: int = 0) -> int:
    """Hits of the sliding-window log ``key`` on the Redis at ``port`` recorded after ``after_us`` (Redis
    TIME, microseconds: hits are scored by it; the bookkeeping members have negative scores)."""
    with redis.Redis(port=port, socket_timeout=2) as r:
        return int(r.zcount(key, f"({after_us}", "+inf"))


def role(port: int) -> str:
    with redis.Redis(port=port, socket_timeout=2) as r:
        return str(r.execute_command("ROLE")[0].decode())


@asynccontextmanager
async def switch_announcements(group: SentinelGroup) -> AsyncIterator[list[float]]:
    """The wall-clock times (as Redis TIME counts) at which the Sentinel's ``+switch-master`` messages arrived."""
    times: list[float] = []
    sentinel = redis.asyncio.Redis(port=group.port)
    pubsub = sentinel.pubsub()
    await pubsub.subscribe("+switch-master")

    async def listen() -> None:
        async for message in pubsub.listen():
            if message["type"] == "message":
                times.append(time.time())

    task = asyncio.create_task(listen())
    try:
        yield times
    finally:
        task.cancel()
        await pubsub.aclose()
        await sentinel.aclose()


async def test_no_admitted_hit_goes_to_the_old_master_after_the_switch_is_announced(
        config: Config, group: SentinelGroup) -> None:
    limiter, backend, key = sentinel_limiter(config, group)
    answers: list[tuple[float, str]] = []  # (wall-clock start, ok | error)
    stop = asyncio.Event()

    async def worker() -> None:
        while not stop.is_set():
            start = time.time()
            try:
                statuses = await limiter.should_rate_limit("t", [Descriptor((("k", "x"),))])
                answers.append((start, "over" if any(s.over for s in statuses) else "ok"))
            except BackendUnavailable:
                answers.append((start, "error"))
            await asyncio.sleep(0.01)

    old, new = group.master.port, group.replica.port
    async with switch_announcements(group) as announced:
        workers = [asyncio.create_task(worker()) for _ in range(4)]
        try:
            while len(answers) < 50:
                await asyncio.sleep(0.02)
            await asyncio.to_thread(group.failover)
            deadline = time.monotonic() + 10
            while not announced:
                assert time.monotonic() < deadline, "no +switch-master"
                await asyncio.sleep(0.01)
            await asyncio.sleep(1.5)  # traffic goes on while the old master still takes writes
        finally:
            stop.set()
            await asyncio.gather(*workers)
    # Sentinel makes the old master a replica ~10 s after the failover, and its resync would replace what it
    # holds: read it before
    assert role(old) == "master"
    switch_us = int(announced[0] * 1_000_000)
    assert hits(old, key, switch_us + IN_FLIGHT_US) == 0  # hundreds before the change, for ~10 s
    admitted_after = sum(1 for start, kind in answers if kind == "ok" and start * 1e6 > switch_us + IN_FLIGHT_US)
    assert admitted_after > 50  # the traffic ran, and the new master was used
    assert hits(new, key, switch_us) >= admitted_after  # each of them is on the new master
    assert {kind for _, kind in answers} <= {"ok", "error"}
    assert backend.sentinel is not None and backend.sentinel.address == ("127.0.0.1", new)
    await backend.close()


async def test_a_sentinel_naming_an_older_master_does_not_move_the_backend_back(
        config: Config, group: SentinelGroup) -> None:
    # a Sentinel back from a restart or a partition names the master it last knew for a while: subscribing to
    # it again after a failover must not send new calls to the old master (still taking writes, soon lost)
    limiter, backend, _ = sentinel_limiter(config, group)
    old, new = ("127.0.0.1", group.master.port), ("127.0.0.1", group.replica.port)
    await limiter.should_rate_limit("t", [Descriptor((("k", "x"),))])
    master = backend.sentinel
    assert master is not None and master.address == old
    async with switch_announcements(group) as announced:
        await asyncio.to_thread(group.failover)
        await asyncio.to_thread(wait_for, lambda: bool(announced), 10, "+switch-master")
    await asyncio.sleep(0.2)  # slidegate asks the announcing Sentinel for the failover's epoch
    assert master.address == new
    # a Sentinel naming the master before the failover, at the epoch before it: not followed back
    master.named(old, 0, "a stale sentinel")
    assert master.address == new
    # a later failover made the old node master again: followed
    master.named(old, 99, "a sentinel of a newer failover")
    assert master.address == old
    await backend.close()


@pytest.mark.parametrize("told_by", ["READONLY", "ROLE"])
async def test_a_master_that_became_a_replica_unannounced_makes_the_backend_ask_the_sentinels(
        config: Config, group: SentinelGroup, told_by: str) -> None:
    limiter, backend, key = sentinel_limiter(config, group)
    old, new = group.master.port, group.replica.port
    try:
        [s] = await limiter.should_rate_limit("t", [Descriptor((("k", "x"),))])
        assert not s.over
        assert backend.sentinel is not None
        # the announcement is not heard (a subscription that was down at the time): what else tells it
        await backend.sentinel.stop_following()
        async with switch_announcements(group) as announced:
            await asyncio.to_thread(group.failover)
            deadline = time.monotonic() + 10
            while not announced:  # the switch is done: the Sentinel names the new master to every asker
                assert time.monotonic() < deadline, "no +switch-master"
                await asyncio.sleep(0.01)
        with redis.Redis(port=old) as r:
            r.replicaof("127.0.0.1", new)  # as Sentinel does ~10 s later
        if told_by == "ROLE":
            await backend.ping()  # the health ping, every second in the server
            assert backend.sentinel.address == ("127.0.0.1", new)
        [s] = await limiter.should_rate_limit("t", [Descriptor((("k", "x"),))])
        assert not s.over  # the call was sent again to the new master: READONLY means nothing was written
        assert backend.sentinel.address == ("127.0.0.1", new)
        [s] = await limiter.should_rate_limit("t", [Descriptor((("k", "x"), ), hits_addend=0)])
        assert s.remaining == LIMIT - 2  # the first call (replicated) and the second, once
        assert hits(new, key) == 2
    finally:
        await backend.close()


async def test_a_call_told_readonly_goes_once_more_not_twice(config: Config, group: SentinelGroup) -> None:
    # READONLY means nothing ran: the call goes once more, to the master the Sentinels name; a second READONLY
    # fails it (the module docstring) — also when the first went without a task (_start_many)
    limiter, backend, key = sentinel_limiter(config, group)
    old = group.master.port
    try:
        [s] = await limiter.should_rate_limit("t", [Descriptor((("k", "x"),))])  # a connection made and kept
        with redis.Redis(port=old) as r:  # kept: its last command was the script call
            assert not s.over and any(c["cmd"] in ("evalsha", "eval") for c in r.client_list())
        assert backend.sentinel is not None
        await backend.sentinel.stop_following()
        with redis.Redis(port=old) as r:
            r.replicaof("127.0.0.1", group.replica.port)  # a replica the Sentinels still name, for a while
            r.config_resetstat()
            with pytest.raises(BackendUnavailable, match="ReadOnlyError"):
                await backend.decide([Check(key, LIMIT, 3_600_000_000, 1)])
            stats = r.info("commandstats")
        sent = sum(stats.get(f"cmdstat_{name}", {}).get(field, 0)
                   for name in ("evalsha", "eval") for field in ("calls", "rejected_calls"))
        assert sent == 2
    finally:
        await backend.close()


@pytest.fixture
def replicated() -> Iterator[tuple[RedisServer, RedisServer]]:
    """A master and its replica, in sync."""
    master = RedisServer().start()
    replica = RedisServer()
    replica.extra_args = ("--replicaof", "127.0.0.1", str(master.port))
    try:
        replica.start()
        with redis.Redis(port=replica.port) as r:
            wait_for(lambda: r.info("replication")["master_link_status"] == "up", 10, "the replica to sync")
        yield master, replica
    finally:
        if replica.process is not None:
            os.kill(replica.process.pid, signal.SIGCONT)
        replica.cleanup()
        master.cleanup()


def test_wait_for_a_replica_confirms_a_call_or_gives_it_the_failure_mode(
        write_config: Callable[..., Path], serve: Callable[..., Served], key_prefix: str,
        replicated: tuple[RedisServer, RedisServer]) -> None:
    master, replica = replicated
    served = serve(write_config(CONFIG), url=master.url, env={
        "REDIS_WAIT_REPLICAS": "1", "REDIS_WAIT_TIMEOUT": "50ms", "REDIS_TIMEOUT": "250ms"})
    stub = served.stub()
    call = request("t", descriptor(("k", "x")))
    key = limit_key(key_prefix, "sliding_window_log", "t", [("k", "x")])
    assert stub.ShouldRateLimit(call).overall_code == OK
    assert hits(replica.port, key) == 1  # answered once the replica had it: no wait needed here

    assert replica.process is not None
    os.kill(replica.process.pid, signal.SIGSTOP)  # a replica that does not answer
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as caught:
        stub.ShouldRateLimit(call)
    took = time.monotonic() - started
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE  # FAILURE_MODE=error
    assert 0.05 <= took < 0.25 + 0.1, took  # WAIT's 50 ms, within REDIS_TIMEOUT
    assert hits(master.port, key) == 2  # the script ran and counted; the call was not sent again

    os.kill(replica.process.pid, signal.SIGCONT)
    with redis.Redis(port=master.port) as r:
        wait_for(lambda: r.execute_command("WAIT", 1, 100) == 1, 10, "the replica to catch up")
    assert stub.ShouldRateLimit(call).overall_code == OK
    replica.stop()  # gone: the master has no replica left
    with pytest.raises(grpc.RpcError) as caught:
        stub.ShouldRateLimit(call)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "reached 0 of 1 replicas within 50 ms (REDIS_WAIT_REPLICAS)" in served.output()
    # and the health check says so: no admission can be confirmed
    wait_for(lambda: served.http("/healthcheck")[0] == 503, 5, "the health check to say not serving")
    assert "0 replicas connected; REDIS_WAIT_REPLICAS needs 1" in served.output()


def test_a_lagging_replica_does_not_lift_a_limit(write_config: Callable[..., Path], serve: Callable[..., Served],
                                                 replicated: tuple[RedisServer, RedisServer]) -> None:
    # only an admission can be lost by a failover: a rejection keeps its answer (as the failure mode, UNAVAILABLE
    # would have let Envoy through, and every rejected request with it)
    master, replica = replicated
    served = serve(write_config("domain: t\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, "
                                "requests_per_unit: 1}\n"), url=master.url, env={
        "REDIS_WAIT_REPLICAS": "1", "REDIS_WAIT_TIMEOUT": "50ms", "REDIS_TIMEOUT": "250ms"})
    stub = served.stub()
    call = request("t", descriptor(("k", "x")))
    assert stub.ShouldRateLimit(call).overall_code == OK
    assert replica.process is not None
    os.kill(replica.process.pid, signal.SIGSTOP)
    assert [stub.ShouldRateLimit(call).overall_code for _ in range(3)] == [OVER_LIMIT] * 3
    with pytest.raises(grpc.RpcError) as caught:  # an admission still waits for the replica
        stub.ShouldRateLimit(request("t", descriptor(("k", "y"))))
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize(("env", "message"), [
    ({"REDIS_WAIT_REPLICAS": "-1"}, "--redis-wait-replicas / REDIS_WAIT_REPLICAS (from the environment): -1 is "
                                    "negative"),
    ({"REDIS_WAIT_REPLICAS": "one"}, "REDIS_WAIT_REPLICAS (from the environment): 'one' is not a whole number"),
    ({"REDIS_WAIT_TIMEOUT": "0"}, "REDIS_WAIT_TIMEOUT (from the environment): '0' must be at least 1 ms (Redis's "
                                  "WAIT counts whole ms, and WAIT 0 waits for ever)"),
    ({"REDIS_WAIT_TIMEOUT": "500us"}, "'500us' must be at least 1 ms"),
    ({"REDIS_WAIT_TIMEOUT": "2m"}, "'2m' must be at most 60 s"),
    ({"REDIS_WAIT_TIMEOUT": "soon"}, "invalid duration 'soon'"),
    ({"REDIS_WAIT_REPLICAS": "1", "REDIS_WAIT_TIMEOUT": "250ms"},
     "--redis-wait-timeout / REDIS_WAIT_TIMEOUT (0.25 s) must be shorter than --redis-timeout / REDIS_TIMEOUT "
     "(0.25 s)"),
    ({"REDIS_WAIT_REPLICAS": "1", "REDIS_TYPE": "cluster", "REDIS_URL": "a:1"},
     "--redis-wait-replicas / REDIS_WAIT_REPLICAS is not offered with REDIS_TYPE=cluster (only single and "
     "sentinel)"),
])
def test_wait_settings_errors_are_precise(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=re.escape(message)):
        Settings.load(env)


def test_wait_settings() -> None:
    default = Settings.load({})
    assert (default.redis_wait_replicas, default.redis_wait_timeout) == (0, 0.05)
    assert Settings.load({"REDIS_WAIT_TIMEOUT": "1s"}).redis_wait_timeout == 1  # off: not checked against 250ms
    given = Settings.load({"REDIS_WAIT_REPLICAS": "2", "REDIS_WAIT_TIMEOUT": "20ms", "REDIS_TYPE": "sentinel",
                           "REDIS_URL": "mymaster,s1:26379"})
    assert (given.redis_wait_replicas, given.redis_wait_timeout) == (2, 0.02)
    with pytest.raises(ValueError, match="not offered on a Redis Cluster"):
        RedisBackend(Topology("cluster", "127.0.0.1:7000"), wait_replicas=1)
