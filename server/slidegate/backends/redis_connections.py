"""The connections of our own to one Redis, or to the master Sentinel names (followed as it moves), kept idle
between script calls: redis-py opens them (slidegate.backends.redis_wire) and the calls skip its pool, retry,
observability and stream layers, two thirds of a call's cost on the event loop. (redis-py's Cluster client
follows redirects inside execute_command, so a cluster keeps its own: slidegate.backends.redis_cluster.)"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from redis.asyncio.connection import AbstractConnection, ConnectionPool
from redis.exceptions import NoPermissionError, ReadOnlyError, ResponseError

from slidegate.backends.redis_errors import STORAGE_ERRORS, reason
from slidegate.backends.redis_sentinel import SentinelMaster
from slidegate.backends.redis_wire import WireConnection
from slidegate.backends.script_codec import pack
from slidegate.backends.silence import Silence

log = logging.getLogger(__name__)


class Connections:
    """Connections to the Redis ``pool`` makes connections for, or (``master``) to the master the Sentinels name.
    ``silence`` hears of the script calls' answers and of connections that cannot be had."""

    def __init__(self, name: str, silence: Silence, *, pool: ConnectionPool | None = None,
                 master: SentinelMaster | None = None) -> None:
        if (pool is None) == (master is None):
            raise ValueError("connections go to one Redis (a pool) or to Sentinel's master")
        self._name = name
        self._silence = silence
        self._pool = pool
        self._master = master
        self._idle: list[WireConnection] = []
        self._idle_loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._role_refused = False  # an ACL without ROLE: the Sentinel master's health ping is a PING

    @property
    def follows_master(self) -> bool:
        """Whether these go to the master Sentinel names (a READONLY reply then means it moved)."""
        return self._master is not None

    def take_idle(self, loop: asyncio.AbstractEventLoop) -> WireConnection | None:
        """The last connection given back, when it is usable at once on ``loop`` (else None, and it stays)."""
        if not self._idle or self._idle_loop is not loop:
            return None
        connection = self._idle[-1]
        # current(), inlined: this runs for every batch
        if connection.closed or not (self._master is None or self._master.current(connection)):
            return None
        return self._idle.pop()

    def keep(self, connection: WireConnection) -> None:
        """``connection``, in step again (taken with ``take_idle``), back among the idle ones, or closed."""
        if self._closed or not (self._master is None or self._master.current(connection)):  # current(), inlined
            connection.close()
        else:
            self._idle.append(connection)

    def current(self, connection: WireConnection) -> bool:
        """Whether ``connection`` goes where calls must go: to a master Sentinel no longer names, hits are lost."""
        return self._master is None or self._master.current(connection)

    def demoted(self, connection: WireConnection) -> None:
        """``connection``'s node said it is a replica: the next connection asks the Sentinels."""
        if self._master is not None:
            self._master.demoted(connection)

    async def execute(self, command: tuple[str | int, ...], *, script: bool,
                      wait: bytes = b"") -> tuple[Any, Any, WireConnection]:
        """``command``'s reply, ``wait``'s (a WAIT written with it; 0 without) and the connection (given back:
        it tells which node answered). ``script``: a script call, whose answers and failures to connect count
        for Redis's health. Raises an error reply (of either) as its ResponseError."""
        loop = asyncio.get_running_loop()
        connection = await self._acquire(loop, script)
        try:
            # bounded by the batch's timeout (the Batcher cuts a batch off by cancelling it)
            replies = await connection.call(pack(command) + wait, 2 if wait else 1)
        except BaseException:
            # cut off or broken mid-call (a killed connection fails its calls, but says nothing of Redis): a late
            # reply must never be read as the next call's
            connection.close()
            raise
        # an error reply (NOSCRIPT, READONLY; WAIT refused by a replica or an ACL): the connection is in step
        reply, acked = replies[0], replies[1] if wait else 0
        if script:
            self._silence.answered()  # an error reply too: Redis is there
        await self._release(connection, loop)
        error = reply if isinstance(reply, ResponseError) else acked if isinstance(acked, ResponseError) else None
        if error is not None:
            if isinstance(error, ReadOnlyError):
                self.demoted(connection)
            raise error
        return reply, acked, connection

    async def _acquire(self, loop: asyncio.AbstractEventLoop, script: bool) -> WireConnection:
        # Batches are at most two at a time (each runs to its end, whoever waits for it), so two connections do
        if self._idle and self._idle_loop is not loop:
            self._idle = []  # made on an event loop that is gone (asyncio.run after another): unusable here
        # after a Redis restart or CLIENT KILL one would fail a batch; to a master Sentinel no longer names, it
        # would write where the hits are lost
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed and self.current(connection):
                return connection
            connection.close()
        try:
            # Sentinel's: connected to the master in use, which it still is (nothing awaited until the send)
            return await self._connect()
        except STORAGE_ERRORS as exc:
            if script:
                self._silence.failed(reason(exc))  # no connection to be had: evidence that Redis is failing
            raise

    async def _connect(self) -> WireConnection:
        if self._master is not None:
            return await WireConnection.take_over(await self._master.connection())
        assert self._pool is not None
        connection: AbstractConnection = self._pool.make_connection()
        try:
            await connection.connect()
        except BaseException:
            await connection.disconnect(nowait=True)
            raise
        return await WireConnection.take_over(connection)

    async def _release(self, connection: WireConnection, loop: asyncio.AbstractEventLoop) -> None:
        if self._closed or not self.current(connection):
            await connection.aclose()
        else:
            self._idle.append(connection)
            self._idle_loop = loop

    async def warm(self, count: int) -> None:
        """Open connections until ``count`` are idle: the first calls as quick as the next."""
        loop = asyncio.get_running_loop()
        while len(self._idle) < count:
            await self._release(await self._connect(), loop)

    async def ping(self) -> None:
        """One Redis: PING. Sentinel's master: it answers ROLE as a master (one that says it is a replica is
        forgotten, and the one the Sentinels name then is asked), on the connections the calls use; PING where
        an ACL refuses ROLE."""
        if self._master is None or self._role_refused:
            await self.execute(("PING",), script=False)
            return
        for _ in range(2):
            try:
                role, _, connection = await self.execute(("ROLE",), script=False)
            except NoPermissionError:
                log.warning("%s: ROLE is not allowed for this Redis user; the health ping cannot tell a demoted "
                            "master (READONLY replies still do)", self._name)
                self._role_refused = True
                await self.execute(("PING",), script=False)
                return
            if role[0] in (b"master", "master"):
                return
            self.demoted(connection)
        raise ReadOnlyError("the node the Sentinels name says it is a replica")

    async def close(self) -> None:
        """Close the idle connections (a call still running closes its own) and stop following the master."""
        self._closed = True
        if self._idle_loop is not asyncio.get_running_loop():
            self._idle = []  # their loop is gone, and their sockets with it
        for connection in self._idle:
            await connection.aclose()
        self._idle.clear()
        if self._master is not None:
            await self._master.close()
