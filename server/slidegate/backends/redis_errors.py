"""What a Redis that fails or cannot be reached raises, and how the failure is told in an answer's message."""

from __future__ import annotations

from redis.exceptions import AuthenticationError, RedisClusterException, RedisError

# What a Redis that fails or cannot be reached raises, through redis-py or our own connections (TimeoutError, an
# OSError: no answer in time). Each becomes BackendUnavailable (RedisBackend.unavailable), and nothing else
# does: any other exception is a bug and goes up as itself.
STORAGE_ERRORS = (RedisError, RedisClusterException, OSError)


def reason(exc: BaseException) -> str:
    """``exc`` as an operator reads it in a log line or an UNAVAILABLE message."""
    if isinstance(exc, AuthenticationError) and ("HELLO must be called" in str(exc) or "NOAUTH" in str(exc)):
        # Redis's own words for a missing password name a command the operator never sent
        return f"{type(exc).__name__}: Redis wants a password and none was given (set REDIS_AUTH)"
    return f"{type(exc).__name__}: {exc}" if str(exc) else f"{type(exc).__name__} (no answer in time)"
