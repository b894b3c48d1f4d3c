"""Several slidegate processes on one Redis, many concurrent gRPC clients: exactly the limit is admitted."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from slidegate import stack
from slidegate.protos import rls_pb2_grpc
from tests.helpers import OK, OVER_LIMIT, descriptor, request

CONFIG = """
domain: race
descriptors:
  - key: shared
    rate_limit: {unit: hour, requests_per_unit: 100}
"""


@pytest.fixture
def servers(write_config: Callable[..., Path], redis_url: str, key_prefix: str) -> Iterator[list[int]]:
    directory = write_config(CONFIG)
    ports = [stack.free_port() for _ in range(3)]
    processes = []
    try:
        for port in ports:
            processes.append(stack.start_slidegate(directory, port, redis_url=redis_url, key_prefix=key_prefix))
        yield ports
    finally:
        for process in processes:
            stack.stop(process)


@pytest.mark.parametrize("run", range(3))
async def test_exactly_the_limit_is_admitted(servers: list[int], run: int) -> None:
    calls = iter(range(1000))
    codes: list[int] = []
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{servers[i % 3]}") for i in range(24)]

    async def client(channel: grpc.aio.Channel) -> None:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        req = request("race", descriptor(("shared", f"run-{run}")))
        for _ in calls:
            reply = await stub.ShouldRateLimit(req, timeout=10)
            codes.append(reply.overall_code)

    try:
        await asyncio.gather(*(client(c) for c in channels))
    finally:
        await asyncio.gather(*(c.close(None) for c in channels))
    assert len(codes) == 1000
    assert codes.count(OK) == 100
    assert codes.count(OVER_LIMIT) == 900
