"""The parsers of slidegate.settings: each turns a setting's text (as an environment variable holds it) into its
value, or raises ValueError saying what is wrong, which Settings.load reports with the setting's flag and variable.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from enum import StrEnum
from typing import TypeVar

from slidegate.statsd import parse_pairs

E = TypeVar("E", bound=StrEnum)
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(us|ms|s|m|h)?\s*$")
_SECONDS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str) -> float:
    """``"250ms"``, ``"0.25s"``, ``"1m"`` (Go-style units us, ms, s, m, h) or ``"0.25"`` (seconds) →
    seconds. Raises ValueError."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"invalid duration {text!r} (use e.g. 250ms or 0.25s)")
    return float(match.group(1)) * _SECONDS[match.group(2)]


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off", ""):
        return False
    raise ValueError(f"{text!r} is not true or false")


def parse_optional_bool(text: str) -> bool | None:
    """A boolean, or None for an empty value (the setting then follows others)."""
    return None if not text.strip() else parse_bool(text)


def parse_names(text: str) -> tuple[str, ...]:
    return tuple(filter(None, (part.strip() for part in text.split(","))))


def parse_whole(text: str) -> int:
    if not re.fullmatch(r"\s*-?\d+\s*", text):
        raise ValueError(f"{text!r} is not a whole number")
    value = int(text)
    if value < 0:
        raise ValueError(f"{value} is negative")
    return value


def parse_port(text: str) -> int:
    value = parse_whole(text)
    if not 0 <= value <= 65535:
        raise ValueError(f"{value} is not a port (0-65535)")
    return value


def parse_listen_address(text: str) -> tuple[str, int] | None:
    """Go's listen address, as envoyproxy/ratelimit's PROMETHEUS_ADDR: ``host:port``, ``[v6]:port`` or ``:port``
    (host "": every address); empty: None."""
    text = text.strip()
    if not text:
        return None
    host, sep, port = text.rpartition(":")
    if not sep:
        raise ValueError(f"{text!r} is not host:port (e.g. :9090 for every address, or 127.0.0.1:9090)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{text!r}: an IPv6 address goes in brackets, as [::1]:9090")
    return host, parse_port(port)


def parse_url_path(text: str) -> str:
    path = text.strip()
    if not path.startswith("/") or any(char.isspace() or char in "?#" for char in path):
        raise ValueError(f"{text!r} is not a URL path (one starting with /, without a query)")
    return path


def parse_positive_int(text: str) -> int:
    value = parse_whole(text)
    if value < 1:
        raise ValueError(f"{value} must be at least 1")
    return value


MAX_WAIT_REPLICAS = 1000  # far past any master's replicas; Redis itself would take up to 2**63 - 1


def parse_wait_replicas(text: str) -> int:
    value = parse_whole(text)
    if value > MAX_WAIT_REPLICAS:
        raise ValueError(f"{value} must be at most {MAX_WAIT_REPLICAS} (the replicas of one master)")
    return value


def parse_message_size(text: str) -> int:
    value = parse_whole(text)
    # below 4 KiB not even a request with one ordinary descriptor and its headers' values would fit
    if not 4096 <= value <= 2**31 - 1:
        raise ValueError(f"{value} must be at least 4096 (bytes) and at most {2**31 - 1}")
    return value


def parse_wait_timeout(text: str) -> float:
    seconds = parse_duration(text)
    if seconds < 0.001:
        raise ValueError(f"{text!r} must be at least 1 ms (Redis's WAIT counts whole ms, and WAIT 0 waits for ever)")
    if seconds > 60:
        raise ValueError(f"{text!r} must be at most 60 s")
    return seconds


def parse_jitter(text: str) -> int:
    value = parse_whole(text)
    # a day is already far past any window's need; Lua's generator draws from 31 bits of milliseconds
    if value > 86400:
        raise ValueError(f"{value} must be at most 86400 (a day)")
    return value


def duration_text(seconds: float) -> str:
    """``seconds`` as a duration setting would say it: 250ms, 2s, 150us."""
    for unit, size in (("s", 1.0), ("ms", 1e-3)):
        whole = round(seconds / size)
        if whole >= 1 and abs(seconds / size - whole) < 1e-9:
            return f"{whole}{unit}"
    return f"{seconds * 1e6:g}us"


def duration_within(least: float, most: float, said: str) -> Callable[[str], float]:
    """A duration setting's parser: from ``least`` to ``most`` seconds (``said``: what it must be, in words)."""

    def parse(text: str) -> float:
        seconds = parse_duration(text)
        if not least <= seconds <= most:
            raise ValueError(f"{text!r} must be {said}")
        return seconds

    return parse


parse_pipeline_window = duration_within(0, 60, "at most 60 s")
parse_drain = duration_within(0, 3600, "at most 1 h")
parse_settle = duration_within(0, 60, "at most 60 s")
parse_connection_age = duration_within(0, 365 * 86400, "at most a year")
parse_flush_interval = duration_within(0.001, 3600, "at least 1 ms and at most 1 h")
# below a millisecond no Redis round trip fits (and the backend's deadlines are kept to 2 ms)
parse_timeout = duration_within(0.001, 60, "at least 1 ms and at most 60 s")
# below 10 ms a dead xDS server would be redialled in a busy loop
parse_backoff_interval = duration_within(0.01, 3600, "at least 10 ms and at most 1 h")


def parse_ratio(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise ValueError(f"{value} must be more than 0 and at most 1")
    return value


def parse_sampling_rate(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise ValueError(f"{value} must be between 0 and 1")
    return value


def choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        lowered = text.strip().lower()
        if lowered not in allowed:
            raise ValueError(f"{text!r} is not one of {', '.join(allowed)}")
        return lowered

    return parse


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP field name (RFC 9110 token)


def parse_header_name(text: str) -> str:
    name = text.strip()
    if not _TOKEN.fullmatch(name):
        raise ValueError(f"{text!r} is not an HTTP header name (letters, digits and !#$%&'*+-.^_`|~)")
    return name


def parse_optional_header_name(text: str) -> str:
    """A header name, or empty for none."""
    return parse_header_name(text) if text.strip() else ""


class BackendType(enum.StrEnum):
    """BACKEND_TYPE: where the counts are kept."""

    REDIS = "redis"  # shared by every replica
    MEMORY = "memory"  # this process only


def parse_backend_type(text: str) -> BackendType:
    if text.strip().lower() == "memcache":
        raise ValueError("memcache (envoyproxy/ratelimit's) is not offered: memcached cannot decide several limits "
                         "at once, atomically (it runs no scripts); use redis")
    return BackendType(choice(*BackendType)(text))


class ConfigType(enum.StrEnum):
    """CONFIG_TYPE: where the limits come from."""

    FILE = "FILE"  # the YAML files of the config directory
    GRPC_XDS_SOTW = "GRPC_XDS_SOTW"  # an xDS server's state of the world


def parse_config_type(text: str) -> ConfigType:
    upper = text.strip().upper()
    if upper not in set(ConfigType):
        raise ValueError(f"{text!r} is not one of {', '.join(ConfigType)} (YAML files in the config directory, or "
                         "an xDS server's state of the world)")
    return ConfigType(upper)


def parse_node_metadata(text: str) -> tuple[tuple[str, str], ...]:
    """``k=v,k2=v2`` (envoyproxy/ratelimit's CONFIG_GRPC_XDS_NODE_METADATA: each value a string, up to the first
    ``=`` the key). The reference drops an entry without ``=`` in silence; it is refused here, so that the node
    does not go without metadata its operator meant to send."""
    found = []
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"{item!r} is not key=value")
        found.append((key, value))
    return tuple(found)


def parse_grpc_headers(text: str) -> tuple[tuple[str, str], ...]:
    """``k1:v1,k2:v2`` as gRPC metadata: names lower case, as Go's metadata.New makes them."""
    pairs = parse_pairs(text)
    for key, _ in pairs:
        if not _TOKEN.fullmatch(key.strip()):
            raise ValueError(f"{key!r} is not a header name (letters, digits and !#$%&'*+-.^_`|~)")
    return tuple((key.strip().lower(), value.strip()) for key, value in pairs)


def parse_random_factor(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise ValueError(f"{value} must be between 0 and 1")
    return value


def parse_xds_message_size(text: str) -> int:
    value = parse_whole(text)
    return 0 if value == 0 else parse_message_size(text)


# envoyproxy/ratelimit's levels (logrus) map onto Python's: LOG_LEVEL=warn carries over
_LOG_LEVELS = {"trace": "debug", "debug": "debug", "info": "info", "warn": "warning", "warning": "warning",
               "error": "error", "fatal": "error", "panic": "error"}


def parse_log_level(text: str) -> str:
    lowered = text.strip().lower()
    if lowered not in _LOG_LEVELS:
        raise ValueError(f"{text!r} is not one of debug, info, warn (warning), error")
    return _LOG_LEVELS[lowered]


def enum_choice(kind: type[E]) -> Callable[[str], E]:
    """A parser of one of ``kind``'s values (any case), as the member."""
    allowed = choice(*(member.value for member in kind))

    def parse(text: str) -> E:
        return kind(allowed(text))

    return parse
