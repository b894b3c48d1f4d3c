"""Hostile RLQS clients: bytes on the stream that are not a RateLimitQuotaUsageReports (the stream ends with
INVALID_ARGUMENT and its reason, one log line, no traceback, its buckets given back), and many streams that
share bucket ids ending at once (every holder given back or detached, on one Redis and across a Cluster's
slots)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import grpc
import pytest
import redis

from slidegate.application import Application
from slidegate.backends.redis_connect import Topology
from slidegate.quotas.ledger import Assignment, Holder
from slidegate.quotas.storage import GIVE_BACK_BATCH, Departure, Quota, RedisQuotas
from slidegate.server import start_server
from tests.redis_servers import RedisServer
from tests.redis_topologies import Cluster
from tests.test_quota_service import METHOD, Reports, Response, Stream, actions, key, quotas, user

__all__ = ["quotas"]  # the fixture, shared with tests/test_quota_service.py

Opener = Callable[..., Awaitable[tuple[Application, Callable[[], Stream]]]]

GARBAGE = {
    "corrupt": b"\xff\xff\xff\xff garbage",
    "truncated": Reports(domain="quotas", bucket_quota_usages=[
        Reports.BucketQuotaUsage(bucket_id={"bucket": user("ann")}, num_requests_allowed=1)]).SerializeToString()[:-3],
    "a domain that is not UTF-8": b"\x0a\x02\xff\xfe",
}


def gauge(app: Application, name: str) -> float:
    return app.metrics.registry.get_sample_value(name) or 0.0


async def wait_closed(app: Application) -> None:
    """Until no quota stream is open (the gauge falls once a stream has given its holders back)."""
    for _ in range(500):
        if gauge(app, "ratelimit_quota_streams") == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("quota streams still open")


@contextlib.asynccontextmanager
async def serving(app: Application) -> AsyncIterator[grpc.aio.Channel]:
    """A channel to a server of ``app``'s own."""
    server, _, port = await start_server(app.service, "127.0.0.1", 0, quotas=app.quotas)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield channel
    finally:
        await channel.close(None)
        await server.stop(0)


def raw(channel: grpc.aio.Channel, instance: str = "") -> grpc.aio.StreamStreamCall:  # type: ignore[type-arg]
    """A quota stream that sends and reads bytes as they are."""
    method = channel.stream_stream(METHOD, request_serializer=lambda b: b, response_deserializer=lambda b: b)
    return method(metadata=(("x-rlqs-instance", instance),) if instance else None)  # type: ignore[call-arg]


def opened(channel: grpc.aio.Channel, instance: str = "") -> Stream:
    method = channel.stream_stream(METHOD, request_serializer=Reports.SerializeToString,
                                   response_deserializer=Response.FromString)
    return Stream(method(metadata=(("x-rlqs-instance", instance),) if instance else None))  # type: ignore[call-arg]


async def ended(call: grpc.aio.StreamStreamCall) -> grpc.aio.AioRpcError:  # type: ignore[type-arg]
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call.read()
    return raised.value


def good_report(*names: str) -> bytes:
    message = Reports(domain="quotas")
    for name in names:
        usage = message.bucket_quota_usages.add()
        usage.bucket_id.bucket.update(user(name))
        usage.num_requests_allowed = 1
    return message.SerializeToString()


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def holders(client: redis.Redis, prefix: str) -> dict[str, dict[str, Holder]]:
    """Every quota ledger under ``prefix``: its holders by name."""
    return {text(ledger): {text(name)[2:]: Holder.decode(text(value)) for name, value in client.hgetall(ledger).items()
                           if text(name).startswith("h:")}
            for ledger in client.scan_iter(match=f"{prefix}*quota*", count=1000)}


async def answer(call: grpc.aio.StreamStreamCall) -> Response:  # type: ignore[type-arg]
    data = await call.read()
    assert isinstance(data, bytes), data
    return Response.FromString(data)


# ---------------------------------------------------------------------------------------------------------------
# Bytes that are not a report


@pytest.mark.parametrize("payload", list(GARBAGE.values()), ids=list(GARBAGE))
async def test_bytes_that_are_not_a_report_end_the_stream_with_invalid_argument_and_one_log_line(
        quotas: Opener, payload: bytes, caplog: pytest.LogCaptureFixture) -> None:
    app, _ = await quotas()
    with caplog.at_level(logging.DEBUG):
        async with serving(app) as channel:
            call = raw(channel)
            await call.write(payload)
            error = await ended(call)
        await wait_closed(app)
    details = error.details() or ""
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith("malformed RateLimitQuotaUsageReports: "), details
    assert "Unexpected" not in details and "DecodeError" not in details
    assert "Traceback" not in caplog.text and not [r for r in caplog.records if r.exc_info]
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, caplog.text
    assert "INVALID_ARGUMENT" in warnings[0].getMessage()
    assert "malformed RateLimitQuotaUsageReports" in warnings[0].getMessage()


async def test_a_client_that_keeps_sending_garbage_gets_one_log_line(quotas: Opener,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    app, _ = await quotas()
    with caplog.at_level(logging.WARNING):
        async with serving(app) as channel:
            for _ in range(5):
                call = raw(channel)
                await call.write(GARBAGE["corrupt"])
                assert (await ended(call)).code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(caplog.records) == 1, caplog.text


async def test_garbage_after_a_good_report_ends_the_stream_and_gives_its_buckets_back(
        quotas: Opener, redis_client: redis.Redis, key_prefix: str) -> None:
    app, stream = await quotas()
    async with serving(app) as channel:
        call = raw(channel)
        await call.write(good_report("bo", "cy"))
        assert set(actions(await answer(call))) == {key(user("bo")), key(user("cy"))}
        assert gauge(app, "ratelimit_quota_buckets") == 2
        await call.write(GARBAGE["corrupt"])
        error = await ended(call)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    await wait_closed(app)
    assert gauge(app, "ratelimit_quota_buckets") == 0
    if app.settings.backend_type == "redis":
        assert holders(redis_client, key_prefix) and not any(holders(redis_client, key_prefix).values())
    # the service goes on
    assert key(user("dot")) in actions(await stream().report((user("dot"), 1, 0)))


async def test_garbage_from_an_envoy_that_names_itself_keeps_its_share_for_its_next_stream(
        quotas: Opener) -> None:
    app, stream = await quotas(metadata=(("x-rlqs-instance", "envoy-9"),))
    async with serving(app) as channel:
        call = raw(channel, "envoy-9")
        await call.write(good_report("eve"))
        first = actions(await answer(call))[key(user("eve"))]
        assert first.quota_assignment_action.rate_limit_strategy.token_bucket.max_tokens == 4
        await call.write(GARBAGE["truncated"])
        assert (await ended(call)).code() == grpc.StatusCode.INVALID_ARGUMENT
    await wait_closed(app)
    # detached as the stream ended: its next stream takes the holder up (still owned, it would be denied)
    again = actions(await stream().report((user("eve"), 1, 0)))[key(user("eve"))]
    assert again.quota_assignment_action.rate_limit_strategy.token_bucket == \
        first.quota_assignment_action.rate_limit_strategy.token_bucket


# ---------------------------------------------------------------------------------------------------------------
# Many streams sharing bucket ids, ending at once


async def test_many_streams_sharing_buckets_give_every_holder_back_when_they_end_at_once(
        quotas: Opener, redis_client: redis.Redis, key_prefix: str) -> None:
    """20 streams and 10 of Envoys that name themselves report the same bucket ids (more than one storage round
    trip's worth each); all end at once: the 20 release their holders, the 10 detach theirs, and the first
    Envoy to have reported, back on a new stream, finds its share where it left it."""
    buckets = [(user(f"b{i}"), 1, 0) for i in range(GIVE_BACK_BATCH + 22)]
    app, _ = await quotas()
    async with serving(app) as channel:
        first = opened(channel, "first")
        shares = actions(await first.report(*buckets))
        assert {a.quota_assignment_action.rate_limit_strategy.token_bucket.max_tokens for a in shares.values()} == {4}
        streams = [opened(channel) for _ in range(20)] + [opened(channel, f"other-{n}") for n in range(9)]
        await asyncio.gather(*(s.report(*buckets) for s in streams))
        assert gauge(app, "ratelimit_quota_buckets") == 30 * len(buckets)
        for s in [first, *streams]:
            s.call.cancel()
        await wait_closed(app)
        assert gauge(app, "ratelimit_quota_buckets") == 0
        if app.settings.backend_type == "redis":
            ledgers = holders(redis_client, key_prefix)
            assert len(ledgers) == len(buckets)
            for ledger, held in ledgers.items():
                assert len(held) == 10 and all(h.owner == "" for h in held.values()), (ledger, held)
        again = actions(await opened(channel, "first").report(*buckets))
    assert {k: a.quota_assignment_action.rate_limit_strategy.token_bucket for k, a in again.items()} == \
        {k: a.quota_assignment_action.rate_limit_strategy.token_bucket for k, a in shares.items()}


# ---------------------------------------------------------------------------------------------------------------
# The storage's give_back


async def reported(storage: RedisQuotas, count: int) -> list[Departure]:
    """A holder in each of ``count`` ledgers: half to release, half (of an owner) to detach."""
    departures = []
    for i in range(count):
        quota = Quota(f"sgtest-give-back:{i}:quota:5:60000", 5, 60_000)
        assert await storage.report(quota, f"h{i}", 1, 0, 0, "s1") == Assignment(4, 1, 60_000)
        departures.append(Departure(quota, f"h{i}", unsure=i % 3, owner="s1" if i % 2 else ""))
    return departures


def left(client: redis.Redis, departures: list[Departure]) -> list[tuple[str, str]]:
    """(holder, owner) of every holder still in the departures' ledgers."""
    out = []
    for d in departures:
        value = client.hget(d.quota.key, "h:" + d.holder)
        if value is not None:
            out.append((d.holder, Holder.decode(text(value)).owner))
    return out


@pytest.fixture
async def single(private_redis: RedisServer) -> AsyncIterator[tuple[RedisQuotas, redis.Redis]]:
    storage = RedisQuotas(Topology("single", private_redis.url), timeout=1.0)
    client = redis.Redis(port=private_redis.port)
    yield storage, client
    await storage.close()
    client.close()


async def test_give_back_releases_and_detaches_after_redis_lost_its_scripts(
        single: tuple[RedisQuotas, redis.Redis]) -> None:
    storage, client = single
    departures = await reported(storage, GIVE_BACK_BATCH + 10)
    client.script_flush()  # a server of this test's own
    assert await storage.give_back(departures) == []
    assert left(client, departures) == [(d.holder, "") for d in departures if d.owner]


async def test_give_back_says_which_holders_a_stopped_redis_did_not_take(
        single: tuple[RedisQuotas, redis.Redis], private_redis: RedisServer) -> None:
    storage, _ = single
    departures = await reported(storage, 5)
    private_redis.stop()
    failed = await storage.give_back(departures)
    assert len(failed) == len(departures) and all(isinstance(exc, Exception) for exc in failed)


async def test_give_back_says_which_holder_redis_refused_and_gives_the_others_back(
        single: tuple[RedisQuotas, redis.Redis]) -> None:
    storage, client = single
    departures = await reported(storage, 6)
    client.delete(departures[2].quota.key)
    client.set(departures[2].quota.key, "not a ledger")  # the script's HGET fails (WRONGTYPE) for this one only
    failed = await storage.give_back(departures)
    assert len(failed) == 1 and "WRONGTYPE" in str(failed[0])
    assert left(client, [d for i, d in enumerate(departures) if i != 2]) == \
        [(d.holder, "") for i, d in enumerate(departures) if d.owner and i != 2]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    yield c
    c.cleanup()


async def test_give_back_across_a_clusters_slots(cluster: Cluster) -> None:
    storage = RedisQuotas(Topology("cluster", cluster.url), timeout=2.0)
    try:
        departures = await reported(storage, 40)  # keys in slots of every master
        masters = {cluster.master_of(d.quota.key).port for d in departures}
        assert len(masters) == 3
        assert await storage.give_back(departures) == []
        for d in departures:
            with cluster.client(cluster.master_of(d.quota.key)) as client:
                fields = client.hgetall(d.quota.key)
                assert [Holder.decode(v).owner for n, v in fields.items() if n.startswith("h:")] == \
                    ([""] if d.owner else []), (d, fields)
                client.delete(d.quota.key)
    finally:
        await storage.close()
