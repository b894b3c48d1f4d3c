"""Any value Envoy can forward is limited like any other, whatever its length, and nothing keeps it whole: storage
keys, the over-limit cache and metric labels hold a digest of a long value. Requests beyond the gRPC message size
are refused before they are read, and the memory a burst of large requests takes goes back to the system."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis

from slidegate import stack
from slidegate.application import build
from slidegate.backends.redis import RedisBackend
from slidegate.config import load_directory
from slidegate.keys import limit_key
from slidegate.limiter import Descriptor, Limiter, LimiterOptions
from slidegate.service import METHOD, RateLimitService
from slidegate.settings import Settings
from slidegate.text import MAX_TEXT_CHARS
from tests.helpers import OK, OVER_LIMIT, descriptor, request

CONFIG = """
domain: d
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: path
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 1}
"""
# Envoy forwards header values up to its 60 KiB header limit by default; a path with its query string likewise
LENGTHS = [MAX_TEXT_CHARS + 1, 20_000, 59 * 1024, 1_000_000]


@pytest.fixture
async def service(backend_settings: dict[str, str],
                  write_config: Callable[..., Path]) -> AsyncIterator[RateLimitService]:
    """The service as `slidegate serve` builds it, on each backend in turn."""
    app = build(Settings.load({}, {"config_dir": str(write_config(CONFIG)), **backend_settings}))
    yield app.service
    await app.backend.close()


async def codes(service: RateLimitService, key: str, value: str, n: int) -> list[int]:
    return [(await service.decide("d", [Descriptor(((key, value),))], 0)).overall_code for _ in range(n)]


@pytest.mark.parametrize("length", LENGTHS)
async def test_a_long_value_is_limited_like_any_other(service: RateLimitService, length: int) -> None:
    value = "k" * length
    assert await codes(service, "api_key", value, 4) == [OK, OK, OVER_LIMIT, OVER_LIMIT]
    # another long value, equal but for its last character, is a limit of its own
    assert await codes(service, "api_key", value[:-1] + "x", 3) == [OK, OK, OVER_LIMIT]


@pytest.mark.parametrize("length", LENGTHS)
async def test_a_long_value_is_decided_over_grpc(rls: Callable[..., Any], length: int) -> None:
    stub = await rls(CONFIG)
    value = "k" * length
    replies = [await stub.ShouldRateLimit(request("d", descriptor(("api_key", value)))) for _ in range(3)]
    assert [r.overall_code for r in replies] == [OK, OK, OVER_LIMIT]


async def test_storage_keys_stay_small(redis_url: str, key_prefix: str, write_config: Callable[..., Path]) -> None:
    config = load_directory(write_config(CONFIG))
    backend = RedisBackend(redis_url)
    service = RateLimitService(Limiter(lambda: config, backend, LimiterOptions(key_prefix=key_prefix)))
    try:
        for length in LENGTHS:
            await codes(service, "api_key", "v" * length, 1)
    finally:
        await backend.close()
    with redis.Redis.from_url(redis_url) as client:
        keys = list(client.scan_iter(match=f"{key_prefix}*"))
    assert len(keys) == len(LENGTHS)
    assert max(len(k) for k in keys) < len(key_prefix) + 120


def test_long_parts_are_digests_that_no_literal_part_can_equal() -> None:
    at_most = "a" * MAX_TEXT_CHARS
    assert limit_key("", "alg", "d", [("k", at_most)]).endswith(f"{MAX_TEXT_CHARS}:{at_most}}}")
    longer = limit_key("", "alg", "d", [("k", at_most + "a")])
    digest_part = longer[longer.index("#"):-1]
    assert len(digest_part) == 65
    # a client sending the digest's text itself gets a literal part, never the long value's key
    assert limit_key("", "alg", "d", [("k", digest_part)]) != longer
    assert limit_key("", "alg", "d", [("k", at_most + "b")]) != longer
    # long keys and domains are digested too
    assert len(limit_key("", "alg", "d" * 50_000, [("k" * 50_000, "v")])) < 200


# Pairs that a careless encoding would merge: separators, empty parts, a part that looks like a length prefix
# or a digest, and one value split differently between key and value.
ADVERSARIAL = [
    ("d", [("a", "0:")]), ("d", [("a", ""), ("", "")]),
    ("d", [("a_b", "c")]), ("d", [("a", "b_c")]), ("d_a", [("b", "c")]),
    ("d", [("1:a", "")]), ("d", [("", "1:a")]), ("d", [("a", "1:")]), ("d", [("a1:", "")]),
    ("d", []), ("", [("d", "")]), ("d", [("", "")]),
    ("d", [("k", "#" + "0" * 64)]), ("d", [("k", "65:#" + "0" * 64)]),
    ("d", [("k", "}")]), ("d", [("k}", "")]), ("{d", [("k", "")]),
    ("d", [("k", "x" * MAX_TEXT_CHARS)]), ("d", [("k", "x" * (MAX_TEXT_CHARS + 1))]),
    ("d", [("k" * (MAX_TEXT_CHARS + 1), "")]), ("d", [("", "k" * (MAX_TEXT_CHARS + 1))]),
]


@pytest.mark.parametrize("domain_slot", [False, True])
def test_adversarial_pairs_never_share_a_key(domain_slot: bool) -> None:
    keys = [limit_key("p:", "alg", d, e, domain_slot=domain_slot) for d, e in ADVERSARIAL]
    assert len(set(keys)) == len(ADVERSARIAL)


async def test_metric_labels_hold_a_digest_of_a_long_value(service: RateLimitService) -> None:
    for value in ("/" + "p" * 60_000, "/short"):
        await service.decide("d", [Descriptor((("path", value),))], 0)
    names = [name for name, _ in service.metrics.store.totals() if name.endswith(".total_hits")]
    long_key = next(name for name in names if "_#" in name).removeprefix("ratelimit.service.rate_limit.d.")
    assert long_key.startswith("path_#") and len(long_key) == len("path_") + 65 + len(".total_hits")
    assert "ratelimit.service.rate_limit.d.path_/short.total_hits" in names


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise LookupError("VmRSS")


async def burst(port: int, value_bytes: int, calls: int = 32) -> dict[str, int]:
    """``calls`` concurrent requests each carrying one value of ``value_bytes``; their outcomes counted."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", -1)]) as ch:
        call = ch.unary_unary(METHOD, request_serializer=lambda m: m.SerializeToString(),
                              response_deserializer=lambda b: b)

        async def one(i: int) -> str:
            try:
                await call(request("d", descriptor(("api_key", f"{i}" + "v" * value_bytes))), timeout=30)
                return "OK"
            except grpc.aio.AioRpcError as exc:
                return exc.code().name

        outcomes = await asyncio.gather(*(one(i) for i in range(calls)))
    return {o: outcomes.count(o) for o in set(outcomes)}


def test_large_requests_are_bounded_and_their_memory_returns(write_config: Callable[..., Path]) -> None:
    port = stack.free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "slidegate", "serve", "--config", str(write_config(CONFIG)), "--backend", "memory",
         "--host", "127.0.0.1", "--grpc-port", str(port), "--http-host", "127.0.0.1", "--http-port", "0",
         "--debug-host", "127.0.0.1", "--debug-port", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        stack.wait_grpc_serving(port)
        asyncio.run(burst(port, 100))  # warm up: every code path has run once
        baseline = rss_mb(process.pid)
        # beyond GRPC_MAX_RECV_MSG_SIZE (4 MiB by default): refused; within it: decided
        assert asyncio.run(burst(port, 5 << 20)) == {"RESOURCE_EXHAUSTED": 32}
        assert asyncio.run(burst(port, 4_000_000)) == {"OK": 32}
        assert asyncio.run(burst(port, 1_000_000, calls=256)) == {"OK": 256}
        assert asyncio.run(burst(port, 50_000, calls=1024)) == {"OK": 1024}
        grown_at_once = rss_mb(process.pid) - baseline
        time.sleep(1.5)  # the heap is trimmed a second after large requests
        grown = rss_mb(process.pid) - baseline
    finally:
        stack.stop(process)
    # measured: 1-2 MB; 70-120 MB at once (what glibc had kept), and hundreds of MB before the trim
    assert grown_at_once > grown
    assert grown < 20, f"the process kept {grown:.0f} MB after the bursts"
