"""The Python ceiling: a grpc.aio + uvloop RLS server that reads each request and answers OK, nothing more.

    python bench/noop_server.py PORT
"""

from __future__ import annotations

import sys
from typing import Any

import grpc
import uvloop

from slidegate._proto.envoy.service.ratelimit.v3 import rls_pb2

OK = rls_pb2.RateLimitResponse(overall_code=rls_pb2.RateLimitResponse.OK)


async def should_rate_limit(request: rls_pb2.RateLimitRequest, context: Any) -> rls_pb2.RateLimitResponse:
    return OK


async def main(port: int) -> None:
    server = grpc.aio.server()
    method = grpc.unary_unary_rpc_method_handler(
        should_rate_limit, request_deserializer=rls_pb2.RateLimitRequest.FromString,
        response_serializer=rls_pb2.RateLimitResponse.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "envoy.service.ratelimit.v3.RateLimitService", {"ShouldRateLimit": method}),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    uvloop.run(main(int(sys.argv[1])))
