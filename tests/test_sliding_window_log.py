"""The sliding-window log in Redis, decided through the Limiter with an injected clock."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import redis

from slidegate.backends.base import Check
from slidegate.backends.redis import RedisBackend
from slidegate.config import load_directory
from slidegate.keys import limit_key
from slidegate.limiter import UNLIMITED_REMAINING, Descriptor, Limiter, LimiterOptions
from tests.conftest import Clock
from tests.redis_servers import RedisServer

CONFIG = """
domain: test
descriptors:
  - key: minute
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: five
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: zero
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: free
    rate_limit: {unlimited: true}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
    descriptors:
      - key: id
        rate_limit: {unit: minute, requests_per_unit: 1}
"""

SECOND = 1_000_000


@pytest.fixture
async def limiter(
    write_config: Callable[..., Path], redis_url: str, key_prefix: str, clock: Clock
) -> AsyncIterator[Limiter]:
    config = load_directory(write_config(CONFIG))
    backend = RedisBackend(redis_url)
    yield Limiter(lambda: config, backend, LimiterOptions(key_prefix=key_prefix), clock=clock)
    await backend.close()


def d(key: str, value: str = "v", hits: int | None = None) -> Descriptor:
    return Descriptor(((key, value),), hits)


async def test_boundary_burst_is_blocked(limiter: Limiter, clock: Clock) -> None:
    # 100 hits in the last second of a minute, then 100 in the first second of the next one: a fixed window
    # would admit all 200; the sliding window admits none of the second 100.
    clock.now_us = (clock.now_us // (60 * SECOND) + 1) * 60 * SECOND - SECOND
    admitted: list[int] = []
    for i in range(100):
        clock.now_us += 9_000  # 100 hits spread over 0.9 s
        [status] = await limiter.should_rate_limit("test", [d("minute")])
        assert not status.over, i
        admitted.append(clock.now_us)
    assert clock.now_us % (60 * SECOND) > 59 * SECOND  # still before the boundary
    clock.now_us = (clock.now_us // (60 * SECOND) + 1) * 60 * SECOND  # the boundary
    for _ in range(100):
        clock.now_us += 5_000
        [status] = await limiter.should_rate_limit("test", [d("minute")])
        assert status.over
    # the first hit leaves the window exactly 60 s after it was made: one more is admitted then, not before
    clock.now_us = admitted[0] + 60 * SECOND - 1
    assert (await limiter.should_rate_limit("test", [d("minute")]))[0].over
    clock.now_us = admitted[0] + 60 * SECOND
    [status] = await limiter.should_rate_limit("test", [d("minute")])
    assert not status.over and status.remaining == 0
    admitted.append(clock.now_us)
    # no rolling 60 s window ever held more than 100 admitted hits
    assert all(
        sum(1 for t in admitted if start <= t < start + 60 * SECOND) <= 100 for start in admitted
    )


async def test_same_instant_hits_are_distinct(
    limiter: Limiter, clock: Clock, redis_client: redis.Redis, key_prefix: str
) -> None:
    results = [(await limiter.should_rate_limit("test", [d("five")]))[0] for _ in range(50)]
    assert [s.over for s in results] == [False] * 5 + [True] * 45
    key = limit_key(key_prefix, "sliding_window_log", "test", [("five", "v")])
    members = redis_client.zrangebyscore(key, 0, "+inf")
    assert len(members) == 5 and len(set(members)) == 5
    assert redis_client.zscore(key, "#") == -5


async def test_remaining_and_reset_within_limit(limiter: Limiter, clock: Clock) -> None:
    [first] = await limiter.should_rate_limit("test", [d("a")])
    assert (first.over, first.remaining, first.reset_us) == (False, 9, 60 * SECOND)
    clock.advance(10.5)
    [second] = await limiter.should_rate_limit("test", [d("a")])
    # the oldest hit (10.5 s old) leaves in 49.5 s
    assert (second.over, second.remaining, second.reset_us) == (False, 8, 49_500_000)


async def test_reset_over_limit_is_exact_time_until_hits_fit(limiter: Limiter, clock: Clock) -> None:
    # hits at t = 0, 5, 10, 15, 20 s weighing 1, 1, 3, 2, 3 on a limit of 10/minute
    for step, hits in ((0, 1), (5, 1), (5, 3), (5, 2), (5, 3)):
        clock.advance(step)
        [status] = await limiter.should_rate_limit("test", [d("a", hits=hits)])
        assert not status.over
    clock.advance(10)  # t = 30 s, 10 hits counted, 0 remaining
    [status] = await limiter.should_rate_limit("test", [d("a", hits=4)])
    # 4 hits fit once the hits at 0 (1), 5 (1) and 10 (3) s have left: at t = 70 s, 40 s from now
    assert (status.over, status.remaining, status.reset_us) == (True, 0, 40 * SECOND)
    [status] = await limiter.should_rate_limit("test", [d("a", hits=1)])
    assert status.reset_us == 30 * SECOND  # the hit at t = 0 leaves at 60 s
    clock.advance(30)
    [status] = await limiter.should_rate_limit("test", [d("a", hits=1)])
    assert not status.over and status.remaining == 0


async def test_hits_addend_semantics(limiter: Limiter) -> None:
    # request-level 0 means 1
    [s] = await limiter.should_rate_limit("test", [d("a")], hits_addend=0)
    assert s.remaining == 9
    # request-level value applies to descriptors without their own
    [s] = await limiter.should_rate_limit("test", [d("a")], hits_addend=3)
    assert s.remaining == 6
    # the descriptor's own value wins
    [s] = await limiter.should_rate_limit("test", [d("a", hits=2)], hits_addend=5)
    assert s.remaining == 4
    # explicit 0 checks without consuming
    [s] = await limiter.should_rate_limit("test", [d("a", hits=0)], hits_addend=5)
    assert (s.over, s.remaining) == (False, 4)
    # more hits than remain: over, nothing recorded
    [s] = await limiter.should_rate_limit("test", [d("a", hits=5)])
    assert (s.over, s.remaining) == (True, 0)
    [s] = await limiter.should_rate_limit("test", [d("a", hits=0)])
    assert s.remaining == 4
    # reaching the limit exactly is OK with 0 remaining
    [s] = await limiter.should_rate_limit("test", [d("a", hits=4)])
    assert (s.over, s.remaining) == (False, 0)


async def test_hits_beyond_limit_never_fit(limiter: Limiter) -> None:
    [s] = await limiter.should_rate_limit("test", [d("a", hits=2**64 - 1)])
    assert (s.over, s.remaining, s.reset_us) == (True, 0, 60 * SECOND)
    [s] = await limiter.should_rate_limit("test", [d("a", hits=0)])
    assert s.remaining == 10


async def test_zero_limit_is_always_over(limiter: Limiter) -> None:
    for _ in range(3):
        [s] = await limiter.should_rate_limit("test", [d("zero")])
        assert (s.over, s.remaining) == (True, 0)


async def test_all_or_nothing(limiter: Limiter) -> None:
    await limiter.should_rate_limit("test", [d("b", hits=2)])  # b is full
    statuses = await limiter.should_rate_limit("test", [d("a"), d("b")])
    assert [s.over for s in statuses] == [False, True]
    assert statuses[0].remaining == 10  # a was not charged
    [a] = await limiter.should_rate_limit("test", [d("a", hits=0)])
    assert a.remaining == 10


async def test_same_limit_twice_in_one_request_counts_both(limiter: Limiter) -> None:
    statuses = await limiter.should_rate_limit("test", [d("b"), d("b")])
    assert [s.over for s in statuses] == [False, False]
    assert [s.remaining for s in statuses] == [1, 0]
    statuses = await limiter.should_rate_limit("test", [d("b")])
    assert statuses[0].over


async def test_no_limit_unlimited_and_unknown_domain(limiter: Limiter) -> None:
    nothing, free, deep = await limiter.should_rate_limit(
        "test", [d("nope"), d("free"), Descriptor((("user", "u"), ("id", "1"), ("x", "y")))]
    )
    assert nothing.limit is None and not nothing.over
    assert free.limit is None and free.remaining == UNLIMITED_REMAINING
    assert deep.limit is None
    assert [s.limit for s in await limiter.should_rate_limit("other", [d("a")])] == [None]


async def test_keys_are_injective(limiter: Limiter) -> None:
    # (user, "a_id_b") and (user, a), (id, b) are different limits with different counters
    [one] = await limiter.should_rate_limit("test", [Descriptor((("user", "a_id_b"),))])
    [two] = await limiter.should_rate_limit("test", [Descriptor((("user", "a"), ("id", "b")))])
    assert not one.over and not two.over


async def test_every_key_has_a_ttl_of_whole_milliseconds(
    limiter: Limiter, redis_client: redis.Redis, key_prefix: str
) -> None:
    await limiter.should_rate_limit("test", [d("a"), d("five")])
    keys = sorted(redis_client.scan_iter(match=f"{key_prefix}*"))
    assert len(keys) == 2
    ttls = sorted(redis_client.pttl(k) for k in keys)
    assert 0 < ttls[0] <= 1000 and 59_000 < ttls[1] <= 60_000


async def test_memory_is_bounded_by_the_limit(
    limiter: Limiter, clock: Clock, redis_client: redis.Redis, key_prefix: str
) -> None:
    for _ in range(30):
        clock.advance(0.3)
        await limiter.should_rate_limit("test", [d("five")])
    key = limit_key(key_prefix, "sliding_window_log", "test", [("five", "v")])
    assert redis_client.zcount(key, "(0", "+inf") <= 5  # one member per admitted request
    clock.advance(2)
    await limiter.should_rate_limit("test", [d("five", hits=0)])
    assert not redis_client.exists(key)  # every hit expired: the key is gone


async def test_script_flush_is_not_an_error(
    write_config: Callable[..., Path], private_redis: RedisServer, clock: Clock
) -> None:
    config = load_directory(write_config(CONFIG))
    backend = RedisBackend(private_redis.url)
    limiter = Limiter(lambda: config, backend, clock=clock)
    try:
        await limiter.should_rate_limit("test", [d("a")])
        client = redis.Redis.from_url(private_redis.url)
        client.script_flush()  # a Redis of this test's own: the shared one's scripts stay
        client.close()
        [s] = await limiter.should_rate_limit("test", [d("a")])
    finally:
        await backend.close()
    assert s.remaining == 8


async def test_redis_time_is_the_default_clock(
    write_config: Callable[..., Path], redis_url: str, key_prefix: str
) -> None:
    config = load_directory(write_config(CONFIG))
    backend = RedisBackend(redis_url)
    limiter = Limiter(lambda: config, backend, LimiterOptions(key_prefix=key_prefix))
    try:
        first = (await limiter.should_rate_limit("test", [d("a")]))[0]
        second = (await limiter.should_rate_limit("test", [d("a")]))[0]
    finally:
        await backend.close()
    assert (first.remaining, second.remaining) == (9, 8)
    assert 59 * SECOND < second.reset_us <= 60 * SECOND


async def test_running_count_is_rebased_before_it_loses_precision(
    redis_url: str, redis_client: redis.Redis, key_prefix: str
) -> None:
    # a key that has counted 2^50 hits over its life (byte-count limits get there): C must start over
    key = f"{key_prefix}old"
    base = 2**50
    now = 1_700_000_000_000_000
    redis_client.zadd(key, {"#": -(base + 3), "^": -base, str(base + 3): now})
    redis_client.pexpire(key, 60_000)
    backend = RedisBackend(redis_url)
    try:
        decision = await backend.decide([Check(key, 10, 60 * SECOND, 1)], now + SECOND)
        assert decision.outcomes[0].remaining == 6  # 3 + 1 of 10
        assert redis_client.zrange(key, 0, -1, withscores=True) == [
            ("#", -4.0), ("^", 0.0), ("3", float(now)), ("4", float(now + SECOND))]
        again = await backend.decide([Check(key, 10, 60 * SECOND, 2)], now + 2 * SECOND)
        assert again.outcomes[0].remaining == 4
    finally:
        await backend.close()
