"""Decisions per second in one process against one Redis, without gRPC (called by bench/run.py).

    python bench/core_rate.py NAME REDIS_URL CALLS

NAME: slidegate-log, slidegate-counter (slidegate's Limiter on uvloop, 100 concurrent callers, so its
batching works as in the server), limits-moving-window, limits-sliding-window (the `limits` library,
synchronous: how it is used) or throttled-sliding-window (throttled-py, synchronous). Each call decides one
hit of one of 10,000 keys, all within their limit. Prints the rate.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
import uuid
from pathlib import Path

import uvloop

KEYS = 10_000


def slidegate_rate(algorithm: str, url: str, calls: int) -> float:
    from slidegate.backends.redis import RedisBackend
    from slidegate.config import load_directory
    from slidegate.limiter import Descriptor, Limiter, LimiterOptions

    with tempfile.TemporaryDirectory(prefix="slidegate-core-rate-") as work:
        directory = Path(work)
        (directory / "c.yaml").write_text(f"domain: core\ndescriptors:\n  - key: k\n    rate_limit: {{unit: hour, "
                                          f"requests_per_unit: 1000000000, algorithm: {algorithm}}}\n")
        config = load_directory(directory)

    async def run() -> float:
        backend = RedisBackend(url, timeout=5)
        limiter = Limiter(lambda: config, backend, LimiterOptions(key_prefix=f"core-{uuid.uuid4().hex[:6]}:"))
        per_caller = calls // 100

        async def caller(c: int) -> None:
            for i in range(per_caller):
                await limiter.should_rate_limit("core", [Descriptor((("k", str((c * per_caller + i) % KEYS)),))])

        await caller(0)  # connect and load the script first
        started = time.perf_counter()
        await asyncio.gather(*(caller(c) for c in range(100)))
        elapsed = time.perf_counter() - started
        await backend.close()
        return per_caller * 100 / elapsed

    return uvloop.run(run())


def limits_rate(strategy: str, url: str, calls: int) -> float:
    from limits import RateLimitItemPerHour, storage, strategies

    store = storage.storage_from_string(url)
    limiter = (strategies.MovingWindowRateLimiter if strategy == "moving" else
               strategies.SlidingWindowCounterRateLimiter)(store)
    item = RateLimitItemPerHour(1_000_000_000)
    prefix = uuid.uuid4().hex[:6]
    limiter.hit(item, prefix, "warm")
    started = time.perf_counter()
    for i in range(calls):
        limiter.hit(item, prefix, str(i % KEYS))
    return calls / (time.perf_counter() - started)


def throttled_rate(url: str, calls: int) -> float:
    from throttled import RateLimiterType, Throttled, rate_limiter, store

    throttle = Throttled(using=RateLimiterType.SLIDING_WINDOW.value, quota=rate_limiter.per_hour(1_000_000_000),
                         store=store.RedisStore(server=url))
    prefix = uuid.uuid4().hex[:6]
    throttle.limit(f"{prefix}:warm")
    started = time.perf_counter()
    for i in range(calls):
        throttle.limit(f"{prefix}:{i % KEYS}")
    return calls / (time.perf_counter() - started)


def main() -> None:
    name, url, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if name.startswith("slidegate-"):
        rate = slidegate_rate({"log": "sliding_window_log", "counter": "sliding_window_counter"}[name[10:]], url,
                              calls)
    elif name.startswith("limits-"):
        rate = limits_rate("moving" if "moving" in name else "sliding", url, calls)
    else:
        rate = throttled_rate(url, calls)
    print(f"{name} {rate:.0f}")


if __name__ == "__main__":
    main()
