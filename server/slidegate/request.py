"""A RateLimitRequest read and validated: its domain and descriptors, within bounds on its shape, under the
operator's RequestPolicy. Requests are read with ``LenientRateLimitRequest`` (protos/slidegate/wire/v1/lenient.proto):
the same wire format with bytes for keys and values, so a value that is not UTF-8 is limited like any other
instead of failing the call; such bytes are kept as surrogate escapes, one character per byte."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence, Sized
from dataclasses import dataclass
from typing import Any

from slidegate._proto.envoy.service.ratelimit.v3 import rls_pb2
from slidegate._proto.slidegate.wire.v1 import lenient_pb2
from slidegate.limiter import Descriptor, Override
from slidegate.units import Unit

Request = lenient_pb2.LenientRateLimitRequest

# Bounds on one request's shape, far above what an Envoy route can be configured to send, so that one call
# cannot stall the service or Redis. Text has no bound of its own: a value is a client's header, path or
# address, and Envoy forwards headers of up to 60 KiB (8 MiB when configured), so any length the message size
# allows (GRPC_MAX_RECV_MSG_SIZE) is limited like any other (long text is kept as its digest, slidegate.keys).
MAX_DESCRIPTORS = 1000
MAX_ENTRIES = 64


class InvalidRequest(ValueError):
    """A request the service cannot decide; the message is sent back with INVALID_ARGUMENT."""


class Refusable(enum.Enum):
    """A request field that can lower a limit, which the operator may refuse (docs/security.md): its wire name."""

    NEGATIVE_HITS = "is_negative_hits"
    LIMIT_OVERRIDE = "limit"


class RefusedField(InvalidRequest):
    """A request using a field the operator turned off (RequestPolicy)."""

    def __init__(self, index: int, field: Refusable, setting: str) -> None:
        super().__init__(f"descriptor {index}: {field.value} is refused by this service ({setting}=false)")
        self.field = field


@dataclass(frozen=True, slots=True)
class RequestPolicy:
    """Which fields that lower a limit a caller may use: ``negative_hits`` (is_negative_hits gives hits back:
    NEGATIVE_HITS_ENABLED) and ``limit_overrides`` (a descriptor's own limit replaces the configured one:
    LIMIT_OVERRIDE_ENABLED). Anyone who reaches the port can send them; the defaults are argued in
    docs/security.md."""

    negative_hits: bool = False
    limit_overrides: bool = True


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _same(text: str) -> str:
    return text


def check_outline(domain: str | bytes, descriptors: Sized) -> None:
    """The bounds on a request as a whole (from any format: the decider checks its own requests with them).
    Raises InvalidRequest."""
    if not domain:
        raise InvalidRequest("rate limit domain must not be empty")
    if not descriptors:
        raise InvalidRequest("rate limit descriptor list must not be empty")
    if len(descriptors) > MAX_DESCRIPTORS:
        raise InvalidRequest(f"too many descriptors: {len(descriptors)} (at most {MAX_DESCRIPTORS})")


def check_entries(index: int, entries: Sized) -> None:
    """The bound on descriptor ``index``'s entries. Raises InvalidRequest."""
    if len(entries) > MAX_ENTRIES:
        raise InvalidRequest(f"descriptor {index}: too many entries: {len(entries)} (at most {MAX_ENTRIES})")


def parse_request(request: Request | rls_pb2.RateLimitRequest,
                  policy: RequestPolicy = RequestPolicy()) -> tuple[str, list[Descriptor]]:
    """Validate ``request`` (read leniently from a call's bytes, or a RateLimitRequest whose text is already
    text: the HTTP API's JSON) under ``policy``; return (domain, descriptors). Raises InvalidRequest with the
    reason (RefusedField for a field the policy refuses)."""
    text: Callable[[Any], str] = _same if isinstance(request, rls_pb2.RateLimitRequest) else _text
    check_outline(request.domain, request.descriptors)
    descriptors = []
    read: Sequence[Any] = request.descriptors  # either message's descriptors: the same fields
    for index, d in enumerate(read):
        check_entries(index, d.entries)
        override = None
        if d.is_negative_hits and not policy.negative_hits:
            raise RefusedField(index, Refusable.NEGATIVE_HITS, "NEGATIVE_HITS_ENABLED")
        if d.HasField("limit"):
            if not policy.limit_overrides:
                raise RefusedField(index, Refusable.LIMIT_OVERRIDE, "LIMIT_OVERRIDE_ENABLED")
            unit = Unit.from_wire(d.limit.unit)
            if unit is None or unit is Unit.WEEK:  # envoy.type.v3.RateLimitUnit has no WEEK
                raise InvalidRequest(f"descriptor {index}: limit override has no valid unit ({d.limit.unit})")
            multiplier = d.limit.unit_multiplier.value if d.limit.HasField("unit_multiplier") else 1
            if multiplier < 1:
                raise InvalidRequest(f"descriptor {index}: limit override unit_multiplier must be at least 1")
            override = Override(d.limit.requests_per_unit, unit, multiplier)
        # by position, the entries from a list: a request never seen before pays for every step here
        descriptors.append(Descriptor(
            tuple([(text(e.key), text(e.value)) for e in d.entries]),
            d.hits_addend.value if d.HasField("hits_addend") else None,
            d.is_negative_hits,
            override,
        ))
    return text(request.domain), descriptors
