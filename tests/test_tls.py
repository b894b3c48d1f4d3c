"""TLS: the gRPC server over TLS and mutual TLS with certificates reloaded on change; Redis over TLS."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from slidegate.application import build
from slidegate.protos import rls_pb2, rls_pb2_grpc
from slidegate.server import start_server
from slidegate.settings import Settings, SettingsError
from slidegate.tls import names_san, server_credentials
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
    assert done.returncode == 2 and "--redis-tls-cacert / REDIS_TLS_CACERT: no such file" in done.stderr


@pytest.mark.parametrize(("wanted", "dns", "addresses", "named"), [
    ("client.example.com", ["client.example.com"], [], True),
    ("Client.Example.COM.", ["client.example.com"], [], True),  # case and a final dot do not matter
    ("client.example.com", ["*.example.com"], [], True),  # a wildcard stands for the leftmost label
    ("a.client.example.com", ["*.example.com"], [], False),  # ... for one label only
    ("example.com", ["*.example.com"], [], False),
    ("client.example.com", ["client.*.com", "*"], [], False),  # only leftmost, and never alone
    ("client.example.com", ["other.example.com", "localhost"], ["127.0.0.1"], False),
    ("10.0.0.7", ["10.0.0.7"], [], False),  # an address is an IP SAN, never a DNS one
    ("10.0.0.7", [], ["10.0.0.8", "10.0.0.7"], True),
    ("::1", [], ["0:0:0:0:0:0:0:1"], True),  # the same address however written
    ("[::1]", [], ["::1"], True),
    ("client.example.com", [], [], False),
])
def test_what_names_the_san(wanted: str, dns: list[str], addresses: list[str], named: bool) -> None:
    """envoyproxy/ratelimit src/server/tls.go verifies the client certificate with x509 VerifyOptions{DNSName:
    GRPC_CLIENT_TLS_SAN}: Go's host name rules (DNS SANs, a leftmost wildcard label, IP SANs for an address)."""
    assert names_san(wanted, dns, addresses) is named


async def secure_call(port: int, ca: Path, client: tuple[Path, Path]) -> dict[str, str]:
    """One call of each kind over mutual TLS with ``client``'s certificate: ShouldRateLimit (unary), the health
    service's Check (unary) and Watch (a stream its handler writes itself) and reflection (an async generator's
    stream); each its overall code or health status name, or the gRPC status name of its failure."""
    credentials = grpc.ssl_channel_credentials(ca.read_bytes(), client[1].read_bytes(), client[0].read_bytes())
    answers: dict[str, str] = {}
    async with grpc.aio.secure_channel(f"localhost:{port}", credentials) as channel:
        try:
            reply = await rls_pb2_grpc.RateLimitServiceStub(channel).ShouldRateLimit(
                request("p", descriptor(("user", "san"))), timeout=5)
            answers["rls"] = rls_pb2.RateLimitResponse.Code.Name(reply.overall_code)
        except grpc.aio.AioRpcError as exc:
            answers["rls"] = exc.code().name
        health = health_pb2_grpc.HealthStub(channel)
        try:
            checked = await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
            answers["check"] = health_pb2.HealthCheckResponse.ServingStatus.Name(checked.status)
        except grpc.aio.AioRpcError as exc:
            answers["check"] = exc.code().name
        watch = health.Watch(health_pb2.HealthCheckRequest(), timeout=5)
        try:
            first = await watch.read()
            answers["watch"] = health_pb2.HealthCheckResponse.ServingStatus.Name(first.status)
        except grpc.aio.AioRpcError as exc:
            answers["watch"] = exc.code().name
        finally:
            watch.cancel()
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        stream = stub.ServerReflectionInfo(timeout=5)
        try:
            await stream.write(reflection_pb2.ServerReflectionRequest(list_services=""))
            listed = await stream.read()
            answers["reflection"] = "listed" if listed.list_services_response.service else "empty"
        except grpc.aio.AioRpcError as exc:
            answers["reflection"] = exc.code().name
        finally:
            stream.cancel()
    return answers


async def test_grpc_client_tls_san_refuses_every_call_of_a_certificate_without_it(
        tmp_path: Path, write_config: Callable[..., Path], redis_url: str, key_prefix: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """envoyproxy/ratelimit src/server/server_impl.go: with GRPC_CLIENT_TLS_SAN set, the client certificate must
    name it (src/server/tls.go verifyClient), or the connection is refused; here every call of such a client,
    to every service, is UNAUTHENTICATED."""
    authority = Authority(tmp_path, "ca")
    cert, key = authority.issue("server")
    app = build(Settings.load({}, {"config_dir": str(write_config(CONFIG)), "redis_url": redis_url,
                                   "cache_key_prefix": key_prefix}))
    server, health, port = await start_server(app.service, "127.0.0.1", 0,
                                              server_credentials(str(cert), str(key), str(authority.ca_file)),
                                              client_san="client.example.com")
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    served = {"rls": "OK", "check": "SERVING", "watch": "SERVING", "reflection": "listed"}
    refused = dict.fromkeys(served, "UNAUTHENTICATED")
    try:
        for name, sans, expected in [
            ("exact", ["client.example.com"], served),
            ("wildcard", ["localhost", "*.example.com"], served),
            ("other", ["other.example.com", "localhost", "127.0.0.1"], refused),
            ("common-name-only", [], refused),  # its common name is client.example.com: not a SAN
        ]:
            common_name = "client.example.com" if name == "common-name-only" else name
            client = authority.issue(common_name, sans)
            with caplog.at_level(logging.WARNING, logger="slidegate.tls"):
                assert await secure_call(port, authority.ca_file, client) == expected, name
        assert "without the SAN 'client.example.com' (GRPC_CLIENT_TLS_SAN) was refused" in caplog.text
        assert "named other.example.com, localhost, 127.0.0.1" in caplog.text
    finally:
        await server.stop(0)
        await app.backend.close()


def test_grpc_client_tls_san_is_served_and_needs_mutual_tls(
        tmp_path: Path, write_config: Callable[..., Path], serve: Callable[..., Served]) -> None:
    """envoyproxy/ratelimit src/settings/settings.go GRPC_CLIENT_TLS_SAN, used by src/server/server_impl.go only
    with client certificates (GRPC_CLIENT_TLS_CACERT)."""
    authority = Authority(tmp_path, "ca")
    cert, key = authority.issue("server")
    served = serve(write_config(CONFIG), "--grpc-server-use-tls", "true", "--grpc-server-tls-cert", str(cert),
                   "--grpc-server-tls-key", str(key), "--grpc-client-tls-cacert", str(authority.ca_file),
                   wait=False, env={"GRPC_CLIENT_TLS_SAN": "ratelimit-client.internal"})
    assert wait_for(lambda: call(served.grpc_port, authority.ca_file,
                                 authority.issue("good", ["ratelimit-client.internal"])) == OK, timeout=20)
    assert call(served.grpc_port, authority.ca_file, authority.issue("client")) == "UNAUTHENTICATED"
    with pytest.raises(SettingsError, match="GRPC_CLIENT_TLS_SAN needs mutual TLS"):
        Settings.load({"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": str(cert),
                       "GRPC_SERVER_TLS_KEY": str(key), "GRPC_CLIENT_TLS_SAN": "x"})
