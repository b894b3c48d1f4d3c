"""Private redis-server processes for tests that need a Redis of their own (to stop, restart or flush)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
import weakref
from pathlib import Path

import redis

from slidegate.stack import free_port

INSTALL_HINT = "redis-server not found: install it (Debian: apt-get install redis-server) or set REDIS_URL"


# why no redis-server may start now (tests/conftest.py sets it while a unit-tier test runs), or ""
REFUSED = ""


class RedisServer:
    """A redis-server on a free loopback port, keeping nothing on disk. ``start``/``stop`` may be repeated
    (same port) to simulate an outage."""

    def __init__(self) -> None:
        if REFUSED:
            raise RuntimeError(REFUSED)
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(INSTALL_HINT)
        self.binary = binary
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="slidegate-redis-")
        # its directory goes with it even when a test stops it without cleanup (the suite left a few each run)
        self._remove_dir = weakref.finalize(self, shutil.rmtree, self.dir, True)
        self.process: subprocess.Popen[bytes] | None = None
        self.extra_args: tuple[str, ...] = ()
        self._started = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, password: str | None = None, tls: tuple[Path, Path, Path] | None = None) -> RedisServer:
        """Start (again). ``password`` is what the readiness check connects with; ``tls`` (certificate, key,
        CA) serves TLS only, on the same port. A first start whose port (or cluster bus port) another process
        took since it was found free starts again on fresh ones; a start again keeps its port."""
        for _ in range(1 if self._started else 3):
            if self._launch(password, tls):
                self._started = True
                return self
            if "Address already in use" not in self._log():
                break
            self.port = free_port()
            self.extra_args = tuple(str(free_port()) if previous == "--cluster-port" else arg
                                    for previous, arg in zip(("", *self.extra_args[:-1]), self.extra_args, strict=True))
        raise RuntimeError(f"redis-server on port {self.port} did not start: {self._log()[-300:]}")

    def _launch(self, password: str | None, tls: tuple[Path, Path, Path] | None) -> bool:
        """Start the process and wait until it answers a PING (True), or until it exited or 10 s passed."""
        ports = ["--port", str(self.port)]
        if tls is not None:
            cert, key, ca = tls
            ports = ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(cert), "--tls-key-file",
                     str(key), "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no"]
        args = [
            self.binary, *ports, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--enable-debug-command", "local", "--dir", self.dir, "--logfile", str(Path(self.dir) / "redis.log"),
            *self.extra_args,
        ]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = (redis.Redis(port=self.port, socket_connect_timeout=0.2, password=password, ssl=True,
                              ssl_ca_certs=str(tls[2])) if tls is not None
                  else redis.Redis(port=self.port, socket_connect_timeout=0.2, password=password))
        deadline = time.monotonic() + 10
        try:
            while True:
                try:
                    client.ping()
                    return True
                except (redis.ConnectionError, redis.TimeoutError):  # a port held by another process may not answer
                    if time.monotonic() > deadline or self.process.poll() is not None:
                        self.stop()
                        return False
                    time.sleep(0.02)
        finally:
            client.close()

    def _log(self) -> str:
        try:
            return (Path(self.dir) / "redis.log").read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def cleanup(self) -> None:
        self.stop()
        self._remove_dir()
