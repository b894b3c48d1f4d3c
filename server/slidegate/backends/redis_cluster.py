"""Sending a script call to the Redis Cluster node that owns its keys, following MOVED and ASK.

redis-py's cluster client keeps the topology (slots → nodes, found again after a failover) and the
connections; this module only routes one command, because redis-py's asyncio router loses in two ways
that matter to a rate limiter under concurrency: it sends ASKING on one pooled connection and the command on
another (so a slot being migrated answers MOVED/ASK back and forth until "TTL exhausted"), and every fifth
MOVED it closes every connection, failing calls in flight that may already have counted their hits.

Here ASKING and the command travel together on one connection, MOVED updates the slot table for later calls,
and TRYAGAIN (keys of one call split by a migration) and CLUSTERDOWN (some slot has no master: with Redis's
default cluster-require-full-coverage, every node refuses every command for the second or so until a replica
is promoted) wait briefly and try again, for RETRY_FOR seconds at most (a call's own timeout ends it sooner):
each of those replies means the command did not run, so sending it again cannot count a hit twice. A
migration of a slot with many keys keeps it split for longer than any number of quick redirections would
allow. Connection errors and timeouts are raised, never retried, and make the next call read the topology
again.
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    RedisClusterException,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

MAX_REDIRECTIONS = 16  # as redis-py: a slot cannot move more often than this during one call
TRYAGAIN_PAUSE = 0.01  # seconds between tries after TRYAGAIN or CLUSTERDOWN
RETRY_FOR = 5.0  # seconds those replies are tried again at most: a migration, a master's replica promoted


async def unusable(connection: AbstractConnection) -> bool:
    """Whether an idle ``connection`` must not carry a command: Redis closed it (CLIENT KILL, its `timeout`, a
    restart) or a reply was left unread on it. A connection never opened is usable (it connects when sent on)."""
    if not connection.is_connected:
        return False
    try:
        return await connection.can_read()
    except (RedisConnectionError, OSError):  # redis-py ≥ 8.2 raises for a connection closed by the server
        return True


class ClusterRouter:
    """Executes commands on the master serving a slot of ``client``'s cluster."""

    def __init__(self, client: RedisCluster) -> None:
        self._client = client
        self._started = False
        self._stale = True  # the topology must be read before the first call
        self._reading = asyncio.Lock()

    async def topology(self) -> None:
        """Read the slot table if it may be out of date; one reader at a time, the others wait for it.
        Raises RedisError (no node answered)."""
        if not self._stale:
            return
        async with self._reading:
            if self._stale:
                if self._started:
                    await self._client.nodes_manager.initialize()
                else:
                    await self._client.initialize()
                    self._started = True
                self._stale = False

    def slot(self, key: str) -> int:
        return self._client.keyslot(key)

    async def execute(self, key: str, *command: Any, until: float | None = None) -> Any:
        """``command``'s reply from the master of ``key``'s slot; TRYAGAIN and CLUSTERDOWN are tried again only
        until ``until`` (the event loop's time), if given. Raises redis-py's errors (ConnectionError,
        TimeoutError, ResponseError such as NoScriptError), or ClusterDownError after too many redirections."""
        await self.topology()
        slot = self._client.keyslot(key)
        try:
            node = self._client.nodes_manager.get_node_from_slot(slot)
        except RedisClusterException:
            self._stale = True  # a slot no master serves (mid-failover): read the topology again next time
            raise
        asking = False
        redirections = 0
        loop = asyncio.get_running_loop()
        since = loop.time()
        while redirections < MAX_REDIRECTIONS:
            try:
                return await self._send(node, command, asking)
            except MovedError as e:  # the slot has a new owner: for this call and every later one
                redirections += 1
                await self._client.nodes_manager.move_slot(e)
                node, asking = self._client.nodes_manager.get_node_from_slot(slot), False
            except AskError as e:  # the slot is migrating and the key is already on the target: this once
                redirections += 1
                target = self._client.nodes_manager.get_node(host=e.host, port=e.port)
                if target is None:
                    self._stale = True
                    await self.topology()
                    target = self._client.nodes_manager.get_node(host=e.host, port=e.port)
                if target is None:
                    raise
                node, asking = target, True
            except (TryAgainError, ClusterDownError):
                now = loop.time()
                if now - since > RETRY_FOR or (until is not None and now + TRYAGAIN_PAUSE >= until):
                    raise
                await asyncio.sleep(TRYAGAIN_PAUSE)
            except ResponseError:
                raise
            except Exception:  # connection lost, timeout, no node: the topology may have changed
                self._stale = True
                raise
        raise ClusterDownError(f"slot {slot} redirected {MAX_REDIRECTIONS} times")

    async def ping(self) -> None:
        """PING every master (through this router's connections: redis-py's own ping may close them all when
        it fails). Raises RedisError or RedisClusterException."""
        await self.on_every_master("PING")

    async def on_every_master(self, *command: Any) -> None:
        """Send ``command`` to every master at once. Raises RedisError or RedisClusterException."""
        await self.topology()
        try:
            await asyncio.gather(*(self._send(node, command, False) for node in self._client.get_primaries()))
        except Exception:
            self._stale = True
            raise

    @staticmethod
    async def _send(node: ClusterNode, command: tuple[Any, ...], asking: bool) -> Any:
        connection = node.acquire_connection()
        try:
            if await unusable(connection):
                # nothing of this call's was sent on it, so it is replaced rather than used to fail the call
                # (redis-py's Cluster client hands its connections out unchecked)
                await connection.disconnect()
            if asking:
                await connection.send_packed_command(connection.pack_commands([("ASKING",), command]))
                try:
                    await connection.read_response()
                finally:
                    reply = await connection.read_response()  # read even when ASKING failed: no reply left behind
                return reply
            else:
                await connection.send_packed_command(connection.pack_command(*command))
            return await connection.read_response()
        except ResponseError:
            raise  # the reply was read whole: the connection is fine
        except BaseException:
            await connection.disconnect()  # a reply may be half read (timeout, cancellation)
            raise
        finally:
            node.release(connection)
