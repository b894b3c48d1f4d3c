"""The Rate Limit Quota Service's messages: the usage reports Envoy sends (read from their bytes, so that a
malformed one is refused with a reason), the bucket ids in them, and the bucket actions it is answered with."""

from __future__ import annotations

from google.protobuf.message import DecodeError

from slidegate._proto.envoy.service.rate_limit_quota.v3 import rlqs_pb2
from slidegate._proto.envoy.type.v3 import ratelimit_strategy_pb2
from slidegate.quotas.ledger import TTL_MS, Assignment

Reports = rlqs_pb2.RateLimitQuotaUsageReports
Response = rlqs_pb2.RateLimitQuotaResponse
ALLOW_ALL = ratelimit_strategy_pb2.RateLimitStrategy.ALLOW_ALL
DENY_ALL = ratelimit_strategy_pb2.RateLimitStrategy.DENY_ALL

# a bucket id beyond these is malformed: Envoy's builders make a few short entries
MAX_ENTRIES = 32
MAX_ID_BYTES = 8192


class MalformedReports(ValueError):
    """Bytes on a quota stream that are not a RateLimitQuotaUsageReports; the message says why."""


def parse_reports(data: bytes) -> Reports:
    """The report ``data`` holds. Raises MalformedReports."""
    try:
        return Reports.FromString(data)
    except DecodeError as exc:
        raise MalformedReports(f"malformed {Reports.DESCRIPTOR.name}: {str(exc) or 'not a protobuf message'}") from None


def bucket_entries(bucket_id: rlqs_pb2.BucketId) -> tuple[tuple[str, str], ...] | str:
    """The descriptor entries of ``bucket_id`` (sorted by key), or why it is malformed."""
    entries = tuple(sorted(bucket_id.bucket.items()))
    if not entries:
        return "an empty bucket id"
    if len(entries) > MAX_ENTRIES:
        return f"a bucket id of {len(entries)} entries (at most {MAX_ENTRIES})"
    size = sum(len(k) + len(v) for k, v in entries)
    if size > MAX_ID_BYTES:
        return f"a bucket id of {size} characters (at most {MAX_ID_BYTES})"
    if any(not key for key, _ in entries):
        return "a bucket id entry without a key"
    return entries


def abandoned(bucket_id: rlqs_pb2.BucketId) -> Response.BucketAction:
    action = Response.BucketAction(bucket_id=bucket_id)
    action.abandon_action.SetInParent()
    return action


def blanket(bucket_id: rlqs_pb2.BucketId, rule: int, ttl_ms: int = TTL_MS) -> Response.BucketAction:
    action = Response.BucketAction(bucket_id=bucket_id)
    assignment = action.quota_assignment_action
    assignment.assignment_time_to_live.FromMilliseconds(ttl_ms)
    assignment.rate_limit_strategy.blanket_rule = rule  # type: ignore[assignment]  # an int of the enum
    return action


def assigned(bucket_id: rlqs_pb2.BucketId, assignment: Assignment) -> Response.BucketAction:
    """``assignment`` as Envoy takes it: a token bucket, or DENY_ALL for none."""
    if assignment.denies:
        return blanket(bucket_id, DENY_ALL)
    action = Response.BucketAction(bucket_id=bucket_id)
    quota = action.quota_assignment_action
    quota.assignment_time_to_live.FromMilliseconds(TTL_MS)
    bucket = quota.rate_limit_strategy.token_bucket
    bucket.max_tokens = assignment.max_tokens
    bucket.tokens_per_fill.value = assignment.tokens_per_fill
    bucket.fill_interval.FromMilliseconds(assignment.fill_interval_ms)
    return action
