"""docker-compose.yml and the Dockerfile agree with envoy/envoy.yaml (Docker cannot run here, so the files are
checked against each other)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from slidegate.config import load_directory

ROOT = Path(__file__).resolve().parent.parent


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services: dict[str, Any] = data["services"]
    return services


def envoy_config() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "envoy" / "envoy.yaml").read_text())
    return data


def volumes(service: dict[str, Any]) -> dict[str, str]:
    """container path -> host path (relative to the repository)."""
    out = {}
    for volume in service.get("volumes", []):
        host, container, *_ = volume.split(":")
        out[container] = host
    return out


def test_envoy_clusters_point_at_compose_services() -> None:
    services = compose()
    endpoints = {
        c["name"]: c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
        for c in envoy_config()["static_resources"]["clusters"]
    }
    assert endpoints["ratelimit"]["address"] == "slidegate"
    assert str(endpoints["ratelimit"]["port_value"]) == services["slidegate"]["environment"]["GRPC_PORT"]
    assert endpoints["upstream"]["address"] == "upstream"
    port = services["upstream"]["entrypoint"][services["upstream"]["entrypoint"].index("--port") + 1]
    assert str(endpoints["upstream"]["port_value"]) == port
    assert services["slidegate"]["environment"]["REDIS_URL"].startswith("redis://redis:")


def test_envoy_ports_and_config_path() -> None:
    service = compose()["envoy"]
    config = envoy_config()
    listener = config["static_resources"]["listeners"][0]["address"]["socket_address"]["port_value"]
    admin = config["admin"]["address"]["socket_address"]["port_value"]
    assert {f"{listener}:{listener}", f"{admin}:{admin}"} == set(service["ports"])
    path = service["command"][service["command"].index("-c") + 1]
    assert volumes(service)[path] == "./envoy/envoy.yaml"
    assert service["image"].startswith("envoyproxy/envoy:v1.40")


def test_slidegate_config_volume_loads_and_matches_the_command() -> None:
    service = compose()["slidegate"]
    path = service["command"][service["command"].index("--config") + 1]
    host = volumes(service)[path].removesuffix(":ro")
    domains = load_directory(ROOT / host).domains
    filter_domain = envoy_config()["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"]["http_filters"][0]["typed_config"]["domain"]
    assert filter_domain in domains
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f'CMD ["serve", "--config", "{path}"]' in dockerfile


def test_dockerfile_copies_what_exists() -> None:
    for source in re.findall(r"^COPY (\S+(?: \S+)*) \S+$", (ROOT / "Dockerfile").read_text(), re.MULTILINE):
        for name in source.split():
            assert (ROOT / name).exists(), name


def test_the_image_answers_to_envoy_gateways_command() -> None:
    """Envoy Gateway runs the rate-limit container as ``/bin/ratelimit`` with no arguments: the image puts the
    wrapper there, and the wrapper is `slidegate serve` (run here with this checkout's slidegate on PATH)."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "COPY deploy/docker/ratelimit /usr/local/bin/ratelimit" in dockerfile
    assert re.search(r"^RUN chmod 0755 /usr/local/bin/ratelimit && ln -s /usr/local/bin/ratelimit /bin/ratelimit$",
                     dockerfile, re.MULTILINE)
    assert dockerfile.index("COPY deploy/docker/ratelimit") < dockerfile.index("USER nobody")
    wrapper = ROOT / "deploy" / "docker" / "ratelimit"
    assert os.access(wrapper, os.X_OK)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    shown = subprocess.run([str(wrapper), "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert shown.returncode == 0 and "Serve envoy.service.ratelimit.v3.RateLimitService" in shown.stdout
    # no arguments: serve from the environment, as Envoy Gateway starts it (RUNTIME_ROOT=/data …)
    started = subprocess.run([str(wrapper)], capture_output=True, text=True, timeout=60,
                             env={**env, "RUNTIME_ROOT": "/nonexistent/data", "RUNTIME_SUBDIRECTORY": "ratelimit"})
    assert started.returncode == 1
    assert "config directory /nonexistent/data/ratelimit/config does not exist" in started.stderr
