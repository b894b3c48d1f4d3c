"""Redis memory per limit key for each algorithm, measured with MEMORY USAGE.

Each algorithm gets one key filled the same way: a limit of N per minute and N admitted requests of one hit
each (for the log, that is its largest size), for N = 100 and 1,000 (Redis keeps small sorted sets in a compact
encoding up to 128 members). Prints a markdown table; docs/algorithms.md shows it (tests/test_accuracy.py checks
that page against a new measurement).

    python bench/memory_per_key.py [REDIS_URL]
"""

from __future__ import annotations

import argparse
import asyncio
import uuid

import redis

from slidegate.algorithms import Algorithm
from slidegate.backends.base import Check
from slidegate.backends.redis import RedisBackend

LIMITS = (100, 1000)
WINDOW_US = 60_000_000


async def measure(url: str) -> dict[tuple[Algorithm, int], int]:
    """Bytes of one full key per algorithm (MEMORY USAGE ... SAMPLES 0, i.e. every element counted)."""
    backend = RedisBackend(url, timeout=5)
    client = redis.Redis.from_url(url)
    prefix = f"sgbench-{uuid.uuid4().hex[:8]}:"
    sizes: dict[tuple[Algorithm, int], int] = {}
    try:
        for algorithm in Algorithm:
            for limit in LIMITS:
                key = f"{prefix}{algorithm.value}{{{limit}:d1:k3:abc}}"
                now = 1_700_000_000_000_000
                for i in range(limit):
                    decision = await backend.decide([Check(key, limit, WINDOW_US, 1, algorithm)], now + i * 1000)
                    assert decision.admitted
                sizes[(algorithm, limit)] = int(client.memory_usage(key, samples=0) or 0)
    finally:
        keys = list(client.scan_iter(match=f"{prefix}*"))
        if keys:
            client.delete(*keys)
        client.close()
        await backend.close()
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("redis_url", nargs="?", default="redis://127.0.0.1:6379/0", metavar="REDIS_URL",
                        help="the Redis to measure on (default redis://127.0.0.1:6379/0; its keys are removed after)")
    sizes = asyncio.run(measure(parser.parse_args().redis_url))
    print("| algorithm | bytes per full key, limit 100 | limit 1,000 |")
    print("|---|---|---|")
    for algorithm in Algorithm:
        print(f"| `{algorithm.value}` | {sizes[(algorithm, 100)]} | {sizes[(algorithm, 1000)]} |")


if __name__ == "__main__":
    main()
