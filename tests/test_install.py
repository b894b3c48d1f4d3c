"""A non-editable `pip install .` into a fresh venv works on its own: the console script, the Lua scripts and the
generated protobuf code all come from the installed package, not the source tree. Its dependencies are the
versions the suite runs on (constraints.txt's, or the newest ones under .ci/newest), not whatever was released
last night."""

from __future__ import annotations

import importlib.metadata
import subprocess
import venv
from collections.abc import Callable
from pathlib import Path

import grpc

from slidegate import stack
from slidegate.protos import rls_pb2_grpc
from tests.helpers import OK, descriptor, request

ROOT = Path(__file__).resolve().parent.parent


def test_pip_install_then_serve(tmp_path: Path, write_config: Callable[..., Path], redis_url: str,
                                key_prefix: str) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python, slidegate = env_dir / "bin" / "python", env_dir / "bin" / "slidegate"
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("".join(f"{d.metadata['Name']}=={d.version}\n" for d in importlib.metadata.distributions()
                                   if d.metadata["Name"] != "slidegate"))
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-c", constraints,
                    str(ROOT)], check=True, timeout=600, cwd=tmp_path)
    where = subprocess.run([python, "-c", "import slidegate, slidegate.resources as r; "
                            "print(slidegate.__file__); print(r.resource_dir('lua'))"],
                           check=True, capture_output=True, text=True, cwd=tmp_path).stdout.split()
    assert all(str(env_dir) in line for line in where), where
    assert subprocess.run([slidegate, "--help"], capture_output=True, text=True, check=True).stdout.startswith(
        "Usage: slidegate")
    directory = write_config("domain: d\ndescriptors:\n- key: k\n  rate_limit: {unit: minute, requests_per_unit: 3}")
    port = stack.free_port()
    process = subprocess.Popen(
        [slidegate, "serve", "--config", str(directory), "--host", "127.0.0.1", "--grpc-port", str(port),
         "--redis-url", redis_url, "--cache-key-prefix", key_prefix, "--http-port", "0", "--debug-port", "0"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        stack.wait_grpc_serving(port)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            reply = rls_pb2_grpc.RateLimitServiceStub(channel).ShouldRateLimit(
                request("d", descriptor(("k", "v"))), timeout=5)
    finally:
        code = stack.stop(process)
    assert reply.overall_code == OK and reply.statuses[0].limit_remaining == 2
    assert code == 0
