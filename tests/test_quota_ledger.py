"""The quota ledger (slidegate.quotas.ledger and its twin lua/quota.lua): the two keep the same books, and
Envoys enforcing what it assigns never admit more than the limit in any window (tests/envoy_quota_model.py)."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slidegate.quotas import ledger
from slidegate.quotas.ledger import Assignment, bucket_for
from slidegate.quotas.storage import MemoryQuotas, Quota
from slidegate.resources import resource_dir
from tests.envoy_quota_model import T0, simulate


@pytest.fixture(scope="module")
def lua(redis_url: str) -> Iterator[tuple[redis.Redis, str]]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    sha = client.script_load((resource_dir("lua") / "quota.lua").read_text())
    yield client, sha
    client.close()


@pytest.mark.parametrize("limit", [1, 2, 3, 5, 10, 1000, 2**32 - 1])
@pytest.mark.parametrize("window_ms", [1000, 10_000, 60_000, 3_600_000, 86_400_000])
def test_a_bucket_admits_at_most_its_share_in_any_window(limit: int, window_ms: int) -> None:
    for share in sorted({0, 1, 2, 3, limit // 2, limit - 1, limit}):
        if share < 0:
            continue
        b = bucket_for(share, limit, window_ms)
        if b.denies:
            assert share == 0 or (share == 1 and limit > 1)
            continue
        # starts full (m), refills t per fill interval continuously: m + t x W / interval in a window W
        assert b.max_tokens + b.tokens_per_fill * window_ms // b.fill_interval_ms <= share
        assert b.max_tokens >= 1 and b.tokens_per_fill >= 1
        assert b.fill_interval_ms % 1000 == 0 and b.fill_interval_ms >= window_ms  # whole seconds, no faster


def test_a_lone_envoy_gets_the_whole_limit_as_a_burst() -> None:
    state: dict[str, str] = {}
    first = ledger.report(state, 5, 60_000, "a", 1, 0, 0, T0)
    assert first == Assignment(4, 1, 60_000)  # 4 at once (besides the request before it), 1 more a minute
    assert ledger.booked(state, 60_000, T0) == 5000


def test_a_newcomer_gets_nothing_until_the_limit_has_room() -> None:
    state: dict[str, str] = {}
    assert ledger.report(state, 5, 60_000, "a", 1, 0, 0, T0) == Assignment(4, 1, 60_000)
    assert ledger.report(state, 5, 60_000, "b", 1, 0, 0, T0 + 1000).denies
    ledger.report(state, 5, 60_000, "a", 4, 10, 5000, T0 + 5000)
    # both keep asking: a keeps its bucket for a window (shrunk at once, what it may still let through would stay
    # booked and nobody would get anything); then a is shrunk, and what it let through stays booked for a window
    shared_at = None
    for now in range(T0 + 10_000, T0 + 200_000, 5000):
        a = ledger.report(state, 5, 60_000, "a", 0, 10, 5000, now)
        b = ledger.report(state, 5, 60_000, "b", 0, 10, 5000, now + 1000)
        if now < T0 + ledger.SETTLE_MS:
            assert a == Assignment(4, 1, 60_000) and b.denies, now
        if shared_at is None and not a.denies and not b.denies:
            shared_at = now
        assert ledger.booked(state, 60_000, now + 1000) <= 5000
    assert shared_at is not None and shared_at <= T0 + 2 * 60_000 + 10_000, shared_at


def test_a_released_holder_stays_booked_until_its_ttl_and_a_window_passed() -> None:
    state: dict[str, str] = {}
    ledger.report(state, 10, 10_000, "a", 1, 0, 0, T0)
    ledger.release(state, 10_000, "a", T0 + 1000)
    assert "h:a" not in state
    free_at = T0 + 1000 + ledger.TTL_MS + ledger.SLACK_MS + 10_000
    assert ledger.report(state, 10, 10_000, "b", 1, 0, 0, free_at - 1).denies
    assert not ledger.report(state, 10, 10_000, "b", 0, 5, 5000, free_at).denies


def test_a_holder_not_heard_from_is_retired_after_its_lease() -> None:
    state: dict[str, str] = {}
    ledger.report(state, 10, 1000, "a", 1, 0, 0, T0)
    ledger.report(state, 10, 1000, "b", 1, 0, 0, T0 + ledger.LEASE_MS)
    assert "h:a" not in state and any(name.startswith("r:") for name in state)


def test_retired_bookings_stay_bounded() -> None:
    state: dict[str, str] = {}
    now = T0
    rng = random.Random(7)
    for step in range(400):
        now += 5000
        holder = f"h{step % 50}"
        if rng.random() < 0.3:
            ledger.release(state, 3_600_000, holder, now)
        else:
            ledger.report(state, 1000, 3_600_000, holder, rng.randrange(50), rng.randrange(50), 5000, now)
        assert sum(name.startswith("r:") for name in state) <= ledger.MAX_RETIRED
        assert ledger.booked(state, 3_600_000, now) <= 1000 * 1000


# one step of a random history: (holder, kind, allowed, denied, elapsed ms, ms to advance first, owner)
steps = st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["report", "report", "release", "detach"]),
                           st.integers(0, 30), st.integers(0, 30), st.sampled_from([0, 1000, 5000, 6000]),
                           st.integers(0, 20_000), st.sampled_from(["", "s1", "s2"])), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=steps, limit=st.sampled_from([1, 2, 5, 17, 100]),
       window_ms=st.sampled_from([1000, 10_000, 60_000]))
def test_the_lua_keeps_the_same_books(lua: tuple[redis.Redis, str], history: list[tuple[str, str, int, int, int,
                                      int, str]], limit: int, window_ms: int) -> None:
    client, sha = lua
    key = f"test-quota-{uuid.uuid4().hex}"
    state: dict[str, str] = {}
    now = T0
    try:
        for holder, kind, allowed, denied, elapsed, advance, owner in history:
            now += advance
            unsure = allowed % 7  # another bucket Envoy may hold (the service's Bucket.unsure)
            if kind == "release":
                ledger.release(state, window_ms, holder, now, unsure)
                client.evalsha(sha, 1, key, "release", now, limit, window_ms, holder, unsure)
            elif kind == "detach":
                ledger.detach(state, window_ms, holder, owner, now, unsure)
                client.evalsha(sha, 1, key, "detach", now, limit, window_ms, holder, owner, unsure)
            else:
                try:
                    ours: Assignment | None = ledger.report(state, limit, window_ms, holder, allowed, denied, elapsed,
                                                            now, owner)
                except ledger.HolderTaken:
                    ours = None
                theirs = client.evalsha(sha, 1, key, "report", now, limit, window_ms, holder, allowed, denied,
                                        elapsed, owner)
                assert (Assignment(*map(int, theirs)) if int(theirs[0]) >= 0 else None) == ours
            assert client.hgetall(key) == state
            booked = ledger.booked(state, window_ms, now)
            assert int(client.evalsha(sha, 1, key, "booked", now, limit, window_ms)) == booked
    finally:
        client.delete(key)


@settings(max_examples=40, deadline=None)
@given(limit=st.sampled_from([1, 2, 5, 20, 100]), window_s=st.sampled_from([1, 10, 60]),
       rates=st.lists(st.sampled_from([0.0, 0.2, 1.0, 5.0, 40.0]), min_size=1, max_size=3),
       delay=st.sampled_from([0.0, 0.05, 0.5]), reconnect=st.sampled_from([0.0, 0.0, 17.0]),
       seed=st.integers(0, 2**16))
def test_envoys_never_admit_more_than_the_limit_in_any_window(limit: int, window_s: int, rates: list[float],
                                                              delay: float, reconnect: float, seed: int) -> None:
    _, most = simulate(limit, window_s, rates, seconds=4 * window_s + 30, delay=delay, seed=seed,
                       reconnect_every=reconnect)
    assert most <= limit


def test_a_busy_envoy_gets_most_of_the_limit_and_an_idle_one_little() -> None:
    envoys, most = simulate(100, 60, [50.0, 0.2], seconds=600, delay=0.01, seed=1)
    assert most <= 100
    busy = sum(1 for t, free in envoys[0].admitted_at if not free and t > 120)
    idle = sum(1 for t, free in envoys[1].admitted_at if not free and t > 120)
    # 480 s at 100 a minute is 800: the busy Envoy gets most of it, the idle one what it asks (0.2/s)
    assert busy >= 0.7 * 800, busy
    assert idle >= 0.4 * 0.2 * 480, idle


async def test_memory_quotas_keep_the_ledgers_books() -> None:
    now = [T0]
    quotas = MemoryQuotas(clock=lambda: now[0])
    quota = Quota("q", 5, 60_000)
    assert await quotas.report(quota, "a", 1, 0, 0, "s1") == Assignment(4, 1, 60_000)
    assert await quotas.booked(quota) == 5000
    await quotas.release(quota, "a")
    now[0] += ledger.LEASE_MS + ledger.TTL_MS + ledger.SLACK_MS + 60_000
    assert await quotas.booked(quota) == 0
    assert quotas.state("q") == {} or await quotas.report(quota, "b", 1, 0, 0, "s2") == Assignment(4, 1, 60_000)
