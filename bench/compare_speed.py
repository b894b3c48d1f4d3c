"""Speed side by side with envoyproxy/ratelimit: h2load against the reference, slidegate with fixed_window and
slidegate with its defaults, all three on one private Redis and one config, in one run.

    python bench/compare_speed.py --reference /path/to/ratelimit [--requests 20000] [--repeat 3] [--out FILE]
    # or any RLS already running on the config this writes:
    python bench/compare_speed.py --write-config DIR
    python bench/compare_speed.py --address slidegate=127.0.0.1:8081 --address other=127.0.0.1:9081

The reference is its ./src/service_cmd, built by hand outside this repository. Each workload is one pre-serialised
ShouldRateLimit call repeated by h2load over gRPC (10 connections, 10 streams each), the servers taken in turn in
every repeat (so a slow moment of the shared machine is shared); the medians are reported: calls/s, calls per
CPU-second of the server's process (its threads and children), the latency percentiles under that load and with one
call at a time, and Redis's CPU per call. Workloads: 1, 4 and 16 descriptors of limits that are never reached, an
attack mix, 90% of the calls on one limit that is over (10 an hour) beside 10% within, and HTTP requests through
Envoy's rate-limit filter (an Envoy started for each measurement). Both send stats (to a listener each) and use the
settings of bench/compare_servers.COMMON, but slidegate's default row, which keeps its own defaults
(sliding_window_log, the rejections cache). A last row, bench/noop_server.py answering OK without Redis, is the
ceiling of any RLS written on Python's grpc.aio.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repository's root on the path, for `bench.*`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.compare_servers import COMMON, Server, config_dir, launch_reference, launch_slidegate, scratch, wait_healthy
from bench.run import Load, body, envoy_config, h2load, h2load_envoy, private_redis, redis_pid
from slidegate import stack

KEYS = 16
CONFIG = "domain: bench\ndescriptors:\n" + "".join(
    f"  - key: d{i}\n    rate_limit: {{unit: hour, requests_per_unit: 1000000000}}\n" for i in range(KEYS)) + \
    "  - key: hot\n    rate_limit: {unit: hour, requests_per_unit: 10}\n" \
    "  - key: path\n    rate_limit: {unit: hour, requests_per_unit: 1000000000}\n"
# slidegate's own defaults for its second row, where COMMON sets the reference's
NOOP = "Python no-op handler"
SLIDEGATE_DEFAULTS = {"DEFAULT_ALGORITHM": "sliding_window_log", "LOCAL_CACHE_SIZE_IN_BYTES": "33554432"}


@dataclass(frozen=True)
class Workload:
    name: str
    descriptors: int  # of the limits never reached
    attack: bool = False  # 90% of the calls on the over limit
    envoy: bool = False  # HTTP requests through Envoy's rate-limit filter, which asks for [path=<:path>]
    clients: int = 10
    streams: int = 10


WORKLOADS = (Workload("1 descriptor", 1), Workload("4 descriptors", 4), Workload("16 descriptors", KEYS),
             Workload("attack mix (90% over)", 1, attack=True),
             Workload("1 descriptor, one call at a time", 1, clients=1, streams=1),
             Workload("through Envoy (1 descriptor, 1,000 paths)", 1, envoy=True))
ENVOY_PATHS = 1000


def measure(server: Server, workload: Workload, requests: int, directory: Path, redis: int) -> Load:
    entries = [(f"d{i}", "v") for i in range(workload.descriptors)]
    data = body(*entries, directory=directory)
    # a server or Redis not started here (pid 0): this process stands in, and its CPU is not told
    watch = {"server": server.pid or os.getpid(), "redis": redis or os.getpid()}
    port = int(server.grpc.rsplit(":", 1)[1])
    if workload.envoy:
        return _through_envoy(port, requests, directory, watch)
    if not workload.attack:
        calls = requests // 10 if workload.clients == 1 else requests
        return h2load(port, data, calls, workload.clients, workload.streams, watch)
    hot = body(("hot", "attacker"), directory=directory)
    return h2load(port, data, requests // 10, 1, workload.streams, watch, extra=((hot, 9),))


def run(reference: str, requests: int, repeat: int) -> tuple[list[str], dict[tuple[str, str], list[Load]]]:
    """The servers started here, measured."""
    root = scratch()
    config_dir(root).mkdir(parents=True)
    (config_dir(root) / "bench.yaml").write_text(CONFIG)
    with private_redis() as (url, _), ExitStack() as stack_:
        env = {**os.environ, **COMMON}
        servers = [launch_reference(reference, root, url, env, root, stack_),
                   launch_slidegate(root, url, env, root, stack_, name="slidegate fixed_window"),
                   launch_slidegate(root, url, {**env, **SLIDEGATE_DEFAULTS}, root, stack_, name="slidegate default")]
        for server in servers:
            wait_healthy(server, root)
        servers.append(_noop(stack_))
        results = rounds(servers, requests, repeat, root, redis_pid(url))
    shutil.rmtree(root)
    return [s.name for s in servers], results


def _through_envoy(rls_port: int, requests: int, directory: Path, watch: dict[str, int]) -> Load:
    """h2load through an Envoy of its own asking the RLS on ``rls_port`` (bench/run.py's config and load)."""
    listener, admin = stack.free_port(), stack.free_port()
    uris = directory / "uris"
    uris.write_text("".join(f"http://127.0.0.1:{listener}/k{i}\n" for i in range(ENVOY_PATHS)))
    envoy = stack.start_envoy(envoy_config(listener, admin, rls_port), admin)
    try:
        envoy_watch = {"envoy": envoy.pid, **watch}
        h2load_envoy(listener, uris, min(requests, 2000), envoy_watch)  # warm up
        return h2load_envoy(listener, uris, requests, envoy_watch)
    finally:
        stack.stop(envoy)


def rounds(servers: list[Server], requests: int, repeat: int, directory: Path,
           redis: int) -> dict[tuple[str, str], list[Load]]:
    """Every workload on every server, ``repeat`` times, the servers in turn."""
    results: dict[tuple[str, str], list[Load]] = {}
    for server in servers:  # warm up: connections, caches, the interpreter's
        measure(server, WORKLOADS[0], requests // 4, directory, redis)
    for _ in range(repeat):
        for workload in WORKLOADS:
            for server in servers:
                results.setdefault((workload.name, server.name), []).append(
                    measure(server, workload, requests, directory, redis))
    return results


def _noop(stack_: ExitStack) -> Server:
    """bench/noop_server.py: a Python gRPC server answering OK to everything, the ceiling of any Python RLS."""
    port = stack.free_port()
    process = subprocess.Popen([sys.executable, str(Path(__file__).parent / "noop_server.py"), str(port)])
    stack_.callback(stack.stop, process)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return Server(NOOP, f"127.0.0.1:{port}", pid=process.pid)
        time.sleep(0.05)
    raise TimeoutError(f"bench/noop_server.py not listening on {port}")


def _median(loads: list[Load], value: Callable[[Load], float]) -> float:
    return statistics.median(value(load) for load in loads)


def table(names: list[str], results: dict[tuple[str, str], list[Load]], commit: str, cpu: bool = True) -> str:
    lines = [f"envoyproxy/ratelimit at `{commit}`; medians of {len(next(iter(results.values())))} runs.", "",
             "| workload | server | calls/s | calls per CPU-second | p50 ms | p99 ms | Redis CPU µs/call | failed |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for workload in WORKLOADS:
        for name in names:
            loads = results[(workload.name, name)]
            calls = _median(loads, lambda x: x.calls)
            per_cpu = _median(loads, lambda x: x.calls / max(x.cpu["server"], 1e-9))
            redis_us = _median(loads, lambda x: x.cpu["redis"] / x.calls * 1e6)
            per_cpu_text, redis_text = (f"{per_cpu:,.0f}", f"{redis_us:.0f}") if cpu else ("-", "-")
            lines.append(f"| {workload.name} | {name} | {calls:,.0f} | {per_cpu_text} | "
                         f"{_median(loads, lambda x: x.p50_ms):.2f} | {_median(loads, lambda x: x.p99_ms):.2f} | "
                         f"{redis_text} | {sum(x.failed for x in loads)} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference", help="envoyproxy/ratelimit's binary: start the servers here")
    parser.add_argument("--address", action="append", default=[], metavar="NAME=HOST:PORT",
                        help="instead, an RLS already running on the config --write-config writes (repeatable; "
                             "calls/s and latency only)")
    parser.add_argument("--write-config", type=Path, help="write the config the workloads need to DIR and exit")
    parser.add_argument("--commit", default="", help="the reference's commit, for the table")
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write the table here too")
    args = parser.parse_args()
    if args.write_config:
        args.write_config.mkdir(parents=True, exist_ok=True)
        (args.write_config / "bench.yaml").write_text(CONFIG)
        return 0
    if args.reference:
        names, results = run(args.reference, args.requests, args.repeat)
    elif args.address:
        servers = [Server(name, address) for name, _, address in (a.partition("=") for a in args.address)]
        names, results = [s.name for s in servers], rounds(servers, args.requests, args.repeat, scratch(), 0)
    else:
        parser.error("give --reference, or --address (with --write-config first)")
    text = table(names, results, args.commit or "unknown", cpu=bool(args.reference))
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

