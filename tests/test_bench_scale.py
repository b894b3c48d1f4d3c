"""bench/scale.py fills Redis with the keys slidegate would write: the same names, the same layout."""

from __future__ import annotations

import redis

from bench.scale import CONFIG, LIMIT, path_of, populate, unlink
from slidegate.backends.redis import RedisBackend
from slidegate.config.loader import load_texts
from slidegate.limiter import Descriptor, Limiter, LimiterOptions


async def test_populated_keys_are_the_ones_slidegate_counts(redis_url: str, key_prefix: str) -> None:
    paths = [path_of(i) for i in range(7)]
    assert populate(redis_url, key_prefix, paths, batch=3) == 7  # batches of 3, 3 and 1
    client = redis.Redis.from_url(redis_url)
    assert len(list(client.scan_iter(match=f"{key_prefix}*"))) == 7
    config = load_texts([("bench.yaml", CONFIG)])
    backend = RedisBackend(redis_url, timeout=5)
    try:
        limiter = Limiter(lambda: config, backend, LimiterOptions(key_prefix=key_prefix))
        plan = limiter.prepare("bench", [Descriptor((("path", paths[3]),))])
        [status] = (await limiter.decide(plan)).statuses
        # slidegate counted its second hit on the populated key, and wrote no key of its own
        assert status.remaining == LIMIT - 2
        assert len(list(client.scan_iter(match=f"{key_prefix}*"))) == 7
        unlink(redis_url, key_prefix, paths)
        assert list(client.scan_iter(match=f"{key_prefix}*")) == []
    finally:
        await backend.close()
        client.close()
