"""TLS: the gRPC server over TLS and mutual TLS with certificates reloaded on change; Redis over TLS."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import grpc

from slidegate._proto.envoy.service.ratelimit.v3 import rls_pb2_grpc
from tests.certs import Authority
from tests.helpers import OK, descriptor, request
from tests.redis_servers import RedisServer
from tests.served import Served, wait_for
from tests.test_production import CONFIG


def call(port: int, ca: Path, client: tuple[Path, Path] | None = None) -> int | str:
    """The overall code of one call over TLS, or the gRPC status name of its failure."""
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca.read_bytes(),
        private_key=client[1].read_bytes() if client else None,
        certificate_chain=client[0].read_bytes() if client else None,
    )
    with grpc.secure_channel(f"localhost:{port}", credentials) as channel:
        try:
            reply = rls_pb2_grpc.RateLimitServiceStub(channel).ShouldRateLimit(
                request("p", descriptor(("user", "tls"))), timeout=5)
        except grpc.RpcError as exc:
            return str(exc.code().name)
    return int(reply.overall_code)


def test_grpc_tls_and_certificate_reload(tmp_path: Path, write_config: Callable[..., Path],
                                         serve: Callable[..., Served]) -> None:
    first, second = Authority(tmp_path, "ca1"), Authority(tmp_path, "ca2")
    cert, key = first.issue("server1")
    live_cert, live_key = tmp_path / "live.crt", tmp_path / "live.key"
    shutil.copy(cert, live_cert)
    shutil.copy(key, live_key)
    served = serve(write_config(CONFIG), "--grpc-server-use-tls", "true", "--grpc-server-tls-cert", str(live_cert),
                   "--grpc-server-tls-key", str(live_key), wait=False)
    assert wait_for(lambda: call(served.grpc_port, first.ca_file) == OK, timeout=20)
    assert call(served.grpc_port, second.ca_file) == "UNAVAILABLE"  # not its certificate yet
    # new files from another CA: new connections get them, without a restart
    cert2, key2 = second.issue("server2")
    shutil.copy(key2, live_key)
    shutil.copy(cert2, live_cert)
    assert wait_for(lambda: call(served.grpc_port, second.ca_file) == OK)
    assert "TLS certificate reloaded from" in served.output()


def test_grpc_mutual_tls(tmp_path: Path, write_config: Callable[..., Path], serve: Callable[..., Served]) -> None:
    authority, stranger = Authority(tmp_path, "ca"), Authority(tmp_path, "other")
    cert, key = authority.issue("server")
    served = serve(write_config(CONFIG), "--grpc-server-use-tls", "true", "--grpc-server-tls-cert", str(cert),
                   "--grpc-server-tls-key", str(key), "--grpc-client-tls-cacert", str(authority.ca_file), wait=False)
    client = authority.issue("client")
    assert wait_for(lambda: call(served.grpc_port, authority.ca_file, client) == OK, timeout=20)
    assert call(served.grpc_port, authority.ca_file) == "UNAVAILABLE"  # no client certificate
    assert call(served.grpc_port, authority.ca_file, stranger.issue("intruder")) == "UNAVAILABLE"
    command = [sys.executable, "-m", "slidegate", "client", "--target", f"localhost:{served.grpc_port}",
               "--domain", "p", "--descriptor", "user=cli", "--tls-cacert", str(authority.ca_file)]
    cert, key = client
    done = subprocess.run([*command, "--tls-cert", str(cert), "--tls-key", str(key)], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0 and done.stdout.startswith("overall: OK"), done.stderr
    refused = subprocess.run(command, capture_output=True, text=True, timeout=30)  # no client certificate
    assert refused.returncode == 2 and refused.stderr.startswith("error: UNAVAILABLE"), refused.stderr


def test_redis_over_tls(tmp_path: Path, write_config: Callable[..., Path], serve: Callable[..., Served]) -> None:
    authority = Authority(tmp_path, "redis-ca")
    cert, key = authority.issue("redis")
    server = RedisServer().start(tls=(cert, key, authority.ca_file))
    port = server.port
    try:
        served = serve(write_config(CONFIG), "--redis-tls", "true", "--redis-tls-cacert", str(authority.ca_file),
                       url=f"redis://localhost:{port}/0")
        stub = served.stub()
        assert [stub.ShouldRateLimit(request("p", descriptor(("user", "t")))).overall_code for _ in range(3)] == [
            OK, OK, 2]
        assert f"storage: redis at rediss://localhost:{port}/0" in served.output()
    finally:
        server.cleanup()


def test_unusable_tls_files_stop_the_start(tmp_path: Path, write_config: Callable[..., Path]) -> None:
    authority = Authority(tmp_path, "ca")
    cert, key = authority.issue("server")
    other_cert, other_key = authority.issue("other")
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate")
    cases = [
        (["--grpc-server-tls-cert", str(junk), "--grpc-server-tls-key", str(key)], "GRPC_SERVER_TLS_CERT"),
        (["--grpc-server-tls-cert", str(cert), "--grpc-server-tls-key", str(other_key)],
         "GRPC_SERVER_TLS_CERT/GRPC_SERVER_TLS_KEY"),
        (["--grpc-server-tls-cert", str(cert), "--grpc-server-tls-key", str(key),
          "--grpc-client-tls-cacert", str(junk)], "GRPC_CLIENT_TLS_CACERT"),
    ]
    for args, setting in cases:
        done = subprocess.run([sys.executable, "-m", "slidegate", "serve", "--config", str(write_config(CONFIG)),
                               "--grpc-port", "0", "--http-port", "0", "--debug-port", "0",
                               "--grpc-server-use-tls", "true", *args], capture_output=True, text=True, timeout=30)
        assert done.returncode == 1 and f"invalid setting: {setting}" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    assert other_cert.exists()
    done = subprocess.run([sys.executable, "-m", "slidegate", "serve", "--config", str(write_config(CONFIG)),
                           "--redis-tls", "true", "--redis-tls-cacert", str(tmp_path / "missing.crt")],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 1 and "REDIS_TLS_CACERT: no such file" in done.stderr
