"""Whether the service is serving, for the gRPC health service (``""``, ``ratelimit`` and the
RateLimitService's full name) and ``GET /healthcheck``: only while a config is loaded, the storage answers
(or a failure mode answers without it), and no SIGTERM has come."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer

from slidegate.backends.base import Backend
from slidegate.logs import Repeated

log = logging.getLogger(__name__)
HEALTH_SERVICES = ("", "ratelimit", "envoy.service.ratelimit.v3.RateLimitService")


class Health:
    """The serving state, published to a gRPC HealthServicer."""

    def __init__(self, servicer: HealthServicer, needs_storage: Callable[[], bool] = lambda: True) -> None:
        self._servicer = servicer
        # False while a failure mode (the deployment's or a domain's) answers without the storage: a replica
        # taken out of its load balancer could not give that answer
        self._needs_storage = needs_storage
        self.storage_ok = False
        self.draining = False
        self._published: bool | None = None
        # a Redis that flaps changes the state every few seconds: one line of each every 10 s, with a count
        self._lost = Repeated(log, "health: the storage does not answer (%s)")
        self._back = Repeated(log, "health: the storage answers again; %s")

    @property
    def serving(self) -> bool:
        return (self.storage_ok or not self._needs_storage()) and not self.draining

    async def publish(self) -> None:
        self._published = self.serving
        status = health_pb2.HealthCheckResponse.SERVING if self.serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in HEALTH_SERVICES:
            await self._servicer.set(name, status)

    async def drain(self) -> None:
        """From now on, not serving (the process is stopping)."""
        self.draining = True
        await self.publish()

    async def watch_storage(self, backend: Backend, stop: asyncio.Event, interval: float = 1.0) -> None:
        """Ping the storage every ``interval`` seconds until ``stop``; publish each change (of the storage, or
        of the failure modes a config reload brought)."""
        first = True
        while not stop.is_set():
            try:
                await backend.ping()
                ok = True
            except Exception as exc:  # BackendUnavailable, or anything unexpected: not serving either way
                ok = False
                if self.storage_ok or first:
                    self._lost(str(exc))
            if ok and not self.storage_ok and not first:
                self._back("serving")
            first = False
            self.storage_ok = ok
            if self.serving != self._published:
                await self.publish()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
