"""slidegate.client: the sync and asyncio clients against a real service, and the in-process limiter."""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from click.testing import CliRunner

from slidegate.cli import main, split_entries
from slidegate.client import (
    AsyncRateLimitClient,
    InvalidRateLimitRequest,
    RateLimitClient,
    RateLimitUnavailable,
)
from slidegate.inprocess import InProcessLimiter
from slidegate.stack import free_port
from tests.redis_servers import RedisServer
from tests.served import Served

ROOT = Path(__file__).resolve().parent.parent

CONFIG = """
domain: c
descriptors:
  - key: k
    rate_limit: {unit: minute, unit_multiplier: 2, requests_per_unit: 2, name: two}
"""


def test_sync_client(write_config: Callable[..., Path], serve: Callable[..., Served],
                     monkeypatch: pytest.MonkeyPatch) -> None:
    served = serve(write_config(CONFIG))
    channels: list[grpc.Channel] = []
    made = grpc.insecure_channel

    def counted(target: str, *args: Any, **kwargs: Any) -> grpc.Channel:
        channels.append(made(target, *args, **kwargs))
        return channels[-1]

    monkeypatch.setattr(grpc, "insecure_channel", counted)
    client = RateLimitClient(f"127.0.0.1:{served.grpc_port}", timeout=2)
    try:
        first = client.should_rate_limit("c", [[("k", "a")], {"other": "x"}])
        second = client.should_rate_limit("c", [[("k", "a")]])
        third = client.should_rate_limit("c", [[("k", "a")]], hits_addend=1)
        assert len(channels) == 1  # one channel for every call
    finally:
        client.close()
    assert first.allowed and first.retry_after is None
    one, none = first.descriptors
    assert (one.over, one.limit, one.window_seconds, one.name, one.remaining, one.reset_seconds) == (
        False, 2, 120, "two", 1, 120.0)
    assert (none.limit, none.over) == (None, False)
    assert second.allowed and not third.allowed and third.retry_after == 120
    assert ("Retry-After", "120") in third.headers() and ("X-RateLimit-Limit", "2") in third.headers()


def test_the_docs_client_example_prints_what_its_comments_say(serve: Callable[..., Served]) -> None:
    # docs/integrations.md's example, run against the demo's limits as it says: a reader must be able to tell a
    # decision by a limit from a request no limit applies to
    text = (ROOT / "docs" / "integrations.md").read_text()
    section = text[text.index("## The client library"):]
    example = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert example is not None
    served = serve(ROOT / "envoy" / "ratelimit", "--backend", "memory")
    code = example.group(1).replace("127.0.0.1:8081", f"127.0.0.1:{served.grpc_port}")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "docs/integrations.md", "exec"), {})
    lines = printed.getvalue().splitlines()
    assert lines == ["True None", "per-client 10 9", "burst-path 3 2"]
    comments = " ".join(line.partition("#")[2] for line in code.splitlines())
    assert all(line in comments for line in lines), (lines, comments)


def test_async_client_and_deadline(write_config: Callable[..., Path], serve: Callable[..., Served]) -> None:
    served = serve(write_config(CONFIG))

    async def run() -> None:
        client = AsyncRateLimitClient(f"127.0.0.1:{served.grpc_port}", timeout=2)
        decisions = await asyncio.gather(*(client.should_rate_limit("c", [[("k", "b")]]) for _ in range(3)))
        await client.close()
        assert sorted(d.allowed for d in decisions) == [False, True, True]
        nowhere = AsyncRateLimitClient(f"127.0.0.1:{free_port()}", timeout=0.2)
        started = time.monotonic()
        with pytest.raises(RateLimitUnavailable):
            await nowhere.should_rate_limit("c", [[("k", "b")]])
        assert time.monotonic() - started < 1
        await nowhere.close()

    asyncio.run(run())


def test_in_process_limiter_in_memory(write_config: Callable[..., Path]) -> None:
    limiter = InProcessLimiter(write_config(CONFIG))
    decisions = [limiter.should_rate_limit_blocking("c", [[("k", "m")]]) for _ in range(3)]
    assert [d.allowed for d in decisions] == [True, True, False]
    assert decisions[0].descriptors[0].remaining == 1


def test_an_invalid_request_is_told_apart_from_an_outage(write_config: Callable[..., Path],
                                                         serve: Callable[..., Served]) -> None:
    # a caller's bug, the same way from the service and from the limiter in process
    directory = write_config(CONFIG)
    client = RateLimitClient(f"127.0.0.1:{serve(directory).grpc_port}", timeout=5)
    for limiter in (client, InProcessLimiter(directory)):
        check = getattr(limiter, "should_rate_limit_blocking", limiter.should_rate_limit)
        with pytest.raises(InvalidRateLimitRequest, match=r"^INVALID_ARGUMENT: rate limit domain must not be empty"):
            check("", [[("k", "x")]])
    client.close()


def test_deadline_holds_against_a_service_that_never_answers() -> None:
    # a TCP server that accepts and never replies: only the deadline can end the call
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = RateLimitClient(f"127.0.0.1:{port}", timeout=0.3)
        started = time.monotonic()
        with pytest.raises(RateLimitUnavailable, match="DEADLINE_EXCEEDED"):
            client.should_rate_limit("c", [[("k", "x")]])
        assert 0.25 < time.monotonic() - started < 1.5
        client.close()


def test_in_process_limiter_with_redis_down(write_config: Callable[..., Path], private_redis: RedisServer) -> None:
    limiter = InProcessLimiter(write_config(CONFIG), private_redis.url, timeout=0.2)
    assert limiter.should_rate_limit_blocking("c", [[("k", "r")]]).allowed
    private_redis.stop()
    started = time.monotonic()
    # the service's status (service.refusal), with the storage's own reason: this process is the one it failed
    reason = r"^UNAVAILABLE: redis at redis://127\.0\.0\.1:\d+/0: ConnectionError"
    with pytest.raises(RateLimitUnavailable, match=reason) as caught:
        limiter.should_rate_limit_blocking("c", [[("k", "r")]])
    assert not isinstance(caught.value, InvalidRateLimitRequest)
    assert time.monotonic() - started < 1.0


def test_the_client_command_reads_commas_and_equals_in_values() -> None:
    assert split_entries("path=/a=b,x=y") == ["path=/a=b", "x=y"]  # '=' after the first is the value's
    assert split_entries(r"q=a\,b,r=c\\d") == ["q=a,b", r"r=c\d"]
    assert split_entries("k=") == ["k="]


@pytest.mark.parametrize(("args", "message"), [
    (("--descriptor", "k=\udcff"), "Invalid value for --descriptor: b'k=\\xff' is not UTF-8"),
    (("--descriptor", "k=v", "--domain", "\udcfe"), "Invalid value for --domain: b'\\xfe' is not UTF-8"),
    (("--descriptor", "k=v", "--timeout", "nan"), "Invalid value for --timeout: nan is not a number of seconds"),
    (("--descriptor", "k=v", "--target", "\udcff:1"), "Invalid value for --target: b'\\xff:1' is not UTF-8"),
    (("--descriptor", "k=v", "--timeout", "1e300"), "Invalid value for --timeout: 1e+300 is not a number of"),
])
def test_the_client_command_refuses_arguments_it_cannot_send(args: tuple[str, ...], message: str) -> None:
    # exit code 1 means over limit: a traceback's 1 read as a rejection
    result = CliRunner().invoke(main, ["client", "--domain", "d", "--target", "127.0.0.1:1", *args])
    assert result.exit_code == 2
    assert message in result.output
