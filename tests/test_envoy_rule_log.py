"""The rule behind each 429, through a real Envoy 1.40: with RESPONSE_DYNAMIC_METADATA, slidegate's answer names
the rules that rejected a request (``rejectedBy``), which Envoy's access log reads from the rate-limit filter's
dynamic metadata; with LIMIT_RULE_HEADER, the client is told them in a header of the 429."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import yaml

from slidegate import stack, upstream

CONFIG = """
domain: demo
descriptors:
  - key: generic_key
    value: demo
    rate_limit: {unit: hour, requests_per_unit: 3, name: everyone}
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 1}
"""
LOG_FORMAT = "%RESPONSE_CODE% %DYNAMIC_METADATA(envoy.filters.http.ratelimit:rejectedBy)%\n"


def with_access_log(config_text: str, path: Path) -> str:
    config = yaml.safe_load(config_text)
    manager = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    manager["access_log"] = [{"name": "envoy.access_loggers.file", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog", "path": str(path),
        "log_format": {"text_format_source": {"inline_string": LOG_FORMAT}}}}]
    return yaml.safe_dump(config)


def get(port: int, headers: dict[str, str]) -> tuple[int, str | None]:
    try:
        with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/", headers=headers),
                                    timeout=10) as reply:
            return reply.status, reply.headers.get("x-ratelimit-rule")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("x-ratelimit-rule")


def test_the_access_log_names_the_rule_behind_every_429_and_none_for_200s(
        write_config: Callable[..., Path], redis_url: str, key_prefix: str, tmp_path: Path) -> None:
    web = upstream.start()
    rls_port, envoy_port, admin_port = stack.free_port(), stack.free_port(), stack.free_port()
    slidegate = stack.start_slidegate(write_config(CONFIG), rls_port, redis_url=redis_url, key_prefix=key_prefix,
                                      extra_args=("--response-dynamic-metadata", "true",
                                                  "--limit-rule-header", "x-ratelimit-rule"))
    log = tmp_path / "access.log"
    try:
        envoy = stack.start_envoy(with_access_log(stack.local_envoy_config(
            listener_port=envoy_port, admin_port=admin_port, rls_port=rls_port, upstream_port=web.server_address[1]),
            log), admin_port)
        try:
            key = {"x-api-key": "k"}
            answers = [get(envoy_port, h) for h in (key, key, {}, {}, {})]
            # all or nothing: the request api_key rejected took none of everyone's 3
            assert answers == [(200, None), (429, "api_key"), (200, None), (200, None), (429, "everyone")]
            deadline = time.monotonic() + 10  # Envoy writes its access log about every second
            lines: list[str] = []
            while len(lines) < 5 and time.monotonic() < deadline:
                time.sleep(0.2)
                lines = log.read_text().splitlines() if log.exists() else []
            assert lines == ["200 -", "429 api_key", "200 -", "200 -", "429 everyone"]
        finally:
            stack.stop(envoy)
    finally:
        stack.stop(slidegate)
        web.shutdown()
