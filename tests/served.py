"""`slidegate serve` as a child process for tests: its ports, its log, HTTP and gRPC clients."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from slidegate import stack
from slidegate.protos import rls_pb2_grpc


@dataclass
class Served:
    process: subprocess.Popen[bytes]
    grpc_port: int
    http_port: int
    debug_port: int
    log: Any

    def http(self, path: str, body: bytes | None = None, port: int | None = None) -> tuple[int, str]:
        req = urllib.request.Request(f"http://127.0.0.1:{port or self.http_port}{path}", data=body,
                                     method="POST" if body is not None else "GET")
        try:
            with urllib.request.urlopen(req, timeout=5) as reply:
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as reply:
            return reply.code, reply.read().decode()
        except urllib.error.URLError:
            return 0, ""  # not listening (yet)

    def stub(self) -> Any:
        return rls_pb2_grpc.RateLimitServiceStub(grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}"))

    def output(self) -> str:
        return read_log(self.log)


def read_log(handle: Any) -> str:
    """Everything a child process wrote so far to ``handle``, its stdout. Read at an offset of its own: the child
    writes through the same open file, so moving the file's offset (seek) made its next lines overwrite its first
    ones (a start-up warning a test looked for was gone)."""
    size = os.fstat(handle.fileno()).st_size
    return os.pread(handle.fileno(), size, 0).decode(errors="replace")


class Starter:
    """Starts `slidegate serve` processes (``start``) and stops them all (``stop_all``)."""

    def __init__(self, redis_url: str, key_prefix: str) -> None:
        self.redis_url, self.key_prefix = redis_url, key_prefix
        self.started: list[Served] = []

    def start(self, config_dir: Path | None, *args: str, url: str | None = None, wait: bool = True,
              env: dict[str, str] | None = None, log_path: Path | None = None, attempts: int = 3) -> Served:
        """Start one; ``wait`` for its gRPC health to say SERVING (plaintext servers only); its log goes to
        ``log_path`` when given. A free port can be taken by another process before the server binds it: then
        it starts again on others, up to ``attempts`` times."""
        grpc_port, http_port, debug_port = stack.free_port(), stack.free_port(), stack.free_port()
        log = log_path.open("w+b") if log_path else tempfile.TemporaryFile()  # noqa: SIM115 - closed by stop_all
        where = ["--config", str(config_dir)] if config_dir is not None else []  # None: RUNTIME_* decide
        cmd = [sys.executable, "-m", "slidegate", "serve", *where, "--host", "127.0.0.1",
               "--grpc-port", str(grpc_port), "--http-host", "127.0.0.1", "--http-port", str(http_port),
               "--debug-host", "127.0.0.1", "--debug-port", str(debug_port), "--redis-url", url or self.redis_url,
               "--cache-key-prefix", self.key_prefix, *args]
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        served = Served(process, grpc_port, http_port, debug_port, log)
        self.started.append(served)
        if wait:
            try:
                stack.wait_grpc_serving(grpc_port)
            except TimeoutError as exc:  # say why: the process's own words
                if process.poll() is not None and "address already in use" in served.output() and attempts > 1:
                    self.started.remove(served)
                    served.log.close()
                    return self.start(config_dir, *args, url=url, wait=wait, env=env, log_path=log_path,
                                      attempts=attempts - 1)
                raise TimeoutError(f"{exc} (exit code {process.poll()}); its log:\n{served.output()[-3000:]}") from exc
        return served

    def stop_all(self) -> None:
        for served in self.started:
            stack.stop(served.process)
            served.log.close()


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


