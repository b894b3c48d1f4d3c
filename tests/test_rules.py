"""envoyproxy/ratelimit's rules, decided by the service and its limiter on every backend (tests/backends.py) with
an injected clock, no gRPC server in between: overrides, replaces, shadow and quota mode, dynamic metadata,
unit multipliers, negative hits, wildcards and unlimited rules. Their wire form is tested in test_service.py."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from google.protobuf import json_format

from slidegate.algorithms import Algorithm
from slidegate.backends.memory import MemoryBackend
from slidegate.config import load_directory
from slidegate.decider import Refused, refusal
from slidegate.limiter import Descriptor, InvalidOverride, Limiter, Status
from slidegate.protos import ratelimit_unit_pb2, rls_pb2
from slidegate.request import InvalidRequest
from tests.conftest import Clock, Decider
from tests.helpers import OK, OVER_LIMIT, descriptor, request

Limits = Callable[..., Awaitable[Decider]]

CONFIG = """
domain: f
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2, name: per-user}
  - key: vip
    rate_limit: {unit: minute, requests_per_unit: 100, name: vip, replaces: [{name: per-user}]}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota
    quota_mode: true
    metadata: {plan: free}
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: five_minutes
    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 1, algorithm: fixed_window}
  - key: path
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 1}
"""


async def test_override_replaces_the_configured_limit(limits: Limits) -> None:
    service = await limits(CONFIG)
    d = descriptor(("user", "u1"))
    d.limit.requests_per_unit = 1
    d.limit.unit = ratelimit_unit_pb2.HOUR
    d.limit.unit_multiplier.value = 2
    first = await service.should_rate_limit(request("f", d))
    status = first.statuses[0]
    assert (first.overall_code, status.limit_remaining) == (OK, 0)
    assert (status.current_limit.requests_per_unit, status.current_limit.unit) == (
        1, rls_pb2.RateLimitResponse.RateLimit.HOUR)
    assert status.current_limit.unit_multiplier.value == 2
    assert status.duration_until_reset.seconds == 7200
    assert (await service.should_rate_limit(request("f", d))).overall_code == OVER_LIMIT
    # the override has its own counter: the configured 2/minute is untouched
    plain = await service.should_rate_limit(request("f", descriptor(("user", "u1"))))
    assert (plain.overall_code, plain.statuses[0].limit_remaining) == (OK, 1)
    # for an unknown domain overrides are ignored
    unknown = await service.should_rate_limit(request("nope", d))
    assert unknown.overall_code == OK and not unknown.statuses[0].HasField("current_limit")


async def test_an_override_without_a_unit_is_a_bad_request(limits: Limits) -> None:
    service = await limits(CONFIG)
    d = descriptor(("user", "u1"))
    d.limit.requests_per_unit = 1
    with pytest.raises(InvalidRequest) as caught:
        await service.should_rate_limit(request("f", d))
    assert refusal(caught.value) == (Refused.INVALID_ARGUMENT,
                                     "descriptor 0: limit override has no valid unit (0)")


async def test_replaces_drops_the_named_limit(limits: Limits) -> None:
    service = await limits(CONFIG)
    for _ in range(3):
        reply = await service.should_rate_limit(request("f", descriptor(("user", "u")), descriptor(("vip", "u"))))
        assert reply.overall_code == OK
        assert not reply.statuses[0].HasField("current_limit")  # per-user replaced by vip
        assert reply.statuses[1].current_limit.name == "vip"
    # on its own, per-user was never counted
    alone = await service.should_rate_limit(request("f", descriptor(("user", "u"))))
    assert alone.statuses[0].limit_remaining == 1


async def test_shadow_mode_rule_never_rejects(limits: Limits) -> None:
    service = await limits(CONFIG)
    codes = []
    for _ in range(3):
        reply = await service.should_rate_limit(request("f", descriptor(("shadow", "s")), descriptor(("user", "v"))))
        codes.append((reply.overall_code, reply.statuses[0].code, reply.statuses[0].limit_remaining))
    # the shadow rule is over from the second call, but reports OK and does not block the user limit
    assert codes == [(OK, OK, 0), (OK, OK, 0), (OVER_LIMIT, OK, 0)]


async def test_global_shadow_mode(limits: Limits) -> None:
    service = await limits(CONFIG, shadow_mode="true")
    replies = [await service.should_rate_limit(request("f", descriptor(("user", "g")))) for _ in range(3)]
    assert [r.overall_code for r in replies] == [OK, OK, OK]
    assert [r.statuses[0].code for r in replies] == [OK, OK, OVER_LIMIT]  # descriptors keep their real code


async def test_quota_mode_and_dynamic_metadata(limits: Limits) -> None:
    service = await limits(CONFIG, response_dynamic_metadata="true")
    replies = [await service.should_rate_limit(request("f", descriptor(("quota", "q")), descriptor(("nothing", "x"))))
               for _ in range(2)]
    # its only quota descriptor over: every quota descriptor of the request is, so it is rejected
    assert [(r.overall_code, r.statuses[0].code) for r in replies] == [(OK, OK), (OVER_LIMIT, OVER_LIMIT)]
    metadata = json_format.MessageToDict(replies[1].dynamic_metadata)
    # slidegate's own, beside the reference's: each descriptor's answer and rule, and the rules that said no
    assert metadata.pop("statuses") == [{"code": "OVER_LIMIT", "rule": "quota", "limit": 1.0, "remaining": 0.0},
                                        {"code": "OK"}]
    assert metadata.pop("rejectedBy") == "quota"
    # the reference's fields, as its ratelimitToMetadata writes them (since its #1112): the rules' metadata only of
    # the descriptors that passed (here none: the quota one was over)
    assert metadata == {"domain": "f", "descriptors": [{"entries": ["quota=q"]}, {"entries": ["nothing=x"]}]}
    assert json_format.MessageToDict(replies[0].dynamic_metadata)["metadata"] == {"plan": "free"}  # it passed
    assert "rejectedBy" not in json_format.MessageToDict(replies[0].dynamic_metadata)  # admitted
    addend = await service.should_rate_limit(request("f", descriptor(("user", "m"), hits=1), hits_addend=2))
    metadata = json_format.MessageToDict(addend.dynamic_metadata)
    assert metadata.pop("statuses")[0]["rule"] == "per-user"  # its limit's name
    assert metadata == {"domain": "f", "descriptors": [{"entries": ["user=m"], "hitsAddend": 1.0}], "hitsAddend": 2.0}
    plain = await limits(CONFIG)
    reply = await plain.should_rate_limit(request("f", descriptor(("quota", "q"))))
    assert not reply.HasField("dynamic_metadata")


async def test_unit_multiplier_reported_to_envoy(limits: Limits, clock: Clock) -> None:
    service = await limits(CONFIG)
    clock.now_us = (clock.now_us // 300_000_000) * 300_000_000 + 60_000_000  # one minute into a 5-minute window
    reply = await service.should_rate_limit(request("f", descriptor(("five_minutes", "x"))))
    limit = reply.statuses[0].current_limit
    assert (limit.unit, limit.unit_multiplier.value) == (rls_pb2.RateLimitResponse.RateLimit.MINUTE, 5)
    assert reply.statuses[0].duration_until_reset.seconds == 240


async def test_negative_hits_give_budget_back(limits: Limits) -> None:
    service = await limits(CONFIG, negative_hits_enabled="true")
    for _ in range(2):
        await service.should_rate_limit(request("f", descriptor(("user", "n"))))
    assert (await service.should_rate_limit(request("f", descriptor(("user", "n"))))).overall_code == OVER_LIMIT
    refund = descriptor(("user", "n"), hits=1)
    refund.is_negative_hits = True
    reply = await service.should_rate_limit(request("f", refund))
    assert (reply.overall_code, reply.statuses[0].limit_remaining) == (OK, 1)
    assert (await service.should_rate_limit(request("f", descriptor(("user", "n"))))).overall_code == OK


async def test_wildcard_value_counts_per_value(limits: Limits) -> None:
    service = await limits(CONFIG)
    for path in ("/api/a", "/api/b"):
        assert (await service.should_rate_limit(request("f", descriptor(("path", path))))).overall_code == OK
    assert (await service.should_rate_limit(request("f", descriptor(("path", "/api/a"))))).overall_code == OVER_LIMIT
    free = await service.should_rate_limit(request("f", descriptor(("path", "/other"))))
    assert free.overall_code == OK and not free.statuses[0].HasField("current_limit")


async def test_an_override_with_a_window_beyond_exact_counting_is_refused(limits: Limits) -> None:
    service = await limits(CONFIG, default_algorithm=Algorithm.TOKEN_BUCKET.value)
    d = descriptor(("user", "o"))
    d.limit.requests_per_unit, d.limit.unit = 1, ratelimit_unit_pb2.YEAR
    d.limit.unit_multiplier.value = 1000
    with pytest.raises(InvalidOverride) as caught:
        await service.should_rate_limit(request("f", d))
    assert refusal(caught.value) == (Refused.INVALID_ARGUMENT,
                                     "limit override window of 31536000000 s is longer than the 9007199254 s allowed")


async def test_an_override_of_the_largest_token_bucket_counts_exactly(limits: Limits, clock: Clock) -> None:
    # 4294967291 (a prime) a year: a token is 31,536,000,000,000 ticks, a full bucket about 2^77 (once refused)
    service = await limits(CONFIG, default_algorithm=Algorithm.TOKEN_BUCKET.value)

    async def take(hits: int) -> tuple[int, int, int]:
        d = descriptor(("user", "o"), hits=hits)
        d.limit.requests_per_unit, d.limit.unit = 4294967291, ratelimit_unit_pb2.YEAR
        reply = await service.should_rate_limit(request("f", d))
        return reply.overall_code, reply.statuses[0].limit_remaining, reply.statuses[0].duration_until_reset.seconds

    assert await take(4294967291) == (OK, 0, 31_536_000)
    assert await take(1) == (OVER_LIMIT, 0, 1)  # a token every 7.3 ms, rounded up to a whole second
    clock.advance(1.0)  # 136.19 tokens back
    assert await take(137) == (OVER_LIMIT, 0, 1)
    assert (await take(136))[:2] == (OK, 0)
    clock.advance(31_536_000.0)
    assert await take(0) == (OK, 4294967291, 0)


async def test_an_unlimited_rule_replaces_too(limits: Limits) -> None:
    service = await limits("""
        domain: r
        descriptors:
          - key: remote_address
            rate_limit: {unit: minute, requests_per_unit: 0, name: per-client}
          - key: api_key
            value: premium
            rate_limit: {unlimited: true, replaces: [{name: per-client}]}
    """)
    reply = await service.should_rate_limit(request("r", descriptor(("remote_address", "1.2.3.4")),
                                                    descriptor(("api_key", "premium"))))
    assert reply.overall_code == OK
    alone = await service.should_rate_limit(request("r", descriptor(("remote_address", "1.2.3.4"))))
    assert alone.overall_code == OVER_LIMIT


async def test_quota_mode_rejects_only_when_every_quota_descriptor_is_over(limits: Limits) -> None:
    """envoyproxy/ratelimit's quota mode (src/service/ratelimit.go, shouldRateLimitWorker): a quota-mode
    descriptor over its limit keeps OVER_LIMIT as its own code; the request is OVER_LIMIT when a descriptor not
    in quota mode is over, or when every quota-mode descriptor of the request is (at least one)."""
    service = await limits(CONFIG)
    q1, q2 = descriptor(("quota", "a")), descriptor(("quota2", "a"))
    assert (await service.should_rate_limit(request("f", q1))).overall_code == OK  # quota a: 1 of 1
    # one quota descriptor over, the other not: admitted, the over one says so
    both = await service.should_rate_limit(request("f", q1, q2))
    assert (both.overall_code, [s.code for s in both.statuses]) == (OK, [OVER_LIMIT, OK])
    assert both.statuses[1].limit_remaining == 2  # quota2 a: 1 of 3
    # a descriptor not in quota mode that is over rejects whatever the quota ones say
    for _ in range(2):
        await service.should_rate_limit(request("f", descriptor(("user", "a"))))
    mixed = await service.should_rate_limit(request("f", q2, descriptor(("user", "a"))))
    assert (mixed.overall_code, [s.code for s in mixed.statuses]) == (OVER_LIMIT, [OK, OVER_LIMIT])
    # all-or-nothing: neither rejected request counted anything on its other descriptors
    assert (await service.should_rate_limit(request("f", q2))).statuses[0].limit_remaining == 1  # 2 of 3
    assert (await service.should_rate_limit(request("f", q2))).statuses[0].limit_remaining == 0  # 3 of 3
    # now both quota descriptors are over: rejected
    over = await service.should_rate_limit(request("f", q1, q2))
    assert (over.overall_code, [s.code for s in over.statuses]) == (OVER_LIMIT, [OVER_LIMIT, OVER_LIMIT])


async def test_a_request_rejected_by_its_quota_descriptors_counts_nothing(limits: Limits) -> None:
    service = await limits(CONFIG)
    await service.should_rate_limit(request("f", descriptor(("quota", "b"))))
    rejected = await service.should_rate_limit(request("f", descriptor(("quota", "b")), descriptor(("user", "b"))))
    assert (rejected.overall_code, [s.code for s in rejected.statuses]) == (OVER_LIMIT, [OVER_LIMIT, OK])
    alone = await service.should_rate_limit(request("f", descriptor(("user", "b"))))
    assert alone.statuses[0].limit_remaining == 1  # the rejected request took none of per-user's 2


async def test_global_quota_mode(limits: Limits) -> None:
    """QUOTA_MODE=true (envoyproxy/ratelimit src/settings/settings.go) puts every limit in quota mode; a
    shadow_mode rule stays a shadow."""
    service = await limits(CONFIG, quota_mode="true", response_dynamic_metadata="true")  # its statuses, below
    user, path = descriptor(("user", "g")), descriptor(("path", "/api/g"))
    for _ in range(2):
        await service.should_rate_limit(request("f", user))
    # per-user (2/minute) is over, the path limit is not: both in quota mode, so admitted
    reply = await service.should_rate_limit(request("f", user, path))
    assert (reply.overall_code, [s.code for s in reply.statuses]) == (OK, [OVER_LIMIT, OK])
    assert [s["code"] for s in json_format.MessageToDict(reply.dynamic_metadata)["statuses"]] == ["OVER_LIMIT", "OK"]
    over = await service.should_rate_limit(request("f", user, path))
    assert (over.overall_code, [s.code for s in over.statuses]) == (OVER_LIMIT, [OVER_LIMIT, OVER_LIMIT])
    # overrides are limits too
    d = descriptor(("user", "o"))
    d.limit.requests_per_unit, d.limit.unit = 1, ratelimit_unit_pb2.HOUR
    await service.should_rate_limit(request("f", d))
    assert (await service.should_rate_limit(request("f", d, path))).overall_code == OVER_LIMIT  # path still over
    shadow = descriptor(("shadow", "g"))
    codes = [(await service.should_rate_limit(request("f", shadow))).statuses[0].code for _ in range(2)]
    assert codes == [OK, OK]  # over from the second, but a shadow answers OK


async def test_a_decisions_statuses_keep_each_field_in_its_place(write_config: Callable[..., Path],
                                                                 clock: Clock) -> None:
    # the Limiter makes a decision's statuses by position (limiter.py): each field must land where its name says;
    # decisions whose fields differ (over or not, shadow, quota, remaining and hits), so that a shift between shows
    config = load_directory(write_config("""
        domain: d
        descriptors:
          - key: k
            shadow_mode: true
            rate_limit: {unit: minute, requests_per_unit: 3}
          - key: q
            quota_mode: true
            rate_limit: {unit: minute, requests_per_unit: 5}
        """))
    limiter = Limiter(lambda: config, MemoryBackend(), clock=clock)
    plan = limiter.prepare("d", [Descriptor((("k", "v"),), hits_addend=2)])
    matched = plan.statuses[0]
    assert matched.limit is not None and matched.rule is not None
    for over, remaining in ((False, 1), (True, 0)):
        decided = await limiter.decide(plan)
        (status,) = decided.statuses
        assert status == Status(limit=matched.limit, over=over, remaining=remaining, reset_us=status.reset_us,
                                shadow=True, rule=matched.rule, quota=False, hits=2)
        assert (decided.degraded, decided.late, decided.cached) == (None, False, False)
        assert 0 < status.reset_us <= 60_000_000
    quota_plan = limiter.prepare("d", [Descriptor((("q", "v"),), hits_addend=2)])
    (status,) = (await limiter.decide(quota_plan)).statuses
    assert status == quota_plan.statuses[0]._replace(remaining=3, reset_us=status.reset_us)
    assert (status.quota, status.shadow, status.over, status.hits) == (True, False, False, 2)


async def test_a_second_and_a_minute_are_decided_together(limits: Limits, clock: Clock) -> None:
    """A request naming a per-second limit (the per-second Redis's, under REDIS_PERSECOND) and a per-minute one
    (the main Redis's) is all or nothing across both: a rejection by either counts in neither."""
    service = await limits("""
        domain: t
        descriptors:
          - key: burst
            rate_limit: {unit: second, requests_per_unit: 2}
          - key: steady
            rate_limit: {unit: minute, requests_per_unit: 3}
    """)
    both = request("t", descriptor(("burst", "b")), descriptor(("steady", "s")))
    replies = [await service.should_rate_limit(both) for _ in range(3)]
    assert [r.overall_code for r in replies] == [OK, OK, OVER_LIMIT]
    assert [s.code for s in replies[2].statuses] == [OVER_LIMIT, OK]
    # the third request's minute hit was not counted: one is left for a later second
    assert replies[2].statuses[1].limit_remaining == 1
    clock.advance(1.5)
    reply = await service.should_rate_limit(both)
    assert (reply.overall_code, [s.limit_remaining for s in reply.statuses]) == (OK, [1, 0])
    clock.advance(1.5)
    reply = await service.should_rate_limit(both)
    assert [s.code for s in reply.statuses] == [OK, OVER_LIMIT] and reply.overall_code == OVER_LIMIT
    # and the second's hit was not counted either: all of it is left
    assert reply.statuses[0].limit_remaining == 2
