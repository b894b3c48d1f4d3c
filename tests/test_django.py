"""The Django middleware with Django's test client, against a real slidegate service and real Redis (and the
in-process mode with an injected clock for the boundary burst)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import django
import pytest
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.test.utils import override_settings
from django.urls import path

from slidegate.contrib.common import FAILURES
from slidegate.stack import free_port
from tests.conftest import Clock
from tests.helpers import metric_value
from tests.served import Served

CONFIG = """
domain: web
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
"""


class FakeUser:
    def __init__(self, name: str | None) -> None:
        self.pk = name
        self.is_authenticated = name is not None


def fake_authentication(get_response: Callable[[HttpRequest], HttpResponse]) -> Callable[[HttpRequest], HttpResponse]:
    """Stands in for django.contrib.auth: the user is named by the X-Test-User header."""

    def middleware(request: HttpRequest) -> HttpResponse:
        request.user = FakeUser(request.headers.get("X-Test-User"))
        return get_response(request)

    return middleware


def hello(request: HttpRequest, **_: str) -> HttpResponse:
    return HttpResponse("hello")


urlpatterns = [path("api/hello", hello), path("free", hello)]

if not settings.configured:
    settings.configure(
        DEBUG=False, SECRET_KEY="tests", ROOT_URLCONF=__name__, ALLOWED_HOSTS=["testserver"],
        MIDDLEWARE=["tests.test_django.fake_authentication", "slidegate.contrib.django.SlidegateMiddleware"],
        SLIDEGATE={"DOMAIN": "web"},
    )
    django.setup()


@pytest.fixture
def service(write_config: Callable[..., Path], serve: Callable[..., Served]) -> Served:
    return serve(write_config(CONFIG))


def remote(served: Served, **options: Any) -> Any:
    return override_settings(SLIDEGATE={"DOMAIN": "web", "TARGET": f"127.0.0.1:{served.grpc_port}",
                                        "PATHS": ["/api/"], "TIMEOUT": 1.0, **options})


def test_limits_anonymous_clients_by_address_with_exact_headers(service: Served) -> None:
    with remote(service):
        client = Client()
        first = client.get("/api/hello")
        second = client.get("/api/hello")
        third = client.get("/api/hello")
        assert [first.status_code, second.status_code, third.status_code] == [200, 200, 429]
        assert (first["X-RateLimit-Limit"], first["X-RateLimit-Remaining"], first["X-RateLimit-Reset"]) == (
            "2", "1", "60")
        assert first["RateLimit-Policy"] == '"remote_address";q=2;w=60'
        assert first["RateLimit"] == '"remote_address";r=1;t=60'
        assert "Retry-After" not in first
        assert third.json() == {"error": "rate limited", "retry_after": 60}
        assert third["Retry-After"] == "60" and third["X-RateLimit-Remaining"] == "0"
        assert client.get("/free").status_code == 200  # outside PATHS: not limited, no headers
        assert "X-RateLimit-Limit" not in client.get("/free")


def test_authenticated_and_anonymous_users_have_separate_buckets(service: Served) -> None:
    with remote(service):
        client = Client()
        assert [client.get("/api/hello").status_code for _ in range(3)] == [200, 200, 429]
        alice = [client.get("/api/hello", headers={"X-Test-User": "alice"}).status_code for _ in range(4)]
        assert alice == [200, 200, 200, 429]
        assert client.get("/api/hello", headers={"X-Test-User": "bob"}).status_code == 200


def test_forwarded_for_is_only_believed_from_trusted_proxies(service: Served) -> None:
    with remote(service, TRUSTED_PROXIES=["10.0.0.0/8"]):
        client = Client()
        untrusted = {"REMOTE_ADDR": "203.0.113.7"}
        codes = [client.get("/api/hello", HTTP_X_FORWARDED_FOR=f"198.51.100.{i}", **untrusted).status_code
                 for i in range(3)]
        assert codes == [200, 200, 429]  # every spoofed address landed in the peer's own bucket
        proxied = {"REMOTE_ADDR": "10.1.2.3"}
        assert [client.get("/api/hello", HTTP_X_FORWARDED_FOR=f"1.2.3.4, 198.51.100.{i}", **proxied).status_code
                for i in range(3)] == [200, 200, 200]  # through the proxy: each client has its own bucket
        assert [client.get("/api/hello", HTTP_X_FORWARDED_FOR="198.51.100.9, 10.9.9.9", **proxied).status_code
                for _ in range(3)] == [200, 200, 429]  # trusted hops on the right are skipped


@pytest.mark.parametrize(("mode", "status"), [("open", 200), ("closed", 503)])
def test_unreachable_service_fails_open_or_closed_in_bounded_time(mode: str, status: int) -> None:
    before = metric_value(FAILURES, failure_mode=mode)
    with override_settings(SLIDEGATE={"DOMAIN": "web", "TARGET": f"127.0.0.1:{free_port()}", "TIMEOUT": 0.2,
                                      "FAILURE_MODE": mode}):
        started = time.monotonic()
        response = Client().get("/api/hello")
        assert time.monotonic() - started < 1.0
    assert response.status_code == status
    assert metric_value(FAILURES, failure_mode=mode) == before + 1
    if mode == "closed":
        assert response.json() == {"error": "rate limiter unavailable"} and response["Retry-After"] == "1"


def test_in_process_mode_blocks_the_boundary_burst(write_config: Callable[..., Path], redis_url: str,
                                                   key_prefix: str) -> None:
    clock = Clock()
    minute = 60_000_000
    clock.now_us = (clock.now_us // minute + 1) * minute - 100_000  # 0.1 s before a minute boundary
    with override_settings(SLIDEGATE={"DOMAIN": "web", "MODE": "in-process", "CONFIG_DIR": str(write_config(CONFIG)),
                                      "REDIS_URL": redis_url, "KEY_PREFIX": key_prefix, "CLOCK": clock}):
        client = Client()
        before = [client.get("/api/hello").status_code for _ in range(2)]
        clock.advance(0.2)  # 0.1 s after the boundary: a fixed window would start over
        after = client.get("/api/hello")
        clock.advance(60)  # a minute later (on the injected clock) the window has rolled on
        later = client.get("/api/hello")
    assert before == [200, 200] and after.status_code == 429
    assert int(after["Retry-After"]) == 60  # the first hit leaves the window 59.8 s from now
    assert later.status_code == 200


def test_bad_options_fail_clearly() -> None:
    with override_settings(SLIDEGATE={"DOMAIN": "web", "DESCRIPTORS": [["cookie"]]}), pytest.raises(
            ValueError, match="unknown descriptor source 'cookie'"):
        Client().get("/api/hello")


def test_a_long_path_cannot_escape_the_limit(service: Served) -> None:
    urlpatterns.append(path("api/items/<str:item>", hello))
    with remote(service, DESCRIPTORS=[["client"], ["client", "path"]]):
        client = Client()
        assert [client.get("/api/items/short").status_code for _ in range(3)] == [200, 200, 429]
        # a 2 MB path is limited like any other: sent whole, gRPC would refuse it and the middleware fail open
        assert client.get("/api/items/" + "a" * 2_000_000).status_code == 429
