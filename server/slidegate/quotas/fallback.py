"""What the quota service answers for a quota bucket when its ledger's storage fails or refuses a report
(FAILURE_MODE; a domain's ``failure_mode`` wins), as the rate-limit service's failure mode answers a decision:

- ``error`` (the default): no answer for the bucket. Envoy keeps its last assignment until its TTL, then its
  ``expired_assignment_behavior``: Envoy's config decides, as its ``failure_mode_deny`` does for the RLS path.
- ``allow``: ALLOW_ALL, ``deny``: DENY_ALL, each for FALLBACK_TTL_MS, renewed by every report (5 s apart) while
  the storage fails and replaced by the ledger's token bucket at the first report it books again.
- ``local``: the bucket's share of this replica's part of the limit (the limit divided by
  LOCAL_LIMIT_REPLICAS, rounded up), kept by a ledger in this process's memory (MemoryQuotas) among the
  buckets of every stream on this replica, as a token bucket.
"""

from __future__ import annotations

from collections.abc import Iterable

from slidegate._proto.envoy.service.rate_limit_quota.v3 import rlqs_pb2
from slidegate.failure_modes import FailureMode
from slidegate.quotas.ledger import REPORT_INTERVAL_MS, Assignment
from slidegate.quotas.messages import ALLOW_ALL, DENY_ALL, Response, blanket
from slidegate.quotas.storage import Departure, MemoryQuotas, Quota

# an allow-all or deny-all answered for a failing storage lives two report intervals: one lost answer does not
# end it, and an Envoy whose slidegate went away falls back to its own expired_assignment_behavior soon
FALLBACK_TTL_MS = 2 * REPORT_INTERVAL_MS


class Fallback:
    """The failure mode's answers; ``local_replicas``: the slidegate replicas sharing a limit (``local``)."""

    def __init__(self, mode: FailureMode = FailureMode.ERROR, local_replicas: int = 1) -> None:
        self.mode = mode
        self._replicas = max(1, local_replicas)
        self._local = MemoryQuotas()

    def _local_quota(self, quota: Quota) -> Quota:
        # this replica's part, rounded up: a limit of 1 stays usable
        return Quota(quota.key, -(-quota.limit // self._replicas), quota.window_ms)

    async def answer(self, mode: FailureMode, bucket_id: rlqs_pb2.BucketId, quota: Quota, holder: str,
                     usage: tuple[int, int, int], owner: str) -> Response.BucketAction | Assignment | None:
        """The answer of ``mode`` for a bucket whose report (``usage``: allowed, denied, elapsed ms) the storage
        did not book: a blanket action, the local ledger's assignment for ``holder``, or None (``error``)."""
        if mode is FailureMode.ALLOW:
            return blanket(bucket_id, ALLOW_ALL, FALLBACK_TTL_MS)
        if mode is FailureMode.DENY:
            return blanket(bucket_id, DENY_ALL, FALLBACK_TTL_MS)
        if mode is FailureMode.LOCAL:
            return await self._local.report(self._local_quota(quota), holder, *usage, owner)
        return None

    async def give_back(self, holders: Iterable[tuple[Quota, str]]) -> None:
        """The local ledger's ``holders`` (quota, holder) went away (a stream ended, a bucket was abandoned)."""
        await self._local.give_back([Departure(self._local_quota(q), h) for q, h in holders])

    async def booked(self, quota: Quota) -> int:
        """What the local ledger books now for ``quota`` (tests)."""
        return await self._local.booked(self._local_quota(quota))
