"""Where a call's event-loop CPU goes, layer by layer, from the bare round trip to `slidegate serve`.

One gRPC server (grpc.aio + uvloop, as `slidegate serve`) per layer answers one-descriptor requests
(sliding-window log) with more of slidegate's path each time, all driven by h2load -c 10 -m 10 in alternating
rounds (2,000 warm-up calls, then --requests) on one private redis-server (or REDIS_URL); event-loop CPU per
call and calls/s, each round's as a ratio to the bare round trip's of the same round, then the median. It
prints a line per round, then the table.

    apt-get install nghttp2-client redis-server   # h2load, redis-server
    python -m bench.layers [--rounds 5] [--requests 20000] [--layers bare,...] [--against DIR]   # from the root

The layers, each from ``minimal`` on adding to the one before (``flatb`` is an experiment beside them):

- ``bare``: bench/noop_server.py with a Redis URL: one EVALSHA per call on a bare asyncio protocol.
- ``minimal``: slidegate's request looked up by its bytes, its script call packed once and written on a connection
  of the same kind as the backend's own (slidegate.backends.redis_wire), the response built from the reply: the
  least slidegate's path does, with none of its bookkeeping.
- ``flatb``: an experiment, not slidegate's path: the decision of a remembered request in one coroutine around the
  Redis backend's decision (the call and its latencies counted, the over-limit cache looked at, an outage log told,
  the limit's counters, the response filled in on its skeleton); anything else goes the service's own way. What the
  layers above the backend cost, against ``backend`` and ``service``. (Its twin ``flat``, which also wrote the
  script call itself on an idle connection of the backend's, reached into the backend's internals and was removed;
  docs/performance.md has what it measured.)
- ``backend``: the call decided by the Redis backend (natural batching, the batch's bound and the caller's,
  breaker, permits, the answers read), the response built from its decision as above.
- ``limiter``: the Limiter's decision (the over-limit cache, statuses, failure modes) and slidegate's response.
- ``service``: RateLimitService.should_rate_limit, the whole decision (metrics, the outage log).
- ``serve``: `slidegate serve` itself (health, reflection, the heap keeper, the quota service beside it).
- ``before`` (with ``--against DIR``): `slidegate serve` from another checkout, to measure a change side by side.

h2load counts a gRPC error as a success, so each layer's calls are counted again in Redis (each one decided is a
hit in its own key's log) and a layer that answered fewer stops the run.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import hiredis
import redis
import redis.asyncio
import uvloop

from bench.run import body, h2load, private_redis
from slidegate import stack
from slidegate.algorithms import Algorithm
from slidegate.application import Application, build
from slidegate.backends.blocked import OverLimitCache
from slidegate.backends.redis import RedisBackend, limit_args
from slidegate.backends.redis_wire import WireConnection
from slidegate.decider import Decision, Prepared, rejects
from slidegate.keys import limit_key
from slidegate.outage import OutageLog
from slidegate.protos import rls_pb2
from slidegate.request import Request, parse_request
from slidegate.resources import lua_script
from slidegate.service import RateLimitService, build_response
from slidegate.settings import Settings

HERE = Path(__file__).resolve().parent
LAYERS = ("bare", "minimal", "flatb", "backend", "limiter", "service", "serve")
CONFIG = """
domain: bench
descriptors:
  - key: sliding_window_log
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
"""
OK = rls_pb2.RateLimitResponse.OK
OVER_LIMIT = rls_pb2.RateLimitResponse.OVER_LIMIT
Handler = Callable[[bytes, Any], Awaitable[rls_pb2.RateLimitResponse]]


def response(admitted: bool, over: bool, remaining: int, reset_us: int,
             prepared: Prepared) -> rls_pb2.RateLimitResponse:
    """The response to a one-descriptor request, filled in on its skeleton (as slidegate.service.build_response
    fills a remembered request's)."""
    assert prepared.skeleton is not None
    answer = rls_pb2.RateLimitResponse.FromString(prepared.skeleton)
    answer.overall_code = OK if admitted else OVER_LIMIT
    status = answer.statuses[0]
    status.code = OVER_LIMIT if over else OK
    status.limit_remaining = remaining
    seconds, micros = divmod(reset_us, 1_000_000)
    status.duration_until_reset.seconds = seconds
    status.duration_until_reset.nanos = micros * 1000
    return answer


def redis_backend(app: Application) -> RedisBackend:
    """The Redis backend under the application's over-limit cache."""
    backend = app.backend.backend if isinstance(app.backend, OverLimitCache) else app.backend
    assert isinstance(backend, RedisBackend)
    return backend


def remembering(service: RateLimitService) -> Callable[[bytes], Prepared]:
    """A request's prepared form by its bytes, made on its first call and kept (as the service keeps them)."""
    prepared: dict[bytes, Prepared] = {}

    def prepare(data: bytes) -> Prepared:
        found = prepared.get(data)
        if found is None:
            domain, descriptors = parse_request(Request.FromString(data))
            found = prepared[data] = service.decider.prepare(domain, descriptors, skeleton=True)
        return found

    return prepare


@dataclass
class Taken:
    """The calls a flat path decided itself, and those it sent the service's way."""

    flat: int = 0
    service: int = 0

    def share(self) -> str:
        calls = self.flat + self.service
        return f"{self.service / calls:.0%} of {calls:,} calls went the service's way" if calls else "no calls"


def flat_handler(app: Application, taken: Taken | None = None) -> Handler:
    """The decision of a remembered request of one limit in one coroutine around the Redis backend's decision, each
    rule above it in its leanest form (an experiment: what the layers above the backend cost); a call out of the
    common case (the over-limit cache holding anything, several limits) goes slidegate's own way, the service's,
    with all its bookkeeping. ``taken`` counts the calls each way."""
    taken = taken or Taken()
    service = app.service
    backend = redis_backend(app)
    prepare = remembering(service)

    cache = app.backend if isinstance(app.backend, OverLimitCache) else None
    metrics = service.metrics
    outage = OutageLog()  # as the service tells its own of every answer

    async def handler(data: bytes, context: Any) -> rls_pb2.RateLimitResponse:
        found = prepare(data)
        checks = found.plan.checks
        if len(checks) != 1 or (cache is not None and cache.bytes_charged):
            taken.service += 1
            return await service.should_rate_limit(data, context)
        taken.flat += 1
        started = time.perf_counter()
        metrics.total_requests.inc()
        decision = await backend.decide(checks, None, context.time_remaining())
        outcome = decision.outcomes[0]
        metrics.storage_latency.observe(time.perf_counter() - started)
        outage.answered()
        answer = response(decision.admitted, outcome.over, outcome.remaining, outcome.reset_us, found)
        for index, counters, limit in found.counted:
            status = found.plan.statuses[index]
            counters.record(hits=status.hits, limit=limit, over=outcome.over, remaining=outcome.remaining,
                            shadow=status.shadow)
        metrics.call_latency.observe(time.perf_counter() - started)
        metrics.response_time.record(int((time.perf_counter() - started) * 1000))
        return answer

    return handler


async def serve_layer(layer: str, port: int, config_root: str, redis_url: str, key_prefix: str) -> None:
    """Serve ``layer`` (one of LAYERS but bare and serve) on ``port`` until killed."""
    settings = Settings.load({"RUNTIME_ROOT": config_root, "RUNTIME_SUBDIRECTORY": "", "RUNTIME_WATCH_ROOT": "false",
                              "REDIS_URL": redis_url, "CACHE_KEY_PREFIX": key_prefix})
    app = build(settings)
    service, limiter = app.service, app.limiter
    backend = redis_backend(app)
    await backend.ping()  # the script loaded
    prepare = remembering(service)

    handler: Handler
    taken = None
    if layer == "minimal":
        pool = redis.asyncio.ConnectionPool.from_url(redis_url)
        connection = await WireConnection.take_over(await pool.get_connection())
        sha = hashlib.sha1(lua_script([a.value for a in Algorithm]).encode()).hexdigest()
        packed: dict[bytes, bytes] = {}

        async def handler(data: bytes, context: Any) -> rls_pb2.RateLimitResponse:
            found = prepare(data)
            call = packed.get(data)
            if call is None:
                [check] = found.plan.checks
                # the backend's call for one request of one limit (lua/decide.lua): Redis's clock, one request
                command: Any = ("EVALSHA", sha, 1, check.key, "", 1, 1, *limit_args(check))
                call = packed[data] = hiredis.pack_command(command)
            admitted, over, remaining, reset_us = (await connection.call(call))[0]
            return response(bool(admitted), bool(over), remaining, reset_us, found)
    elif layer == "flatb":
        taken = Taken()
        handler = flat_handler(app, taken=taken)
    elif layer == "backend":
        async def handler(data: bytes, context: Any) -> rls_pb2.RateLimitResponse:
            found = prepare(data)
            decision = await backend.decide(found.plan.checks)
            outcome = decision.outcomes[0]
            return response(decision.admitted, outcome.over, outcome.remaining, outcome.reset_us, found)
    elif layer == "limiter":
        async def handler(data: bytes, context: Any) -> rls_pb2.RateLimitResponse:
            found = prepare(data)
            statuses = (await limiter.decide(found.plan)).statuses
            return build_response(Decision(found, statuses, rejects(statuses)))
    else:
        handler = service.should_rate_limit
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "envoy.service.ratelimit.v3.RateLimitService", {"ShouldRateLimit": grpc.unary_unary_rpc_method_handler(
            handler, request_deserializer=None, response_serializer=rls_pb2.RateLimitResponse.SerializeToString)}),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    stopped = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopped.set)
    await stopped.wait()
    if taken is not None:
        print(f"{layer}: {taken.share()}", file=sys.stderr, flush=True)
    await server.stop(0)


def listening(port: int, timeout: float = 20.0) -> None:
    """Wait until a server takes connections on ``port`` (it listens once it serves). Raises TimeoutError."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on port {port}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument("--requests", type=int, default=20_000,
                        help="calls per layer per round, after 2,000 to warm up (default 20000)")
    parser.add_argument("--layers", default=",".join(LAYERS),
                        help=f"the layers to run, comma-separated, bare first (default {','.join(LAYERS)})")
    parser.add_argument("--against", metavar="DIR",
                        help="add the layer `before`: `slidegate serve` from the checkout DIR (its server/ first on "
                             "PYTHONPATH), to measure this code side by side with that")
    parser.add_argument("--serve", nargs=5, metavar=("LAYER", "PORT", "CONFIG_ROOT", "REDIS_URL", "KEY_PREFIX"),
                        help=argparse.SUPPRESS)  # a layer's server, started by this script itself
    options = parser.parse_args()
    if options.serve:
        layer, port, root, url, prefix = options.serve
        uvloop.run(serve_layer(layer, int(port), root, url, prefix))
        return
    layers = tuple(options.layers.split(","))
    if layers[0] != "bare" or not set(layers) <= set(LAYERS):
        parser.error(f"--layers: bare first, then any of {', '.join(LAYERS[1:])}")
    if options.against:
        layers += ("before",)
    work = Path(tempfile.mkdtemp(prefix="slidegate-layers-"))
    (work / "config").mkdir()
    (work / "config" / "bench.yaml").write_text(CONFIG)
    data = body(("sliding_window_log", "k1"), directory=work)
    with private_redis() as (url, _):
        servers: dict[str, tuple[int, subprocess.Popen[bytes]]] = {}
        prefixes = {layer: f"layers-{layer}-{uuid.uuid4().hex[:6]}:" for layer in layers}
        try:
            for layer in layers:
                port = stack.free_port()
                if layer == "bare":
                    process = subprocess.Popen([sys.executable, str(HERE / "noop_server.py"), str(port), url])
                elif layer in ("serve", "before"):
                    env = None
                    if layer == "before":
                        env = {**os.environ, "PYTHONPATH": str(Path(options.against).resolve() / "server")}
                    process = stack.start_slidegate(work / "config", port, redis_url=url, key_prefix=prefixes[layer],
                                                    extra_args=("--log-level", "warning"), env=env)
                else:
                    process = subprocess.Popen([sys.executable, "-m", "bench.layers", "--serve", layer, str(port),
                                                str(work), url, prefixes[layer]])
                servers[layer] = (port, process)
            for port, _ in servers.values():
                listening(port)
            rounds: dict[str, list[tuple[float, float]]] = {layer: [] for layer in layers}
            for number in range(options.rounds):
                for layer, (port, process) in servers.items():
                    watch = {"server": process.pid}
                    h2load(port, data, 2000, 10, 10, watch)  # warm up (and, the first time, wait for it)
                    load = h2load(port, data, options.requests, 10, 10, watch)
                    if load.failed:
                        sys.exit(f"{layer}: {load.failed} calls failed")
                    rounds[layer].append((load.calls, load.loop_us))
                print(f"round {number + 1}: " + ", ".join(f"{layer} {rounds[layer][-1][1]:.0f} µs"
                                                         for layer in layers), flush=True)
            # h2load counts a gRPC error as a success: each layer's answers are checked in Redis, where each call
            # it decided is one member scored by its time in its own key's log (the bare server's key is its own)
            with redis.Redis.from_url(url) as client:
                for layer in layers[1:]:
                    key = limit_key(prefixes[layer], Algorithm.SLIDING_WINDOW_LOG.value, "bench",
                                    [("sliding_window_log", "k1")])
                    counted = client.zcount(key, "(0", "+inf")  # the hits (lua/sliding_window_log.lua)
                    if counted != options.rounds * (2000 + options.requests):
                        sys.exit(f"{layer}: {counted} calls counted in Redis, "
                                 f"{options.rounds * (2000 + options.requests)} sent")
        finally:
            for _, process in servers.values():
                stack.stop(process)
            shutil.rmtree(work, ignore_errors=True)
    print("\n| layer | calls/s | loop µs | calls/s to bare | loop µs to bare | loop µs added by the layer |")
    print("|---|---|---|---|---|---|")
    previous = None
    for layer in layers:
        calls = statistics.median(c for c, _ in rounds[layer])
        loop_us = statistics.median(u for _, u in rounds[layer])
        to_bare = [(c / b[0], u / b[1]) for (c, u), b in zip(rounds[layer], rounds["bare"], strict=True)]
        added = "" if previous is None else f"{loop_us - previous:+.0f}"
        print(f"| {layer} | {calls:,.0f} | {loop_us:.0f} | {statistics.median(c for c, _ in to_bare):.2f} | "
              f"{statistics.median(u for _, u in to_bare):.2f} | {added} |")
        previous = loop_us


if __name__ == "__main__":
    main()
