"""One Redis as the settings name it (RedisTarget): the main one (REDIS_*) and the per-second one
(REDIS_PERSECOND_*) are declared once here, and their URLs made whole and checked the same way."""

from __future__ import annotations

import dataclasses
import enum
import os
from dataclasses import dataclass

from slidegate.redis_urls import check_url
from slidegate.setting_parsers import enum_choice, parse_bool, parse_pipeline_window, parse_positive_int, parse_whole
from slidegate.setting_spec import setting

# why the REDIS_PIPELINE_* settings change nothing (their help, and the start-up's log line when they are set)
PIPELINING = ("slidegate sends the calls that arrive while others are at Redis together in the next round trip, "
              "with no timer and no count to tune (a timer-based coalescer lost 20% of throughput); a value other "
              "than 0 is logged at start")


class RedisType(enum.StrEnum):
    """REDIS_TYPE: the topology."""

    SINGLE = "single"
    SENTINEL = "sentinel"
    CLUSTER = "cluster"


class SocketType(enum.StrEnum):
    """REDIS_SOCKET_TYPE: how a single Redis's URL without a scheme is reached."""

    TCP = "tcp"
    UNIX = "unix"


class HashTag(enum.StrEnum):
    """REDIS_HASH_TAG: what shares a Redis Cluster slot."""

    LIMIT = "limit"  # each limit its own slot
    DOMAIN = "domain"  # a whole domain one slot


@dataclass(frozen=True, slots=True)
class RedisTarget:
    """Where one Redis is and how it is reached; its settings' names follow the section's prefix (REDIS_ or
    REDIS_PERSECOND_), the help and defaults here are the main Redis's."""

    type: RedisType = setting(  # noqa: RUF009 - setting() is a dataclasses.field
        "TYPE", "single", enum_choice(RedisType),
        "single (one Redis), sentinel (a master found through Sentinel) or cluster (Redis Cluster)")
    socket_type: SocketType = setting(  # noqa: RUF009 - setting() is a dataclasses.field
        "SOCKET_TYPE", "tcp", enum_choice(SocketType),
        "single: how a REDIS_URL without a scheme is reached, as envoyproxy/ratelimit's host:port (tcp) or "
        "socket path (unix)")
    url: str = setting(
        "URL", "redis://127.0.0.1:6379/0", str,
        "single: redis://, rediss:// (TLS) or unix:// URL, or envoyproxy/ratelimit's host:port or socket path "
        "(see REDIS_SOCKET_TYPE); sentinel: master_name,host:port[,host:port…] (the Sentinels); cluster: "
        "host:port[,host:port…] (any nodes)")
    auth: str = setting("AUTH", "", str, "Redis password, or user:password (ACL); overrides one in the URL")
    sentinel_auth: str = setting(
        "SENTINEL_AUTH", "", str, "password, or user:password, of the Sentinels themselves (REDIS_TYPE=sentinel)")
    tls: bool = setting("TLS", "false", parse_bool, "connect to Redis with TLS (as rediss://)")
    pool_size: int = setting("POOL_SIZE", "64", parse_positive_int,
                             "Redis connections at most; more calls in flight wait for one")
    pipeline_window: float = setting("PIPELINE_WINDOW", "0", parse_pipeline_window,
                                     f"accepted from envoyproxy/ratelimit's configs, not used: {PIPELINING}")
    pipeline_limit: int = setting("PIPELINE_LIMIT", "0", parse_whole,
                                  f"accepted from envoyproxy/ratelimit's configs, not used: {PIPELINING}")

    def whole(self) -> RedisTarget:
        """This target with envoyproxy/ratelimit's URL forms of a single Redis made URLs: host:port → redis://,
        a socket path (SOCKET_TYPE=unix) → unix:// with the path made absolute."""
        url = self.url.strip()
        if self.type is not RedisType.SINGLE or not url or "://" in url:
            return dataclasses.replace(self, url=url)
        unix = self.socket_type is SocketType.UNIX
        return dataclasses.replace(self, url="unix://" + os.path.abspath(url) if unix else "redis://" + url)

    def check(self) -> None:
        """Raise ValueError naming the problem unless the URL has the form the type takes."""
        check_url(self.url, self.type)
