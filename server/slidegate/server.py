"""Run the gRPC server: load config, connect the backend, serve until SIGTERM/SIGINT, then drain."""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from slidegate.algorithms import Algorithm
from slidegate.backends.base import Backend, BackendUnavailable
from slidegate.backends.memory import MemoryBackend
from slidegate.backends.redis import RedisBackend
from slidegate.config import LoadOptions, load_directory
from slidegate.limiter import Limiter, LimiterOptions
from slidegate.service import AnswerOptions, RateLimitService

log = logging.getLogger("slidegate")
HEALTH_SERVICES = ("", "ratelimit")


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """What ``slidegate serve`` needs. Times are in seconds."""

    config_dir: str
    backend: str = "redis"  # or "memory"
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_pool_size: int = 64
    host: str = "0.0.0.0"
    grpc_port: int = 8081
    redis_timeout: float = 0.25
    key_prefix: str = ""
    drain_seconds: float = 10.0
    default_algorithm: Algorithm = Algorithm.SLIDING_WINDOW_LOG
    merge_domain_config: bool = False
    shadow_mode: bool = False
    stop_when_over: bool = False
    response_dynamic_metadata: bool = False


def make_backend(options: ServeOptions) -> Backend:
    """The storage backend ``options`` ask for. Raises ValueError for a malformed Redis URL."""
    if options.backend == "memory":
        return MemoryBackend()
    return RedisBackend(options.redis_url, timeout=options.redis_timeout, pool_size=options.redis_pool_size)


async def start_server(
    service: RateLimitService, host: str, port: int
) -> tuple[grpc.aio.Server, HealthServicer, int]:
    """Start a gRPC server with the rate-limit and health services on ``host:port``; return it, its health
    servicer (statuses still unset) and the bound port. Raises OSError when the address cannot be bound."""
    # without SO_REUSEPORT a second server on a taken port fails instead of silently sharing it
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((service.handler(),))
    health_servicer = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    address = f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:  # grpcio raises RuntimeError, not OSError, for a port in use
        raise OSError(f"cannot listen on {address}: {exc}") from exc
    if bound == 0:
        raise OSError(f"cannot listen on {address}")
    await server.start()
    return server, health_servicer, bound


async def serve(options: ServeOptions, ready: asyncio.Event | None = None) -> None:
    """Serve until SIGTERM or SIGINT, then stop accepting calls and let in-flight ones finish (at most
    ``drain_seconds``). Raises ConfigError for an invalid config, ValueError for a malformed Redis URL and
    OSError when the port is taken."""
    load = LoadOptions(merge_domains=options.merge_domain_config, default_algorithm=options.default_algorithm)
    config = load_directory(options.config_dir, load)
    if not config.domains:
        log.warning("no domain in %s: every request will be answered OK with no limit", options.config_dir)
    backend = make_backend(options)
    limiter = Limiter(lambda: config, backend, LimiterOptions(
        key_prefix=options.key_prefix, default_algorithm=options.default_algorithm,
        stop_when_over=options.stop_when_over, shadow_mode=options.shadow_mode,
    ))
    service = RateLimitService(limiter, AnswerOptions(
        shadow_mode=options.shadow_mode, dynamic_metadata=options.response_dynamic_metadata))
    server, health_servicer, port = await start_server(service, options.host, options.grpc_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await backend.ping()
        log.info("storage: %s", backend.describe())
    except BackendUnavailable as exc:
        # Keep serving: every call answers UNAVAILABLE until Redis is back, and Envoy's failure mode decides.
        log.warning("storage not answering yet (%s); calls fail with UNAVAILABLE until it does", exc)
    for name in HEALTH_SERVICES:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info(
        "listening for gRPC on %s:%d; loaded %d domains, %d limits from %s",
        options.host, port, len(config.domains), config.limit_count(), options.config_dir,
    )
    if ready is not None:
        ready.set()
    await stop.wait()
    log.info("shutting down: draining in-flight calls (up to %.0f s)", options.drain_seconds)
    for name in HEALTH_SERVICES:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    await server.stop(options.drain_seconds)
    await backend.close()
    log.info("stopped")


def run(options: ServeOptions) -> None:
    """Run ``serve`` on uvloop when it is installed, else on asyncio's default loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(options))
    else:
        uvloop.run(serve(options))
