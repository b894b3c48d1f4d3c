"""`slidegate serve` on a read-only root filesystem (Envoy Gateway's rate-limit Deployment: uid 65534,
readOnlyRootFilesystem): with WORKERS=1 it writes nothing, so an unwritable TMPDIR and working directory still
serve everything; with WORKERS above 1 its port locks and the workers' metrics files go to TMPDIR, and an
unwritable one is refused with what to mount.

Root writes anywhere, so as root the server runs with every capability dropped (as that Deployment's
`capabilities: drop: [ALL]`; setpriv): the permission bits then hold for it too. (Not as nobody: the interpreter
may live in root's home.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slidegate import stack
from slidegate.protos import rls_pb2
from tests.helpers import descriptor, request
from tests.served import Served, read_log

CONFIG = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"
# root without capabilities: CAP_DAC_OVERRIDE gone, a 0555 directory is not writable to it either
DROP_ALL = ["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--"] if os.geteuid() == 0 else []


@pytest.fixture
def place() -> Iterator[Path]:
    """A directory holding the config in ``config/``, and ``locked/``, which the server cannot write (0555)."""
    root = Path(tempfile.mkdtemp(prefix="slidegate-rofs-"))
    try:
        root.chmod(0o755)
        (root / "config").mkdir(mode=0o755)
        (root / "config" / "config.yaml").write_text(CONFIG)
        (root / "config" / "config.yaml").chmod(0o644)
        (root / "locked").mkdir(mode=0o555)
        yield root
    finally:
        (root / "locked").chmod(0o755)
        shutil.rmtree(root, ignore_errors=True)


def _start(place: Path, tmpdir: Path, workers: int, redis_url: str, key_prefix: str,
           ) -> tuple[subprocess.Popen[bytes], dict[str, int], Any]:
    ports = {name: stack.free_port() for name in ("grpc", "http", "debug", "metrics")}
    env = {**os.environ, "TMPDIR": str(tmpdir), "WORKERS": str(workers), "CONFIG_DIR": str(place / "config"),
           "GRPC_HOST": "127.0.0.1", "GRPC_PORT": str(ports["grpc"]), "HOST": "127.0.0.1",
           "PORT": str(ports["http"]), "DEBUG_HOST": "127.0.0.1", "DEBUG_PORT": str(ports["debug"]),
           "PROMETHEUS_ADDR": f"127.0.0.1:{ports['metrics']}", "REDIS_URL": redis_url,
           "CACHE_KEY_PREFIX": key_prefix, "PYTHONDONTWRITEBYTECODE": "1"}
    log = tempfile.TemporaryFile()  # noqa: SIM115 - closed by the caller
    process = subprocess.Popen([*DROP_ALL, sys.executable, "-m", "slidegate", "serve"], cwd=place / "locked",
                               env=env, stdout=log, stderr=subprocess.STDOUT)
    return process, ports, log


def _get(port: int, path: str) -> tuple[int, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
        return reply.status, reply.read().decode()


def _output(log: Any) -> str:
    return read_log(log)


def test_one_worker_serves_with_nothing_writable(place: Path, redis_url: str, key_prefix: str) -> None:
    process, ports, log = _start(place, place / "locked", 1, redis_url, key_prefix)
    try:
        try:
            stack.wait_grpc_serving(ports["grpc"])
        except TimeoutError:
            pytest.fail(f"not serving; its log:\n{_output(log)}")
        served = Served(process, ports["grpc"], ports["http"], ports["debug"], log)
        stub = served.stub()
        codes = [stub.ShouldRateLimit(request("d", descriptor(("k", "v"))), timeout=5).overall_code
                 for _ in range(2)]
        assert codes == [rls_pb2.RateLimitResponse.OK, rls_pb2.RateLimitResponse.OVER_LIMIT]
        assert _get(ports["http"], "/healthcheck") == (200, "OK")
        assert "d" in _get(ports["debug"], "/rlconfig")[1]
        assert 'key="k"} 2.0' in _get(ports["metrics"], "/metrics")[1]
        assert list((place / "locked").iterdir()) == []
        assert process.poll() is None
    finally:
        stack.stop(process)
        log.close()


def test_workers_keep_their_files_in_tmpdir(place: Path, redis_url: str, key_prefix: str) -> None:
    writable = place / "writable"
    writable.mkdir(mode=0o755)
    process, ports, log = _start(place, writable, 2, redis_url, key_prefix)
    try:
        try:
            stack.wait_grpc_serving(ports["grpc"], timeout=40)
        except TimeoutError:
            pytest.fail(f"not serving; its log:\n{_output(log)}")
        names = sorted(path.name for path in writable.iterdir())
        assert [n for n in names if n.endswith(".lock")] == sorted(
            f"slidegate-port-{port}.lock" for port in ports.values())
        assert any(n.startswith("slidegate-metrics-") for n in names)
        assert _get(ports["metrics"], "/metrics")[0] == 200
    finally:
        stack.stop(process)
        log.close()


def test_workers_refuse_an_unwritable_tmpdir(place: Path, redis_url: str, key_prefix: str) -> None:
    process, _, log = _start(place, place / "locked", 2, redis_url, key_prefix)
    try:
        deadline = time.monotonic() + 20
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process.poll() == 1
        output = _output(log)
        assert f"WORKERS above 1 needs a writable TMPDIR, and {place / 'locked'} is not" in output
        assert "an emptyDir" in output
    finally:
        stack.stop(process)
        log.close()
