"""slidegate.inprocess against the service: the limiter in process answers what a call answers (read back by
slidegate.client), descriptor by descriptor, without the request or the answer going through protobuf."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from slidegate.application import build
from slidegate.client import DescriptorSpec, build_request, decision_from_response
from slidegate.inprocess import InProcessLimiter
from slidegate.request import Request, parse_request
from slidegate.settings import Settings

CONFIG = """
domain: c
descriptors:
  - key: named
    rate_limit: {unit: minute, unit_multiplier: 2, requests_per_unit: 2, name: two}
  - key: plain
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
"""
NOW_US = 1_700_000_000_123_456


def test_the_limiter_in_process_answers_what_a_call_answers(write_config: Callable[..., Path]) -> None:
    directory = write_config(CONFIG)
    clock = lambda: NOW_US  # noqa: E731  # both decide at one instant: their resets agree to the microsecond
    limiter = InProcessLimiter(directory, clock=clock)
    service = build(Settings.load({}, {"config_dir": str(directory), "backend_type": "memory"}), clock=clock).service
    specs: list[DescriptorSpec] = [[("named", "a")], {"plain": "b"}, [("shadow", "c")], [("free", "d")],
                                   [("none", "e")]]

    async def run() -> None:
        for hits in (0, 1, 2, 0):
            request = build_request("c", specs, hits)
            domain, descriptors = parse_request(Request.FromString(request.SerializeToString()))
            called = decision_from_response(await service.decide(domain, descriptors, hits), request)
            assert await limiter.should_rate_limit("c", specs, hits) == called
        assert not called.allowed and called.descriptors[0].over and not called.descriptors[2].over

    asyncio.run(run())


@pytest.mark.parametrize(("specs", "hits", "error"), [
    ([[("k", 1)]], 0, TypeError),  # not text: a call could not carry it
    ([[("k", "\udc80")]], 0, UnicodeEncodeError),  # not Unicode
    ([[("k", "v")]], -1, ValueError),  # hits_addend is a uint32
])
def test_what_no_call_could_carry_is_refused(write_config: Callable[..., Path], specs: list[list[tuple[str, object]]],
                                            hits: int, error: type[Exception]) -> None:
    limiter = InProcessLimiter(write_config(CONFIG))
    with pytest.raises(error):
        limiter.should_rate_limit_blocking("c", specs, hits)  # type: ignore[arg-type]
    with pytest.raises(error):
        build_request("c", specs, hits)  # type: ignore[arg-type]
