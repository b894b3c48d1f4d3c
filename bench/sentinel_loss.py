"""What a Sentinel failover loses, and what REDIS_WAIT_REPLICAS costs (a minute or two).

    python -m bench.sentinel_loss [--rate 20] [--skip-cost]

Loss: a Sentinel group of its own (tests/redis_topologies.SentinelGroup: a master, one replica, one Sentinel
with down-after-milliseconds 1000) and slidegate's Limiter on it, in this process, sending --rate calls a
second, each with a limit of its own (so every admitted call's hit can be looked for on the new master). Then
(a) ``SENTINEL FAILOVER``, or (b) ``kill -9`` of the master (the node is started again, as a replica of the
new master, 1 s after the announcement, as an orchestrator would), each without and with WAIT (one
replica, 50 ms). Prints, per run: the calls admitted, those whose hit the new master does not hold ("lost"),
split by when they were sent (before the promotion, between the promotion and Sentinel's ``+switch-master``,
after it), the calls answered by the failure mode, and when every call was admitted again (each run goes on
until that has lasted 2 s, 30 s after the announcement at most).

Cost: a master and one replica (private redis-servers), 50 concurrent callers for 5 s, then one caller at a
time for 3 s, each without and with WAIT 1, three times in turn: calls/s, p50 and p99 (medians).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import redis
import redis.asyncio
import uvloop

from slidegate.backends.base import BackendUnavailable
from slidegate.backends.redis import RedisBackend, Topology
from slidegate.config import Config, load_directory
from slidegate.keys import limit_key
from slidegate.limiter import Descriptor, Limiter, LimiterOptions
from tests.redis_servers import RedisServer
from tests.redis_topologies import SentinelGroup, wait_for

CONFIG = "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1000000}\n"
TIMEOUT = 0.25  # REDIS_TIMEOUT's default
WAIT_TIMEOUT = 0.05  # REDIS_WAIT_TIMEOUT's default


def load_config() -> Config:
    directory = Path(tempfile.mkdtemp(prefix="slidegate-bench-"))
    (directory / "b.yaml").write_text(CONFIG)
    return load_directory(directory)


@dataclass
class Run:
    scenario: str
    wait: int
    calls: list[tuple[float, str, str]] = field(default_factory=list)  # (wall-clock start, key, ok|error)
    promoted: float = 0.0  # wall-clock time the replica first answered ROLE as master
    announced: float = 0.0  # wall-clock time +switch-master arrived
    event: float = 0.0  # wall-clock time of the FAILOVER command or the kill
    lost: list[float] = field(default_factory=list)  # starts of admitted calls whose hit the new master lacks


def watch_promotion(port: int, run: Run, stop: threading.Event) -> None:
    with redis.Redis(port=port, socket_timeout=1) as r:
        while not stop.is_set():
            try:
                if r.execute_command("ROLE")[0] == b"master":
                    run.promoted = time.time()
                    return
            except redis.RedisError:
                pass
            time.sleep(0.005)


async def failover_run(config: Config, scenario: str, wait: int, rate: float) -> Run:
    run = Run(scenario, wait)
    group = SentinelGroup()
    backend = RedisBackend(Topology("sentinel", group.url), timeout=TIMEOUT, wait_replicas=wait,
                           wait_timeout=WAIT_TIMEOUT)
    prefix = f"bench-{uuid.uuid4().hex[:6]}:"
    limiter = Limiter(lambda: config, backend, LimiterOptions(key_prefix=prefix))
    sentinel = redis.asyncio.Redis(port=group.port)
    pubsub = sentinel.pubsub()
    stop_watch = threading.Event()
    try:
        await pubsub.subscribe("+switch-master")

        async def one(i: int) -> None:
            start = time.time()
            try:
                await limiter.should_rate_limit("b", [Descriptor((("k", str(i)),))])
                run.calls.append((start, str(i), "ok"))
            except BackendUnavailable:
                run.calls.append((start, str(i), "error"))

        async def announcement() -> None:
            async for message in pubsub.listen():
                if message["type"] == "message":
                    run.announced = time.time()
                    return

        tasks: set[asyncio.Task[None]] = set()
        stop = asyncio.Event()

        async def load() -> None:
            i = 0
            next_at = time.monotonic()
            while not stop.is_set():
                task = asyncio.create_task(one(i))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                i += 1
                next_at += 1 / rate
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))

        loader = asyncio.create_task(load())
        await asyncio.sleep(3)
        old, new = group.master, group.replica
        watcher = threading.Thread(target=watch_promotion, args=(new.port, run, stop_watch), daemon=True)
        watcher.start()
        listening = asyncio.create_task(announcement())
        run.event = time.time()
        if scenario == "SENTINEL FAILOVER":
            await asyncio.to_thread(group.failover)
        else:
            old.stop()  # SIGKILL
        await asyncio.wait_for(listening, 30)
        if scenario != "SENTINEL FAILOVER":
            await asyncio.sleep(1)
            old.extra_args = ("--replicaof", "127.0.0.1", str(new.port))
            await asyncio.to_thread(old.start)
        # until every call is admitted again for 2 s: with WAIT, the new master needs a replica in sync first
        # (Sentinel makes the old master of a SENTINEL FAILOVER a replica ~10 s later, then a full resync)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (run.calls and time.time() - back_since(run) > 2):
            await asyncio.sleep(0.1)
        stop.set()
        await loader
        await asyncio.gather(*tasks)
        stop_watch.set()
        with redis.Redis(port=new.port) as r:
            admitted = [(start, k) for start, k, kind in run.calls if kind == "ok"]
            pipe = r.pipeline(transaction=False)
            for _, k in admitted:
                pipe.exists(limit_key(prefix, "sliding_window_log", "b", [("k", k)]))
            run.lost = [start for (start, _), held in zip(admitted, pipe.execute(), strict=True) if not held]
    except BaseException:
        print(f"the Sentinel's log ends:\n{Path(group.dir, 'log').read_text()[-3000:]}")
        raise
    finally:
        stop_watch.set()
        await pubsub.aclose()
        await sentinel.aclose()
        await backend.close()
        await asyncio.to_thread(group.cleanup)
    return run


def back_since(run: Run) -> float:
    """Start of the first call after the event from which every call was admitted (inf: none was)."""
    since = float("inf")
    for start, _, kind in sorted(run.calls):
        if kind != "ok":
            since = float("inf")
        elif since == float("inf") and start > run.event:
            since = start
    return since


def report(run: Run) -> str:
    admitted = sum(1 for _, _, kind in run.calls if kind == "ok")
    errors = sum(1 for _, _, kind in run.calls if kind == "error")
    promoted = run.promoted or run.announced
    before = sum(1 for t in run.lost if t < promoted)
    window = sum(1 for t in run.lost if promoted <= t < run.announced)
    after = sum(1 for t in run.lost if t >= run.announced)
    return (f"| {run.scenario} | {run.wait or 'off'} | {promoted - run.event:.2f} s "
            f"| {run.announced - run.event:.2f} s | {len(run.calls)} | {admitted} | **{len(run.lost)}** | {before} "
            f"| {window} | {after} | {errors} | {back_since(run) - run.event:.1f} s |")


async def cost(wait: int, callers: int, seconds: float, replicated: tuple[RedisServer, RedisServer],
               config: Config) -> tuple[float, float, float]:
    master, _ = replicated
    backend = RedisBackend(master.url, timeout=TIMEOUT, wait_replicas=wait, wait_timeout=WAIT_TIMEOUT)
    limiter = Limiter(lambda: config, backend, LimiterOptions(key_prefix=f"cost-{uuid.uuid4().hex[:6]}:"))
    latencies: list[float] = []
    deadline = time.monotonic() + seconds

    async def caller(c: int) -> None:
        i = 0
        while time.monotonic() < deadline:
            start = time.perf_counter()
            await limiter.should_rate_limit("b", [Descriptor((("k", f"{c}-{i % 1000}"),))])
            latencies.append(time.perf_counter() - start)
            i += 1

    await limiter.should_rate_limit("b", [Descriptor((("k", "warm"),))])
    started = time.monotonic()
    await asyncio.gather(*(caller(c) for c in range(callers)))
    elapsed = time.monotonic() - started
    await backend.close()
    latencies.sort()
    return (len(latencies) / elapsed, statistics.median(latencies) * 1000,
            latencies[int(len(latencies) * 0.99)] * 1000)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--rate", type=float, default=20, help="calls per second during the failovers")
    parser.add_argument("--skip-cost", action="store_true", help="only the failovers")
    args = parser.parse_args()
    config = load_config()
    print(f"Failover at {args.rate:g} calls/s, each call a limit of its own; REDIS_TIMEOUT {TIMEOUT * 1000:.0f} ms, "
          f"REDIS_WAIT_TIMEOUT {WAIT_TIMEOUT * 1000:.0f} ms; times from the FAILOVER command or the kill.\n")
    print("| event | REDIS_WAIT_REPLICAS | promoted | +switch-master | calls | admitted | lost | lost before "
          "promotion | lost promotion → announcement | lost after announcement | failure mode | all admitted again "
          "after |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for scenario in ("SENTINEL FAILOVER", "kill -9 of the master"):
        for wait in (0, 1):
            print(report(await failover_run(config, scenario, wait, args.rate)), flush=True)
    if args.skip_cost:
        return
    master = RedisServer().start()
    replica = RedisServer()
    replica.extra_args = ("--replicaof", "127.0.0.1", str(master.port))
    try:
        replica.start()
        with redis.Redis(port=replica.port) as r:
            wait_for(lambda: r.info("replication")["master_link_status"] == "up", 10, "the replica")
        print("\nCost of WAIT: a master and one replica on this machine, one process on uvloop; each number the "
              "median of 3 runs, taken in turn.\n")
        print("| callers | REDIS_WAIT_REPLICAS | calls/s | p50 ms | p99 ms |")
        print("|---|---|---|---|---|")
        for callers, seconds in ((50, 5.0), (1, 3.0)):
            runs: dict[int, list[tuple[float, float, float]]] = {0: [], 1: []}
            for _ in range(3):
                for wait in (0, 1):
                    runs[wait].append(await cost(wait, callers, seconds, (master, replica), config))
            for wait, measured in runs.items():
                rate, p50, p99 = (statistics.median(m[i] for m in measured) for i in range(3))
                print(f"| {callers} | {wait or 'off'} | {rate:,.0f} | {p50:.2f} | {p99:.2f} |", flush=True)
    finally:
        replica.cleanup()
        master.cleanup()


if __name__ == "__main__":
    uvloop.run(main())
