"""The wire contract: our protos match Envoy's own (go-control-plane's copy of Envoy's API at the version in
tests/envoy_protos/go.mod, read in a descriptor pool of its own) and the generated code is current."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor as _d
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.unknown_fields import UnknownFieldSet

from slidegate.protos import (
    ads_pb2,
    base_pb2,
    discovery_pb2,
    ratelimit_pb2,
    ratelimit_strategy_pb2,
    ratelimit_unit_pb2,
    rlqs_pb2,
    rls_pb2,
    token_bucket_pb2,
)
from tests.proto_shapes import describe_message

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def envoys(tmp_path_factory: pytest.TempPathFactory) -> descriptor_pool.DescriptorPool:
    """Envoy's descriptors, printed by tests/envoy_protos (Go, its modules from the Go module proxy)."""
    binary = tmp_path_factory.mktemp("envoy_protos") / "envoy_protos"
    if shutil.which("go") is None:
        pytest.fail("the wire tests need Go 1.26 or newer on PATH (https://go.dev/dl/)")
    subprocess.run(["go", "build", "-buildvcs=false", "-o", str(binary), "."], cwd=ROOT / "tests" / "envoy_protos",
                   check=True, timeout=600)
    files = {f.name: f for f in descriptor_pb2.FileDescriptorSet.FromString(
        subprocess.run([str(binary)], capture_output=True, check=True, timeout=60).stdout).file}
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(name: str) -> None:  # a pool takes a file only after the files it imports
        if name not in added:
            for dependency in files[name].dependency:
                add(dependency)
            pool.Add(files[name])
            added.add(name)

    for name in files:
        add(name)
    return pool


def message(pool: descriptor_pool.DescriptorPool, name: str) -> Any:  # a generated message class
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


def described(pool: descriptor_pool.DescriptorPool, *names: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in names:
        describe_message(pool.FindMessageTypeByName(name), out)
    return out


def methods(service: Any) -> list[list[Any]]:
    return [[m.full_name, m.input_type.full_name, m.output_type.full_name, m.client_streaming, m.server_streaming]
            for m in service.methods]


def unknown(msg: Any) -> list[list[Any]]:
    return [[f.field_number, f.wire_type, f.data.hex() if isinstance(f.data, bytes) else f.data]
            for f in UnknownFieldSet(msg)]  # type: ignore[attr-defined]  # iterable at run time


def test_generated_code_is_current() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "protos" / "generate.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"run `python protos/generate.py`:\n{done.stderr}"


def test_generated_code_does_not_claim_the_envoy_package() -> None:
    code = "import sys, slidegate.service; assert 'envoy' not in sys.modules, 'envoy imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd="/")


@pytest.mark.envoy
def test_messages_match_envoy(envoys: descriptor_pool.DescriptorPool) -> None:
    """The RLS messages, the descriptor and the header value: every field as Envoy 1.40 has it, none missing."""
    names = ("envoy.service.ratelimit.v3.RateLimitRequest", "envoy.service.ratelimit.v3.RateLimitResponse",
             "envoy.extensions.common.ratelimit.v3.RateLimitDescriptor", "envoy.config.core.v3.HeaderValue")
    theirs = described(envoys, *names)
    ours: dict[str, Any] = {}
    for desc in (rls_pb2.RateLimitRequest.DESCRIPTOR, rls_pb2.RateLimitResponse.DESCRIPTOR,
                 ratelimit_pb2.RateLimitDescriptor.DESCRIPTOR, base_pb2.HeaderValue.DESCRIPTOR):
        describe_message(desc, ours)
    assert ours == theirs
    unit: _d.EnumDescriptor = ratelimit_unit_pb2.DESCRIPTOR.enum_types_by_name["RateLimitUnit"]
    their_unit = envoys.FindEnumTypeByName("envoy.type.v3.RateLimitUnit")
    assert {v.name: v.number for v in unit.values} == {v.name: v.number for v in their_unit.values}
    service = rls_pb2.DESCRIPTOR.services_by_name["RateLimitService"]
    assert methods(service) == methods(envoys.FindServiceByName(service.full_name)) == [[
        "envoy.service.ratelimit.v3.RateLimitService.ShouldRateLimit",
        "envoy.service.ratelimit.v3.RateLimitRequest",
        "envoy.service.ratelimit.v3.RateLimitResponse", False, False,
    ]]
    assert ours["envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit"]["WEEK"] == 7


@pytest.mark.envoy
def test_the_xds_client_messages_are_envoys(envoys: descriptor_pool.DescriptorPool) -> None:
    """protos/envoy/service/discovery and base.proto's Node declare a subset of Envoy's fields: each as Envoy has
    it, and the ADS method the same."""
    ours: dict[str, Any] = {}
    for desc in (discovery_pb2.DiscoveryRequest.DESCRIPTOR, discovery_pb2.DiscoveryResponse.DESCRIPTOR,
                 base_pb2.Node.DESCRIPTOR, discovery_pb2.DiscoveryRequest.DESCRIPTOR.fields_by_name[
                     "error_detail"].message_type):
        describe_message(desc, ours)
    theirs = described(envoys, "envoy.service.discovery.v3.DiscoveryRequest",
                       "envoy.service.discovery.v3.DiscoveryResponse", "envoy.config.core.v3.Node", "google.rpc.Status")
    assert set(ours) <= set(theirs)
    for name, fields in ours.items():
        for field, shape in fields.items():
            assert shape == theirs[name][field], (name, field)
    assert ours["google.rpc.Status"] == theirs["google.rpc.Status"]
    assert "error_detail" in ours["envoy.service.discovery.v3.DiscoveryRequest"]
    service = ads_pb2.DESCRIPTOR.services_by_name["AggregatedDiscoveryService"]
    ours_method = methods(service)[0]
    assert ours_method[0].endswith(".StreamAggregatedResources") and ours_method[3:] == [True, True]
    assert ours_method in methods(envoys.FindServiceByName(service.full_name))


@pytest.mark.envoy
def test_the_quota_service_messages_are_envoys(envoys: descriptor_pool.DescriptorPool) -> None:
    """protos/envoy/service/rate_limit_quota and the token bucket and strategy it uses: every field as Envoy's,
    and the streaming method the same."""
    descs = (rlqs_pb2.RateLimitQuotaUsageReports.DESCRIPTOR, rlqs_pb2.RateLimitQuotaResponse.DESCRIPTOR,
             rlqs_pb2.BucketId.DESCRIPTOR, ratelimit_strategy_pb2.RateLimitStrategy.DESCRIPTOR,
             token_bucket_pb2.TokenBucket.DESCRIPTOR)
    ours: dict[str, Any] = {}
    for desc in descs:
        describe_message(desc, ours)
    assert ours == described(envoys, *(desc.full_name for desc in descs))
    assert "envoy.type.v3.TokenBucket" in ours and "envoy.type.v3.RateLimitStrategy" in ours
    service = rlqs_pb2.DESCRIPTOR.services_by_name["RateLimitQuotaService"]
    assert methods(service) == methods(envoys.FindServiceByName(service.full_name))
    assert methods(service)[0][3:] == [True, True]


@pytest.mark.envoy
def test_a_request_round_trips_through_envoys_messages(envoys: descriptor_pool.DescriptorPool) -> None:
    request = rls_pb2.RateLimitRequest(domain="d", hits_addend=3)
    first = request.descriptors.add()
    first.entries.add(key="remote_address", value="10.0.0.1")
    first.entries.add(key="path", value="/a?b=c")
    first.limit.requests_per_unit = 42
    first.limit.unit = ratelimit_unit_pb2.HOUR
    first.limit.unit_multiplier.value = 5
    first.hits_addend.value = 10**9
    first.is_negative_hits = True
    second = request.descriptors.add()
    second.entries.add(key="generic_key", value="")
    second.hits_addend.value = 0
    theirs = message(envoys, "envoy.service.ratelimit.v3.RateLimitRequest").FromString(request.SerializeToString())
    assert json_format.MessageToDict(theirs) == {
        "domain": "d",
        "hitsAddend": 3,
        "descriptors": [
            {"entries": [{"key": "remote_address", "value": "10.0.0.1"}, {"key": "path", "value": "/a?b=c"}],
             "limit": {"requestsPerUnit": 42, "unit": "HOUR", "unitMultiplier": 5}, "hitsAddend": "1000000000",
             "isNegativeHits": True},
            {"entries": [{"key": "generic_key"}], "hitsAddend": "0"},
        ],
    }
    assert [unknown(d) + unknown(d.limit) for d in theirs.descriptors] == [[], []]
    assert rls_pb2.RateLimitRequest.FromString(theirs.SerializeToString()) == request


@pytest.mark.envoy
def test_a_response_round_trips_through_envoys_messages(envoys: descriptor_pool.DescriptorPool) -> None:
    built = {
        "overallCode": "OVER_LIMIT",
        "statuses": [
            {"code": "OVER_LIMIT", "currentLimit": {"name": "n", "requestsPerUnit": 4294967295, "unit": "WEEK",
                                                    "unitMultiplier": 5},
             "limitRemaining": 7, "durationUntilReset": "59.500s"},
            {"code": "OK", "quota": {"requests": 1, "validUntil": "2026-01-01T00:00:00Z", "id": "q"}},
        ],
        "responseHeadersToAdd": [{"key": "retry-after", "value": "60"}],
        "requestHeadersToAdd": [{"key": "x-rl", "value": "1", "rawValue": "AQI="}],
        "rawBody": "b3Zlcg==",
        "dynamicMetadata": {"tier": "gold", "n": 3.0},
        "quota": {"requests": 2, "id": "all"},
    }
    theirs = json_format.ParseDict(built, message(envoys, "envoy.service.ratelimit.v3.RateLimitResponse")())
    ours = rls_pb2.RateLimitResponse.FromString(theirs.SerializeToString())
    assert json_format.MessageToDict(ours) == built
    assert ours.statuses[0].current_limit.unit == rls_pb2.RateLimitResponse.RateLimit.WEEK
    assert ours.statuses[0].current_limit.unit_multiplier.value == 5
    back = type(theirs).FromString(ours.SerializeToString())
    assert back == theirs and [unknown(s.current_limit) for s in back.statuses] == [[], []]
