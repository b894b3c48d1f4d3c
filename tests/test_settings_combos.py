"""Settings that only make sense together: each refusal names the flag and variable of what is wrong, and each
setting given that has no effect is a start-up warning saying why (Settings.leftovers), not a refusal, since
envoyproxy/ratelimit ignores it and the configs moved from it carry such leftovers."""

from __future__ import annotations

from pathlib import Path

import pytest

from slidegate.application import make_backend
from slidegate.settings import Settings, SettingsError


def refusal(environ: dict[str, str]) -> str:
    with pytest.raises(SettingsError) as caught:
        Settings.load(environ)
    return str(caught.value)


@pytest.mark.unit
@pytest.mark.parametrize(("environ", "named"), [
    ({"REDIS_URL": "redis://h:1/0?max_connections=-1"},
     '--redis-url / REDIS_URL: Redis URL \'redis://h:1/0?max_connections=-1\': a query parameter is not one'),
    ({"REDIS_TLS": "true", "REDIS_TLS_CACERT": "/nonexistent"},
     "--redis-tls-cacert / REDIS_TLS_CACERT: no such file '/nonexistent'"),
    ({"REDIS_URL": "rediss://h:1/0", "REDIS_TLS_CLIENT_CERT": "/no/cert", "REDIS_TLS_CLIENT_KEY": "/no/key"},
     "--redis-tls-client-cert / REDIS_TLS_CLIENT_CERT: no such file '/no/cert'"),
    ({"REDIS_PERSECOND": "true", "REDIS_PERSECOND_URL": "h:2", "REDIS_PERSECOND_TLS": "true",
      "REDIS_TLS_CACERT": "/nonexistent"}, "--redis-tls-cacert / REDIS_TLS_CACERT: no such file"),
    ({"REDIS_TLS_CLIENT_CERT": "/c"},
     "--redis-tls-client-cert / REDIS_TLS_CLIENT_CERT and --redis-tls-client-key / REDIS_TLS_CLIENT_KEY go together"),
    ({"REDIS_WAIT_REPLICAS": "99999999999999999999999"},
     "--redis-wait-replicas / REDIS_WAIT_REPLICAS (from the environment): 99999999999999999999999 must be at most "
     "1000 (the replicas of one master)"),
])
def test_a_refusal_names_the_flag_and_variable_in_the_usual_form(environ: dict[str, str], named: str) -> None:
    message = refusal(environ)
    assert message.startswith("invalid settings:\n  "), message
    assert named in message


@pytest.mark.unit
def test_the_most_replicas_waited_for_is_accepted() -> None:
    assert Settings.load({"REDIS_WAIT_REPLICAS": "1000"}).redis_wait_replicas == 1000
    assert "REDIS_WAIT_REPLICAS (from the environment): 1001 must be at most 1000" in refusal(
        {"REDIS_WAIT_REPLICAS": "1001"})


@pytest.mark.unit
def test_tls_files_present_are_taken(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("not checked here: the TLS context reads it")
    loaded = Settings.load({"REDIS_TLS": "true", "REDIS_TLS_CACERT": str(ca)})
    assert (loaded.redis_tls_cacert, loaded.leftovers()) == (str(ca), [])


@pytest.mark.unit
@pytest.mark.parametrize(("environ", "warned"), [
    # as envoyproxy/ratelimit, which reads the files only with REDIS_TLS or REDIS_PERSECOND_TLS
    ({"REDIS_TLS_CACERT": "/nonexistent"}, "--redis-tls-cacert / REDIS_TLS_CACERT: not used (files not read): no "
                                          "Redis is reached over TLS"),
    ({"BACKEND_TYPE": "memory", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": "true"},
     "--redis-tls-skip-hostname-verification / REDIS_TLS_SKIP_HOSTNAME_VERIFICATION: not used"),
    ({"REDIS_TLS": "true", "REDIS_URL": "unix:///run/redis.sock"},
     "--redis-tls / REDIS_TLS is not used: REDIS_URL is a unix:// socket, reached without TLS"),
    ({"REDIS_TLS": "true", "REDIS_URL": "/run/redis.sock", "REDIS_SOCKET_TYPE": "unix"},
     "--redis-tls / REDIS_TLS is not used: REDIS_URL is a unix:// socket"),
    ({"REDIS_SENTINEL_AUTH": "pw"}, "--redis-sentinel-auth / REDIS_SENTINEL_AUTH is not used: REDIS_TYPE=single "
                                    "has no Sentinels"),
    ({"REDIS_TYPE": "cluster", "REDIS_URL": "a:1", "REDIS_SENTINEL_AUTH": "pw"},
     "REDIS_SENTINEL_AUTH is not used: REDIS_TYPE=cluster has no Sentinels"),
    ({"REDIS_TYPE": "sentinel", "REDIS_URL": "m,a:1", "REDIS_SOCKET_TYPE": "unix"},
     "--redis-socket-type / REDIS_SOCKET_TYPE=unix is not used: REDIS_TYPE=sentinel reaches its nodes over TCP"),
    ({"REDIS_TYPE": "cluster", "REDIS_URL": "a:1", "REDIS_SOCKET_TYPE": "unix"},
     "REDIS_SOCKET_TYPE=unix is not used: REDIS_TYPE=cluster reaches its nodes over TCP"),
    ({"REDIS_PERSECOND": "true", "REDIS_PERSECOND_URL": "h:2", "REDIS_PERSECOND_SENTINEL_AUTH": "pw"},
     "--redis-persecond-sentinel-auth / REDIS_PERSECOND_SENTINEL_AUTH is not used: REDIS_PERSECOND_TYPE=single"),
    ({"REDIS_PERSECOND_URL": "garbage://"},
     "--redis-persecond-url / REDIS_PERSECOND_URL is neither checked nor used: --redis-persecond / REDIS_PERSECOND "
     "is false"),
])
def test_a_setting_without_effect_is_a_warning_naming_it(environ: dict[str, str], warned: str) -> None:
    leftovers = Settings.load(environ).leftovers()
    assert len(leftovers) == 1 and warned in leftovers[0], leftovers


@pytest.mark.unit
def test_settings_in_effect_are_no_leftovers() -> None:
    for environ in ({}, {"REDIS_TYPE": "sentinel", "REDIS_URL": "m,a:1", "REDIS_SENTINEL_AUTH": "pw"},
                    {"REDIS_TLS": "true", "REDIS_URL": "h:1"},
                    {"REDIS_PERSECOND": "true", "REDIS_PERSECOND_URL": "h:2", "REDIS_PERSECOND_TLS": "true",
                     "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": "true"}):
        assert Settings.load(environ).leftovers() == [], environ


@pytest.mark.unit
async def test_an_unused_tls_file_stops_no_backend_from_being_built() -> None:
    backend = make_backend(Settings.load({"REDIS_URL": "redis://127.0.0.1:1/0", "REDIS_TLS_CACERT": "/nonexistent"}))
    await backend.close()
