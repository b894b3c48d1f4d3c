"""What one script call costs the event loop's thread, client by client: the evidence behind
docs/performance.md's "What limits it" for where a Redis-backed call's time goes.

    python -m bench.client_cost [REDIS_URL] [--calls 10000]     # from the repository root

Each row makes ``--calls`` EVALSHA calls of slidegate's script (one sliding-window-log hit of one key) on
uvloop, by 1 and by 10 concurrent callers, and prints the calling thread's user and system CPU per call
(getrusage, microseconds): a bare asyncio protocol with hiredis parsing and no client library
(bench/noop_server.py's BareRedis: the least a round trip costs Python), redis-py's ``evalsha``, slidegate's
RedisBackend.decide (redis-py connections, batching, deadlines), and valkey-glide's ``custom_command`` when
valkey-glide is installed (its Rust threads' CPU is reported apart: on two cores they compete with Redis,
gRPC and the load generator). Keys are named by a random prefix and deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib
import resource
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import redis.asyncio
import uvloop

from bench.noop_server import BareRedis, pack
from slidegate.algorithms import Algorithm
from slidegate.backends.base import Check
from slidegate.backends.redis import RedisBackend
from slidegate.resources import lua_script

# the script's arguments after the key, as RedisBackend sends them for one limit of 10^9 per hour
ARGS = ("", 1, 1, "sliding_window_log", 1_000_000_000, 3_600_000_000, 0, 1, 0)


def thread_cpu() -> tuple[float, float]:
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_utime, usage.ru_stime


async def measure(label: str, call: Callable[[], Awaitable[object]], calls: int, callers: int) -> None:
    for _ in range(200):  # connections made, script loaded
        await call()

    async def caller() -> None:
        for _ in range(calls // callers):
            await call()

    user, system, process = *thread_cpu(), time.process_time()
    await asyncio.gather(*(caller() for _ in range(callers)))
    user_after, system_after = thread_cpu()
    n = calls // callers * callers
    loop_us = (user_after - user + system_after - system) / n * 1e6
    others = (time.process_time() - process) / n * 1e6 - loop_us
    print(f"| {label} | {callers} | {(user_after - user) / n * 1e6:.0f} | {(system_after - system) / n * 1e6:.0f} "
          f"| {loop_us:.0f} | {others:.0f} |")


async def main(url: str, calls: int) -> None:
    prefix = f"bench-client-{uuid.uuid4().hex[:8]}:"
    script = lua_script([a.value for a in Algorithm])
    sha = hashlib.sha1(script.encode()).hexdigest()
    address = urlsplit(url)
    host, port = address.hostname or "127.0.0.1", address.port or 6379
    _, bare = await asyncio.get_running_loop().create_connection(BareRedis, host, port)
    await bare.call(pack("SCRIPT", "LOAD", script))
    client = redis.asyncio.Redis.from_url(url)
    backend = RedisBackend(url)
    rows: list[tuple[str, Callable[[], Awaitable[object]]]] = [
        ("bare protocol (no library)", lambda: bare.call(pack("EVALSHA", sha, 1, f"{prefix}bare", *ARGS))),
        ("redis-py `evalsha`", lambda: client.evalsha(sha, 1, f"{prefix}redis-py", *ARGS)),
        ("slidegate RedisBackend.decide", lambda: backend.decide(
            [Check(f"{prefix}slidegate", 1_000_000_000, 3_600_000_000, 1)], None, 0.25)),
    ]
    glide: Any = None
    try:
        library: Any = importlib.import_module("glide")  # optional: not one of slidegate's dependencies
    except ImportError:
        print("(valkey-glide is not installed: its row is left out)")
    else:
        glide = await library.GlideClient.create(library.GlideClientConfiguration([library.NodeAddress(host, port)]))
        command = ["EVALSHA", sha, "1", f"{prefix}glide", *map(str, ARGS)]
        rows.append(("valkey-glide `custom_command`", lambda: glide.custom_command(command)))
    print("| client | callers | user µs/call | system µs/call | loop thread µs/call | other threads µs/call |")
    print("|---|---|---|---|---|---|")
    try:
        for callers in (1, 10):
            for label, call in rows:
                await measure(label, call, calls, callers)
    finally:
        await client.delete(*(f"{prefix}{name}" for name in ("bare", "redis-py", "slidegate", "glide")))
        await client.aclose()
        await backend.close()
        if glide is not None:
            await glide.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("redis_url", nargs="?", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--calls", type=int, default=10_000)
    options = parser.parse_args()
    uvloop.run(main(options.redis_url, options.calls))
