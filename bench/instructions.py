"""A call's cost in CPU instructions, counted by valgrind: the same count run after run, whatever else the machine
is doing, where timings on a shared 2-core machine move ±10% between rounds and hide a change of a few percent.

slidegate's decision of one remembered request (RateLimitService.should_rate_limit, one descriptor, sliding-window
log, a real Redis), called in one process one call at a time, runs under ``valgrind --tool=callgrind`` twice: with
``--warm`` calls and with ``--warm`` + ``--calls`` calls; the difference of the two totals over ``--calls`` is the
instructions of one call, start-up and warm-up left out. It counts Python's and the event loop's instructions, not
gRPC's (no server) nor the cost of a loaded machine (docs/performance.md: a microsecond in one process is two or
three under load): use it to compare two versions of the code, and bench.layers to see what a change does under
load.

    apt-get install valgrind redis-server
    python -m bench.instructions [--calls 2000] [--against DIR]   # from the root; DIR: another checkout

Each version (this checkout's, and DIR's with ``--against``) is counted twice and the lower count kept: now and
then a run counts a few percent more (a collection of the heap's oldest generation falling inside it).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import redis
import uvloop

from bench.run import private_redis
from slidegate._proto.envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from slidegate._proto.envoy.service.ratelimit.v3 import rls_pb2
from slidegate.algorithms import Algorithm
from slidegate.application import build
from slidegate.keys import limit_key
from slidegate.settings import Settings

HERE = Path(__file__).resolve().parent
CONFIG = """
domain: bench
descriptors:
  - key: sliding_window_log
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
"""


class _Context:
    """What the service asks of a gRPC call's context: no deadline (as h2load's calls)."""

    def time_remaining(self) -> float | None:
        return None


async def calls(redis_url: str, count: int) -> None:
    """``count`` decisions of one remembered request, one at a time, after five to remember it; each checked
    (answered OK, counted in Redis)."""
    work = Path(tempfile.mkdtemp(prefix="slidegate-instructions-"))
    (work / "config").mkdir()
    (work / "config" / "bench.yaml").write_text(CONFIG)
    prefix = f"bench-instructions-{uuid.uuid4().hex[:8]}:"
    app = build(Settings.load({"RUNTIME_ROOT": str(work), "RUNTIME_SUBDIRECTORY": "", "RUNTIME_WATCH_ROOT": "false",
                               "REDIS_URL": redis_url, "CACHE_KEY_PREFIX": prefix}))
    await app.backend.ping()
    data = rls_pb2.RateLimitRequest(domain="bench", descriptors=[ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key="sliding_window_log", value="k1")])]).SerializeToString()
    context: Any = _Context()
    answer = app.service.should_rate_limit
    for _ in range(5 + count):
        response = await answer(data, context)
        if response.overall_code != rls_pb2.RateLimitResponse.OK:
            sys.exit(f"a call was answered {response}")
    await app.backend.close()
    await app.quotas.close()
    with redis.Redis.from_url(redis_url) as client:
        key = limit_key(prefix, Algorithm.SLIDING_WINDOW_LOG.value, "bench", [("sliding_window_log", "k1")])
        decided = client.zcount(key, "(0", "+inf")  # the hits (lua/sliding_window_log.lua)
        client.delete(key)
    if decided != 5 + count:
        sys.exit(f"{decided} calls counted in Redis, {5 + count} made")


def instructions(tree: Path, redis_url: str, count: int) -> int:
    """The instructions callgrind counts in a child process making ``count`` calls with slidegate from ``tree``."""
    with tempfile.TemporaryDirectory(prefix="slidegate-callgrind-") as directory:
        out = Path(directory) / "callgrind.out"
        env = {**os.environ, "PYTHONPATH": f"{tree / 'server'}{os.pathsep}{HERE.parent}"}
        subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, "-m",
                        "bench.instructions", "--child", redis_url, str(count)],
                       check=True, env=env, cwd=HERE.parent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        found = re.search(r"^summary: (\d+)$", out.read_text(), re.MULTILINE)
        if found is None:
            sys.exit(f"no summary in callgrind's output for {tree}")
        return int(found.group(1))


def per_call(tree: Path, redis_url: str, warm: int, count: int) -> int:
    """Instructions of one call with slidegate from ``tree``: the lower of two counts."""
    return min((instructions(tree, redis_url, warm + count) - instructions(tree, redis_url, warm)) // count
               for _ in range(2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls counted (default 2000)")
    parser.add_argument("--warm", type=int, default=1000, help="calls made before, in both runs (default 1000)")
    parser.add_argument("--against", metavar="DIR", help="also count the checkout DIR's slidegate")
    parser.add_argument("--child", nargs=2, metavar=("REDIS_URL", "COUNT"), help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        url, count = options.child
        uvloop.run(calls(url, int(count)))
        return
    trees = [("this checkout", HERE.parent)]
    if options.against:
        trees.append((options.against, Path(options.against).resolve()))
    with private_redis() as (url, _):
        counts = [(name, per_call(tree, url, options.warm, options.calls)) for name, tree in trees]
    print("| slidegate | instructions a call | ratio to this checkout's |")
    print("|---|---|---|")
    for name, count in counts:
        print(f"| {name} | {count:,} | {count / counts[0][1]:.2f} |")


if __name__ == "__main__":
    main()
