"""The Python ceilings: a grpc.aio + uvloop RLS server that reads each request and answers OK, nothing more —
or, with a Redis URL, that first waits for one EVALSHA of slidegate's script (one sliding-window-log hit on
one key) sent over a bare asyncio protocol with hiredis parsing and no client library: what one Redis round
trip costs the event loop at the least.

    python bench/noop_server.py PORT [REDIS_URL]
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
import uuid
from collections import deque
from typing import Any
from urllib.parse import urlsplit

import grpc
import hiredis
import uvloop

from slidegate.algorithms import Algorithm
from slidegate.protos import rls_pb2
from slidegate.resources import lua_script

OK = rls_pb2.RateLimitResponse(overall_code=rls_pb2.RateLimitResponse.OK)


class BareRedis(asyncio.Protocol):
    """Commands written at once, replies resolved in order; an error reply fails its call (a benchmark
    reference: no AUTH, no SELECT, no reconnection)."""

    def __init__(self) -> None:
        self.reader = hiredis.Reader()
        self.waiting: deque[asyncio.Future[Any]] = deque()
        self.transport: Any = None  # uvloop's transports are not asyncio.Transport subclasses

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            future = self.waiting.popleft()
            if future.done():  # its call was cancelled (the client went away)
                continue
            if isinstance(reply, hiredis.ReplyError):  # (say NOAUTH: a password in REDIS_URL is not sent)
                future.set_exception(reply)
            else:
                future.set_result(reply)

    def call(self, packed: bytes) -> asyncio.Future[Any]:
        future = asyncio.get_running_loop().create_future()
        self.waiting.append(future)
        self.transport.write(packed)
        return future


def pack(*parts: str | int) -> bytes:
    arguments: Any = parts  # hiredis's stubs declare a one-element tuple
    packed: bytes = hiredis.pack_command(arguments)
    return packed


async def main(port: int, redis_url: str | None) -> None:
    redis: BareRedis | None = None
    packed = b""
    if redis_url:
        script = lua_script([a.value for a in Algorithm])
        address = urlsplit(redis_url)
        _, redis = await asyncio.get_running_loop().create_connection(
            BareRedis, address.hostname or "127.0.0.1", address.port or 6379)
        await redis.call(pack("SCRIPT", "LOAD", script))
        packed = pack("EVALSHA", hashlib.sha1(script.encode()).hexdigest(), 1, f"bench-bare-{uuid.uuid4().hex[:6]}:k1",
                      "", 1, 1, "sliding_window_log", 1_000_000_000, 3_600_000_000, 0, 1, 0)

    async def should_rate_limit(request: rls_pb2.RateLimitRequest, context: Any) -> rls_pb2.RateLimitResponse:
        if redis is not None:
            await redis.call(packed)
        return OK

    server = grpc.aio.server()
    method = grpc.unary_unary_rpc_method_handler(
        should_rate_limit, request_deserializer=rls_pb2.RateLimitRequest.FromString,
        response_serializer=rls_pb2.RateLimitResponse.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "envoy.service.ratelimit.v3.RateLimitService", {"ShouldRateLimit": method}),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    uvloop.run(main(int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None))
