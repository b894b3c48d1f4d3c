"""What reloading a 1,000-descriptor config costs the calls served meanwhile: ShouldRateLimit's p99 latency under
steady gRPC load on `slidegate serve` (memory backend), with and without the config file rewritten again as soon
as the server has reloaded it, in alternating rounds of the same run; prints each round's p99s, then the pooled
p99s and their ratio. The target (issue 35): reloading raises p99 by at most 2x; exits 1 when the ratio is above it.

    python bench/reload.py [--rounds 3] [--seconds 5] [--callers 8] [--source file|xds]

The load: --callers concurrent grpc.aio callers in this process, each sending one-descriptor requests one after
another, the value drawn from the config's 1,000 (each a limit of its own). The file is rewritten in place with
every limit changed (so each write is a real reload); the server loads it once it has settled for 0.5 s (the
watcher's own wait), so a reload starts about every 0.6 s; reloads are counted in the server's log. With
--source xds the same limits come as one RateLimitConfig from an ADS server in this process (tests/ads_server.py),
a new snapshot 0.5 s after each is in force.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from slidegate import stack
from slidegate.protos import ratelimit_pb2, rls_conf_pb2, rls_pb2, rls_pb2_grpc

DESCRIPTORS = 1_000
TARGET = 2.0
XDS_GAP = 0.5  # s after an xDS config is in force before the next is sent: the cadence of the file's reloads


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


class ReloadLog:
    """The server's log, read for the lines it writes when a reload is in force: asking the server (its /stats)
    would make it work during the reloading phases only, and that work (aiohttp and the stats' text, several
    milliseconds a poll) would be counted as the reloads'."""

    def __init__(self, path: Path, line: bytes) -> None:
        self.path, self.line = path, line
        self._read = 0
        self._count = 0

    def reloads(self) -> int:
        with self.path.open("rb") as log:
            log.seek(self._read)
            lines = log.read().split(b"\n")
        complete = b"\n".join(lines[:-1])
        self._read += len(complete) + (1 if len(lines) > 1 else 0)
        self._count += complete.count(self.line)
        return self._count


class Rewriter(threading.Thread):
    """Changes the config (``change``, with the next of ``generations``, 0, 1, 0 … over the whole run: every limit
    changed each time), waits until the server has it in force and ``gap`` seconds more, and again, until stopped.
    What ``change`` sends is made beforehand, so that this thread takes little of this process's GIL from the
    callers."""

    def __init__(self, change: Callable[[int], None], log: ReloadLog, gap: float,
                 generations: Iterator[int]) -> None:
        super().__init__(daemon=True)
        self.change, self.log, self.gap, self.generations = change, log, gap, generations
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            done = self.log.reloads()
            self.change(next(self.generations))
            while self.log.reloads() == done and not self.stopped.wait(0.1):
                pass
            self.stopped.wait(self.gap)


def xds_config(generation: int) -> list[rls_conf_pb2.RateLimitConfig]:
    """config_text's limits as an xDS resource."""
    return [rls_conf_pb2.RateLimitConfig(name="bench", domain="bench", descriptors=[
        rls_conf_pb2.RateLimitDescriptor(key="k", value=f"v{i}", rate_limit=rls_conf_pb2.RateLimitPolicy(
            unit=rls_conf_pb2.HOUR, requests_per_unit=1_000_000_000 + generation)) for i in range(DESCRIPTORS)])]


@contextlib.contextmanager
def serve(source: str, work: Path) -> Iterator[tuple[int, Callable[[int], None], ReloadLog, float]]:
    """`slidegate serve` on ``source`` (file, or xds: tests/ads_server.py's ADS server in this process); yields its
    port, how to change its config, its log and the gap to leave after each reload."""
    port, log_path = stack.free_port(), work / "serve.log"
    with contextlib.ExitStack() as stop:
        if source == "xds":
            from tests.ads_server import AdsServer
            ads = AdsServer()
            snapshots = [xds_config(generation) for generation in (1, 2)]
            ads.set(snapshots[-1])
            ads.start()
            stop.callback(ads.stop)
            env: dict[str, str] | None = {**os.environ, "CONFIG_TYPE": "GRPC_XDS_SOTW",
                                          "CONFIG_GRPC_XDS_SERVER_URL": f"127.0.0.1:{ads.port}"}

            def change(generation: int) -> None:
                ads.set(snapshots[generation])
            line, gap = b" in force: ", XDS_GAP
        else:
            env, file = None, work / "config" / "config.yaml"
            file.parent.mkdir()
            texts = [config_text(generation).encode() for generation in (1, 2)]
            file.write_bytes(texts[-1])

            def change(generation: int) -> None:
                file.write_bytes(texts[generation])
            line, gap = b"config reloaded", 0.0
        with log_path.open("wb") as log_file:
            server = stack.start_slidegate(work / "config", port, backend="memory", log_file=log_file, env=env)
        stop.callback(stack.stop, server)
        yield port, change, ReloadLog(log_path, line), gap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--rounds", type=int, default=3, help="rounds of (steady, reloading)")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each phase")
    parser.add_argument("--callers", type=int, default=8, help="concurrent callers")
    parser.add_argument("--source", choices=("file", "xds"), default="file", help="where the config comes from")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="slidegate-reload-") as work, serve(args.source, Path(work)) as served:
        steady, reloading = run_rounds(args, *served)
    ratio = p99(reloading) / p99(steady)
    print(f"pooled: steady p99 {p99(steady):.2f} ms ({len(steady):,} calls), reloading p99 {p99(reloading):.2f} ms "
          f"({len(reloading):,} calls); ratio {ratio:.2f} (target <= {TARGET})")
    sys.exit(0 if ratio <= TARGET else 1)


def run_rounds(args: argparse.Namespace, port: int, change: Callable[[int], None], log: ReloadLog,
               gap: float) -> tuple[list[float], list[float]]:
    asyncio.run(load(port, args.callers, 1.0))  # warm-up: connections, every request seen once
    steady: list[float] = []
    reloading: list[float] = []
    generations = itertools.cycle((0, 1))  # the server starts with 1's
    for round_ in range(1, args.rounds + 1):
        calm = asyncio.run(load(port, args.callers, args.seconds))
        before = log.reloads()
        rewriter = Rewriter(change, log, gap, generations)
        rewriter.start()
        busy = asyncio.run(load(port, args.callers, args.seconds))
        rewriter.stopped.set()
        rewriter.join()
        time.sleep(1.0)  # the last reload done before the next steady phase
        done = log.reloads() - before
        steady += calm
        reloading += busy
        print(f"round {round_}: steady p99 {p99(calm):.2f} ms, reloading p99 {p99(busy):.2f} ms "
              f"({done} reloads), ratio {p99(busy) / p99(calm):.2f}", flush=True)
    return steady, reloading


if __name__ == "__main__":
    main()
