"""One behavioural suite for every (algorithm x backend) pair, with the exact codes, remaining hits and reset
times each algorithm gives. Times are injected; the backends are every one the product offers (tests/backends.py:
memory, one Redis, Sentinel, Cluster, the per-second Redis, with and without the over-limit cache)."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from slidegate.algorithms import Algorithm
from slidegate.backends.base import Backend, Check
from slidegate.backends.redis import RedisBackend
from slidegate.config import load_directory
from slidegate.limiter import Descriptor, Limiter, LimiterOptions
from slidegate.resources import resource_dir
from tests.conftest import Clock

S = 1_000_000  # one second in microseconds
T0 = 1_700_000_000 * S  # a window boundary for windows of 10 s
WINDOW = 10 * S
LOG, COUNTER, BUCKET, FIXED = (Algorithm.SLIDING_WINDOW_LOG, Algorithm.SLIDING_WINDOW_COUNTER,
                               Algorithm.TOKEN_BUCKET, Algorithm.FIXED_WINDOW)


class Limit:
    """One limit of 3 hits per 10 s under test, decided at injected times."""

    def __init__(self, backend: Backend, algorithm: Algorithm, key: str, limit: int = 3, **extra: object) -> None:
        self.backend, self.algorithm, self.key, self.limit, self.extra = backend, algorithm, key, limit, extra

    def check(self, hits: int = 1) -> Check:
        return Check(self.key, self.limit, WINDOW, hits, self.algorithm, **self.extra)  # type: ignore[arg-type]

    async def hit(self, at: float, hits: int = 1) -> tuple[bool, int, int]:
        decision = await self.backend.decide([self.check(hits)], T0 + round(at * S))
        outcome = decision.outcomes[0]
        assert decision.admitted == (not outcome.over)
        return outcome.over, outcome.remaining, outcome.reset_us


ALL = list(Algorithm)


@pytest.mark.parametrize(("algorithm", "expected"), [
    (LOG, [(False, 2, 10 * S), (False, 1, 10 * S), (False, 0, 10 * S), (True, 0, 10 * S)]),
    # counter: within limit the current window ends in 9 s; over limit, this window's 3 hits become the
    # older window's and decay until 3 * (10 - e) / 10 <= 2, at e = 3.33 s of the next window
    (COUNTER, [(False, 2, 9 * S), (False, 1, 9 * S), (False, 0, 9 * S), (True, 0, 9 * S + 3_333_334)]),
    # bucket: time until full (one token per 3.33 s); over: one token away
    (BUCKET, [(False, 2, 3_333_334), (False, 1, 6_666_667), (False, 0, 10 * S), (True, 0, 3_333_334)]),
    (FIXED, [(False, 2, 9 * S), (False, 1, 9 * S), (False, 0, 9 * S), (True, 0, 9 * S)]),
])
async def test_fill_then_over(backend: Backend, key_prefix: str, algorithm: Algorithm,
                              expected: list[tuple[bool, int, int]]) -> None:
    limit = Limit(backend, algorithm, f"{key_prefix}fill")
    assert [await limit.hit(1.0) for _ in range(4)] == expected


@pytest.mark.parametrize(("algorithm", "admitted_after_boundary"), [
    (LOG, 0), (COUNTER, 0), (BUCKET, 0),
    (FIXED, 3),  # envoyproxy/ratelimit's fixed window: a full window's worth right after the edge
])
async def test_boundary_burst(backend: Backend, key_prefix: str, algorithm: Algorithm,
                              admitted_after_boundary: int) -> None:
    limit = Limit(backend, algorithm, f"{key_prefix}edge")
    assert [(await limit.hit(9.9))[0] for _ in range(3)] == [False] * 3
    after = [(await limit.hit(10.1))[0] for _ in range(3)]
    assert after.count(False) == admitted_after_boundary


@pytest.mark.parametrize("algorithm", ALL)
async def test_zero_limit_is_always_over(backend: Backend, key_prefix: str, algorithm: Algorithm) -> None:
    limit = Limit(backend, algorithm, f"{key_prefix}zero", limit=0)
    for at in (0.0, 5.0, 15.0, 100.0):
        over, remaining, _ = await limit.hit(at)
        assert (over, remaining) == (True, 0)


@pytest.mark.parametrize(("algorithm", "zero_limit", "too_many"), [
    (LOG, WINDOW, WINDOW),
    (COUNTER, WINDOW, WINDOW),
    # a bucket that never refills never fits: a year; 4 hits never fit a full bucket of 3: the time it
    # takes to fill from empty, one window
    (BUCKET, 31_536_000 * S, WINDOW),
    (FIXED, WINDOW - S, WINDOW - S),  # the window's end
])
async def test_what_never_fits_is_never_told_to_retry_now(
    backend: Backend, key_prefix: str, algorithm: Algorithm, zero_limit: int, too_many: int
) -> None:
    assert (await Limit(backend, algorithm, f"{key_prefix}zero", limit=0).hit(1.0))[2] == zero_limit
    assert await Limit(backend, algorithm, f"{key_prefix}full").hit(1.0, hits=4) == (True, 0, too_many)


@pytest.mark.parametrize("algorithm", ALL)
async def test_check_only_consumes_nothing(backend: Backend, key_prefix: str, algorithm: Algorithm) -> None:
    limit = Limit(backend, algorithm, f"{key_prefix}check")
    await limit.hit(1.0)
    assert [(await limit.hit(1.0, hits=0))[:2] for _ in range(5)] == [(False, 2)] * 5
    assert (await limit.hit(1.0))[:2] == (False, 1)


@pytest.mark.parametrize("algorithm", ALL)
async def test_hits_beyond_limit_never_fit_and_record_nothing(
    backend: Backend, key_prefix: str, algorithm: Algorithm
) -> None:
    limit = Limit(backend, algorithm, f"{key_prefix}huge", limit=4294967295)
    over, remaining, _ = await limit.hit(1.0, hits=2**64 - 1)
    assert (over, remaining) == (True, 0)
    if algorithm is not FIXED:  # the fixed window counts denied hits, as envoyproxy/ratelimit does
        assert (await limit.hit(1.0, hits=0))[:2] == (False, 4294967295)
    assert (await limit.hit(1.0, hits=4294967295))[0] is (algorithm is FIXED)


@pytest.mark.parametrize(("algorithm", "after_give_back", "then"), [
    (LOG, 2, [False, False, True]),
    (COUNTER, 2, [False, False, True]),
    (BUCKET, 2, [False, False, True]),
    (FIXED, 1, [False, True, True]),  # the denied hit had counted too
])
async def test_negative_hits_give_back(backend: Backend, key_prefix: str, algorithm: Algorithm,
                                       after_give_back: int, then: list[bool]) -> None:
    limit = Limit(backend, algorithm, f"{key_prefix}neg")
    await limit.hit(1.0, hits=3)
    assert (await limit.hit(1.0))[0] is True
    over, remaining, _ = await limit.hit(1.0, hits=-2)
    assert (over, remaining) == (False, after_give_back)
    assert [(await limit.hit(1.0))[0] for _ in range(3)] == then
    # giving back more than was taken stops at a full limit
    assert (await limit.hit(1.0, hits=-100))[:2] == (False, 3)


@pytest.mark.parametrize("algorithm", ALL)
async def test_window_rolls_on(backend: Backend, key_prefix: str, algorithm: Algorithm) -> None:
    limit = Limit(backend, algorithm, f"{key_prefix}roll")
    await limit.hit(1.0, hits=3)
    assert (await limit.hit(1.0))[0] is True
    # two windows later every algorithm has forgotten everything
    assert await limit.hit(21.0, hits=0) == (False, 3, 0 if algorithm is not FIXED else 9 * S)


async def test_one_call_decides_every_algorithm_all_or_nothing(backend: Backend, key_prefix: str) -> None:
    log = Limit(backend, LOG, f"{key_prefix}mixed-log")
    bucket = Limit(backend, BUCKET, f"{key_prefix}mixed-bucket", limit=1)
    counter = Limit(backend, COUNTER, f"{key_prefix}mixed-counter")
    await bucket.hit(1.0)  # the bucket is empty now
    decision = await backend.decide([log.check(), bucket.check(), counter.check()], T0 + S)
    assert not decision.admitted
    assert [o.over for o in decision.outcomes] == [False, True, False]
    assert [o.remaining for o in decision.outcomes] == [3, 0, 3]  # nothing recorded on the others
    assert (await log.hit(1.0, hits=0))[1] == 3 and (await counter.hit(1.0, hits=0))[1] == 3


async def test_fixed_window_counts_denied_hits_like_envoyproxy_ratelimit(backend: Backend, key_prefix: str) -> None:
    counted = Limit(backend, FIXED, f"{key_prefix}fw")
    other = Limit(backend, LOG, f"{key_prefix}fw-other", limit=0)
    # a request rejected by another limit still counts on the fixed window
    decision = await backend.decide([counted.check(), other.check()], T0 + S)
    assert not decision.admitted and decision.outcomes[0].remaining == 2
    assert [(await counted.hit(1.0))[:2] for _ in range(3)] == [(False, 1), (False, 0), (True, 0)]
    assert (await counted.hit(1.0, hits=0))[0] is True  # the denied hit counted: 4 > 3

    stopping = Limit(backend, FIXED, f"{key_prefix}fw-stop", stop_when_over=True)
    decision = await backend.decide([stopping.check(), other.check()], T0 + S)
    assert not decision.admitted and decision.outcomes[0].remaining == 3
    assert [(await stopping.hit(1.0))[:2] for _ in range(4)] == [(False, 2), (False, 1), (False, 0), (True, 0)]
    assert (await stopping.hit(1.0, hits=0))[:2] == (False, 0)  # the denied hit did not count


async def test_token_bucket_burst_and_exact_refill(backend: Backend, key_prefix: str) -> None:
    # 3 tokens per 10 s with room for 6: a burst of 6, then one token every 3.333... s, with no drift
    bucket = Limit(backend, BUCKET, f"{key_prefix}burst", burst=6)
    assert (await bucket.hit(0.0, hits=6))[:2] == (False, 0)
    assert (await bucket.hit(0.0))[2] == 3_333_334
    admitted_at = []
    for second in range(1, 1001):  # a request every second for 1,000 s: the k-th token is there at 10k/3 s
        if not (await bucket.hit(float(second)))[0]:
            admitted_at.append(second)
    assert admitted_at == [math.ceil(10 * k / 3) for k in range(1, 301)]


async def test_a_bucket_a_microsecond_short_of_its_tokens_is_over(backend: Backend, key_prefix: str) -> None:
    # 3 tokens per 10 s: emptied, it holds 3 again after exactly 10 s, and not a microsecond sooner
    bucket = Limit(backend, BUCKET, f"{key_prefix}short")
    assert (await bucket.hit(0.0, hits=3))[:2] == (False, 0)
    assert await bucket.hit(9.999999, hits=3) == (True, 0, 1)  # 2.9999997 tokens: one microsecond to go
    assert (await bucket.hit(10.0, hits=3))[:2] == (False, 0)


async def test_log_same_instant_requests_leave_together_without_phantoms(backend: Backend, key_prefix: str) -> None:
    # twelve requests in one microsecond (running counts 1..12 would sort "10" < "9" as text in Redis)
    limit = Limit(backend, LOG, f"{key_prefix}ties", limit=12)
    assert [(await limit.hit(1.0))[0] for _ in range(12)] == [False] * 12
    assert (await limit.hit(1.0))[0] is True
    # one window later every one of them has left: the whole limit is free again, twice over
    assert await limit.hit(11.1, hits=0) == (False, 12, 0)
    assert (await limit.hit(11.1, hits=12))[:2] == (False, 0)
    assert await limit.hit(21.2, hits=0) == (False, 12, 0)


@pytest.mark.parametrize("algorithm", [COUNTER, FIXED])
async def test_a_clock_stepping_back_resets_nothing(backend: Backend, key_prefix: str, algorithm: Algorithm) -> None:
    limit = Limit(backend, algorithm, f"{key_prefix}back")
    await limit.hit(10.5, hits=3)  # the window [10 s, 20 s) is full
    over, remaining, _ = await limit.hit(9.5)  # Redis TIME stepped back into the window before
    assert (over, remaining) == (True, 0)


async def test_log_giving_back_late_in_the_window_keeps_the_key(backend: Backend, key_prefix: str) -> None:
    # The key's expiry is set when hits are recorded; giving some back must not shorten it to what is left of
    # the window at the injected time (1 ms of real time here), or the hits still counted would vanish.
    limit = Limit(backend, LOG, f"{key_prefix}late-give")
    await limit.hit(0.0, hits=2)
    await limit.hit(9.999999, hits=-1)  # 1 µs before both hits leave the window
    await asyncio.sleep(0.005)
    assert (await limit.hit(9.999999, hits=0))[:2] == (False, 2)


async def test_giving_back_everything_empties_a_counter_holding_two_windows(backend: Backend, key_prefix: str) -> None:
    limit = Limit(backend, COUNTER, f"{key_prefix}empty", limit=10)
    await limit.hit(9.9, hits=10)
    await limit.hit(10.0, hits=1)  # the older window (10 hits) still weighs 10: over
    await limit.hit(19.99, hits=9)  # nearly all of the older window has decayed
    assert (await limit.hit(19.99, hits=-(2**64 - 1)))[:2] == (False, 10)


async def test_no_key_without_a_ttl(redis_url: str, key_prefix: str) -> None:
    backend = RedisBackend(redis_url)
    try:
        for algorithm in ALL:
            for step, hits in enumerate([1, 3, 0, -1, 2, 5, -100, 1]):
                checks = [Check(f"{key_prefix}{algorithm.value}-{i}", 3, WINDOW, hits, algorithm) for i in range(3)]
                await backend.decide(checks, T0 + step * S // 3)
    finally:
        await backend.close()
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"{key_prefix}*"))
    ttls = {k.decode(): client.pttl(k) for k in keys}
    client.close()
    assert len(ttls) >= len(ALL)
    # every key expires, in at most the time its state matters (two windows for the counter)
    assert all(0 < ttl <= 2 * WINDOW // 1000 for ttl in ttls.values()), ttls


@pytest.mark.parametrize("algorithm", [COUNTER, FIXED])
async def test_a_window_made_longer_by_a_reload_starts_afresh(
    backend: Backend, key_prefix: str, algorithm: Algorithm
) -> None:
    # a count kept by window number means another time once the window's length changes: it must not be read
    # as a window decades ahead (the counter would never decay, the fixed window reject until then)
    key = f"{key_prefix}longer"

    async def hit(window: int, at: float, hits: int = 1) -> tuple[bool, int, int]:
        decision = await backend.decide([Check(key, 3, window, hits, algorithm)], T0 + round(at * S))
        return decision.outcomes[0].over, decision.outcomes[0].remaining, decision.outcomes[0].reset_us

    assert await hit(WINDOW, 1.0, hits=3) == (False, 0, 9 * S)
    longer = 60 * S
    over, remaining, reset = await hit(longer, 2.0)
    assert not over and remaining == 2 and reset <= longer
    assert (await hit(longer, 2.0, hits=2))[:2] == (False, 0)
    assert (await hit(longer, 2.0))[0]  # and from here it counts in the longer window


async def test_a_buckets_tokens_carry_over_a_change_of_rate(backend: Backend, key_prefix: str) -> None:
    key = f"{key_prefix}rate"

    async def take(limit: int, hits: int = 1) -> bool:
        decision = await backend.decide([Check(key, limit, 60 * S, hits, BUCKET)], T0)
        return decision.admitted

    assert await take(3, hits=2)  # 1 token left of 3
    assert await take(7)  # the same token, counted in the finer ticks of 7 a minute
    assert not await take(7)
    assert await take(7, hits=-1)  # give it back
    assert await take(3)  # one token, whatever the rate
    assert not await take(3)
    # a bucket whose ticks pass 2^53 is stored as tokens and a fraction, a smaller one in ticks, as earlier
    # versions read it: the same token goes back and forth between the two forms, never kept twice
    assert await take(3, hits=-2)  # 2 tokens: 40,000,000 ticks of 20,000,000
    assert await take(4294967295, hits=2)  # a token is 4,000,000 ticks here: stale ticks would be 10 tokens
    assert not await take(4294967295)
    assert not await take(3)
    assert await take(3, hits=-1)
    assert await take(4294967295)
    assert not await take(3)


async def test_a_log_rejection_renews_the_keys_expiry(redis_url: str, key_prefix: str) -> None:
    # a reload that made the window longer: the key must live as long as its hits count in the new window
    backend = RedisBackend(redis_url)
    key = f"{key_prefix}renew"
    try:
        for _ in range(3):
            await backend.decide([Check(key, 3, 60 * S, 1)])
        assert not (await backend.decide([Check(key, 3, 3600 * S, 1)])).admitted
        client = redis.Redis.from_url(redis_url)
        ttl = client.pttl(key)
        client.close()
        assert 3_590_000 < ttl <= 3_600_000
    finally:
        await backend.close()


@pytest.mark.parametrize(("algorithm", "fields"), [(FIXED, ("w", "c")), (COUNTER, ("i", "c"))])
async def test_a_key_from_before_window_lengths_were_stored_is_not_read_as_a_far_window(
    redis_url: str, key_prefix: str, algorithm: Algorithm, fields: tuple[str, str]
) -> None:
    # an earlier version wrote no window length: its 1 s window number, read in hours, is decades ahead
    key = f"{key_prefix}old"
    client = redis.Redis.from_url(redis_url)
    client.hset(key, mapping={fields[0]: T0 // S, fields[1]: 5})
    client.pexpire(key, 60_000)
    backend = RedisBackend(redis_url)
    try:
        decision = await backend.decide([Check(key, 10, 3600 * S, 1, algorithm)], T0)
        assert (decision.admitted, decision.outcomes[0].remaining) == (True, 9)
        assert 0 < client.pttl(key) <= 2 * 3600 * 1000
    finally:
        await backend.close()
        client.close()


async def test_expiries_follow_a_slower_rate_and_a_longer_window_without_writes(
        redis_url: str, key_prefix: str) -> None:
    backend = RedisBackend(redis_url)
    client = redis.Redis.from_url(redis_url)
    bucket, log = f"{key_prefix}slower", f"{key_prefix}gave"
    try:
        # a bucket drained at 10 a second, then a reload to 10 per 100 s: a rejection renews its expiry
        assert (await backend.decide([Check(bucket, 10, S, 10, BUCKET)], T0)).admitted
        assert not (await backend.decide([Check(bucket, 10, 100 * S, 1, BUCKET)], T0)).admitted
        assert client.pttl(bucket) > 90_000
        # a log whose window grew, then hits only given back: the rest still need the longer window
        assert (await backend.decide([Check(log, 5, S, 2)], T0)).admitted
        assert (await backend.decide([Check(log, 5, 100 * S, -1)], T0)).admitted
        assert client.pttl(log) > 90_000
    finally:
        await backend.close()
        client.close()


async def test_the_largest_token_bucket_config_allows_counts_exactly(
    backend: Backend, key_prefix: str, write_config: Callable[..., Path], clock: Clock
) -> None:
    # 4294967295 a minute: a token is 4,000,000 ticks, a full bucket about 2^64 of them (once refused at load)
    config = load_directory(write_config("""
        domain: big
        descriptors:
          - key: k
            rate_limit: {unit: minute, requests_per_unit: 4294967295, algorithm: token_bucket}
    """))
    limiter = Limiter(lambda: config, backend, LimiterOptions(key_prefix=key_prefix), clock=clock)

    async def take(hits: int) -> tuple[bool, int, int]:
        [status] = await limiter.should_rate_limit("big", [Descriptor((("k", "v"),), hits_addend=hits)])
        return status.over, status.remaining, status.reset_us

    start = clock.now_us
    assert await take(4294967295) == (False, 0, 60 * S)
    assert await take(1) == (True, 0, 1)  # a token takes 60 s / 4294967295 = 0.014 µs
    clock.now_us = start + S  # 4294967295 / 60 = 71582788.25 tokens back, 59 s from full
    assert await take(0) == (False, 71582788, 59 * S)
    assert await take(71582788) == (False, 0, 60 * S)  # 0.25 token left: 60 s less 3.5 ns, rounded up
    assert await take(1) == (True, 0, 1)
    clock.now_us = start + 61 * S - 1  # 0.25 + 59,999,999 µs x 71.58 tokens
    assert await take(0) == (False, 4294967223, 1)
    clock.now_us = start + 61 * S
    assert await take(0) == (False, 4294967295, 0)
    assert await take(4294967295) == (False, 0, 60 * S)


async def test_a_bucket_stored_in_ticks_by_an_earlier_version_carries_on(redis_url: str, key_prefix: str) -> None:
    # An earlier version stored {t = ticks, u, p = ticks per token}. 3 tokens per 10 s: a token is 10/3 s,
    # 10,000,000 ticks at 3 ticks a microsecond; 2.5 tokens were left at T0.
    key = f"{key_prefix}old-bucket"
    client = redis.Redis.from_url(redis_url)
    client.hset(key, mapping={"t": 25_000_000, "u": T0, "p": 10_000_000})
    client.pexpire(key, 60_000)
    backend = RedisBackend(redis_url)
    try:
        bucket = Limit(backend, BUCKET, key)
        assert await bucket.hit(0.0, hits=0) == (False, 2, 1_666_667)
        # half a second refills 1,500,000 ticks: 2.65 tokens, 0.35 short of 3
        assert await bucket.hit(0.5, hits=3) == (True, 0, 1_166_667)
        assert await bucket.hit(0.5, hits=2) == (False, 0, 7_833_334)
        # stored as earlier versions read it: 0.65 token left
        assert client.hmget(key, "t", "n") == [b"6500000", None]
    finally:
        await backend.close()
        client.close()


async def test_a_buckets_fraction_of_a_token_carries_over_a_change_of_rate_exactly(
        backend: Backend, key_prefix: str) -> None:
    key = f"{key_prefix}frac"

    async def take(limit: int, at: int, hits: int) -> tuple[bool, int, int]:
        decision = await backend.decide([Check(key, limit, 60 * S, hits, BUCKET)], T0 + at)
        return decision.admitted, decision.outcomes[0].remaining, decision.outcomes[0].reset_us

    # 2 a minute: a token is 30,000,000 ticks, one a microsecond; 1,851 µs after emptying, 1,851 ticks are back
    assert (await take(2, 0, 2))[:2] == (True, 0)
    assert (await take(2, 1851, 0))[:2] == (True, 0)
    # 1 a minute from that instant: a token is 60,000,000 ticks and the fraction is 3,702 of them (doubles
    # made it 1851 / 30e6 x 60e6 = 3701.9999..., rounded down to 3,701)
    assert await take(1, 1851, 1) == (False, 0, 60 * S - 3702)


def test_the_buckets_exact_arithmetic_at_its_edges(redis_url: str) -> None:
    # lua/token_bucket.lua's muldiv and refill_time against Python's integers, on the values near 2^53 where
    # doubles would round: windows up to 2^53 µs, rates up to 2^32 - 1, bursts up to 2^32 - 1
    harness = ("local algorithms = {}\nlocal function fmt(x) return string.format('%.0f', x) end\n"
               "local function extend_us() end\nlocal function pexpire_us() end\n"
               + (resource_dir("lua") / "token_bucket.lua").read_text() + """
local out = {}
for i = 1, #ARGV, 5 do
  local a, b, c = tonumber(ARGV[i]), tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local q, r = muldiv(a, b, c)
  local st = {per_token = c, per_us = tonumber(ARGV[i + 4])}
  out[#out + 1] = fmt(q) .. ' ' .. fmt(r) .. ' ' .. fmt(refill_time(st, tonumber(ARGV[i + 3]), math.fmod(a, c)))
end
return out
""")
    rnd = random.Random(53)
    top = 2**53 - 1

    def near(limit: int) -> int:
        choices: list[int] = [rnd.randrange(1, limit), limit - rnd.randrange(0, 1000),
                              2 ** rnd.randrange(1, limit.bit_length()) - 1]
        return rnd.choice(choices)

    cases: list[tuple[int, int, int, int, int]] = []
    while len(cases) < 20_000:
        a, b, c = near(top), near(top), near(9007199254 * 10**6)
        if a * b // c < 2**53:
            cases.append((a, b, c, rnd.choice([1, 2, near(2**32)]), near(2**32)))
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        for i in range(0, len(cases), 2000):
            chunk = cases[i:i + 2000]
            got = client.eval(harness, 0, *(x for case in chunk for x in case))
            expected = [f"{q} {r} {min(2**51, -(-(k * c - a % c) // per_us))}"
                        for (a, b, c, k, per_us) in chunk for q, r in [divmod(a * b, c)]]
            assert got == expected
    finally:
        client.close()
