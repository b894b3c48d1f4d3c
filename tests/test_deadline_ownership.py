"""Who owns a call's deadline and its place in a batch: heavy requests beside small ones, callers that give up,
the wait for a batch's place, a Redis that never appears, connections at close, calls outliving their
deadline — against private redis-server processes."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
import redis
import redis.asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from slidegate import stack
from slidegate.algorithms import Algorithm
from slidegate.backends.base import Check, DeadlineExceeded
from slidegate.backends.batching import Batcher
from slidegate.backends.breaker import Breaker
from slidegate.backends.redis import MAX_BATCH_CHECKS, RedisBackend
from slidegate.limiter import Descriptor
from slidegate.protos import rls_pb2_grpc
from tests.helpers import OK, descriptor, request
from tests.redis_servers import RedisServer
from tests.served import Served, wait_for

CONFIG = """
domain: f
failure_mode: allow
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 1000000}
"""


def heavy(n: int, name: str, algorithm: Algorithm = Algorithm.SLIDING_WINDOW_LOG) -> list[Check]:
    return [Check(f"sgown:{name}:{i}", 1_000_000, 60_000_000, 1, algorithm) for i in range(n)]


async def test_light_items_keep_every_place_of_theirs_while_a_heavy_one_is_out() -> None:
    # a heavy request took one of the two places: light batches then went one at a time, each waiting at Redis
    # behind a heavy script, and a light item arriving waited for two of them
    gates: dict[int, asyncio.Event] = {}
    sent: list[list[int]] = []

    async def send(items: list[int]) -> list[int]:
        sent.append(items)
        gate = gates.setdefault(items[0], asyncio.Event())
        await gate.wait()
        return [i * 10 for i in items]

    batcher = Batcher(send, max_in_flight=2, weight=lambda item: item, max_weight=10)
    first_heavy = asyncio.ensure_future(batcher.send(20))
    second_heavy = asyncio.ensure_future(batcher.send(30))
    light = [asyncio.ensure_future(batcher.send(n)) for n in (1, 2)]
    await asyncio.sleep(0.01)
    assert sent == [[20], [1], [2]]  # both light items at once, beside the heavy one; the second heavy waits
    gates[1].set()
    gates[2].set()
    assert await asyncio.gather(*light) == [10, 20]
    assert not first_heavy.done() and not second_heavy.done()
    gates[20].set()
    assert await first_heavy == 200
    await asyncio.sleep(0.01)
    assert sent[-1] == [30]
    gates[30].set()
    assert await second_heavy == 300


async def test_small_requests_are_answered_in_time_while_heavy_ones_are_in_flight(
        private_redis: RedisServer) -> None:
    """Small calls with 20 ms deadlines beside heavy ones on the same backend: about as many in time as beside
    the same heavy calls on a backend of their own (the same work for this process and for Redis, none of the
    small calls' places to take), in rounds alternating in the same run. A machine the other test processes
    keep busy misses a 20 ms deadline for want of a CPU alone (eight busy loops on two cores: 91 to 103 of 320
    late apart, 120 to 176 shared; 0 of 320 either way on a quiet machine)."""
    backend = RedisBackend(private_redis.url, timeout=0.5)
    apart = RedisBackend(private_redis.url, timeout=0.5)
    await backend.ping()
    await apart.ping()
    stop = False

    async def heavy_caller(on: RedisBackend, name: str) -> None:
        # fixed windows: each call takes Redis the same few ms however long the test runs
        checks = heavy(2 * MAX_BATCH_CHECKS, name, Algorithm.FIXED_WINDOW)
        while not stop:
            await on.decide(checks)

    async def small_caller(name: str) -> int:
        late = 0
        for i in range(10):
            try:
                await backend.decide([Check(f"sgown:small:{name}:{i}", 10, 60_000_000, 1)], timeout=0.02)
            except DeadlineExceeded:
                late += 1
        return late

    async def late_beside(on: RedisBackend, name: str) -> int:
        nonlocal stop
        stop = False
        heavies = [asyncio.create_task(heavy_caller(on, f"{name}:{n}")) for n in range(8)]
        await asyncio.sleep(0.1)
        try:
            return sum(await asyncio.gather(*(small_caller(f"{name}:{n}") for n in range(8))))
        finally:
            stop = True
            await asyncio.gather(*heavies)

    shared = own = 0
    for round_ in range(4):
        own += await late_beside(apart, f"apart{round_}")
        shared += await late_beside(backend, f"shared{round_}")
    calls = 4 * 8 * 10
    assert shared <= 2 * own + 0.05 * calls, f"{shared} of {calls} late beside heavy calls, {own} beside " \
        "the same on a backend of their own"
    await backend.close()
    await apart.close()


async def test_a_caller_out_of_time_is_no_storage_error(write_config: Callable[..., Path],
                                                        private_redis: RedisServer,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    from tests.test_failure_policy import hung_service  # noqa: PLC0415 - the hung-Redis service of the policy tests
    service, backend = await hung_service(write_config(CONFIG), private_redis, "allow")
    assert private_redis.process is not None
    descriptors = [Descriptor((("k", "v"),))]
    try:
        first = asyncio.create_task(service.decide("f", descriptors, 0, timeout=1.0))
        await asyncio.sleep(0.2)  # Redis silent for longer than any caller below can wait
        for timeout in (0.0, -0.001, 0.0005, 0.0015):  # less than any timer of the backend's can tell
            with pytest.raises(DeadlineExceeded):
                await service.decide("f", descriptors, 0, timeout=timeout)
    finally:
        private_redis.process.send_signal(signal.SIGCONT)
    assert (await first).overall_code == OK
    registry = service.metrics.registry
    assert registry.get_sample_value("ratelimit_storage_errors_total") == 0
    assert registry.get_sample_value("ratelimit_degraded_decisions_total", {"mode": "allow"}) is None
    assert "storage unavailable" not in caplog.text  # the outage log
    await backend.close()


async def test_the_wait_for_a_heavy_batch_place_is_not_counted_as_redis_slow(private_redis: RedisServer) -> None:
    size = 40 * MAX_BATCH_CHECKS
    probe = RedisBackend(private_redis.url, timeout=5.0)
    await probe.ping()
    took = []
    for n in range(5):
        started = time.monotonic()
        await probe.decide(heavy(size, f"probe{n}"))
        took.append(time.monotonic() - started)
    await probe.close()
    one = statistics.median(took)
    # each round trip is well within the timeout; a second heavy request waits for the first one's place
    breaker = Breaker(failures=1, open_after=0.0)
    backend = RedisBackend(private_redis.url, timeout=1.3 * one, breaker=breaker)
    await backend.ping()
    for attempt in range(3):
        results = await asyncio.gather(*(backend.decide(heavy(size, f"{attempt}:{n}")) for n in range(2)),
                                       return_exceptions=True)
        assert not [r for r in results if isinstance(r, BaseException)], (one, results)
    assert not breaker.is_open
    await backend.close()


async def test_a_caller_s_own_deadline_counts_its_wait_for_a_place(private_redis: RedisServer) -> None:
    # a deadline no shorter than REDIS_TIMEOUT is still the caller's: waiting for a place, then a batch's
    # REDIS_TIMEOUT at a paused Redis, would answer it after its deadline, when its failure mode no longer counts
    backend = RedisBackend(private_redis.url, timeout=0.1)
    await backend.ping()
    with redis.Redis.from_url(private_redis.url) as admin:
        admin.execute_command("CLIENT", "PAUSE", 1000, "ALL")
        try:
            first = asyncio.ensure_future(backend.decide(heavy(2 * MAX_BATCH_CHECKS, "first")))
            await asyncio.sleep(0.01)  # the first holds the heavy place, at a Redis that answers nothing
            started = time.monotonic()
            with pytest.raises(Exception):  # noqa: B017 - the failure (its kind is another test's) and its time
                await backend.decide(heavy(2 * MAX_BATCH_CHECKS, "second"), timeout=0.12)
            took = time.monotonic() - started
            await asyncio.gather(first, return_exceptions=True)
        finally:
            admin.execute_command("CLIENT", "UNPAUSE")
    assert took < 0.17, took  # by its 120 ms (and a timer's slack), not the wait's 90 ms and a batch's 100 ms more
    await backend.close()


def test_serve_with_a_redis_that_never_appears_starts_and_recovers(
        write_config: Callable[..., Path], serve: Callable[..., Served]) -> None:
    port = stack.free_port()  # nothing listens there: a REDIS_URL wrong for good, until a Redis appears on it
    served = serve(write_config(CONFIG.replace("failure_mode: allow\n", "")), "--redis-timeout", "0.05",
                   url=f"redis://127.0.0.1:{port}/0", wait=False)
    channel = grpc.insecure_channel(f"127.0.0.1:{served.grpc_port}")
    health = health_pb2_grpc.HealthStub(channel)
    stub = rls_pb2_grpc.RateLimitServiceStub(channel)

    def status() -> int | None:
        try:
            return int(health.Check(health_pb2.HealthCheckRequest(), timeout=1).status)
        except grpc.RpcError:
            return None  # not listening yet

    try:
        assert wait_for(lambda: status() == health_pb2.HealthCheckResponse.NOT_SERVING, 15), served.output()[-2000:]
        took = []
        for _ in range(20):
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as caught:  # failure mode error: UNAVAILABLE, for Envoy to decide
                stub.ShouldRateLimit(request("f", descriptor(("k", "v"))), timeout=0.5)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            took.append(time.monotonic() - started)
        assert max(took) < 0.2, took
        time.sleep(2.5)
        out = served.output()
        assert "Traceback" not in out and len(out.splitlines()) < 12, out[-3000:]
        assert f"127.0.0.1:{port}" in out and "Connection refused" in out
        appeared = RedisServer()
        appeared.port = port
        appeared.start()
        try:
            assert wait_for(lambda: status() == health_pb2.HealthCheckResponse.SERVING, 15), served.output()[-2000:]
            assert stub.ShouldRateLimit(request("f", descriptor(("k", "v"))), timeout=1).overall_code == OK
            assert redis.Redis(port=port).keys("*")  # decided by Redis, not by a failure mode
        finally:
            appeared.stop()
    finally:
        channel.close()


async def test_close_closes_every_connection_it_opened(private_redis: RedisServer) -> None:
    watcher = redis.Redis(port=private_redis.port)
    backend = RedisBackend(private_redis.url, timeout=0.5, pool_size=4)
    await backend.ping()
    await asyncio.gather(*(backend.decide([Check(f"sgown:close:{n}", 10, 60_000_000, 1)]) for n in range(20)))
    await backend.ping()
    assert len(watcher.client_list()) > 1
    await backend.close()
    assert wait_for(lambda: len(watcher.client_list()) == 1, 2), watcher.client_list()
    watcher.close()


async def test_a_deadline_storm_over_a_slow_redis_logs_no_grpc_traceback(
        write_config: Callable[..., Path], serve: Callable[..., Served], private_redis: RedisServer) -> None:
    # answers that come just as their callers' deadlines pass, and refusals just after: a status sent on a call
    # gRPC has ended itself is logged by gRPC as an ExecuteBatchError traceback
    served = serve(write_config(CONFIG), url=private_redis.url)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{served.grpc_port}")
    stub = rls_pb2_grpc.RateLimitServiceStub(channel)
    slow = redis.asyncio.Redis(port=private_redis.port)
    stop = False

    async def slow_redis() -> None:
        while not stop:
            await slow.execute_command("DEBUG", "SLEEP", "0.004")
            await asyncio.sleep(0.001)

    async def call(i: int) -> None:
        await asyncio.sleep(i / 1000)
        with contextlib.suppress(grpc.aio.AioRpcError):
            await stub.ShouldRateLimit(request("f", descriptor(("k", str(i % 7)))), timeout=0.001 + 0.0001 * (i % 100))

    sleeper = asyncio.create_task(slow_redis())
    try:
        await asyncio.gather(*(call(i) for i in range(1500)))
        await asyncio.sleep(0.3)
    finally:
        stop = True
        await sleeper
        await slow.aclose()
        await channel.close(None)
    out = served.output()
    assert "Traceback" not in out and "ExecuteBatchError" not in out, out[-3000:]
