"""Run the gRPC server: load config, connect the backend, serve until SIGTERM/SIGINT, then drain."""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from slidegate._proto.envoy.service.ratelimit.v3 import rls_pb2_grpc
from slidegate.backends.base import Backend, BackendUnavailable
from slidegate.backends.redis import RedisBackend
from slidegate.config import load_directory
from slidegate.limiter import Limiter
from slidegate.service import RateLimitService

log = logging.getLogger("slidegate")
HEALTH_SERVICES = ("", "ratelimit")


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """What ``slidegate serve`` needs. Times are in seconds."""

    config_dir: str
    redis_url: str = "redis://127.0.0.1:6379/0"
    host: str = "0.0.0.0"
    grpc_port: int = 8081
    redis_timeout: float = 0.25
    key_prefix: str = ""
    drain_seconds: float = 10.0


async def start_server(limiter: Limiter, host: str, port: int) -> tuple[grpc.aio.Server, HealthServicer, int]:
    """Start a gRPC server with the rate-limit and health services on ``host:port``; return it, its health
    servicer (statuses still unset) and the bound port. Raises OSError when the address cannot be bound."""
    server = grpc.aio.server()
    rls_pb2_grpc.add_RateLimitServiceServicer_to_server(RateLimitService(limiter), server)
    health_servicer = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    address = f"{host}:{port}"
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
    ``drain_seconds``). Raises ConfigError for an invalid config and OSError when the port is taken."""
    config = load_directory(options.config_dir)
    backend: Backend = RedisBackend(options.redis_url, timeout=options.redis_timeout)
    limiter = Limiter(lambda: config, backend, key_prefix=options.key_prefix)
    server, health_servicer, port = await start_server(limiter, options.host, options.grpc_port)
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
