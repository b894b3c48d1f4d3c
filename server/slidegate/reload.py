"""Hot reload: the config directory is watched, and a change that loads is swapped in whole.

A change that does not load (any error in any file) keeps the config in force, logs every error and counts a
load error. Counters in storage are keyed by descriptors, not by config versions, so a reload resets none.
Kubernetes ConfigMap volumes update by swapping a ``..data`` symlink inside the directory; with
RUNTIME_WATCH_ROOT the directory's parent is watched too, so a swapped symlink on the path (envoyproxy/ratelimit's
``RUNTIME_ROOT`` layout) is seen as well.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

import watchfiles

from slidegate.config import Config, ConfigError, LoadOptions, load_directory
from slidegate.metrics import Metrics

log = logging.getLogger(__name__)


class ConfigHolder:
    """The config in force; ``current`` is replaced whole, so a request reads one version throughout."""

    def __init__(self, config: Config) -> None:
        self.current = config


class ConfigWatcher:
    """Reloads ``directory`` into ``holder`` whenever something under the watched paths changes."""

    def __init__(self, directory: Path, options: LoadOptions, holder: ConfigHolder, metrics: Metrics,
                 watch_parent: bool = True) -> None:
        self._directory = directory
        self._options = options
        self._holder = holder
        self._metrics = metrics
        self._paths = [directory.parent if watch_parent else directory]

    async def reload(self) -> bool:
        """Load the directory now (in a thread: a large config must not stall decisions); swap it in if it
        loads. Returns whether it did."""
        try:
            config = await asyncio.to_thread(load_directory, self._directory, self._options)
        except ConfigError as exc:
            self._metrics.config_load_error.inc()
            log.error("config reload failed, keeping the previous config:\n%s", exc)
            return False
        self._holder.current = config
        self._metrics.config_load_success.inc()
        log.info("config reloaded: %d domains, %d limits", len(config.domains), config.limit_count())
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Watch until ``stop`` is set. Changes within 100 ms are taken together. The watch is started again
        (after a second) if it fails, e.g. while the directory is missing."""
        while not stop.is_set():
            try:
                async for _ in watchfiles.awatch(*self._paths, stop_event=stop, debounce=100, step=20,
                                                 recursive=True, ignore_permission_denied=True):
                    await self.reload()
            except Exception as exc:  # whatever happened, the service keeps its config and goes on
                log.error("watching %s failed (%s); trying again in 1 s", self._paths[0], exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1)
