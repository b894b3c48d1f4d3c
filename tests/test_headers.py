"""The response headers (slidegate.headers) and the overall code (slidegate.service.build_response), on statuses
made by hand: what a fractional wait becomes, and which descriptor decides."""

from __future__ import annotations

from slidegate.config.model import RateLimit
from slidegate.headers import ResponseHeaders
from slidegate.limiter import Descriptor, Status
from slidegate.service import AnswerOptions, build_response
from slidegate.settings import Settings
from slidegate.units import Unit
from tests.helpers import OK, OVER_LIMIT

MINUTE = RateLimit(10, Unit.MINUTE, name="per-minute")
HOUR = RateLimit(100, Unit.HOUR)
IETF = AnswerOptions(headers=ResponseHeaders.IETF)


def headers(statuses: list[Status], options: AnswerOptions = IETF, descriptors: list[Descriptor] | None = None,
            shadow_mode: bool = False) -> dict[str, str]:
    """The headers the service adds to its answer for ``statuses`` (descriptors: one ("k<i>", "v") each)."""
    descriptors = descriptors or [Descriptor(((f"k{i}", "v"),)) for i in range(len(statuses))]
    response = build_response("d", descriptors, statuses, options, shadow_mode)
    return {h.key: h.value for h in response.response_headers_to_add}


def test_seconds_are_rounded_up_so_no_client_comes_back_too_soon() -> None:
    statuses = [Status(MINUTE, over=True, remaining=0, reset_us=58_300_000),
                Status(HOUR, remaining=40, reset_us=1_200_000)]
    answer = headers(statuses)
    assert answer["RateLimit-Reset"] == "59"  # 58.3 s: 58 would send the client back 0.3 s early
    assert answer["Retry-After"] == "59"
    assert answer["RateLimit"] == '"per-minute";r=0;t=59'
    within = headers([Status(HOUR, remaining=40, reset_us=1_200_000)])
    assert within["RateLimit-Reset"] == "2" and "Retry-After" not in within


def test_a_wait_under_a_second_is_told_as_one() -> None:
    answer = headers([Status(MINUTE, over=True, remaining=0, reset_us=1)])
    assert answer["Retry-After"] == answer["RateLimit-Reset"] == "1"


def test_an_unnamed_limit_is_named_by_its_descriptors_keys() -> None:
    descriptors = [Descriptor((("remote_address", "10.0.0.1"), ("path", "/login"))), Descriptor((("user", "a"),))]
    answer = headers([Status(HOUR, remaining=40, reset_us=1), Status(MINUTE, remaining=3, reset_us=1)],
                     descriptors=descriptors)
    # the keys, never the values: a header must not echo what a client sent
    assert answer["RateLimit-Policy"] == '"remote_address.path";q=100;w=3600, "per-minute";q=10;w=60'
    assert answer["RateLimit"] == '"per-minute";r=3;t=1'


def test_shadow_mode_tells_no_client_to_wait() -> None:
    over = [Status(MINUTE, over=True, remaining=0, reset_us=5_000_000)]
    assert "Retry-After" not in headers(over, shadow_mode=True)
    assert "Retry-After" not in headers([Status(MINUTE, over=True, shadow=True, reset_us=5_000_000)])
    assert headers(over)["Retry-After"] == "5"


def test_any_blocking_descriptor_makes_the_answer_over_limit_wherever_it_stands() -> None:
    descriptors = [Descriptor((("a", "1"),)), Descriptor((("b", "2"),))]
    for statuses in ([Status(MINUTE, over=True), Status(HOUR, remaining=5)],
                     [Status(HOUR, remaining=5), Status(MINUTE, over=True)]):
        response = build_response("d", descriptors, statuses)
        assert response.overall_code == OVER_LIMIT
        assert [s.code for s in response.statuses] == [OVER_LIMIT if s.over else OK for s in statuses]
    shadow = build_response("d", descriptors, [Status(MINUTE, over=True, shadow=True), Status(HOUR)])
    assert shadow.overall_code == OK  # a shadow rule over its limit rejects nothing


def test_the_settings_choose_which_headers() -> None:
    statuses = [Status(MINUTE, remaining=3, reset_us=1)]
    chosen = {which: set(headers(statuses, AnswerOptions(headers=which))) for which in ResponseHeaders}
    assert chosen[ResponseHeaders.NONE] == set()
    assert chosen[ResponseHeaders.RATELIMIT] == {"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"}
    assert chosen[ResponseHeaders.IETF] == chosen[ResponseHeaders.RATELIMIT] | {"RateLimit-Policy", "RateLimit"}
    for enabled, ietf, which in [("false", "false", ResponseHeaders.NONE), ("false", "true", ResponseHeaders.NONE),
                                 ("true", "false", ResponseHeaders.RATELIMIT), ("true", "true", ResponseHeaders.IETF)]:
        settings = Settings.load({"LIMIT_RESPONSE_HEADERS_ENABLED": enabled, "LIMIT_RESPONSE_HEADERS_IETF": ietf})
        assert settings.response_headers is which
