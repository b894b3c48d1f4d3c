"""Settings and rule fields that reach each decision's check, on every backend: a token bucket's burst,
STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, QUOTA_MODE for an override, an unlimited rule's remaining hits, and the
keys a plan counts under (CACHE_KEY_PREFIX, REDIS_HASH_TAG). Found by the mutation check (docs/testing.md)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from redis.crc import key_slot

from slidegate.limiter import UNLIMITED_REMAINING, Descriptor, Override
from slidegate.protos import ratelimit_pb2, ratelimit_unit_pb2
from slidegate.units import Unit
from tests.conftest import Decider
from tests.helpers import OK, OVER_LIMIT, descriptor, request

Limits = Callable[..., Awaitable[Decider]]

CONFIG = """
domain: e
descriptors:
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: token_bucket, burst: 3}
  - key: fixed
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: fixed_window}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: free
    rate_limit: {unlimited: true}
"""


async def codes(service: Decider, *descriptors: ratelimit_pb2.RateLimitDescriptor, n: int = 1) -> list[int]:
    return [(await service.should_rate_limit(request("e", *descriptors))).overall_code for _ in range(n)]


async def test_a_token_buckets_burst_is_its_size(limits: Limits) -> None:
    service = await limits(CONFIG)
    assert await codes(service, descriptor(("bucket", "b")), n=4) == [OK, OK, OK, OVER_LIMIT]


async def remaining_after_a_give_back(service: Decider, value: str) -> int:
    """A fixed window of 3 filled, one request denied, then 2 hits given back: what is left."""
    fixed = descriptor(("fixed", value))
    assert await codes(service, fixed, n=4) == [OK, OK, OK, OVER_LIMIT]
    back = descriptor(("fixed", value), hits=2)
    back.is_negative_hits = True
    reply = await service.should_rate_limit(request("e", back))
    assert reply.overall_code == OK
    return reply.statuses[0].limit_remaining


async def test_a_fixed_window_counts_denied_hits_unless_told_not_to(limits: Limits) -> None:
    # envoyproxy/ratelimit's fixed window counts a denied request's hits: 4 counted, 2 given back, 1 left
    assert await remaining_after_a_give_back(await limits(CONFIG, negative_hits_enabled="true"), "counting") == 1
    stopping = await limits(CONFIG, negative_hits_enabled="true", stop_cache_key_increment_when_overlimit="true")
    assert await remaining_after_a_give_back(stopping, "stopping") == 2


async def test_an_override_is_in_quota_mode_under_quota_mode(limits: Limits) -> None:
    service = await limits(CONFIG, quota_mode="true")
    override = descriptor(("user", "o"))
    override.limit.requests_per_unit, override.limit.unit = 1, ratelimit_unit_pb2.HOUR
    assert await codes(service, override) == [OK]
    # the override is over, the path is not: both quotas, so admitted
    reply = await service.should_rate_limit(request("e", override, descriptor(("path", "p"))))
    assert (reply.overall_code, [s.code for s in reply.statuses]) == (OK, [OVER_LIMIT, OK])


async def test_an_unlimited_rule_reports_the_most_remaining(limits: Limits) -> None:
    reply = await (await limits(CONFIG)).should_rate_limit(request("e", descriptor(("free", "x"))))
    assert (reply.overall_code, reply.statuses[0].limit_remaining) == (OK, UNLIMITED_REMAINING)


def keys(service: Decider, *entries: tuple[str, str]) -> list[str]:
    plan = service.app.limiter.prepare("e", [Descriptor((entry,)) for entry in entries])
    return [check.key for check in plan.checks]


async def test_every_key_is_under_the_prefix(limits: Limits, key_prefix: str) -> None:
    service = await limits(CONFIG)
    override = service.app.limiter.prepare(
        "e", [Descriptor((("user", "o"),), override=Override(2, Unit.HOUR))]).checks
    for key in [*keys(service, ("user", "u"), ("bucket", "b")), *(c.key for c in override)]:
        assert key.startswith(key_prefix), key


async def test_the_domains_hash_tag_puts_its_keys_in_one_slot(limits: Limits) -> None:
    entries = [("user", str(n)) for n in range(20)]
    spread = {key_slot(k.encode()) for k in keys(await limits(CONFIG, redis_hash_tag="limit"), *entries)}
    together = {key_slot(k.encode()) for k in keys(await limits(CONFIG, redis_hash_tag="domain"), *entries)}
    assert len(spread) > 1 and len(together) == 1
