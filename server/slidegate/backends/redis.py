"""The Redis backend: every request's limits are decided by one Lua script call (EVALSHA).

Connection errors and timeouts become BackendUnavailable within ``timeout`` seconds. Nothing is retried
except a NOSCRIPT reply (after SCRIPT FLUSH or a Redis restart), which means the script did not run: a call
that may have executed is never sent twice, so no hit is counted twice.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio import connection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, RedisError

from slidegate.algorithms import Algorithm
from slidegate.backends.base import BackendUnavailable, Check, DeadlineExceeded, Decision, Outcome
from slidegate.resources import lua_script


def redact(url: str) -> str:
    """``url`` with any password (in the user part or a ``password=`` query parameter) replaced by ``***``."""
    parts = urlsplit(url)
    if "@" in parts.netloc:
        user = (parts.username or "") if parts.password is not None else ""
        parts = parts._replace(netloc=f"{user}:***@{parts.netloc.rsplit('@', 1)[1]}")
    if parts.query:
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        query = [(k, "***" if k.lower() == "password" else v) for k, v in pairs]
        parts = parts._replace(query=urlencode(query, safe="*"))
    return urlunsplit(parts)


def check_url(url: str) -> None:
    """Raise ValueError naming the problem unless ``url`` is a usable redis://, rediss:// or unix:// URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"Redis URL {redact(url)!r} must start with redis://, rediss:// or unix://")
    try:
        parts.port  # noqa: B018 - urllib checks the port when it is read
        connection.parse_url(url)
    except ValueError as exc:
        raise ValueError(f"Redis URL {redact(url)!r}: {exc}") from exc
    if parts.scheme != "unix" and not parts.hostname:
        raise ValueError(f"Redis URL {redact(url)!r} names no host")


@dataclass(frozen=True, slots=True)
class TlsOptions:
    """TLS files for a rediss:// URL: CA bundle (empty: the system's), client certificate and key (mutual TLS),
    and whether the certificate must name the host."""

    ca_certs: str = ""
    certfile: str = ""
    keyfile: str = ""
    check_hostname: bool = True


class RedisBackend:
    """Limits of every algorithm in one Redis (``redis://`` or ``rediss://`` URL).

    ``timeout``: seconds allowed for one decision, connecting and waiting for a connection included
    (default 0.25 s); ``pool_size``: connections at most (REDIS_POOL_SIZE); calls beyond it wait for one;
    ``tls``: files for a rediss:// URL; ``auth``: (user or None, password), instead of the URL's.
    Raises ValueError for a malformed URL.
    """

    def __init__(self, url: str, *, timeout: float = 0.25, pool_size: int = 64, tls: TlsOptions | None = None,
                 auth: tuple[str | None, str] | None = None) -> None:
        check_url(url)
        self._url = url
        self._timeout = timeout
        extra: dict[str, object] = {}
        if auth is not None:  # (user or None, password): wins over any in the URL
            extra["username"], extra["password"] = auth
        if url.startswith("rediss://") and tls is not None:
            extra = {"ssl_ca_certs": tls.ca_certs or None, "ssl_certfile": tls.certfile or None,
                     "ssl_keyfile": tls.keyfile or None, "ssl_check_hostname": tls.check_hostname}
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=pool_size,
            timeout=timeout,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),  # a retried EVALSHA could count hits twice
            health_check_interval=0,
            encoding_errors="surrogateescape",  # request bytes that are not UTF-8 travel as they came
            **extra,
        )
        self._client = aioredis.Redis(connection_pool=pool)
        self._script = lua_script([a.value for a in Algorithm])
        self._sha = hashlib.sha1(self._script.encode()).hexdigest()

    def describe(self) -> str:
        return f"redis at {redact(self._url)}"

    async def decide(
        self, checks: Sequence[Check], now_us: int | None = None, timeout: float | None = None
    ) -> Decision:
        """Decide ``checks`` in one script call. Raises BackendUnavailable on any Redis failure or timeout."""
        if not checks:
            return Decision(True, [])
        args: list[str | int] = ["" if now_us is None else now_us]
        for c in checks:
            args += (c.algorithm.value, *c.params(), c.clamped_hits(), int(c.shadow))
        keys = [c.key for c in checks]
        caller_first = timeout is not None and timeout < self._timeout
        try:
            async with asyncio.timeout(timeout if caller_first else self._timeout):
                reply = await self._eval(keys, args)
        except TimeoutError as exc:
            if caller_first:
                raise DeadlineExceeded(f"{self.describe()}: the caller's deadline ({timeout:.3f} s) ran out") from exc
            raise BackendUnavailable(f"{self.describe()}: {_reason(exc)}") from exc
        except (RedisError, OSError) as exc:
            raise BackendUnavailable(f"{self.describe()}: {_reason(exc)}") from exc
        outcomes = [
            Outcome(over=bool(reply[i]), remaining=int(reply[i + 1]), reset_us=int(reply[i + 2]))
            for i in range(1, len(reply), 3)
        ]
        return Decision(admitted=bool(reply[0]), outcomes=outcomes)

    async def _eval(self, keys: list[str], args: list[str | int]) -> list[int]:
        try:
            reply: list[int] = await self._client.execute_command("EVALSHA", self._sha, len(keys), *keys, *args)
        except NoScriptError:
            # The script cache was flushed: NOSCRIPT means nothing ran, so loading and sending again is safe.
            await self._client.execute_command("SCRIPT", "LOAD", self._script)
            reply = await self._client.execute_command("EVALSHA", self._sha, len(keys), *keys, *args)
        return reply

    async def ping(self) -> None:
        try:
            async with asyncio.timeout(self._timeout):
                await self._client.ping()
        except (RedisError, OSError, TimeoutError) as exc:
            raise BackendUnavailable(f"{self.describe()}: {_reason(exc)}") from exc

    async def close(self) -> None:
        await self._client.aclose()


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else f"{type(exc).__name__} (no answer in time)"
