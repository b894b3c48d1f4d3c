"""Following the master of a name that Sentinels monitor (REDIS_TYPE=sentinel), as soon as it moves.

redis-py's Sentinel client asks the Sentinels for the master when it opens a connection, and then keeps its
connections: after a failover, calls went on to the old master — which still takes writes, no longer
replicated — until Sentinel made it a replica (11 s after a ``SENTINEL FAILOVER`` in our measurements), and
every hit it admitted in that time vanished when it resynced. Here, with redis-py's Sentinel client for
finding the master and its pub/sub for the announcements:

- every configured Sentinel is subscribed to ``+switch-master``; a subscription that drops, or whose
  Sentinel stops answering its PINGs, is made again every RESUBSCRIBE_DELAY seconds. On the announcement for
  our master, the address in use changes at once, and RedisBackend sends no new call on a connection to
  another address (calls in flight finish where they were);
- a Sentinel subscribed to (again) is asked for the master at once, so an announcement made while no
  subscription was up is not missed; its answer moves the master in use only when it comes from a later
  failover (its epoch, which every announcement is followed by asking for): a Sentinel back from a restart or
  a partition names the master it last knew for a while;
- a node that said it is a replica (a script's ``READONLY`` reply, or ``ROLE`` in the health ping) is
  forgotten: the next connection asks the Sentinels again.

Not covered: hits that the old master admitted between its replica's promotion and the announcement are not
on the new master (replication is asynchronous; 0.5 to 1 s after ``SENTINEL FAILOVER`` here). Nor a node
that is cut off from the Sentinels and goes on as master without a word: Sentinel's own
``min-replicas-to-write`` advice applies. REDIS_WAIT_REPLICAS (RedisBackend) closes both windows, at a cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection, Connection, SSLConnection
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

CHANNEL = "+switch-master"
RESUBSCRIBE_DELAY = 1.0  # seconds between attempts to subscribe to a Sentinel that failed
PING_EVERY = 1.0  # seconds between PINGs on a quiet subscription (a Sentinel gone silent is otherwise never noticed)
SILENT_FOR = 3.0  # seconds without any answer after which a subscription is made again

Address = tuple[str, int]


class SentinelMaster:
    """The master in use for ``client``'s name (``client``: redis-py's ``Sentinel.master_for`` client, whose
    Sentinels, name and connection settings are used), and connections to it. See the module docstring."""

    def __init__(self, client: aioredis.Redis) -> None:
        pool = client.connection_pool
        if not isinstance(pool, SentinelConnectionPool):
            raise TypeError("SentinelMaster needs a client made by Sentinel.master_for")
        self.name: str = pool.service_name
        self._manager: Sentinel = pool.sentinel_manager
        kwargs = dict(pool.connection_kwargs)
        kwargs.pop("connection_pool", None)  # for redis-py's own SentinelManagedConnection
        # as a single Redis's: each call is bounded by the backend, a per-read timer on top would cost a timer
        # per command (connecting keeps its timeout)
        kwargs["socket_timeout"] = None
        self._connection_kwargs = kwargs
        # plain connections: redis-py's Sentinel connections turn READONLY into a ConnectionError, which says
        # the call may have run; READONLY says it did not, so the script may go to the new master
        self._connection_class = SSLConnection if issubclass(pool.connection_class, SSLConnection) else Connection
        self.address: Address | None = None  # None: ask the Sentinels before the next connection
        self._known: Address | None = None  # the last master in use (for the log)
        self._epoch = -1  # the failover epoch of the master in use, as the Sentinels tell it
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listeners: list[asyncio.Task[None]] = []

    async def connection(self) -> AbstractConnection:
        """A connection to the master in use, connected (asking the Sentinels first when no master is known).
        Raises RedisError or OSError."""
        self.follow()
        while True:
            address = self.address
            if address is None:
                address = await self._discover()
                _raise_if_cancelled()
            connection = self._connection_class(host=address[0], port=address[1], **self._connection_kwargs)
            try:
                await connection.connect()
            except BaseException:
                await connection.disconnect(nowait=True)
                raise
            if self.current(connection):
                return connection
            await connection.disconnect(nowait=True)  # the master changed while connecting

    def current(self, connection: object) -> bool:
        """Whether ``connection`` is to the master in use (a connection to another address is not used again)."""
        where = (getattr(connection, "host", None), getattr(connection, "port", None))
        return self.address is not None and where == self.address

    def demoted(self, connection: object) -> None:
        """``connection``'s node said it is a replica: if it is the master in use, forget it, so that the next
        connection asks the Sentinels."""
        if self.address is not None and self.current(connection):
            host, port = self.address
            log.warning("redis %s:%s says it is a replica now; asking the Sentinels for the master of %r", host, port,
                        self.name)
            self.address = None

    def switch(self, address: Address, why: str) -> None:
        """Use ``address`` as the master from now on."""
        if address == self.address:
            return
        if self._known is None or address == self._known:  # found (again, after a READONLY), not moved
            log.info("redis master %r is at %s:%s (%s)", self.name, address[0], address[1], why)
        else:
            log.warning("redis master %r is now %s:%s (%s)", self.name, address[0], address[1], why)
        self.address = self._known = address

    async def _discover(self) -> Address:
        host, port = await self._manager.discover_master(self.name)
        address = (str(host), int(port))
        if self.address is None:  # an announcement that came meanwhile wins
            self.switch(address, "named by the Sentinels")
        return self.address or address

    def follow(self) -> None:
        """Subscribe to the announcements of every Sentinel, in the running event loop (once per loop)."""
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        self._loop = loop
        self._listeners = [loop.create_task(self._listen(sentinel)) for sentinel in list(self._manager.sentinels)]

    async def _listen(self, sentinel: aioredis.Redis) -> None:
        kwargs = sentinel.connection_pool.connection_kwargs
        where = f"{kwargs.get('host')}:{kwargs.get('port')}"
        failed = 0
        while True:
            pubsub = sentinel.pubsub()
            try:
                await pubsub.subscribe(CHANNEL)
                await self._catch_up(sentinel, where)
                if failed:
                    log.warning("sentinel %s: subscribed to %s again", where, CHANNEL)
                failed = 0
                await self._read(pubsub, sentinel, where)
            except (RedisError, OSError, TimeoutError) as exc:
                _raise_if_cancelled()
                failed += 1
                if failed == 1:  # once per outage: a Sentinel that is down would otherwise log every second
                    log.warning("sentinel %s: no %s subscription (%s: %s); trying again every %.0f s", where,
                                CHANNEL, type(exc).__name__, exc, RESUBSCRIBE_DELAY)
            finally:
                with contextlib.suppress(RedisError, OSError, RuntimeError):
                    await pubsub.aclose()
            _raise_if_cancelled()
            await asyncio.sleep(RESUBSCRIBE_DELAY)

    async def _catch_up(self, sentinel: aioredis.Redis, where: str) -> None:
        """Ask a Sentinel just subscribed to for the master: it may have been announced while we were not
        listening. Only a newer failover than the one in use moves it: a Sentinel back from a restart or a
        partition may still name the old master for a while."""
        address, epoch = await self._named_by(sentinel)
        self.named(address, epoch, f"sentinel {where} on subscribing")

    def named(self, address: Address, epoch: int, by: str) -> None:
        """A Sentinel (``by``) names ``address`` master since failover ``epoch``: followed when no master is
        known or the failover is newer than the one in use, never back to an older one."""
        if self.address is None or epoch > self._epoch:
            self.switch(address, f"named by {by} (failover epoch {epoch})")
        if address == self.address:
            self._epoch = max(self._epoch, epoch)

    async def _named_by(self, sentinel: aioredis.Redis) -> tuple[Address, int]:
        """The master ``sentinel`` names, and the epoch of the failover that made it master."""
        state = await sentinel.sentinel_master(self.name)
        if not isinstance(state, dict):
            raise RedisError(f"SENTINEL MASTER {self.name}: unexpected reply {state!r}")
        return (str(state["ip"]), int(state["port"])), int(state["config-epoch"])

    async def _read(self, pubsub: aioredis.client.PubSub, sentinel: aioredis.Redis, where: str) -> None:
        loop = asyncio.get_running_loop()
        heard = pinged = loop.time()
        while True:
            message = await pubsub.get_message(timeout=PING_EVERY)
            _raise_if_cancelled()
            now = loop.time()
            if message is not None:
                heard = now
                if message["type"] == "message":
                    await self._announced(message["data"], sentinel, where)
            if now - heard > SILENT_FOR:
                raise TimeoutError(f"no answer for {SILENT_FOR:.0f} s")
            if now - pinged >= PING_EVERY:
                await pubsub.ping()
                pinged = now

    async def _announced(self, data: bytes | str, sentinel: aioredis.Redis, where: str) -> None:
        # "<master name> <old ip> <old port> <new ip> <new port>": followed at once, then the failover's epoch
        # is asked for, so that a Sentinel naming the old master afterwards does not move it back
        text = data.decode(errors="replace") if isinstance(data, bytes) else data
        parts = text.split()
        if len(parts) == 5 and parts[0] == self.name and parts[4].isdigit():
            announced = (parts[3], int(parts[4]))
            self.switch(announced, f"{CHANNEL} from sentinel {where}")
            address, epoch = await self._named_by(sentinel)
            if address == announced:
                self._epoch = max(self._epoch, epoch)

    async def stop_following(self) -> None:
        """Unsubscribe from every Sentinel, for the rest of this event loop (on close; and in the tests of what
        else tells a failover)."""
        if self._loop is asyncio.get_running_loop() and self._listeners:  # a gone loop's tasks went with it
            for task in self._listeners:
                task.cancel()
            await asyncio.wait(self._listeners)
        self._listeners = []
        self._loop = asyncio.get_running_loop()  # follow() does not start again in this loop

    async def close(self) -> None:
        await self.stop_following()
        with contextlib.suppress(RedisError, OSError, RuntimeError):
            await self._manager.aclose()


def _raise_if_cancelled() -> None:
    """Raise CancelledError if the running task was asked to stop. redis-py's client can swallow a cancellation
    (seen: a Sentinel command cancelled in flight raised its error reply instead): a listener that missed its
    cancellation would never end, and a batch cut off while asking the Sentinels would still be sent."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
