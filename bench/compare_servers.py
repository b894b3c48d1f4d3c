"""The two servers bench/compare.py compares: their addresses, and, when it is given a reference binary, the
processes it starts for a run: a private redis-server, `slidegate serve` with DEFAULT_ALGORITHM=fixed_window,
and the envoyproxy/ratelimit binary (built by hand outside this repository), both on the same config directory,
the same Redis and the same settings (a profile), each under a key prefix of its own for the run."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from bench.compare_stats import StatsdListener
from bench.run import private_redis
from slidegate import stack

STATS_FLUSH_SECONDS = 1
# the settings both servers get in every run; a profile adds the ones that change answers
# (REDIS_TIMEOUT: slidegate's 250 ms default bounds a whole decision, which a loaded machine can miss now and then)
COMMON = {"LOG_LEVEL": "warn", "REDIS_TIMEOUT": "5s", "USE_STATSD": "false", "USE_PROMETHEUS": "false",
          "EXPIRATION_JITTER_MAX_SECONDS": "0", "LOCAL_CACHE_SIZE_IN_BYTES": "0", "REDIS_SOCKET_TYPE": "tcp",
          "RUNTIME_WATCH_ROOT": "false"}
PROFILES: dict[str, dict[str, str]] = {
    # the answers with everything they can carry: headers and dynamic metadata
    "full": {"LIMIT_RESPONSE_HEADERS_ENABLED": "true", "RESPONSE_DYNAMIC_METADATA": "true"},
    # the defaults of both (but the rejections cache, which the reference has off)
    "plain": {},
    # the header names changed, another near-limit ratio, the rejections cache on in both
    "renamed": {"LIMIT_RESPONSE_HEADERS_ENABLED": "true", "LIMIT_LIMIT_HEADER": "X-RateLimit-Limit",
                "LIMIT_REMAINING_HEADER": "X-RateLimit-Remaining", "LIMIT_RESET_HEADER": "X-RateLimit-Reset",
                "NEAR_LIMIT_RATIO": "0.5", "LOCAL_CACHE_SIZE_IN_BYTES": "1048576"},
    # every limit in shadow mode
    "shadow": {"SHADOW_MODE": "true", "LIMIT_RESPONSE_HEADERS_ENABLED": "true"},
    # every limit in quota mode
    "quota": {"QUOTA_MODE": "true", "LIMIT_RESPONSE_HEADERS_ENABLED": "true"},
    # the per-second limits in a Redis of their own
    "persecond": {"REDIS_PERSECOND": "true", "REDIS_PERSECOND_SOCKET_TYPE": "tcp",
                  "LIMIT_RESPONSE_HEADERS_ENABLED": "true"},
    # a request over a limit counts no more on it
    "stop_increment": {"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "true", "LIMIT_RESPONSE_HEADERS_ENABLED": "true"},
}


@dataclass(frozen=True)
class Server:
    """One RLS: its gRPC address (host:port), and its HTTP (/json, /healthcheck) and debug addresses if known."""

    name: str
    grpc: str
    http: str = ""
    debug: str = ""
    stats: StatsdListener | None = field(default=None, compare=False)  # what it sends to statsd, if started here
    pid: int = 0  # its process, if started here

    def get(self, path: str, body: bytes | None = None) -> tuple[int, str]:
        """The HTTP status and body of ``path`` on the HTTP port (POST when ``body`` is given); (0, "") when nothing
        answers."""
        request = urllib.request.Request(f"http://{self.http}{path}", data=body,
                                         method="POST" if body is not None else "GET")
        try:
            with urllib.request.urlopen(request, timeout=5) as reply:
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as reply:
            return reply.code, reply.read().decode()
        except (urllib.error.URLError, OSError):
            return 0, ""


def config_dir(root: Path) -> Path:
    """Where both servers read the config under ``root``: the reference's RUNTIME_ROOT/ratelimit/config."""
    return root / "ratelimit" / "config"


@contextmanager
def started(reference_binary: str, root: Path, profile: Mapping[str, str],
            logs: Path) -> Iterator[tuple[Server, Server]]:
    """Both servers on the config under ``root`` with ``profile``'s settings, on a private Redis, each sending
    its stats to a listener of its own; stopped after."""
    with private_redis() as (url, _), ExitStack() as stack_:
        env = {**os.environ, **COMMON, **profile}
        persecond: dict[str, str] = {}
        if profile.get("REDIS_PERSECOND") == "true":  # a second Redis for the per-second limits
            persecond["REDIS_PERSECOND_URL"] = stack_.enter_context(private_redis())[0]
        servers = (launch_slidegate(root, url, {**env, **persecond}, logs, stack_),
                   launch_reference(reference_binary, root, url, {**env, **_host_port(persecond)}, logs, stack_))
        for server in servers:
            wait_healthy(server, logs)
        yield servers


def launch_slidegate(root: Path, redis_url: str, env: Mapping[str, str], logs: Path, stack_: ExitStack,
                     name: str = "slidegate") -> Server:
    """`slidegate serve` on the config under ``root``, DEFAULT_ALGORITHM=fixed_window unless ``env`` says
    otherwise, under a key prefix of its own."""
    own = {"DEFAULT_ALGORITHM": "fixed_window", "LOCAL_LIMIT_REPLICAS": "1", **env, "REDIS_URL": redis_url,
           "CACHE_KEY_PREFIX": f"sg{uuid.uuid4().hex[:8]}:"}
    return launch(name, [sys.executable, "-m", "slidegate", "serve", "--config", str(config_dir(root))], own, logs,
                  stack_)


def launch_reference(binary: str, root: Path, redis_url: str, env: Mapping[str, str], logs: Path,
                     stack_: ExitStack) -> Server:
    """envoyproxy/ratelimit's ``binary`` on the config under ``root`` (its RUNTIME_ROOT), under a key prefix of
    its own."""
    own = {**env, **_host_port({"REDIS_URL": redis_url}), "RUNTIME_ROOT": str(root),
           "RUNTIME_SUBDIRECTORY": "ratelimit", "CACHE_KEY_PREFIX": f"rl{uuid.uuid4().hex[:8]}:"}
    return launch("reference", [binary], own, logs, stack_)


def _host_port(urls: Mapping[str, str]) -> dict[str, str]:
    """Redis URLs (redis://host:port/0) as the reference takes them with REDIS_SOCKET_TYPE=tcp: host:port."""
    return {name: url.removeprefix("redis://").split("/")[0] for name, url in urls.items()}


def launch(name: str, command: list[str], env: Mapping[str, str], logs: Path, stack_: ExitStack) -> Server:
    """Start ``command`` on free ports with a statsd listener of its own (both closed by ``stack_``)."""
    listener = StatsdListener()
    stack_.callback(listener.close)
    ports = {"grpc": stack.free_port(), "http": stack.free_port(), "debug": stack.free_port()}
    statsd = {"USE_STATSD": "true", "STATSD_HOST": "127.0.0.1", "STATSD_PORT": str(listener.port),
              "STATS_FLUSH_INTERVAL": f"{STATS_FLUSH_SECONDS}s"}
    with (logs / f"{name}.log").open("w") as log:
        process = subprocess.Popen(command, env={**env, **_listen(ports), **statsd}, stdout=log,
                                   stderr=subprocess.STDOUT)
    stack_.callback(stack.stop, process)
    return Server(name, f"127.0.0.1:{ports['grpc']}", f"127.0.0.1:{ports['http']}", f"127.0.0.1:{ports['debug']}",
                  listener, process.pid)


def _listen(ports: Mapping[str, int]) -> dict[str, str]:
    return {"GRPC_HOST": "127.0.0.1", "GRPC_PORT": str(ports["grpc"]), "HOST": "127.0.0.1",
            "PORT": str(ports["http"]), "DEBUG_HOST": "127.0.0.1", "DEBUG_PORT": str(ports["debug"])}


def wait_healthy(server: Server, logs: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.get("/healthcheck")[0] == 200:
            return
        time.sleep(0.1)
    raise TimeoutError(f"{server.name} not healthy after {timeout:.0f} s: see {logs / (server.name + '.log')}")


def scratch() -> Path:
    return Path(tempfile.mkdtemp(prefix="slidegate-compare-"))
