"""When the storage fails: the failure modes (error, allow, deny, local; per deployment and per domain) and
the circuit breaker that makes a dead Redis cheap — against real redis-server processes."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis
import redis.asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from slidegate import health as health_module
from slidegate.backends.base import BackendUnavailable, Check, DeadlineExceeded
from slidegate.backends.breaker import Breaker
from slidegate.backends.redis import RedisBackend
from slidegate.backends.redis_connect import Topology, make_client
from slidegate.config import ConfigError, LoadOptions, load_directory
from slidegate.config.describe import describe_config
from slidegate.decider import Refused, refusal
from slidegate.failure_modes import FailureMode
from slidegate.health import Health
from slidegate.limiter import ANSWER_MARGIN, Descriptor, Limiter, LimiterOptions
from slidegate.protos import rls_pb2_grpc
from slidegate.service import RateLimitService
from tests.conftest import Decider
from tests.helpers import OK, OVER_LIMIT, descriptor, request
from tests.redis_servers import RedisServer
from tests.served import Served, wait_for

CONFIG = """
domain: f
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 4}
"""

Start = Callable[..., Any]
Failing = Callable[..., Decider]


@pytest.mark.parametrize(("mode", "codes"), [
    ("allow", [OK] * 5),
    ("deny", [OVER_LIMIT] * 5),
    ("local", [OK, OK, OVER_LIMIT, OVER_LIMIT, OVER_LIMIT]),  # 4 per minute shared by 2 replicas: 2 here
])
async def test_failure_modes(failing: Failing, mode: str, codes: list[int]) -> None:
    service = failing(CONFIG, failure_mode=mode, local_limit_replicas="2")
    got = [(await service.should_rate_limit(request("f", descriptor(("k", "v"))))).overall_code for _ in range(5)]
    assert got == codes
    assert counted(service, "ratelimit_storage_errors_total") == 5
    assert counted(service, "ratelimit_degraded_decisions_total", mode=mode) == 5


async def test_failure_mode_error_leaves_the_answer_to_envoy(failing: Failing) -> None:
    service = failing(CONFIG)
    with pytest.raises(BackendUnavailable) as caught:
        await service.should_rate_limit(request("f", descriptor(("k", "v"))))
    # UNAVAILABLE: Envoy's failure_mode_deny decides
    assert refusal(caught.value) == (Refused.UNAVAILABLE, "rate limit storage unavailable")


async def test_a_stopped_redis_gets_the_failure_mode(rls: Start, private_redis: RedisServer) -> None:
    stub = await rls(CONFIG, url=private_redis.url, timeout=0.2, use_clock=False,
                     failure_mode="local", local_limit_replicas="2")
    private_redis.stop()
    got = [(await stub.ShouldRateLimit(request("f", descriptor(("k", "v"))))).overall_code for _ in range(3)]
    assert got == [OK, OK, OVER_LIMIT]


async def test_a_domain_can_choose_its_own_failure_mode(failing: Failing, write_config: Callable[..., Path]) -> None:
    write_config(CONFIG.replace("domain: f", "domain: g"), "g.yaml")
    service = failing("failure_mode: allow\n" + CONFIG, failure_mode="deny")
    assert (await service.should_rate_limit(request("f", descriptor(("k", "v"))))).overall_code == OK
    assert (await service.should_rate_limit(request("g", descriptor(("k", "v"))))).overall_code == OVER_LIMIT


@pytest.mark.parametrize("mode", ["allow", "deny", "local"])
async def test_a_callers_deadline_is_answered_by_the_failure_mode_only_with_time_to_answer(
        failing: Failing, mode: str) -> None:
    service = failing(CONFIG, error=DeadlineExceeded("failing storage: the caller's deadline ran out"),
                      failure_mode=mode)
    # with time left to answer (Envoy's 20 ms), the failure mode answers; it says nothing of the storage
    reply = await service.should_rate_limit(request("f", descriptor(("k", "v"))), timeout=0.02)
    assert reply.overall_code == (OVER_LIMIT if mode == "deny" else OK)
    assert counted(service, "ratelimit_degraded_decisions_total", mode=mode) == 1
    assert counted(service, "ratelimit_storage_errors_total") == 0
    # with none, nothing would reach the caller in time: the call ends as its deadline did
    for timeout in (None, 2 * ANSWER_MARGIN):
        with pytest.raises(DeadlineExceeded) as caught:
            await service.should_rate_limit(request("f", descriptor(("k", "v"))), timeout=timeout)
        assert refusal(caught.value).code is Refused.DEADLINE_EXCEEDED
    assert counted(service, "ratelimit_storage_errors_total") == 0


def counted(service: Decider, name: str, **labels: str) -> float | None:
    return service.app.metrics.registry.get_sample_value(name, labels)


def test_failure_mode_in_config_is_checked(write_config: Callable[..., Path]) -> None:
    with pytest.raises(ConfigError, match="failure_mode: unknown failure mode 'maybe' "
                                          r"\(expected one of: error, allow, deny, local\)"):
        load_directory(write_config("failure_mode: maybe\n" + CONFIG))


async def test_breaker_makes_a_hung_redis_cheap_and_closes_when_it_answers(private_redis: RedisServer) -> None:
    # a TCP server that accepts and never answers: every call would cost the whole timeout
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(-1)

    listener = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    breaker = Breaker(failures=3, open_after=0.5, cooldown=0.5)
    backend = RedisBackend(f"redis://127.0.0.1:{port}/0", timeout=0.2, breaker=breaker)
    checks = [Check("sgbreaker:k", 4, 60_000_000, 1)]
    durations = []
    for _ in range(7):
        started = time.monotonic()
        with pytest.raises(BackendUnavailable):
            await backend.decide(checks)
        durations.append(time.monotonic() - started)
    # four calls find out the hard way (no answer for 0.6 s after the first failure: three alone are not
    # enough evidence), then the breaker answers at once
    assert all(d >= 0.15 for d in durations[:4]), durations
    assert all(d < 0.02 for d in durations[4:]), durations
    assert breaker.is_open
    await backend.close()
    listener.close()

    # against a Redis that comes back: after the cooldown one probe closes the breaker
    breaker = Breaker(failures=2, open_after=0.1, cooldown=0.3)
    backend = RedisBackend(private_redis.url, timeout=0.2, breaker=breaker)
    private_redis.stop()
    for _ in range(3):
        with pytest.raises(BackendUnavailable):
            await backend.decide([Check("sgbreaker:j", 4, 60_000_000, 0)])
        await asyncio.sleep(0.06)
    assert breaker.is_open
    private_redis.start()
    await asyncio.sleep(0.35)
    decision = await backend.decide([Check("sgbreaker:j", 4, 60_000_000, 0)])
    assert decision.admitted and not breaker.is_open
    await backend.close()


def test_the_breaker_opens_on_evidence_over_time_not_on_one_burst() -> None:
    now = [0.0]
    breaker = Breaker(failures=3, open_after=0.5, cooldown=1.0, clock=lambda: now[0])
    for _ in range(10):  # one batch of ten calls cut off, or ten failures in one instant: one event in time
        breaker.failed("x")
    assert not breaker.is_open and breaker.allow()
    now[0] = 0.3
    breaker.answered()  # an answer in between: the count starts again
    now[0] = 0.4
    breaker.failed("x")
    now[0] = 0.8
    breaker.failed("x")
    assert not breaker.is_open  # two failures
    now[0] = 0.9
    breaker.failed("x")
    assert breaker.is_open  # three, over 0.5 s with no answer
    assert not breaker.allow()
    now[0] = 1.95
    assert breaker.allow()  # the probe, once per cooldown
    assert not breaker.allow()
    breaker.answered()
    assert not breaker.is_open and breaker.allow()


def test_degraded_decisions_are_counted(write_config: Callable[..., Path], serve: Callable[..., Served],
                                        private_redis: RedisServer) -> None:
    served = serve(write_config(CONFIG), "--failure-mode", "deny", "--redis-timeout", "200ms", url=private_redis.url)
    private_redis.stop()
    stub = served.stub()
    codes = []
    for _ in range(5):
        try:
            codes.append(stub.ShouldRateLimit(request("f", descriptor(("k", "v"))), timeout=5).overall_code)
        except grpc.RpcError as exc:  # never: deny answers
            codes.append(exc.code())
    assert codes == [OVER_LIMIT] * 5
    assert wait_for(lambda: 'ratelimit_degraded_decisions_total{mode="deny"} 5.0' in served.http("/metrics")[1])


async def test_local_shares_are_rounded_up(failing: Failing) -> None:
    service = failing(CONFIG.replace("requests_per_unit: 4", "requests_per_unit: 1"), failure_mode="local",
                      local_limit_replicas="3")
    got = [(await service.should_rate_limit(request("f", descriptor(("k", "v"))))).overall_code for _ in range(2)]
    assert got == [OK, OVER_LIMIT]  # 1 per minute over 3 replicas: still 1 here, not 0


async def test_the_callers_deadline_is_not_a_redis_failure(private_redis: RedisServer) -> None:
    breaker = Breaker(failures=2, open_after=0.0, cooldown=5)
    backend = RedisBackend(private_redis.url, timeout=2.0, breaker=breaker)
    checks = [Check("sgbreaker:d", 4, 60_000_000, 0)]
    await backend.decide(checks)
    assert private_redis.process is not None
    private_redis.process.send_signal(signal.SIGSTOP)  # a pause far shorter than REDIS_TIMEOUT
    kinds = []
    try:
        started = time.monotonic()
        while time.monotonic() - started < 0.3:
            # at first each call waits out its deadline; once Redis has been silent longer than a caller can
            # wait (and than a stall of ours could hide), each is told at once
            with pytest.raises(BackendUnavailable) as caught:
                await backend.decide(checks, timeout=0.02)
            kinds.append(type(caught.value))
    finally:
        private_redis.process.send_signal(signal.SIGCONT)
    assert kinds[0] is DeadlineExceeded and BackendUnavailable in kinds
    assert not breaker.is_open
    assert (await backend.decide(checks)).admitted
    await backend.close()


def test_merged_domain_files_agree_on_the_failure_mode(write_config: Callable[..., Path]) -> None:
    write_config("domain: x\ndescriptors:\n  - key: a\n", "0.yaml")
    directory = write_config("domain: x\nfailure_mode: deny\ndescriptors:\n  - key: b\n", "1.yaml")
    assert load_directory(directory, LoadOptions(merge_domains=True)).domains["x"].failure_mode == "deny"
    write_config("domain: x\nfailure_mode: Allow\ndescriptors:\n  - key: c\n", "2.yaml")
    with pytest.raises(ConfigError, match="'allow' conflicts with 'deny' for domain 'x'"):
        load_directory(directory, LoadOptions(merge_domains=True))


def test_health_serves_without_redis_when_a_failure_mode_answers(
        write_config: Callable[..., Path], serve: Callable[..., Served], private_redis: RedisServer) -> None:
    served = serve(write_config(CONFIG), "--failure-mode", "allow", url=private_redis.url)
    private_redis.stop()
    assert wait_for(lambda: "health: the storage does not answer" in served.output(), timeout=10)
    assert served.http("/healthcheck") == (200, "OK")
    assert served.stub().ShouldRateLimit(request("f", descriptor(("k", "v")))).overall_code == OK


async def test_a_hung_redis_opens_the_breaker_whatever_the_callers_deadlines(private_redis: RedisServer) -> None:
    breaker = Breaker(failures=3, open_after=0.3, cooldown=5)
    backend = RedisBackend(private_redis.url, timeout=0.1, breaker=breaker)
    checks = [Check("sgbreaker:p", 4, 60_000_000, 0)]
    await backend.decide(checks)
    assert private_redis.process is not None
    private_redis.process.send_signal(signal.SIGSTOP)  # hung: callers in a hurry give up long before REDIS_TIMEOUT
    try:
        with pytest.raises(BackendUnavailable):
            await backend.ping()  # one failed ping (tried twice) is one failure: not enough
        assert not breaker.is_open
        started = time.monotonic()
        while not breaker.is_open:  # each batch cut off at REDIS_TIMEOUT is one more
            assert time.monotonic() - started < 2
            with pytest.raises(BackendUnavailable):
                await backend.decide(checks, timeout=0.02)
            await asyncio.sleep(0.01)
        started = time.monotonic()
        with pytest.raises(BackendUnavailable, match="calls fail at once"):
            await backend.decide(checks, timeout=0.02)
        assert time.monotonic() - started < 0.015  # at once: well before the 20 ms a wait would take
    finally:
        private_redis.process.send_signal(signal.SIGCONT)
    await backend.close()


async def test_a_killed_idle_connection_is_replaced_not_reported(private_redis: RedisServer) -> None:
    breaker = Breaker(failures=1, open_after=0.0, cooldown=5)  # the least evidence would open it
    backend = RedisBackend(private_redis.url, timeout=0.5, breaker=breaker)
    checks = [Check("sgbreaker:i", 100, 60_000_000, 1)]
    await backend.decide(checks)
    await backend.ping()
    with redis.Redis.from_url(private_redis.url) as admin:
        assert admin.execute_command("CLIENT", "KILL", "TYPE", "normal") >= 2  # the call's and the ping's
    await backend.ping()  # on a new connection
    assert (await backend.decide(checks)).admitted
    assert not breaker.is_open
    await backend.close()


async def test_a_connection_redis_closed_while_idle_is_not_used_again(private_redis: RedisServer) -> None:
    # redis-py, which carries the health pings and admin commands, retries nothing (make_client): a pooled
    # connection Redis closed (CLIENT KILL, its idle `timeout`, a restart) must be replaced, not fail the next
    # command — redis-py 8.1.0's maintenance notifications, on by default, skipped that check (redis-py #4252)
    client = make_client(Topology("single", private_redis.url), timeout=1.0, pool_size=2)
    assert isinstance(client, redis.asyncio.Redis)
    try:
        assert await client.ping()
        with redis.Redis.from_url(private_redis.url) as admin:
            assert admin.execute_command("CLIENT", "KILL", "TYPE", "normal") == 1
        await asyncio.sleep(0.05)  # the end of file reaches the idle connection's stream
        assert await client.ping()
    finally:
        await client.aclose(close_connection_pool=True)


async def test_calls_in_flight_are_all_that_a_client_kill_fails(private_redis: RedisServer) -> None:
    breaker = Breaker()
    backend = RedisBackend(private_redis.url, timeout=0.5, breaker=breaker)
    checks = [Check("sgbreaker:load", 10**9, 60_000_000, 1)]
    outcomes: list[str] = []
    stop = asyncio.Event()

    async def client() -> None:
        while not stop.is_set():
            try:
                await backend.decide(checks)
                outcomes.append("ok")
            except BackendUnavailable:
                outcomes.append("failed")

    async def health() -> None:
        while not stop.is_set():
            await backend.ping()  # raises, failing the test, if a killed connection fails the ping
            await asyncio.sleep(0.05)

    clients = [asyncio.create_task(client()) for _ in range(8)]
    pinger = asyncio.create_task(health())
    with redis.Redis.from_url(private_redis.url) as admin:
        for _ in range(5):
            await asyncio.sleep(0.2)
            admin.execute_command("CLIENT", "KILL", "TYPE", "normal")
        await asyncio.sleep(0.2)
    stop.set()
    await asyncio.gather(*clients, pinger)
    await backend.close()
    # each kill can fail the calls of the (at most two) batches then at Redis: 8 clients, so 8 calls at most
    assert outcomes.count("ok") > 100
    assert outcomes.count("failed") <= 5 * 8
    assert not breaker.is_open and breaker.reason == ""


def script_calls(server: RedisServer) -> int:
    """How many script calls ``server`` has run (INFO commandstats)."""
    with redis.Redis.from_url(server.url) as admin:
        return int(admin.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


async def ran_at(server: RedisServer, before: int) -> None:
    """Once ``server`` has run a script call more than ``before``."""
    while script_calls(server) == before:
        await asyncio.sleep(0.001)


async def test_a_pause_of_this_process_is_not_taken_for_redis_failing(private_redis: RedisServer) -> None:
    breaker = Breaker(failures=1, open_after=0.0, cooldown=5)
    backend = RedisBackend(private_redis.url, timeout=0.05, breaker=breaker)
    checks = [Check("sgbreaker:gc", 100, 60_000_000, 1)]
    await backend.decide(checks)
    before = script_calls(private_redis)
    call = asyncio.create_task(backend.decide(checks))
    await ran_at(private_redis, before)  # the call is at Redis, its answer on its way
    time.sleep(0.2)  # on purpose: the loop stalls (a garbage collection) past REDIS_TIMEOUT
    assert (await call).admitted  # Redis answered long ago: its answer is read, not thrown away
    assert not breaker.is_open and breaker.reason == ""
    await backend.close()


WAIT = 0.25  # seconds the callers after a stall may wait: more than two busy cores delay a round trip


@pytest.mark.parametrize("stall", [0.02, 0.9 * WAIT, 2 * WAIT], ids=["unseen", "under-wait", "over-wait"])
async def test_a_pause_of_this_process_is_not_redis_silent(private_redis: RedisServer, stall: float) -> None:
    # callers arriving right after this process stalled must not be told Redis has been silent: its answer came
    # meanwhile and is just not read yet (stalls shorter than the loop watch can tell, shorter than the callers
    # can wait, and longer)
    backend = RedisBackend(private_redis.url, timeout=2.0)
    checks = [Check("sgbreaker:quiet", 1000, 60_000_000, 1)]
    await backend.decide(checks)
    before = script_calls(private_redis)
    first = asyncio.create_task(backend.decide(checks))
    await ran_at(private_redis, before)  # the call is at Redis, its answer on its way
    time.sleep(stall)  # on purpose: the loop stalls
    later = await asyncio.gather(*(backend.decide(checks, timeout=WAIT) for _ in range(5)), return_exceptions=True)
    assert [getattr(d, "admitted", d) for d in later] == [True] * 5
    assert (await first).admitted
    await backend.close()


def test_health_serves_without_redis_when_a_domains_failure_mode_answers(
        write_config: Callable[..., Path], serve: Callable[..., Served], private_redis: RedisServer) -> None:
    # the deployment's failure mode is error, one domain's is allow: taken out of its load balancer, this
    # replica could not give that domain its answer
    directory = write_config("failure_mode: allow\n" + CONFIG)
    write_config("domain: strict\ndescriptors:\n  - key: k\n", "strict.yaml")
    served = serve(directory, url=private_redis.url)
    private_redis.stop()
    assert wait_for(lambda: "health: the storage does not answer" in served.output(), timeout=10)
    time.sleep(1.5)  # a publish would have come by now
    assert served.http("/healthcheck") == (200, "OK")
    with grpc.insecure_channel(f"127.0.0.1:{served.grpc_port}") as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        for name in ("", "ratelimit", "envoy.service.ratelimit.v3.RateLimitService"):
            assert check(health_pb2.HealthCheckRequest(service=name)).status == health_pb2.HealthCheckResponse.SERVING
    (directory / "config.yaml").write_text(CONFIG)  # no domain answers without Redis any more
    assert wait_for(lambda: served.http("/healthcheck") == (503, "NOT SERVING"), timeout=10)


async def hung_service(directory: Path, redis_server: RedisServer, mode: str) -> tuple[RateLimitService,
                                                                                       RedisBackend]:
    """A service with failure mode ``mode`` on ``redis_server``, which answers it once (for the descriptor k=v)
    and is then stopped (SIGSTOP: hung, its connections open); the caller sends SIGCONT."""
    config = load_directory(directory)
    backend = RedisBackend(redis_server.url, timeout=2.0)
    service = RateLimitService(Limiter(lambda: config, backend, LimiterOptions(failure_mode=FailureMode(mode))))
    await service.decide("f", [Descriptor((("k", "v"),))], 0)
    assert redis_server.process is not None
    redis_server.process.send_signal(signal.SIGSTOP)
    return service, backend


@pytest.mark.parametrize("mode", ["error", "allow", "deny", "local"])
async def test_a_call_about_to_pass_its_deadline_is_answered_by_the_failure_mode_but_is_no_storage_error(
        write_config: Callable[..., Path], private_redis: RedisServer, mode: str) -> None:
    # Envoy's filter waits 20 ms by default, far less than REDIS_TIMEOUT: a hung Redis must still leave time
    # for the failure mode to answer
    service, backend = await hung_service(write_config(CONFIG), private_redis, mode)
    descriptors = [Descriptor((("k", "v"),))]
    assert private_redis.process is not None
    try:
        started = time.monotonic()
        if mode == "error":
            with pytest.raises(DeadlineExceeded):  # not UNAVAILABLE: the storage may be fine
                await service.decide("f", descriptors, 0, timeout=0.02)
        else:
            reply = await service.decide("f", descriptors, 0, timeout=0.02)
            assert reply.overall_code == (OVER_LIMIT if mode == "deny" else OK)
            assert time.monotonic() - started < 0.02  # heard before the caller gives up
    finally:
        private_redis.process.send_signal(signal.SIGCONT)
    await service.decide("f", descriptors, 0)
    private_redis.process.send_signal(signal.SIGSTOP)
    try:
        with pytest.raises(DeadlineExceeded):  # too short for any answer but gRPC's own
            await service.decide("f", descriptors, 0, timeout=0.015)
    finally:
        private_redis.process.send_signal(signal.SIGCONT)
    registry = service.metrics.registry
    assert registry.get_sample_value("ratelimit_storage_errors_total") == 0
    assert registry.get_sample_value("ratelimit_degraded_decisions_total", {"mode": mode}) == (
        None if mode == "error" else 1)
    await backend.close()


@pytest.mark.parametrize("mode", ["allow", "deny", "local"])
async def test_a_redis_silent_longer_than_a_caller_can_wait_gets_the_failure_mode_at_once(
        write_config: Callable[..., Path], private_redis: RedisServer, mode: str) -> None:
    service, backend = await hung_service(write_config(CONFIG), private_redis, mode)
    descriptors = [Descriptor((("k", "v"),))]
    assert private_redis.process is not None
    try:
        first = asyncio.create_task(service.decide("f", descriptors, 0, timeout=1.0))  # waits: it has time
        await asyncio.sleep(0.2)  # longer than a caller of 20 ms can wait, and than a stall of ours might hide
        codes, took = [], []
        for _ in range(20):
            started = time.monotonic()
            # Envoy's 20 ms: Redis has already been silent longer than that
            codes.append((await service.decide("f", descriptors, 0, timeout=0.02)).overall_code)
            took.append(time.monotonic() - started)
        # at once, not near the deadline: waiting would take each 12 ms (20 less ANSWER_MARGIN); counted call by
        # call, so that a pause or two of a busy machine cannot fail the test (the wall time of all twenty did, 1
        # CI run in 6)
        assert sum(t >= 0.010 for t in took) <= 2, took
        # local: this process's own count of the limit (4 per minute)
        assert codes == {"allow": [OK] * 20, "deny": [OVER_LIMIT] * 20, "local": [OK] * 4 + [OVER_LIMIT] * 16}[mode]
        assert not first.done()
    finally:
        private_redis.process.send_signal(signal.SIGCONT)
    assert (await first).overall_code == OK  # Redis's own answer, once it came
    assert service.metrics.registry.get_sample_value("ratelimit_degraded_decisions_total", {"mode": mode}) == 20
    await backend.close()


async def test_calls_outliving_their_deadline_end_without_a_grpc_error_log(
        write_config: Callable[..., Path], serve: Callable[..., Served], private_redis: RedisServer) -> None:
    # the service's own deadline and gRPC's end of the call race; sending a status after gRPC ended the call
    # made gRPC log an ExecuteBatchError traceback (about 1 call in 70 here)
    served = serve(write_config(CONFIG), url=private_redis.url)
    assert private_redis.process is not None
    private_redis.process.send_signal(signal.SIGSTOP)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{served.grpc_port}")
    stub = rls_pb2_grpc.RateLimitServiceStub(channel)

    async def call(i: int) -> grpc.StatusCode:
        await asyncio.sleep(i / 2000)  # spread over a second: the race needs a loop that is not saturated
        try:
            await stub.ShouldRateLimit(request("f", descriptor(("k", "v"))), timeout=0.002 + 0.0001 * (i % 280))
        except grpc.aio.AioRpcError as exc:
            return exc.code()
        return grpc.StatusCode.OK

    try:
        codes = await asyncio.gather(*(call(i) for i in range(2000)))
        await asyncio.sleep(0.2)
    finally:
        private_redis.process.send_signal(signal.SIGCONT)
        await channel.close(None)
    # UNAVAILABLE once the health ping has found Redis hung and opened the breaker
    assert grpc.StatusCode.DEADLINE_EXCEEDED in codes
    assert set(codes) <= {grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE}
    assert "Traceback" not in served.output()


def test_a_flapping_redis_is_one_breaker_line_every_ten_seconds(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    breaker = Breaker(failures=1, open_after=0.0, cooldown=1.0, clock=lambda: now[0])
    for _ in range(20):  # hung a second out of every three
        breaker.failed("no answer")
        assert breaker.is_open
        now[0] += 1.0
        breaker.answered()
        now[0] += 2.0
    lines = [r.getMessage() for r in caplog.records if r.name == "slidegate.backends.breaker"]
    assert len(lines) == 1 and lines[0].startswith("storage failing for 0.0 s (1 failed round trips")


async def test_the_health_log_ends_on_the_storage_state_as_it_is(monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    # the health policy alone: a storage whose pings fail and answer by turns, then fail for good
    answers = iter([False, True, False, True, False, True] + [False] * 20)

    class Flapping:
        async def ping(self) -> None:
            if not next(answers):
                raise BackendUnavailable("hung")

    monkeypatch.setattr(health_module, "LINE_EVERY", 0.05)
    health = Health(HealthServicer())
    stop = asyncio.Event()
    watching = asyncio.create_task(health.watch_storage(Flapping(), stop, interval=0.02))  # type: ignore[arg-type]
    await asyncio.sleep(0.5)
    stop.set()
    await watching
    lines = [r.getMessage() for r in caplog.records if r.name == "slidegate.health"]
    assert 2 <= len(lines) < 8  # not one a change
    assert lines[0] == "health: the storage does not answer (hung)"
    assert lines[-1].startswith("health: the storage does not answer (hung)")  # as it is at the end


def test_check_config_shows_a_domains_failure_mode(write_config: Callable[..., Path]) -> None:
    # a domain's own failure mode changes what Envoy gets when Redis fails: it must be seen where limits are
    text = describe_config(load_directory(write_config("failure_mode: deny\n" + CONFIG)))
    assert text.splitlines()[0].endswith("failure_mode: deny")
