"""The local over-limit cache: known rejections are answered without Redis, and nothing else is."""

from __future__ import annotations

import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from slidegate.algorithms import Algorithm
from slidegate.application import make_backend
from slidegate.backends import blocked
from slidegate.backends.base import BackendUnavailable, Check
from slidegate.backends.blocked import OverLimitCache, entry_bytes
from slidegate.backends.redis import RedisBackend
from slidegate.cache_sizes import ENTRY_BYTES
from slidegate.config import load_directory
from slidegate.keys import limit_key
from slidegate.limiter import Descriptor, Limiter, LimiterOptions
from slidegate.settings import Settings
from slidegate.text import MAX_TEXT_CHARS
from tests.conftest import Clock
from tests.redis_servers import RedisServer

NOW = 1_700_000_000_000_000


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
    w = Descriptor((("k", "w"),))  # another limit of the same rule, over limit the same way
    try:
        for _ in range(5):
            clock.advance(1)
            statuses = await limiter.should_rate_limit("c", [d("k"), w])
            assert not any(s.over for s in statuses)
        [over] = await limiter.should_rate_limit("c", [d("k")])
        assert over.over and over.reset_us == 56_000_000  # the first hit leaves the window in 56 s
        await limiter.should_rate_limit("c", [w])
        private_redis.stop()  # from here on, only a local answer can come back
        clock.advance(55)
        [local] = await limiter.should_rate_limit("c", [d("k")])
        assert (local.over, local.remaining, local.reset_us) == (True, 0, 1_000_000)
        with pytest.raises(BackendUnavailable):  # fewer hits may fit earlier: the storage must say
            await limiter.should_rate_limit("c", [d("k", hits=0)])
        with pytest.raises(BackendUnavailable):  # a limit with room needs the storage too
            await limiter.should_rate_limit("c", [w, d("other")])
        clock.advance(1)  # the exact retry time: no longer known to be over (the failed calls above forgot w only)
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


async def test_hits_counted_since_a_rejection_push_its_retry_time_back(
        write_config: Callable[..., Path], redis_url: str, key_prefix: str, clock: Clock) -> None:
    # Found by the property test: 5 hits are over; 3 hits then fit, so 5 hits now fit later than the time
    # remembered for them (a token bucket of 8 a minute: one token per 7.5 s).
    config = load_directory(write_config(config_text(8).replace(
        "unit: minute\n", "unit: minute\n      algorithm: token_bucket\n", 1)))
    redis = RedisBackend(redis_url, timeout=1)
    options = LimiterOptions(key_prefix=key_prefix)
    limiter = Limiter(lambda: config, OverLimitCache(redis), options, clock=clock)
    storage_only = Limiter(lambda: config, redis, options, clock=clock)
    try:
        clock.advance(1)
        assert not (await limiter.should_rate_limit("c", [d("k", hits=5)]))[0].over
        clock.advance(1)
        [first] = await limiter.should_rate_limit("c", [d("k", hits=5)])
        assert first.over and first.reset_us == 14_000_000  # 1.87 tokens short
        assert not (await limiter.should_rate_limit("c", [d("k", hits=3)]))[0].over
        [again] = await limiter.should_rate_limit("c", [d("k", hits=5)])
        [truth] = await storage_only.should_rate_limit("c", [d("k", hits=5)])
        assert again.over and again.reset_us == truth.reset_us == 36_500_000  # now 4.87 tokens short
    finally:
        await redis.close()


async def test_hits_given_back_make_room_at_once(
        write_config: Callable[..., Path], redis_url: str, key_prefix: str, clock: Clock) -> None:
    config = load_directory(write_config(config_text(4)))
    backend = OverLimitCache(RedisBackend(redis_url, timeout=1))
    limiter = Limiter(lambda: config, backend, LimiterOptions(key_prefix=key_prefix), clock=clock)
    try:
        assert not (await limiter.should_rate_limit("c", [d("k", hits=4)]))[0].over
        assert (await limiter.should_rate_limit("c", [d("k")]))[0].over  # remembered as over
        give = Descriptor((("k", "v"),), hits_addend=2, negative=True)
        assert (await limiter.should_rate_limit("c", [give]))[0].remaining == 2
        [after] = await limiter.should_rate_limit("c", [d("k")])
        assert (after.over, after.remaining) == (False, 1)
    finally:
        await backend.close()


async def test_long_keys_are_bounded_by_their_size(
        write_config: Callable[..., Path], private_redis: RedisServer, clock: Clock) -> None:
    """envoyproxy/ratelimit's freecache (src/limiter/base_limiter.go) holds at most LOCAL_CACHE_SIZE_IN_BYTES;
    here keys of the longest values, each charged its own size, stay within the bytes given."""
    config = load_directory(write_config(config_text(1)))
    backend = OverLimitCache(RedisBackend(private_redis.url, timeout=0.2), max_bytes=6_000)
    limiter = Limiter(lambda: config, backend, clock=clock)
    value = "x" * MAX_TEXT_CHARS  # the longest value kept whole in a key
    try:
        for i in range(40):  # 40 limits over their limit: each charged about 520 bytes
            for _ in range(2):
                await limiter.should_rate_limit("c", [Descriptor((("k", f"{i:02}" + value[2:]),))])
            assert 0 < backend.bytes_charged <= 6_000
            assert backend.bytes_charged == sum(entry_bytes(key) for key in backend.remembered())
        remembered = len(backend.remembered())
        assert 0 < remembered < 12
        [over] = await limiter.should_rate_limit("c", [Descriptor((("k", "39" + value[2:]),))])
        assert over.over  # the newest is still answered
    finally:
        await backend.close()


async def test_the_bytes_charged_cover_the_memory_taken(redis_url: str, key_prefix: str) -> None:
    """envoyproxy/ratelimit sizes its local cache in bytes (LOCAL_CACHE_SIZE_IN_BYTES, src/settings/settings.go;
    freecache in src/limiter/base_limiter.go); here the bytes charged per limit must not be fewer than Python
    takes for it (tracemalloc, the cache's own allocations), nor more than twice as many."""
    backend = OverLimitCache(RedisBackend(redis_url, timeout=5))
    # envoyproxy/ratelimit's usual key shapes, an address and a path; limits whose numbers are not small ints,
    # each taken whole by one request, so that the next is over
    checks = [Check(limit_key(key_prefix, "sliding_window_log", "edge",
                              [("remote_address", f"10.1.{i // 250}.{i % 250}"), ("path", "/api/v1/users")]),
                    1000 + i, 60_000_000, 1000 + i) for i in range(5000)]
    try:
        assert (await backend.decide(checks, NOW)).admitted
        tracemalloc.start()
        try:
            assert not (await backend.decide(checks, NOW)).admitted  # every limit is over: each one remembered
            taken = sum(stat.size for stat in tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(True, blocked.__file__)]).statistics("filename"))
        finally:
            tracemalloc.stop()
        assert len(backend.remembered()) == len(checks)
        charged = backend.bytes_charged - sum(sys.getsizeof(c.key) for c in checks)  # the keys are the request's own
        assert charged == len(checks) * ENTRY_BYTES
        assert charged / 2 <= taken <= charged, (taken, charged)
        assert (await backend.decide(checks, NOW)).cached
    finally:
        await backend.close()


async def test_a_size_of_zero_means_no_cache() -> None:
    """envoyproxy/ratelimit src/service_cmd/runner/runner.go makes a local cache only when LOCAL_CACHE_SIZE_IN_BYTES
    is not 0; here 0 builds no OverLimitCache, and any other size bounds it."""
    plain = make_backend(Settings.load({}, {"local_cache_size_in_bytes": "0"}))
    cached = make_backend(Settings.load({}, {"local_cache_size_in_bytes": "1000000"}))
    default = make_backend(Settings.load({}))
    try:
        assert isinstance(plain, RedisBackend)
        assert isinstance(cached, OverLimitCache) and cached.max_bytes == 1_000_000
        assert isinstance(default, OverLimitCache) and default.max_bytes == 32 * 1024 * 1024
    finally:
        for backend in (plain, cached, default):
            await backend.close()


async def test_hits_given_back_under_another_version_of_the_limit_forget_it_too(
        write_config: Callable[..., Path], redis_url: str, key_prefix: str, clock: Clock) -> None:
    configs = [load_directory(write_config(config_text(3)))]
    backend = OverLimitCache(RedisBackend(redis_url, timeout=1))
    limiter = Limiter(lambda: configs[-1], backend, LimiterOptions(key_prefix=key_prefix), clock=clock)
    try:
        assert not (await limiter.should_rate_limit("c", [d("k", hits=3)]))[0].over
        assert (await limiter.should_rate_limit("c", [d("k")]))[0].over  # remembered under the limit of 3
        configs.append(load_directory(write_config(config_text(5))))  # a reload, and back again later
        give = Descriptor((("k", "v"),), hits_addend=3, negative=True)
        assert (await limiter.should_rate_limit("c", [give]))[0].remaining == 5
        configs.append(load_directory(write_config(config_text(3))))
        [after] = await limiter.should_rate_limit("c", [d("k")])
        assert (after.over, after.remaining) == (False, 2)  # not the rejection remembered before
    finally:
        await backend.close()


async def test_hits_of_a_call_that_failed_forget_the_limit(
        write_config: Callable[..., Path], private_redis: RedisServer, clock: Clock) -> None:
    # a give-back whose deadline ran out may still have reached Redis: its room must be asked for again
    config = load_directory(write_config(config_text(2)))
    backend = OverLimitCache(RedisBackend(private_redis.url, timeout=0.2))
    limiter = Limiter(lambda: config, backend, clock=clock)
    try:
        assert not (await limiter.should_rate_limit("c", [d("k", hits=2)]))[0].over
        assert (await limiter.should_rate_limit("c", [d("k")]))[0].over
        assert backend.remembered()
        private_redis.stop()
        with pytest.raises(BackendUnavailable):
            await limiter.should_rate_limit("c", [Descriptor((("k", "v"),), hits_addend=1, negative=True)])
        assert not backend.remembered()
    finally:
        await backend.close()


@pytest.mark.parametrize(("stop_when_over", "remembered"), [(False, False), (True, True)])
async def test_a_fixed_window_counting_denied_hits_is_never_answered_here(
        write_config: Callable[..., Path], redis_url: str, key_prefix: str, clock: Clock, stop_when_over: bool,
        remembered: bool) -> None:
    # envoyproxy/ratelimit's fixed window counts the hits of rejected requests: each must reach Redis
    config = load_directory(write_config(config_text(2).replace("requests_per_unit: 2",
                                                                "requests_per_unit: 2\n      algorithm: fixed_window")))
    backend = OverLimitCache(RedisBackend(redis_url, timeout=1))
    limiter = Limiter(lambda: config, backend, LimiterOptions(key_prefix=key_prefix, stop_when_over=stop_when_over),
                      clock=clock)
    try:
        for _ in range(3):
            await limiter.should_rate_limit("c", [d("k")])
        assert bool(backend.remembered()) is remembered
    finally:
        await backend.close()


async def test_hits_beyond_a_buckets_burst_are_not_remembered(redis_url: str, key_prefix: str) -> None:
    # more than the burst never fits, whatever the limit: its answer is the storage's fixed one, never a count-down
    backend = OverLimitCache(RedisBackend(redis_url, timeout=1))
    check = Check(f"{key_prefix}bucket", 8, 10_000_000, 3, Algorithm.TOKEN_BUCKET, burst=2)
    try:
        for at in (0, 1):
            decision = await backend.decide([check], 1_700_000_000_000_000 + at)
            assert (decision.admitted, decision.outcomes[0].reset_us) == (False, 2_500_000)
        assert not backend.remembered()
    finally:
        await backend.close()
