"""Run slidegate: load config, connect the backend, serve gRPC and HTTP until SIGTERM/SIGINT, then drain.

While serving, the config directory is watched and reloaded (slidegate.reload), or the xDS server followed
(slidegate.xds, CONFIG_TYPE=GRPC_XDS_SOTW), either driven as a slidegate.config_source.ConfigSource, and the
storage is pinged for the health state (slidegate.health).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import signal
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from aiohttp import web
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from slidegate.allocator import return_large_blocks
from slidegate.application import Application, build, make_backend, make_statsd_sink
from slidegate.config_source import ConfigSource
from slidegate.health import Health
from slidegate.heap import Heap
from slidegate.httpapi import make_app, start_app
from slidegate.limited_view import watching
from slidegate.page import routes as limited_routes
from slidegate.quotas.service import SERVICE as QUOTA_SERVICE
from slidegate.quotas.service import QuotaService
from slidegate.reload import ConfigWatcher
from slidegate.service import RateLimitService
from slidegate.settings import DEFAULT_MAX_RECV_MSG_SIZE, Settings
from slidegate.tls import ClientSanCheck, server_credentials
from slidegate.xds import XdsConfigSource

if TYPE_CHECKING:
    from slidegate.tracing import Tracing

run_loop: Callable[[Coroutine[Any, Any, None]], None]
try:
    import uvloop

    run_loop = uvloop.run
except ImportError:  # not installed on Windows (pyproject.toml)
    run_loop = asyncio.run

log = logging.getLogger("slidegate")
_RLS = "envoy.service.ratelimit.v3.RateLimitService"


async def start_server(
    service: RateLimitService, host: str, port: int, credentials: grpc.ServerCredentials | None = None,
    *, reuse_port: bool = False, max_message_size: int = DEFAULT_MAX_RECV_MSG_SIZE, client_san: str = "",
    uds: str = "", connection_age: tuple[float, float] = (0, 0),
    handler: grpc.GenericRpcHandler[Any, Any] | None = None, quotas: QuotaService | None = None,
) -> tuple[grpc.aio.Server, HealthServicer, int]:
    """Start a gRPC server with the rate-limit, health and reflection services on ``host:port``, or on the unix
    socket ``uds`` (TLS with ``credentials``; shared with other processes with ``reuse_port``; requests of at most
    ``max_message_size`` bytes; with ``client_san``, only for clients whose certificate carries it:
    slidegate.tls.ClientSanCheck; ``connection_age``: a connection's most age and its grace, in seconds, 0 for
    none; ``handler``: the rate-limit service's handler, when not its own: slidegate.tracing's; ``quotas``: the
    Rate Limit Quota Service, served beside it); return it, its
    health servicer (statuses still unset) and the bound port. Raises OSError when the address cannot be bound."""
    options: list[tuple[str, int]] = [
        # without SO_REUSEPORT a second server on a taken port fails instead of silently sharing it; workers
        # share theirs on purpose (slidegate.workers checks first that nobody else holds it)
        ("grpc.so_reuseport", int(reuse_port)),
        # gRPC refuses a larger message from its length prefix, before buffering it
        ("grpc.max_receive_message_length", max_message_size),
    ]
    age, grace = connection_age
    if age:
        # behind a load balancer that keeps connections, new replicas get clients only as old connections end
        options += [("grpc.max_connection_age_ms", round(age * 1000)),
                    ("grpc.max_connection_age_grace_ms", round(grace * 1000))]
    server = grpc.aio.server(interceptors=[ClientSanCheck(client_san)] if client_san else None, options=options)
    server.add_generic_rpc_handlers((handler or service.handler(),))
    names = [_RLS, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME]
    if quotas is not None:
        server.add_generic_rpc_handlers((quotas.handler(),))
        names.append(QUOTA_SERVICE)
    health_servicer = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(names, server)
    address = f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
    if uds:
        address = f"unix:{uds}"
    try:
        bound = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    except RuntimeError as exc:  # grpcio raises RuntimeError, not OSError, for a port in use
        raise OSError(f"cannot listen on {address}: {exc}") from exc
    if bound == 0:
        raise OSError(f"cannot listen on {address}")
    await server.start()
    return server, health_servicer, bound


async def serve(settings: Settings, ready: asyncio.Event | None = None, *, reuse_port: bool = False) -> None:
    """Serve until SIGTERM or SIGINT, then report not serving, stop taking calls and let in-flight ones
    finish (at most DRAIN_TIMEOUT); ``reuse_port``: share the ports with the other workers. Raises ConfigError
    for an invalid config, ValueError for a malformed Redis URL and OSError when a port is taken or a TLS file
    cannot be read."""
    await Server(settings, reuse_port=reuse_port).serve(ready)


class Server:
    """`slidegate serve`'s life in three steps, as uvicorn's: ``serve`` starts what serving needs in order,
    serves until ``stop`` is set (SIGTERM or SIGINT), and stops it all in the reverse order. Building it loads
    the config and makes the backend (the errors of ``serve``); ``grpc_port``, ``http_port`` and ``debug_port``
    are the bound ports once it is ready."""

    def __init__(self, settings: Settings, *, reuse_port: bool = False) -> None:
        self.settings, self.reuse_port = settings, reuse_port
        self.stop = asyncio.Event()
        self.grpc_port = self.http_port = self.debug_port = 0
        self._heap = Heap()
        self._tracing = start_tracing(settings)
        self._app = build(settings, heap=self._heap,
                          backend=make_backend(settings, self._tracing.backend if self._tracing is not None else None))
        self._sink = make_statsd_sink(settings, self._app.metrics.store, os.environ)
        self._source = config_source(settings, self._app)
        # who is limited: told of every decision, shown on the debug port (/limited, /limited/page)
        self._limited = watching(settings, self._app.service.decider)
        _warn_unused_pipelining(settings)
        # the sink stops after the drain, so that it sends what the last calls counted
        self._sink_stop = asyncio.Event()
        self._runners: list[web.AppRunner] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._metrics_at = ""

    async def serve(self, ready: asyncio.Event | None = None) -> None:
        """Start, set ``ready``, serve until ``stop``, drain and stop (see ``serve`` above)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop.set)
        source_task = asyncio.create_task(self._source.run(self.stop))
        if not await self._first_config(source_task):
            return
        server, health = await self._start_grpc(source_task)
        sink_task = asyncio.create_task(self._sink.run(self._sink_stop)) if self._sink is not None else None
        try:
            await self._start_http(health)
            self._start_watching(health, source_task)
            self._heap.started()  # before the health check says serving
            self._announce()
            if ready is not None:
                ready.set()
            await self.stop.wait()
            await self._drain(server, health, sink_task)
        finally:
            await self._shutdown(server, source_task, sink_task)
        log.info("stopped")

    async def _first_config(self, source_task: asyncio.Task[None]) -> bool:
        """Wait for the source's first config unless FORCE_START_WITHOUT_INITIAL_CONFIG; False (all stopped) when
        ``stop`` came first."""
        if self.settings.force_start_without_initial_config or await self._source.first_config(self.stop):
            return True
        await _cancel(source_task)
        await self._app.backend.close()
        await self._app.quotas.close()
        log.info("stopped before any config came")
        return False

    async def _start_grpc(self, source_task: asyncio.Task[None]) -> tuple[grpc.aio.Server, Health]:
        """Listen for gRPC, and publish the health state. Raises OSError (the source stopped)."""
        settings, app = self.settings, self._app
        try:
            credentials = None
            if settings.grpc_server_use_tls:
                credentials = server_credentials(settings.grpc_server_tls_cert, settings.grpc_server_tls_key,
                                                 settings.grpc_client_tls_cacert)
            server, health_servicer, self.grpc_port = await start_server(
                app.service, settings.grpc_host, settings.grpc_port, credentials, reuse_port=self.reuse_port,
                max_message_size=settings.grpc_max_recv_msg_size, client_san=settings.grpc_client_tls_san,
                uds=settings.grpc_uds,
                connection_age=(settings.grpc_max_connection_age, settings.grpc_max_connection_age_grace),
                handler=self._tracing.handler(app.service) if self._tracing is not None else None,
                quotas=app.quotas)
        except BaseException:  # a port taken, a TLS file unreadable: the source must not outlive the start
            await _cancel(source_task)
            raise
        holder = app.holder
        health = Health(health_servicer, needs_storage=app.needs_storage, config_loaded=(
            (lambda: bool(holder.current.domains)) if settings.healthy_with_at_least_one_config_loaded
            else (lambda: True)))
        await health.publish()
        return server, health

    async def _start_http(self, health: Health) -> None:
        """Listen on the HTTP port, the debug port and, with PROMETHEUS_ADDR, the metrics port."""
        settings = self.settings
        # /explain beside /json (it counts nothing, but tells any caller's usage, so it is switched with /json)
        routes = (("json", "explain") if settings.json_endpoint_enabled else ()) + ("healthcheck", "rlconfig") + (
            ("metrics",) if settings.serves_prometheus else ())
        self.http_port = await self._listen(health, routes, settings.http_host, settings.http_port)
        # /stats: the counters by their envoyproxy/ratelimit names, as its debug port prints them
        debug_routes = ("rlconfig", "explain") + (("metrics", "stats") if settings.serves_prometheus else ("stats",))
        self.debug_port = await self._listen(health, debug_routes, settings.debug_host, settings.debug_port,
                                             limited_routes(self._limited))
        if settings.prometheus_listener is not None:
            # PROMETHEUS_ADDR (Envoy Gateway scrapes :19001): the metrics alone, at PROMETHEUS_PATH; Go's ":port"
            # (host "") is every address, which aiohttp binds for no host
            host, wanted = settings.prometheus_listener
            metrics_port = await self._listen(health, ("metrics",), host or None, wanted,
                                              metrics_path=settings.prometheus_path)
            self._metrics_at = f", metrics on {host}:{metrics_port}{settings.prometheus_path}"

    async def _listen(self, health: Health, routes: tuple[str, ...], host: str | None, port: int,
                      more: list[web.RouteDef] | None = None, **options: str) -> int:
        holder = self._app.holder
        app = make_app(self._app.service, lambda: holder.current, health, routes, **options)
        app.add_routes(more or [])
        runner, bound = await start_app(app, host, port, reuse_port=self.reuse_port)
        self._runners.append(runner)
        return bound

    def _start_watching(self, health: Health, source_task: asyncio.Task[None]) -> None:
        """Ping the storage for the health state; the source, already following its config, takes SIGHUP."""
        self._tasks += [asyncio.create_task(health.watch_storage(self._app.backend, self.stop)), source_task,
                        asyncio.create_task(self._limited.run(self.stop))]
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._source.reload_now)

    def _announce(self) -> None:
        """Log where it listens, what it serves and where its config, storage, stats and spans are."""
        settings, config = self.settings, self._app.holder.current
        log.info(
            "listening for gRPC on %s%s, HTTP on %s:%d, debug on %s:%d%s; domains loaded: %d, limits: %d, from %s",
            f"unix:{settings.grpc_uds}" if settings.grpc_uds else f"{settings.grpc_host}:{self.grpc_port}",
            " (TLS)" if settings.grpc_server_use_tls else "", settings.http_host, self.http_port,
            settings.debug_host, self.debug_port, self._metrics_at, len(config.domains), config.limit_count(),
            self._source.describe(),
        )
        log.info("storage: %s", self._app.backend.describe())
        log.info("quotas: Envoy's Rate Limit Quota Service on the same port, the limits of the same config")
        if self._sink is not None:
            log.info("stats: %s, counters every %g s", self._sink.describe(), settings.stats_flush_interval)
        if self._tracing is not None:
            log.info("tracing: %s", self._tracing.describe())

    async def _drain(self, server: grpc.aio.Server, health: Health, sink_task: asyncio.Task[None] | None) -> None:
        """Say not serving, let the calls in flight finish, send the last stats and stop the watches."""
        log.info("shutting down: not serving; draining in-flight calls (up to %.0f s)", self.settings.drain_timeout)
        await health.drain()
        await server.stop(self.settings.drain_timeout)
        if sink_task is not None:
            self._sink_stop.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(sink_task), 3)
        for task in self._tasks:
            await _cancel(task)

    async def _shutdown(self, server: grpc.aio.Server, source_task: asyncio.Task[None],
                        sink_task: asyncio.Task[None] | None) -> None:
        """Stop everything still running, in the reverse order of the start, drained or not."""
        self.stop.set()
        await _cancel(source_task)
        if sink_task is not None and not sink_task.done():
            sink_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sink_task
        await server.stop(0)
        for runner in self._runners:
            await runner.cleanup()
        await self._app.backend.close()
        await self._app.quotas.close()
        if self._tracing is not None:
            # the spans of the last calls go out; the SDK blocks while it sends them
            await asyncio.to_thread(self._tracing.shutdown)


def config_source(settings: Settings, app: Application) -> ConfigSource:
    """The source CONFIG_TYPE names, keeping ``app``'s holder current: the xDS server, or the config directory
    (whose parent is watched too with RUNTIME_WATCH_ROOT: slidegate.reload)."""
    if settings.uses_xds:
        return XdsConfigSource(settings, app.load_options, app.holder, app.metrics)
    if not app.holder.current.domains:
        log.warning("no domain in %s: every request will be answered OK with no limit", settings.config_path)
    root = None
    if settings.runtime_watch_root:
        root = Path(settings.config_dir) if settings.config_dir else Path(settings.runtime_root)
    return ConfigWatcher(settings.config_path, app.load_options, app.holder, app.metrics, root,
                         settings.config_settle_time)


def _warn_unused_pipelining(settings: Settings) -> None:
    unused = settings.unused_pipelining()
    if unused:
        # envoyproxy/ratelimit's configs carry them; ignoring them without a word would leave an operator tuning
        # a knob that does nothing
        log.warning("%s: accepted and not used: slidegate sends the calls that arrive while others are at Redis "
                    "together in the next round trip, with no timer or count to tune (docs/configuration.md)",
                    ", ".join(unused))


def start_tracing(settings: Settings) -> Tracing | None:
    """The tracing TRACING_ENABLED asks for, None when off. slidegate.tracing is loaded only then: it imports
    the OpenTelemetry SDK (the optional extra ``tracing``), which a process without tracing does without.
    Raises ImportError without the extra (`slidegate serve` checks it first, see ``tracing_missing``)."""
    if not settings.tracing.enabled:
        return None
    tracing: Tracing = importlib.import_module("slidegate.tracing").Tracing(settings)
    return tracing


def tracing_missing(settings: Settings) -> str | None:
    """Why tracing cannot start (the extra is not installed), None when it can or is off."""
    if not settings.tracing.enabled:
        return None
    try:
        importlib.import_module("slidegate.tracing")
    except ImportError as exc:
        return (f"TRACING_ENABLED=true needs the OpenTelemetry SDK and its OTLP exporters, which are not installed "
                f"({exc}): install slidegate's tracing extra (pip install -e '.[tracing]' in a checkout)")
    return None


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def run(settings: Settings, *, reuse_port: bool = False) -> None:
    """Run ``serve`` on uvloop when it is installed, else on asyncio's default loop; memory that large requests
    took goes back to the system (slidegate.allocator)."""
    return_large_blocks()
    run_loop(serve(settings, reuse_port=reuse_port))
