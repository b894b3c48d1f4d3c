"""`slidegate serve` with the whole environment Envoy Gateway gives its rate-limit container at once (issue 17):
its variables as it sets them (paths and host:ports adapted to the test), under a read-only root with every
capability dropped (tests/test_read_only_root.py), the limits over xDS from the test ADS server
(tests/ads_server.py) with mutual TLS, one certificate pair serving both the gRPC listener and the xDS client."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from slidegate import stack
from tests.ads_server import AdsServer
from tests.certs import Authority
from tests.helpers import OK, OVER_LIMIT
from tests.served import Served, wait_for
from tests.test_read_only_root import DROP_ALL
from tests.test_tls import call  # domain "p", descriptor user=tls, over TLS
from tests.test_xds import invalid, limit


def gateway_env(place: Path, certs: dict[str, Path], xds_port: int, redis_url: str,
                ports: dict[str, int]) -> dict[str, str]:
    """Envoy Gateway's environment of its rate-limit container (its ratelimit deployment's, as of v1.x), with its
    paths in ``place`` and its host:ports this test's."""
    redis = urllib.parse.urlsplit(redis_url)
    return {
        "RUNTIME_ROOT": str(place / "data"), "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_IGNOREDOTFILES": "true",
        "RUNTIME_WATCH_ROOT": "false", "LOG_LEVEL": "info", "USE_STATSD": "false", "CONFIG_TYPE": "GRPC_XDS_SOTW",
        # envoy-gateway:18001 there; the client checks the name it dials, as there
        "CONFIG_GRPC_XDS_SERVER_URL": f"localhost:{xds_port}", "CONFIG_GRPC_XDS_NODE_ID": "envoy-ratelimit",
        "GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": str(certs["cert"]),
        "GRPC_SERVER_TLS_KEY": str(certs["key"]), "GRPC_SERVER_TLS_CA_CERT": str(certs["ca"]),
        "CONFIG_GRPC_XDS_SERVER_USE_TLS": "true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT": str(certs["cert"]),
        "CONFIG_GRPC_XDS_CLIENT_TLS_KEY": str(certs["key"]), "CONFIG_GRPC_XDS_SERVER_TLS_CACERT": str(certs["ca"]),
        "FORCE_START_WITHOUT_INITIAL_CONFIG": "true", "REDIS_SOCKET_TYPE": "tcp",
        "REDIS_URL": f"{redis.hostname}:{redis.port or 6379}", "USE_PROMETHEUS": "true",
        "PROMETHEUS_ADDR": f":{ports['metrics']}", "PROMETHEUS_MAPPER_YAML": str(certs["ca"]),  # any existing file
        # not Envoy Gateway's: the test's free ports (8081, 8080, 6070 there)
        "GRPC_PORT": str(ports["grpc"]), "PORT": str(ports["http"]), "DEBUG_PORT": str(ports["debug"]),
    }


@pytest.fixture
def place(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path`` with ``certs/`` and ``locked/``, which the server cannot write (0555)."""
    (tmp_path / "certs").mkdir()
    (tmp_path / "locked").mkdir(mode=0o555)
    yield tmp_path
    (tmp_path / "locked").chmod(0o755)


def test_serve_with_envoy_gateways_environment(place: Path, redis_url: str, key_prefix: str) -> None:
    ca = Authority(place / "certs", "ca")
    cert, key = ca.issue("envoy-ratelimit")  # localhost and 127.0.0.1: this test's names for it
    xds_cert, xds_key = ca.issue("envoy-gateway")  # for localhost, the name the xDS client dials
    ads = AdsServer(grpc.ssl_server_credentials([(xds_key.read_bytes(), xds_cert.read_bytes())],
                                                root_certificates=ca.ca_file.read_bytes(),
                                                require_client_auth=True))
    ads.set([limit("p", "user", 2)])
    ads.start()
    ports = {name: stack.free_port() for name in ("grpc", "http", "debug", "metrics")}
    env = {**os.environ, **gateway_env(place, {"cert": cert, "key": key, "ca": ca.ca_file}, ads.port, redis_url,
                                       ports),
           "TMPDIR": str(place / "locked"), "CACHE_KEY_PREFIX": key_prefix, "PYTHONDONTWRITEBYTECODE": "1"}
    log = tempfile.TemporaryFile()  # noqa: SIM115 - closed at the end
    process = subprocess.Popen([*DROP_ALL, sys.executable, "-m", "slidegate", "serve"], cwd=place / "locked",
                               env=env, stdout=log, stderr=subprocess.STDOUT)
    served = Served(process, ports["grpc"], ports["http"], ports["debug"], log)
    client = (cert, key)  # Envoy's certificate there; any the CA signed

    def rlconfig() -> str:
        return served.http("/rlconfig", port=served.debug_port)[1]

    def acked(version: str) -> bool:
        """An ACK: the version, the nonce of a response that brought it, no error."""
        nonces = {response.nonce for _, response in ads.sent if response.version_info == version}
        return any(r.version_info == version and r.response_nonce in nonces and not r.HasField("error_detail")
                   for r in ads.requests())

    try:
        assert wait_for(lambda: rlconfig().startswith("xds version 1\ndomain p (p):\n"), 30), served.output()[-3000:]
        assert [call(served.grpc_port, ca.ca_file, client) for _ in range(3)] == [OK, OK, OVER_LIMIT]
        assert wait_for(lambda: acked("1"))
        first = ads.requests()[0]
        assert first.node.id == "envoy-ratelimit" and first.version_info == ""

        ads.set([limit("p", "user", 10)])  # the limit raised: the next call is under it
        assert wait_for(lambda: rlconfig().startswith("xds version 2\n"), 10) and wait_for(lambda: acked("2"))
        assert "10/minute" in rlconfig()
        assert call(served.grpc_port, ca.ca_file, client) == OK

        ads.set([invalid("broken")])  # NACKed with why; version 2 stays in force
        assert wait_for(lambda: any(r.HasField("error_detail") for r in ads.requests()), 10)
        nack = next(r for r in ads.requests() if r.HasField("error_detail"))
        assert nack.version_info == "2" and nack.response_nonce == ads.sent[-1][1].nonce
        assert "broken: descriptors[0].rate_limit.unit: is required" in nack.error_detail.message
        assert rlconfig().startswith("xds version 2\n") and call(served.grpc_port, ca.ca_file, client) == OK

        ads.stop()  # the control plane goes away: the limits are still served
        assert wait_for(lambda: "dialling again" in served.output(), 10)
        assert rlconfig().startswith("xds version 2\n") and call(served.grpc_port, ca.ca_file, client) == OK
        ads.set([limit("p", "user", 1)])  # version 4, from the server back on the same port
        ads.start()
        # the first redial comes after XDS_CLIENT_BACKOFF_INITIAL_INTERVAL (10 s) ± half of it
        assert wait_for(lambda: rlconfig().startswith("xds version 4\n"), 30), served.output()[-3000:]
        assert wait_for(lambda: acked("4")) and len({r.stream for r in ads.received}) >= 2
        assert call(served.grpc_port, ca.ca_file, client) == OVER_LIMIT

        assert served.http("/healthcheck") == (200, "OK")
        status, body = served.http("/metrics", port=ports["metrics"])
        assert status == 200 and 'ratelimit_service_rate_limit_total_hits_total{domain="p",key="user"}' in body
        warning = next(line for line in served.output().splitlines()
                       if "envoyproxy/ratelimit settings this service does not read" in line)
        assert "GRPC_SERVER_TLS_CA_CERT (ignored" in warning and "PROMETHEUS_MAPPER_YAML (mapped" in warning
        assert list((place / "locked").iterdir()) == [] and process.poll() is None
    finally:
        stack.stop(process)
        log.close()
        ads.stop()
