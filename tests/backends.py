"""Every backend the product offers, as the settings that choose it: the behaviour suite runs over each (the
``backing`` fixture in conftest.py), so ``pytest -k sentinel`` runs it against a real Sentinel set.

An id names the storage (``memory``; ``single``, one Redis; ``sentinel``, a master, a replica and a Sentinel;
``cluster``, three masters with a replica each; ``cluster-domain``, the same with REDIS_HASH_TAG=domain;
``persecond``, a Redis for the per-second limits beside the main one), and ``-cache`` adds the local over-limit
cache (LOCAL_CACHE_SIZE_IN_BYTES). The servers start once per session; each test has a key prefix of its own.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import pytest

CACHE_BYTES = "1048576"


class Servers(enum.Enum):
    """What a backend needs running, each a session fixture of conftest.py."""

    NONE = ""
    SINGLE = "redis_url"
    PERSECOND = "persecond_redis"
    SENTINEL = "shared_sentinel"
    CLUSTER = "shared_cluster"


class Backing(NamedTuple):
    """One backend under test: its id, the tier its tests are in, and what it needs running."""

    id: str
    tier: str
    servers: Servers
    cache: bool = False
    domain_slot: bool = False


def _both(id_: str, tier: str, servers: Servers, domain_slot: bool = False) -> list[Backing]:
    return [Backing(id_, tier, servers, False, domain_slot), Backing(f"{id_}-cache", tier, servers, True, domain_slot)]


BACKENDS: list[Backing] = [
    Backing("memory", "unit", Servers.NONE),  # the product has no over-limit cache in front of its memory
    *_both("single", "redis", Servers.SINGLE),
    *_both("persecond", "redis", Servers.PERSECOND),
    *_both("sentinel", "topology", Servers.SENTINEL),
    *_both("cluster", "topology", Servers.CLUSTER),
    *_both("cluster-domain", "topology", Servers.CLUSTER, domain_slot=True),
]


# The storage alone, as the `backend` fixture gives it: REDIS_HASH_TAG=domain is in the keys the limiter builds,
# and REDIS_PERSECOND sends only windows of one second to its Redis, so for checks made by hand those two would
# repeat `cluster` and `single`; the `limits` fixture (the whole service) runs them
STORAGES = [b for b in BACKENDS if not b.domain_slot and b.servers is not Servers.PERSECOND]


def params(backends: list[Backing] = BACKENDS) -> list[object]:
    """``backends`` as pytest params: the id as the test id, the tier as its mark."""
    return [pytest.param(b, id=b.id, marks=getattr(pytest.mark, b.tier)) for b in backends]


def settings_for(backing: Backing, request: pytest.FixtureRequest) -> dict[str, str]:
    """The settings (flag names, values as text) that choose ``backing``, its servers started (session
    fixtures asked for through ``request``)."""
    # the cache is on by default (32 MiB): a backend without it says so
    flags = {"local_cache_size_in_bytes": CACHE_BYTES if backing.cache else "0"}
    if backing.servers is Servers.NONE:
        return {**flags, "backend_type": "memory"}
    # the behaviour suite decides, it does not time out: the failure tests keep their own deadlines, and here two
    # test workers, a Cluster and a Sentinel set share two cores
    flags |= {"backend_type": "redis", "redis_timeout": "2"}
    if backing.servers in (Servers.SINGLE, Servers.PERSECOND):
        flags["redis_url"] = request.getfixturevalue("redis_url")
    if backing.servers is Servers.PERSECOND:
        flags |= {"redis_persecond": "true", "redis_persecond_url": request.getfixturevalue("persecond_redis").url}
    if backing.servers is Servers.SENTINEL:
        flags |= {"redis_type": "sentinel", "redis_url": request.getfixturevalue("shared_sentinel").url}
    if backing.servers is Servers.CLUSTER:
        flags |= {"redis_type": "cluster", "redis_url": request.getfixturevalue("shared_cluster").url}
    if backing.domain_slot:
        flags["redis_hash_tag"] = "domain"
    return flags


def redis_urls(flags: dict[str, str]) -> list[str]:
    """The single Redis servers of ``flags`` that may be shared with others (REDIS_URL's, the per-second one):
    the ones whose keys a test deletes after it. Sentinel's and Cluster's are the session's own."""
    if flags["backend_type"] != "redis" or flags.get("redis_type", "single") != "single":
        return []
    return [flags["redis_url"], *([flags["redis_persecond_url"]] if "redis_persecond_url" in flags else [])]
