"""The quota service when its Redis fails: SCRIPT FLUSH between reports books as if nothing happened (the
in-memory ledger keeping the same books), and a stopped or paused Redis gets each quota bucket the failure
mode's answer (FAILURE_MODE) in time, with the breaker opening on a paused Redis and closing once it answers."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import pytest
import redis

from slidegate.application import Application, build
from slidegate.backends.breaker import Breaker
from slidegate.backends.redis_connect import Topology
from slidegate.quotas.fallback import FALLBACK_TTL_MS
from slidegate.quotas.ledger import SLACK_MS
from slidegate.quotas.storage import MemoryQuotas, Quota, RedisQuotas
from slidegate.settings import Settings
from tests.redis_servers import RedisServer
from tests.test_quota_hostile import opened, serving
from tests.test_quota_service import ALLOW_ALL, CONFIG, DENY_ALL, Stream, actions, key, user

T0 = 1_700_000_000_000


@pytest.mark.parametrize("seed", range(4))
async def test_redis_quotas_keep_the_memory_ledgers_books_across_script_flushes(
        private_redis: RedisServer, seed: int) -> None:
    """A random history of reports, releases and SCRIPT FLUSHes: RedisQuotas answers and books what MemoryQuotas
    (the reference model) does, step by step."""
    rng = random.Random(seed)
    memory, stored = MemoryQuotas(clock=lambda: 0), RedisQuotas(Topology("single", private_redis.url), timeout=1.0)
    client = redis.Redis(port=private_redis.port)
    quota = Quota(f"flush-{seed}:quota:20:10000", 20, 10_000)
    now = T0
    try:
        for _ in range(60):
            now += rng.choice([0, 500, 5000, 6000])
            holder = rng.choice(["a", "b", "c"])
            if rng.random() < 0.2:
                client.script_flush()
            if rng.random() < 0.2:
                await memory.release(quota, holder, 1, now_ms=now)
                await stored.release(quota, holder, 1, now_ms=now)
            else:
                usage = (holder, rng.randrange(10), rng.randrange(5), rng.choice([0, 5000]), "s1")
                assert await stored.report(quota, *usage, now_ms=now) == await memory.report(quota, *usage,
                                                                                             now_ms=now)
            assert await stored.booked(quota, now_ms=now) == await memory.booked(quota, now_ms=now)
    finally:
        await stored.close()
        client.close()


async def started(server: RedisServer, tmp_path: object, write_config: object, **flags: str) -> Application:
    settings = {"config_dir": str(write_config(CONFIG)), "backend_type": "redis",  # type: ignore[operator]
                "redis_url": server.url, "redis_timeout": "100ms", **flags}
    return build(Settings.load({}, settings))


async def timed(stream: Stream, name: str) -> tuple[float, Any]:
    begun = time.monotonic()
    answer = actions(await stream.report((user(name), 1, 0)))[key(user(name))]
    return time.monotonic() - begun, answer.quota_assignment_action


@pytest.mark.parametrize("mode", ["allow", "deny", "local"])
async def test_a_stopped_redis_gets_quota_buckets_the_failure_modes_answer(
        private_redis: RedisServer, write_config: object, mode: str) -> None:
    app = await started(private_redis, None, write_config, failure_mode=mode, local_limit_replicas="2")
    try:
        async with serving(app) as channel:
            stream = opened(channel)
            _, first = await timed(stream, "ann")
            assert first.rate_limit_strategy.HasField("token_bucket")
            private_redis.stop()
            spent, action = await timed(stream, "ann")
            assert spent < SLACK_MS / 1000
            strategy = action.rate_limit_strategy
            if mode == "local":  # this replica's half of 5 a minute, rounded up: 3
                bucket = strategy.token_bucket
                assert 0 < bucket.max_tokens + bucket.tokens_per_fill.value <= 3, bucket
            else:
                assert strategy.blanket_rule == (ALLOW_ALL if mode == "allow" else DENY_ALL)
                assert action.assignment_time_to_live.ToMilliseconds() == FALLBACK_TTL_MS
            assert app.metrics.registry.get_sample_value("ratelimit_quota_degraded_assignments_total",
                                                         {"mode": mode}) == 1
    finally:
        await app.backend.close()
        await app.quotas.close()


async def test_a_stopped_redis_leaves_quota_buckets_unanswered_by_default(
        private_redis: RedisServer, write_config: object) -> None:
    """FAILURE_MODE=error (the default, as for decisions): Envoy's expired_assignment_behavior decides; the
    stream still answers its blanket buckets."""
    app = await started(private_redis, None, write_config)
    try:
        async with serving(app) as channel:
            stream = opened(channel)
            await timed(stream, "ann")
            private_redis.stop()
            answer = actions(await stream.report((user("ann"), 1, 0), (user("free"), 1, 0), answered=1))
            assert list(answer) == [key(user("free"))]
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(stream.call.read(), 1.5)
    finally:
        await app.backend.close()
        await app.quotas.close()


async def test_a_paused_redis_opens_the_quota_breaker_and_answers_come_at_once(
        private_redis: RedisServer) -> None:
    """CLIENT PAUSE: the first reports wait out the timeout (each answered by the failure mode in time), then
    the breaker opens and reports fail at once; after the pause a probe gets the ledger's answers again."""
    storage = RedisQuotas(Topology("single", private_redis.url), timeout=0.3, breaker=Breaker())
    client = redis.Redis(port=private_redis.port)
    quota = Quota("paused:quota:5:60000", 5, 60_000)
    try:
        await storage.report(quota, "a", 1, 0, 0, "s1")
        # long enough for the six reports below; no longer, as Redis 7.0 holds CLIENT UNPAUSE itself till its end
        client.execute_command("CLIENT", "PAUSE", 4_000, "ALL")
        spent = []
        for _ in range(6):
            begun = time.monotonic()
            with pytest.raises(Exception, match="quotas at"):
                await storage.report(quota, "a", 1, 0, 5000, "s1")
            spent.append(time.monotonic() - begun)
        assert all(s < 0.5 for s in spent), spent
        assert spent[-1] < 0.05 and spent[0] >= 0.25, spent  # refused at once once the breaker opened
        client.execute_command("CLIENT", "UNPAUSE")
        for _ in range(30):  # a probe every second finds it back
            try:
                await storage.report(quota, "a", 1, 0, 5000, "s1")
                break
            except Exception:
                await asyncio.sleep(0.1)
        else:
            raise AssertionError("the breaker never closed")
    finally:
        client.execute_command("CLIENT", "UNPAUSE")
        await storage.close()
        client.close()


async def test_thousands_of_reports_at_once_are_all_booked_by_a_healthy_redis(private_redis: RedisServer) -> None:
    """3000 reports at once, far more than the places at Redis: each waits for one however long it takes (the
    ledger books it at Redis's clock), and only its time at Redis counts against the timeout."""
    storage = RedisQuotas(Topology("single", private_redis.url), timeout=0.05, pool_size=4, breaker=Breaker())
    quotas = [Quota(f"crowd:{i}:quota:100:60000", 100, 60_000) for i in range(150)]
    try:
        answers = await asyncio.gather(*(storage.report(q, f"h{n}", 1, 0, 0, f"s{n}")
                                         for n in range(20) for q in quotas), return_exceptions=True)
        assert [a for a in answers if isinstance(a, BaseException)] == []
        assert [await storage.booked(q) for q in quotas[:3]] == [100_000] * 3  # the whole limit, shared out
    finally:
        await storage.close()


async def test_a_paused_redis_fails_a_queue_of_reports_within_a_few_timeouts(private_redis: RedisServer) -> None:
    """400 reports queued behind a paused Redis: a timeout per place at Redis in turn would take 15 s; the
    breaker opens and the rest fail at once."""
    storage = RedisQuotas(Topology("single", private_redis.url), timeout=0.3, pool_size=8, breaker=Breaker())
    client = redis.Redis(port=private_redis.port)
    quota = Quota("queued:quota:5:60000", 5, 60_000)
    try:
        await storage.report(quota, "a", 1, 0, 0, "s1")
        client.execute_command("CLIENT", "PAUSE", 2_500, "ALL")  # its end is awaited (UNPAUSE waits for it)
        begun = time.monotonic()
        answers = await asyncio.gather(*(storage.report(quota, f"h{n}", 1, 0, 0, "s1") for n in range(400)),
                                       return_exceptions=True)
        spent = time.monotonic() - begun
        assert all(isinstance(a, Exception) and "quotas at" in str(a) for a in answers), answers[:3]
        assert spent < 2.0, spent
    finally:
        client.execute_command("CLIENT", "UNPAUSE")
        await storage.close()
        client.close()
