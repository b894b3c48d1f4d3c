"""When the storage fails: the failure modes (error, allow, deny, local; per deployment and per domain) and
the circuit breaker that makes a dead Redis cheap — against real redis-server processes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from slidegate.backends.base import BackendUnavailable, Check
from slidegate.backends.breaker import CircuitBreaker
from slidegate.backends.redis import RedisBackend
from slidegate.config import ConfigError, load_directory
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


@pytest.mark.parametrize(("mode", "codes"), [
    ("allow", [OK] * 5),
    ("deny", [OVER_LIMIT] * 5),
    ("local", [OK, OK, OVER_LIMIT, OVER_LIMIT, OVER_LIMIT]),  # 4 per minute shared by 2 replicas: 2 here
])
async def test_failure_modes(rls: Start, private_redis: RedisServer, mode: str, codes: list[int]) -> None:
    stub = await rls(CONFIG, url=private_redis.url, timeout=0.2, use_clock=False,
                     limiter_options={"failure_mode": mode, "local_replicas": 2})
    private_redis.stop()
    got = [(await stub.ShouldRateLimit(request("f", descriptor(("k", "v"))))).overall_code for _ in range(5)]
    assert got == codes


async def test_a_domain_can_choose_its_own_failure_mode(rls: Start, private_redis: RedisServer) -> None:
    stub = await rls("failure_mode: allow\n" + CONFIG, url=private_redis.url, timeout=0.2, use_clock=False)
    private_redis.stop()
    assert (await stub.ShouldRateLimit(request("f", descriptor(("k", "v"))))).overall_code == OK


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
    breaker = CircuitBreaker(RedisBackend(f"redis://127.0.0.1:{port}/0", timeout=0.2), failures=3, cooldown=0.5)
    checks = [Check("sgbreaker:k", 4, 60_000_000, 1)]
    durations = []
    for _ in range(6):
        started = time.monotonic()
        with pytest.raises(BackendUnavailable):
            await breaker.decide(checks)
        durations.append(time.monotonic() - started)
    assert all(d >= 0.15 for d in durations[:3])  # three calls find out the hard way ...
    assert all(d < 0.02 for d in durations[3:])  # ... then the breaker answers at once
    await breaker.close()
    listener.close()

    # against a Redis that comes back: after the cooldown one trial call closes the breaker
    breaker = CircuitBreaker(RedisBackend(private_redis.url, timeout=0.2), failures=2, cooldown=0.3)
    private_redis.stop()
    for _ in range(3):
        with pytest.raises(BackendUnavailable):
            await breaker.decide([Check("sgbreaker:j", 4, 60_000_000, 0)])
    assert breaker.is_open
    private_redis.start()
    await asyncio.sleep(0.35)
    decision = await breaker.decide([Check("sgbreaker:j", 4, 60_000_000, 0)])
    assert decision.admitted and not breaker.is_open
    await breaker.close()


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
