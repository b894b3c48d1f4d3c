"""The gRPC service in-process against real Redis: the wire contract (validation, answers in request order,
bytes that are not UTF-8, metadata), Redis failures, and the requests it remembers. The rules themselves are
tested without gRPC, on both backends, in test_rules.py."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format

from slidegate import decider as decider_module
from slidegate import outage as outage_module
from slidegate.backends.base import BackendUnavailable, DeadlineExceeded
from slidegate.backends.blocked import OverLimitCache
from slidegate.backends.redis import RedisBackend
from slidegate.config import Config, load_directory
from slidegate.decider import UNDECIDED, Prepared, refusal
from slidegate.heap import Heap
from slidegate.httpapi import HTTP_STATUS
from slidegate.limiter import Descriptor, InvalidOverride, Limiter, LimiterOptions
from slidegate.logs import Repeated
from slidegate.protos import lenient_pb2, rls_pb2, rls_pb2_grpc
from slidegate.request import InvalidRequest
from slidegate.server import start_server
from slidegate.service import METHOD, RateLimitService, grpc_status
from slidegate.stack import free_port
from tests.conftest import Clock
from tests.helpers import OK, OVER_LIMIT, descriptor, request
from tests.redis_servers import RedisServer

CONFIG = """
domain: api
descriptors:
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 2, name: per-client}
  - key: plan
    value: free
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: plan
    value: gold
    rate_limit: {unlimited: true}
  - key: week
    rate_limit: {unit: week, requests_per_unit: 5}
"""

Start = Callable[..., Any]

override_without_unit = descriptor(("client", "c"))
override_without_unit.limit.requests_per_unit = 1


async def test_statuses_in_request_order(rls: Start, clock: Clock) -> None:
    stub = await rls(CONFIG)
    reply = await stub.ShouldRateLimit(request(
        "api", descriptor(("nothing", "x")), descriptor(("client", "c1")), descriptor(("plan", "gold")),
        descriptor(("week", "w")),
    ))
    assert reply.overall_code == OK
    nothing, client, gold, week = reply.statuses
    assert nothing == rls_pb2.RateLimitResponse.DescriptorStatus(code=OK)
    assert client.code == OK and client.limit_remaining == 1
    assert (client.current_limit.requests_per_unit, client.current_limit.unit, client.current_limit.name) == (
        2, rls_pb2.RateLimitResponse.RateLimit.MINUTE, "per-client",
    )
    assert (client.duration_until_reset.seconds, client.duration_until_reset.nanos) == (60, 0)
    assert not gold.HasField("current_limit") and gold.limit_remaining == 4294967295 and gold.code == OK
    assert week.current_limit.unit == rls_pb2.RateLimitResponse.RateLimit.WEEK == 7


async def test_over_limit_answer(rls: Start, clock: Clock) -> None:
    stub = await rls(CONFIG)
    for _ in range(2):
        clock.advance(0.25)
        assert (await stub.ShouldRateLimit(request("api", descriptor(("client", "c"))))).overall_code == OK
    clock.advance(0.25)
    reply = await stub.ShouldRateLimit(request("api", descriptor(("plan", "free")), descriptor(("client", "c"))))
    assert reply.overall_code == OVER_LIMIT
    free, client = reply.statuses
    assert (free.code, free.limit_remaining) == (OK, 1)  # nothing recorded: its room is unchanged
    assert (client.code, client.limit_remaining) == (OVER_LIMIT, 0)
    # the first hit (0.5 s ago) leaves in 59.5 s: said as 60, since Envoy drops the fraction (59 would be early)
    assert (client.duration_until_reset.seconds, client.duration_until_reset.nanos) == (60, 0)


async def test_unknown_domain_is_ok_without_limit(rls: Start) -> None:
    stub = await rls(CONFIG)
    reply = await stub.ShouldRateLimit(request("nope", descriptor(("client", "c")), descriptor()))
    assert reply.overall_code == OK
    assert list(reply.statuses) == [rls_pb2.RateLimitResponse.DescriptorStatus(code=OK)] * 2


async def test_empty_entries_mean_no_limit(rls: Start) -> None:
    stub = await rls(CONFIG)
    reply = await stub.ShouldRateLimit(request("api", descriptor()))
    assert reply.overall_code == OK and not reply.statuses[0].HasField("current_limit")


@pytest.mark.parametrize(
    ("req", "reason"),
    [
        (request("", descriptor(("client", "c"))), "rate limit domain must not be empty"),
        (request("api"), "rate limit descriptor list must not be empty"),
        (request("api", descriptor(("client", "c"), hits=1), override_without_unit),
         "descriptor 1: limit override has no valid unit (0)"),
    ],
)
async def test_invalid_request(rls: Start, req: rls_pb2.RateLimitRequest, reason: str) -> None:
    stub = await rls(CONFIG)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.ShouldRateLimit(req)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == reason


async def test_redis_down_is_unavailable_in_bounded_time_then_recovers(
    rls: Start, private_redis: RedisServer, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outage_module.OutageLog, "QUIET", 0.2)
    stub = await rls(CONFIG, url=private_redis.url, timeout=0.2, use_clock=False)
    req = request("api", descriptor(("client", "c")))
    assert (await stub.ShouldRateLimit(req)).overall_code == OK
    private_redis.stop()
    for _ in range(3):
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.ShouldRateLimit(req, timeout=5)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "rate limit storage unavailable" in (caught.value.details() or "")
        assert time.monotonic() - started < 1.0
    private_redis.start()  # same port, empty: the service reconnects by itself
    reply = await stub.ShouldRateLimit(req)
    assert reply.overall_code == OK and reply.statuses[0].limit_remaining == 1
    await asyncio.sleep(outage_module.OutageLog.QUIET)
    await stub.ShouldRateLimit(req)
    # the outage is logged once (with a count), not once per call, and so is the recovery
    messages = [r.getMessage() for r in caplog.records if r.name == "slidegate.service"]
    assert len(messages) == 2
    assert messages[0].startswith("storage unavailable: calls failed or decided by the failure mode: 1; last: ")
    assert messages[1].startswith("storage answering again: no call failed for 0.")
    assert messages[1].endswith(" (calls failed since the last line: 2)")


async def test_answers_from_the_over_limit_cache_are_not_the_storage_answering(
        write_config: Callable[..., Path], private_redis: RedisServer, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    config = load_directory(write_config(CONFIG))
    backend = OverLimitCache(RedisBackend(private_redis.url, timeout=0.2))
    service = RateLimitService(Limiter(lambda: config, backend))
    over, fresh = [Descriptor((("plan", "free"),))], [Descriptor((("client", "c"),))]
    for _ in range(2):
        await service.decide("api", over, 0)  # the second is over: remembered
    private_redis.stop()
    for _ in range(50):  # an outage while an attack on the over-limit key goes on
        assert (await service.decide("api", over, 0)).overall_code == OVER_LIMIT
        with pytest.raises(BackendUnavailable):
            await service.decide("api", fresh, 0)
    messages = [r.getMessage() for r in caplog.records if r.name == "slidegate.service"]
    assert len(messages) == 1
    assert messages[0].startswith("storage unavailable: calls failed or decided by the failure mode: 1")
    private_redis.start()
    monkeypatch.setattr(outage_module.OutageLog, "QUIET", 0.0)
    assert (await service.decide("api", fresh, 0)).overall_code == OK
    messages = [r.getMessage() for r in caplog.records if r.name == "slidegate.service"]
    assert len(messages) == 2 and messages[1].endswith("(calls failed since the last line: 49)")
    await backend.close()


def test_an_outage_is_one_line_every_ten_seconds(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    outage = outage_module.OutageLog(clock=lambda: now[0])
    for i in range(2000):  # 40 s of an outage, 50 failed calls a second
        now[0] = i / 50
        outage.failed("no answer in time")
    now[0] = 45.0
    outage.answered()  # too soon after the last failure to say
    now[0] = 50.0
    outage.answered()
    outage.answered()  # nothing more to say
    now[0] = 52.0
    outage.failed("refused")  # another outage: told at once
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 6
    assert messages[0] == "storage unavailable: calls failed or decided by the failure mode: 1; last: no answer in time"
    assert messages[1] == ("storage unavailable: calls failed or decided by the failure mode in the last 10 s: 500; "
                           "last: no answer in time")
    assert messages[4] == ("storage answering again: no call failed for 10.0 s, after failures for 40.0 s (calls "
                           "failed since the last line: 499)")
    assert messages[5] == "storage unavailable: calls failed or decided by the failure mode: 1; last: refused"


def test_a_partial_outage_answering_by_turns_is_one_outage(caplog: pytest.LogCaptureFixture) -> None:
    # a cluster with one master down: its slots fail while the others answer, call after call
    now = [0.0]
    outage = outage_module.OutageLog(clock=lambda: now[0])
    for i in range(2000):
        now[0] = i / 50
        if i % 2:
            outage.failed("a master is down")
        else:
            outage.answered()
    assert len(caplog.records) == 4  # the first failure, then one line each 10 s


def test_a_repeated_warning_is_one_line_every_ten_seconds(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    warn = Repeated(logging.getLogger("test"), "a compensating call failed (%s)", clock=lambda: now[0])
    for i in range(1000):  # 20 s, 50 a second
        now[0] = i / 50
        warn(f"error {i}")
    assert [r.getMessage() for r in caplog.records] == [
        "a compensating call failed (error 0)",
        "a compensating call failed (error 500) (499 more like it in the last 10 s)"]


async def test_redis_that_never_answers_is_bounded(rls: Start) -> None:
    # a TCP server that accepts and reads but never replies: the call must still end within the timeout
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(-1)

    listener = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        stub = await rls(CONFIG, url=f"redis://127.0.0.1:{port}/0", timeout=0.2, use_clock=False)
        for _ in range(2):
            started = time.monotonic()
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.ShouldRateLimit(request("api", descriptor(("client", "c"))), timeout=5)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            assert time.monotonic() - started < 1.0
    finally:
        listener.close()


async def test_refused_connection_is_unavailable(rls: Start) -> None:
    stub = await rls(CONFIG, url=f"redis://127.0.0.1:{free_port()}/0", timeout=0.2, use_clock=False)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.ShouldRateLimit(request("api", descriptor(("client", "c"))), timeout=5)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


@contextlib.asynccontextmanager
async def served(service: RateLimitService) -> AsyncIterator[rls_pb2_grpc.RateLimitServiceStub]:
    server, _, port = await start_server(service, "127.0.0.1", 0)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield rls_pb2_grpc.RateLimitServiceStub(channel)
    finally:
        await server.stop(0)


def reloadable_service(configs: list[Config], redis_url: str, key_prefix: str) -> tuple[RateLimitService, RedisBackend]:
    """A service answering from the last of ``configs`` (append one to reload) and its backend, to close."""
    backend = RedisBackend(redis_url)
    return RateLimitService(Limiter(lambda: configs[-1], backend, LimiterOptions(key_prefix=key_prefix))), backend


async def test_a_request_seen_before_is_matched_again_after_a_reload(
        write_config: Callable[..., Path], redis_url: str, key_prefix: str) -> None:
    # the service remembers each request's matched form by its bytes: a new config must not be answered
    # with the old one's limits
    configs = [load_directory(write_config(CONFIG))]
    service, backend = reloadable_service(configs, redis_url, key_prefix)
    try:
        async with served(service) as stub:
            same = request("api", descriptor(("client", "c")))
            assert (await stub.ShouldRateLimit(same)).statuses[0].current_limit.requests_per_unit == 2
            configs.append(load_directory(write_config(CONFIG.replace("requests_per_unit: 2", "requests_per_unit: 9"))))
            [status] = (await stub.ShouldRateLimit(same)).statuses
            assert (status.current_limit.requests_per_unit, status.limit_remaining) == (9, 7)
            configs.append(load_directory(write_config("domain: api\ndescriptors: []\n")))
            assert not (await stub.ShouldRateLimit(same)).statuses[0].HasField("current_limit")
    finally:
        await backend.close()


async def test_an_old_config_is_not_kept_alive_by_remembered_requests(
        write_config: Callable[..., Path], redis_url: str, key_prefix: str) -> None:
    configs = [load_directory(write_config(CONFIG))]
    service, backend = reloadable_service(configs, redis_url, key_prefix)
    try:
        async with served(service) as stub:
            for reload in range(4):
                await stub.ShouldRateLimit(request("api", descriptor(("client", f"c{reload}"))))
                configs.append(load_directory(write_config(CONFIG)))
            await stub.ShouldRateLimit(request("api", descriptor(("client", "new"))))
            # every request remembered now was matched against the config in force, and only those
            assert {id(p.plan.config) for p in service.decider.remembered().values()} == {id(configs[-1])}
    finally:
        await backend.close()


async def test_remembered_requests_are_bounded(write_config: Callable[..., Path], redis_url: str, key_prefix: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decider_module, "PREPARED_REQUESTS", 5)
    config = load_directory(write_config(CONFIG))
    backend = RedisBackend(redis_url)
    service = RateLimitService(Limiter(lambda: config, backend, LimiterOptions(key_prefix=key_prefix)))
    try:
        async with served(service) as stub:
            for i in range(12):
                reply = await stub.ShouldRateLimit(request("api", descriptor(("client", f"c{i}"))))
                assert reply.statuses[0].limit_remaining == 1
            remembered = service.decider.remembered()
            assert 0 < len(remembered) <= 5
            assert all(prepared.skeleton for prepared in remembered.values())  # their responses' (build_response)
            big = request("api", descriptor(("client", "x" * decider_module.PREPARED_MAX_BYTES)))
            answered: list[Prepared] = []
            service.on_answer = lambda prepared, _: answered.append(prepared)
            for remaining in (1, 0):
                assert (await stub.ShouldRateLimit(big)).statuses[0].limit_remaining == remaining
            service.on_answer = None
            assert big.SerializeToString() not in service.decider.remembered()
            assert [prepared.skeleton for prepared in answered] == [None, None]  # made only to be kept
            # small in bytes, many in entries (empty entries cost two bytes each, hundreds in memory)
            many = request("api", descriptor(("client", "m")), *[descriptor(*[("", "")] * 8)] * 4)
            assert len(many.SerializeToString()) < decider_module.PREPARED_MAX_BYTES
            for remaining in (1, 0):
                assert (await stub.ShouldRateLimit(many)).statuses[0].limit_remaining == remaining
            assert many.SerializeToString() not in service.decider.remembered()
    finally:
        await backend.close()


async def test_a_limit_has_no_series_until_it_counts_hits(write_config: Callable[..., Path], redis_url: str,
                                                          key_prefix: str) -> None:
    config = load_directory(write_config(CONFIG))
    backend = RedisBackend(redis_url)
    service = RateLimitService(Limiter(lambda: config, backend, LimiterOptions(key_prefix=key_prefix)))
    try:
        async with served(service) as stub:
            await stub.ShouldRateLimit(request("api", descriptor(("client", "c"), hits=0)))  # check only
            assert b'key="client"' not in service.metrics.render()
            await stub.ShouldRateLimit(request("api", descriptor(("client", "c"))))
            text = service.metrics.render().decode()
            assert 'ratelimit_service_rate_limit_total_hits_total{domain="api",key="client"} 1.0' in text
            assert 'ratelimit_service_rate_limit_over_limit_total{domain="api",key="client"}' not in text
    finally:
        await backend.close()


async def test_remembered_requests_are_left_out_of_garbage_collections(
        write_config: Callable[..., Path], redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # a full collection walks every tracked object: 10,000 remembered requests made it a 170-250 ms pause of
    # every call in flight (slidegate.heap)
    monkeypatch.setattr(decider_module, "PREPARED_REQUESTS", 1500)
    config = load_directory(write_config(CONFIG))
    backend = RedisBackend(redis_url)
    service = RateLimitService(Limiter(lambda: config, backend, LimiterOptions(key_prefix=key_prefix)),
                               heap=Heap(freeze_every=100))
    gc.collect()
    try:
        async with served(service) as stub:
            walked = len(gc.get_objects())
            for i in range(1400):
                await stub.ShouldRateLimit(request("api", descriptor(("client", f"c{i}")), descriptor(("week", "w"))))
            assert len(service.decider.remembered()) == 1400
            # what a collection walks grew by the requests since the last freeze, not by all 1,400
            assert len(gc.get_objects()) - walked < 100 * 60
            frozen = gc.get_freeze_count()
            assert frozen > 1400 * 20
            for i in range(200):  # the service forgets them all at once: nothing frozen stays for them
                await stub.ShouldRateLimit(request("api", descriptor(("client", f"d{i}"))))
            assert len(service.decider.remembered()) == 100
            # a remembered request holds about 16 tracked objects (its limit's counters are shared with others')
            assert gc.get_freeze_count() < frozen - 1300 * 12
    finally:
        gc.unfreeze()
        await backend.close()


async def test_values_that_are_not_utf8_are_limited(rls: Start) -> None:
    stub = await rls(CONFIG)
    raw = lenient_pb2.LenientRateLimitRequest(domain=b"api")
    entry = raw.descriptors.add().entries.add()
    entry.key, entry.value = b"client", b"\xff\xfe"
    call = stub.channel.unary_unary(  # the same method, fed bytes a proto3 string cannot hold
        METHOD, request_serializer=lenient_pb2.LenientRateLimitRequest.SerializeToString,
        response_deserializer=rls_pb2.RateLimitResponse.FromString,
    )
    codes = [(await call(raw)).overall_code for _ in range(3)]
    assert codes == [OK, OK, OVER_LIMIT]
    # a different byte string is a different client
    entry.value = b"\xff\xfd"
    assert (await call(raw)).overall_code == OK


async def test_dynamic_metadata_with_values_that_are_not_utf8(rls: Start) -> None:
    stub = await rls(CONFIG, response_dynamic_metadata="true")
    raw = lenient_pb2.LenientRateLimitRequest(domain=b"api")
    entry = raw.descriptors.add().entries.add()
    entry.key, entry.value = b"client", b"\xff"
    call = stub.channel.unary_unary(METHOD, request_serializer=lenient_pb2.LenientRateLimitRequest.SerializeToString,
                                    response_deserializer=rls_pb2.RateLimitResponse.FromString)
    reply = await call(raw)
    assert reply.overall_code == OK
    assert json_format.MessageToDict(reply.dynamic_metadata)["descriptors"] == [{"entries": ["client=\\xff"]}]


async def test_the_deepest_metadata_a_config_may_hold_reaches_the_caller(rls: Start) -> None:
    deepest = "[" * 19 + "1" + "]" * 19  # with its mapping, as deep as the config allows
    stub = await rls(f"domain: f\ndescriptors:\n  - key: deep\n    rate_limit: {{unit: hour, requests_per_unit: 5}}\n"
                     f"    metadata: {{x: {deepest}, n: {2**53}}}\n",
                     response_dynamic_metadata="true")
    reply = await stub.ShouldRateLimit(request("f", descriptor(("deep", "d"))))  # parsed by the client
    metadata = json_format.MessageToDict(reply.dynamic_metadata)["metadata"]  # of the descriptors that passed
    assert metadata["n"] == 2**53 and json.dumps(metadata["x"]) == deepest.replace("1", "1.0")


@pytest.mark.parametrize(("undecided", "code", "http_status"), [
    (InvalidRequest("r"), grpc.StatusCode.INVALID_ARGUMENT, 400),
    (InvalidOverride("o"), grpc.StatusCode.INVALID_ARGUMENT, 400),
    (BackendUnavailable("redis://10.0.0.1:6379/0: ConnectionError"), grpc.StatusCode.UNAVAILABLE, 503),
    (DeadlineExceeded("redis://10.0.0.1:6379/0: the caller's deadline ran out"),
     grpc.StatusCode.DEADLINE_EXCEEDED, 504),
])
def test_every_undecided_call_has_one_answer(undecided: Exception, code: grpc.StatusCode, http_status: int) -> None:
    assert isinstance(undecided, UNDECIDED)
    refused = refusal(undecided)
    assert (grpc_status(refused.code), HTTP_STATUS[refused.code]) == (code, http_status)
    assert "10.0.0.1" not in refused.details  # the storage's address stays with the operator
