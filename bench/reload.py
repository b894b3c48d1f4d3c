"""What reloading a 1,000-descriptor config costs the calls served meanwhile: ShouldRateLimit's p99 latency under
steady gRPC load on `slidegate serve` (memory backend), with and without the config file rewritten again as soon
as the server has reloaded it, in alternating rounds of the same run; prints each round's p99s, then the pooled
p99s and their ratio. The target (issue 35): reloading raises p99 by at most 2x; exits 1 when the ratio is above it.

    python bench/reload.py [--rounds 3] [--seconds 5] [--callers 8]

The load: --callers concurrent grpc.aio callers in this process, each sending one-descriptor requests one after
another, the value drawn from the config's 1,000 (each a limit of its own). The file is rewritten in place with
every limit changed (so each write is a real reload); the server loads it once it has settled for 0.5 s (the
watcher's own wait), so a reload starts about every 0.6 s; reloads are counted on the debug port's /stats.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from slidegate import stack
from slidegate.protos import ratelimit_pb2, rls_pb2, rls_pb2_grpc

DESCRIPTORS = 1_000
TARGET = 2.0


def config_text(generation: int) -> str:
    """The domain ``bench``: DESCRIPTORS limits key=k, value=v<i>, every one's count changed by ``generation``."""
    rules = "".join(f"  - key: k\n    value: v{i}\n    rate_limit: {{unit: hour, requests_per_unit: "
                    f"{1_000_000_000 + generation}}}\n" for i in range(DESCRIPTORS))
    return f"domain: bench\ndescriptors:\n{rules}"


def p99(latencies: list[float]) -> float:
    return statistics.quantiles(latencies, n=100)[98]


async def load(port: int, callers: int, seconds: float) -> list[float]:
    """Latencies (ms) of the calls --callers callers made one after another for ``seconds``."""
    requests = [rls_pb2.RateLimitRequest(domain="bench", descriptors=[ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key="k", value=f"v{i}")])]) for i in range(DESCRIPTORS)]
    latencies: list[float] = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        end = time.monotonic() + seconds

        async def caller(seed: int) -> None:
            pick = random.Random(seed)
            while time.monotonic() < end:
                start = time.perf_counter()
                await stub.ShouldRateLimit(pick.choice(requests), timeout=5)
                latencies.append((time.perf_counter() - start) * 1000)

        await asyncio.gather(*(caller(n) for n in range(callers)))
    return latencies


class Rewriter(threading.Thread):
    """Rewrites the config file, waits until the server has loaded it, and again, until stopped."""

    def __init__(self, path: Path, debug_port: int, generations: itertools.count[int]) -> None:
        super().__init__(daemon=True)
        self.path, self.debug_port, self.generations = path, debug_port, generations
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            done = reloads(self.debug_port)
            self.path.write_text(config_text(next(self.generations)))
            while reloads(self.debug_port) == done and not self.stopped.wait(0.1):
                pass


def reloads(debug_port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{debug_port}/stats", timeout=5) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith("ratelimit.service.config_load_success:"):
                return int(line.split(":")[1])
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--rounds", type=int, default=3, help="rounds of (steady, reloading)")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each phase")
    parser.add_argument("--callers", type=int, default=8, help="concurrent callers")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="slidegate-reload-") as work:
        config = Path(work) / "config.yaml"
        generations = itertools.count()
        config.write_text(config_text(next(generations)))
        port, debug_port = stack.free_port(), stack.free_port()
        server = stack.start_slidegate(work, port, backend="memory", extra_args=("--debug-port", str(debug_port)))
        try:
            steady, reloading = run_rounds(args, port, debug_port, config, generations)
        finally:
            stack.stop(server)
    ratio = p99(reloading) / p99(steady)
    print(f"pooled: steady p99 {p99(steady):.2f} ms ({len(steady):,} calls), reloading p99 {p99(reloading):.2f} ms "
          f"({len(reloading):,} calls); ratio {ratio:.2f} (target <= {TARGET})")
    sys.exit(0 if ratio <= TARGET else 1)


def run_rounds(args: argparse.Namespace, port: int, debug_port: int, config: Path,
               generations: itertools.count[int]) -> tuple[list[float], list[float]]:
    asyncio.run(load(port, args.callers, 1.0))  # warm-up: connections, every request seen once
    steady: list[float] = []
    reloading: list[float] = []
    for round_ in range(1, args.rounds + 1):
        calm = asyncio.run(load(port, args.callers, args.seconds))
        before = reloads(debug_port)
        rewriter = Rewriter(config, debug_port, generations)
        rewriter.start()
        busy = asyncio.run(load(port, args.callers, args.seconds))
        rewriter.stopped.set()
        rewriter.join()
        time.sleep(1.0)  # the last reload done before the next steady phase
        done = reloads(debug_port) - before
        steady += calm
        reloading += busy
        print(f"round {round_}: steady p99 {p99(calm):.2f} ms, reloading p99 {p99(busy):.2f} ms "
              f"({done} reloads), ratio {p99(busy) / p99(calm):.2f}", flush=True)
    return steady, reloading


if __name__ == "__main__":
    main()
