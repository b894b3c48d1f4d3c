"""The Redis settings taken together: what is refused at start (SettingsError naming each setting's flag and
variable), and what is accepted with a warning at start because it has no effect. The warnings are not refusals:
envoyproxy/ratelimit ignores these settings in silence (it reads the REDIS_TLS_* files only with REDIS_TLS, the
per-second URL only with REDIS_PERSECOND), so the configs that move from it carry such leftovers."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from slidegate.redis_target import RedisTarget, RedisType, SocketType
from slidegate.setting_parsers import BackendType
from slidegate.setting_spec import SettingsError, named


class Settings(Protocol):
    """What these checks read of slidegate.settings.Settings (which imports this module)."""

    @property
    def backend_type(self) -> BackendType: ...
    @property
    def redis(self) -> RedisTarget: ...
    @property
    def persecond_redis(self) -> RedisTarget: ...
    @property
    def redis_persecond(self) -> bool: ...
    @property
    def redis_wait_replicas(self) -> int: ...
    @property
    def redis_wait_timeout(self) -> float: ...
    @property
    def redis_timeout(self) -> float: ...
    @property
    def redis_tls_cacert(self) -> str: ...
    @property
    def redis_tls_client_cert(self) -> str: ...
    @property
    def redis_tls_client_key(self) -> str: ...
    @property
    def redis_tls_skip_hostname_verification(self) -> bool: ...

_TLS_FILES = ("REDIS_TLS_CACERT", "REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_KEY")


def _refuse(problem: str) -> SettingsError:
    return SettingsError("invalid settings:\n  " + problem)


def in_use(settings: Settings) -> list[tuple[str, RedisTarget]]:
    """The Redis the settings reach, with their settings' prefix: none with the memory backend."""
    if settings.backend_type is not BackendType.REDIS:
        return []
    return [("REDIS_", settings.redis)] + ([("REDIS_PERSECOND_", settings.persecond_redis)]
                                           if settings.redis_persecond else [])


def _uses_tls(target: RedisTarget) -> bool:
    return target.tls or target.url.startswith("rediss://")


def _tls_files(settings: Settings) -> dict[str, str]:
    """The REDIS_TLS_* files given, by variable."""
    given = dict(zip(_TLS_FILES, (settings.redis_tls_cacert, settings.redis_tls_client_cert,
                                  settings.redis_tls_client_key), strict=True))
    return {env: path for env, path in given.items() if path}


def check_redis(settings: Settings) -> None:
    """Raise SettingsError for Redis settings that cannot work together, or a Redis URL or TLS file that
    cannot be used."""
    if settings.redis_persecond:
        if settings.backend_type is not BackendType.REDIS:
            raise _refuse(f"{named('REDIS_PERSECOND')} needs --backend / BACKEND_TYPE=redis")
        if not settings.persecond_redis.url.strip():
            raise _refuse(f"{named('REDIS_PERSECOND')} needs {named('REDIS_PERSECOND_URL')} (the Redis of the "
                          "per-second limits)")
    for prefix, target in in_use(settings):
        try:
            target.check()
        except ValueError as exc:
            raise _refuse(f"{named(prefix + 'URL')}: {exc}") from exc
    if settings.redis_wait_replicas and settings.backend_type is BackendType.REDIS:
        if settings.redis.type is RedisType.CLUSTER:
            raise _refuse(f"{named('REDIS_WAIT_REPLICAS')} is not offered with REDIS_TYPE=cluster (only single and "
                          "sentinel)")
        if settings.redis_wait_timeout >= settings.redis_timeout:
            raise _refuse(f"{named('REDIS_WAIT_TIMEOUT')} ({settings.redis_wait_timeout:g} s) must be shorter than "
                          f"{named('REDIS_TIMEOUT')} ({settings.redis_timeout:g} s): the replicas' answer has to "
                          "arrive within the decision's time")
    files = _tls_files(settings)
    if ("REDIS_TLS_CLIENT_CERT" in files) != ("REDIS_TLS_CLIENT_KEY" in files):
        raise _refuse(f"{named('REDIS_TLS_CLIENT_CERT')} and {named('REDIS_TLS_CLIENT_KEY')} go together")
    if any(_uses_tls(target) for _, target in in_use(settings)):
        for env, path in files.items():
            if not Path(path).is_file():
                raise _refuse(f"{named(env)}: no such file {path!r}")


def redis_leftovers(settings: Settings) -> list[str]:
    """A line for each Redis setting given that has no effect, naming it and saying why."""
    found: list[str] = []
    for prefix, target in in_use(settings):
        found += _target_leftovers(prefix, target)
    if settings.persecond_redis.url.strip() and not settings.redis_persecond:
        found.append(f"{named('REDIS_PERSECOND_URL')} is neither checked nor used: {named('REDIS_PERSECOND')} is "
                     "false")
    unused = list(_tls_files(settings)) + (["REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"]
                                           if settings.redis_tls_skip_hostname_verification else [])
    if unused and not any(_uses_tls(target) for _, target in in_use(settings)):
        found.append(f"{', '.join(map(named, unused))}: not used (files not read): no Redis is reached over TLS "
                     f"({named('REDIS_TLS')}, {named('REDIS_PERSECOND_TLS')} or a rediss:// URL)")
    return found


def _target_leftovers(prefix: str, target: RedisTarget) -> list[str]:
    found = []
    if target.sentinel_auth and target.type is not RedisType.SENTINEL:
        found.append(f"{named(prefix + 'SENTINEL_AUTH')} is not used: {prefix}TYPE={target.type} has no Sentinels")
    if target.socket_type is SocketType.UNIX and target.type is not RedisType.SINGLE:
        found.append(f"{named(prefix + 'SOCKET_TYPE')}=unix is not used: {prefix}TYPE={target.type} reaches its "
                     "nodes over TCP (a socket path is for single)")
    if target.tls and target.url.startswith("unix://"):
        found.append(f"{named(prefix + 'TLS')} is not used: {prefix}URL is a unix:// socket, reached without TLS "
                     "(Redis serves TLS on TCP only)")
    return found
