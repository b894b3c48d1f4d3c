"""The ASGI middleware with Starlette's test client, against a real slidegate service and real Redis."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.authentication import AuthCredentials, AuthenticationBackend, BaseUser, SimpleUser
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection, Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from slidegate.contrib.asgi import SlidegateMiddleware
from slidegate.contrib.common import FAILURES
from slidegate.stack import free_port
from tests.conftest import Clock
from tests.helpers import metric_value
from tests.served import Served
from tests.test_django import CONFIG


class NamedUser(BaseUser):
    """A user as Starlette's docs write one: no ``identity``."""

    def __init__(self, name: str) -> None:
        self.name = name

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def display_name(self) -> str:
        return self.name


class HeaderAuth(AuthenticationBackend):
    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, BaseUser] | None:
        name = conn.headers.get("x-test-user")
        if not name:
            return None
        return AuthCredentials(["authenticated"]), NamedUser(name) if name.startswith("named-") else SimpleUser(name)


async def hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello")


def make_app(**options: Any) -> Starlette:
    return Starlette(routes=[Route("/api/hello", hello), Route("/free", hello)], middleware=[
        Middleware(AuthenticationMiddleware, backend=HeaderAuth()),
        # starlette's ParamSpec-based factory type does not accept **options, though it calls it that way
        Middleware(SlidegateMiddleware, **{"domain": "web", "paths": ["/api/"], "timeout": 1.0,  # type: ignore[arg-type]
                                           **options}),
    ])


@pytest.fixture
def service(write_config: Callable[..., Path], serve: Callable[..., Served]) -> Served:
    return serve(write_config(CONFIG))


def test_limits_with_headers_and_separate_user_buckets(service: Served) -> None:
    with TestClient(make_app(target=f"127.0.0.1:{service.grpc_port}"), client=("203.0.113.7", 5000)) as client:
        check_limits(client)


def check_limits(client: TestClient) -> None:
    responses = [client.get("/api/hello") for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 429]
    first, third = responses[0], responses[2]
    assert (first.headers["x-ratelimit-limit"], first.headers["x-ratelimit-remaining"]) == ("2", "1")
    assert first.headers["ratelimit"] == '"remote_address";r=1;t=60'
    assert third.json() == {"error": "rate limited", "retry_after": 60} and third.headers["retry-after"] == "60"
    alice = [client.get("/api/hello", headers={"x-test-user": "alice"}).status_code for _ in range(4)]
    assert alice == [200, 200, 200, 429]
    named = [client.get("/api/hello", headers={"x-test-user": "named-bo"}).status_code for _ in range(4)]
    assert named == [200, 200, 200, 429]  # a user without identity is known by its display name
    assert client.get("/free").status_code == 200 and "x-ratelimit-limit" not in client.get("/free").headers


def test_repeated_forwarded_for_lines_are_one_list(service: Served) -> None:
    app = make_app(target=f"127.0.0.1:{service.grpc_port}", trusted_proxies=["10.0.0.0/8"])
    with TestClient(app, client=("10.0.0.5", 5000)) as client:
        # two proxies, each adding its own header line: the client is the first line's address
        codes = [client.get("/api/hello", headers=[("x-forwarded-for", f"198.51.100.{i}"),
                                                   ("x-forwarded-for", "10.0.0.7")]).status_code for i in range(3)]
    assert codes == [200, 200, 200]


def test_spoofed_forwarded_for_from_an_untrusted_peer_is_ignored(service: Served) -> None:
    client = TestClient(make_app(target=f"127.0.0.1:{service.grpc_port}", trusted_proxies=["10.0.0.0/8"]),
                        client=("203.0.113.8", 5000))
    codes = [client.get("/api/hello", headers={"x-forwarded-for": f"198.51.100.{i}"}).status_code for i in range(3)]
    assert codes == [200, 200, 429]
    proxied = TestClient(make_app(target=f"127.0.0.1:{service.grpc_port}", trusted_proxies=["10.0.0.0/8"]),
                         client=("10.0.0.5", 5000))
    assert [proxied.get("/api/hello", headers={"x-forwarded-for": f"198.51.100.{i}"}).status_code
            for i in range(3)] == [200, 200, 200]


@pytest.mark.parametrize(("mode", "status"), [("open", 200), ("closed", 503)])
def test_unreachable_service_fails_open_or_closed(mode: str, status: int) -> None:
    before = metric_value(FAILURES, failure_mode=mode)
    client = TestClient(make_app(target=f"127.0.0.1:{free_port()}", timeout=0.2, failure_mode=mode))
    started = time.monotonic()
    response = client.get("/api/hello")
    assert time.monotonic() - started < 1.0
    assert response.status_code == status and metric_value(FAILURES, failure_mode=mode) == before + 1


def test_in_process_mode_blocks_the_boundary_burst(write_config: Callable[..., Path], redis_url: str,
                                                   key_prefix: str) -> None:
    clock = Clock()
    minute = 60_000_000
    clock.now_us = (clock.now_us // minute + 1) * minute - 100_000
    app = make_app(mode="in-process", config_dir=str(write_config(CONFIG)), redis_url=redis_url,
                   key_prefix=key_prefix, clock=clock)
    with TestClient(app) as client:  # one event loop for the limiter's Redis connections
        before = [client.get("/api/hello").status_code for _ in range(2)]
        clock.advance(0.2)
        after = client.get("/api/hello").status_code
        clock.advance(60)
        later = client.get("/api/hello").status_code
    assert before == [200, 200] and after == 429 and later == 200
