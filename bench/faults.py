"""The fault suite: slidegate (several worker processes) under steady load while its Redis fails in one way at a
time, and the table of what each fault cost.

    python bench/faults.py [--seconds 10] [--only NAME ...] [--out bench/faults.md]

Every phase starts a fresh `slidegate serve --workers 2` against a Redis of its own (a private redis-server, a
Sentinel group or a Redis Cluster, all on free loopback ports), drives it from two load processes (32 clients,
4 descriptors a call) and injects its fault a few seconds in. Each call names a user (limit per hour), the
user's organisation (per hour), a per-second key and a key shared by all; the limits are sliding-window logs,
so "over-admission" has one meaning: more calls admitted than a limit allows in some window. For the hourly
limits the whole phase is one window; for the per-second keys a window of calls counts only when every one of
them was certainly decided within one second (sent after the first was sent, answered before it ended), so the
count has no false alarms. A Redis restarted without persistence forgets what it counted: what is admitted
again after that is reported apart ("re-admitted after data loss").

Columns: calls; over-admissions (must be 0); re-admitted after data loss; UNAVAILABLE; late (the call's
deadline passed first: Envoy treats both as an error and, by default, lets the request through); time from the
fault to the last failed call; the slowest answer; the share of calls answered before their deadline.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import redis

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests.redis_servers / redis_topologies: the private Redis processes

from slidegate import stack  # noqa: E402
from slidegate._proto.envoy.extensions.common.ratelimit.v3 import ratelimit_pb2  # noqa: E402
from slidegate._proto.envoy.service.ratelimit.v3 import rls_pb2  # noqa: E402
from tests.redis_servers import RedisServer  # noqa: E402

METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
USERS, ORGS, SECOND_KEYS = 12_000, 30, 60
USER_LIMIT, ORG_LIMIT, SECOND_LIMIT = 40, 3000, 4
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
    rate_limit: {{unit: hour, requests_per_unit: 1000000000}}
  - key: hot
    rate_limit: {{unit: hour, requests_per_unit: 5}}
  - key: probe
    rate_limit: {{unit: hour, requests_per_unit: 1000000000}}
  - key: api_key
    rate_limit: {{unit: hour, requests_per_unit: 5}}
"""
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
    """What one load process sends: ``clients`` coroutines of user calls with ``deadline`` seconds each, and
    ``hammers`` coroutines that send one over-limit key as fast as they can (answered without Redis once it is
    known to be over). ``user_base``: this process's first user (processes take disjoint users only when
    ``disjoint``)."""

    run: str
    port: int
    start: float  # monotonic time to begin at
    seconds: float
    clients: int = 16
    deadline: float = 1.0
    hammers: int = 0
    probe: bool = False  # each client sends a key of its own with room (never answered from the cache)


async def _drive(w: Workload, seed: int) -> list[Record]:
    rng = random.Random(seed)
    requests = [user_request(w.run, u) for u in range(USERS)]
    hot = single_request("hot", w.run)
    records: list[Record] = []
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{w.port}") for _ in range(4)]
    calls = [c.unary_unary(METHOD, request_serializer=lambda b: b,
                           response_deserializer=rls_pb2.RateLimitResponse.FromString) for c in channels]
    end = w.start + w.seconds

    async def client(i: int) -> None:
        call = calls[i % len(calls)]
        probe = single_request("probe", f"{w.run}-{seed}-{i}")
        while time.monotonic() < end:
            user = rng.randrange(USERS)
            sent = time.monotonic()
            try:
                reply = await call(probe if w.probe else requests[user], timeout=w.deadline)
                outcome = "ok" if reply.overall_code == rls_pb2.RateLimitResponse.OK else "over"
            except grpc.aio.AioRpcError as exc:
                outcome = exc.code().name
            answered = time.monotonic()
            records.append((sent, answered, outcome, -1 if w.probe else user))
            if outcome not in ("ok", "over"):
                await asyncio.sleep(0.002)  # as a client would: no tight loop on errors

    async def hammer(i: int) -> None:
        call = calls[i % len(calls)]
        while time.monotonic() < end:
            try:
                await call(hot, timeout=1.0)
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.002)

    await asyncio.sleep(max(0.0, w.start - time.monotonic()))
    await asyncio.gather(*(client(i) for i in range(w.clients)), *(hammer(i) for i in range(w.hammers)))
    for channel in channels:
        await channel.close()
    return records


def _load_process(w: Workload, seed: int, out: multiprocessing.Queue[list[Record]]) -> None:
    gc.disable()  # a collection pause here would show as a slow answer of the server's
    out.put(asyncio.run(_drive(w, seed)))


@dataclass
class Result:
    name: str
    calls: int = 0
    over_admitted: int = 0
    readmitted: int = 0
    unavailable: int = 0
    late: int = 0
    other_errors: int = 0
    recovery: float = 0.0
    slowest: float = 0.0
    in_time: float = 1.0
    notes: list[str] = field(default_factory=list)


def analyse(name: str, records: list[Record], fault_at: float, deadline: float, lost_at: float | None = None,
            ) -> Result:
    """The table row of one phase. ``lost_at``: when Redis came back empty (a restart without persistence)."""
    result = Result(name, calls=len(records))
    admitted: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
    for sent, answered, outcome, user in records:
        result.slowest = max(result.slowest, answered - sent)
        if outcome == "ok" and user >= 0:
            for kind, index in (("user", user), ("org", user % ORGS), ("second", user % SECOND_KEYS)):
                admitted[(kind, index)].append((sent, answered))
        elif outcome == "UNAVAILABLE":
            result.unavailable += 1
        elif outcome == "DEADLINE_EXCEEDED":
            result.late += 1
        elif outcome not in ("ok", "over"):
            result.other_errors += 1
        if outcome not in ("ok", "over") and answered > fault_at:
            result.recovery = max(result.recovery, answered - fault_at)
    limits = {"user": USER_LIMIT, "org": ORG_LIMIT}
    for (kind, _), calls in admitted.items():
        calls.sort()
        if kind not in limits:
            result.over_admitted += _rolling_over(calls, 1.0, SECOND_LIMIT, lost_at)
            continue
        limit = limits[kind]
        beyond = max(0, len(calls) - limit)
        if lost_at is None:
            result.over_admitted += beyond
            continue
        # a Redis that came back empty at lost_at counts afresh: calls answered before it certainly met the old
        # counts, calls sent after it the new ones; each world must stay within the limit
        old = sum(1 for _, answered in calls if answered < lost_at)
        new = sum(1 for sent, _ in calls if sent >= lost_at)
        certain = max(0, old - limit) + max(0, new - limit)
        result.over_admitted += certain
        result.readmitted += beyond - certain
    answered_in_time = sum(1 for s, a, o, _ in records if o in ("ok", "over") and a - s <= deadline)
    result.in_time = answered_in_time / max(1, len(records))
    return result


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
        self.port = stack.free_port()
        self.log = open(self.dir / "log", "wb")  # noqa: SIM115 - closed in stop()
        args = [sys.executable, "-m", "slidegate", "serve", "--config", str(self.dir), "--host", "127.0.0.1",
                "--grpc-port", str(self.port), "--http-host", "127.0.0.1", "--http-port", str(stack.free_port()),
                "--debug-host", "127.0.0.1", "--debug-port", str(stack.free_port()), "--workers", str(workers)]
        self.process = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT,
                                        env={**os.environ, "REDIS_URL": redis_url, **env})
        try:
            stack.wait_grpc_serving(self.port, timeout=30)
            time.sleep(0.5)  # every worker's loop running
        except TimeoutError:
            self.stop()
            raise

    def warnings(self) -> list[str]:
        return [line for line in (self.dir / "log").read_text(errors="replace").splitlines() if "WARNING" in line]

    def stop(self) -> None:
        stack.stop(self.process)
        self.log.close()


def run_phase(name: str, port: int, inject: Callable[[], float | None], *, seconds: float, before: float = 3.0,
              workload: dict[str, object] | None = None) -> Result:
    """Load for ``seconds`` from two processes; ``inject`` runs ``before`` seconds in and returns the time Redis
    came back empty, if it did."""
    run = f"{name}-{random.getrandbits(32):08x}"
    start = time.monotonic() + 1.0
    context = multiprocessing.get_context("spawn")
    queue: multiprocessing.Queue[list[Record]] = context.Queue()
    w = Workload(run=run, port=port, start=start, seconds=seconds, **(workload or {}))  # type: ignore[arg-type]
    processes = [context.Process(target=_load_process, args=(w, seed, queue)) for seed in range(2)]
    for p in processes:
        p.start()
    time.sleep(max(0.0, start + before - time.monotonic()))
    fault_at = time.monotonic()
    lost_at = inject()
    records = [r for _ in processes for r in queue.get(timeout=seconds + 60)]
    for p in processes:
        p.join()
    return analyse(name, records, fault_at, w.deadline, lost_at)


# --- faults on one Redis -------------------------------------------------------------------------------------

def admin(server: RedisServer) -> redis.Redis:
    return redis.Redis(port=server.port, socket_timeout=5)


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


def client_pause(server: RedisServer) -> float | None:
    with admin(server) as r:
        r.execute_command("CLIENT", "PAUSE", 2000, "WRITE")
    return None


def debug_sleep(server: RedisServer) -> float | None:
    with admin(server) as r:
        r.execute_command("DEBUG", "SLEEP", 1)
    return None


def restart(server: RedisServer) -> float | None:
    with admin(server) as r, contextlib.suppress(redis.ConnectionError):  # it closes the connection as it goes
        r.execute_command("SHUTDOWN", "NOSAVE")
    if server.process is not None:
        server.process.wait(10)
    time.sleep(1.0)
    server.start()
    return time.monotonic()


def hostile(server: RedisServer, port: int) -> Callable[[], float | None]:
    """Long values, malformed and oversized messages and many descriptors from another client while the load
    runs; every long-value request names one key limited to 5 per hour."""

    def inject() -> float | None:
        async def attack() -> None:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}",
                                                 options=[("grpc.max_send_message_length", -1)]) as channel:
                call = channel.unary_unary(METHOD, request_serializer=lambda b: b, response_deserializer=lambda b: b)
                long_value = single_request("api_key", "k" * 60_000)
                bodies = [long_value, b"\xff\xff\xff", b"\x0a" * 4_000_000,
                          rls_pb2.RateLimitRequest(domain="faults", descriptors=[ratelimit_pb2.RateLimitDescriptor(
                              entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key="k", value="v" * 1000)] * 64)]
                              * 15).SerializeToString()]
                ended = time.monotonic() + 4
                admitted = 0
                while time.monotonic() < ended:
                    for body in bodies:
                        try:
                            reply = await call(body, timeout=2)
                            if body is long_value and rls_pb2.RateLimitResponse.FromString(reply).overall_code == 1:
                                admitted += 1
                        except grpc.aio.AioRpcError:
                            pass
                if admitted > 5:
                    print(f"hostile: {admitted} long-value requests admitted, limit 5", file=sys.stderr)
        asyncio.run(attack())
        return None

    return inject


@contextmanager
def single_redis() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.cleanup()


SINGLE_FAULTS: dict[str, Callable[[RedisServer], float | None]] = {
    "healthy": nothing, "client-kill": client_kill, "script-flush": script_flush, "client-pause": client_pause,
    "debug-sleep": debug_sleep, "restart": restart,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0, help="load per phase")
    parser.add_argument("--only", nargs="*", help="phases to run (default: all)")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here (Markdown)")
    args = parser.parse_args()
    wanted = set(args.only or [])
    results: list[Result] = []

    def want(name: str) -> bool:
        return not wanted or name in wanted

    with single_redis() as server:
        for name, fault in SINGLE_FAULTS.items():
            if not want(name):
                continue
            slidegate = Slidegate(server.url, {})
            try:
                results.append(run_phase(name, slidegate.port, lambda f=fault: f(server), seconds=args.seconds))
                results[-1].notes = slidegate.warnings()[-5:]
            finally:
                slidegate.stop()
            print(row(results[-1]), flush=True)
    table = render(results)
    print(table)
    if args.out:
        args.out.write_text(table)


HEADER = ("| fault | calls | over-admitted | re-admitted after data loss | UNAVAILABLE | late | other errors | "
          "last failure after the fault | slowest answer | answered in time |\n"
          "|---|---|---|---|---|---|---|---|---|---|")


def row(r: Result) -> str:
    return (f"| {r.name} | {r.calls:,} | {r.over_admitted} | {r.readmitted} | {r.unavailable} | {r.late} | "
            f"{r.other_errors} | {r.recovery:.2f} s | {r.slowest * 1000:.0f} ms | {r.in_time:.2%} |")


def render(results: list[Result]) -> str:
    return "\n".join([HEADER, *(row(r) for r in results)]) + "\n"


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    main()
