"""The protobuf messages slidegate speaks, under public names: what a caller of its gRPC services builds and reads.

The modules are generated into slidegate._proto (their import paths there follow the .proto files', under a
package of slidegate's own so that they cannot clash with another copy of Envoy's generated code); this module is
the way to them from outside the package, so that the layout of the generated code stays slidegate's to change.

- Rate Limit Service (``ShouldRateLimit``): ``rls_pb2`` and its stubs ``rls_pb2_grpc``; the descriptors of a
  request, ``ratelimit_pb2`` (envoy.extensions.common.ratelimit.v3), and their units, ``ratelimit_unit_pb2``.
- ``lenient_pb2``: slidegate's own twin of the RLS request, as the service reads it (unknown enum values kept).
- Rate Limit Quota Service: ``rlqs_pb2``; the strategies it answers with, ``ratelimit_strategy_pb2`` and
  ``token_bucket_pb2``.
- Config over xDS: ``rls_conf_pb2`` (ratelimit.config.ratelimit.v3, envoyproxy/ratelimit's own), ``discovery_pb2``,
  ``ads_pb2`` and its stubs ``ads_pb2_grpc``, and ``base_pb2`` (envoy.config.core.v3: a node's identity).
"""

from __future__ import annotations

from slidegate._proto.envoy.config.core.v3 import base_pb2
from slidegate._proto.envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from slidegate._proto.envoy.service.discovery.v3 import ads_pb2, ads_pb2_grpc, discovery_pb2
from slidegate._proto.envoy.service.rate_limit_quota.v3 import rlqs_pb2
from slidegate._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from slidegate._proto.envoy.type.v3 import ratelimit_strategy_pb2, ratelimit_unit_pb2, token_bucket_pb2
from slidegate._proto.ratelimit.config.ratelimit.v3 import rls_conf_pb2
from slidegate._proto.slidegate.wire.v1 import lenient_pb2

__all__ = ["ads_pb2", "ads_pb2_grpc", "base_pb2", "discovery_pb2", "lenient_pb2", "ratelimit_pb2",
           "ratelimit_strategy_pb2", "ratelimit_unit_pb2", "rlqs_pb2", "rls_conf_pb2", "rls_pb2", "rls_pb2_grpc",
           "token_bucket_pb2"]
