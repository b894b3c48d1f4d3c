"""The transport to one Redis, or to the master Sentinel names (slidegate.backends.transport): connections of our
own (slidegate.backends.redis_connections), which also take batches of requests.

With Sentinel, a READONLY reply means the node was demoted to a replica: the script's first write failed, so
nothing was written, and the command goes once more, to the master the Sentinels name now (a second READONLY
fails it). With ``wait_replicas`` (REDIS_WAIT_REPLICAS) each script call is followed, in the same write, by
``WAIT wait_replicas wait_ms``; hits that did not reach that many replicas in time raise Unconfirmed with the
reply (the call ran and counted: it is never sent again).
"""

from __future__ import annotations

import contextlib
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import NoPermissionError, ReadOnlyError

from slidegate.backends.base import BackendUnavailable
from slidegate.backends.redis_connections import Connections
from slidegate.backends.redis_sentinel import SentinelMaster
from slidegate.backends.script_codec import Unconfirmed, pack
from slidegate.backends.silence import Silence


class NodeTransport:
    """Commands to ``client``'s Redis, or (``sentinel``) to the master its Sentinels name."""

    def __init__(self, name: str, client: aioredis.Redis, silence: Silence, *, sentinel: bool,
                 wait_replicas: int = 0, wait_ms: int = 0) -> None:
        self._name = name
        self._client = client
        self._master = SentinelMaster(client) if sentinel else None
        if self._master is not None:
            self._connections = Connections(name, silence, master=self._master)
        else:
            self._connections = Connections(name, silence, pool=client.connection_pool)
        self._wait_replicas = wait_replicas
        self._wait_ms = wait_ms
        self._wait = pack(("WAIT", wait_replicas, wait_ms)) if wait_replicas else b""

    def describe(self) -> str:
        return self._name

    @property
    def batches(self) -> Connections:
        return self._connections

    @property
    def sentinel(self) -> SentinelMaster | None:
        return self._master

    def slot(self, key: str) -> int:
        return 0

    async def execute(self, key: str, command: tuple[str | int, ...], until: float | None, *,
                      script: bool = True, once: bool = False) -> Any:
        # ``until`` bounds nothing here: the call's own timeout (the batch's) ends a round trip
        try:
            return await self._send(command, script)
        except ReadOnlyError:
            if self._master is None or once:
                raise
            return await self._send(command, script)

    async def _send(self, command: tuple[str | int, ...], script: bool) -> Any:
        waits = script and bool(self._wait_replicas)
        reply, acked, _ = await self._connections.execute(command, script=script, wait=self._wait if waits else b"")
        if waits and acked < self._wait_replicas:
            raise Unconfirmed(reply, f"{self._name}: the hits reached {acked} of {self._wait_replicas} replicas "
                                     f"within {self._wait_ms} ms (REDIS_WAIT_REPLICAS)")
        return reply

    async def on_every_master(self, *command: str | int) -> None:
        await self._connections.execute(command, script=False)
        await self._connections.warm(2)

    async def ping(self) -> None:
        """PING (Sentinel's master: ROLE, as a master; Connections.ping), on a connection of the health ping's own
        (one Redis): load cannot starve it."""
        if self._master is not None:
            await self._connections.ping()
        else:
            await self._client.ping()
        if self._wait_replicas:
            await self._check_replicas()

    async def _check_replicas(self) -> None:
        """Raise BackendUnavailable (no evidence for the breaker: Redis answers) when the master has fewer
        replicas than REDIS_WAIT_REPLICAS: every admission would then wait for WAIT and get the failure mode."""
        try:
            role, _, _ = await self._connections.execute(("ROLE",), script=False)
        except NoPermissionError:
            return  # an ACL without ROLE: the failed WAITs tell
        replicas = len(role[2]) if role[0] in (b"master", "master") and len(role) > 2 else 0
        if replicas < self._wait_replicas:
            raise BackendUnavailable(f"{self._name}: {replicas} replicas connected; REDIS_WAIT_REPLICAS needs "
                                     f"{self._wait_replicas}, so no admission can be confirmed")

    async def close(self) -> None:
        await self._connections.close()
        # given its pool, redis-py would leave it open (the health ping's connection); one made on an event loop
        # that is closed now cannot be closed on this one, and its socket went with its loop
        with contextlib.suppress(RuntimeError):
            await self._client.aclose(close_connection_pool=True)
