"""A call's cost in CPU instructions, counted by valgrind: counts that repeat within a few percent whatever else the
machine is doing, where timings on a shared 2-core machine move ±10% between rounds and hide a change of that size.

slidegate's decision of one remembered request (RateLimitService.should_rate_limit, one descriptor, sliding-window
log, a real Redis), called in one process one call at a time, runs under ``valgrind --tool=callgrind`` twice: with
``--warm`` calls and with ``--warm`` + ``--calls`` calls; the difference of the two totals over ``--calls`` is the
instructions of one call, start-up and warm-up left out. It counts Python's and the event loop's instructions, not
gRPC's (no server) nor the cost of a loaded machine (docs/performance.md: a microsecond in one process is two or
three under load): use it to compare two versions of the code, and bench.layers to see what a change does under
load. With ``--over`` the request counted is over its limit (one an hour): its first call is admitted, its second
rejected by Redis, and every one after it answered from the over-limit cache (checked): an attack's path.

    apt-get install valgrind redis-server
    python -m bench.instructions [--calls 2000] [--warm 1000] [--flat | --over] [--against DIR]   # from the root
    python -m bench.instructions --top-limited   # also with the top limited callers' watcher, as serve runs it

Each version (this checkout's, and DIR's with ``--against``) is counted twice and the lower count kept: a run
counts up to a few percent more now and then (what falls inside it of the garbage collector's and the event loop's
occasional work), and once in a while far more.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import redis
import uvloop

from bench.run import private_redis
from slidegate.algorithms import Algorithm
from slidegate.application import build
from slidegate.keys import limit_key
from slidegate.protos import ratelimit_pb2, rls_pb2
from slidegate.settings import Settings

HERE = Path(__file__).resolve().parent
CONFIG = """
domain: bench
descriptors:
  - key: sliding_window_log
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
  - key: over
    rate_limit: {unit: hour, requests_per_unit: 1}
"""


class _Context:
    """What the service asks of a gRPC call's context: no deadline (as h2load's calls)."""

    def time_remaining(self) -> float | None:
        return None


async def calls(redis_url: str, count: int, prefix: str, *, flat: bool = False, over: bool = False,
                top: bool = False) -> None:
    """``count`` decisions of one remembered request (keys under ``prefix``), one at a time, after five to remember
    it, each checked (answered OK and counted in Redis; with ``over``, of a limit of one an hour: answered
    OVER_LIMIT after the first, which alone is counted, and from the over-limit cache after the second), by
    slidegate's service or, with ``flat``, by bench.layers' flat path (an experiment: the layers above the Redis
    backend in one coroutine); ``top``: the decisions told to the top limited callers' watcher, as `slidegate serve`
    tells them (slidegate.limited_view.watching)."""
    with tempfile.TemporaryDirectory(prefix="slidegate-instructions-") as work:
        (Path(work) / "bench.yaml").write_text(CONFIG)
        # REDIS_TIMEOUT: under valgrind a call takes some fifty times as long, and 250 ms made the first one
        # (connecting, loading the script) fail now and then; its value is not in the path counted
        settings = Settings.load({"CONFIG_DIR": work, "RUNTIME_WATCH_ROOT": "false", "REDIS_URL": redis_url,
                                  "CACHE_KEY_PREFIX": prefix, "REDIS_TIMEOUT": "10s"})
        app = build(settings)
    if top:
        # imported only here, as bench.layers below
        from slidegate.limited_view import watching

        watching(settings, app.service.decider)
    await app.backend.ping()
    entry = ("over" if over else "sliding_window_log", "k1")
    data = rls_pb2.RateLimitRequest(domain="bench", descriptors=[ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=entry[0], value=entry[1])])]).SerializeToString()
    context: Any = _Context()
    answer: Callable[[bytes, Any], Awaitable[rls_pb2.RateLimitResponse]] = app.service.should_rate_limit
    if flat:
        # imported only here: bench.layers needs slidegate's public pieces of today, which an older checkout
        # measured with --against may not have
        from bench.layers import flat_handler

        answer = flat_handler(app)
    key = limit_key(prefix, Algorithm.SLIDING_WINDOW_LOG.value, "bench", [entry])
    try:
        for made in range(5 + count):
            response = await answer(data, context)
            expected = rls_pb2.RateLimitResponse.OVER_LIMIT if over and made else rls_pb2.RateLimitResponse.OK
            if response.overall_code != expected:
                due = rls_pb2.RateLimitResponse.Code.Name(expected)
                sys.exit(f"call {made + 1} was answered {response}, not {due}")
        stats = dict(line.rsplit(": ", 1) for line in app.service.metrics.render_stats().splitlines())
        cached = sum(int(total) for name, total in stats.items() if name.endswith(".over_limit_with_local_cache"))
        if cached != (3 + count if over else 0):
            sys.exit(f"{cached} calls answered from the over-limit cache, {3 + count if over else 0} expected")
    finally:
        await app.backend.close()
        await app.quotas.close()
        with redis.Redis.from_url(redis_url) as client:
            decided = client.zcount(key, "(0", "+inf")  # the hits (lua/sliding_window_log.lua)
            client.delete(key)
    if decided != (1 if over else 5 + count):
        sys.exit(f"{decided} calls counted in Redis, {1 if over else 5 + count} expected of {5 + count} made")


def instructions(tree: Path, redis_url: str, count: int, path: str) -> int:
    """The instructions callgrind counts in a child process making ``count`` calls with slidegate from ``tree``
    (``path``: service, flat or over)."""
    with tempfile.TemporaryDirectory(prefix="slidegate-callgrind-") as directory:
        out, log = Path(directory) / "callgrind.out", Path(directory) / "valgrind.log"
        # the same hashes every run: a dict's layout, and so its instructions, follow them
        env = {**os.environ, "PYTHONPATH": f"{tree / 'server'}{os.pathsep}{HERE.parent}", "PYTHONHASHSEED": "0"}
        prefix = f"bench-instructions-{uuid.uuid4().hex[:8]}:"
        child = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", f"--log-file={log}",
                                sys.executable, "-m", "bench.instructions", "--child", redis_url, str(count), prefix,
                                path], env=env, cwd=HERE.parent, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)
        if child.returncode != 0:
            # the child's reason, or valgrind's own (in its log)
            said = child.stderr.strip() or (log.read_text().strip() if log.exists() else "")
            sys.exit(f"the calls with slidegate from {tree} failed: {said[-2000:]}")
        found = re.search(r"^summary: (\d+)$", out.read_text(), re.MULTILINE)
        if found is None:
            sys.exit(f"no summary in callgrind's output for {tree}")
        return int(found.group(1))


def per_call(tree: Path, redis_url: str, warm: int, count: int, path: str = "service") -> int:
    """Instructions of one call with slidegate from ``tree``: the lower of two counts."""
    return min((instructions(tree, redis_url, warm + count, path) - instructions(tree, redis_url, warm, path))
               // count for _ in range(2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--calls", type=int, default=2000, help="calls counted (default 2000)")
    parser.add_argument("--warm", type=int, default=1000, help="calls made before, in both runs (default 1000)")
    parser.add_argument("--against", metavar="DIR", help="also count the checkout DIR's slidegate")
    parser.add_argument("--flat", action="store_true",
                        help="also count bench.layers' flat path (an experiment: the layers above the Redis backend in "
                             "one coroutine)")
    parser.add_argument("--over", action="store_true",
                        help="count a request over its limit instead, answered from the over-limit cache (an attack's "
                             "path)")
    parser.add_argument("--top-limited", action="store_true",
                        help="also count this checkout's calls told to the top limited callers' watcher, as `slidegate "
                             "serve` tells them")
    parser.add_argument("--child", nargs=4, metavar=("REDIS_URL", "COUNT", "PREFIX", "PATH"), help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        url, count, prefix, path = options.child
        path, _, top = path.partition("+")
        uvloop.run(calls(url, int(count), prefix, flat=path == "flat", over=path == "over", top=top == "top"))
        return
    if options.flat and options.over:
        parser.error("--flat counts a request within its limit: not with --over")
    path = "over" if options.over else "service"
    rows = [("this checkout", HERE.parent, path)]
    if options.flat:
        rows.append(("this checkout, bench.layers' flat path", HERE.parent, "flat"))
    if options.top_limited:
        rows.append(("this checkout, with the top limited callers", HERE.parent, f"{path}+top"))
    if options.against:
        rows.append((options.against, Path(options.against).resolve(), path))
    with private_redis() as (url, _):
        counts = [(name, per_call(tree, url, options.warm, options.calls, path)) for name, tree, path in rows]
    print("| slidegate | instructions a call | ratio to this checkout's |")
    print("|---|---|---|")
    for name, count in counts:
        print(f"| {name} | {count:,} | {count / counts[0][1]:.2f} |")


if __name__ == "__main__":
    main()
