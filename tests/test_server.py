"""`slidegate serve` as a process: settings from flags and environment, start-up errors, the port, the log,
and many calls in flight at once."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from slidegate import stack
from slidegate.backends.redis import redact
from slidegate.keys import limit_key
from slidegate.protos import rls_pb2, rls_pb2_grpc
from slidegate.service import METHOD
from slidegate.settings import SPECS, Settings, SettingsError
from tests.helpers import OK, OVER_LIMIT, descriptor, request

CONFIG = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 150}\n"


def serve(config_dir: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 20) -> (
        subprocess.CompletedProcess[str]):
    return subprocess.run([sys.executable, "-m", "slidegate", "serve", "--config", str(config_dir),
                           "--http-host", "127.0.0.1", "--http-port", "0", "--debug-host", "127.0.0.1",
                           "--debug-port", "0", *args],
                          capture_output=True, text=True, timeout=timeout, env={**SETTLED, **(env or {})})


# the settings' defaults are what these tests expect: none of the suite's own (REDIS_URL and the like) leaks in
SETTLED = {name: value for name, value in os.environ.items() if not name.startswith("REDIS_")}


@pytest.mark.parametrize(("args", "message"), [
    (("--redis-url", "foo://x"),
     "--redis-url / REDIS_URL: Redis URL 'foo://x' must start with redis://, rediss:// or unix://"),
    (("--redis-url", "redis://127.0.0.1:6379/abc"), "Redis URL 'redis://127.0.0.1:6379/abc': the database 'abc' "
                                                    "is not a whole number"),
    (("--redis-url", "redis://127.0.0.1:6379/1/5"), "the database '1/5' is not a whole number"),
    (("--redis-url", "redis://127.0.0.1:6379/-1"), "the database '-1' is not a whole number"),
    (("--redis-url", "localhost:99999"), "Redis URL 'redis://localhost:99999': Port out of range"),
    (("--redis-url", "redis://127.0.0.1:99999/0"),
     "--redis-url / REDIS_URL: Redis URL 'redis://127.0.0.1:99999/0': Port out of range"),
    (("--redis-url", "redis://:s3cret@127.0.0.1:99999/0"), "Redis URL 'redis://:***@127.0.0.1:99999/0'"),
    (("--redis-timeout", "0"), "--redis-timeout / REDIS_TIMEOUT (from the flag): '0' must be at least 1 ms and "
                               "at most 60 s"),
    (("--redis-timeout", "1us"), "'1us' must be at least 1 ms and at most 60 s"),
    (("--redis-timeout", "soon"), "invalid duration 'soon' (use e.g. 250ms or 0.25s)"),
    (("--grpc-port", "abc"), "--grpc-port / GRPC_PORT (from the flag): 'abc' is not a whole number"),
    (("--grpc-max-recv-msg-size", "100"), "--grpc-max-recv-msg-size / GRPC_MAX_RECV_MSG_SIZE (from the flag): 100 "
                                          "must be at least 4096 (bytes) and at most 2147483647"),
    (("--workers", "-1"), "--workers / WORKERS (from the flag): -1 is negative"),
    (("--default-algorithm", "leaky"), "--default-algorithm / DEFAULT_ALGORITHM (from the flag): 'leaky' is not "
                                       "one of sliding_window_log, sliding_window_counter, token_bucket, "
                                       "fixed_window"),
    (("--shadow-mode", "perhaps"), "--shadow-mode / SHADOW_MODE (from the flag): 'perhaps' is not true or false"),
    (("--grpc-server-use-tls", "true"), "GRPC_SERVER_USE_TLS needs --grpc-server-tls-cert / GRPC_SERVER_TLS_CERT"),
    (("--redis-type", "cluster"), "cluster REDIS_URL 'redis://127.0.0.1:6379/0' must be host:port"),
])
def test_bad_settings_fail_clearly(write_config: Callable[..., Path], args: tuple[str, ...], message: str) -> None:
    done = serve(write_config(CONFIG), "--grpc-port", str(stack.free_port()), *args)
    assert done.returncode != 0
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_environment_variables_and_the_log(write_config: Callable[..., Path], redis_url: str, key_prefix: str) -> None:
    port = stack.free_port()
    env = {"GRPC_PORT": str(port), "GRPC_HOST": "127.0.0.1", "REDIS_URL": redis_url, "CACHE_KEY_PREFIX": key_prefix,
           "DEFAULT_ALGORITHM": "fixed_window", "HOST": "127.0.0.1", "PORT": "0", "DEBUG_HOST": "127.0.0.1",
           "DEBUG_PORT": "0"}
    process = subprocess.Popen(
        [sys.executable, "-m", "slidegate", "serve", "--config", str(write_config(CONFIG))],
        env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        stack.wait_grpc_serving(port)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            reply = rls_pb2_grpc.RateLimitServiceStub(channel).ShouldRateLimit(request("d", descriptor(("k", "v"))))
    finally:
        stack.stop(process)
    log = process.stdout.read() if process.stdout else ""
    assert reply.statuses[0].limit_remaining == 149
    # DEFAULT_ALGORITHM took effect: the limit is kept as a fixed window
    client = redis.Redis.from_url(redis_url)
    assert [k.decode() for k in client.scan_iter(match=f"{key_prefix}*")] == [f"{key_prefix}fixed_window{{1:d1:k1:v}}"]
    client.close()
    assert re.search(rf"listening for gRPC on 127.0.0.1:{port}, HTTP on 127.0.0.1:\d+, debug on 127.0.0.1:\d+; "
                     r"domains loaded: 1, limits: 1, from ", log), log
    assert f"storage: redis at {redis_url}" in log
    assert process.returncode == 0


def test_defaults_and_precedence() -> None:
    defaults = Settings.load({})
    assert (defaults.grpc_port, defaults.redis.url, defaults.http_port, defaults.debug_port) == (
        8081, "redis://127.0.0.1:6379/0", 8080, 6070)
    assert defaults.config_path == Path("/srv/runtime_data/current/config")
    env = {"GRPC_PORT": "9000", "RUNTIME_ROOT": "/r", "RUNTIME_SUBDIRECTORY": "s", "SHADOW_MODE": "TRUE"}
    from_env = Settings.load(env)
    assert (from_env.grpc_port, from_env.config_path, from_env.shadow_mode) == (9000, Path("/r/s/config"), True)
    assert Settings.load(env, {"grpc_port": "9100", "config_dir": "/c"}).grpc_port == 9100
    assert Settings.load(env, {"config_dir": "/c"}).config_path == Path("/c")
    with pytest.raises(SettingsError) as caught:
        Settings.load({"GRPC_PORT": "70000", "NEAR_LIMIT_RATIO": "2", "LOG_FORMAT": "xml"})
    assert str(caught.value).splitlines()[1:] == [
        "  --grpc-port / GRPC_PORT (from the environment): 70000 is not a port (0-65535)",
        "  --log-format / LOG_FORMAT (from the environment): 'xml' is not one of text, json",
        "  --near-limit-ratio / NEAR_LIMIT_RATIO (from the environment): 2.0 must be more than 0 and at most 1",
    ]


def test_envoyproxy_ratelimit_values_carry_over() -> None:
    # its REDIS_URL is host:port (or a socket path with REDIS_SOCKET_TYPE=unix), its LOG_LEVEL logrus's names
    assert Settings.load({"REDIS_URL": "redis.internal:6380"}).redis.url == "redis://redis.internal:6380"
    assert Settings.load({"REDIS_URL": "/run/redis.sock", "REDIS_SOCKET_TYPE": "unix"}).redis.url == (
        "unix:///run/redis.sock")
    relative = Settings.load({"REDIS_URL": "redis.sock", "REDIS_SOCKET_TYPE": "unix"}).redis.url
    assert relative == f"unix://{Path.cwd() / 'redis.sock'}"
    with pytest.raises(SettingsError, match="names no socket path"):
        Settings.load({"REDIS_URL": "unix://redis.sock"})  # the name is taken for a host
    assert Settings.load({"REDIS_URL": "rediss://r:6380"}).redis.url == "rediss://r:6380"
    assert Settings.load({"REDIS_TYPE": "cluster", "REDIS_URL": "a:1,b:2"}).redis.url == "a:1,b:2"
    assert [Settings.load({"LOG_LEVEL": level}).log_level for level in ("WARN", "trace", "Info", "panic")] == [
        "warning", "debug", "info", "error"]
    with pytest.raises(SettingsError, match="'loud' is not one of debug, info, warn"):
        Settings.load({"LOG_LEVEL": "loud"})


def test_the_settings_table_lists_every_setting() -> None:
    page = (Path(__file__).resolve().parent.parent / "docs" / "configuration.md").read_text()
    rows = re.findall(r"^\| `(--[a-z0-9-]+)` \| `([A-Z_]+)` \| (.*?) \|", page, re.MULTILINE)
    assert [(flag, env) for flag, env, _ in rows] == [(s.flag, s.env) for s in SPECS]
    for (_, _, default), spec in zip(rows, SPECS, strict=True):
        assert default == (f"`{spec.default}`" if spec.default else "(empty)"), spec.env


def test_a_taken_port_is_an_error(write_config: Callable[..., Path], redis_url: str) -> None:
    directory = write_config(CONFIG)
    port = stack.free_port()
    first = stack.start_slidegate(directory, port, redis_url=redis_url)
    try:
        done = serve(directory, "--host", "127.0.0.1", "--grpc-port", str(port), "--redis-url", redis_url)
    finally:
        stack.stop(first)
    assert done.returncode == 1
    assert f"cannot start: cannot listen on 127.0.0.1:{port}" in done.stderr


async def test_many_calls_in_flight_are_all_decided(write_config: Callable[..., Path], redis_url: str,
                                                    key_prefix: str) -> None:
    port = stack.free_port()
    process = stack.start_slidegate(write_config(CONFIG), port, redis_url=redis_url, key_prefix=key_prefix,
                                    extra_args=("--redis-timeout", "5s"))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = rls_pb2_grpc.RateLimitServiceStub(channel)
            replies = await asyncio.gather(*(
                stub.ShouldRateLimit(request("d", descriptor(("k", "burst"))), timeout=30) for _ in range(400)))
    finally:
        stack.stop(process)
    codes = [r.overall_code for r in replies]
    assert (codes.count(OK), codes.count(OVER_LIMIT)) == (150, 250)


async def test_malformed_and_oversized_requests(rls: Callable[..., object]) -> None:
    stub = await rls(CONFIG)  # type: ignore[misc]
    raw = stub.channel.unary_unary(METHOD, request_serializer=lambda b: b,
                                   response_deserializer=rls_pb2.RateLimitResponse.FromString)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await raw(b"\xff\xff\xff\xff")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # the reason names the message the caller sent, not the lenient type it is read with (service.py)
    details = caught.value.details() or ""
    assert details.startswith("malformed RateLimitRequest: ")
    assert "Lenient" not in details and "slidegate.wire" not in details
    cases = [
        (request("d", *[descriptor(("k", str(i))) for i in range(1001)]), "too many descriptors: 1001 (at most 1000)"),
        (request("d", descriptor(*[("k", "v")] * 65)), "descriptor 0: too many entries: 65 (at most 64)"),
    ]
    for req, reason in cases:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.ShouldRateLimit(req)
        assert (caught.value.code(), caught.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, reason)


def test_redact_hides_passwords() -> None:
    assert redact("redis://:pw@h:1/0") == "redis://:***@h:1/0"
    assert redact("redis://user:pw@h:1/0") == "redis://user:***@h:1/0"
    assert redact("redis://h:1/0?password=pw&db=2") == "redis://h:1/0?password=***&db=2"
    assert redact("redis://h:1/0") == "redis://h:1/0"


entries = st.lists(st.tuples(st.text(max_size=6), st.text(max_size=6)), max_size=4)


@given(a=st.tuples(st.text(max_size=6), entries), b=st.tuples(st.text(max_size=6), entries))
def test_keys_are_injective(a: tuple[str, list[tuple[str, str]]], b: tuple[str, list[tuple[str, str]]]) -> None:
    assert (limit_key("p:", "alg", a[0], a[1]) == limit_key("p:", "alg", b[0], b[1])) == (a == b)


def test_serve_without_a_config_says_how_to_give_one(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "slidegate", "serve"], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "RUNTIME_ROOT": str(tmp_path / "nowhere")})
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"config directory {tmp_path}/nowhere/config does not exist: pass the directory of your limits' YAML files "
        "with --config / CONFIG_DIR (or RUNTIME_ROOT, RUNTIME_SUBDIRECTORY and RUNTIME_APPDIRECTORY, whose directory "
        "this is)")
