"""Property tests: random traffic, hits and clock steps; the Redis backend must agree with the reference model
decision by decision."""

from __future__ import annotations

import asyncio
import uuid

import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from slidegate.backends.base import Check
from slidegate.backends.redis import RedisBackend

from tests.models import SlidingWindowLogModel

LIMITS = [(1, 500_000), (3, 1_000_000), (5, 2_000_000), (0, 1_000_000), (8, 10_000_000)]  # (limit, window us)

step = st.tuples(
    # clock step in microseconds: coarse steps land exactly on window edges, fine ones between them
    st.one_of(st.sampled_from([0, 1, 250_000, 499_999, 500_000, 1_000_000]), st.integers(0, 1_500_000)),
    st.lists(st.tuples(st.integers(0, len(LIMITS) - 1), st.integers(0, 4)), min_size=1, max_size=3),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(step, min_size=1, max_size=40))
def test_redis_agrees_with_model(redis_url: str, steps: list[tuple[int, list[tuple[int, int]]]]) -> None:
    prefix = f"sgprop-{uuid.uuid4().hex}:"

    async def run() -> None:
        backend = RedisBackend(redis_url, timeout=2)
        model = SlidingWindowLogModel()
        now = 1_700_000_000_000_000
        try:
            for clock_step, picks in steps:
                now += clock_step
                checks = [Check(f"{prefix}{i}", LIMITS[i][0], LIMITS[i][1], hits) for i, hits in picks]
                decision = await backend.decide(checks, now)
                admitted, expected = model.decide(now, [(c.key, c.limit, c.window_us, c.hits) for c in checks])
                got = [(o.over, o.remaining, o.reset_us) for o in decision.outcomes]
                assert (decision.admitted, got) == (admitted, [(e.over, e.remaining, e.reset_us) for e in expected])
        finally:
            await backend.close()

    try:
        asyncio.run(run())
    finally:
        client = redis.Redis.from_url(redis_url)
        keys = list(client.scan_iter(match=f"{prefix}*"))
        if keys:
            client.delete(*keys)
        client.close()
