"""Run slidegate: load config, connect the backend, serve gRPC and HTTP until SIGTERM/SIGINT, then drain.

While serving, the config directory is watched and reloaded (slidegate.reload), or the xDS server followed
(slidegate.xds, CONFIG_TYPE=GRPC_XDS_SOTW), and the storage is pinged for the health state (slidegate.health).
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
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from slidegate.allocator import return_large_blocks
from slidegate.application import build, make_backend, make_statsd_sink
from slidegate.config import LoadOptions
from slidegate.health import Health
from slidegate.heap import Heap
from slidegate.httpapi import make_app, start_app
from slidegate.metrics import Metrics
from slidegate.quotas.service import SERVICE as QUOTA_SERVICE
from slidegate.quotas.service import QuotaService
from slidegate.reload import ConfigHolder, ConfigWatcher
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
    heap = Heap()
    tracing = start_tracing(settings)
    app = build(settings, heap=heap,
                backend=make_backend(settings, tracing.backend if tracing is not None else None))
    sink = make_statsd_sink(settings, app.metrics.store, os.environ)
    directory, holder, backend = settings.config_path, app.holder, app.backend
    if not settings.uses_xds and not holder.current.domains:
        log.warning("no domain in %s: every request will be answered OK with no limit", directory)
    unused = settings.unused_pipelining()
    if unused:
        # envoyproxy/ratelimit's configs carry them; ignoring them without a word would leave an operator tuning
        # a knob that does nothing
        log.warning("%s: accepted and not used: slidegate sends the calls that arrive while others are at Redis "
                    "together in the next round trip, with no timer or count to tune (docs/configuration.md)",
                    ", ".join(unused))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    source = XdsConfigSource(settings, app.load_options, holder, app.metrics) if settings.uses_xds else None
    source_task = asyncio.create_task(source.run(stop)) if source is not None else None
    if source is not None and not settings.force_start_without_initial_config:
        # as envoyproxy/ratelimit: no listener until there is a config to answer with
        log.info("waiting for the first config from the xDS server %s before listening",
                 settings.xds.server_url)
        first = asyncio.create_task(source.first.wait())
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait((first, stopping), return_when=asyncio.FIRST_COMPLETED)
        first.cancel()
        stopping.cancel()
        if stop.is_set() and source_task is not None:
            await _cancel(source_task)
            await backend.close()
            await app.quotas.close()
            log.info("stopped before any config came")
            return
    credentials = None
    if settings.grpc_server_use_tls:
        credentials = server_credentials(settings.grpc_server_tls_cert, settings.grpc_server_tls_key,
                                         settings.grpc_client_tls_cacert)
    try:
        server, health_servicer, port = await start_server(
            app.service, settings.grpc_host, settings.grpc_port, credentials, reuse_port=reuse_port,
            max_message_size=settings.grpc_max_recv_msg_size, client_san=settings.grpc_client_tls_san,
            uds=settings.grpc_uds,
            connection_age=(settings.grpc_max_connection_age, settings.grpc_max_connection_age_grace),
            handler=tracing.handler(app.service) if tracing is not None else None, quotas=app.quotas)
    except BaseException:
        if source_task is not None:  # a port taken: the stream must not outlive the start
            await _cancel(source_task)
        raise
    health = Health(health_servicer, needs_storage=app.needs_storage, config_loaded=(
        (lambda: bool(holder.current.domains)) if settings.healthy_with_at_least_one_config_loaded else (lambda: True)))
    await health.publish()
    runners = []
    # the sink stops after the drain, so that it sends what the last calls counted
    sink_stop = asyncio.Event()
    sink_task = asyncio.create_task(sink.run(sink_stop)) if sink is not None else None
    try:
        routes = (("json",) if settings.json_endpoint_enabled else ()) + ("healthcheck", "rlconfig") + (
            ("metrics",) if settings.serves_prometheus else ())
        runner, http_port = await start_app(make_app(app.service, lambda: holder.current, health, routes),
                                            settings.http_host, settings.http_port, reuse_port=reuse_port)
        runners.append(runner)
        # /stats: the counters by their envoyproxy/ratelimit names, as its debug port prints them
        debug_routes = ("rlconfig", "metrics", "stats") if settings.serves_prometheus else ("rlconfig", "stats")
        runner, debug_port = await start_app(make_app(app.service, lambda: holder.current, health, debug_routes),
                                             settings.debug_host, settings.debug_port, reuse_port=reuse_port)
        runners.append(runner)
        metrics_at = ""
        if settings.prometheus_listener is not None:
            # PROMETHEUS_ADDR (Envoy Gateway scrapes :19001): the metrics alone, at PROMETHEUS_PATH; Go's ":port"
            # (host "") is every address, which aiohttp binds for no host
            host, wanted = settings.prometheus_listener
            runner, metrics_port = await start_app(
                make_app(app.service, lambda: holder.current, health, ("metrics",),
                         metrics_path=settings.prometheus_path), host or None, wanted, reuse_port=reuse_port)
            runners.append(runner)
            metrics_at = f", metrics on {host}:{metrics_port}{settings.prometheus_path}"
        tasks = [asyncio.create_task(health.watch_storage(backend, stop))]
        if source_task is not None:
            tasks.append(source_task)
            # the config is the xDS server's: nothing to reload, and SIGHUP must not end the process either
            loop.add_signal_handler(signal.SIGHUP, lambda: log.info("SIGHUP: the config comes over xDS, nothing "
                                                                    "to reload"))
        else:
            tasks.append(asyncio.create_task(_watch_files(settings, app.load_options, holder, app.metrics, stop)))
        heap.started()  # before the health check says serving
        config = holder.current
        origin = (f"the xDS server {settings.xds.server_url}" + (
            f" (version {config.version})" if config.loaded else " (none yet: calls are refused until it comes)")
                  if source is not None else str(directory))
        log.info(
            "listening for gRPC on %s%s, HTTP on %s:%d, debug on %s:%d%s; domains loaded: %d, limits: %d, from %s",
            f"unix:{settings.grpc_uds}" if settings.grpc_uds else f"{settings.grpc_host}:{port}",
            " (TLS)" if credentials else "", settings.http_host, http_port,
            settings.debug_host, debug_port, metrics_at, len(config.domains), config.limit_count(), origin,
        )
        log.info("storage: %s", backend.describe())
        log.info("quotas: Envoy's Rate Limit Quota Service on the same port, the limits of the same config")
        if sink is not None:
            log.info("stats: %s, counters every %g s", sink.describe(), settings.stats_flush_interval)
        if tracing is not None:
            log.info("tracing: %s", tracing.describe())
        if ready is not None:
            ready.set()
        await stop.wait()
        log.info("shutting down: not serving; draining in-flight calls (up to %.0f s)", settings.drain_timeout)
        await health.drain()
        await server.stop(settings.drain_timeout)
        if sink_task is not None:
            sink_stop.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(sink_task), 3)
        for task in tasks:
            await _cancel(task)
    finally:
        stop.set()
        if source_task is not None:
            await _cancel(source_task)
        if sink_task is not None and not sink_task.done():
            sink_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sink_task
        await server.stop(0)
        for runner in runners:
            await runner.cleanup()
        await backend.close()
        await app.quotas.close()
        if tracing is not None:
            # the spans of the last calls go out; the SDK blocks while it sends them
            await asyncio.to_thread(tracing.shutdown)
    log.info("stopped")


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


async def _watch_files(settings: Settings, options: LoadOptions, holder: ConfigHolder, metrics: Metrics,
                       stop: asyncio.Event) -> None:
    """Reload the config files on each change, and at SIGHUP, until ``stop``."""
    root = None
    if settings.runtime_watch_root:
        root = Path(settings.config_dir) if settings.config_dir else Path(settings.runtime_root)
    watcher = ConfigWatcher(settings.config_path, options, holder, metrics, root, settings.config_settle_time)
    reloads: set[asyncio.Task[bool]] = set()

    def reload_now() -> None:  # SIGHUP: reload the config now, as many daemons do
        task = asyncio.create_task(watcher.reload(force=True))
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload_now)
    await watcher.run(stop)


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def run(settings: Settings, *, reuse_port: bool = False) -> None:
    """Run ``serve`` on uvloop when it is installed, else on asyncio's default loop; memory that large requests
    took goes back to the system (slidegate.allocator)."""
    return_large_blocks()
    run_loop(serve(settings, reuse_port=reuse_port))
