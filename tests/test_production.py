"""Running slidegate in production: HTTP endpoints, health, hot reload, metrics, response headers, reflection,
JSON logs and the client command — against `slidegate serve` processes and real Redis."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from redis.backoff import NoBackoff
from redis.retry import Retry

from slidegate.protos import lenient_pb2, rls_pb2, rls_pb2_grpc
from slidegate.service import METHOD
from tests.helpers import OK, OVER_LIMIT, descriptor, request
from tests.redis_servers import RedisServer
from tests.served import Served, wait_for

CONFIG = """
domain: p
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2, name: per-user}
  - key: path
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 100}
"""


def json_request(domain: str, *entries: tuple[str, str]) -> bytes:
    return json.dumps({"domain": domain, "descriptors": [
        {"entries": [{"key": k, "value": v} for k, v in entries]}]}).encode()


def test_http_api(write_config: Callable[..., Path], serve: Callable[..., Served]) -> None:
    served = serve(write_config(CONFIG))
    assert served.http("/healthcheck") == (200, "OK")
    codes = [served.http("/json", json_request("p", ("user", "h")))[0] for _ in range(3)]
    assert codes == [200, 200, 429]
    status, body = served.http("/json", json_request("p", ("user", "h2")))
    assert json.loads(body)["statuses"][0]["currentLimit"] == {
        "requestsPerUnit": 2, "unit": "MINUTE", "name": "per-user"}
    served.http("/json", json_request("p", ("user", "h2")))
    status, body = served.http("/json", json_request("p", ("user", "h2")))
    # every field, zeros too: limitRemaining 0 is an answer (proto3's JSON leaves zeros out by default)
    assert status == 429 and json.loads(body)["statuses"][0]["limitRemaining"] == 0
    status, body = served.http("/json", b"{not json")
    assert status == 400 and json.loads(body)["error"].startswith("the body is not JSON: ")
    for document, kind in ((None, "null"), ([], "list"), (7, "int")):
        status, body = served.http("/json", json.dumps(document).encode())
        assert (status, json.loads(body)) == (
            400, {"error": f"the body must be a JSON object (a RateLimitRequest), not {kind}"})
    status, body = served.http("/json", json.dumps({"domain": "p"}).encode())
    assert (status, json.loads(body)) == (400, {"error": "rate limit descriptor list must not be empty"})
    # every error of the HTTP API is JSON, aiohttp's own too
    status, body = served.http("/json")
    assert (status, json.loads(body)) == (405, {"error": "Method Not Allowed"})
    status, body = served.http("/nothing-here")
    assert (status, json.loads(body)) == (404, {"error": "Not Found"})
    status, body = served.http("/rlconfig")
    assert status == 200 and "  [user] 2/minute sliding_window_log name=per-user" in body
    # the debug port serves the limits and the metrics too, but not decisions
    assert served.http("/rlconfig", port=served.debug_port) == (200, body)
    assert served.http("/json", json_request("p", ("user", "x")), port=served.debug_port)[0] == 404


def test_metrics_are_named_as_the_reference_and_bounded(write_config: Callable[..., Path],
                                                         serve: Callable[..., Served]) -> None:
    served = serve(write_config(CONFIG))
    stub = served.stub()
    for _ in range(3):
        stub.ShouldRateLimit(request("p", descriptor(("user", "m"))))
    for i in range(50):  # 50 values of one wildcard rule: one series
        stub.ShouldRateLimit(request("p", descriptor(("path", f"/api/{i}"))))
    status, text = served.http("/metrics", port=served.debug_port)
    assert status == 200
    assert 'ratelimit_service_rate_limit_total_hits_total{domain="p",key="user"} 3.0' in text
    assert 'ratelimit_service_rate_limit_within_limit_total{domain="p",key="user"} 2.0' in text
    assert 'ratelimit_service_rate_limit_near_limit_total{domain="p",key="user"} 1.0' in text
    assert 'ratelimit_service_rate_limit_over_limit_total{domain="p",key="user"} 1.0' in text
    assert 'ratelimit_service_rate_limit_total_hits_total{domain="p",key="path_/api/*"} 50.0' in text
    assert len(re.findall(r'^ratelimit_service_rate_limit_total_hits_total\{', text, re.MULTILINE)) == 2
    assert "ratelimit_config_load_success_total 1.0" in text
    assert "ratelimit_should_rate_limit_latency_seconds_count 53.0" in text
    status, main_port_text = served.http("/metrics")
    assert status == 200 and "ratelimit_config_load_success_total 1.0" in main_port_text


def test_hot_reload_swaps_valid_config_and_keeps_it_on_errors(write_config: Callable[..., Path],
                                                              serve: Callable[..., Served]) -> None:
    directory = write_config(CONFIG)
    served = serve(directory)
    stub = served.stub()
    assert stub.ShouldRateLimit(request("p", descriptor(("user", "r")))).statuses[0].limit_remaining == 1
    (directory / "config.yaml").write_text(CONFIG.replace("requests_per_unit: 2", "requests_per_unit: 5"))
    check = request("p", descriptor(("user", "r"), hits=0))  # check only: polling consumes nothing
    assert wait_for(lambda: stub.ShouldRateLimit(check).statuses[0].current_limit.requests_per_unit == 5)
    assert stub.ShouldRateLimit(check).statuses[0].limit_remaining == 4  # the counter survived: 1 of the new 5
    (directory / "config.yaml").write_text(
        "domain: p\ndescriptors:\n  - key: user\n    rate_limit: {unit: lightyear}\n")
    assert wait_for(lambda: "ratelimit_config_load_error_total 1.0" in served.http("/metrics")[1])
    reply = stub.ShouldRateLimit(request("p", descriptor(("user", "r2"))))
    assert reply.statuses[0].current_limit.requests_per_unit == 5  # the old config stays
    assert "config.yaml:4: descriptors[0].rate_limit.unit: unknown unit 'lightyear'" in served.output()
    # put back as it was in force: said, so the error is not the last word
    (directory / "config.yaml").write_text(CONFIG.replace("requests_per_unit: 2", "requests_per_unit: 5"))
    assert wait_for(lambda: "config files are back to the config in force" in served.output())
    (directory / "config.yaml").unlink()  # no file at all: no limits, and the log says so
    assert wait_for(lambda: "no domain in" in served.output() and "answered OK with no limit" in served.output())
    assert not stub.ShouldRateLimit(check).statuses[0].HasField("current_limit")


def test_kubernetes_configmap_symlink_swap(tmp_path: Path, serve: Callable[..., Served]) -> None:
    # a ConfigMap volume: files are links into ..data, itself a link swapped atomically to a new directory
    volume = tmp_path / "volume"
    volume.mkdir()
    (volume / "..v1").mkdir()
    (volume / "..v1" / "limits.yaml").write_text(CONFIG)
    (volume / "..data").symlink_to("..v1")
    (volume / "limits.yaml").symlink_to("..data/limits.yaml")
    served = serve(volume)
    stub = served.stub()
    limit = stub.ShouldRateLimit(request("p", descriptor(("user", "k")))).statuses[0].current_limit
    assert limit.requests_per_unit == 2
    (volume / "..v2").mkdir()
    (volume / "..v2" / "limits.yaml").write_text(CONFIG.replace("requests_per_unit: 2", "requests_per_unit: 7"))
    (volume / "..data_tmp").symlink_to("..v2")
    os.replace(volume / "..data_tmp", volume / "..data")
    shutil.rmtree(volume / "..v1")
    assert wait_for(lambda: stub.ShouldRateLimit(
        request("p", descriptor(("user", "k")))).statuses[0].current_limit.requests_per_unit == 7)


def test_health_waits_for_storage_and_ends_at_sigterm(write_config: Callable[..., Path],
                                                      serve: Callable[..., Served]) -> None:
    redis_server = RedisServer()  # not started yet: slidegate comes up before its Redis
    try:
        served = serve(write_config(CONFIG), "--redis-timeout", "2s", url=redis_server.url, wait=False)
        assert wait_for(lambda: served.http("/healthcheck")[0] == 503)
        with grpc.insecure_channel(f"127.0.0.1:{served.grpc_port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for name in ("", "ratelimit"):
                assert health.Check(health_pb2.HealthCheckRequest(service=name)).status == \
                    health_pb2.HealthCheckResponse.NOT_SERVING
            redis_server.start()
            assert wait_for(lambda: health.Check(health_pb2.HealthCheckRequest(service="ratelimit")).status
                            == health_pb2.HealthCheckResponse.SERVING)
        assert served.http("/healthcheck") == (200, "OK")
        # a call in flight when SIGTERM comes: the health check says NOT SERVING while it drains
        blocker = subprocess.Popen([sys.executable, "-c", f"import redis; redis.Redis(port={redis_server.port})"
                                    ".execute_command('DEBUG', 'SLEEP', '2')"])
        probe = redis.Redis(port=redis_server.port, socket_timeout=0.05, retry=Retry(NoBackoff(), 0))

        def busy() -> bool:
            try:
                probe.ping()
                return False
            except redis.TimeoutError:
                return True

        assert wait_for(busy)  # Redis is asleep now
        call = served.stub().ShouldRateLimit.future(request("p", descriptor(("user", "d"))), timeout=10)
        time.sleep(0.1)
        served.process.send_signal(signal.SIGTERM)
        assert wait_for(lambda: served.http("/healthcheck")[0] == 503, timeout=1.0)
        assert call.result().overall_code == OK
        blocker.wait(10)
        assert served.process.wait(10) == 0
    finally:
        redis_server.cleanup()


def test_response_headers(write_config: Callable[..., Path], serve: Callable[..., Served]) -> None:
    served = serve(write_config(CONFIG), "--limit-response-headers-enabled", "true",
                   "--limit-response-headers-ietf", "true")
    stub = served.stub()
    first = stub.ShouldRateLimit(request("p", descriptor(("user", "hd")), descriptor(("path", "/api/x"))))
    headers = {h.key: h.value for h in first.response_headers_to_add}
    assert headers["RateLimit-Limit"] == "2, 2;w=60, 100;w=60"
    assert headers["RateLimit-Remaining"] == "1"
    assert headers["RateLimit-Reset"] == "60"
    assert headers["RateLimit-Policy"] == '"per-user";q=2;w=60, "path";q=100;w=60'
    assert headers["RateLimit"] == '"per-user";r=1;t=60'
    assert "Retry-After" not in headers
    stub.ShouldRateLimit(request("p", descriptor(("user", "hd"))))
    over = stub.ShouldRateLimit(request("p", descriptor(("user", "hd"))))
    headers = {h.key: h.value for h in over.response_headers_to_add}
    assert over.overall_code == OVER_LIMIT
    assert headers["RateLimit-Remaining"] == "0" and 58 <= int(headers["Retry-After"]) <= 60


def test_debug_logs_written_beside_the_config_stay_quiet(write_config: Callable[..., Path],
                                                        serve: Callable[..., Served]) -> None:
    # the config directory's parent is watched (RUNTIME_WATCH_ROOT): a log file there is a change too, and the
    # watcher's own debug line about it was another one, without end
    directory = write_config(CONFIG)
    log_path = directory.parent / "slidegate.log"
    served = serve(directory, "--log-level", "debug", log_path=log_path)
    served.stub().ShouldRateLimit(request("p", descriptor(("user", "quiet"))))
    time.sleep(1.0)
    size = log_path.stat().st_size
    time.sleep(1.0)
    assert log_path.stat().st_size == size
    assert "decision " in served.output() and "watchfiles" not in served.output()


def test_reflection_json_logs_and_the_client_command(write_config: Callable[..., Path],
                                                     serve: Callable[..., Served]) -> None:
    served = serve(write_config(CONFIG), "--log-format", "json", "--log-level", "debug")
    with grpc.insecure_channel(f"127.0.0.1:{served.grpc_port}") as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        answers = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        names = {s.name for answer in answers for s in answer.list_services_response.service}
    assert "envoy.service.ratelimit.v3.RateLimitService" in names and "grpc.health.v1.Health" in names
    target = f"127.0.0.1:{served.grpc_port}"
    client = [sys.executable, "-m", "slidegate", "client", "--target", target, "--domain", "p"]
    first = subprocess.run([*client, "--descriptor", "user=c", "--descriptor", "path=/api/1,x=y"],
                           capture_output=True, text=True, timeout=30)
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines()[0] == "overall: OK"
    assert re.search(r"^0\s+user=c\s+OK\s+2/60s\s+per-user\s+1\s+60\.000$", first.stdout, re.MULTILINE), first.stdout
    assert re.search(r"^1\s+path=/api/1,x=y\s+OK\s+-\s+-\s+-\s+-$", first.stdout, re.MULTILINE), first.stdout
    over = subprocess.run([*client, "--descriptor", "user=c", "--hits", "5", "--json"],
                          capture_output=True, text=True, timeout=30)
    decision = json.loads(over.stdout)
    assert over.returncode == 1 and decision["allowed"] is False and decision["retry_after"] == 60
    assert decision["descriptors"][0]["over"] is True and decision["descriptors"][0]["limit"] == 2
    bad = subprocess.run([*client[:-2], "--descriptor", "user=c"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "Missing option '--domain'" in bad.stderr
    lines = [json.loads(line) for line in served.output().splitlines() if line.startswith("{")]
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    decisions = [line for line in lines if line["message"].startswith("decision ")]
    assert decisions[0]["domain"] == "p" and decisions[0]["codes"] == ["OK", "OK"]
    assert decisions[0]["descriptors"] == [["user=c"], ["path=/api/1", "x=y"]]


def test_redis_auth(write_config: Callable[..., Path], serve: Callable[..., Served]) -> None:
    password = "p@ss/w#rd:x"  # characters a URL would need quoted
    server = RedisServer()
    server.extra_args = ("--requirepass", password)
    server.start(password=password)
    try:
        served = serve(write_config(CONFIG), "--redis-auth", f"default:{password}", url=server.url)
        assert served.stub().ShouldRateLimit(request("p", descriptor(("user", "a")))).overall_code == OK
        wrong = serve(write_config(CONFIG), "--redis-auth", "nope", url=server.url, wait=False)
        assert wait_for(lambda: wrong.http("/healthcheck")[0] == 503)
        assert wait_for(lambda: "health: the storage does not answer" in wrong.output())
        with pytest.raises(grpc.RpcError) as caught:
            wrong.stub().ShouldRateLimit(request("p", descriptor(("user", "a"))), timeout=5)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "ratelimit_storage_errors_total 1.0" in wrong.http("/metrics")[1]
        assert f"storage: redis at redis://127.0.0.1:{server.port}/0" in wrong.output()
        assert "nope" not in wrong.output()
        missing = serve(write_config(CONFIG), url=server.url, wait=False)
        assert wait_for(lambda: "Redis wants a password and none was given (set REDIS_AUTH)" in missing.output())
    finally:
        server.cleanup()


def test_redis_over_a_unix_socket_as_envoyproxy_ratelimit_names_it(
        tmp_path: Path, write_config: Callable[..., Path], serve: Callable[..., Served]) -> None:
    socket_path = tmp_path / "redis.sock"
    server = RedisServer()
    server.extra_args = ("--unixsocket", str(socket_path), "--unixsocketperm", "700")
    server.start()
    try:
        served = serve(write_config(CONFIG), url=str(socket_path), env={"REDIS_SOCKET_TYPE": "unix"})
        stub = served.stub()
        assert [stub.ShouldRateLimit(request("p", descriptor(("user", "u")))).overall_code for _ in range(3)] == [
            OK, OK, OVER_LIMIT]
        assert f"storage: redis at unix://{socket_path}" in served.output()
    finally:
        server.cleanup()


def reload_count(served: Served) -> float:
    match = re.search(r"^ratelimit_config_load_success_total (\S+)$", served.http("/metrics")[1], re.MULTILINE)
    return float(match.group(1)) if match else -1.0


def test_runtime_root_symlink_swap_and_unrelated_writes(tmp_path: Path, serve: Callable[..., Served]) -> None:
    # envoyproxy/ratelimit's layout: RUNTIME_ROOT is a symlink swapped to a new version directory
    runtime = tmp_path / "runtime"
    for version, limit in (("v1", 2), ("v2", 9)):
        (runtime / version / "config").mkdir(parents=True)
        (runtime / version / "config" / "limits.yaml").write_text(
            CONFIG.replace("requests_per_unit: 2", f"requests_per_unit: {limit}"))
    (runtime / "current").symlink_to("v1")
    served = serve(None, env={"RUNTIME_ROOT": str(runtime / "current")})
    stub = served.stub()
    check = request("p", descriptor(("user", "s"), hits=0))
    assert stub.ShouldRateLimit(check).statuses[0].current_limit.requests_per_unit == 2
    # writes beside the config, in the watched parent, reload nothing
    for i in range(5):
        (runtime / f"unrelated-{i}.log").write_text("x")
        (runtime / "v1" / "config" / f"notes-{i}.txt").write_text("x")
    time.sleep(0.4)
    assert reload_count(served) == 1.0
    (runtime / "next").symlink_to("v2")
    os.replace(runtime / "next", runtime / "current")
    assert wait_for(lambda: stub.ShouldRateLimit(check).statuses[0].current_limit.requests_per_unit == 9)
    # and the new version's directory is the one watched now
    (runtime / "v2" / "config" / "limits.yaml").write_text(
        CONFIG.replace("requests_per_unit: 2", "requests_per_unit: 4"))
    assert wait_for(lambda: stub.ShouldRateLimit(check).statuses[0].current_limit.requests_per_unit == 4)


def test_config_directory_removed_and_recreated(tmp_path: Path, serve: Callable[..., Served]) -> None:
    directory = tmp_path / "config"
    directory.mkdir()
    (directory / "limits.yaml").write_text(CONFIG)
    served = serve(directory)
    stub = served.stub()
    check = request("p", descriptor(("user", "z"), hits=0))
    shutil.rmtree(directory)
    assert wait_for(lambda: "config directory does not exist" in served.output())
    assert stub.ShouldRateLimit(check).statuses[0].current_limit.requests_per_unit == 2  # the old config stays
    directory.mkdir()
    (directory / "limits.yaml").write_text(CONFIG.replace("requests_per_unit: 2", "requests_per_unit: 6"))
    assert wait_for(lambda: stub.ShouldRateLimit(check).statuses[0].current_limit.requests_per_unit == 6)


def test_request_values_that_are_not_utf8_in_detailed_metrics(write_config: Callable[..., Path],
                                                               serve: Callable[..., Served]) -> None:
    served = serve(write_config("domain: d\ndescriptors:\n  - key: k\n    detailed_metric: true\n"
                                "    rate_limit: {unit: minute, requests_per_unit: 5}\n"))
    raw = lenient_pb2.LenientRateLimitRequest(domain=b"d")
    entry = raw.descriptors.add().entries.add()
    entry.key, entry.value = b"k", b"\xff\xfe"
    with grpc.insecure_channel(f"127.0.0.1:{served.grpc_port}") as channel:
        call = channel.unary_unary(METHOD, request_serializer=lenient_pb2.LenientRateLimitRequest.SerializeToString,
                                   response_deserializer=rls_pb2.RateLimitResponse.FromString)
        assert call(raw).overall_code == OK
    status, text = served.http("/metrics")
    assert status == 200
    assert 'ratelimit_service_rate_limit_total_hits_total{domain="d",key="k_\\\\xff\\\\xfe"} 1.0' in text


def test_json_bodies_that_cannot_be_read_are_bad_requests(write_config: Callable[..., Path],
                                                          serve: Callable[..., Served]) -> None:
    served = serve(write_config(CONFIG))
    for headers, code in (({"Content-Type": "application/json; charset=bogus"}, 400),
                          ({"Content-Encoding": "gzip"}, 415), ({"Content-Encoding": "br"}, 415)):
        req = urllib.request.Request(f"http://127.0.0.1:{served.http_port}/json", data=b"notgzip{", headers=headers)
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(req, timeout=5)
        assert caught.value.code == code
        assert "error" in json.loads(caught.value.read())
    status, text = served.http("/json", b"{" + b" " * (2 << 20) + b"}")  # over aiohttp's 1 MiB
    assert status == 413 and "Maximum request body size" in json.loads(text)["error"]
    # the service goes on answering, and the bodies it refused are no tracebacks in its log
    assert served.http("/json", json_request("p", ("user", "after")))[0] == 200
    assert "Traceback" not in served.output()


def test_a_compressed_body_is_never_inflated(write_config: Callable[..., Path], serve: Callable[..., Served]) -> None:
    # aiohttp inflated bodies on the event loop as they came, past its size limit: a 1 MB gzip of 1 GiB held the
    # loop 3 s, every gRPC call missed Envoy's deadline, and Envoy let every request through
    served = serve(write_config(CONFIG))
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip
    bomb = b"".join([*(deflate.compress(b" " * (1 << 20)) for _ in range(1024)), deflate.flush()])  # 1 GiB, 1 MB
    stub = served.stub()
    for port, path in ((served.http_port, "/json"), (served.http_port, "/nope"), (served.debug_port, "/metrics")):
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=bomb,
                                     headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})
        started = time.monotonic()
        with contextlib.suppress(urllib.error.HTTPError):
            urllib.request.urlopen(req, timeout=10).read()
        assert time.monotonic() - started < 1.0, path  # 2 to 3 s to inflate it, had it been
        assert stub.ShouldRateLimit(request("p", descriptor(("user", path))), timeout=1).overall_code == OK


def test_sighup_reloads(write_config: Callable[..., Path], serve: Callable[..., Served]) -> None:
    directory = write_config(CONFIG)
    served = serve(directory, "--runtime-watch-root", "false")
    served.process.send_signal(signal.SIGHUP)
    assert wait_for(lambda: reload_count(served) == 2.0)
    assert served.process.poll() is None


def test_healthy_only_with_a_config_loaded_when_asked(tmp_path: Path, serve: Callable[..., Served]) -> None:
    """HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED (envoyproxy/ratelimit src/settings/settings.go): not serving while
    no config file has loaded a domain; serving once one has (by reload), as without the setting from the start."""
    empty = tmp_path / "config"
    empty.mkdir()
    plain = serve(empty)
    assert plain.http("/healthcheck") == (200, "OK")
    strict = serve(empty, wait=False, env={"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED": "true"})
    assert wait_for(lambda: "no domain in" in strict.output(), timeout=10)
    assert wait_for(lambda: strict.http("/healthcheck") == (503, "NOT SERVING"), timeout=10)
    (empty / "config.yaml").write_text(CONFIG)
    assert wait_for(lambda: strict.http("/healthcheck") == (200, "OK"), timeout=10)


def test_grpc_on_a_unix_socket(write_config: Callable[..., Path], serve: Callable[..., Served],
                               tmp_path: Path) -> None:
    """GRPC_UDS (envoyproxy/ratelimit src/settings/settings.go): gRPC on a unix socket instead of host:port."""
    socket_path = tmp_path / "rls.sock"
    served = serve(write_config(CONFIG), wait=False, env={"GRPC_UDS": str(socket_path)})
    assert wait_for(lambda: socket_path.exists(), timeout=10), served.output()
    with grpc.insecure_channel(f"unix:{socket_path}") as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        reply = stub.ShouldRateLimit(request("p", descriptor(("user", "uds"))), timeout=5)
    assert reply.overall_code == OK and reply.statuses[0].current_limit.requests_per_unit == 2
    assert f"listening for gRPC on unix:{socket_path}" in served.output()


def test_connections_are_asked_to_go_after_their_max_age(write_config: Callable[..., Path],
                                                         serve: Callable[..., Served]) -> None:
    """GRPC_MAX_CONNECTION_AGE(_GRACE) (envoyproxy/ratelimit src/settings/settings.go): the server sends GOAWAY
    after about that long, and the client connects again."""
    served = serve(write_config(CONFIG), "--grpc-max-connection-age", "500ms", "--grpc-max-connection-age-grace",
                   "200ms")
    states: list[grpc.ChannelConnectivity] = []
    with grpc.insecure_channel(f"127.0.0.1:{served.grpc_port}") as channel:
        channel.subscribe(states.append)
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        assert stub.ShouldRateLimit(request("p", descriptor(("user", "age"))), timeout=5).overall_code == OK
        # the states come on gRPC's own thread: READY may not be there yet when the call has returned
        assert wait_for(lambda: grpc.ChannelConnectivity.READY in states and grpc.ChannelConnectivity.IDLE in states[
            states.index(grpc.ChannelConnectivity.READY):], timeout=5), states
        assert stub.ShouldRateLimit(request("p", descriptor(("user", "age"))), timeout=5).overall_code == OK
