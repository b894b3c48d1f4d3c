"""The wire contract: our protos match Envoy's (via xds-protos, in a subprocess) and the generated code is
current."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from google.protobuf import descriptor as _d
from google.protobuf import json_format

from slidegate._proto.envoy.config.core.v3 import base_pb2
from slidegate._proto.envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from slidegate._proto.envoy.service.discovery.v3 import ads_pb2, discovery_pb2
from slidegate._proto.envoy.service.rate_limit_quota.v3 import rlqs_pb2
from slidegate._proto.envoy.service.ratelimit.v3 import rls_pb2
from slidegate._proto.envoy.type.v3 import ratelimit_strategy_pb2, ratelimit_unit_pb2, token_bucket_pb2
from tests.proto_shapes import describe_message

ROOT = Path(__file__).resolve().parent.parent
# Fields of Envoy 1.40 that xds-protos 1.85 does not have yet (envoy-rls.md §1.8).
ENVOY_140_ONLY = {
    ("envoy.extensions.common.ratelimit.v3.RateLimitDescriptor", "is_negative_hits"),
    ("envoy.extensions.common.ratelimit.v3.RateLimitDescriptor.RateLimitOverride", "unit_multiplier"),
    ("envoy.service.ratelimit.v3.RateLimitResponse.RateLimit", "unit_multiplier"),
}


def xds(op: str, **args: Any) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "xds_side.py")],
        input=json.dumps({"op": op, **args}), capture_output=True, text=True, check=True, timeout=60,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_generated_code_is_current() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "protos" / "generate.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"run `python protos/generate.py`:\n{done.stderr}"


def test_generated_code_does_not_claim_the_envoy_package() -> None:
    code = "import sys, slidegate.service; assert 'envoy' not in sys.modules, 'envoy imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd="/")


def test_messages_match_envoy() -> None:
    theirs = xds("describe")
    ours: dict[str, Any] = {}
    for desc in (rls_pb2.RateLimitRequest.DESCRIPTOR, rls_pb2.RateLimitResponse.DESCRIPTOR,
                 ratelimit_pb2.RateLimitDescriptor.DESCRIPTOR, base_pb2.HeaderValue.DESCRIPTOR):
        describe_message(desc, ours)
    unit: _d.EnumDescriptor = ratelimit_unit_pb2.DESCRIPTOR.enum_types_by_name["RateLimitUnit"]
    ours[unit.full_name] = {v.name: v.number for v in unit.values}
    service = rls_pb2.DESCRIPTOR.services_by_name["RateLimitService"]
    ours["service"] = [[m.full_name, m.input_type.full_name, m.output_type.full_name] for m in service.methods]
    assert sorted(ours) == sorted(theirs)
    extras = set()
    for name, fields in ours.items():
        for field, shape in fields.items() if isinstance(fields, dict) else []:
            if field in theirs[name]:
                assert shape == theirs[name][field], (name, field)
            else:
                extras.add((name, field))
        if isinstance(fields, dict):
            assert set(theirs[name]) <= set(fields), name
    assert extras == ENVOY_140_ONLY
    assert ours["service"] == theirs["service"] == [[
        "envoy.service.ratelimit.v3.RateLimitService.ShouldRateLimit",
        "envoy.service.ratelimit.v3.RateLimitRequest",
        "envoy.service.ratelimit.v3.RateLimitResponse",
    ]]
    assert ours["envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit"]["WEEK"] == 7


def test_the_xds_client_messages_are_envoys() -> None:
    """protos/envoy/service/discovery and base.proto's Node declare a subset of Envoy's fields: each as Envoy has
    it, and the ADS method the same."""
    theirs = xds("describe_discovery")
    ours: dict[str, Any] = {}
    for desc in (discovery_pb2.DiscoveryRequest.DESCRIPTOR, discovery_pb2.DiscoveryResponse.DESCRIPTOR,
                 base_pb2.Node.DESCRIPTOR, discovery_pb2.DiscoveryRequest.DESCRIPTOR.fields_by_name[
                     "error_detail"].message_type):
        describe_message(desc, ours)
    assert set(ours) <= set(theirs)
    for name, fields in ours.items():
        for field, shape in fields.items():
            assert shape == theirs[name][field], (name, field)
    assert ours["google.rpc.Status"] == theirs["google.rpc.Status"]
    assert "error_detail" in ours["envoy.service.discovery.v3.DiscoveryRequest"]
    service = ads_pb2.DESCRIPTOR.services_by_name["AggregatedDiscoveryService"]
    method = service.methods_by_name["StreamAggregatedResources"]
    ours_method = [method.full_name, method.input_type.full_name, method.output_type.full_name,
                   method.client_streaming, method.server_streaming]
    assert ours_method in theirs["service"] and ours_method[3:] == [True, True]


def test_the_quota_service_messages_are_envoys() -> None:
    """protos/envoy/service/rate_limit_quota and the token bucket and strategy it uses: every field as Envoy's,
    and the streaming method the same."""
    theirs = xds("describe_quota")
    ours: dict[str, Any] = {}
    for desc in (rlqs_pb2.RateLimitQuotaUsageReports.DESCRIPTOR, rlqs_pb2.RateLimitQuotaResponse.DESCRIPTOR,
                 rlqs_pb2.BucketId.DESCRIPTOR, ratelimit_strategy_pb2.RateLimitStrategy.DESCRIPTOR,
                 token_bucket_pb2.TokenBucket.DESCRIPTOR):
        describe_message(desc, ours)
    method = rlqs_pb2.DESCRIPTOR.services_by_name["RateLimitQuotaService"].methods_by_name["StreamRateLimitQuotas"]
    ours["service"] = [[method.full_name, method.input_type.full_name, method.output_type.full_name,
                        method.client_streaming, method.server_streaming]]
    assert ours == theirs
    assert "envoy.type.v3.TokenBucket" in ours and "envoy.type.v3.RateLimitStrategy" in ours


def test_request_round_trips_through_xds_protos() -> None:
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
    answer = xds("parse_request", data=request.SerializeToString().hex())
    assert answer["json"] == {
        "domain": "d",
        "hitsAddend": 3,
        "descriptors": [
            {"entries": [{"key": "remote_address", "value": "10.0.0.1"}, {"key": "path", "value": "/a?b=c"}],
             "limit": {"requestsPerUnit": 42, "unit": "HOUR"}, "hitsAddend": "1000000000"},
            {"entries": [{"key": "generic_key"}], "hitsAddend": "0"},
        ],
    }
    # the 1.40-only fields travel as unknown fields: is_negative_hits = field 4 varint 1,
    # unit_multiplier = field 3 length-delimited UInt32Value {value: 5} (08 05)
    assert answer["unknown"] == [[[[4, 0, 1]], [[3, 2, "0805"]]], [[], []]]
    assert rls_pb2.RateLimitRequest.FromString(bytes.fromhex(answer["data"])) == request


def test_response_round_trips_through_xds_protos() -> None:
    built = {
        "overallCode": "OVER_LIMIT",
        "statuses": [
            {"code": "OVER_LIMIT", "currentLimit": {"name": "n", "requestsPerUnit": 4294967295, "unit": "WEEK"},
             "limitRemaining": 7, "durationUntilReset": "59.500s"},
            {"code": "OK", "quota": {"requests": 1, "validUntil": "2026-01-01T00:00:00Z", "id": "q"}},
        ],
        "responseHeadersToAdd": [{"key": "retry-after", "value": "60"}],
        "requestHeadersToAdd": [{"key": "x-rl", "value": "1", "rawValue": "AQI="}],
        "rawBody": "b3Zlcg==",
        "dynamicMetadata": {"tier": "gold", "n": 3.0},
        "quota": {"requests": 2, "id": "all"},
    }
    data = xds("build_response", json=built)["data"]
    ours = rls_pb2.RateLimitResponse.FromString(bytes.fromhex(data))
    assert json_format.MessageToDict(ours) == built
    assert ours.statuses[0].current_limit.unit == rls_pb2.RateLimitResponse.RateLimit.WEEK
    # and back, with the 1.40-only unit_multiplier (field 4 of RateLimit)
    ours.statuses[0].current_limit.unit_multiplier.value = 5
    answer = xds("parse_response", data=ours.SerializeToString().hex())
    assert answer["json"] == built
    assert answer["unknown"] == [[[4, 2, "0805"]], []]
    assert rls_pb2.RateLimitResponse.FromString(bytes.fromhex(answer["data"])) == ours
