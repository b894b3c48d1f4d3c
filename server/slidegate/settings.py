"""Every setting of ``slidegate serve``: one typed object, read from environment variables and overridable by
command-line flags (a flag wins over its variable, which wins over the default).

Each setting is declared once, as a field of Settings (or of a section, slidegate.redis_target.RedisTarget) with
its variable, flag, default, parser and help (slidegate.setting_spec); SPECS lists them. Names follow
envoyproxy/ratelimit where it has the setting (``REDIS_URL``, ``GRPC_PORT``, ``RUNTIME_ROOT`` …);
docs/configuration.md's settings table lists them all and a test keeps it equal to ``SPECS``.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slidegate.algorithms import Algorithm
from slidegate.cache_sizes import DEFAULT_MAX_BYTES, ENTRY_BYTES
from slidegate.failure_modes import FailureMode
from slidegate.headers import HeaderNames, ResponseHeaders
from slidegate.limited_settings import TopLimitedSettings
from slidegate.redis_checks import check_redis, redis_leftovers
from slidegate.redis_target import HashTag, RedisTarget
from slidegate.setting_parsers import (
    BackendType,
    ConfigType,
    duration_text,
    enum_choice,
    parse_backend_type,
    parse_bool,
    parse_config_type,
    parse_connection_age,
    parse_drain,
    parse_duration,
    parse_flush_interval,
    parse_header_name,
    parse_jitter,
    parse_listen_address,
    parse_log_level,
    parse_message_size,
    parse_names,
    parse_optional_bool,
    parse_optional_header_name,
    parse_port,
    parse_positive_int,
    parse_ratio,
    parse_settle,
    parse_timeout,
    parse_url_path,
    parse_wait_replicas,
    parse_wait_timeout,
    parse_whole,
)
from slidegate.setting_spec import SettingsError, Spec, assemble, section, setting, specs
from slidegate.statsd import Transport, parse_pairs
from slidegate.tracing_settings import TracingSettings
from slidegate.xds_settings import XdsClientSettings

__all__ = ["DEFAULT_MAX_RECV_MSG_SIZE", "SPECS", "Settings", "SettingsError", "Spec"]

DEFAULT_MAX_RECV_MSG_SIZE = 4 * 1024 * 1024  # bytes: gRPC's own default, as envoyproxy/ratelimit's
MAX_WORKERS = 128  # each worker is a whole Python process (~70 MB)


class LogFormat(enum.StrEnum):
    """LOG_FORMAT."""

    TEXT = "text"
    JSON = "json"  # a JSON object a line


@dataclass(frozen=True, slots=True)
class Settings:
    """The parsed settings (times in seconds). Build with ``Settings.load``."""

    config_dir: str = setting(
        "CONFIG_DIR", "", str,
        "directory of rate-limit YAML files; empty: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY",
        flag="--config")
    runtime_root: str = setting("RUNTIME_ROOT", "/srv/runtime_data/current", str,
        "root of the runtime directory (envoyproxy/ratelimit's layout)")
    runtime_subdirectory: str = setting("RUNTIME_SUBDIRECTORY", "", str,
        "subdirectory of RUNTIME_ROOT")
    runtime_appdirectory: str = setting("RUNTIME_APPDIRECTORY", "config", str,
        "directory of the YAML files inside RUNTIME_ROOT/RUNTIME_SUBDIRECTORY")
    runtime_watch_root: bool = setting("RUNTIME_WATCH_ROOT", "true", parse_bool,
        "watch the config directory's parent too, so a swapped symlink (Kubernetes ConfigMap) is seen")
    config_settle_time: float = setting("CONFIG_SETTLE_TIME", "500ms", parse_settle,
        "a changed config file is loaded once no config file has changed for this long (0: at once), so that "
        "one written in parts never loads half written (a finished file renamed into place is always whole)")
    backend_type: BackendType = setting(  # noqa: RUF009 - setting() is a dataclasses.field
        "BACKEND_TYPE", "redis", parse_backend_type,
        "redis (shared by every replica) or memory (this process only)", flag="--backend")
    redis: RedisTarget = section(RedisTarget, "REDIS_")  # noqa: RUF009 - section() is a dataclasses.field
    redis_hash_tag: HashTag = setting(  # noqa: RUF009 - setting() is a dataclasses.field
        "REDIS_HASH_TAG", "limit", enum_choice(HashTag),
        "what shares a Redis Cluster slot: limit (each limit its own; a request spanning slots is one call "
        "per slot, undone where it admitted when another rejects) or domain (a whole domain in one slot: every "
        "request one call)")
    redis_tls_cacert: str = setting("REDIS_TLS_CACERT", "", str,
        "CA bundle to verify Redis's certificate (empty: the system's)")
    redis_tls_client_cert: str = setting("REDIS_TLS_CLIENT_CERT", "", str,
        "client certificate for Redis (mutual TLS)")
    redis_tls_client_key: str = setting("REDIS_TLS_CLIENT_KEY", "", str,
        "key of REDIS_TLS_CLIENT_CERT")
    redis_tls_skip_hostname_verification: bool = setting("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "false", parse_bool,
        "accept a Redis certificate for another host name")
    failure_mode: FailureMode = setting(  # noqa: RUF009 - setting() is a dataclasses.field
        "FAILURE_MODE", FailureMode.ERROR.value, enum_choice(FailureMode),
        "when the storage cannot decide: error (UNAVAILABLE, Envoy's failure_mode_deny decides), allow, deny, "
        "or local (in memory, each limit divided by LOCAL_LIMIT_REPLICAS); a domain's failure_mode wins")
    local_limit_replicas: int = setting("LOCAL_LIMIT_REPLICAS", "1", parse_positive_int,
        "slidegate replicas sharing the limits, for FAILURE_MODE=local")
    redis_timeout: float = setting("REDIS_TIMEOUT", "250ms", parse_timeout,
        "time allowed for one decision (250ms, 0.25s, 1m …; a bare number is seconds), 1 ms to 60 s; the "
        "caller's deadline caps it")
    redis_wait_replicas: int = setting("REDIS_WAIT_REPLICAS", "0", parse_wait_replicas,
        "single (with replicas) and sentinel: after each script call, Redis WAIT for its writes to reach this "
        "many replicas (at most 1000); a call they did not reach in time gets the failure mode; 0: off")
    redis_wait_timeout: float = setting("REDIS_WAIT_TIMEOUT", "50ms", parse_wait_timeout,
        "how long REDIS_WAIT_REPLICAS waits (rounded up to whole ms), at least 1 ms and shorter than "
        "REDIS_TIMEOUT")
    redis_persecond: bool = setting("REDIS_PERSECOND", "false", parse_bool,
        "keep the limits of one second (unit second, unit_multiplier 1) in a Redis of their own, "
        "REDIS_PERSECOND_URL; a request with limits in both is still decided all-or-nothing")
    # the per-second Redis: each setting's help points at the main Redis's
    persecond_redis: RedisTarget = section(  # noqa: RUF009 - section() is a dataclasses.field
        RedisTarget, "REDIS_PERSECOND_", defaults={"url": ""}, helps={
        "type": "REDIS_TYPE of the per-second Redis",
        "socket_type": "REDIS_SOCKET_TYPE of the per-second Redis",
        "url": "the per-second Redis, in REDIS_URL's forms; needed with REDIS_PERSECOND",
        "auth": "REDIS_AUTH of the per-second Redis",
        "sentinel_auth": "REDIS_SENTINEL_AUTH of the per-second Redis's Sentinels",
        "tls": "connect to the per-second Redis with TLS (the REDIS_TLS_* files serve both Redis)",
        "pool_size": "REDIS_POOL_SIZE of the per-second Redis",
        "pipeline_window": "REDIS_PIPELINE_WINDOW of the per-second Redis: not used either",
        "pipeline_limit": "REDIS_PIPELINE_LIMIT of the per-second Redis: not used either",
    })
    expiration_jitter_max_seconds: int = setting("EXPIRATION_JITTER_MAX_SECONDS", "0",
        parse_jitter, "every Redis key expires up to this many seconds later than it must (a random share, whole ms, "
        "drawn for each key), so that keys written together do not expire together; at most 86400; 0: off")
    local_cache_size_in_bytes: int = setting("LOCAL_CACHE_SIZE_IN_BYTES", str(DEFAULT_MAX_BYTES), parse_whole,
        "memory of each process's over-limit cache (requests known to be over limit are answered without "
        f"Redis), charged {ENTRY_BYTES} bytes a remembered limit plus its key's size; 0: no cache")
    grpc_client_tls_san: str = setting("GRPC_CLIENT_TLS_SAN", "", str,
        "with GRPC_CLIENT_TLS_CACERT: only clients whose certificate carries this SAN (a DNS name, '*.' "
        "wildcards in the certificate matching one label, or an IP address) are served; others get "
        "UNAUTHENTICATED")
    grpc_host: str = setting("GRPC_HOST", "0.0.0.0", str, "address for gRPC", flag="--host")
    grpc_port: int = setting("GRPC_PORT", "8081", parse_port, "gRPC port (0: any free port)")
    grpc_uds: str = setting("GRPC_UDS", "", str,
        "listen for gRPC on this unix socket path instead of GRPC_HOST:GRPC_PORT")
    grpc_max_connection_age: float = setting("GRPC_MAX_CONNECTION_AGE", "24h", parse_connection_age,
        "a client connection is asked to go (GOAWAY) after about this long (gRPC adds +/-10%), so that clients "
        "spread over new replicas; 0: never")
    grpc_max_connection_age_grace: float = setting(
        "GRPC_MAX_CONNECTION_AGE_GRACE", "1h", parse_connection_age,
        "after GRPC_MAX_CONNECTION_AGE, how long its calls in flight may take before it is closed")
    grpc_max_recv_msg_size: int = setting("GRPC_MAX_RECV_MSG_SIZE", str(DEFAULT_MAX_RECV_MSG_SIZE), parse_message_size,
        "largest request accepted, in bytes (larger ones are refused with RESOURCE_EXHAUSTED before they are "
        "read, and Envoy lets them through); the default holds a route's descriptors naming a header or the "
        "path 68 times at Envoy's default 60 KiB header limit: raise it with max_request_headers_kb")
    grpc_server_use_tls: bool = setting("GRPC_SERVER_USE_TLS", "false", parse_bool,
        "serve gRPC over TLS")
    grpc_server_tls_cert: str = setting("GRPC_SERVER_TLS_CERT", "", str,
        "server certificate (PEM); re-read when the file changes")
    grpc_server_tls_key: str = setting("GRPC_SERVER_TLS_KEY", "", str,
        "key of GRPC_SERVER_TLS_CERT")
    grpc_client_tls_cacert: str = setting("GRPC_CLIENT_TLS_CACERT", "", str,
        "CA of client certificates: set, clients must present one it signed (mutual TLS)")
    http_host: str = setting("HOST", "0.0.0.0", str, "address for HTTP (/json, /healthcheck)", flag="--http-host")
    http_port: int = setting("PORT", "8080", parse_port, "HTTP port (0: any free port)", flag="--http-port")
    debug_host: str = setting("DEBUG_HOST", "0.0.0.0", str, "address for /rlconfig, /metrics and /stats")
    debug_port: int = setting("DEBUG_PORT", "6070", parse_port, "debug HTTP port (0: any free port)")
    log_level: str = setting("LOG_LEVEL", "info", parse_log_level,
        "debug, info, warn or error (envoyproxy/ratelimit's trace, fatal and panic too); debug logs one line "
        "per decision")
    log_format: LogFormat = setting(  # noqa: RUF009 - setting() is a dataclasses.field
        "LOG_FORMAT", "text", enum_choice(LogFormat), "text or JSON lines")
    over_limit_log_interval: float = setting("OVER_LIMIT_LOG_INTERVAL", "10s", parse_duration,
        "at most one info line per rule this often, naming the rule, a descriptor it rejected and how many it "
        "rejected since its last line (a request's values are shown); 0: none")
    cache_key_prefix: str = setting("CACHE_KEY_PREFIX", "", str, "prefix of every Redis key")
    default_algorithm: Algorithm = setting(  # noqa: RUF009 - setting() is a dataclasses.field
        "DEFAULT_ALGORITHM", Algorithm.SLIDING_WINDOW_LOG.value, enum_choice(Algorithm),
        "algorithm of limits that name none, and of overrides")
    merge_domain_config: bool = setting("MERGE_DOMAIN_CONFIG", "false", parse_bool,
        "let several files add descriptors to one domain")
    shadow_mode: bool = setting("SHADOW_MODE", "false", parse_bool,
        "evaluate and count every limit but answer OK overall (descriptors keep their codes)")
    quota_mode: bool = setting("QUOTA_MODE", "false", parse_bool,
        "every limit in quota mode (but a shadow_mode rule's): a request is rejected only when all its quota "
        "limits are over, or a limit not in quota mode is")
    stop_cache_key_increment_when_overlimit: bool = setting(
        "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "false", parse_bool,
        "fixed_window: do not count hits of requests that are over limit")
    response_dynamic_metadata: bool = setting("RESPONSE_DYNAMIC_METADATA", "false", parse_bool,
        "describe the request and matched rules' metadata in dynamic_metadata")
    negative_hits_enabled: bool = setting("NEGATIVE_HITS_ENABLED", "false", parse_bool,
        "accept is_negative_hits (a descriptor giving hits back); refused with INVALID_ARGUMENT otherwise, since "
        "anyone who reaches the port could empty any counter (docs/security.md)")
    limit_override_enabled: bool = setting("LIMIT_OVERRIDE_ENABLED", "true", parse_bool,
        "accept a descriptor's own limit (Envoy's RateLimit.limit), as envoyproxy/ratelimit does; refused with "
        "INVALID_ARGUMENT otherwise (docs/security.md)")
    json_endpoint_enabled: bool = setting("JSON_ENDPOINT_ENABLED", "true", parse_bool,
        "serve POST /json (ShouldRateLimit in JSON) on the HTTP port")
    near_limit_ratio: float = setting("NEAR_LIMIT_RATIO", "0.8", parse_ratio,
        "a hit past this share of a limit counts as near_limit in the metrics")
    limit_response_headers_enabled: bool = setting(
        "LIMIT_RESPONSE_HEADERS_ENABLED", "false", parse_bool,
        "add RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset to answers, for the descriptor closest to its "
        "limit")
    limit_response_headers_ietf: bool = setting("LIMIT_RESPONSE_HEADERS_IETF", "false",
        parse_bool, "tell the limit in the IETF draft's form (10, 10;w=60) and add its RateLimit-Policy and RateLimit "
        "fields, and Retry-After when over limit")
    limit_limit_header: str = setting("LIMIT_LIMIT_HEADER", "RateLimit-Limit", parse_header_name,
        "name of the header telling the limit")
    limit_remaining_header: str = setting("LIMIT_REMAINING_HEADER", "RateLimit-Remaining",
        parse_header_name, "name of the header telling the hits remaining")
    limit_reset_header: str = setting("LIMIT_RESET_HEADER", "RateLimit-Reset", parse_header_name,
        "name of the header telling the seconds until reset")
    limit_rule_header: str = setting("LIMIT_RULE_HEADER", "", parse_optional_header_name,
        "name of a header naming, on an over-limit answer, the rules that rejected it (their YAML name, else their "
        "key path); empty: none. It tells clients your rules' names")
    use_prometheus: bool = setting("USE_PROMETHEUS", "true", parse_bool, "serve metrics on /metrics")
    prometheus_addr: tuple[str, int] | None = setting("PROMETHEUS_ADDR", "", parse_listen_address,
        "a listener of its own for the metrics, host:port (:port: every address), serving only PROMETHEUS_PATH; "
        "empty: none (the metrics are on /metrics of the HTTP and debug ports either way); with USE_PROMETHEUS")
    prometheus_path: str = setting("PROMETHEUS_PATH", "/metrics", parse_url_path,
        "the path of the metrics on PROMETHEUS_ADDR's listener")
    use_statsd: bool | None = setting("USE_STATSD", "", parse_optional_bool,
        "send stats to statsd as envoyproxy/ratelimit does (its default sink); empty: on when STATSD_HOST is set")
    statsd_host: str = setting("STATSD_HOST", "", str,
        "statsd (or DogStatsD) host; empty with USE_STATSD=true or USE_DOG_STATSD=true: localhost")
    statsd_port: int = setting("STATSD_PORT", "8125", parse_port, "statsd (or DogStatsD) port")
    statsd_protocol: Transport = setting(  # noqa: RUF009 - setting() is a dataclasses.field
        "STATSD_PROTOCOL", Transport.TCP.value, enum_choice(Transport),
        "tcp (as the reference's gostats client) or udp; DogStatsD is always sent over udp")
    extra_tags: tuple[tuple[str, str], ...] = setting("EXTRA_TAGS", "", parse_pairs,
        "tags on every stat, k1:v1,k2:v2 (statsd: in the name as .__k1=v1; DogStatsD: as tags)")
    stats_flush_interval: float = setting("STATS_FLUSH_INTERVAL", "10s", parse_flush_interval,
        "how often counters are sent to statsd (timers: every second)")
    disable_stats: bool = setting("DISABLE_STATS", "false", parse_bool,
        "send and serve no stats: no statsd, no /metrics")
    use_dog_statsd: bool = setting("USE_DOG_STATSD", "false", parse_bool,
        "send stats to DogStatsD (tags as its tags, not in the name) instead of plain statsd")
    use_dog_statsd_mogrifiers: tuple[str, ...] = setting("USE_DOG_STATSD_MOGRIFIERS", "", parse_names,
        "DogStatsD mogrifiers to apply, first match wins, each defined by DOG_STATSD_MOGRIFIER_(name)_PATTERN, "
        "_NAME and _TAGS")
    drain_timeout: float = setting("DRAIN_TIMEOUT", "10s", parse_drain,
        "after SIGTERM, how long in-flight calls may take")
    rlqs_max_buckets_per_stream: int = setting("RLQS_MAX_BUCKETS_PER_STREAM", "10000",
        parse_positive_int, "Rate Limit Quota Service: buckets one Envoy stream may hold; further buckets are denied")
    workers: int = setting("WORKERS", "1", parse_positive_int,
        "processes serving the same ports (SO_REUSEPORT), each with its own event loop; Redis backend only")
    healthy_with_at_least_one_config_loaded: bool = setting(
        "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "false", parse_bool,
        "not serving (health checks) while no config file has loaded a domain")
    config_type: ConfigType = setting(  # noqa: RUF009 - setting() is a dataclasses.field
        "CONFIG_TYPE", "FILE", parse_config_type,
        "where the limits come from: FILE, the YAML files of the config directory; GRPC_XDS_SOTW, an xDS server "
        "(ADS, state of the world) at CONFIG_GRPC_XDS_SERVER_URL")
    force_start_without_initial_config: bool = setting("FORCE_START_WITHOUT_INITIAL_CONFIG", "false", parse_bool,
        "GRPC_XDS_SOTW: listen before the first config came (every call is refused until it does); false: wait "
        "for it")
    xds: XdsClientSettings = section(XdsClientSettings, "")  # noqa: RUF009 - section() is a dataclasses.field
    tracing: TracingSettings = section(TracingSettings, "TRACING_")  # noqa: RUF009 - section() is a dataclasses.field
    top_limited: TopLimitedSettings = section(  # noqa: RUF009 - section() is a dataclasses.field
        TopLimitedSettings, "TOP_LIMITED_")

    @property
    def uses_xds(self) -> bool:
        """Whether the limits come from an xDS server (CONFIG_TYPE=GRPC_XDS_SOTW), not from files."""
        return self.config_type is ConfigType.GRPC_XDS_SOTW

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
        given: list[tuple[str, str]] = []
        for prefix, target in (("REDIS_", self.redis), ("REDIS_PERSECOND_", self.persecond_redis)):
            given += [(f"{prefix}PIPELINE_WINDOW", duration_text(target.pipeline_window)),
                      (f"{prefix}PIPELINE_LIMIT", str(target.pipeline_limit))]
        return [f"{name}={text}" for name, text in given if text not in ("0", "0us")]

    def leftovers(self) -> list[str]:
        """A line for each setting given that has no effect, saying why, which the start-up logs."""
        return redis_leftovers(self)

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
        """Settings from ``flags`` (Spec.field → text, None = not given), else ``environ``, else the defaults.
        Raises SettingsError listing every malformed value."""
        values: dict[tuple[str, ...], Any] = {}
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
                values[spec.path] = spec.parse(text)
            except ValueError as exc:
                problems.append(f"{spec.flag} / {spec.env} (from the {source}): {exc}")
        if problems:
            raise SettingsError("invalid settings:\n  " + "\n  ".join(problems))
        settings: Settings = assemble(cls, values)
        settings = dataclasses.replace(settings, redis=settings.redis.whole(),
                                       persecond_redis=settings.persecond_redis.whole())
        settings.check()
        return settings

    def check(self) -> None:
        """Raise SettingsError for settings that only make sense together, and for a malformed Redis URL."""
        self._check_grpc()
        check_redis(self)
        if self.use_dog_statsd and self.use_statsd:
            raise SettingsError("invalid settings:\n  --use-dog-statsd / USE_DOG_STATSD and --use-statsd / USE_STATSD "
                                "are two statsd sinks: set one of them (as envoyproxy/ratelimit asks)")
        if self.uses_xds:
            self.xds.check()
            if self.workers > 1:
                raise SettingsError("invalid settings:\n  --workers / WORKERS above 1 is not offered with "
                                    "CONFIG_TYPE=GRPC_XDS_SOTW (each worker would hold a stream of its own)")
        self._check_workers()

    def _check_grpc(self) -> None:
        if self.grpc_uds and self.workers > 1:
            raise SettingsError("--grpc-uds / GRPC_UDS cannot be shared by --workers / WORKERS > 1: workers share "
                                "TCP ports only")
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

    def _check_workers(self) -> None:
        if self.workers > MAX_WORKERS:
            raise SettingsError(f"invalid settings:\n  --workers / WORKERS: {self.workers} is more than "
                                f"{MAX_WORKERS}; one worker per core is the most that helps")
        if self.workers <= 1:
            return
        if self.backend_type is BackendType.MEMORY:
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

    @property
    def config_path(self) -> Path:
        """The directory of the YAML files: CONFIG_DIR, else RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY."""
        if self.config_dir:
            return Path(self.config_dir)
        return Path(self.runtime_root, self.runtime_subdirectory, self.runtime_appdirectory)


SPECS: tuple[Spec, ...] = specs(Settings)

