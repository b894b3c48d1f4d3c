"""The response headers (slidegate.headers) and the overall code (slidegate.service.build_response), on statuses
made by hand: what a fractional wait becomes, and which descriptor decides."""

from __future__ import annotations

from slidegate.config.model import RateLimit
from slidegate.headers import rate_limit_headers
from slidegate.limiter import Descriptor, Status
from slidegate.service import build_response
from slidegate.units import Unit
from tests.helpers import OK, OVER_LIMIT

MINUTE = RateLimit(10, Unit.MINUTE, name="per-minute")
HOUR = RateLimit(100, Unit.HOUR)


def test_seconds_are_rounded_up_so_no_client_comes_back_too_soon() -> None:
    statuses = [Status(MINUTE, over=True, remaining=0, reset_us=58_300_000),
                Status(HOUR, remaining=40, reset_us=1_200_000)]
    headers = dict(rate_limit_headers(statuses, over=True, ietf=True))
    assert headers["RateLimit-Reset"] == "59"  # 58.3 s: 58 would send the client back 0.3 s early
    assert headers["Retry-After"] == "59"
    assert headers["RateLimit"] == '"per-minute";r=0;t=59'
    within = dict(rate_limit_headers([Status(HOUR, remaining=40, reset_us=1_200_000)], over=False))
    assert within["RateLimit-Reset"] == "2"


def test_a_wait_under_a_second_is_told_as_one() -> None:
    headers = dict(rate_limit_headers([Status(MINUTE, over=True, remaining=0, reset_us=1)], over=True))
    assert headers["Retry-After"] == headers["RateLimit-Reset"] == "1"


def test_any_blocking_descriptor_makes_the_answer_over_limit_wherever_it_stands() -> None:
    descriptors = [Descriptor((("a", "1"),)), Descriptor((("b", "2"),))]
    for statuses in ([Status(MINUTE, over=True), Status(HOUR, remaining=5)],
                     [Status(HOUR, remaining=5), Status(MINUTE, over=True)]):
        response = build_response("d", descriptors, statuses)
        assert response.overall_code == OVER_LIMIT
        assert [s.code for s in response.statuses] == [OVER_LIMIT if s.over else OK for s in statuses]
    shadow = build_response("d", descriptors, [Status(MINUTE, over=True, shadow=True), Status(HOUR)])
    assert shadow.overall_code == OK  # a shadow rule over its limit rejects nothing
