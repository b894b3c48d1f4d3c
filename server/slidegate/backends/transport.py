"""How a command reaches the Redis that holds a key: one small protocol, one transport per topology.

A transport knows where a key lives (its hash slot), sends one command there, pings, and runs a command on
every master; it tells the Silence it was given of Redis's answers and failures. What the command is (a script
call, its NOSCRIPT reload) is the script runner's (slidegate.backends.script_runner), never a transport's.

- one Redis and Sentinel's master: slidegate.backends.node_transport (connections of our own; a batch of
  requests shares one script call; READONLY from a demoted master goes once more to the new one; WAIT);
- Redis Cluster: slidegate.backends.cluster_transport (each slot's master; MOVED, ASK, TRYAGAIN, CLUSTERDOWN).

``open_transport`` is the one place that picks a transport by topology.
"""

from __future__ import annotations

from typing import Any, Protocol

from redis.asyncio.cluster import RedisCluster

from slidegate.backends.cluster_transport import ClusterTransport
from slidegate.backends.node_transport import NodeTransport
from slidegate.backends.redis_connect import Topology, make_client
from slidegate.backends.redis_connections import Connections
from slidegate.backends.redis_sentinel import SentinelMaster
from slidegate.backends.silence import Silence
from slidegate.redis_target import RedisType


class Transport(Protocol):
    def describe(self) -> str:
        """Where Redis is, for logs and errors (never a password)."""
        ...

    @property
    def batches(self) -> Connections | None:
        """The connections that take batches of requests, each one script call (slidegate.backends.taskless);
        None where one request's keys may live on several nodes (a cluster)."""
        ...

    @property
    def sentinel(self) -> SentinelMaster | None:
        """With Sentinel, what follows the master calls go to; None otherwise."""
        ...

    def slot(self, key: str) -> int:
        """``key``'s hash slot on a cluster; 0 where one node holds every key."""
        ...

    async def execute(self, key: str, command: tuple[str | int, ...], until: float | None, *,
                      script: bool = True, once: bool = False) -> Any:
        """``command``'s reply from the node holding ``key``, sent before ``until`` (the event loop's time) or not
        at all. ``script``: a script call, whose answers and failures count for Redis's health. ``once``: not
        sent again to another node (a READONLY the caller already had). Raises an error reply as its
        ResponseError, a storage error (slidegate.backends.redis_errors) on a failure, and
        script_codec.Unconfirmed when hits did not reach the replicas asked for (REDIS_WAIT_REPLICAS)."""
        ...

    async def on_every_master(self, *command: str | int) -> None:
        """Send ``command`` (SCRIPT LOAD) to every master, and open the connections calls will use."""
        ...

    async def ping(self) -> None:
        """Raise a storage error unless every master answers (and, with REDIS_WAIT_REPLICAS, has the replicas
        asked for: BackendUnavailable otherwise)."""
        ...

    async def close(self) -> None: ...


def open_transport(topology: Topology, *, timeout: float, pool_size: int, silence: Silence,
                   wait_replicas: int = 0, wait_ms: int = 0) -> Transport:
    """The transport for ``topology``, with at most ``pool_size`` connections to a node (the health ping's
    one more). Raises ValueError for a malformed URL, or waiting for replicas on a cluster."""
    if wait_replicas and topology.type == RedisType.CLUSTER:
        raise ValueError("waiting for replicas (REDIS_WAIT_REPLICAS) is not offered on a Redis Cluster")
    client = make_client(topology, timeout=timeout, pool_size=pool_size + 1)
    if isinstance(client, RedisCluster):
        return ClusterTransport(topology.describe(), client, silence)
    return NodeTransport(topology.describe(), client, silence, sentinel=topology.type == RedisType.SENTINEL,
                         wait_replicas=wait_replicas, wait_ms=wait_ms)
