"""Hot reload: the config directory is watched, and a change that loads is swapped in whole.

A change that does not load (any error in any file, or a directory that cannot be read) keeps the config in
force, logs every error and counts a load error. Counters in storage are keyed by descriptors, not by config
versions, so a reload resets none. What is watched, not recursively: the config directory itself (Kubernetes
ConfigMap volumes update by swapping a ``..data`` symlink inside it) and, with RUNTIME_WATCH_ROOT, the parent
of RUNTIME_ROOT (or of the config directory), so a swapped symlink on the path (envoyproxy/ratelimit's
``RUNTIME_ROOT`` layout) is seen. Events elsewhere in those directories are ignored; when a watched directory is
replaced or removed, the watch starts again on what the paths name now. Changes that leave the files' bytes as
they were do not reload.

A file is read only once it has stopped changing: every config file's size, modification time and inode (and
the directory's list of them) the same over SETTLE seconds (CONFIG_SETTLE_TIME), and the same again after the
load, so that a file written in parts (an editor, ``cat > file``) never loads half written and a directory's
files load as one generation. A file written elsewhere and renamed into place (or Kubernetes' symlink swap) is
whole whenever it is read: the safe way to update, docs/configuration.md says.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import logging
import os
import sys
import threading
import time
from pathlib import Path

import watchfiles

from slidegate.config import Config, ConfigError, LoadOptions, load_directory
from slidegate.config.loader import config_files
from slidegate.metrics import Metrics

log = logging.getLogger(__name__)


# the GIL is handed between threads when one has waited this long for it (Python's default: 5 ms); while a
# reload's worker thread loads, every call the event loop answers waited up to that for it, again and again
LOADING_SWITCH_INTERVAL = 0.0001  # 0.5 ms left the ratio of bench/reload.py at 2.61x, 0.1 ms at 2.30x


class _Loading:
    """What a load in a worker thread changes for the whole process, until the last overlapping load (SIGHUP's
    and the watch's) ends. The GIL goes back to the event loop after LOADING_SWITCH_INTERVAL rather than 5 ms,
    and the garbage collector is off: a load makes ~100,000 short-lived YAML nodes, and the collections they
    set off walked them (and every object not frozen, slidegate.heap) in passes of several milliseconds holding
    the GIL. The nodes are freed by reference counting as the load ends; the cycles other threads make
    meanwhile (tens of milliseconds' worth) wait for the next collection after it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loads = 0
        self._interval = sys.getswitchinterval()
        self._collecting = True

    def __enter__(self) -> None:
        with self._lock:
            if self._loads == 0:
                self._interval, self._collecting = sys.getswitchinterval(), gc.isenabled()
                sys.setswitchinterval(min(self._interval, LOADING_SWITCH_INTERVAL))
                gc.disable()
            self._loads += 1

    def __exit__(self, *_: object) -> None:
        with self._lock:
            self._loads -= 1
            if self._loads == 0:
                sys.setswitchinterval(self._interval)
                if self._collecting:
                    gc.enable()


loading = _Loading()

# a load's thread works RUN s of its own CPU time, then sleeps REST s, the GIL left to the event loop meanwhile.
# Sharing the GIL throughout, the loop got about half of it while a load ran (and waited for it again at each
# turn): a call (a loop turn's Python work, measured in process) took 2-2.5 times as long on average during the
# 100-300 ms of a 1,000-descriptor load, 2.5-3 times at p99. Resting, the load takes 150-750 ms (longer the busier
# the machine) and calls meanwhile 1.5 times as long on average, 1.1-1.6 times at p99; resting 1 ms after 0.5 ms
# of work left them 2 times as long on average, 1 ms of work and 2 ms of rest 2.1 times
RUN = 0.0003
REST = 0.0015


class Pacer:
    """The loader's pause (slidegate.config.loader.Pause) for one load in a worker thread (a file's or xDS's)."""

    def __init__(self) -> None:
        self._since: float | None = None  # the thread's CPU time when it last rested (thread_time is per thread)

    def __call__(self) -> None:
        now = time.thread_time()
        if self._since is None:
            self._since = now
        elif now - self._since >= RUN:
            time.sleep(REST)
            self._since = time.thread_time()


class ConfigHolder:
    """The config in force; ``current`` is replaced whole, so a request reads one version throughout."""

    def __init__(self, config: Config) -> None:
        self.current = config


def _fingerprint(directory: Path) -> str:
    """A digest of every config file's name and bytes ("" when the directory cannot be read)."""
    digest = hashlib.sha256()
    try:
        for path in config_files(directory):
            digest.update(os.fsencode(path.name) + b"\0")
            with contextlib.suppress(OSError):
                digest.update(path.read_bytes() if path.is_file() else b"")
    except OSError:
        return ""
    return digest.hexdigest()


Snapshot = tuple[tuple[str, int, int, int], ...] | None


def _snapshot(directory: Path) -> Snapshot:
    """What a write to a config file changes: each one's name, size, modification time and inode, through
    links (-1s for one that cannot be read); None when the directory cannot be read."""
    out = []
    try:
        for path in config_files(directory):
            try:
                info = path.stat()
            except OSError:
                out.append((path.name, -1, -1, -1))
            else:
                out.append((path.name, info.st_size, info.st_mtime_ns, info.st_ino))
    except OSError:
        return None
    return tuple(out)


class ConfigWatcher:
    """Reloads ``directory`` into ``holder`` when something it depends on changes and has settled for
    ``settle`` seconds. ``root``: the directory whose parent is watched too (RUNTIME_ROOT, or ``directory``
    itself), or None not to watch a parent."""

    def __init__(self, directory: Path, options: LoadOptions, holder: ConfigHolder, metrics: Metrics,
                 root: Path | None = None, settle: float = 0.5) -> None:
        self._settle = settle
        self._named = directory  # as the settings name it, for the start-up line
        self._directory = directory.absolute()
        self._options = options
        self._holder = holder
        self._metrics = metrics
        self._root = root.absolute() if root is not None else None
        self._fingerprint = _fingerprint(self._directory)
        self._failed = False  # the files changed and did not load: the config in force is older than them
        self._reloads: set[asyncio.Task[bool]] = set()  # SIGHUP's, kept until done (the loop keeps weak references)

    async def first_config(self, stop: asyncio.Event) -> bool:
        """The directory was loaded before the watch began (slidegate.application): there is one already."""
        return True

    def reload_now(self) -> None:
        """SIGHUP: reload the config now, even if its files look unchanged, as many daemons do."""
        task = asyncio.create_task(self.reload(force=True))
        self._reloads.add(task)
        task.add_done_callback(self._reloads.discard)

    def describe(self) -> str:
        return str(self._named)

    def _targets(self) -> tuple[list[Path], set[Path]]:
        """(directories to watch, paths whose changes matter besides the config directory's entries)."""
        watched = [self._directory]
        matter = {self._directory}
        if self._root is not None:
            watched.append(self._root.parent)
            path = self._directory
            while True:  # every component from RUNTIME_ROOT down to the config directory
                matter.add(path)
                if path == self._root or path.parent == path:
                    break
                path = path.parent
        return [p for p in watched if p.is_dir()], matter

    async def settled(self, stop: asyncio.Event | None = None) -> None:
        """Return once the config files have not changed for ``settle`` seconds (or ``stop`` is set)."""
        before = await asyncio.to_thread(_snapshot, self._directory)
        while self._settle > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for((stop or asyncio.Event()).wait(), self._settle)
                return
            now = await asyncio.to_thread(_snapshot, self._directory)
            if now == before:
                return
            before = now

    async def reload(self, force: bool = False) -> bool:
        """Load the directory now (in a thread: a large config must not stall decisions) if its files
        changed (or ``force``); swap it in if it loads and its files did not change meanwhile (the watch sees
        that change and loads again once it settles). Returns whether a new config is in force."""
        before = await asyncio.to_thread(_snapshot, self._directory)
        fingerprint = await asyncio.to_thread(_fingerprint, self._directory)
        if fingerprint and fingerprint == self._fingerprint and not force:
            if self._failed:  # put back as they were: the last line logged must not stay the error
                self._failed = False
                log.info("config files are back to the config in force")
            return False
        try:
            with loading:
                config = await asyncio.to_thread(load_directory, self._directory, self._options, Pacer())
        except (ConfigError, OSError) as exc:
            self._metrics.config_load_error.inc()
            log.error("config reload failed, keeping the previous config:\n%s", exc)
            self._failed = True
            return False
        if await asyncio.to_thread(_snapshot, self._directory) != before:
            log.info("config files changed while being loaded: loading them again once they settle")
            return False
        self._failed = False
        self._fingerprint = fingerprint
        self._holder.current = config
        self._metrics.config_load_success.inc()
        log.info("config reloaded: %d domains, %d limits", len(config.domains), config.limit_count())
        if not config.domains:
            log.warning("no domain in %s: every request will be answered OK with no limit", self._directory)
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Watch until ``stop`` is set. Changes within 100 ms are taken together. The watch starts again
        whenever a watched directory is replaced or removed (checked at least every second)."""
        while not stop.is_set():
            watched, matter = self._targets()
            identity = [(p, p.stat().st_ino) for p in watched]

            def relevant(_: watchfiles.Change, name: str, matter: set[Path] = matter) -> bool:
                path = Path(name)
                return path in matter or path.parent == self._directory

            try:
                if not watched:
                    raise FileNotFoundError(f"{self._directory} does not exist")
                async for changes in watchfiles.awatch(*watched, watch_filter=relevant, stop_event=stop,
                                                       debounce=100, step=20, recursive=False,
                                                       yield_on_timeout=True, rust_timeout=1000,
                                                       ignore_permission_denied=True):
                    if changes:
                        await self.settled(stop)
                        await self.reload()
                    if any(not p.is_dir() or p.stat().st_ino != ino for p, ino in identity) or \
                            self._targets()[0] != watched:
                        await self.settled(stop)
                        await self.reload()  # what the paths name has changed: look again, and watch it
                        break
            except Exception as exc:  # whatever happened, the service keeps its config and goes on
                log.error("watching %s failed (%s); trying again in 1 s", self._directory, exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1)
