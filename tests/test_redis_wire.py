"""The hot path's own connections (slidegate.backends.redis_wire): redis-py opens them (AUTH, SELECT), they carry
commands pipelined with replies in order, errors as redis-py's exceptions, and fail their calls when Redis closes
them. Reconnection, timeouts, TLS, NOSCRIPT and READONLY through RedisBackend are tested with the backend
(test_batching, test_production, test_tls, test_failover, test_topologies)."""

from __future__ import annotations

import asyncio
from typing import Any

import hiredis
import pytest
import redis
import redis.asyncio
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, NoScriptError, ResponseError

from slidegate.backends.base import Check
from slidegate.backends.redis import RedisBackend
from slidegate.backends.redis_wire import WireConnection
from tests.redis_servers import RedisServer


def pack(command: tuple[str | int, ...]) -> bytes:
    """``command`` in the Redis protocol, by hiredis's packer (the backend's own)."""
    args: Any = command  # its stubs declare a one-element tuple
    packed: bytes = hiredis.pack_command(args)
    return packed


async def _wire(url: str) -> WireConnection:
    connection = redis.asyncio.ConnectionPool.from_url(url).make_connection()
    await connection.connect()
    return await WireConnection.take_over(connection)


async def test_replies_come_in_order_and_errors_do_not_break_the_step(redis_url: str, key_prefix: str) -> None:
    wire = await _wire(redis_url)
    try:
        key = f"{key_prefix}wire"
        first = wire.call(pack(("INCR", key)))
        # an error reply in the middle of a pipeline: a redis-py exception in its place, the replies after it read
        second = wire.call(pack(("EVALSHA", "0" * 40, 0)) + pack(("INCR", key)), 2)
        assert await first == [1]
        error, after = await second
        assert isinstance(error, NoScriptError) and after == 2
        [wrong] = await wire.call(pack(("HGET", key, "field")))  # WRONGTYPE: a plain ResponseError
        assert isinstance(wrong, ResponseError)
    finally:
        await wire.aclose()
    assert wire.closed


async def test_redis_py_keeps_nothing_of_a_connection_taken_over(redis_url: str) -> None:
    connection = redis.asyncio.ConnectionPool.from_url(redis_url).make_connection()
    await connection.connect()
    wire = await WireConnection.take_over(connection)
    try:
        assert not connection.is_connected
        await connection.disconnect()  # must not close the socket it gave away
        assert await wire.call(pack(("PING",))) == [b"PONG"]
    finally:
        await wire.aclose()


@pytest.mark.redis  # a redis-server of its own
async def test_a_connection_redis_closes_fails_its_calls_and_says_it_is_closed() -> None:
    server = RedisServer().start()
    try:
        wire = await _wire(server.url)
        [name] = await wire.call(pack(("CLIENT", "ID")))
        killer = redis.Redis(port=server.port)
        waiting = wire.call(pack(("BLPOP", "nothing", 0)))  # held at Redis until the kill
        await asyncio.sleep(0.05)
        killer.client_kill_filter(_id=name)
        killer.close()
        with pytest.raises(RedisConnectionError):
            await asyncio.wait_for(waiting, 2)
        assert wire.closed
        with pytest.raises(RedisConnectionError):
            await wire.call(pack(("PING",)))
    finally:
        server.cleanup()


@pytest.mark.redis  # a redis-server of its own
async def test_auth_and_select_are_redis_pys() -> None:
    server = RedisServer()
    server.extra_args = ("--requirepass", "s3cret")
    server.start(password="s3cret")
    try:
        wire = await _wire(f"redis://:s3cret@127.0.0.1:{server.port}/3")
        try:
            assert await wire.call(pack(("SET", "in-three", 1))) == [b"OK"]
        finally:
            await wire.aclose()
        assert redis.Redis(port=server.port, password="s3cret", db=3).get("in-three") == b"1"
    finally:
        server.cleanup()


async def test_a_reply_nobody_asked_for_closes_the_connection(redis_url: str) -> None:
    wire = await _wire(redis_url)
    try:
        wire.data_received(b"+OK\r\n")  # as if the stream had slipped out of step
        await asyncio.sleep(0.01)
        assert wire.closed
    finally:
        await wire.aclose()


@pytest.mark.redis
async def test_the_backend_reconnects_after_redis_closed_its_connections(key_prefix: str) -> None:
    server = RedisServer().start()
    backend = RedisBackend(server.url, timeout=1)
    try:
        check = Check(f"{key_prefix}again", 100, 60_000_000, 1)
        assert (await backend.decide([check])).outcomes[0].remaining == 99
        redis.Redis(port=server.port).client_kill_filter(skipme=True, _type="normal")
        await asyncio.sleep(0.05)
        assert (await backend.decide([check])).outcomes[0].remaining == 98
    finally:
        await backend.close()
        server.cleanup()


async def test_bytes_that_are_not_the_redis_protocol_fail_the_calls_waiting(redis_url: str) -> None:
    wire = await _wire(redis_url)
    try:
        waiting = wire.call(pack(("BLPOP", "nothing-here", 1)))
        wire.data_received(b"?what\r\n")
        with pytest.raises(InvalidResponse):
            await waiting
        assert wire.closed
    finally:
        await wire.aclose()


@pytest.mark.redis  # a redis-server of its own
async def test_a_connection_redis_closed_before_it_was_taken_over_is_refused() -> None:
    # killed right after its handshake, its end of file read by redis-py's stream: taken over, a call written
    # there was never answered nor failed (a batch cut off at REDIS_TIMEOUT, and the breaker told Redis failed)
    server = RedisServer().start()
    try:
        client = redis.asyncio.Redis(port=server.port)
        connection = client.connection_pool.make_connection()
        await connection.connect()
        with redis.Redis(port=server.port) as admin:
            admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        await asyncio.sleep(0.05)  # the end of file reaches redis-py's stream
        with pytest.raises(RedisConnectionError):
            await WireConnection.take_over(connection)
        await client.aclose()
    finally:
        server.stop()


async def test_a_callback_that_raises_leaves_the_replies_after_it_in_step(redis_url: str, key_prefix: str) -> None:
    wire = await _wire(redis_url)
    loop = asyncio.get_running_loop()
    reported: list[BaseException] = []
    loop.set_exception_handler(lambda _, context: reported.append(context["exception"]))
    told: list[tuple[object, object]] = []

    def broken(replies: object, error: object) -> None:
        told.append((replies, error))
        raise RuntimeError("a caller's bug")

    try:
        key = f"{key_prefix}callback"
        wire.send(pack(("INCR", key)), broken)
        assert await wire.call(pack(("INCR", key))) == [2]  # read in its turn, after the reply that broke
        assert told == [([1], None)] and [type(e) for e in reported] == [RuntimeError]
    finally:
        loop.set_exception_handler(None)
        await wire.aclose()
    wire.send(pack(("PING",)), lambda replies, error: told.append((replies, error)))  # closed: told at once
    assert told[1][0] is None and isinstance(told[1][1], RedisConnectionError)
