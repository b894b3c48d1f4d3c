"""EXPIRATION_JITTER_MAX_SECONDS: every key the scripts write expires up to that much later than it must, each key
its own random share (lua/decide.lua's J and seed), and the share changes no answer."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
import redis

from slidegate.algorithms import Algorithm
from slidegate.backends.base import Check
from slidegate.backends.redis import RedisBackend
from slidegate.settings import Settings, SettingsError

NOW = 1_700_000_000_123_456  # the decisions' clock: the same base expiry for both backends below
KEYS = 120
JITTER = 3  # seconds


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def checks(prefix: str, algorithm: Algorithm) -> list[Check]:
    window = 5_000_000 if algorithm is not Algorithm.TOKEN_BUCKET else 20_000_000
    return [Check(f"{prefix}{algorithm.value}:{i}", 10, window, 1, algorithm) for i in range(KEYS)]


async def write(redis_url: str, jitter: int, prefix: str, algorithm: Algorithm, seed: int) -> list[bool]:
    """Each key hit once at NOW: one request of many limits (one script call, one seed) and then each key again
    alone (a call, and a seed, each); the admissions."""
    backend = RedisBackend(redis_url, timeout=2, expiry_jitter=jitter, rng=random.Random(seed))
    try:
        together = await backend.decide(checks(prefix, algorithm), NOW)
        alone = [await backend.decide([c], NOW + 1) for c in checks(prefix, algorithm)]
        return [together.admitted, *(d.admitted for d in alone)]
    finally:
        await backend.close()


@pytest.mark.parametrize("algorithm", list(Algorithm))
async def test_expiries_spread_between_the_base_and_the_base_plus_the_jitter(
        redis_url: str, key_prefix: str, client: redis.Redis, algorithm: Algorithm) -> None:
    """envoyproxy/ratelimit src/redis/fixed_cache_impl.go adds JitterRand.Int63n(EXPIRATION_JITTER_MAX_SECONDS)
    to each key's EXPIRE (src/settings/settings.go); here each key's PEXPIRE gets its own share of up to J ms."""
    plain = await write(redis_url, 0, f"{key_prefix}plain:", algorithm, 1)
    jittered = await write(redis_url, JITTER, f"{key_prefix}jit:", algorithm, 2)
    assert plain == jittered  # the same answers: the jitter only lengthens lives
    with client.pipeline(transaction=False) as pipe:
        for c in checks(f"{key_prefix}plain:", algorithm) + checks(f"{key_prefix}jit:", algorithm):
            pipe.pttl(c.key)
        ttls = pipe.execute()
    base, late = ttls[:KEYS], ttls[KEYS:]
    assert min(base) > 0  # every key has an expiry, the same for every key (one clock)
    assert max(base) - min(base) < 500  # what passes between the reads, at most
    extra = [b - a for a, b in zip(base, late, strict=True)]
    # each within [base, base + J] (a few ms either way: the two sets of keys were read one after the other)
    assert min(extra) >= -500 and max(extra) <= JITTER * 1000 + 500, (min(extra), max(extra))
    # and spread over it: 120 draws from [0, 3000] ms leave no gap of half of it at either end
    assert min(extra) < JITTER * 1000 / 2 < max(extra)
    assert len(set(extra)) > KEYS / 2


async def test_without_jitter_no_key_outlives_its_need(redis_url: str, key_prefix: str, client: redis.Redis) -> None:
    """envoyproxy/ratelimit src/redis/fixed_cache_impl.go adds no jitter when EXPIRATION_JITTER_MAX_SECONDS is 0,
    slidegate's default: a 5 s log's key lives exactly its window after the hit."""
    await write(redis_url, 0, key_prefix, Algorithm.SLIDING_WINDOW_LOG, 3)
    assert all(4000 < client.pttl(c.key) <= 5000 for c in checks(key_prefix, Algorithm.SLIDING_WINDOW_LOG))


async def test_a_rejected_request_renews_with_the_jitter_too(
        redis_url: str, key_prefix: str, client: redis.Redis) -> None:
    """envoyproxy/ratelimit src/redis/fixed_cache_impl.go jitters every EXPIRE it sends; here also the renewal a
    rejected request makes of a token bucket's key (keep: extend_us), each key with its own share."""
    buckets = [Check(f"{key_prefix}b{i}", 1, 20_000_000, 1, Algorithm.TOKEN_BUCKET) for i in range(40)]
    backend = RedisBackend(redis_url, timeout=2, expiry_jitter=JITTER, rng=random.Random(4))
    try:
        assert (await backend.decide(buckets, NOW)).admitted
        for b in buckets:
            client.pexpire(b.key, 2000)  # shorter than they need: the rejected request must extend them
        assert not (await backend.decide([*buckets, Check(f"{key_prefix}x", 0, 1_000_000, 1)], NOW)).admitted
        extra = [client.pttl(b.key) - 20_000 for b in buckets]
        assert -1000 < min(extra) < JITTER * 1000 / 2 < max(extra) <= JITTER * 1000
    finally:
        await backend.close()


def test_the_setting_is_whole_seconds_up_to_a_day() -> None:
    """envoyproxy/ratelimit src/settings/settings.go: EXPIRATION_JITTER_MAX_SECONDS, an int64 of seconds."""
    assert Settings.load({}).expiration_jitter_max_seconds == 0
    assert Settings.load({"EXPIRATION_JITTER_MAX_SECONDS": "300"}).expiration_jitter_max_seconds == 300
    for bad, message in (("86401", "must be at most 86400"), ("1.5", "is not a whole number"),
                         ("-1", "is negative")):
        with pytest.raises(SettingsError, match=message):
            Settings.load({"EXPIRATION_JITTER_MAX_SECONDS": bad})
