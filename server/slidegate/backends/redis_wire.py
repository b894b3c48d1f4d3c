"""The hot path's own connections to Redis: a connection redis-py opened — URL, TLS, AUTH, SELECT, HELLO and
Sentinel's choice of master all redis-py's — taken over by an asyncio protocol that writes each command at once
and hands the replies, parsed by hiredis, to their callers in order.

Why: redis-py's asyncio connection reads through a StreamReader and its own layers, about 100 µs of event-loop
CPU per call more than a protocol whose replies arrive in ``data_received`` (docs/performance.md). Replies are
mapped to redis-py's exceptions by redis-py's own parser (NOSCRIPT is a NoScriptError, READONLY a ReadOnlyError
…), so callers see what they saw through redis-py.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

import hiredis
from redis._parsers import BaseParser
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse

CLOSED = "Connection closed by server."  # redis-py's words for it


# told a call's replies (a list, in order) or why there are none (the connection failed), never both
Answered = Callable[[list[Any] | None, Exception | None], None]


class WireConnection(asyncio.Protocol):
    """One connection to one Redis (``host``, ``port``: where redis-py connected). ``send`` writes a packed
    command (or several, pipelined) and tells a callback their replies as soon as they are read; ``call`` does
    the same for a caller that awaits them. A reply that is an error is a ResponseError in that list, not
    raised, so that the replies after it are still read. A connection that is lost fails every call still
    waiting with ConnectionError (a RedisError, as redis-py's)."""

    def __init__(self, host: object, port: object, stream: object = None) -> None:
        self.host = host
        self.port = port
        self._reader = hiredis.Reader(protocolError=InvalidResponse, replyError=BaseParser.parse_error)
        self._waiting: deque[tuple[Answered, list[Any], int]] = deque()
        self._transport: Any = None  # uvloop's transports are not asyncio.Transport subclasses
        self._lost: asyncio.Future[None] | None = None
        # asyncio's StreamWriter closes its transport when collected: the one taken over (``stream``) lives as
        # long as the connection
        self._stream = stream

    @classmethod
    async def take_over(cls, connection: AbstractConnection) -> WireConnection:
        """The socket of ``connection`` (connected: its handshake done, nothing unread) as a WireConnection;
        ``connection`` is left disconnected, with nothing of its own to close."""
        writer = _connected_writer(connection)
        wire = cls(getattr(connection, "host", None), getattr(connection, "port", None), writer)
        transport = writer.transport
        transport.set_protocol(wire)
        wire.connection_made(transport)
        _disown(connection)
        await connection.disconnect(nowait=True)
        return wire

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        self._lost = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        waiting = self._waiting
        try:
            while (reply := self._reader.gets()) is not False:
                if not waiting:  # a reply no call asked for: the connection is out of step, and of no more use
                    self.close()
                    return
                answered, replies, expected = waiting[0]
                replies.append(reply)
                if len(replies) == expected:
                    waiting.popleft()  # first: the callback may write the next call on this connection
                    _tell(answered, replies, None)
        except InvalidResponse as exc:  # not the Redis protocol: the calls waiting fail with redis-py's error
            self._fail(exc)
            self.close()

    def _fail(self, error: Exception) -> None:
        while self._waiting:
            answered, _, _ = self._waiting.popleft()
            _tell(answered, None, error)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(RedisConnectionError(CLOSED if exc is None else f"{CLOSED} ({exc})"))
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(None)

    @property
    def closed(self) -> bool:
        """Whether the connection is closed or closing (by Redis, or by us): it takes no more calls."""
        return self._transport is None or self._transport.is_closing()

    def send(self, packed: bytes, answered: Answered, replies: int = 1) -> None:
        """Write ``packed`` (``replies`` commands); ``answered`` is told their replies, in order, from the code that
        reads them (no turn of the event loop in between: the hot path's reply goes straight to its caller), or
        the error that ended the connection first (at once when it is closed already)."""
        if self.closed:
            _tell(answered, None, RedisConnectionError(CLOSED))
            return
        self._waiting.append((answered, [], replies))
        self._transport.write(packed)

    def call(self, packed: bytes, replies: int = 1) -> asyncio.Future[list[Any]]:
        """``send`` for a caller that awaits: the future's result is the replies (cancelling it leaves the
        connection in step: the replies are read and dropped)."""
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self.send(packed, partial(_settle, future), replies)
        return future

    def close(self) -> None:
        """Close at once: calls still waiting fail (a late reply must never be read as another call's)."""
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    async def aclose(self) -> None:
        """Close, and wait until the socket is."""
        self.close()
        if self._lost is not None:
            await asyncio.shield(self._lost)


# redis-py (8.2) has no public way to hand a connection's socket over: these two are the only places that touch
# its private streams


def _connected_writer(connection: AbstractConnection) -> asyncio.StreamWriter:
    """The stream ``connection`` writes to, once it is known to be open."""
    writer: asyncio.StreamWriter | None = getattr(connection, "_writer", None)
    if writer is None:
        raise RedisConnectionError("the connection to take over is not connected")
    reader: asyncio.StreamReader | None = getattr(connection, "_reader", None)
    if reader is not None and reader.at_eof():
        # Redis closed it (CLIENT KILL) after the handshake: its end of file went to redis-py's stream, and a
        # protocol taking the socket over now would never hear of it (a call written there waits forever)
        raise RedisConnectionError(CLOSED)
    return writer


def _disown(connection: AbstractConnection) -> None:
    """redis-py no longer owns the socket: its disconnect (or its finaliser) must not close ours."""
    connection._reader = connection._writer = None


def _tell(answered: Answered, replies: list[Any] | None, error: Exception | None) -> None:
    try:
        answered(replies, error)
    except Exception as exc:  # a caller's bug must not leave the replies after it unread (out of step)
        asyncio.get_running_loop().call_exception_handler({"message": "a Redis reply's callback failed",
                                                           "exception": exc})


def _settle(future: asyncio.Future[list[Any]], replies: list[Any] | None, error: Exception | None) -> None:
    if future.done():  # a caller cut off: its replies are dropped
        return
    if replies is None:
        future.set_exception(error or RedisConnectionError(CLOSED))
    else:
        future.set_result(replies)
