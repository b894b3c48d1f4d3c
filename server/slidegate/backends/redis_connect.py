"""redis-py clients for the three Redis topologies (REDIS_TYPE) and the REDIS_URL forms they take.

The URL conventions are envoyproxy/ratelimit's:

- ``single``: ``redis://[user:password@]host:port/db``, ``rediss://`` (TLS) or ``unix:///path``;
- ``sentinel``: ``master_name,host:port[,host:port...]`` — the name Sentinel knows the master by, then the
  Sentinel addresses;
- ``cluster``: ``host:port[,host:port...]`` — any nodes of the cluster (the client learns the rest).

Every client is set up so that redis-py never retries a command itself: a script that may have run would
count its hits twice. Redirections (MOVED, ASK) and master changes are still followed: those replies mean
the command did not run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.maint_notifications import MaintNotificationsConfig

# check_url and redact are offered here too (slidegate.backends.redis takes them from this module)
from slidegate.redis_urls import check_url as check_url
from slidegate.redis_urls import parse_cluster_url, parse_sentinel_url
from slidegate.redis_urls import redact as redact

# redis-py 8.1.0's default ("auto", on over RESP3) skips its pools' check of a connection before reuse, so a
# connection Redis or a Sentinel closed while idle (CLIENT KILL, its `timeout`, a restart) failed the next command
# (redis-py #4252, a regression of 8.1.0). The notifications are Redis Enterprise's hitless upgrades, which
# slidegate does not follow. (redis-py's Cluster client checks no idle connection either way: ClusterRouter does.)
NO_MAINTENANCE_NOTIFICATIONS = MaintNotificationsConfig(enabled=False)


@dataclass(frozen=True, slots=True)
class TlsOptions:
    """TLS files: CA bundle (empty: the system's), client certificate and key (mutual TLS), and whether the
    certificate must name the host."""

    ca_certs: str = ""
    certfile: str = ""
    keyfile: str = ""
    check_hostname: bool = True


@dataclass(frozen=True, slots=True)
class Topology:
    """Where Redis is: ``type`` (single, sentinel or cluster) and ``url`` in that type's form (see the module
    docstring). ``tls``: files for TLS; sentinel and cluster use TLS when it is given, single when the URL is
    ``rediss://``. ``auth``: (user or None, password) for Redis, winning over the URL's; ``sentinel_auth``:
    the same for the Sentinels themselves."""

    type: str
    url: str
    tls: TlsOptions | None = None
    auth: tuple[str | None, str] | None = None
    sentinel_auth: tuple[str | None, str] | None = None

    def describe(self) -> str:
        """For logs: never shows a password."""
        if self.type == "single":
            return f"redis at {redact(self.url)}"
        if self.type == "sentinel":
            master, sentinels = parse_sentinel_url(self.url)
            return f"redis master {master!r} via sentinel {_join(sentinels)}"
        return f"redis cluster via {_join(parse_cluster_url(self.url))}"


def _join(addresses: list[tuple[str, int]]) -> str:
    return ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in addresses)


def _tls_kwargs(tls: TlsOptions) -> dict[str, Any]:
    return {"ssl_ca_certs": tls.ca_certs or None, "ssl_certfile": tls.certfile or None,
            "ssl_keyfile": tls.keyfile or None, "ssl_check_hostname": tls.check_hostname}


def _auth_kwargs(auth: tuple[str | None, str] | None) -> dict[str, Any]:
    return {} if auth is None else {"username": auth[0], "password": auth[1]}


def make_client(topology: Topology, *, timeout: float, pool_size: int) -> aioredis.Redis | RedisCluster:
    """A redis-py asyncio client for ``topology``: at most ``pool_size`` connections (per node for a
    cluster) — callers keep their own calls within it, since these pools fail rather than wait when
    full —, ``timeout`` seconds for connecting and (Sentinel, Cluster) for each reply, and no retries.
    Raises ValueError for a malformed URL."""
    check_url(topology.url, topology.type)
    common: dict[str, Any] = {
        # a single Redis's calls are each bounded by the backend (RedisBackend._execute): a per-read timeout
        # on top would cost a timer per command; redis-py's Sentinel and Cluster clients rely on it
        "socket_timeout": None if topology.type == "single" else timeout,
        "socket_connect_timeout": timeout,
        "retry": Retry(NoBackoff(), 0),
        "encoding_errors": "surrogateescape",  # request bytes that are not UTF-8 travel as they came
        "maint_notifications_config": NO_MAINTENANCE_NOTIFICATIONS,
        **_auth_kwargs(topology.auth),
    }
    if topology.type == "single":
        tls = _tls_kwargs(topology.tls) if topology.tls is not None and topology.url.startswith("rediss://") else {}
        pool = aioredis.ConnectionPool.from_url(topology.url, max_connections=pool_size, health_check_interval=0,
                                                **common, **tls)
        return aioredis.Redis(connection_pool=pool)
    tls = {} if topology.tls is None else {"ssl": True, **_tls_kwargs(topology.tls)}
    if topology.type == "sentinel":
        master, sentinels = parse_sentinel_url(topology.url)
        sentinel_kwargs = {"socket_timeout": timeout, "socket_connect_timeout": timeout,
                           "retry": Retry(NoBackoff(), 0),  # so a refusal is reported as such, at once
                           "maint_notifications_config": NO_MAINTENANCE_NOTIFICATIONS,
                           **_auth_kwargs(topology.sentinel_auth), **tls}
        manager = Sentinel(sentinels, sentinel_kwargs=sentinel_kwargs)
        client: aioredis.Redis = manager.master_for(master, redis_class=aioredis.Redis, max_connections=pool_size,
                                                    **common, **tls)
        return client
    nodes = [ClusterNode(host, port) for host, port in parse_cluster_url(topology.url)]
    # a node that is down must not stop the slots of the others from being served
    return RedisCluster(startup_nodes=nodes, require_full_coverage=False, max_connections=pool_size,
                        **common, **tls)
