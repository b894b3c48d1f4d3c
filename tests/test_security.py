"""Hostile callers of `slidegate serve`: the switches for the request fields that lower a limit
(NEGATIVE_HITS_ENABLED, LIMIT_OVERRIDE_ENABLED) and for ``POST /json`` (JSON_ENDPOINT_ENABLED), each setting over
gRPC and HTTP (a refused field is INVALID_ARGUMENT or 400 with the reason, and counted; an accepted one does what
Envoy means by it), and malformed HTTP requests answered without a traceback in the log."""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from google.protobuf import json_format

from slidegate.protos import ratelimit_unit_pb2, rls_pb2
from tests.helpers import OK, descriptor, request
from tests.served import Served

CONFIG = "domain: s\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 2}\n"
Serve = Callable[..., Served]


def refund(user: str) -> rls_pb2.RateLimitRequest:
    give = descriptor(("user", user), hits=2)
    give.is_negative_hits = True
    return request("s", give)


def raised(user: str) -> rls_pb2.RateLimitRequest:
    own = descriptor(("user", user))
    own.limit.requests_per_unit = 4294967295
    own.limit.unit = ratelimit_unit_pb2.SECOND
    return request("s", own)


def ask(served: Served, message: rls_pb2.RateLimitRequest, *, http: bool) -> tuple[str, str]:
    """(OK / OVER_LIMIT / the refusal's gRPC code name, the refusal's reason) over gRPC or POST /json."""
    if http:
        status, body = served.http("/json", json_format.MessageToJson(message).encode())
        if status in (200, 429):
            return ("OK" if status == 200 else "OVER_LIMIT"), ""
        return {400: "INVALID_ARGUMENT"}.get(status, str(status)), json.loads(body)["error"]
    try:
        reply = served.stub().ShouldRateLimit(message, timeout=5)
    except grpc.RpcError as exc:
        return exc.code().name, exc.details() or ""
    return rls_pb2.RateLimitResponse.Code.Name(reply.overall_code), ""


def exhaust(served: Served, user: str) -> None:
    answers = [ask(served, request("s", descriptor(("user", user))), http=False)[0] for _ in range(3)]
    assert answers == ["OK", "OK", "OVER_LIMIT"]


def refusals(served: Served) -> tuple[float, float, float]:
    """The calls refused for (is_negative_hits, limit, any other reason) in the metrics."""
    _, text = served.http("/metrics")
    counted = {m[1]: float(m[2]) for m in re.finditer(
        r'^ratelimit_service_should_rate_limit_error_total\{err_type="(\w+)"\} (\S+)$', text, re.M)}
    return (counted.get("refused_negative_hits", 0.0), counted.get("refused_limit_override", 0.0),
            counted.get("service_error", 0.0))


@pytest.mark.parametrize("http", [False, True], ids=["grpc", "http"])
def test_by_default_a_limit_cannot_be_given_back_but_can_be_overridden(
        serve: Serve, write_config: Callable[..., Path], http: bool) -> None:
    served = serve(write_config(CONFIG))
    exhaust(served, "a")
    code, reason = ask(served, refund("a"), http=http)
    assert (code, reason) == ("INVALID_ARGUMENT",
                              "descriptor 0: is_negative_hits is refused by this service (NEGATIVE_HITS_ENABLED=false)")
    assert ask(served, request("s", descriptor(("user", "a"))), http=http)[0] == "OVER_LIMIT"  # nothing given back
    assert ask(served, raised("a"), http=http)[0] == "OK"  # the override is the limit, as in envoyproxy/ratelimit
    assert refusals(served) == (1, 0, 0)


@pytest.mark.parametrize("http", [False, True], ids=["grpc", "http"])
def test_the_switches_turned_the_other_way(serve: Serve, write_config: Callable[..., Path], http: bool) -> None:
    served = serve(write_config(CONFIG), "--negative-hits-enabled", "true", "--limit-override-enabled", "false")
    exhaust(served, "b")
    assert ask(served, refund("b"), http=http)[0] == "OK"
    assert ask(served, request("s", descriptor(("user", "b"))), http=http)[0] == "OK"  # two given back, one taken
    code, reason = ask(served, raised("b"), http=http)
    assert (code, reason) == ("INVALID_ARGUMENT",
                              "descriptor 0: limit is refused by this service (LIMIT_OVERRIDE_ENABLED=false)")
    assert refusals(served) == (0, 1, 0)


def test_the_json_endpoint_can_be_turned_off(serve: Serve, write_config: Callable[..., Path]) -> None:
    served = serve(write_config(CONFIG), env={"JSON_ENDPOINT_ENABLED": "false"})
    status, body = served.http("/json", b'{"domain": "s", "descriptors": [{"entries": [{"key": "user"}]}]}')
    assert (status, json.loads(body)) == (404, {"error": "Not Found"})
    assert served.http("/healthcheck") == (200, "OK")
    reply = served.stub().ShouldRateLimit(request("s", descriptor(("user", "c"))), timeout=5)
    assert reply.overall_code == OK



MALFORMED_HTTP = [
    b"GET /healthcheck HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",  # a header over 8 KiB
    b"GET /" + b"p" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",  # a path over 8 KiB
    b"POST /json HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"GARBAGE\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS client hello
]


def test_malformed_http_requests_are_answered_400_and_logged_in_a_line(
        serve: Serve, write_config: Callable[..., Path]) -> None:
    served = serve(write_config(CONFIG))
    before = served.output()
    for raw in MALFORMED_HTTP * 3:
        with socket.create_connection(("127.0.0.1", served.http_port), timeout=5) as connection:
            connection.sendall(raw)
            assert connection.recv(64).startswith(b"HTTP/1.0 400 Bad Request"), raw[:40]
    time.sleep(0.2)
    logged = served.output()[len(before):]
    assert "Traceback" not in logged
    assert len(logged.splitlines()) == 1, logged
    assert "malformed HTTP requests answered 400" in logged and "LineTooLong from 127.0.0.1" in logged
    assert served.http("/healthcheck") == (200, "OK")
