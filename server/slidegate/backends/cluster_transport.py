"""The transport to a Redis Cluster (slidegate.backends.transport): each command to the master of its key's slot,
through slidegate.backends.redis_cluster's router (MOVED, ASK, TRYAGAIN and CLUSTERDOWN followed there). One
request's keys may live on several masters, so a cluster takes no batches of requests: slidegate.backends.spanning
decides a request spanning slots."""

from __future__ import annotations

from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

from slidegate.backends.redis_cluster import ClusterRouter
from slidegate.backends.redis_connections import Connections
from slidegate.backends.redis_errors import STORAGE_ERRORS, reason
from slidegate.backends.redis_sentinel import SentinelMaster
from slidegate.backends.silence import Silence


class ClusterTransport:
    """Commands to the masters of ``client``'s cluster; ``silence`` hears of the script calls' answers."""

    def __init__(self, name: str, client: RedisCluster, silence: Silence) -> None:
        self._name = name
        self._client = client
        self._router = ClusterRouter(client)
        self._silence = silence

    def describe(self) -> str:
        return self._name

    @property
    def batches(self) -> Connections | None:
        return None

    @property
    def sentinel(self) -> SentinelMaster | None:
        return None

    def slot(self, key: str) -> int:
        return self._router.slot(key)

    async def execute(self, key: str, command: tuple[str | int, ...], until: float | None, *,
                      script: bool = True, once: bool = False) -> Any:
        try:
            reply = await self._router.execute(key, *command, until=until)
        except ResponseError:
            if script:
                self._silence.answered()  # an error reply: Redis is there
            raise
        except STORAGE_ERRORS as exc:
            if script:
                # redis-py's Cluster client does not say whether the connection was new: counted
                self._silence.failed(reason(exc))
            raise
        if script:
            self._silence.answered()
        return reply

    async def on_every_master(self, *command: str | int) -> None:
        await self._router.on_every_master(*command)

    async def ping(self) -> None:
        await self._router.ping()

    async def close(self) -> None:
        await self._client.aclose()
