"""Every setting of ``slidegate serve``: one typed object, read from environment variables and overridable by
command-line flags (a flag wins over its variable, which wins over the default).

Names follow envoyproxy/ratelimit where it has the setting (``REDIS_URL``, ``GRPC_PORT``, ``RUNTIME_ROOT`` …);
docs/configuration.md's settings table lists them all and a test keeps it equal to ``SPECS``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slidegate.algorithms import Algorithm
from slidegate.backends.blocked import DEFAULT_MAX_BYTES, ENTRY_BYTES
from slidegate.backends.redis_connect import check_url
from slidegate.failure_modes import FailureMode
from slidegate.headers import HeaderNames, ResponseHeaders
from slidegate.statsd import Transport, parse_pairs

DEFAULT_MAX_RECV_MSG_SIZE = 4 * 1024 * 1024  # bytes: gRPC's own default, as envoyproxy/ratelimit's
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(us|ms|s|m|h)?\s*$")
_SECONDS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


class SettingsError(ValueError):
    """A setting that cannot be used; the message names it (flag and variable) and the value."""


def parse_duration(text: str) -> float:
    """``"250ms"``, ``"0.25s"``, ``"1m"`` (Go-style units us, ms, s, m, h) or ``"0.25"`` (seconds) →
    seconds. Raises ValueError."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"invalid duration {text!r} (use e.g. 250ms or 0.25s)")
    return float(match.group(1)) * _SECONDS[match.group(2)]


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off", ""):
        return False
    raise ValueError(f"{text!r} is not true or false")


def _optional_bool(text: str) -> bool | None:
    """A boolean, or None for an empty value (the setting then follows others)."""
    return None if not text.strip() else _bool(text)


def _names(text: str) -> tuple[str, ...]:
    return tuple(filter(None, (part.strip() for part in text.split(","))))


def _whole(text: str) -> int:
    if not re.fullmatch(r"\s*-?\d+\s*", text):
        raise ValueError(f"{text!r} is not a whole number")
    value = int(text)
    if value < 0:
        raise ValueError(f"{value} is negative")
    return value


def _port(text: str) -> int:
    value = _whole(text)
    if not 0 <= value <= 65535:
        raise ValueError(f"{value} is not a port (0-65535)")
    return value


def _listen_address(text: str) -> tuple[str, int] | None:
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
    return host, _port(port)


def _url_path(text: str) -> str:
    path = text.strip()
    if not path.startswith("/") or any(char.isspace() or char in "?#" for char in path):
        raise ValueError(f"{text!r} is not a URL path (one starting with /, without a query)")
    return path


def _positive_int(text: str) -> int:
    value = _whole(text)
    if value < 1:
        raise ValueError(f"{value} must be at least 1")
    return value


def _message_size(text: str) -> int:
    value = _whole(text)
    # below 4 KiB not even a request with one ordinary descriptor and its headers' values would fit
    if not 4096 <= value <= 2**31 - 1:
        raise ValueError(f"{value} must be at least 4096 (bytes) and at most {2**31 - 1}")
    return value


def _wait_timeout(text: str) -> float:
    seconds = parse_duration(text)
    if seconds < 0.001:
        raise ValueError(f"{text!r} must be at least 1 ms (Redis's WAIT counts whole ms, and WAIT 0 waits for ever)")
    if seconds > 60:
        raise ValueError(f"{text!r} must be at most 60 s")
    return seconds


def _jitter(text: str) -> int:
    value = _whole(text)
    # a day is already far past any window's need; Lua's generator draws from 31 bits of milliseconds
    if value > 86400:
        raise ValueError(f"{value} must be at most 86400 (a day)")
    return value


def _duration_text(seconds: float) -> str:
    """``seconds`` as a duration setting would say it: 250ms, 2s, 150us."""
    for unit, size in (("s", 1.0), ("ms", 1e-3)):
        whole = round(seconds / size)
        if whole >= 1 and abs(seconds / size - whole) < 1e-9:
            return f"{whole}{unit}"
    return f"{seconds * 1e6:g}us"


# why the REDIS_PIPELINE_* settings change nothing (their help, and the start-up's log line when they are set)
_PIPELINING = ("slidegate sends the calls that arrive while others are at Redis together in the next round trip, "
               "with no timer and no count to tune (a timer-based coalescer lost 20% of throughput); a value other "
               "than 0 is logged at start")


def _duration_within(least: float, most: float, said: str) -> Callable[[str], float]:
    """A duration setting's parser: from ``least`` to ``most`` seconds (``said``: what it must be, in words)."""

    def parse(text: str) -> float:
        seconds = parse_duration(text)
        if not least <= seconds <= most:
            raise ValueError(f"{text!r} must be {said}")
        return seconds

    return parse


_pipeline_window = _duration_within(0, 60, "at most 60 s")
_drain = _duration_within(0, 3600, "at most 1 h")
_settle = _duration_within(0, 60, "at most 60 s")
_connection_age = _duration_within(0, 365 * 86400, "at most a year")
_flush_interval = _duration_within(0.001, 3600, "at least 1 ms and at most 1 h")
# below a millisecond no Redis round trip fits (and the backend's deadlines are kept to 2 ms)
_timeout = _duration_within(0.001, 60, "at least 1 ms and at most 60 s")
# below 10 ms a dead xDS server would be redialled in a busy loop
_backoff_interval = _duration_within(0.01, 3600, "at least 10 ms and at most 1 h")


def _ratio(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise ValueError(f"{value} must be more than 0 and at most 1")
    return value


def _sampling_rate(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise ValueError(f"{value} must be between 0 and 1")
    return value


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        lowered = text.strip().lower()
        if lowered not in allowed:
            raise ValueError(f"{text!r} is not one of {', '.join(allowed)}")
        return lowered

    return parse


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP field name (RFC 9110 token)


def _header_name(text: str) -> str:
    name = text.strip()
    if not _TOKEN.fullmatch(name):
        raise ValueError(f"{text!r} is not an HTTP header name (letters, digits and !#$%&'*+-.^_`|~)")
    return name


def _backend_type(text: str) -> str:
    if text.strip().lower() == "memcache":
        raise ValueError("memcache (envoyproxy/ratelimit's) is not offered: memcached cannot decide several limits "
                         "at once, atomically (it runs no scripts); use redis")
    return _choice("redis", "memory")(text)


CONFIG_TYPES = ("FILE", "GRPC_XDS_SOTW")


def _config_type(text: str) -> str:
    upper = text.strip().upper()
    if upper not in CONFIG_TYPES:
        raise ValueError(f"{text!r} is not one of {', '.join(CONFIG_TYPES)} (YAML files in the config directory, or "
                         "an xDS server's state of the world)")
    return upper


def _node_metadata(text: str) -> tuple[tuple[str, str], ...]:
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


def _grpc_headers(text: str) -> tuple[tuple[str, str], ...]:
    """``k1:v1,k2:v2`` as gRPC metadata: names lower case, as Go's metadata.New makes them."""
    pairs = parse_pairs(text)
    for key, _ in pairs:
        if not _TOKEN.fullmatch(key.strip()):
            raise ValueError(f"{key!r} is not a header name (letters, digits and !#$%&'*+-.^_`|~)")
    return tuple((key.strip().lower(), value.strip()) for key, value in pairs)


def _random_factor(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise ValueError(f"{value} must be between 0 and 1")
    return value


def _xds_message_size(text: str) -> int:
    value = _whole(text)
    return 0 if value == 0 else _message_size(text)


# envoyproxy/ratelimit's levels (logrus) map onto Python's: LOG_LEVEL=warn carries over
_LOG_LEVELS = {"trace": "debug", "debug": "debug", "info": "info", "warn": "warning", "warning": "warning",
               "error": "error", "fatal": "error", "panic": "error"}


def _log_level(text: str) -> str:
    lowered = text.strip().lower()
    if lowered not in _LOG_LEVELS:
        raise ValueError(f"{text!r} is not one of debug, info, warn (warning), error")
    return _LOG_LEVELS[lowered]


@dataclass(frozen=True, slots=True)
class Spec:
    """One setting: its field in Settings, environment variable, flag, default (as text, as the variable
    would hold it), parser and help."""

    field: str
    env: str
    flag: str
    default: str
    parse: Callable[[str], Any]
    help: str


SPECS: tuple[Spec, ...] = (
    Spec("config_dir", "CONFIG_DIR", "--config", "", str,
         "directory of rate-limit YAML files; empty: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY"),
    Spec("runtime_root", "RUNTIME_ROOT", "--runtime-root", "/srv/runtime_data/current", str,
         "root of the runtime directory (envoyproxy/ratelimit's layout)"),
    Spec("runtime_subdirectory", "RUNTIME_SUBDIRECTORY", "--runtime-subdirectory", "", str,
         "subdirectory of RUNTIME_ROOT"),
    Spec("runtime_appdirectory", "RUNTIME_APPDIRECTORY", "--runtime-appdirectory", "config", str,
         "directory of the YAML files inside RUNTIME_ROOT/RUNTIME_SUBDIRECTORY"),
    Spec("runtime_watch_root", "RUNTIME_WATCH_ROOT", "--runtime-watch-root", "true", _bool,
         "watch the config directory's parent too, so a swapped symlink (Kubernetes ConfigMap) is seen"),
    Spec("config_settle_time", "CONFIG_SETTLE_TIME", "--config-settle-time", "500ms", _settle,
         "a changed config file is loaded once no config file has changed for this long (0: at once), so that "
         "one written in parts never loads half written (a finished file renamed into place is always whole)"),
    Spec("backend_type", "BACKEND_TYPE", "--backend", "redis", _backend_type,
         "redis (shared by every replica) or memory (this process only)"),
    Spec("redis_type", "REDIS_TYPE", "--redis-type", "single", _choice("single", "sentinel", "cluster"),
         "single (one Redis), sentinel (a master found through Sentinel) or cluster (Redis Cluster)"),
    Spec("redis_socket_type", "REDIS_SOCKET_TYPE", "--redis-socket-type", "tcp", _choice("tcp", "unix"),
         "single: how a REDIS_URL without a scheme is reached, as envoyproxy/ratelimit's host:port (tcp) or "
         "socket path (unix)"),
    Spec("redis_url", "REDIS_URL", "--redis-url", "redis://127.0.0.1:6379/0", str,
         "single: redis://, rediss:// (TLS) or unix:// URL, or envoyproxy/ratelimit's host:port or socket path "
         "(see REDIS_SOCKET_TYPE); sentinel: master_name,host:port[,host:port…] (the Sentinels); cluster: "
         "host:port[,host:port…] (any nodes)"),
    Spec("redis_auth", "REDIS_AUTH", "--redis-auth", "", str,
         "Redis password, or user:password (ACL); overrides one in the URL"),
    Spec("redis_sentinel_auth", "REDIS_SENTINEL_AUTH", "--redis-sentinel-auth", "", str,
         "password, or user:password, of the Sentinels themselves (REDIS_TYPE=sentinel)"),
    Spec("redis_hash_tag", "REDIS_HASH_TAG", "--redis-hash-tag", "limit", _choice("limit", "domain"),
         "what shares a Redis Cluster slot: limit (each limit its own; a request spanning slots is one call "
         "per slot, undone where it admitted when another rejects) or domain (a whole domain in one slot: every "
         "request one call)"),
    Spec("redis_tls", "REDIS_TLS", "--redis-tls", "false", _bool, "connect to Redis with TLS (as rediss://)"),
    Spec("redis_tls_cacert", "REDIS_TLS_CACERT", "--redis-tls-cacert", "", str,
         "CA bundle to verify Redis's certificate (empty: the system's)"),
    Spec("redis_tls_client_cert", "REDIS_TLS_CLIENT_CERT", "--redis-tls-client-cert", "", str,
         "client certificate for Redis (mutual TLS)"),
    Spec("redis_tls_client_key", "REDIS_TLS_CLIENT_KEY", "--redis-tls-client-key", "", str,
         "key of REDIS_TLS_CLIENT_CERT"),
    Spec("redis_tls_skip_hostname_verification", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
         "--redis-tls-skip-hostname-verification", "false", _bool,
         "accept a Redis certificate for another host name"),
    Spec("failure_mode", "FAILURE_MODE", "--failure-mode", FailureMode.ERROR.value,
         lambda text: FailureMode(_choice(*FailureMode)(text)),
         "when the storage cannot decide: error (UNAVAILABLE, Envoy's failure_mode_deny decides), allow, deny, "
         "or local (in memory, each limit divided by LOCAL_LIMIT_REPLICAS); a domain's failure_mode wins"),
    Spec("local_limit_replicas", "LOCAL_LIMIT_REPLICAS", "--local-limit-replicas", "1", _positive_int,
         "slidegate replicas sharing the limits, for FAILURE_MODE=local"),
    Spec("redis_pool_size", "REDIS_POOL_SIZE", "--redis-pool-size", "64", _positive_int,
         "Redis connections at most; more calls in flight wait for one"),
    Spec("redis_timeout", "REDIS_TIMEOUT", "--redis-timeout", "250ms", _timeout,
         "time allowed for one decision (250ms, 0.25s, 1m …; a bare number is seconds), 1 ms to 60 s; the "
         "caller's deadline caps it"),
    Spec("redis_wait_replicas", "REDIS_WAIT_REPLICAS", "--redis-wait-replicas", "0", _whole,
         "single (with replicas) and sentinel: after each script call, Redis WAIT for its writes to reach this "
         "many replicas; a call they did not reach in time gets the failure mode; 0: off"),
    Spec("redis_wait_timeout", "REDIS_WAIT_TIMEOUT", "--redis-wait-timeout", "50ms", _wait_timeout,
         "how long REDIS_WAIT_REPLICAS waits (rounded up to whole ms), at least 1 ms and shorter than "
         "REDIS_TIMEOUT"),
    Spec("redis_persecond", "REDIS_PERSECOND", "--redis-persecond", "false", _bool,
         "keep the limits of one second (unit second, unit_multiplier 1) in a Redis of their own, "
         "REDIS_PERSECOND_URL; a request with limits in both is still decided all-or-nothing"),
    Spec("redis_persecond_type", "REDIS_PERSECOND_TYPE", "--redis-persecond-type", "single",
         _choice("single", "sentinel", "cluster"), "REDIS_TYPE of the per-second Redis"),
    Spec("redis_persecond_socket_type", "REDIS_PERSECOND_SOCKET_TYPE", "--redis-persecond-socket-type", "tcp",
         _choice("tcp", "unix"), "REDIS_SOCKET_TYPE of the per-second Redis"),
    Spec("redis_persecond_url", "REDIS_PERSECOND_URL", "--redis-persecond-url", "", str,
         "the per-second Redis, in REDIS_URL's forms; needed with REDIS_PERSECOND"),
    Spec("redis_persecond_auth", "REDIS_PERSECOND_AUTH", "--redis-persecond-auth", "", str,
         "REDIS_AUTH of the per-second Redis"),
    Spec("redis_persecond_sentinel_auth", "REDIS_PERSECOND_SENTINEL_AUTH", "--redis-persecond-sentinel-auth", "",
         str, "REDIS_SENTINEL_AUTH of the per-second Redis's Sentinels"),
    Spec("redis_persecond_tls", "REDIS_PERSECOND_TLS", "--redis-persecond-tls", "false", _bool,
         "connect to the per-second Redis with TLS (the REDIS_TLS_* files serve both Redis)"),
    Spec("redis_persecond_pool_size", "REDIS_PERSECOND_POOL_SIZE", "--redis-persecond-pool-size", "64",
         _positive_int, "REDIS_POOL_SIZE of the per-second Redis"),
    Spec("redis_pipeline_window", "REDIS_PIPELINE_WINDOW", "--redis-pipeline-window", "0", _pipeline_window,
         f"accepted from envoyproxy/ratelimit's configs, not used: {_PIPELINING}"),
    Spec("redis_pipeline_limit", "REDIS_PIPELINE_LIMIT", "--redis-pipeline-limit", "0", _whole,
         f"accepted from envoyproxy/ratelimit's configs, not used: {_PIPELINING}"),
    Spec("redis_persecond_pipeline_window", "REDIS_PERSECOND_PIPELINE_WINDOW", "--redis-persecond-pipeline-window",
         "0", _pipeline_window, "REDIS_PIPELINE_WINDOW of the per-second Redis: not used either"),
    Spec("redis_persecond_pipeline_limit", "REDIS_PERSECOND_PIPELINE_LIMIT", "--redis-persecond-pipeline-limit",
         "0", _whole, "REDIS_PIPELINE_LIMIT of the per-second Redis: not used either"),
    Spec("expiration_jitter_max_seconds", "EXPIRATION_JITTER_MAX_SECONDS", "--expiration-jitter-max-seconds", "0",
         _jitter, "every Redis key expires up to this many seconds later than it must (a random share, whole ms, "
         "drawn for each key), so that keys written together do not expire together; at most 86400; 0: off"),
    Spec("local_cache_size_in_bytes", "LOCAL_CACHE_SIZE_IN_BYTES", "--local-cache-size-in-bytes",
         str(DEFAULT_MAX_BYTES), _whole,
         "memory of each process's over-limit cache (requests known to be over limit are answered without "
         f"Redis), charged {ENTRY_BYTES} bytes a remembered limit plus its key's size; 0: no cache"),
    Spec("grpc_client_tls_san", "GRPC_CLIENT_TLS_SAN", "--grpc-client-tls-san", "", str,
         "with GRPC_CLIENT_TLS_CACERT: only clients whose certificate carries this SAN (a DNS name, '*.' "
         "wildcards in the certificate matching one label, or an IP address) are served; others get "
         "UNAUTHENTICATED"),
    Spec("grpc_host", "GRPC_HOST", "--host", "0.0.0.0", str, "address for gRPC"),
    Spec("grpc_port", "GRPC_PORT", "--grpc-port", "8081", _port, "gRPC port (0: any free port)"),
    Spec("grpc_uds", "GRPC_UDS", "--grpc-uds", "", str,
         "listen for gRPC on this unix socket path instead of GRPC_HOST:GRPC_PORT"),
    Spec("grpc_max_connection_age", "GRPC_MAX_CONNECTION_AGE", "--grpc-max-connection-age", "24h", _connection_age,
         "a client connection is asked to go (GOAWAY) after about this long (gRPC adds +/-10%), so that clients "
         "spread over new replicas; 0: never"),
    Spec("grpc_max_connection_age_grace", "GRPC_MAX_CONNECTION_AGE_GRACE", "--grpc-max-connection-age-grace", "1h",
         _connection_age, "after GRPC_MAX_CONNECTION_AGE, how long its calls in flight may take before it is closed"),
    Spec("grpc_max_recv_msg_size", "GRPC_MAX_RECV_MSG_SIZE", "--grpc-max-recv-msg-size",
         str(DEFAULT_MAX_RECV_MSG_SIZE), _message_size,
         "largest request accepted, in bytes (larger ones are refused with RESOURCE_EXHAUSTED before they are "
         "read, and Envoy lets them through); the default holds a route's descriptors naming a header or the "
         "path 68 times at Envoy's default 60 KiB header limit: raise it with max_request_headers_kb"),
    Spec("grpc_server_use_tls", "GRPC_SERVER_USE_TLS", "--grpc-server-use-tls", "false", _bool,
         "serve gRPC over TLS"),
    Spec("grpc_server_tls_cert", "GRPC_SERVER_TLS_CERT", "--grpc-server-tls-cert", "", str,
         "server certificate (PEM); re-read when the file changes"),
    Spec("grpc_server_tls_key", "GRPC_SERVER_TLS_KEY", "--grpc-server-tls-key", "", str,
         "key of GRPC_SERVER_TLS_CERT"),
    Spec("grpc_client_tls_cacert", "GRPC_CLIENT_TLS_CACERT", "--grpc-client-tls-cacert", "", str,
         "CA of client certificates: set, clients must present one it signed (mutual TLS)"),
    Spec("http_host", "HOST", "--http-host", "0.0.0.0", str, "address for HTTP (/json, /healthcheck)"),
    Spec("http_port", "PORT", "--http-port", "8080", _port, "HTTP port (0: any free port)"),
    Spec("debug_host", "DEBUG_HOST", "--debug-host", "0.0.0.0", str, "address for /rlconfig, /metrics and /stats"),
    Spec("debug_port", "DEBUG_PORT", "--debug-port", "6070", _port, "debug HTTP port (0: any free port)"),
    Spec("log_level", "LOG_LEVEL", "--log-level", "info", _log_level,
         "debug, info, warn or error (envoyproxy/ratelimit's trace, fatal and panic too); debug logs one line "
         "per decision"),
    Spec("log_format", "LOG_FORMAT", "--log-format", "text", _choice("text", "json"), "text or JSON lines"),
    Spec("cache_key_prefix", "CACHE_KEY_PREFIX", "--cache-key-prefix", "", str, "prefix of every Redis key"),
    Spec("default_algorithm", "DEFAULT_ALGORITHM", "--default-algorithm", Algorithm.SLIDING_WINDOW_LOG.value,
         lambda text: Algorithm(_choice(*(a.value for a in Algorithm))(text)),
         "algorithm of limits that name none, and of overrides"),
    Spec("merge_domain_config", "MERGE_DOMAIN_CONFIG", "--merge-domain-config", "false", _bool,
         "let several files add descriptors to one domain"),
    Spec("shadow_mode", "SHADOW_MODE", "--shadow-mode", "false", _bool,
         "evaluate and count every limit but answer OK overall (descriptors keep their codes)"),
    Spec("quota_mode", "QUOTA_MODE", "--quota-mode", "false", _bool,
         "every limit in quota mode (but a shadow_mode rule's): a request is rejected only when all its quota "
         "limits are over, or a limit not in quota mode is"),
    Spec("stop_cache_key_increment_when_overlimit", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
         "--stop-cache-key-increment-when-overlimit", "false", _bool,
         "fixed_window: do not count hits of requests that are over limit"),
    Spec("response_dynamic_metadata", "RESPONSE_DYNAMIC_METADATA", "--response-dynamic-metadata", "false", _bool,
         "describe the request and matched rules' metadata in dynamic_metadata"),
    Spec("negative_hits_enabled", "NEGATIVE_HITS_ENABLED", "--negative-hits-enabled", "false", _bool,
         "accept is_negative_hits (a descriptor giving hits back); refused with INVALID_ARGUMENT otherwise, since "
         "anyone who reaches the port could empty any counter (docs/security.md)"),
    Spec("limit_override_enabled", "LIMIT_OVERRIDE_ENABLED", "--limit-override-enabled", "true", _bool,
         "accept a descriptor's own limit (Envoy's RateLimit.limit), as envoyproxy/ratelimit does; refused with "
         "INVALID_ARGUMENT otherwise (docs/security.md)"),
    Spec("json_endpoint_enabled", "JSON_ENDPOINT_ENABLED", "--json-endpoint-enabled", "true", _bool,
         "serve POST /json (ShouldRateLimit in JSON) on the HTTP port"),
    Spec("near_limit_ratio", "NEAR_LIMIT_RATIO", "--near-limit-ratio", "0.8", _ratio,
         "a hit past this share of a limit counts as near_limit in the metrics"),
    Spec("limit_response_headers_enabled", "LIMIT_RESPONSE_HEADERS_ENABLED", "--limit-response-headers-enabled",
         "false", _bool, "add RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset to answers, for the "
         "descriptor closest to its limit"),
    Spec("limit_response_headers_ietf", "LIMIT_RESPONSE_HEADERS_IETF", "--limit-response-headers-ietf", "false",
         _bool, "tell the limit in the IETF draft's form (10, 10;w=60) and add its RateLimit-Policy and RateLimit "
         "fields, and Retry-After when over limit"),
    Spec("limit_limit_header", "LIMIT_LIMIT_HEADER", "--limit-limit-header", "RateLimit-Limit", _header_name,
         "name of the header telling the limit"),
    Spec("limit_remaining_header", "LIMIT_REMAINING_HEADER", "--limit-remaining-header", "RateLimit-Remaining",
         _header_name, "name of the header telling the hits remaining"),
    Spec("limit_reset_header", "LIMIT_RESET_HEADER", "--limit-reset-header", "RateLimit-Reset", _header_name,
         "name of the header telling the seconds until reset"),
    Spec("use_prometheus", "USE_PROMETHEUS", "--use-prometheus", "true", _bool, "serve metrics on /metrics"),
    Spec("prometheus_addr", "PROMETHEUS_ADDR", "--prometheus-addr", "", _listen_address,
         "a listener of its own for the metrics, host:port (:port: every address), serving only PROMETHEUS_PATH; "
         "empty: none (the metrics are on /metrics of the HTTP and debug ports either way); with USE_PROMETHEUS"),
    Spec("prometheus_path", "PROMETHEUS_PATH", "--prometheus-path", "/metrics", _url_path,
         "the path of the metrics on PROMETHEUS_ADDR's listener"),
    Spec("use_statsd", "USE_STATSD", "--use-statsd", "", _optional_bool,
         "send stats to statsd as envoyproxy/ratelimit does (its default sink); empty: on when STATSD_HOST is set"),
    Spec("statsd_host", "STATSD_HOST", "--statsd-host", "", str,
         "statsd (or DogStatsD) host; empty with USE_STATSD=true or USE_DOG_STATSD=true: localhost"),
    Spec("statsd_port", "STATSD_PORT", "--statsd-port", "8125", _port, "statsd (or DogStatsD) port"),
    Spec("statsd_protocol", "STATSD_PROTOCOL", "--statsd-protocol", Transport.TCP.value,
         lambda text: Transport(_choice(*Transport)(text)),
         "tcp (as the reference's gostats client) or udp; DogStatsD is always sent over udp"),
    Spec("extra_tags", "EXTRA_TAGS", "--extra-tags", "", parse_pairs,
         "tags on every stat, k1:v1,k2:v2 (statsd: in the name as .__k1=v1; DogStatsD: as tags)"),
    Spec("stats_flush_interval", "STATS_FLUSH_INTERVAL", "--stats-flush-interval", "10s", _flush_interval,
         "how often counters are sent to statsd (timers: every second)"),
    Spec("disable_stats", "DISABLE_STATS", "--disable-stats", "false", _bool,
         "send and serve no stats: no statsd, no /metrics"),
    Spec("use_dog_statsd", "USE_DOG_STATSD", "--use-dog-statsd", "false", _bool,
         "send stats to DogStatsD (tags as its tags, not in the name) instead of plain statsd"),
    Spec("use_dog_statsd_mogrifiers", "USE_DOG_STATSD_MOGRIFIERS", "--use-dog-statsd-mogrifiers", "", _names,
         "DogStatsD mogrifiers to apply, first match wins, each defined by DOG_STATSD_MOGRIFIER_(name)_PATTERN, "
         "_NAME and _TAGS"),
    Spec("drain_timeout", "DRAIN_TIMEOUT", "--drain-timeout", "10s", _drain,
         "after SIGTERM, how long in-flight calls may take"),
    Spec("rlqs_max_buckets_per_stream", "RLQS_MAX_BUCKETS_PER_STREAM", "--rlqs-max-buckets-per-stream", "10000",
         _positive_int, "Rate Limit Quota Service: buckets one Envoy stream may hold; further buckets are denied"),
    Spec("workers", "WORKERS", "--workers", "1", _positive_int,
         "processes serving the same ports (SO_REUSEPORT), each with its own event loop; Redis backend only"),
    Spec("healthy_with_at_least_one_config_loaded", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
         "--healthy-with-at-least-one-config-loaded", "false", _bool,
         "not serving (health checks) while no config file has loaded a domain"),
    Spec("config_type", "CONFIG_TYPE", "--config-type", "FILE", _config_type,
         "where the limits come from: FILE, the YAML files of the config directory; GRPC_XDS_SOTW, an xDS server "
         "(ADS, state of the world) at CONFIG_GRPC_XDS_SERVER_URL"),
    Spec("force_start_without_initial_config", "FORCE_START_WITHOUT_INITIAL_CONFIG",
         "--force-start-without-initial-config", "false", _bool,
         "GRPC_XDS_SOTW: listen before the first config came (every call is refused until it does); false: wait "
         "for it"),
    Spec("config_grpc_xds_node_id", "CONFIG_GRPC_XDS_NODE_ID", "--config-grpc-xds-node-id", "default", str,
         "GRPC_XDS_SOTW: the node id sent to the xDS server"),
    Spec("config_grpc_xds_node_metadata", "CONFIG_GRPC_XDS_NODE_METADATA", "--config-grpc-xds-node-metadata", "",
         _node_metadata, "GRPC_XDS_SOTW: the node's metadata, k=v,k2=v2 (string values)"),
    Spec("config_grpc_xds_server_url", "CONFIG_GRPC_XDS_SERVER_URL", "--config-grpc-xds-server-url",
         "localhost:18000", str, "GRPC_XDS_SOTW: the xDS server, host:port"),
    Spec("config_grpc_xds_client_additional_headers", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
         "--config-grpc-xds-client-additional-headers", "", _grpc_headers,
         "GRPC_XDS_SOTW: gRPC metadata sent with the stream, k1:v1,k2:v2"),
    Spec("config_grpc_xds_server_use_tls", "CONFIG_GRPC_XDS_SERVER_USE_TLS", "--config-grpc-xds-server-use-tls",
         "false", _bool, "GRPC_XDS_SOTW: talk TLS to the xDS server"),
    Spec("config_grpc_xds_client_tls_cert", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "--config-grpc-xds-client-tls-cert",
         "", str, "GRPC_XDS_SOTW: client certificate for mutual TLS with the xDS server"),
    Spec("config_grpc_xds_client_tls_key", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "--config-grpc-xds-client-tls-key",
         "", str, "GRPC_XDS_SOTW: the client certificate's key"),
    Spec("config_grpc_xds_server_tls_cacert", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
         "--config-grpc-xds-server-tls-cacert", "", str,
         "GRPC_XDS_SOTW: CA of the xDS server's certificate, trusted besides the system's CAs"),
    Spec("config_grpc_xds_server_tls_san", "CONFIG_GRPC_XDS_SERVER_TLS_SAN", "--config-grpc-xds-server-tls-san", "",
         str, "GRPC_XDS_SOTW: the name the xDS server's certificate must carry; empty: the host of the URL"),
    Spec("xds_client_backoff_initial_interval", "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
         "--xds-client-backoff-initial-interval", "10s", _backoff_interval,
         "GRPC_XDS_SOTW: the wait before redialling a lost xDS server, doubled at each failure"),
    Spec("xds_client_backoff_max_interval", "XDS_CLIENT_BACKOFF_MAX_INTERVAL", "--xds-client-backoff-max-interval",
         "60s", _backoff_interval, "GRPC_XDS_SOTW: the longest wait before redialling"),
    Spec("xds_client_backoff_random_factor", "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
         "--xds-client-backoff-random-factor", "0.5", _random_factor,
         "GRPC_XDS_SOTW: with XDS_CLIENT_BACKOFF_JITTER, each wait is drawn within this share of it either way"),
    Spec("xds_client_backoff_jitter", "XDS_CLIENT_BACKOFF_JITTER", "--xds-client-backoff-jitter", "true", _bool,
         "GRPC_XDS_SOTW: randomize the waits (replicas do not redial together)"),
    Spec("xds_client_max_msg_size_in_bytes", "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "--xds-client-max-msg-size-in-bytes",
         "0", _xds_message_size, "GRPC_XDS_SOTW: the largest xDS response accepted, in bytes; 0: gRPC's 4 MiB"),
    Spec("tracing_enabled", "TRACING_ENABLED", "--tracing-enabled", "false", _bool,
         "export OpenTelemetry spans (a span per ShouldRateLimit call, a child per storage call) over OTLP to "
         "OTEL_EXPORTER_OTLP_ENDPOINT; needs the tracing extra (pip install -e '.[tracing]' in a checkout)"),
    Spec("tracing_service_name", "TRACING_SERVICE_NAME", "--tracing-service-name", "RateLimit", str,
         "the spans' service.name"),
    Spec("tracing_service_namespace", "TRACING_SERVICE_NAMESPACE", "--tracing-service-namespace", "", str,
         "the spans' service.namespace"),
    Spec("tracing_service_instance_id", "TRACING_SERVICE_INSTANCE_ID", "--tracing-service-instance-id", "", str,
         "the spans' service.instance.id; empty: a random UUID for each process"),
    Spec("tracing_exporter_protocol", "TRACING_EXPORTER_PROTOCOL", "--tracing-exporter-protocol", "http",
         _choice("http", "grpc"), "OTLP over http (protobuf) or grpc"),
    Spec("tracing_sampling_rate", "TRACING_SAMPLING_RATE", "--tracing-sampling-rate", "1", _sampling_rate,
         "the share of traces started here that are sampled, 0 to 1; a caller's traceparent decides for its own"),
)


MAX_WORKERS = 128  # each worker is a whole Python process (~70 MB)

@dataclass(frozen=True, slots=True)
class Settings:
    """The parsed settings (times in seconds). Build with ``Settings.load``."""

    config_dir: str
    runtime_root: str
    runtime_subdirectory: str
    runtime_appdirectory: str
    runtime_watch_root: bool
    config_settle_time: float
    backend_type: str
    redis_type: str
    redis_socket_type: str
    redis_url: str
    redis_auth: str
    redis_sentinel_auth: str
    redis_hash_tag: str
    redis_tls: bool
    redis_tls_cacert: str
    redis_tls_client_cert: str
    redis_tls_client_key: str
    redis_tls_skip_hostname_verification: bool
    failure_mode: FailureMode
    local_limit_replicas: int
    redis_pool_size: int
    redis_timeout: float
    redis_wait_replicas: int
    redis_wait_timeout: float
    redis_persecond: bool
    redis_persecond_type: str
    redis_persecond_socket_type: str
    redis_persecond_url: str
    redis_persecond_auth: str
    redis_persecond_sentinel_auth: str
    redis_persecond_tls: bool
    redis_persecond_pool_size: int
    redis_pipeline_window: float
    redis_pipeline_limit: int
    redis_persecond_pipeline_window: float
    redis_persecond_pipeline_limit: int
    expiration_jitter_max_seconds: int
    local_cache_size_in_bytes: int
    grpc_client_tls_san: str
    grpc_host: str
    grpc_port: int
    grpc_uds: str
    grpc_max_connection_age: float
    grpc_max_connection_age_grace: float
    grpc_max_recv_msg_size: int
    grpc_server_use_tls: bool
    grpc_server_tls_cert: str
    grpc_server_tls_key: str
    grpc_client_tls_cacert: str
    http_host: str
    http_port: int
    debug_host: str
    debug_port: int
    log_level: str
    log_format: str
    cache_key_prefix: str
    default_algorithm: Algorithm
    merge_domain_config: bool
    shadow_mode: bool
    quota_mode: bool
    stop_cache_key_increment_when_overlimit: bool
    response_dynamic_metadata: bool
    negative_hits_enabled: bool
    limit_override_enabled: bool
    json_endpoint_enabled: bool
    near_limit_ratio: float
    limit_response_headers_enabled: bool
    limit_response_headers_ietf: bool
    limit_limit_header: str
    limit_remaining_header: str
    limit_reset_header: str
    use_prometheus: bool
    prometheus_addr: tuple[str, int] | None
    prometheus_path: str
    use_statsd: bool | None
    statsd_host: str
    statsd_port: int
    statsd_protocol: Transport
    extra_tags: tuple[tuple[str, str], ...]
    stats_flush_interval: float
    disable_stats: bool
    use_dog_statsd: bool
    use_dog_statsd_mogrifiers: tuple[str, ...]
    drain_timeout: float
    rlqs_max_buckets_per_stream: int
    workers: int
    healthy_with_at_least_one_config_loaded: bool
    config_type: str
    force_start_without_initial_config: bool
    config_grpc_xds_node_id: str
    config_grpc_xds_node_metadata: tuple[tuple[str, str], ...]
    config_grpc_xds_server_url: str
    config_grpc_xds_client_additional_headers: tuple[tuple[str, str], ...]
    config_grpc_xds_server_use_tls: bool
    config_grpc_xds_client_tls_cert: str
    config_grpc_xds_client_tls_key: str
    config_grpc_xds_server_tls_cacert: str
    config_grpc_xds_server_tls_san: str
    xds_client_backoff_initial_interval: float
    xds_client_backoff_max_interval: float
    xds_client_backoff_random_factor: float
    xds_client_backoff_jitter: bool
    xds_client_max_msg_size_in_bytes: int
    tracing_enabled: bool
    tracing_service_name: str
    tracing_service_namespace: str
    tracing_service_instance_id: str
    tracing_exporter_protocol: str
    tracing_sampling_rate: float

    @property
    def uses_xds(self) -> bool:
        """Whether the limits come from an xDS server (CONFIG_TYPE=GRPC_XDS_SOTW), not from files."""
        return self.config_type == "GRPC_XDS_SOTW"

    @property
    def statsd_enabled(self) -> bool:
        """Whether stats go to statsd: USE_DOG_STATSD, or USE_STATSD, or (USE_STATSD unset) a STATSD_HOST given,
        unless DISABLE_STATS. The reference sends to statsd by default; slidegate, whose default sink is
        Prometheus, does when asked, and a STATSD_HOST alone asks (a reference operator seldom sets USE_STATSD,
        its default)."""
        if self.disable_stats:
            return False
        return self.use_dog_statsd or (self.use_statsd if self.use_statsd is not None else bool(self.statsd_host))

    @property
    def serves_prometheus(self) -> bool:
        """Whether /metrics is served: USE_PROMETHEUS unless DISABLE_STATS."""
        return self.use_prometheus and not self.disable_stats

    @property
    def prometheus_listener(self) -> tuple[str, int] | None:
        """The address of the metrics' own listener: PROMETHEUS_ADDR when /metrics is served at all (the
        reference opens it only with USE_PROMETHEUS too); None: none. Host "" stands for every address."""
        return self.prometheus_addr if self.serves_prometheus else None

    def unused_pipelining(self) -> list[str]:
        """The REDIS_PIPELINE_* settings given a value other than 0, as ``NAME=value``: accepted and not used
        (see their help), which the start-up says."""
        given = [("REDIS_PIPELINE_WINDOW", _duration_text(self.redis_pipeline_window)),
                 ("REDIS_PIPELINE_LIMIT", str(self.redis_pipeline_limit)),
                 ("REDIS_PERSECOND_PIPELINE_WINDOW", _duration_text(self.redis_persecond_pipeline_window)),
                 ("REDIS_PERSECOND_PIPELINE_LIMIT", str(self.redis_persecond_pipeline_limit))]
        return [f"{name}={text}" for name, text in given if text not in ("0", "0us")]

    @property
    def response_headers(self) -> ResponseHeaders:
        """The headers LIMIT_RESPONSE_HEADERS_ENABLED and LIMIT_RESPONSE_HEADERS_IETF ask for (the IETF fields
        come with the others, never alone)."""
        if not self.limit_response_headers_enabled:
            return ResponseHeaders.NONE
        return ResponseHeaders.IETF if self.limit_response_headers_ietf else ResponseHeaders.RATELIMIT

    @property
    def header_names(self) -> HeaderNames:
        """The names LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER and LIMIT_RESET_HEADER give the headers."""
        return HeaderNames(self.limit_limit_header, self.limit_remaining_header, self.limit_reset_header)

    @classmethod
    def load(cls, environ: Mapping[str, str], flags: Mapping[str, str | None] | None = None) -> Settings:
        """Settings from ``flags`` (field → text, None = not given), else ``environ``, else the defaults.
        Raises SettingsError listing every malformed value."""
        values: dict[str, Any] = {}
        problems = []
        for spec in SPECS:
            flag = (flags or {}).get(spec.field)
            if flag is not None:
                source, text = "flag", flag
            elif spec.env in environ:
                source, text = "environment", environ[spec.env]
            else:
                source, text = "default", spec.default
            try:
                values[spec.field] = spec.parse(text)
            except ValueError as exc:
                problems.append(f"{spec.flag} / {spec.env} (from the {source}): {exc}")
        if problems:
            raise SettingsError("invalid settings:\n  " + "\n  ".join(problems))
        for prefix in ("redis", "redis_persecond"):
            url = values[f"{prefix}_url"].strip()
            if values[f"{prefix}_type"] == "single" and url and "://" not in url:
                # envoyproxy/ratelimit's REDIS_URL: host:port, or a socket path with REDIS_SOCKET_TYPE=unix
                unix = values[f"{prefix}_socket_type"] == "unix"
                values[f"{prefix}_url"] = "unix://" + os.path.abspath(url) if unix else "redis://" + url
        settings = cls(**values)
        settings.check()
        return settings

    def check(self) -> None:
        """Raise SettingsError for settings that only make sense together, and for a malformed Redis URL."""
        if self.grpc_uds and self.workers > 1:
            raise SettingsError("--grpc-uds / GRPC_UDS cannot be shared by --workers / WORKERS > 1: workers share "
                                "TCP ports only")
        if self.backend_type == "redis":
            try:
                check_url(self.redis_url, self.redis_type)
            except ValueError as exc:
                raise SettingsError(f"invalid settings:\n  --redis-url / REDIS_URL: {exc}") from exc
        if self.redis_persecond:
            if self.backend_type != "redis":
                raise SettingsError("invalid settings:\n  --redis-persecond / REDIS_PERSECOND needs "
                                    "--backend / BACKEND_TYPE=redis")
            if not self.redis_persecond_url.strip():
                raise SettingsError("invalid settings:\n  --redis-persecond / REDIS_PERSECOND needs "
                                    "--redis-persecond-url / REDIS_PERSECOND_URL (the Redis of the per-second limits)")
            try:
                check_url(self.redis_persecond_url, self.redis_persecond_type)
            except ValueError as exc:
                raise SettingsError(f"invalid settings:\n  --redis-persecond-url / REDIS_PERSECOND_URL: {exc}") from exc
        if self.grpc_server_use_tls and not (self.grpc_server_tls_cert and self.grpc_server_tls_key):
            raise SettingsError("--grpc-server-use-tls / GRPC_SERVER_USE_TLS needs --grpc-server-tls-cert / "
                                "GRPC_SERVER_TLS_CERT and --grpc-server-tls-key / GRPC_SERVER_TLS_KEY")
        if self.grpc_client_tls_cacert and not self.grpc_server_use_tls:
            raise SettingsError("--grpc-client-tls-cacert / GRPC_CLIENT_TLS_CACERT (mutual TLS) needs "
                                "--grpc-server-use-tls / GRPC_SERVER_USE_TLS=true")
        if self.grpc_client_tls_san and not self.grpc_client_tls_cacert:
            # without client certificates there is no SAN to check: serving everyone would be silent about it
            raise SettingsError("--grpc-client-tls-san / GRPC_CLIENT_TLS_SAN needs mutual TLS: "
                                "--grpc-client-tls-cacert / GRPC_CLIENT_TLS_CACERT")
        if self.redis_wait_replicas and self.backend_type == "redis":
            if self.redis_type == "cluster":
                raise SettingsError("invalid settings:\n  --redis-wait-replicas / REDIS_WAIT_REPLICAS is not offered "
                                    "with REDIS_TYPE=cluster (only single and sentinel)")
            if self.redis_wait_timeout >= self.redis_timeout:
                raise SettingsError(
                    f"invalid settings:\n  --redis-wait-timeout / REDIS_WAIT_TIMEOUT ({self.redis_wait_timeout:g} s) "
                    f"must be shorter than --redis-timeout / REDIS_TIMEOUT ({self.redis_timeout:g} s): the replicas' "
                    "answer has to arrive within the decision's time")
        if self.use_dog_statsd and self.use_statsd:
            raise SettingsError("invalid settings:\n  --use-dog-statsd / USE_DOG_STATSD and --use-statsd / USE_STATSD "
                                "are two statsd sinks: set one of them (as envoyproxy/ratelimit asks)")
        if bool(self.redis_tls_client_cert) != bool(self.redis_tls_client_key):
            raise SettingsError("REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY go together")
        if self.uses_xds:
            self._check_xds()
        if self.workers > MAX_WORKERS:
            raise SettingsError(f"invalid settings:\n  --workers / WORKERS: {self.workers} is more than "
                                f"{MAX_WORKERS}; one worker per core is the most that helps")
        if self.workers > 1:
            if self.backend_type == "memory":
                raise SettingsError("invalid settings:\n  --workers / WORKERS above 1 needs the Redis backend: the "
                                    "memory backend's limits would be split between the processes")
            ports = {"--grpc-port / GRPC_PORT": self.grpc_port, "--http-port / PORT": self.http_port,
                     "--debug-port / DEBUG_PORT": self.debug_port}
            if self.prometheus_listener is not None:
                ports["--prometheus-addr / PROMETHEUS_ADDR"] = self.prometheus_listener[1]
            for name, port in ports.items():
                if port == 0:
                    raise SettingsError(f"invalid settings:\n  --workers / WORKERS above 1 needs a fixed port: {name} "
                                        "is 0 (any port), which would give each worker a different one")

    def _check_xds(self) -> None:
        if bool(self.config_grpc_xds_client_tls_cert) != bool(self.config_grpc_xds_client_tls_key):
            raise SettingsError("invalid settings:\n  CONFIG_GRPC_XDS_CLIENT_TLS_CERT and "
                                "CONFIG_GRPC_XDS_CLIENT_TLS_KEY go together")
        tls_files = (self.config_grpc_xds_client_tls_cert or self.config_grpc_xds_server_tls_cacert
                     or self.config_grpc_xds_server_tls_san)
        if tls_files and not self.config_grpc_xds_server_use_tls:
            raise SettingsError("invalid settings:\n  CONFIG_GRPC_XDS_CLIENT_TLS_CERT, _SERVER_TLS_CACERT and "
                                "_SERVER_TLS_SAN need --config-grpc-xds-server-use-tls / "
                                "CONFIG_GRPC_XDS_SERVER_USE_TLS=true")
        if not self.config_grpc_xds_server_url.strip():
            raise SettingsError("invalid settings:\n  --config-grpc-xds-server-url / CONFIG_GRPC_XDS_SERVER_URL "
                                "must name the xDS server (host:port) with CONFIG_TYPE=GRPC_XDS_SOTW")
        if self.xds_client_backoff_max_interval < self.xds_client_backoff_initial_interval:
            raise SettingsError("invalid settings:\n  --xds-client-backoff-max-interval / "
                                "XDS_CLIENT_BACKOFF_MAX_INTERVAL must be at least XDS_CLIENT_BACKOFF_INITIAL_INTERVAL")
        if self.workers > 1:
            raise SettingsError("invalid settings:\n  --workers / WORKERS above 1 is not offered with "
                                "CONFIG_TYPE=GRPC_XDS_SOTW (each worker would hold a stream of its own)")

    @property
    def config_path(self) -> Path:
        """The directory of the YAML files: CONFIG_DIR, else RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY."""
        if self.config_dir:
            return Path(self.config_dir)
        return Path(self.runtime_root, self.runtime_subdirectory, self.runtime_appdirectory)
