"""Where the config in force comes from: the config directory (slidegate.reload's ConfigWatcher) or an xDS server
(slidegate.xds's XdsConfigSource). Each keeps its ConfigHolder current behind this one protocol, so that
`slidegate serve` (slidegate.server) drives either without asking which it is."""

from __future__ import annotations

import asyncio
from typing import Protocol


class ConfigSource(Protocol):
    """A source of the config in force, followed by ``run`` until stopped."""

    async def run(self, stop: asyncio.Event) -> None:
        """Keep the holder on the source's config until ``stop`` is set; errors are logged and the config in force
        kept, never raised."""

    async def first_config(self, stop: asyncio.Event) -> bool:
        """Return once there is a config to serve (``run`` running alongside brings it): True, or False when
        ``stop`` came first."""

    def reload_now(self) -> None:
        """SIGHUP: take the source's config again now, or log why there is nothing to take."""

    def describe(self) -> str:
        """Where the config in force comes from, for the start-up line."""
