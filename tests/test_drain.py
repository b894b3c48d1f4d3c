"""SIGTERM: slidegate stops taking calls, lets the one in flight finish, and exits 0."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import redis

from slidegate import stack
from slidegate.protos import rls_pb2_grpc
from tests.helpers import OK, descriptor, request
from tests.redis_servers import RedisServer


async def test_sigterm_drains_in_flight_calls(write_config: Callable[..., Path], private_redis: RedisServer) -> None:
    directory = write_config("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 9}")
    port = stack.free_port()
    process = stack.start_slidegate(directory, port, redis_url=private_redis.url, extra_args=("--redis-timeout", "3s"))
    try:
        reply = await _call_during_sigterm(process, port, private_redis)
    finally:
        stack.stop(process)
    assert reply.overall_code == OK and reply.statuses[0].limit_remaining == 7
    assert process.returncode == 0


async def _call_during_sigterm(process: Any, port: int, private_redis: RedisServer) -> Any:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        assert (await stub.ShouldRateLimit(request("d", descriptor(("k", "v"))))).overall_code == OK
        # Redis busy for 0.8 s: the next call is in flight when SIGTERM arrives
        blocker = asyncio.create_task(asyncio.to_thread(
            lambda: redis.Redis.from_url(private_redis.url).execute_command("DEBUG", "SLEEP", "0.8")))
        await asyncio.sleep(0.1)
        call = asyncio.ensure_future(stub.ShouldRateLimit(request("d", descriptor(("k", "v"))), timeout=10))
        await asyncio.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        reply = await call
        await blocker
    await asyncio.to_thread(process.wait, 10)
    return reply
