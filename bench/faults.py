"""The fault suite: slidegate (two worker processes) under steady load while its Redis fails in one way at a
time, and a table of what each fault cost.

    python bench/faults.py [--seconds 10] [--only PHASE ...] [--timeline] [--out FILE]

Each phase starts a fresh `slidegate serve --workers 2` against a Redis of its own (a private redis-server, a
Sentinel group or a Redis Cluster, all on free loopback ports, stopped by PID afterwards), drives it from two
load processes at a steady pace (1,800 calls/s, 4 descriptors a call, 12,000 distinct requests so that the
service's memory of requests fills and empties as in production) and injects its fault 3 s in. A call names a
user, the user's organisation (50 an hour), a per-second key (4 a second) and a key every call of the phase
names (limited far beyond the load: it counts the admitted calls in storage). All are sliding-window logs, so
"over-admitted" has one meaning: more calls admitted than a limit allows in some window. For the hourly limits
the phase is one window; for the per-second keys a window counts only calls certainly decided within it (sent
after its start, answered before its end), so the count has no false alarms. Admitted calls that the storage no
longer holds at the end were lost (a restart without persistence, a failover before replication); a limit
admits those hits again, so what they explain is reported as lost, not as over-admitted.

The deadline phases (pause-*, sleep-*) are Envoy's defaults: 20 ms deadlines, FAILURE_MODE allow, deny or local,
Redis paused for 3 s (CLIENT PAUSE WRITE or ALL; DEBUG SLEEP 3, which stops it answering anything) while 16
clients hammer one key known to be over limit; the measured calls each name a key of their own with room, so
only Redis or the failure mode can answer them.

Columns: calls measured (after a second of warm-up); over-admitted (must be 0); admitted hits lost; UNAVAILABLE;
late (the call's deadline passed first: Envoy treats both as an error and, by default, lets the request
through); when the last failed call ended, from the fault; the slowest answer; the share answered in time in
the 4 s after the fault; the server's warning lines.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import grpc
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests.redis_servers / redis_topologies: the private Redis processes

from slidegate import stack  # noqa: E402
from slidegate.keys import limit_key  # noqa: E402
from slidegate.protos import ratelimit_pb2, rls_pb2  # noqa: E402
from slidegate.workers import remove_port_locks  # noqa: E402
from tests.redis_servers import RedisServer  # noqa: E402
from tests.redis_topologies import Cluster, SentinelGroup, wait_for  # noqa: E402

METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
USERS, ORGS, SECOND_KEYS = 12_000, 30, 60
USER_LIMIT, ORG_LIMIT, SECOND_LIMIT, ALL_LIMIT = 40, 50, 4, 1_000_000_000
CONFIG = f"""
domain: faults
descriptors:
  - key: user
    rate_limit: {{unit: hour, requests_per_unit: {USER_LIMIT}}}
  - key: org
    rate_limit: {{unit: hour, requests_per_unit: {ORG_LIMIT}}}
  - key: second
    rate_limit: {{unit: second, requests_per_unit: {SECOND_LIMIT}}}
  - key: all
    rate_limit: {{unit: hour, requests_per_unit: {ALL_LIMIT}}}
  - key: hot
    rate_limit: {{unit: hour, requests_per_unit: 5}}
  - key: probe
    rate_limit: {{unit: hour, requests_per_unit: 1000000000}}
  - key: api_key
    rate_limit: {{unit: hour, requests_per_unit: 5}}
"""
AFTER_FAULT = 4.0  # seconds after the fault in which "answered in time" is measured (every fault here is over by then)
Record = tuple[float, float, str, int]  # sent, answered (monotonic s), outcome ("ok", "over" or a gRPC code), user


def user_request(run: str, user: int) -> bytes:
    entries = [("user", f"{run}-u{user}"), ("org", f"{run}-o{user % ORGS}"), ("second", f"{run}-s{user % SECOND_KEYS}"),
               ("all", run)]
    return rls_pb2.RateLimitRequest(domain="faults", descriptors=[
        ratelimit_pb2.RateLimitDescriptor(entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v)])
        for k, v in entries]).SerializeToString()


def single_request(key: str, value: str) -> bytes:
    return rls_pb2.RateLimitRequest(domain="faults", descriptors=[ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=key, value=value)])]).SerializeToString()


@dataclass(frozen=True)
class Workload:
    """What one load process sends, at a steady pace as Envoy's traffic comes (a closed loop would only measure
    how long calls queue in a saturated server): ``rate`` calls a second spread over ``clients`` coroutines,
    each call with ``deadline`` seconds; ``hammer_rate`` calls a second of one key that is soon over limit
    (answered without Redis once it is known to be over) over ``hammers`` coroutines."""

    run: str
    port: int
    start: float  # monotonic time to begin at
    seconds: float
    clients: int = 16
    rate: float = 900.0
    deadline: float = 1.0
    hammers: int = 0
    hammer_rate: float = 0.0
    probe: bool = False  # each client sends a key of its own with room (never answered from the cache)


async def _paced(interval: float, end: float, send: Callable[[], Awaitable[None]]) -> None:
    """``send`` every ``interval`` seconds until ``end``; a call that takes longer delays the next, never
    bunches them up."""
    due = time.monotonic() + random.random() * interval
    while due < end:
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        await send()
        due = max(due + interval, time.monotonic())


async def _drive(w: Workload, seed: int) -> list[Record]:
    rng = random.Random(seed)
    requests = [user_request(w.run, u) for u in range(USERS)]
    hot = single_request("hot", w.run)
    records: list[Record] = []
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{w.port}") for _ in range(4)]
    calls = [c.unary_unary(METHOD, request_serializer=lambda b: b,
                           response_deserializer=rls_pb2.RateLimitResponse.FromString) for c in channels]
    end = w.start + w.seconds

    def client(i: int) -> Callable[[], Awaitable[None]]:
        call = calls[i % len(calls)]
        probe = single_request("probe", f"{w.run}-{seed}-{i}")

        async def send() -> None:
            user = rng.randrange(USERS)
            sent = time.monotonic()
            try:
                reply = await call(probe if w.probe else requests[user], timeout=w.deadline)
                outcome = "ok" if reply.overall_code == rls_pb2.RateLimitResponse.OK else "over"
            except grpc.aio.AioRpcError as exc:
                outcome = exc.code().name
            records.append((sent, time.monotonic(), outcome, -1 if w.probe else user))

        return send

    def hammer(i: int) -> Callable[[], Awaitable[None]]:
        call = calls[i % len(calls)]

        async def send() -> None:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await call(hot, timeout=1.0)

        return send

    await asyncio.sleep(max(0.0, w.start - time.monotonic()))
    await asyncio.gather(*(_paced(w.clients / w.rate, end, client(i)) for i in range(w.clients)),
                         *(_paced(w.hammers / w.hammer_rate, end, hammer(i)) for i in range(w.hammers)))
    for channel in channels:
        await channel.close(None)
    return records


def _load_process(w: Workload, seed: int, out: multiprocessing.Queue[list[Record]]) -> None:
    gc.disable()  # a collection pause here would show as a slow answer of the server's
    out.put(asyncio.run(_drive(w, seed)))


@dataclass
class Result:
    name: str
    calls: int = 0
    over_admitted: int = 0
    lost: int = 0
    unavailable: int = 0
    late: int = 0
    other_errors: int = 0
    recovery: float = 0.0
    slowest: float = 0.0
    in_time: float = 1.0
    log_lines: int = 0  # the server's warnings


def analyse(name: str, records: list[Record], fault_at: float, deadline: float, lost_at: float | None,
            stored: int) -> Result:
    """The table row of one phase. ``stored``: the hits the storage holds at the end on the key every call
    names (limited far beyond the load): each admitted call that it does not hold was lost (a restart without
    persistence, a failover before replication); ``lost_at``: when data may have been lost."""
    result = Result(name, calls=len(records))
    admitted: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
    total = 0
    for sent, answered, outcome, user in records:
        result.slowest = max(result.slowest, answered - sent)
        if outcome == "ok" and user >= 0:
            total += 1
            for kind, index in (("org", user % ORGS), ("second", user % SECOND_KEYS)):
                admitted[(kind, index)].append((sent, answered))
        elif outcome == "UNAVAILABLE":
            result.unavailable += 1
        elif outcome == "DEADLINE_EXCEEDED":
            result.late += 1
        elif outcome not in ("ok", "over"):
            result.other_errors += 1
        if outcome not in ("ok", "over") and answered > fault_at:
            result.recovery = max(result.recovery, answered - fault_at)
    result.lost = max(0, total - stored)
    # a limit whose counted hits were lost admits them again: only what the lost hits do not explain is an error
    beyond = sum(max(0, len(calls) - ORG_LIMIT) for (kind, _), calls in admitted.items() if kind == "org")
    result.over_admitted = max(0, beyond - result.lost)
    for (kind, _), calls in admitted.items():
        if kind == "second":
            calls.sort()
            result.over_admitted += _rolling_over(calls, 1.0, SECOND_LIMIT, lost_at)
    after = [(s, a, o) for s, a, o, _ in records if fault_at <= s < fault_at + AFTER_FAULT]
    result.in_time = sum(1 for s, a, o in after if o in ("ok", "over") and a - s <= deadline) / max(1, len(after))
    return result


def timeline(records: list[Record], fault_at: float, deadline: float, step: float = 0.25) -> str:
    """Calls and the failed or late among them, per ``step`` seconds from the fault: where the failures fell."""
    calls: dict[int, int] = defaultdict(int)
    bad: dict[int, int] = defaultdict(int)
    for sent, answered, outcome, _ in records:
        bucket = int((sent - fault_at) // step)
        calls[bucket] += 1
        if outcome not in ("ok", "over") or answered - sent > deadline:
            bad[bucket] += 1
    return "\n".join(f"  {b * step:+6.2f} s: {bad[b]:5} failed or late of {calls[b]}" for b in sorted(calls) if bad[b])


def _rolling_over(calls: list[tuple[float, float]], window: float, limit: int, lost_at: float | None) -> int:
    """Calls admitted beyond ``limit`` in a window of ``window`` seconds that certainly held them all (each sent
    after the first was sent and answered before the window ended); windows around a data loss are skipped."""
    worst = 0
    for i, (first_sent, _) in enumerate(calls):
        if lost_at is not None and first_sent - window < lost_at < first_sent + window:
            continue
        inside = sum(1 for sent, answered in calls[i:] if sent < first_sent + window and answered < first_sent + window)
        worst = max(worst, inside - limit)
    return worst


class Slidegate:
    """`slidegate serve --workers 2` on free ports, with ``env``."""

    def __init__(self, redis_url: str, env: dict[str, str], workers: int = 2) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="slidegate-faults-"))
        (self.dir / "config.yaml").write_text(CONFIG)
        self.ports = [stack.free_port() for _ in range(3)]
        self.port = self.ports[0]
        self.log = open(self.dir / "log", "wb")  # noqa: SIM115 - closed in stop()
        args = [sys.executable, "-m", "slidegate", "serve", "--config", str(self.dir), "--host", "127.0.0.1",
                "--grpc-port", str(self.port), "--http-host", "127.0.0.1", "--http-port", str(self.ports[1]),
                "--debug-host", "127.0.0.1", "--debug-port", str(self.ports[2]), "--workers", str(workers)]
        self.process = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT,
                                        env={**os.environ, "REDIS_URL": redis_url, **env})
        try:
            stack.wait_grpc_serving(self.port, timeout=30)
            time.sleep(0.5)  # every worker's loop running
        except TimeoutError:
            self.stop()
            raise

    def stop(self) -> int:
        """Stop it and remove its directory; returns the number of warning lines it logged."""
        stack.stop(self.process)
        self.log.close()
        warnings = sum(1 for line in (self.dir / "log").read_text(errors="replace").splitlines() if "WARNING" in line)
        shutil.rmtree(self.dir, ignore_errors=True)
        remove_port_locks(self.ports)  # `serve --workers` leaves its ports' lock files: no one holds them now
        return warnings


def stored_hits(port: int, run: str) -> int:
    """The hits the storage holds on the key every call of ``run`` names (a check that counts nothing)."""
    check = rls_pb2.RateLimitRequest(domain="faults", descriptors=[ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key="all", value=run)])])
    check.descriptors[0].hits_addend.value = 0
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = channel.unary_unary(METHOD, request_serializer=lambda m: m.SerializeToString(),
                                    response_deserializer=rls_pb2.RateLimitResponse.FromString)(check, timeout=10)
    return ALL_LIMIT - int(reply.statuses[0].limit_remaining)


def run_phase(name: str, port: int, inject: Callable[[str], float | None], *, seconds: float, before: float = 3.0,
              warmup: float = 1.0, workload: dict[str, object] | None = None, show_timeline: bool = False) -> Result:
    """Load for ``warmup`` + ``seconds`` from two processes (the first ``warmup`` seconds, while connections are
    made, are not measured); ``inject`` runs ``before`` seconds into the measured part and returns the time
    data may have been lost, if it may have been."""
    run = f"{name}-{random.getrandbits(32):08x}"
    start = time.monotonic() + 1.0 + warmup
    context = multiprocessing.get_context("spawn")
    queue: multiprocessing.Queue[list[Record]] = context.Queue()
    w = Workload(run=run, port=port, start=start - warmup, seconds=seconds + warmup,
                 **(workload or {}))  # type: ignore[arg-type]
    processes = [context.Process(target=_load_process, args=(w, seed, queue)) for seed in range(2)]
    for p in processes:
        p.start()
    time.sleep(max(0.0, start + before - time.monotonic()))
    fault_at = time.monotonic()
    lost_at = inject(run)
    records = [r for _ in processes for r in queue.get(timeout=seconds + warmup + 60) if r[0] >= start]
    for p in processes:
        p.join()
    if show_timeline:
        print(f"{name}:\n{timeline(records, fault_at, w.deadline)}", flush=True)
    return analyse(name, records, fault_at, w.deadline, lost_at, stored_hits(port, run))


# --- the faults ----------------------------------------------------------------------------------------------

Topology = RedisServer | SentinelGroup | Cluster
Inject = Callable[[Topology, int, str], float | None]  # (Redis, slidegate's port, run) -> when data may be lost


def admin(server: RedisServer) -> redis.Redis:
    # no retries: redis-py's default would try a SHUTDOWN's lost connection again for seconds
    return redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=5, retry=Retry(NoBackoff(), 0))


def single(fault: Callable[[RedisServer], float | None]) -> Inject:
    def inject(topology: Topology, _port: int, _run: str) -> float | None:
        assert isinstance(topology, RedisServer)
        return fault(topology)

    return inject


def nothing(_: RedisServer) -> float | None:
    return None


def client_kill(server: RedisServer) -> float | None:
    for _ in range(3):
        with admin(server) as r:
            r.execute_command("CLIENT", "KILL", "TYPE", "normal")
        time.sleep(1.0)
    return None


def script_flush(server: RedisServer) -> float | None:
    for _ in range(3):
        with admin(server) as r:
            r.execute_command("SCRIPT", "FLUSH")
        time.sleep(1.0)
    return None


def client_pause(which: str) -> Callable[[RedisServer], float | None]:
    def pause(server: RedisServer) -> float | None:
        with admin(server) as r:
            r.execute_command("CLIENT", "PAUSE", 3000, which)
        return None

    return pause


def debug_sleep(seconds: int) -> Callable[[RedisServer], float | None]:
    def sleep(server: RedisServer) -> float | None:
        with admin(server) as r:
            r.execute_command("DEBUG", "SLEEP", seconds)
        return None

    return sleep


def restart(server: RedisServer) -> float | None:
    with admin(server) as r, contextlib.suppress(redis.ConnectionError):  # it closes the connection as it goes
        r.execute_command("SHUTDOWN", "NOSAVE")
    if server.process is not None:
        server.process.wait(10)
    time.sleep(1.0)
    server.start()
    return time.monotonic()


def hostile(_topology: Topology, port: int, run: str) -> float | None:
    """Another client sends, for 4 s as fast as it can, 60 KB values (all naming one key limited to 5 an hour),
    malformed messages, messages over GRPC_MAX_RECV_MSG_SIZE, and requests of 15 descriptors of 64 entries of
    1,000 characters."""

    async def attack() -> int:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}",
                                             options=[("grpc.max_send_message_length", -1)]) as channel:
            call = channel.unary_unary(METHOD, request_serializer=lambda b: b,
                                       response_deserializer=rls_pb2.RateLimitResponse.FromString)
            long_value = single_request("api_key", f"{run}-" + "k" * 60_000)
            many = rls_pb2.RateLimitRequest(domain="faults", descriptors=[ratelimit_pb2.RateLimitDescriptor(
                entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key="k", value="v" * 1000)] * 64)] * 15)
            bodies = [long_value, b"\xff\xff\xff", b"\x0a" * 5_000_000, many.SerializeToString()]  # 5 MB: refused
            ended = time.monotonic() + 4
            admitted = 0
            while time.monotonic() < ended:
                for body in bodies:
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        reply = await call(body, timeout=2)
                        admitted += body is long_value and reply.overall_code == rls_pb2.RateLimitResponse.OK
            return admitted

    admitted = asyncio.run(attack())
    if admitted != 5:
        print(f"hostile: {admitted} requests with a 60 KB value admitted; the limit is 5", file=sys.stderr)
    return None


def sentinel_failover(topology: Topology, _port: int, _run: str) -> float | None:
    assert isinstance(topology, SentinelGroup)
    old = topology.master_port()
    topology.failover()
    wait_for(lambda: topology.master_port() != old, 20, "the failover")
    return time.monotonic()


def sentinel_master_kill(topology: Topology, _port: int, _run: str) -> float | None:
    """kill -9 of the master: Sentinel promotes the replica after down-after-milliseconds (1 s here)."""
    assert isinstance(topology, SentinelGroup)
    old = topology.master_port()
    killed = next(s for s in (topology.master, topology.replica) if s.port == old)
    killed.stop()
    lost_at = time.monotonic()
    wait_for(lambda: topology.master_port() != old, 30, "the failover")
    return lost_at


def cluster_master_kill(topology: Topology, _port: int, run: str) -> float | None:
    """kill -9 of the master holding the key every call names: its replica takes over after the node timeout."""
    assert isinstance(topology, Cluster)
    victim = topology.master_of(limit_key("", "sliding_window_log", "faults", [("all", run)]))
    victim.stop()
    lost_at = time.monotonic()
    wait_for(lambda: topology.master_of(limit_key("", "sliding_window_log", "faults", [("all", run)])) is not victim,
             30, "the failover")
    return lost_at


@dataclass(frozen=True)
class Phase:
    topology: str  # single, sentinel or cluster
    inject: Inject
    env: tuple[tuple[str, str], ...] = ()
    workload: tuple[tuple[str, object], ...] = ()


# Envoy's default deadline (20 ms) while Redis is paused and 16 clients hammer a key known to be over limit:
# the failure mode must answer the other calls before their deadline (each sends a key of its own with room)
DEADLINE_LOAD = (("clients", 8), ("rate", 150.0), ("hammers", 8), ("hammer_rate", 600.0), ("deadline", 0.02),
                 ("probe", True))
PHASES: dict[str, Phase] = {
    "healthy": Phase("single", single(nothing)),
    "client-kill": Phase("single", single(client_kill)),
    "script-flush": Phase("single", single(script_flush)),
    "client-pause": Phase("single", single(client_pause("WRITE"))),
    "debug-sleep": Phase("single", single(debug_sleep(1))),
    "restart": Phase("single", single(restart)),
    "hostile-input": Phase("single", hostile),
    **{f"pause-{which.lower()}-{mode}": Phase("single", single(client_pause(which)), (("FAILURE_MODE", mode),),
                                              DEADLINE_LOAD)
       for mode in ("allow", "deny", "local") for which in ("WRITE", "ALL")},
    **{f"sleep-{mode}": Phase("single", single(debug_sleep(3)), (("FAILURE_MODE", mode),), DEADLINE_LOAD)
       for mode in ("allow", "deny", "local")},
    "sentinel-failover": Phase("sentinel", sentinel_failover, (("REDIS_TYPE", "sentinel"),)),
    "sentinel-master-kill": Phase("sentinel", sentinel_master_kill, (("REDIS_TYPE", "sentinel"),)),
    "cluster-master-kill": Phase("cluster", cluster_master_kill, (("REDIS_TYPE", "cluster"),)),
}


def _inject(phase: Phase, topology: Topology, slidegate: Slidegate, run: str) -> float | None:
    """``phase``'s fault injected into ``topology`` under ``slidegate``, for run_phase."""
    return phase.inject(topology, slidegate.port, run)


@contextmanager
def redis_of(kind: str) -> Iterator[Topology]:
    """A fresh Redis of ``kind`` (single, sentinel, cluster) of private processes, stopped afterwards."""
    topology: Topology
    if kind == "single":
        topology = RedisServer().start()
    elif kind == "sentinel":
        topology = SentinelGroup()
    else:
        topology = Cluster()
    try:
        yield topology
    finally:
        topology.cleanup()


def redis_url(topology: Topology) -> str:
    return topology.url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0, help="measured load per phase")
    parser.add_argument("--only", nargs="*", choices=sorted(PHASES), help="phases to run (default: all)")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here (Markdown)")
    parser.add_argument("--timeline", action="store_true", help="print when each phase's failures fell")
    args = parser.parse_args()
    results: list[Result] = []
    for name, phase in PHASES.items():
        if args.only and name not in args.only:
            continue
        with redis_of(phase.topology) as topology:
            slidegate = Slidegate(redis_url(topology), dict(phase.env))
            try:
                results.append(run_phase(name, slidegate.port, partial(_inject, phase, topology, slidegate),
                                         seconds=args.seconds, workload=dict(phase.workload),
                                         show_timeline=args.timeline))
            finally:
                warnings = slidegate.stop()
            results[-1].log_lines = warnings
        print(row(results[-1]), flush=True)
    table = render(results)
    print(table)
    if args.out:
        args.out.write_text(table)


HEADER = ("| fault | calls | over-admitted | admitted hits lost | UNAVAILABLE | late | other errors | "
          "last failure after the fault | slowest answer | answered in time (4 s after the fault) | warnings logged |"
          "\n|---|---|---|---|---|---|---|---|---|---|---|")


def row(r: Result) -> str:
    return (f"| {r.name} | {r.calls:,} | {r.over_admitted} | {r.lost} | {r.unavailable} | {r.late} | "
            f"{r.other_errors} | {r.recovery:.2f} s | {r.slowest * 1000:.0f} ms | {r.in_time:.2%} | {r.log_lines} |")


def render(results: list[Result]) -> str:
    return "\n".join([HEADER, *(row(r) for r in results)]) + "\n"


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    main()
