"""Several worker processes on the same ports (WORKERS): one Python process is one event loop, so more cores
need more processes.

The parent checks that the ports are free (SO_REUSEPORT would otherwise let a stranger's server share them),
then starts WORKERS processes that each run the whole service with SO_REUSEPORT, so the kernel spreads new
connections between them (Envoy keeps its gRPC connections, so each Envoy connection stays with one worker).
Every worker keeps its own Redis connections, over-limit cache and remembered requests; the limits
themselves live in Redis and stay exact. The parent passes SIGTERM, SIGINT and SIGHUP on to the workers and
exits when they have all stopped; when one stops on its own, it stops the others and exits with that
worker's code, so that the supervisor (Kubernetes, systemd) restarts the whole. Workers whose parent was
killed outright stop by themselves within a second.

Metrics are summed over the workers with prometheus_client's multiprocess mode (a directory made in TMPDIR,
named in PROMETHEUS_MULTIPROC_DIR); to statsd each worker sends its own counts, which statsd sums; with
FAILURE_MODE=local each worker decides alone, so each takes its share:
LOCAL_LIMIT_REPLICAS is multiplied by WORKERS.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import FrameType

from slidegate.config import ConfigError
from slidegate.logs import configure_logging
from slidegate.server import run
from slidegate.settings import Settings

log = logging.getLogger("slidegate")


def _addresses(settings: Settings) -> tuple[tuple[str, str, int], ...]:
    addresses: tuple[tuple[str, str, int], ...] = (
        ("gRPC", settings.grpc_host, settings.grpc_port), ("HTTP", settings.http_host, settings.http_port),
        ("debug HTTP", settings.debug_host, settings.debug_port))
    if settings.prometheus_listener is not None:
        host, port = settings.prometheus_listener
        addresses += (("metrics", host or "0.0.0.0", port),)  # Go's ":port": every address
    return addresses


def check_ports_free(settings: Settings) -> None:
    """Raise OSError naming the first of the gRPC, HTTP and debug addresses that another program holds."""
    for name, host, port in _addresses(settings):
        # every address the name stands for (localhost: ::1 and 127.0.0.1), as the servers bind each
        for family, kind, proto, _, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: TIME_WAIT is fine
                try:
                    probe.bind(address)
                except OSError as exc:
                    if exc.errno == errno.EADDRNOTAVAIL:
                        continue  # (::1 where IPv6 is off) the servers skip such an address too
                    raise OSError(f"cannot listen for {name} on {host}:{port}: {exc.strerror}") from exc


def writable_directory() -> Path:
    """TMPDIR (default /tmp): the only place `serve` writes to, and only with WORKERS above 1 (its port locks and
    the workers' metrics files). Not tempfile.gettempdir(), which falls back to another directory, even the
    working one, when TMPDIR is not writable: locks that two starts keep in different places lock nothing, and a
    read-only root filesystem is better told than worked around."""
    return Path(os.environ.get("TMPDIR") or "/tmp")


def _unwritable(directory: Path, exc: OSError) -> OSError:
    return OSError(f"--workers / WORKERS above 1 needs a writable TMPDIR, and {directory} is not ({exc.strerror}): "
                   "set TMPDIR to a writable directory, or mount one at /tmp (on Kubernetes, an emptyDir); with "
                   "WORKERS=1 nothing is written")


def _lock_file(directory: Path, port: int) -> Path:
    # by port alone: two spellings of one address (0.0.0.0 and 127.0.0.1, localhost) must meet here
    return directory / f"slidegate-port-{port}.lock"


def remove_port_locks(ports: Iterable[int]) -> None:
    """Remove the lock files (lock_ports) of ``ports`` that no slidegate holds, for tools that start and stop
    `serve --workers` (a running one keeps them: removing a held file would let a second start lock a new one)."""
    directory = writable_directory()
    for port in ports:
        path = _lock_file(directory, port)
        with contextlib.suppress(OSError), path.open("r+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino:  # not since replaced by another's file
                path.unlink()


def lock_ports(settings: Settings) -> list[int]:
    """Lock files (in TMPDIR, one per port) held for the parent's life, so that a second `serve --workers` on
    the same ports is refused even when both start at once: the port check alone would pass for both, since
    workers bind a moment later and share the ports with each other. Returns the open file descriptors; raises
    OSError naming the address another slidegate holds, or the directory that cannot be written."""
    held: list[int] = []
    directory = writable_directory()
    for name, host, port in _addresses(settings):
        path = _lock_file(directory, port)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            for other in held:
                os.close(other)
            raise _unwritable(directory, exc) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            for other in held:
                os.close(other)
            raise OSError(f"cannot listen for {name} on {host}:{port}: another slidegate with --workers "
                          "holds it") from None
        held.append(fd)
    return held


def run_workers(settings: Settings) -> int:
    """Serve with ``settings.workers`` processes (see the module docstring) until they stop; return the exit
    code: 0 after SIGTERM/SIGINT, else the code of the worker that stopped first. Raises OSError when a port
    is taken."""
    locks = lock_ports(settings)
    try:
        check_ports_free(settings)
        return _supervise(settings)
    finally:
        for fd in locks:
            os.close(fd)


def _supervise(settings: Settings) -> int:
    processes: list[multiprocessing.process.BaseProcess] = []  # the started ones
    stopping = False

    def forward(signum: int, _: FrameType | None) -> None:
        nonlocal stopping
        stopping = stopping or signum != signal.SIGHUP
        # SIGINT is passed on as SIGTERM: a worker still starting ignores SIGINT (see below)
        passed = signal.SIGHUP if signum == signal.SIGHUP else signal.SIGTERM
        for process in processes:
            if process.pid is not None and process.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, passed)

    signal.signal(signal.SIGTERM, forward)  # from the start: a SIGTERM before the workers run still cleans up
    metrics_dir = _metrics_directory()
    # one hash key for all (TOP_LIMITED_VALUES=hashed), so that the merged top limited callers show a caller once
    each = dataclasses.replace(settings, workers=1, top_limited=settings.top_limited.keyed(),
                               local_limit_replicas=settings.local_limit_replicas * settings.workers)
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no event loop or gRPC state copied
    try:
        # Ignored signals stay ignored in a new process, until its event loop takes them over: a worker still
        # starting is not ended by a SIGHUP passed on (it loads the config anyway), nor by a terminal's Ctrl-C,
        # which reaches it besides the parent (the parent passes SIGINT on as SIGTERM).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        for i in range(settings.workers):
            if stopping:
                break
            worker = context.Process(target=_worker, args=(each, os.getpid()), name=f"slidegate-worker-{i}")
            worker.start()
            processes.append(worker)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, forward)
        log.info("started %d workers (pids %s)", len(processes), ", ".join(str(p.pid) for p in processes))
        code = _wait_for_workers(processes, lambda: stopping, lambda: forward(signal.SIGTERM, None))
    finally:
        for process in processes:
            if process.exitcode is None and process.pid is not None:
                process.kill()
                process.join()
        shutil.rmtree(metrics_dir, ignore_errors=True)
    return code


def _metrics_directory() -> str:
    """A new directory for the workers' metrics files, named in PROMETHEUS_MULTIPROC_DIR (read by
    prometheus_client when a worker imports it). Raises OSError when TMPDIR cannot be written."""
    try:
        metrics_dir = tempfile.mkdtemp(prefix="slidegate-metrics-", dir=writable_directory())
    except OSError as exc:
        raise _unwritable(writable_directory(), exc) from exc
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    return metrics_dir


def _wait_for_workers(processes: list[multiprocessing.process.BaseProcess], stopping: Callable[[], bool],
                      stop_all: Callable[[], None]) -> int:
    """Wait until every worker has stopped; the first to stop while not ``stopping`` makes ``stop_all`` stop the
    others, and its code is returned (0 when none did)."""
    code = 0
    while True:
        # one look at each worker per turn: one reaped between two looks would be neither ended nor waited
        # for (a worker not reaped yet is waited for, and its sentinel is already ready)
        codes = [p.exitcode for p in processes]
        first = next((p for p, c in zip(processes, codes, strict=True) if c is not None), None)
        if first is not None and not stopping():
            exitcode = first.exitcode or 1
            code = 128 - exitcode if exitcode < 0 else exitcode  # killed by signal N: 128 + N, as shells say
            log.error("worker %s (pid %s) stopped with code %s: stopping the others", first.name, first.pid,
                      first.exitcode)
            stop_all()
        running = [p for p, c in zip(processes, codes, strict=True) if c is None]
        if not running:
            return code
        multiprocessing.connection.wait([p.sentinel for p in running])


def _worker(settings: Settings, parent: int) -> None:
    # ``parent`` comes from the parent itself: one killed while this worker was still starting is already
    # gone from os.getppid()
    threading.Thread(target=_stop_when_orphaned, args=(parent,), daemon=True).start()

    configure_logging(settings.log_level, settings.log_format, worker=True)
    try:
        run(settings, reuse_port=True)
    except (ConfigError, ValueError, OSError) as exc:
        print(f"worker {os.getpid()} cannot serve: {exc}", file=sys.stderr)
        sys.exit(1)


def _stop_when_orphaned(parent: int) -> None:
    # a parent killed outright (SIGKILL, OOM killer) cannot stop its workers, which would keep the ports, nor
    # remove the metrics directory (files the workers still hold open stay usable until they exit)
    while os.getppid() == parent:
        time.sleep(1)
    shutil.rmtree(os.environ.get("PROMETHEUS_MULTIPROC_DIR", ""), ignore_errors=True)
    os.kill(os.getpid(), signal.SIGTERM)
