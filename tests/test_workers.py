"""`slidegate serve --workers N`: processes sharing the ports, exact limits across them, summed metrics,
and the parent's handling of signals and of a worker that dies."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from slidegate.logs import configure_logging
from slidegate.protos import rls_pb2_grpc
from slidegate.settings import Settings, SettingsError
from slidegate.stack import free_port, stop
from slidegate.workers import lock_ports, remove_port_locks
from tests.helpers import OK, descriptor, request
from tests.served import Served, wait_for

CONFIG = """
domain: w
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 40}
"""


def worker_pids(served: Served) -> list[int]:
    assert wait_for(lambda: "started 2 workers" in served.output())
    found = re.search(r"started 2 workers \(pids (\d+), (\d+)\)", served.output())
    assert found is not None
    return [int(found.group(1)), int(found.group(2))]


def gone(pid: int) -> bool:
    """The process has exited (a zombie waiting for a reaper counts as exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def sockets_of(pid: int) -> int:
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(FileNotFoundError):  # closed since the listing
            count += os.readlink(fd).startswith("socket:")
    return count


def test_workers_share_the_ports_and_the_limits(write_config: Callable[..., Path],
                                                serve: Callable[..., Served]) -> None:
    served = serve(write_config(CONFIG), "--workers", "2")
    pids = worker_pids(served)
    assert wait_for(lambda: served.output().count("listening for gRPC") == 2, timeout=15)  # both, not the first
    for pid in pids:  # each worker's lines say whose they are
        assert f"INFO slidegate[{pid}]: listening for gRPC" in served.output()
    before = {pid: sockets_of(pid) for pid in pids}
    # channels share one connection unless each keeps its own subchannels
    channels = [grpc.insecure_channel(f"127.0.0.1:{served.grpc_port}", options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(80)]
    try:
        def call(channel: grpc.Channel) -> int:
            stub = rls_pb2_grpc.RateLimitServiceStub(channel)
            return int(stub.ShouldRateLimit(request("w", descriptor(("k", "shared"))), timeout=5).overall_code)

        with ThreadPoolExecutor(16) as pool:
            codes = list(pool.map(call, channels))
        assert codes.count(OK) == 40  # one limit in Redis, whichever worker answered
        # each connection is one socket in the worker that accepted it: the kernel gave both some
        assert all(sockets_of(pid) > before[pid] for pid in pids)
    finally:
        for channel in channels:
            channel.close()
    metrics = served.http("/metrics")[1]
    assert 'ratelimit_service_rate_limit_total_hits_total{domain="w",key="k"} 80.0' in metrics
    assert 'ratelimit_service_rate_limit_over_limit_total{domain="w",key="k"} 40.0' in metrics
    assert "ratelimit_config_load_success_total 2.0" in metrics  # one load per worker, summed
    served.process.send_signal(signal.SIGTERM)
    assert served.process.wait(15) == 0
    assert all(gone(pid) for pid in pids)


def test_a_worker_that_dies_stops_the_others(write_config: Callable[..., Path],
                                             serve: Callable[..., Served]) -> None:
    served = serve(write_config(CONFIG), "--workers", "2")
    dead, other = worker_pids(served)
    os.kill(dead, signal.SIGKILL)
    assert served.process.wait(15) == 128 + 9  # the supervisor (Kubernetes, systemd) restarts the whole
    assert wait_for(lambda: gone(other))
    assert "stopped with code -9: stopping the others" in served.output()


def test_a_port_taken_by_another_program_is_refused(write_config: Callable[..., Path], redis_url: str) -> None:
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # it would share the port without the check
        other.bind(("127.0.0.1", 0))
        other.listen()
        taken = other.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "slidegate", "serve", "--config", str(write_config(CONFIG)), "--workers", "2",
             "--host", "127.0.0.1", "--grpc-port", str(taken), "--http-host", "127.0.0.1", "--http-port",
             str(free_port()), "--debug-host", "127.0.0.1", "--debug-port", str(free_port()),
             "--redis-url", redis_url], capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    assert f"cannot listen for gRPC on 127.0.0.1:{taken}" in done.stderr


def test_a_sighup_before_the_workers_serve_ends_nothing(write_config: Callable[..., Path],
                                                        serve: Callable[..., Served]) -> None:
    served = serve(write_config(CONFIG), "--workers", "2", wait=False)
    assert wait_for(lambda: "started 2 workers" in served.output(), timeout=15)
    served.process.send_signal(signal.SIGHUP)  # passed on to workers still importing
    stub = served.stub()
    assert wait_for(lambda: served.http("/healthcheck")[0] == 200, timeout=15), served.output()
    assert stub.ShouldRateLimit(request("w", descriptor(("k", "after-hup"))), timeout=5).overall_code == OK
    assert served.process.poll() is None and "stopped with code" not in served.output()


def test_workers_of_a_killed_parent_stop(write_config: Callable[..., Path], serve: Callable[..., Served]) -> None:
    served = serve(write_config(CONFIG), "--workers", "2")
    pids = worker_pids(served)
    metrics_dir = Path(Path(f"/proc/{pids[0]}/environ").read_bytes().split(b"PROMETHEUS_MULTIPROC_DIR=")[1]
                       .split(b"\0")[0].decode())
    assert metrics_dir.is_dir()
    served.process.kill()  # no chance to stop them
    served.process.wait()
    assert wait_for(lambda: all(gone(pid) for pid in pids), timeout=15)
    assert not metrics_dir.exists()


def test_two_started_at_once_on_the_same_ports_one_is_refused(write_config: Callable[..., Path],
                                                              redis_url: str) -> None:
    ports = [str(free_port()) for _ in range(3)]
    command = [sys.executable, "-m", "slidegate", "serve", "--config", str(write_config(CONFIG)), "--workers", "2",
               "--host", "127.0.0.1", "--grpc-port", ports[0], "--http-host", "127.0.0.1", "--http-port", ports[1],
               "--debug-host", "127.0.0.1", "--debug-port", ports[2], "--redis-url", redis_url]
    # the second spells the same addresses another way
    other = [("0.0.0.0" if arg == "127.0.0.1" else arg) for arg in command]
    both = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for c in (command, other)]
    try:
        assert wait_for(lambda: any(p.poll() is not None for p in both), timeout=15)
        [refused] = [p for p in both if p.poll() is not None]
        assert refused.returncode == 1
        assert "another slidegate with --workers holds it" in (refused.stdout.read() if refused.stdout else "")
        [kept] = [p for p in both if p is not refused]

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ports[1]}/healthcheck", timeout=2) as reply:
                    return bool(reply.status == 200)
            except OSError:
                return False

        assert wait_for(healthy, timeout=15)
        assert kept.poll() is None
    finally:
        for process in both:
            stop(process)


@pytest.mark.parametrize(("flags", "reason"), [
    ({"workers": "2", "backend_type": "memory"}, "needs the Redis backend"),
    ({"workers": "3", "http_port": "0"}, "--http-port / PORT is 0"),
    ({"workers": "1000"}, "1000 is more than 128"),
])
def test_settings_that_cannot_work_with_workers(flags: dict[str, str], reason: str) -> None:
    with pytest.raises(SettingsError, match=re.escape(reason)):
        Settings.load({}, flags)


def test_a_workers_json_lines_name_its_pid(capsys: pytest.CaptureFixture[str]) -> None:
    root, ours, watcher = logging.getLogger(), logging.getLogger("slidegate"), logging.getLogger("watchfiles")
    saved = root.handlers[:], root.level, ours.level, watcher.level
    try:
        configure_logging("info", "json", worker=True)
        logging.getLogger("slidegate.test").info("hello")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        ours.setLevel(saved[2])
        watcher.setLevel(saved[3])
    line = json.loads(capsys.readouterr().err.splitlines()[-1])
    assert (line["message"], line["pid"]) == ("hello", os.getpid())


def test_port_locks_no_one_holds_are_removed_and_held_ones_kept(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    settings = Settings.load({"GRPC_PORT": str(free_port()), "PORT": str(free_port()),
                              "DEBUG_PORT": str(free_port())})
    held = lock_ports(settings)
    ports = [settings.grpc_port, settings.http_port, settings.debug_port]
    try:
        remove_port_locks(ports)  # a running `serve --workers` holds them: kept
        assert sorted(path.name for path in tmp_path.iterdir()) == sorted(f"slidegate-port-{p}.lock" for p in ports)
    finally:
        for fd in held:
            os.close(fd)
    remove_port_locks([*ports, free_port()])  # stopped: removed (a port never locked is no error)
    assert list(tmp_path.iterdir()) == []


def test_a_lock_file_replaced_while_being_removed_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # between the remover's open and its lock, another remover took the old file away and a new `serve --workers`
    # made and locked a new one at the same path: that one is held, and must stay
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    path = tmp_path / "slidegate-port-2001.lock"
    path.touch()
    newer: list[int] = []
    real_flock = fcntl.flock

    def replaced_then_flock(handle: Any, operation: int) -> None:
        path.unlink()
        newer.append(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
        real_flock(newer[0], fcntl.LOCK_EX | fcntl.LOCK_NB)
        real_flock(handle, operation)

    monkeypatch.setattr(fcntl, "flock", replaced_then_flock)
    try:
        remove_port_locks([2001])
        assert path.exists()
    finally:
        for fd in newer:
            os.close(fd)
