"""Every environment variable of envoyproxy/ratelimit (src/settings/settings.go) accounted for: read as a setting
of the same name, or in slidegate.reference_env.UNREAD with what is done instead; docs/migrating.md's table says
the same; `slidegate serve` names the unread ones that are set, and refuses what it cannot do."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from slidegate.reference_env import GATEWAY_VARIABLES, REFERENCE_VARIABLES, UNREAD, unread_line
from slidegate.settings import SPECS, Settings, SettingsError
from tests.served import Served, wait_for

ROOT = Path(__file__).resolve().parent.parent
READ = {spec.env for spec in SPECS}


def test_every_reference_variable_is_read_or_said_why_not() -> None:
    known = REFERENCE_VARIABLES + GATEWAY_VARIABLES
    assert len(set(known)) == len(known)
    assert set(UNREAD) <= set(known)
    assert set(GATEWAY_VARIABLES) <= set(UNREAD), "Envoy Gateway's own: the reference reads none, nor do we"
    assert not set(UNREAD) & READ, "read as a setting and listed as unread"
    assert [v for v in REFERENCE_VARIABLES if v not in READ and v not in UNREAD] == []


def test_the_migration_page_lists_every_variable_as_the_code_handles_it() -> None:
    page = (ROOT / "docs" / "migrating.md").read_text()
    rows = re.findall(r"^\| `([A-Z_0-9]+)` \| (supported|mapped|ignored) \|(.*?)\|$", page, re.MULTILINE)
    assert [name for name, _, _ in rows] == list(REFERENCE_VARIABLES + GATEWAY_VARIABLES)
    for name, handling, why in rows:
        if name in READ:
            assert handling == "supported", name
        else:
            assert (handling, why.strip()) == (UNREAD[name].handling.value, UNREAD[name].why), name


def test_the_start_up_line_names_each_unread_variable_set() -> None:
    assert unread_line({"REDIS_URL": "x", "PATH": "/bin", "PROTO": "", "GRPC_UDS": ""}) is None
    line = unread_line({"MEMCACHE_SRV": "x", "PROTO": "tcp", "REDIS_URL": "x", "TRACING_ENABLED": "true"})
    assert line == ("envoyproxy/ratelimit settings this service does not read: PROTO (ignored: every listener is "
                    "TCP); MEMCACHE_SRV (ignored: there is no memcached backend (BACKEND_TYPE=memcache is refused: "
                    "memcached cannot decide several limits at once, atomically))")


def test_envoy_gateways_ca_variable_is_named_as_ignored() -> None:
    line = unread_line({"GRPC_SERVER_TLS_CA_CERT": "/certs/ca.crt", "GRPC_CLIENT_TLS_CACERT": "/x"})
    assert line is not None and line.startswith("envoyproxy/ratelimit settings this service does not read: "
                                                "GRPC_SERVER_TLS_CA_CERT (ignored: Envoy Gateway sets it")
    assert "GRPC_CLIENT_TLS_CACERT (" not in line  # that one is read


def test_serve_says_it_at_start(write_config: Callable[..., Path], serve: Callable[..., Served]) -> None:
    served = serve(write_config("domain: d\ndescriptors: []\n"), env={"PROTO": "tcp"})
    assert wait_for(lambda: "does not read: PROTO (ignored: every listener is TCP)" in served.output())


@pytest.mark.parametrize(("variable", "value", "reason"), [
    ("BACKEND_TYPE", "memcache", "memcache (envoyproxy/ratelimit's) is not offered: memcached cannot decide "
                                 "several limits at once, atomically"),
    ("CONFIG_TYPE", "GRPC_XDS_DELTA", "'GRPC_XDS_DELTA' is not one of FILE, GRPC_XDS_SOTW"),
])
def test_what_cannot_be_done_is_refused_with_its_reason(variable: str, value: str, reason: str) -> None:
    with pytest.raises(SettingsError) as caught:
        Settings.load({variable: value})
    assert reason in str(caught.value) and variable in str(caught.value)
    assert Settings.load({"CONFIG_TYPE": "file"}).config_type == "FILE"
