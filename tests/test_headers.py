"""The response headers (slidegate.headers) and the overall code (slidegate.decider.rejects, written by
slidegate.service.build_response), on statuses made by hand: what a fractional wait becomes, and which
descriptor decides; a response made from its request's skeleton is the one built anew."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slidegate.config.model import Config, RateLimit
from slidegate.decider import Decision, Prepared, rejects
from slidegate.headers import ResponseHeaders, Shown, retry_after
from slidegate.limiter import Descriptor, Plan, Status
from slidegate.service import AnswerOptions, build_response, response_skeleton
from slidegate.settings import Settings, SettingsError
from slidegate.units import Unit
from tests.helpers import OK, OVER_LIMIT

MINUTE = RateLimit(10, Unit.MINUTE, name="per-minute")
HOUR = RateLimit(100, Unit.HOUR)
IETF = AnswerOptions(headers=ResponseHeaders.IETF)


def respond(descriptors: list[Descriptor], statuses: list[Status], options: AnswerOptions | None = None,
            shadow_mode: bool = False, hits_addend: int = 0, skeleton: bytes | None = None) -> Any:
    """The response to a decision of ``statuses`` (overall as the decider decides it, under ``shadow_mode``)."""
    plan = Plan(Config(domains={}), "d", tuple(statuses), (), ())
    prepared = Prepared(descriptors, plan, (), hits_addend, skeleton=skeleton)
    return build_response(Decision(prepared, statuses, rejects(statuses) and not shadow_mode),
                          options or AnswerOptions())


def headers(statuses: list[Status], options: AnswerOptions = IETF, descriptors: list[Descriptor] | None = None,
            shadow_mode: bool = False) -> dict[str, str]:
    """The headers the service adds to its answer for ``statuses`` (descriptors: one ("k<i>", "v") each)."""
    descriptors = descriptors or [Descriptor(((f"k{i}", "v"),)) for i in range(len(statuses))]
    response = respond(descriptors, statuses, options, shadow_mode)
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
        response = respond(descriptors, statuses)
        assert response.overall_code == OVER_LIMIT
        assert [s.code for s in response.statuses] == [OVER_LIMIT if s.over else OK for s in statuses]
    shadow = respond(descriptors, [Status(MINUTE, over=True, shadow=True), Status(HOUR)])
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


def test_the_default_headers_are_envoyproxy_ratelimits() -> None:
    """envoyproxy/ratelimit (src/service/ratelimit.go, src/settings/settings.go): with
    LIMIT_RESPONSE_HEADERS_ENABLED, the last descriptor rejecting the request, else the one closest to its limit
    (the least remaining, the first of equals) as RateLimit-Limit (the bare number), RateLimit-Remaining and
    RateLimit-Reset, and nothing more."""
    plain = AnswerOptions(headers=ResponseHeaders.RATELIMIT)
    statuses = [Status(HOUR, remaining=3, reset_us=1_500_000), Status(MINUTE, over=True, remaining=0, reset_us=9),
                Status(MINUTE, remaining=0, reset_us=7_000_000)]
    assert headers(statuses, plain) == {"RateLimit-Limit": "10", "RateLimit-Remaining": "0", "RateLimit-Reset": "1"}
    assert headers(statuses[:1], plain) == {"RateLimit-Limit": "100", "RateLimit-Remaining": "3",
                                            "RateLimit-Reset": "2"}
    # equals: the first, unless one of them rejects the request
    assert headers(statuses[2:] + statuses[2:], plain)["RateLimit-Reset"] == "7"
    assert headers(statuses[2:] + statuses[1:2], plain)["RateLimit-Reset"] == "1"
    assert headers([Status(None, remaining=2**32 - 1)], plain) == {}  # unlimited: no limit to tell


def test_the_headers_tell_the_last_limit_that_rejects_as_the_reference_does() -> None:
    """As envoyproxy/ratelimit answered beside slidegate (bench/compare.py: shadow_and_real, quota_and_over,
    mixed_units): a descriptor over its limit that rejects the request is told, the last of them, before any
    closer to its limit; one over in shadow mode or in quota mode is not."""
    plain = AnswerOptions(headers=ResponseHeaders.RATELIMIT)
    shadow = Status(MINUTE, over=True, shadow=True, remaining=0, reset_us=1)
    hour_over = Status(RateLimit(2, Unit.HOUR), over=True, remaining=0, reset_us=3_000_000_000)
    minute_full = Status(MINUTE, remaining=0, reset_us=35_000_000)
    assert headers([shadow, hour_over], plain)["RateLimit-Limit"] == "2"
    assert headers([minute_full, hour_over], plain)["RateLimit-Reset"] == "3000"
    assert headers([hour_over, Status(MINUTE, over=True, remaining=0, reset_us=9)], plain)["RateLimit-Limit"] == "10"
    quota_over = Status(MINUTE, over=True, quota=True, remaining=0, reset_us=5_000_000)
    assert headers([quota_over, Status(HOUR, over=True, remaining=0, reset_us=1)], plain)["RateLimit-Limit"] == "100"
    assert headers([shadow, minute_full], plain)["RateLimit-Reset"] == "1"  # no rejection: the first of equals
    # under SHADOW_MODE nothing is rejected, but the descriptor whose own code is OVER_LIMIT is still the one told
    # (as the reference, beside slidegate: its codes stay), and no client is told to wait
    told = headers([minute_full, hour_over], plain, shadow_mode=True)
    assert told["RateLimit-Reset"] == "3000"


def test_the_header_names_are_settings() -> None:
    settings = Settings.load({"LIMIT_RESPONSE_HEADERS_ENABLED": "true", "LIMIT_LIMIT_HEADER": "X-Limit",
                              "LIMIT_REMAINING_HEADER": "X-Left", "LIMIT_RESET_HEADER": "X-Reset"})
    options = AnswerOptions(headers=settings.response_headers, header_names=settings.header_names)
    assert headers([Status(MINUTE, remaining=4, reset_us=2)], options) == {
        "X-Limit": "10", "X-Left": "4", "X-Reset": "1"}
    for bad in ("", "Rate Limit", "X-Limit:", "ä"):
        with pytest.raises(SettingsError, match=r"LIMIT_LIMIT_HEADER .* is not an HTTP header name"):
            Settings.load({"LIMIT_LIMIT_HEADER": bad})


def test_a_request_rejected_by_its_quota_limits_waits_for_the_first_of_them() -> None:
    # every quota limit over: the request fits once any one has room; a plain limit over must have room too
    quota_soon, quota_late = Status(MINUTE, over=True, reset_us=1_100_000, quota=True), Status(
        HOUR, over=True, reset_us=3_600_000_000, quota=True)
    assert headers([quota_soon, quota_late])["Retry-After"] == "2"
    assert headers([quota_late, Status(MINUTE, over=True, reset_us=30_000_000)])["Retry-After"] == "3600"
    room = Status(HOUR, remaining=5, reset_us=1, quota=True)
    assert headers([quota_late, room, Status(MINUTE, over=True, reset_us=30_000_000)])["Retry-After"] == "30"
    assert "Retry-After" not in headers([quota_late, room])  # one quota limit has room: admitted


COUNTED = [MINUTE, HOUR, RateLimit(5, Unit.SECOND, name="burst", unit_multiplier=3)]


def status(*fields: Any) -> Status:
    """A Status of these first fields, the others left at their defaults (hypothesis would draw every field of a
    NamedTuple it is given itself)."""
    return Status(*fields)


# as the limiter makes them: a counted limit's decision, or a descriptor with no limit or an unlimited one
STATUS = st.one_of(
    st.builds(status, st.sampled_from(COUNTED), st.booleans(), st.integers(0, 2**32 - 1), st.integers(0, 10**10),
              st.booleans(), st.none(), st.booleans()),
    st.builds(status, st.sampled_from([None, RateLimit(0, None, unlimited=True)]), st.just(False),
              st.sampled_from([0, 2**32 - 1])))


@given(st.lists(st.tuples(STATUS, STATUS), min_size=1, max_size=6), st.booleans(), st.booleans(), st.booleans())
def test_a_response_from_its_skeleton_is_the_one_built_anew(pairs: list[tuple[Status, Status]], shadow_mode: bool,
                                                           with_headers: bool, metadata: bool) -> None:
    descriptors = [Descriptor(((f"k{i}", "v"),)) for i in range(len(pairs))]
    options = AnswerOptions(metadata, ResponseHeaders.IETF if with_headers else ResponseHeaders.NONE)
    # made before the decision, from the limits alone; then two decisions of the same limits
    skeleton = response_skeleton([Status(first.limit) for first, _ in pairs]).SerializeToString()
    firsts = [first for first, _ in pairs]
    seconds = [Status(first.limit, second.over, second.remaining, second.reset_us, second.shadow, None, second.quota)
               for first, second in pairs]
    for statuses in (firsts, seconds):
        made = respond(descriptors, statuses, options, shadow_mode, 3, skeleton)
        anew = respond(descriptors, statuses, options, shadow_mode, 3)
        assert made == anew
        assert made.SerializeToString(deterministic=True) == anew.SerializeToString(deterministic=True)


def test_a_rejection_by_one_quota_of_two_still_says_when_to_retry() -> None:
    """Found by the mutation check's run of the skeleton property test: statuses put together by hand can reject
    by one quota limit while another has room; the wait is the rejecting limit's, not a crash."""
    over = Shown("over", (), 10, 60, 0, 5_000_000, over=True, blocking=True, quota=True)
    room = Shown("room", (), 10, 60, 3, 1_000_000, over=False, blocking=False, quota=True)
    assert retry_after([over, room]) == 5
