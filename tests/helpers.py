"""Building RLS requests in tests, reading a Prometheus metric's value, and asking a limiter how it decided."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client.metrics import MetricWrapperBase

from slidegate.failure_modes import FailureMode
from slidegate.limiter import Descriptor, Limiter, Status
from slidegate.protos import ratelimit_pb2, rls_pb2

Entries = list[tuple[str, str]]


def descriptor(*entries: tuple[str, str], hits: int | None = None) -> ratelimit_pb2.RateLimitDescriptor:
    out = ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries]
    )
    if hits is not None:
        out.hits_addend.value = hits
    return out


def request(
    domain: str, *descriptors: ratelimit_pb2.RateLimitDescriptor, hits_addend: int = 0
) -> rls_pb2.RateLimitRequest:
    return rls_pb2.RateLimitRequest(domain=domain, descriptors=list(descriptors), hits_addend=hits_addend)


OK = rls_pb2.RateLimitResponse.OK
OVER_LIMIT = rls_pb2.RateLimitResponse.OVER_LIMIT


def metric_value(metric: MetricWrapperBase, **labels: str) -> float:
    """The value of a prometheus_client Counter or Gauge (of its series with ``labels``, 0 when that series was
    never counted), read through its public ``collect``, as a scrape reads it."""
    for family in metric.collect():
        for sample in family.samples:
            if sample.name in (family.name, f"{family.name}_total") and sample.labels == labels:
                return sample.value
    return 0.0


async def decided(limiter: Limiter, domain: str, descriptors: Sequence[Descriptor],
                  timeout: float | None = None) -> tuple[list[Status], FailureMode | None]:
    """The statuses ``limiter`` decides for a request and the failure mode that decided it (None: the storage)."""
    answer = await limiter.decide(limiter.prepare(domain, descriptors), timeout)
    return answer.statuses, answer.degraded
