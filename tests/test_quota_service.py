"""The Rate Limit Quota Service over gRPC, as Envoy's quota filter speaks it (a stream of usage reports, an
answer per report), on both storages: what each kind of bucket is assigned, how streams share a quota, and
what bad input gets."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from slidegate.application import Application, build
from slidegate.config import load_directory
from slidegate.protos import ratelimit_strategy_pb2, rlqs_pb2
from slidegate.quotas.ledger import TTL_MS
from slidegate.server import start_server
from slidegate.settings import Settings
from tests.helpers import metric_value

Reports = rlqs_pb2.RateLimitQuotaUsageReports
Response = rlqs_pb2.RateLimitQuotaResponse
ALLOW_ALL = ratelimit_strategy_pb2.RateLimitStrategy.ALLOW_ALL
DENY_ALL = ratelimit_strategy_pb2.RateLimitStrategy.DENY_ALL
METHOD = "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas"

CONFIG = """
domain: quotas
descriptors:
  - key: name
    value: per_user
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 5}
      - key: user
        value: blocked
        rate_limit: {unit: minute, requests_per_unit: 0}
      - key: user
        value: free
        rate_limit: {unlimited: true}
      - key: user
        value: watched
        shadow_mode: true
        rate_limit: {unit: minute, requests_per_unit: 1}
      - key: user
        value: watched-closed
        shadow_mode: true
        rate_limit: {unit: minute, requests_per_unit: 0}
"""


@dataclass
class Stream:
    """One Envoy's stream: ``report`` sends a report and waits for its answer."""

    call: grpc.aio.StreamStreamCall  # type: ignore[type-arg]

    async def report(self, *buckets: tuple[dict[str, str], int, int], domain: str = "quotas",
                     elapsed: int = 5, answered: int | None = None) -> Response | None:
        """Send one report; return its answers (slidegate may answer in parts), merged into one Response, once
        ``answered`` buckets (default: every bucket in the report) have an action; None when 0 are expected."""
        message = Reports(domain=domain)
        for bucket, allowed, denied in buckets:
            usage = message.bucket_quota_usages.add()
            usage.bucket_id.bucket.update(bucket)
            usage.num_requests_allowed, usage.num_requests_denied = allowed, denied
            usage.time_elapsed.seconds = elapsed
        await self.call.write(message)
        expected = len({key(b) for b, _, _ in buckets}) if answered is None else answered
        if not expected:
            return None
        merged = Response()
        while len(merged.bucket_action) < expected:
            # bounded: a bucket left unanswered fails the test, not the run (pytest-timeout's kill segfaults gRPC)
            part = await asyncio.wait_for(self.call.read(), 20)
            assert isinstance(part, Response), f"{len(merged.bucket_action)} of {expected} buckets answered"
            merged.bucket_action.extend(part.bucket_action)
        return merged


def actions(answer: Response | None) -> dict[tuple[tuple[str, str], ...], Response.BucketAction]:
    assert answer is not None
    return {tuple(sorted(a.bucket_id.bucket.items())): a for a in answer.bucket_action}


def user(name: str) -> dict[str, str]:
    return {"name": "per_user", "user": name}


def key(bucket: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(bucket.items()))


@pytest.fixture(params=["memory", "redis"])
async def quotas(request: pytest.FixtureRequest, write_config: Callable[..., Path], redis_url: str,
                 key_prefix: str) -> AsyncIterator[Callable[..., Awaitable[tuple[Application, Callable[[], Stream]]]]]:
    """``await quotas(**settings)``: an app serving CONFIG's quotas on one storage, and a way to open streams."""
    started: list[tuple[grpc.aio.Server, Application, grpc.aio.Channel]] = []

    async def start(text: str = CONFIG, idle_ms: int | None = None, metadata: tuple[tuple[str, str], ...] = (),
                    **settings: str) -> tuple[Application, Callable[[], Stream]]:
        flags = {"config_dir": str(write_config(text)), "backend_type": request.param, "redis_url": redis_url,
                 "cache_key_prefix": key_prefix, **settings}
        app = build(Settings.load({}, flags))
        if idle_ms is not None:
            app.quotas.idle_ms = idle_ms
        server, _, port = await start_server(app.service, "127.0.0.1", 0, quotas=app.quotas)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        started.append((server, app, channel))
        call = channel.stream_stream(METHOD, request_serializer=Reports.SerializeToString,
                                     response_deserializer=Response.FromString)
        # a stream opened without requests yet
        return app, lambda: Stream(call(metadata=metadata or None))  # type: ignore[call-arg]

    yield start
    for server, app, channel in started:
        await channel.close(None)
        await server.stop(0)
        await app.backend.close()
        await app.quotas.close()


async def test_a_quota_bucket_gets_a_token_bucket_with_a_ttl_and_whole_seconds(quotas: Callable[..., Awaitable[
        tuple[Application, Callable[[], Stream]]]]) -> None:
    _, stream = await quotas()
    answer = actions(await stream().report((user("alice"), 1, 0)))
    action = answer[key(user("alice"))].quota_assignment_action
    assert action.assignment_time_to_live.ToMilliseconds() == TTL_MS >= 1000
    bucket = action.rate_limit_strategy.token_bucket
    assert bucket.fill_interval.nanos == 0 and bucket.fill_interval.seconds == 60
    # 5 a minute for the only Envoy: 4 at once (one went through before this answer), then 1 a minute
    assert (bucket.max_tokens, bucket.tokens_per_fill.value) == (4, 1)


async def test_blanket_rules(quotas: Callable[..., Awaitable[tuple[Application, Callable[[], Stream]]]]) -> None:
    _, stream = await quotas()
    s = stream()
    buckets = [user("blocked"), user("free"), user("watched"), user("watched-closed"), {"name": "other"},
               {"unknown_key": "x"}]
    answer = actions(await s.report(*((b, 1, 0) for b in buckets)))
    rules = {k: a.quota_assignment_action.rate_limit_strategy.blanket_rule for k, a in answer.items()}
    # a shadow rule never rejects, not even one of requests_per_unit 0
    assert rules == {key(user("blocked")): DENY_ALL, key(user("free")): ALLOW_ALL, key(user("watched")): ALLOW_ALL,
                     key(user("watched-closed")): ALLOW_ALL, key({"name": "other"}): ALLOW_ALL,
                     key({"unknown_key": "x"}): ALLOW_ALL}
    for action in answer.values():
        assert action.quota_assignment_action.assignment_time_to_live.ToMilliseconds() == TTL_MS
    # an unknown domain: nothing is limited there
    unknown = actions(await s.report((user("alice"), 1, 0), domain="nobody-configured-this"))
    assert unknown[key(user("alice"))].quota_assignment_action.rate_limit_strategy.blanket_rule == ALLOW_ALL


async def test_two_streams_share_one_quota(quotas: Callable[..., Awaitable[tuple[Application,
                                                                                   Callable[[], Stream]]]]) -> None:
    _, stream = await quotas()
    first, second = stream(), stream()
    one = actions(await first.report((user("bob"), 1, 0)))[key(user("bob"))]
    assert one.quota_assignment_action.rate_limit_strategy.token_bucket.max_tokens == 4
    # every report is answered; alone, the same bucket again (Envoy keeps its tokens)
    again = actions(await first.report((user("bob"), 0, 0)))[key(user("bob"))]
    assert again.quota_assignment_action.rate_limit_strategy.token_bucket == \
        one.quota_assignment_action.rate_limit_strategy.token_bucket
    # the first holds the whole limit: the second gets nothing until there is room
    two = actions(await second.report((user("bob"), 1, 0)))[key(user("bob"))]
    assert two.quota_assignment_action.rate_limit_strategy.blanket_rule == DENY_ALL
    # the first, idle now, keeps its bucket for a while: shrunk at once, what it may still let through would stay
    # booked for a window, and neither would get anything (the ledger's tests follow the shares over time)
    kept = actions(await first.report((user("bob"), 0, 0)))[key(user("bob"))]
    assert kept.quota_assignment_action.rate_limit_strategy.token_bucket == \
        one.quota_assignment_action.rate_limit_strategy.token_bucket


async def test_a_closed_stream_gives_its_share_back_after_its_ttl(
        quotas: Callable[..., Awaitable[tuple[Application, Callable[[], Stream]]]]) -> None:
    app, stream = await quotas()
    first = stream()
    await first.report((user("carol"), 1, 0))
    first.call.cancel()
    for _ in range(100):
        if metric_value(app.quotas.metrics.streams) == 0:
            break
        await asyncio.sleep(0.02)
    assert metric_value(app.quotas.metrics.streams) == 0
    # its Envoy may still enforce the assignment until the TTL: the share stays booked (the ledger's tests show
    # when it is free again), so a newcomer gets nothing yet
    late = actions(await stream().report((user("carol"), 1, 0)))[key(user("carol"))]
    assert late.quota_assignment_action.rate_limit_strategy.blanket_rule == DENY_ALL


async def test_idle_buckets_are_abandoned(quotas: Callable[..., Awaitable[tuple[Application,
                                                                                Callable[[], Stream]]]]) -> None:
    app, stream = await quotas(idle_ms=50)
    s = stream()
    await s.report((user("free"), 1, 0))
    await asyncio.sleep(0.1)
    answer = actions(await s.report((user("free"), 0, 0)))
    assert answer[key(user("free"))].HasField("abandon_action")
    assert metric_value(app.quotas.metrics.buckets) == 0
    # made again by a later request: a new bucket
    again = actions(await s.report((user("free"), 1, 0)))
    assert again[key(user("free"))].HasField("quota_assignment_action")


async def test_bad_buckets_are_left_out_and_the_stream_goes_on(
        quotas: Callable[..., Awaitable[tuple[Application, Callable[[], Stream]]]],
        caplog: pytest.LogCaptureFixture) -> None:
    _, stream = await quotas()
    s = stream()
    huge = {f"k{i}": "v" for i in range(100)}
    with caplog.at_level(logging.WARNING, logger="slidegate.quotas"):
        answer = actions(await s.report(({}, 1, 0), (huge, 1, 0), ({"": "x"}, 1, 0), (user("dave"), 1, 0), answered=1))
    assert list(answer) == [key(user("dave"))]
    assert "malformed bucket" in caplog.text and "an empty bucket id" in caplog.text
    # nothing but bad buckets: no answer at all (Envoy keeps its no-assignment behaviour for them); the next
    # answer is the next good report's
    await s.report(({}, 1, 0), answered=0)
    assert list(actions(await s.report((user("erin"), 1, 0)))) == [key(user("erin"))]


async def test_a_flood_of_buckets_is_bounded(quotas: Callable[..., Awaitable[tuple[Application,
                                                                                  Callable[[], Stream]]]],
                                             caplog: pytest.LogCaptureFixture) -> None:
    app, stream = await quotas(rlqs_max_buckets_per_stream="3")
    s = stream()
    with caplog.at_level(logging.WARNING, logger="slidegate.quotas"):
        answer = actions(await s.report(*((user(f"u{i}"), 1, 0) for i in range(10))))
    assert len(answer) == 10
    denied = [k for k, a in answer.items()
              if a.quota_assignment_action.rate_limit_strategy.WhichOneof("strategy") == "blanket_rule"
              and a.quota_assignment_action.rate_limit_strategy.blanket_rule == DENY_ALL]
    assert len(denied) == 7
    assert metric_value(app.quotas.metrics.buckets) == 3
    assert caplog.text.count("more than 3 buckets") == 1
    # once idle, the untracked ones are abandoned (Envoy's memory stays bounded too); the tracked ones stay
    idle = actions(await s.report(*((user(f"u{i}"), 0, 0) for i in range(10))))
    abandoned = {k for k, a in idle.items() if a.HasField("abandon_action")}
    assert abandoned == set(denied)


async def test_a_reload_changes_what_a_bucket_gets(quotas: Callable[..., Awaitable[tuple[Application,
                                                                                      Callable[[], Stream]]]],
                                                   write_config: Callable[..., Path]) -> None:
    app, stream = await quotas()
    s = stream()
    first = actions(await s.report((user("erin"), 1, 0)))[key(user("erin"))]
    assert first.quota_assignment_action.rate_limit_strategy.token_bucket.max_tokens == 4
    changed = CONFIG.replace("requests_per_unit: 5}", "requests_per_unit: 0}")
    app.holder.current = load_directory(write_config(changed))
    later = actions(await s.report((user("erin"), 0, 0)))[key(user("erin"))]
    assert later.quota_assignment_action.rate_limit_strategy.blanket_rule == DENY_ALL
    # a reload that changes the limit to another: Envoy is told to forget the bucket (it would keep a token
    # bucket of the same max_tokens and tokens_per_fill, refill included), and the next report starts afresh
    hourly = CONFIG.replace("{unit: minute, requests_per_unit: 5}", "{unit: hour, requests_per_unit: 5}")
    app.holder.current = load_directory(write_config(CONFIG))
    s2 = stream()
    await s2.report((user("fay"), 1, 0))
    app.holder.current = load_directory(write_config(hourly))
    assert actions(await s2.report((user("fay"), 0, 0)))[key(user("fay"))].HasField("abandon_action")
    fresh = actions(await s2.report((user("fay"), 1, 0)))[key(user("fay"))]
    assert fresh.quota_assignment_action.rate_limit_strategy.token_bucket.fill_interval.seconds == 3600


async def test_an_envoy_that_names_itself_keeps_its_share_across_streams(
        quotas: Callable[..., Awaitable[tuple[Application, Callable[[], Stream]]]]) -> None:
    _, stream = await quotas(metadata=(("x-rlqs-instance", "envoy-7"),))
    first = stream()
    one = actions(await first.report((user("gus"), 1, 0)))[key(user("gus"))]
    assert one.quota_assignment_action.rate_limit_strategy.token_bucket.max_tokens == 4
    first.call.cancel()  # a reconnect: the next stream picks the holder up (a stream of its own would be denied)
    await asyncio.sleep(0.2)
    again = actions(await stream().report((user("gus"), 1, 0)))[key(user("gus"))]
    assert again.quota_assignment_action.rate_limit_strategy.token_bucket == \
        one.quota_assignment_action.rate_limit_strategy.token_bucket


async def test_two_live_streams_naming_the_same_instance_do_not_share_a_holder(
        quotas: Callable[..., Awaitable[tuple[Application, Callable[[], Stream]]]],
        caplog: pytest.LogCaptureFixture) -> None:
    _, stream = await quotas(metadata=(("x-rlqs-instance", "twin"),))
    one = actions(await stream().report((user("hal"), 1, 0)))[key(user("hal"))]
    assert one.quota_assignment_action.rate_limit_strategy.token_bucket.max_tokens == 4
    with caplog.at_level(logging.WARNING, logger="slidegate.quotas"):
        two = actions(await stream().report((user("hal"), 1, 0)))[key(user("hal"))]
    assert two.quota_assignment_action.rate_limit_strategy.blanket_rule == DENY_ALL
    assert "same Envoy instance (twin)" in caplog.text


async def test_a_malformed_instance_name_is_ignored(quotas: Callable[..., Awaitable[tuple[Application,
                                                                                       Callable[[], Stream]]]],
                                                    caplog: pytest.LogCaptureFixture) -> None:
    _, stream = await quotas(metadata=(("x-rlqs-instance", "no spaces allowed"),))
    with caplog.at_level(logging.WARNING, logger="slidegate.quotas"):
        answer = actions(await stream().report((user("ike"), 1, 0)))
    assert answer[key(user("ike"))].quota_assignment_action.rate_limit_strategy.token_bucket.max_tokens == 4
    assert "ignored x-rlqs-instance" in caplog.text
