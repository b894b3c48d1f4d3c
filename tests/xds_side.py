"""The xds-protos side of the wire tests, run in its own process: xds-protos registers the same protobuf
symbols as slidegate._proto, so the two cannot share a descriptor pool.

Reads one JSON command on stdin, writes one JSON answer on stdout.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.discovery.v3 import ads_pb2, discovery_pb2
from envoy.service.rate_limit_quota.v3 import rlqs_pb2
from envoy.service.ratelimit.v3 import rls_pb2
from envoy.type.v3 import ratelimit_strategy_pb2, ratelimit_unit_pb2, token_bucket_pb2
from google.protobuf import json_format
from google.protobuf.unknown_fields import UnknownFieldSet
from proto_shapes import describe_message  # beside this file: run as a script, not as tests.xds_side


def unknown(message: Any) -> list[list[Any]]:
    return [[f.field_number, f.wire_type, f.data.hex() if isinstance(f.data, bytes) else f.data]
            for f in UnknownFieldSet(message)]  # type: ignore[attr-defined]  # iterable at run time


def main() -> None:
    command = json.load(sys.stdin)
    answer: dict[str, Any] = {}
    if command["op"] == "describe":
        for desc in (rls_pb2.RateLimitRequest.DESCRIPTOR, rls_pb2.RateLimitResponse.DESCRIPTOR,
                     ratelimit_pb2.RateLimitDescriptor.DESCRIPTOR, base_pb2.HeaderValue.DESCRIPTOR):
            describe_message(desc, answer)
        unit = ratelimit_unit_pb2.DESCRIPTOR.enum_types_by_name["RateLimitUnit"]
        answer[unit.full_name] = {v.name: v.number for v in unit.values}
        answer["service"] = [
            [m.full_name, m.input_type.full_name, m.output_type.full_name]
            for m in rls_pb2.DESCRIPTOR.services_by_name["RateLimitService"].methods
        ]
    elif command["op"] == "describe_discovery":
        for desc in (discovery_pb2.DiscoveryRequest.DESCRIPTOR, discovery_pb2.DiscoveryResponse.DESCRIPTOR,
                     base_pb2.Node.DESCRIPTOR):
            describe_message(desc, answer)
        status = discovery_pb2.DiscoveryRequest.DESCRIPTOR.fields_by_name["error_detail"].message_type
        describe_message(status, answer)
        answer["service"] = [
            [m.full_name, m.input_type.full_name, m.output_type.full_name, m.client_streaming, m.server_streaming]
            for m in ads_pb2.DESCRIPTOR.services_by_name["AggregatedDiscoveryService"].methods
        ]
    elif command["op"] == "describe_quota":
        for desc in (rlqs_pb2.RateLimitQuotaUsageReports.DESCRIPTOR, rlqs_pb2.RateLimitQuotaResponse.DESCRIPTOR,
                     rlqs_pb2.BucketId.DESCRIPTOR, ratelimit_strategy_pb2.RateLimitStrategy.DESCRIPTOR,
                     token_bucket_pb2.TokenBucket.DESCRIPTOR):
            describe_message(desc, answer)
        answer["service"] = [
            [m.full_name, m.input_type.full_name, m.output_type.full_name, m.client_streaming, m.server_streaming]
            for m in rlqs_pb2.DESCRIPTOR.services_by_name["RateLimitQuotaService"].methods
        ]
    elif command["op"] == "parse_request":
        request = rls_pb2.RateLimitRequest.FromString(bytes.fromhex(command["data"]))
        answer["json"] = json_format.MessageToDict(request)
        answer["unknown"] = [[unknown(d), unknown(d.limit)] for d in request.descriptors]
        answer["data"] = request.SerializeToString().hex()
    elif command["op"] == "parse_response":
        response = rls_pb2.RateLimitResponse.FromString(bytes.fromhex(command["data"]))
        answer["json"] = json_format.MessageToDict(response)
        answer["unknown"] = [unknown(s.current_limit) for s in response.statuses]
        answer["data"] = response.SerializeToString().hex()
    elif command["op"] == "build_response":
        response = rls_pb2.RateLimitResponse()
        json_format.ParseDict(command["json"], response)
        answer["data"] = response.SerializeToString().hex()
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
