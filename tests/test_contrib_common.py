"""The middleware's shared parts: who the client is, what the descriptors are, which options are valid."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from slidegate.client import Decision, DescriptorDecision
from slidegate.contrib.common import MAX_VALUE, Options, RequestView, build_descriptors, client_ip
from slidegate.headers import policy_name

TRUSTED = [ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("2001:db8:ffff::/48")]


@pytest.mark.parametrize(("peer", "forwarded", "client"), [
    ("203.0.113.7", "1.1.1.1", "203.0.113.7"),  # untrusted peer: its header is ignored
    ("10.0.0.5", "198.51.100.1", "198.51.100.1"),
    ("10.0.0.5", "198.51.100.1, 10.0.0.7", "198.51.100.1"),  # trusted hops on the right are skipped
    ("10.0.0.5", "6.6.6.6, 198.51.100.1", "198.51.100.1"),  # whatever the client wrote on the left is ignored
    ("10.0.0.5", " 198.51.100.1 ,", "198.51.100.1"),
    ("10.0.0.5", "198.51.100.1:5678", "198.51.100.1"),  # a proxy that adds the port
    ("10.0.0.5", "[2001:db8::1]:443", "2001:db8::1"),
    ("10.0.0.5", "2001:db8::2", "2001:db8::2"),
    ("::ffff:10.0.0.5", "198.51.100.1", "198.51.100.1"),  # IPv4-mapped peer (a dual-stack listener)
    ("2001:db8:ffff::1", "198.51.100.3", "198.51.100.3"),
    ("10.0.0.5", "garbage", "10.0.0.5"),  # unusable: the nearest trusted proxy
    ("10.0.0.5", "garbage, 10.0.0.9", "10.0.0.9"),
    ("10.0.0.5", "10.0.0.8, 10.0.0.9", "10.0.0.8"),  # every hop trusted: the farthest one
    ("10.0.0.5", "", "10.0.0.5"),
    ("", "198.51.100.1", ""),  # a Unix socket peer
])
def test_client_ip(peer: str, forwarded: str, client: str) -> None:
    assert client_ip(peer, forwarded, TRUSTED) == client


def view(**changes: Any) -> RequestView:
    fields: dict[str, Any] = {"path": "/api/x", "method": "GET", "headers": {"x-key": "k"}, "client_ip": "1.2.3.4",
                              "user_id": None, **changes}
    return RequestView(**fields)


def test_descriptors_from_sources() -> None:
    options = Options.parse({"DOMAIN": "d", "DESCRIPTORS": [
        ["client"], ["client", "path"], ["user"], ["header:X-Key"], ["header:X-Missing"], ["method", "generic:g"]]})
    assert build_descriptors(options, view()) == [
        [("remote_address", "1.2.3.4")], [("remote_address", "1.2.3.4"), ("path", "/api/x")],
        [("x-key", "k")], [("method", "GET"), ("generic_key", "g")],
    ]
    assert build_descriptors(options, view(user_id="7"))[:3] == [
        [("user", "7")], [("user", "7"), ("path", "/api/x")], [("user", "7")]]


def test_long_and_unsendable_values_are_sent_as_digests_that_no_value_can_forge() -> None:
    options = Options.parse({"DOMAIN": "d", "DESCRIPTORS": [["path"]]})

    def sent(path: str) -> str:
        [[entry]] = build_descriptors(options, view(path=path))
        assert isinstance(entry, tuple) and entry[0] == "path"
        return entry[1]

    long_path = "/" + "a" * 2_000_000  # past the service's message size: refused whole, the middleware fails open
    assert sent(long_path) == sent(long_path)
    assert sent(long_path).startswith("#") and len(sent(long_path)) == 65
    assert sent(long_path[:-1] + "b") != sent(long_path)
    assert sent("/" + "a" * (MAX_VALUE - 1)) == "/" + "a" * (MAX_VALUE - 1)
    assert sent(sent(long_path)) == "#" + sent(long_path)  # a value that looks like a digest is not one
    assert sent("#") == "##" and sent("##") == "###"
    assert sent("/\udcff").startswith("#") and len(sent("/\udcff")) == 65  # not UTF-8: sent as its digest
    assert sent("/\udcff") != sent("/\udcfe")


@pytest.mark.parametrize(("options", "message"), [
    ({"DOMAIN": "d", "PATHS": "/api/"}, "PATHS must be a list of strings"),
    ({"DOMAIN": "d", "TIMEOUT": "0.05"}, "TIMEOUT must be a number of seconds"),
    ({"DOMAIN": "d", "TIMEOUT": 0}, "TIMEOUT must be a number of seconds"),
    ({"DOMAIN": "d", "TARGET": "http://127.0.0.1:8081"}, "TARGET must be host:port"),
    ({"DOMAIN": "d", "TARGET": "127.0.0.1"}, "TARGET must be host:port"),
    ({"DOMAIN": 123}, "DOMAIN must be a string"),
    ({"DOMAIN": "d", "DESCRIPTORS": []}, "DESCRIPTORS must be a non-empty list"),
    ({"DOMAIN": "d", "DESCRIPTORS": [[]]}, "DESCRIPTORS must be a non-empty list"),
    ({"DOMAIN": "d", "DESCRIPTORS": [["header:"]]}, "unknown descriptor source 'header:'"),
    ({"DOMAIN": "d", "TRUSTED_PROXIES": "10.0.0.0/8"}, "TRUSTED_PROXIES must be a list of strings"),
    ({"DOMAIN": "d", "TRUSTED_PROXIES": ["10.0.0.0/33"]}, "TRUSTED_PROXIES: "),
    ({"DOMAIN": "d", "domain": "e"}, "an option is given twice"),
    ({"DOMAIN": "d", "COLOUR": "red"}, "unknown slidegate middleware option(s): colour"),
])
def test_bad_options(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        Options.parse(options)
    assert message in str(caught.value)


def test_policy_names_cannot_break_headers() -> None:
    assert policy_name('a\r\nSet-Cookie: x="1"') == 'a__Set-Cookie: x=\\"1\\"'
    assert policy_name("名前") == "__"
    assert policy_name("", ("user", 'pa\\th"')) == 'user.pa\\\\th\\"'  # an unnamed limit: its keys
    decision = Decision(False, [DescriptorDecision(True, 5, 60, "límite\n", 0, 30.2)])
    assert dict(decision.headers())["RateLimit-Policy"] == '"l_mite_";q=5;w=60'
    assert all(value.isascii() and "\n" not in value for _, value in decision.headers())
