"""The local over-limit cache: known rejections are answered without Redis, and nothing else is."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from slidegate.backends.base import BackendUnavailable
from slidegate.backends.blocked import OverLimitCache
from slidegate.backends.redis import RedisBackend
from slidegate.config import load_directory
from slidegate.limiter import Descriptor, Limiter
from tests.conftest import Clock
from tests.redis_servers import RedisServer


def config_text(limit: int) -> str:
    return f"""
domain: c
descriptors:
  - key: k
    rate_limit:
      unit: minute
      requests_per_unit: {limit}
  - key: other
    rate_limit:
      unit: minute
      requests_per_unit: 100
"""


def d(key: str, hits: int | None = None) -> Descriptor:
    return Descriptor(((key, "v"),), hits_addend=hits)


async def test_rejections_are_answered_locally_until_the_exact_retry_time(
        write_config: Callable[..., Path], private_redis: RedisServer, clock: Clock) -> None:
    config = load_directory(write_config(config_text(5)))
    backend = OverLimitCache(RedisBackend(private_redis.url, timeout=0.2))
    limiter = Limiter(lambda: config, backend, clock=clock)
    try:
        for _ in range(5):
            clock.advance(1)
            [s] = await limiter.should_rate_limit("c", [d("k")])
            assert not s.over
        [over] = await limiter.should_rate_limit("c", [d("k")])
        assert over.over and over.reset_us == 56_000_000  # the first hit leaves the window in 56 s
        private_redis.stop()  # from here on, only a local answer can come back
        clock.advance(55)
        [local] = await limiter.should_rate_limit("c", [d("k")])
        assert (local.over, local.remaining, local.reset_us) == (True, 0, 1_000_000)
        with pytest.raises(BackendUnavailable):  # fewer hits may fit earlier: the storage must say
            await limiter.should_rate_limit("c", [d("k", hits=0)])
        with pytest.raises(BackendUnavailable):  # a limit with room needs the storage too
            await limiter.should_rate_limit("c", [d("k"), d("other")])
        clock.advance(1)  # the exact retry time: no longer known to be over
        with pytest.raises(BackendUnavailable):
            await limiter.should_rate_limit("c", [d("k")])
    finally:
        await backend.close()


async def test_a_reloaded_limit_is_not_blocked_by_the_old_one(
        write_config: Callable[..., Path], private_redis: RedisServer, clock: Clock) -> None:
    configs = [load_directory(write_config(config_text(2))), load_directory(write_config(config_text(3)))]
    current = configs[0]
    backend = OverLimitCache(RedisBackend(private_redis.url, timeout=0.2))
    limiter = Limiter(lambda: current, backend, clock=clock)
    try:
        answers = [(await limiter.should_rate_limit("c", [d("k")]))[0].over for _ in range(3)]
        assert answers == [False, False, True]
        current = configs[1]  # a reload raises the limit: the cached rejection was for the old one
        [s] = await limiter.should_rate_limit("c", [d("k")])
        assert (s.over, s.remaining) == (False, 0)
    finally:
        await backend.close()
