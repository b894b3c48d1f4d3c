"""envoyproxy/ratelimit's environment variables, each accounted for. A variable slidegate reads as a setting
(slidegate.settings.SPECS: same name, same meaning) is supported; every other one is in ``UNREAD`` with what
slidegate does about it and why. `slidegate serve` names each one that is set in one start-up line, so that an
operator who moves their environment over learns what it no longer does. tests/test_reference_env.py keeps the
two lists whole and apart, and docs/migrating.md shows them.

The list is the reference's newest src/settings/settings.go stored for us, with PROTO of earlier versions and
QUOTA_MODE; ``GATEWAY_VARIABLES`` are those Envoy Gateway sets that the reference does not read.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass


class Handling(enum.Enum):
    """What slidegate does with a variable it does not read."""

    MAPPED = "mapped"  # what the variable asks for is done another way, or always
    IGNORED = "ignored"  # it has no effect here


@dataclass(frozen=True, slots=True)
class Unread:
    handling: Handling
    why: str


REFERENCE_VARIABLES = (
    "PROTO", "HOST", "PORT", "DEBUG_HOST", "DEBUG_PORT", "GRPC_UDS", "GRPC_HOST", "GRPC_PORT",
    "GRPC_MAX_CONNECTION_AGE", "GRPC_MAX_CONNECTION_AGE_GRACE", "GRPC_SERVER_USE_TLS", "GRPC_SERVER_TLS_CERT",
    "GRPC_SERVER_TLS_KEY", "GRPC_CLIENT_TLS_CACERT", "GRPC_CLIENT_TLS_SAN", "LOG_LEVEL", "LOG_FORMAT", "CONFIG_TYPE",
    "FORCE_START_WITHOUT_INITIAL_CONFIG", "CONFIG_GRPC_XDS_NODE_ID", "CONFIG_GRPC_XDS_NODE_METADATA",
    "CONFIG_GRPC_XDS_SERVER_URL", "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
    "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "CONFIG_GRPC_XDS_SERVER_USE_TLS", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
    "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
    "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "XDS_CLIENT_BACKOFF_MAX_INTERVAL", "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
    "XDS_CLIENT_BACKOFF_JITTER", "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "USE_DOG_STATSD", "USE_DOG_STATSD_MOGRIFIERS",
    "USE_STATSD", "STATSD_HOST",
    "STATSD_PORT", "EXTRA_TAGS", "STATS_FLUSH_INTERVAL", "DISABLE_STATS", "USE_PROMETHEUS", "PROMETHEUS_ADDR",
    "PROMETHEUS_PATH", "PROMETHEUS_MAPPER_YAML", "RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY",
    "RUNTIME_IGNOREDOTFILES", "RUNTIME_WATCH_ROOT", "EXPIRATION_JITTER_MAX_SECONDS", "LOCAL_CACHE_SIZE_IN_BYTES",
    "NEAR_LIMIT_RATIO", "CACHE_KEY_PREFIX", "BACKEND_TYPE", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
    "LIMIT_RESPONSE_HEADERS_ENABLED", "LIMIT_LIMIT_HEADER", "LIMIT_REMAINING_HEADER", "LIMIT_RESET_HEADER",
    "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "REDIS_SOCKET_TYPE", "REDIS_TYPE", "REDIS_URL", "REDIS_POOL_SIZE",
    "REDIS_AUTH", "REDIS_TLS", "REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_KEY", "REDIS_TLS_CACERT",
    "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "REDIS_PIPELINE_WINDOW", "REDIS_PIPELINE_LIMIT",
    "REDIS_USE_EXPLICIT_PIPELINE", "REDIS_PERSECOND",
    "REDIS_PERSECOND_SOCKET_TYPE", "REDIS_PERSECOND_TYPE", "REDIS_PERSECOND_URL", "REDIS_PERSECOND_POOL_SIZE",
    "REDIS_PERSECOND_AUTH", "REDIS_PERSECOND_TLS", "REDIS_SENTINEL_AUTH", "REDIS_PERSECOND_SENTINEL_AUTH",
    "REDIS_PERSECOND_PIPELINE_WINDOW", "REDIS_PERSECOND_PIPELINE_LIMIT", "REDIS_PERSECOND_USE_EXPLICIT_PIPELINE",
    "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "REDIS_TIMEOUT", "REDIS_PERSECOND_TIMEOUT", "REDIS_POOL_ON_EMPTY_BEHAVIOR",
    "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", "MEMCACHE_HOST_PORT", "MEMCACHE_MAX_IDLE_CONNS", "MEMCACHE_SRV",
    "MEMCACHE_SRV_REFRESH", "MEMCACHE_TLS", "MEMCACHE_TLS_CLIENT_CERT", "MEMCACHE_TLS_CLIENT_KEY",
    "MEMCACHE_TLS_CACERT", "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", "SHADOW_MODE", "QUOTA_MODE",
    "RESPONSE_DYNAMIC_METADATA",
    "MERGE_DOMAIN_CONFIG", "TRACING_ENABLED", "TRACING_SERVICE_NAME", "TRACING_SERVICE_NAMESPACE",
    "TRACING_SERVICE_INSTANCE_ID", "TRACING_EXPORTER_PROTOCOL", "TRACING_SAMPLING_RATE",
)

# set by Envoy Gateway on its rate-limit Deployment, and read by no envoyproxy/ratelimit version (whose CA of
# client certificates is GRPC_CLIENT_TLS_CACERT): a drop-in there meets them, so they are accounted for too
GATEWAY_VARIABLES = ("GRPC_SERVER_TLS_CA_CERT",)

_MEMCACHE = Unread(Handling.IGNORED, "there is no memcached backend (BACKEND_TYPE=memcache is refused: memcached "
                                     "cannot decide several limits at once, atomically)")

UNREAD: dict[str, Unread] = {
    "PROTO": Unread(Handling.IGNORED, "every listener is TCP"),
    "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL": Unread(Handling.MAPPED, "the wait before redialling the xDS "
                                                                            "server is XDS_CLIENT_BACKOFF_* (as in "
                                                                            "the reference's newer versions)"),
    # the reference turns its statsd names into Prometheus ones through statsd_exporter's mapping rules; slidegate
    # counts in Prometheus directly, so there are no statsd names for such rules to map
    "PROMETHEUS_MAPPER_YAML": Unread(Handling.MAPPED, "the Prometheus names are fixed, slidegate's own "
                                                      "(ratelimit_service_rate_limit_total_hits_total{domain,key} …): "
                                                      "its metrics are not statsd names passed through "
                                                      "statsd_exporter's mapping rules; statsd gets the reference's "
                                                      "names"),
    "RUNTIME_IGNOREDOTFILES": Unread(Handling.MAPPED, "always: hidden files never load"),
    "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION": Unread(Handling.MAPPED, "always: health checks include the storage"),
    "REDIS_USE_EXPLICIT_PIPELINE": Unread(Handling.MAPPED, "calls that arrive while others are at Redis always go "
                                                           "together in the next round trip"),
    "REDIS_PERSECOND_USE_EXPLICIT_PIPELINE": Unread(Handling.MAPPED, "see REDIS_USE_EXPLICIT_PIPELINE"),
    "REDIS_PERSECOND_TIMEOUT": Unread(Handling.MAPPED, "REDIS_TIMEOUT serves both Redis"),
    "REDIS_POOL_ON_EMPTY_BEHAVIOR": Unread(Handling.MAPPED, "always WAIT: a call waits for a connection, within "
                                                            "REDIS_TIMEOUT"),
    "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR": Unread(Handling.MAPPED, "see REDIS_POOL_ON_EMPTY_BEHAVIOR"),
    "MEMCACHE_HOST_PORT": _MEMCACHE,
    "MEMCACHE_MAX_IDLE_CONNS": _MEMCACHE,
    "MEMCACHE_SRV": _MEMCACHE,
    "MEMCACHE_SRV_REFRESH": _MEMCACHE,
    "MEMCACHE_TLS": _MEMCACHE,
    "MEMCACHE_TLS_CLIENT_CERT": _MEMCACHE,
    "MEMCACHE_TLS_CLIENT_KEY": _MEMCACHE,
    "MEMCACHE_TLS_CACERT": _MEMCACHE,
    "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION": _MEMCACHE,
    "GRPC_SERVER_TLS_CA_CERT": Unread(Handling.IGNORED, "Envoy Gateway sets it, and envoyproxy/ratelimit reads no "
                                                        "such variable (client certificates are asked for with "
                                                        "GRPC_CLIENT_TLS_CACERT): the gRPC listener does TLS without "
                                                        "client certificates, there as here"),
}


_NOTHING = ("", "false", "0", "no", "off")


def unread_line(environ: Mapping[str, str]) -> str | None:
    """The start-up line naming every set variable of ``UNREAD``, each with its reason; None when none is."""
    # set to nothing, or off (TRACING_ENABLED=false, the reference's own default), it asks for nothing either
    told = [f"{name} ({UNREAD[name].handling.value}: {UNREAD[name].why})"
            for name in REFERENCE_VARIABLES + GATEWAY_VARIABLES
            if name in UNREAD and environ.get(name, "").strip().lower() not in _NOTHING]
    if not told:
        return None
    return "envoyproxy/ratelimit settings this service does not read: " + "; ".join(told)
