"""Whether the service is serving, for the gRPC health service (``""``, ``ratelimit`` and the
RateLimitService's full name) and ``GET /healthcheck``: only while a config is loaded (with
HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED, one with a domain), the storage answers (or a failure mode answers
without it), and no SIGTERM has come."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer

from slidegate.backends.base import Backend

log = logging.getLogger(__name__)
HEALTH_SERVICES = ("", "ratelimit", "envoy.service.ratelimit.v3.RateLimitService")
LINE_EVERY = 10.0  # seconds: the log tells the storage's state at most this often


class Health:
    """The serving state, published to a gRPC HealthServicer."""

    def __init__(self, servicer: HealthServicer, needs_storage: Callable[[], bool] = lambda: True,
                 config_loaded: Callable[[], bool] = lambda: True) -> None:
        self._servicer = servicer
        self._config_loaded = config_loaded
        # False while a failure mode (the deployment's or a domain's) answers without the storage: a replica
        # taken out of its load balancer could not give that answer
        self._needs_storage = needs_storage
        self.storage_ok = False
        self.draining = False
        self._published: bool | None = None
        # the log tells the storage's state as it changes, one line every LINE_EVERY seconds at most (a Redis that
        # flaps changes it every few seconds), and always ends on the state as it is
        self._told: bool | None = None
        self._told_at: float | None = None
        self._changes = 0  # since the last line

    @property
    def serving(self) -> bool:
        return (self.storage_ok or not self._needs_storage()) and self._config_loaded() and not self.draining

    async def publish(self) -> None:
        self._published = self.serving
        status = health_pb2.HealthCheckResponse.SERVING if self.serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in HEALTH_SERVICES:
            await self._servicer.set(name, status)

    async def drain(self) -> None:
        """From now on, not serving (the process is stopping)."""
        self.draining = True
        await self.publish()

    def _tell(self, ok: bool, reason: str) -> None:
        if ok == self._told or (ok and self._told is None):  # nothing new (a storage answering at start: nothing)
            return
        now = time.monotonic()
        if self._told_at is not None and now - self._told_at < LINE_EVERY:
            return
        more = f" ({self._changes - 1} more changes in the last {now - self._told_at:.0f} s)" \
            if self._changes > 1 and self._told_at is not None else ""
        if ok:
            log.warning("health: the storage answers again%s%s", "; serving" if self._needs_storage() else "", more)
        else:
            log.warning("health: the storage does not answer (%s)%s", reason, more)
        self._told, self._told_at, self._changes = ok, now, 0

    async def watch_storage(self, backend: Backend, stop: asyncio.Event, interval: float = 1.0) -> None:
        """Ping the storage every ``interval`` seconds until ``stop``; publish each change (of the storage, or
        of the failure modes a config reload brought)."""
        first = True
        while not stop.is_set():
            reason = ""
            try:
                await backend.ping()
                ok = True
            except Exception as exc:  # BackendUnavailable, or anything unexpected: not serving either way
                ok, reason = False, str(exc)
            if ok != self.storage_ok and not first:
                self._changes += 1
            first = False
            self.storage_ok = ok
            self._tell(ok, reason)
            if self.serving != self._published:
                await self.publish()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
