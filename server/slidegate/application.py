"""One slidegate, built from its Settings: the config (in a holder, for reloads), the metrics, the storage, the
limiter and the service (and, for `slidegate serve`, the statsd sink). `slidegate serve`, the in-process limiter
(slidegate.inprocess) and the tests all build it here, so that every setting is read in one place and means the
same thing everywhere."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from slidegate.backends.base import Backend
from slidegate.backends.blocked import OverLimitCache
from slidegate.backends.breaker import Breaker
from slidegate.backends.memory import MemoryBackend
from slidegate.backends.persecond import PerSecondBackend
from slidegate.backends.redis import RedisBackend, TlsOptions, Topology
from slidegate.config import Config, LoadOptions, load_directory
from slidegate.failure_modes import FailureMode
from slidegate.heap import Heap
from slidegate.limiter import Limiter, LimiterOptions
from slidegate.metrics import Metrics
from slidegate.overlimit_log import OverLimitLog
from slidegate.quotas.fallback import Fallback
from slidegate.quotas.ledger import SLACK_MS
from slidegate.quotas.service import QuotaService
from slidegate.quotas.storage import MemoryQuotas, QuotaStorage, RedisQuotas
from slidegate.redis_target import HashTag, RedisTarget, RedisType
from slidegate.reload import ConfigHolder
from slidegate.request import RequestPolicy
from slidegate.service import AnswerOptions, RateLimitService
from slidegate.setting_parsers import BackendType
from slidegate.settings import Settings
from slidegate.stats import StatsStore
from slidegate.statsd import LineFormat, StatsdSink, Transport, mogrifiers_from_env


@dataclass(frozen=True, slots=True)
class Application:
    """What ``build`` made. ``backend`` is the limiter's storage, ``quotas`` the Rate Limit Quota Service with its
    own (close both when done)."""

    settings: Settings
    load_options: LoadOptions
    holder: ConfigHolder
    metrics: Metrics
    backend: Backend
    limiter: Limiter
    service: RateLimitService
    quotas: QuotaService

    def needs_storage(self) -> bool:
        """Whether answering needs the storage: False while a failure mode (the deployment's or every
        domain's) answers without it, so that health checks do not take such a replica out of service."""
        return self.settings.failure_mode is FailureMode.ERROR and all(
            d.failure_mode in (None, FailureMode.ERROR) for d in self.holder.current.domains.values())


def build(settings: Settings, *, clock: Callable[[], int] | None = None, heap: Heap | None = None,
          backend: Backend | None = None) -> Application:
    """The application ``settings`` describe. ``clock`` (microseconds) and ``backend`` (storage other than the
    settings') are for tests; ``heap``: the process's heap keeper (`slidegate serve` only, see slidegate.heap).
    Raises ConfigError for an invalid config and ValueError for a malformed Redis URL or a TLS file that does
    not exist."""
    load = LoadOptions(merge_domains=settings.merge_domain_config, default_algorithm=settings.default_algorithm)
    # config over xDS: none until the server sends it (slidegate.xds puts it in the holder and counts it)
    holder = ConfigHolder(Config(domains={}, loaded=False) if settings.uses_xds else
                          load_directory(settings.config_path, load))
    # timers' values are kept only for a statsd sink to take (slidegate.server starts it)
    metrics = Metrics(settings.near_limit_ratio, StatsStore(keep_timers=settings.statsd_enabled))
    if not settings.uses_xds:
        metrics.config_load_success.inc()
    backend = make_backend(settings) if backend is None else backend
    limiter = Limiter(lambda: holder.current, backend, LimiterOptions(
        key_prefix=settings.cache_key_prefix, default_algorithm=settings.default_algorithm,
        stop_when_over=settings.stop_cache_key_increment_when_overlimit, shadow_mode=settings.shadow_mode,
        quota_mode=settings.quota_mode,
        failure_mode=settings.failure_mode, local_replicas=settings.local_limit_replicas,
        domain_slot=settings.redis_hash_tag is HashTag.DOMAIN,
    ), clock=clock)
    service = RateLimitService(limiter, AnswerOptions(
        dynamic_metadata=settings.response_dynamic_metadata, headers=settings.response_headers,
        header_names=settings.header_names, rule_header=settings.limit_rule_header,
    ), metrics, heap, RequestPolicy(negative_hits=settings.negative_hits_enabled,
                                    limit_overrides=settings.limit_override_enabled))
    if settings.over_limit_log_interval > 0:
        service.decider.watch(OverLimitLog(settings.over_limit_log_interval))
    quotas = QuotaService(limiter, make_quota_storage(settings), metrics.registry,
                          max_buckets=settings.rlqs_max_buckets_per_stream,
                          fallback=Fallback(settings.failure_mode, settings.local_limit_replicas))
    return Application(settings, load, holder, metrics, backend, limiter, service, quotas)


def make_quota_storage(settings: Settings) -> QuotaStorage:
    """Where the quota ledgers live: the main Redis (whatever REDIS_PERSECOND says: a ledger is one key), or
    this process's memory."""
    if settings.backend_type is BackendType.MEMORY:
        return MemoryQuotas()
    # a report is rare, so it may wait longer than a decision; but the ledger allows its answer SLACK_MS to reach
    # Envoy, and a script that ran just before its call timed out counts from when it ran
    timeout = min(settings.redis_timeout * 4, SLACK_MS / 2000)
    # the breaker as the decisions' (one per Redis client): a dead Redis costs a report microseconds, not a timeout
    return RedisQuotas(_topology(settings, settings.redis), timeout=timeout, breaker=Breaker())


def make_statsd_sink(settings: Settings, store: StatsStore, environ: Mapping[str, str]) -> StatsdSink | None:
    """The statsd sink the settings ask for (None: none), sending ``store``'s stats; ``environ`` holds the
    DogStatsD mogrifiers' definitions (DOG_STATSD_MOGRIFIER_<NAME>_*). Raises ValueError for a malformed
    mogrifier."""
    if not settings.statsd_enabled:
        return None
    dog = settings.use_dog_statsd
    mogrifiers = mogrifiers_from_env(settings.use_dog_statsd_mogrifiers, environ) if dog else ()
    # DogStatsD is UDP only, as the reference's datadog-go client sends it
    transport = Transport.UDP if dog else settings.statsd_protocol
    return StatsdSink(store, settings.statsd_host or "localhost", settings.statsd_port, transport,
                      settings.stats_flush_interval,
                      LineFormat(dog=dog, extra_tags=settings.extra_tags, mogrifiers=mogrifiers))


def make_backend(settings: Settings, traced: Callable[[Backend, str], Backend] | None = None) -> Backend:
    """The storage backend the settings ask for; ``traced`` wraps the storage itself (below the over-limit
    cache, whose answers are no storage call), given its kind (slidegate.tracing). Raises ValueError for a
    malformed Redis URL (the settings' check refuses a TLS file that does not exist, where TLS is used)."""
    if settings.backend_type is BackendType.MEMORY:
        return traced(MemoryBackend(), "memory") if traced is not None else MemoryBackend()
    main = _redis(settings, settings.redis, settings.redis_wait_replicas)
    backend: Backend = main
    if settings.redis_persecond:
        # REDIS_WAIT_REPLICAS is the main Redis's: a per-second Redis is often a lone node, and a failover loses
        # at most a second's worth of counts there
        backend = PerSecondBackend(main, _redis(settings, settings.persecond_redis, 0))
    if traced is not None:
        backend = traced(backend, f"redis {settings.redis.type}" + (
            f", per second: redis {settings.persecond_redis.type}" if settings.redis_persecond else ""))
    if not settings.local_cache_size_in_bytes:
        return backend
    # the cache: a request that can only be rejected costs no round trip (one cache for both Redis of
    # REDIS_PERSECOND: a limit's key is kept in one of them only, so two caches would hold the same entries)
    return OverLimitCache(backend, max_bytes=settings.local_cache_size_in_bytes)


def _redis(settings: Settings, target: RedisTarget, wait_replicas: int) -> RedisBackend:
    """One Redis: the main one (REDIS_*) or the per-second one (REDIS_PERSECOND_*), which share the TLS files,
    the timeout and the expiry jitter, as in envoyproxy/ratelimit."""
    topology = _topology(settings, target)
    # the breaker, one per Redis: a dead Redis costs microseconds per call, not a timeout each, and only to the
    # calls that need it
    return RedisBackend(topology, timeout=settings.redis_timeout, pool_size=target.pool_size, breaker=Breaker(),
                        wait_replicas=wait_replicas, wait_timeout=settings.redis_wait_timeout,
                        expiry_jitter=settings.expiration_jitter_max_seconds)


def _topology(settings: Settings, target: RedisTarget) -> Topology:
    """Where one Redis is, with its TLS files and credentials."""
    url = target.url
    if target.type is RedisType.SINGLE and target.tls and url.startswith("redis://"):
        url = "rediss://" + url.removeprefix("redis://")
    tls = None
    if target.tls or url.startswith("rediss://"):
        tls = TlsOptions(settings.redis_tls_cacert, settings.redis_tls_client_cert, settings.redis_tls_client_key,
                         check_hostname=not settings.redis_tls_skip_hostname_verification)
    return Topology(target.type, url, tls=tls, auth=_auth(target.auth), sentinel_auth=_auth(target.sentinel_auth))


def _auth(text: str) -> tuple[str | None, str] | None:
    """REDIS_AUTH's forms: a password, or user:password (an ACL user); given apart from the URL, never
    quoted into it."""
    user, sep, password = text.partition(":")
    return (user, password) if sep else (None, text) if text else None
