"""REDIS_URL values that redis-py would accept at start and fail on at every call, and passwords in the errors
of URLs too malformed to parse: refused at start, naming the problem, never showing the password."""

from __future__ import annotations

import pytest

from slidegate.redis_urls import check_url, redact


@pytest.mark.parametrize(("url", "kind", "message"), [
    ("redis://127.0.0.1:6379/0?foo=bar", "single", "unexpected keyword argument 'foo'"),
    ("redis://h:1/0?ssl_ca_certs=/x", "single", "unexpected keyword argument 'ssl_ca_certs'"),
    ("rediss://h:1/0?ssl_cert_reqs=bogus", "single", "Invalid SSL Certificate Requirements Flag"),
    ("unix:///p?ssl_cert_reqs=none", "single", "unexpected keyword argument 'ssl_cert_reqs'"),
    ("redis://127.0.0.1:", "single", "names no port after its colon"),
    ("redis://bad host:6379/0", "single", "the host 'bad host' is not a host name or address"),
    ("redis://h:0/0", "single", "the port 0 is not from 1 to 65535"),
    ("unix://host/path", "single", "names a host"),
    ("h:6379?password=hunter2", "cluster", "cluster node 'h:6379' comes with a query or fragment"),
    ("m,h:1?password=hunter2", "sentinel", "Sentinel address 'h:1' comes with a query or fragment"),
])
def test_a_url_every_call_would_fail_on_is_refused_at_start(url: str, kind: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        check_url(url, kind)
    assert message in str(caught.value)
    assert "hunter2" not in str(caught.value)


@pytest.mark.parametrize("url", ["redis://:hunt/er2@h:1/0", "redis://:hu#nt@h:1/0", "redis://:hu?nt@h:1/0"])
def test_a_password_never_shows_even_in_a_url_too_malformed_to_parse(url: str) -> None:
    secret = url.split("://")[1].rpartition("@")[0].split(":", 1)[1]
    with pytest.raises(ValueError) as caught:
        check_url(url)
    assert secret not in str(caught.value) and "***" in str(caught.value)
    assert secret not in redact(url)


def test_a_password_with_an_at_sign_never_shows() -> None:
    assert redact("redis://user:a@b@h:1/0") == "redis://user:***@h:1/0"


@pytest.mark.parametrize("url", ["redis://h:1/0?db=2&socket_timeout=1", "rediss://h:1/0?ssl_cert_reqs=none",
                                 "unix:///tmp/r.sock?db=1", "redis://user:pw@h:6379/0", "redis://[::1]:6379/0"])
def test_urls_redis_py_takes_are_accepted(url: str) -> None:
    check_url(url)
