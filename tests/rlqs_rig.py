"""Real Envoys in front of a real `slidegate serve` on a private Redis, for the long quota runs
(bench/rlqs_record.py, bench/quota_envoy.py): a recording proxy between the Envoys and slidegate logs every usage
report and every assignment, and clients send steady traffic through each Envoy, each answer timed.

Each Envoy reaches slidegate through a proxy of its own (one RLQS stream per Envoy), so the log says which
Envoy reported and which was answered; the proxy forwards the bytes as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from slidegate import stack, upstream
from slidegate._proto.envoy.service.rate_limit_quota.v3 import rlqs_pb2
from tests.redis_servers import RedisServer

# a scripted server instead of slidegate (bench/rlqs_probe.py): (envoy, time, report) -> the answer, if any
Script = Callable[[int, float, rlqs_pb2.RateLimitQuotaUsageReports], rlqs_pb2.RateLimitQuotaResponse | None]

METHOD = "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas"


@dataclass(frozen=True, slots=True)
class Event:
    """One message on an RLQS stream: ``at`` (s since the rig started), which Envoy, ``kind`` "report" or
    "answer", the bucket's user and what it says (a report: allowed, denied, elapsed s; an answer: the
    assignment as text)."""

    at: float
    envoy: int
    kind: str
    user: str
    what: str


def _describe(action: rlqs_pb2.RateLimitQuotaResponse.BucketAction) -> str:
    if action.HasField("abandon_action"):
        return "abandon"
    quota = action.quota_assignment_action
    ttl = quota.assignment_time_to_live.seconds
    strategy = quota.rate_limit_strategy
    if strategy.HasField("token_bucket"):
        tb = strategy.token_bucket
        return (f"token_bucket max={tb.max_tokens} per_fill={tb.tokens_per_fill.value} "
                f"fill={tb.fill_interval.seconds}s ttl={ttl}s")
    return f"{'ALLOW_ALL' if strategy.blanket_rule == 0 else 'DENY_ALL'} ttl={ttl}s"


class Recorder:
    """Recording proxies (one per Envoy) in an event loop of their own, all forwarding to ``target``; and
    ``pause``/``resume``: stop forwarding (every stream ended, new ones refused) as if slidegate were down."""

    def __init__(self, target: int, started: float, script: Script | None = None) -> None:
        self.target = target
        self.script = script
        self.started = started
        self.events: list[Event] = []
        self.lock = threading.Lock()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.servers: list[Any] = []

    def proxy(self, envoy: int) -> int:
        """A proxy port for Envoy number ``envoy``."""
        return asyncio.run_coroutine_threadsafe(self._serve(envoy), self.loop).result(10)

    async def _serve(self, envoy: int) -> int:
        server = grpc.aio.server()

        async def handle(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
            async for reply in self._forward(envoy, requests, context):
                yield reply

        method = grpc.stream_stream_rpc_method_handler(handle)
        service, name = METHOD[1:].rsplit("/", 1)
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(service, {name: method})])
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        self.servers.append(server)
        return port

    async def _forward(self, envoy: int, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        if self.script is not None:
            async for data in requests:
                self._log_reports(envoy, data)
                reply = self.script(envoy, self._now(), rlqs_pb2.RateLimitQuotaUsageReports.FromString(data))
                if reply is not None:
                    answer = reply.SerializeToString()
                    self._log_answers(envoy, answer)
                    yield answer
            return
        async with grpc.aio.insecure_channel(f"127.0.0.1:{self.target}") as channel:
            call = channel.stream_stream(METHOD, request_serializer=None, response_deserializer=None)

            async def upstream_requests() -> AsyncIterator[bytes]:
                async for data in requests:
                    self._log_reports(envoy, data)
                    yield data

            responses = call(upstream_requests(), metadata=context.invocation_metadata())
            async for data in responses:
                self._log_answers(envoy, data)
                yield data

    def _now(self) -> float:
        return time.monotonic() - self.started

    def _log_reports(self, envoy: int, data: bytes) -> None:
        message = rlqs_pb2.RateLimitQuotaUsageReports.FromString(data)
        now = self._now()
        with self.lock:
            for usage in message.bucket_quota_usages:
                what = (f"allowed={usage.num_requests_allowed} denied={usage.num_requests_denied} "
                        f"elapsed={usage.time_elapsed.seconds}s")
                self.events.append(Event(now, envoy, "report", usage.bucket_id.bucket.get("user", ""), what))

    def _log_answers(self, envoy: int, data: bytes) -> None:
        message = rlqs_pb2.RateLimitQuotaResponse.FromString(data)
        now = self._now()
        with self.lock:
            for action in message.bucket_action:
                self.events.append(Event(now, envoy, "answer", action.bucket_id.bucket.get("user", ""),
                                         _describe(action)))

    def close(self) -> None:
        for server in self.servers:
            asyncio.run_coroutine_threadsafe(server.stop(0), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@dataclass
class Envoy:
    number: int
    port: int
    process: Any

    def get(self, who: str) -> int:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/q", headers={"x-user": who})
        try:
            with urllib.request.urlopen(request, timeout=5) as reply:
                return int(reply.status)
        except urllib.error.HTTPError as reply:
            return int(reply.code)
        except OSError:
            return 0  # this Envoy is gone


@dataclass
class Rig:
    """The processes of one run; ``admitted[(envoy, user)]``: when each of its requests got a 200 (s since
    the start)."""

    work: Path
    redis: RedisServer
    started: float = field(default_factory=time.monotonic)
    slidegate_port: int = 0
    slidegate: Any = None
    recorder: Recorder | None = None
    envoys: list[Envoy] = field(default_factory=list)
    web: Any = None
    logs: list[Any] = field(default_factory=list)
    admitted: dict[tuple[int, str], list[float]] = field(default_factory=dict)
    denied: dict[tuple[int, str], int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def now(self) -> float:
        return time.monotonic() - self.started

    def start_slidegate(self) -> None:
        log = tempfile.TemporaryFile()  # noqa: SIM115 - closed by close()
        self.logs.append(log)
        self.slidegate = stack.start_slidegate(self.work, self.slidegate_port, redis_url=self.redis.url,
                                               key_prefix="rig:", log_file=log)

    def stop_slidegate(self) -> None:
        stack.stop(self.slidegate)

    def envoy(self, *, instance: str = "") -> Envoy:
        """Another Envoy, through a recording proxy of its own; ``instance``: its x-rlqs-instance name."""
        assert self.recorder is not None
        number = len(self.envoys)
        port, admin = stack.free_port(), stack.free_port()
        overrides: dict[str, Any] = {"domain": "rig"}
        server: dict[str, Any] = {"envoy_grpc": {"cluster_name": "rlqs"}}
        if instance:
            server["initial_metadata"] = [{"key": "x-rlqs-instance", "value": instance}]
        overrides["rlqs_server"] = server
        config = stack.local_rlqs_envoy_config(listener_port=port, admin_port=admin,
                                               rlqs_port=self.recorder.proxy(number),
                                               upstream_port=self.web.server_address[1], filter_overrides=overrides)
        log = tempfile.TemporaryFile()  # noqa: SIM115 - closed by close()
        self.logs.append(log)
        envoy = Envoy(number, port, stack.start_envoy(config, admin, log_file=log))
        self.envoys.append(envoy)
        return envoy

    def send(self, envoy: Envoy, who: str, rate: float, start: float, stop: float) -> threading.Thread:
        """A client sending ``rate`` requests a second as ``who`` through ``envoy`` from ``start`` to ``stop``
        (s since the rig started), evenly spaced."""
        key = (envoy.number, who)
        self.admitted.setdefault(key, [])
        self.denied.setdefault(key, 0)

        def run() -> None:
            n = 0
            while True:
                due = start + n / rate
                if due >= stop:
                    return
                time.sleep(max(0.0, due - self.now()))
                status = envoy.get(who)
                at = self.now()
                if status == 200:
                    self.admitted[key].append(at)
                elif status == 429:
                    self.denied[key] += 1
                elif status != 0:
                    self.errors.append(f"{at:.1f}s envoy {envoy.number}: HTTP {status}")
                n += 1

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        for envoy in self.envoys:
            stack.stop(envoy.process)
        if self.slidegate is not None:
            stack.stop(self.slidegate)
        if self.recorder is not None:
            self.recorder.close()
        if self.web is not None:
            self.web.shutdown()
        for log in self.logs:
            log.close()


@contextlib.contextmanager
def rig(config: str, script: Script | None = None) -> Iterator[Rig]:
    """A private Redis, `slidegate serve` with ``config`` (domain "rig") and the recorder (or, with ``script``,
    a scripted server and neither Redis nor slidegate); add Envoys with ``Rig.envoy``."""
    with tempfile.TemporaryDirectory(prefix="slidegate-rig-") as work:
        (Path(work) / "config.yaml").write_text(config)
        redis = RedisServer()
        run = Rig(Path(work), redis)
        try:
            run.web = upstream.start()
            if script is None:
                redis.start()
                run.slidegate_port = stack.free_port()
                run.start_slidegate()
            run.recorder = Recorder(run.slidegate_port, run.started, script)
            yield run
        finally:
            run.close()
            redis.cleanup()


def user() -> str:
    return f"u{uuid.uuid4().hex[:8]}"
