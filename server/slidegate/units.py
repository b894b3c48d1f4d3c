"""Time units of rate limits, with the window lengths Envoy uses for them.

MONTH is 30 days and YEAR 365 days, as in envoyproxy/ratelimit and Envoy's x-ratelimit headers.
"""

from __future__ import annotations

import enum


class Unit(enum.Enum):
    """A rate-limit unit. ``value`` is the ``RateLimitResponse.RateLimit.Unit`` enum number on the wire
    (WEEK is 7, after YEAR); ``seconds`` is the window length."""

    SECOND = (1, 1)
    MINUTE = (2, 60)
    HOUR = (3, 3600)
    DAY = (4, 86400)
    WEEK = (7, 604800)
    MONTH = (5, 2592000)
    YEAR = (6, 31536000)

    def __init__(self, wire: int, seconds: int) -> None:
        self.wire = wire
        self.seconds = seconds

    @classmethod
    def from_wire(cls, number: int) -> Unit | None:
        """The unit a ``RateLimitResponse.RateLimit.Unit`` number names; None for UNKNOWN and numbers not
        (yet) known. envoy.type.v3.RateLimitUnit (a request's limit override) numbers the same units, without
        WEEK."""
        return _BY_WIRE.get(number)

    @classmethod
    def parse(cls, text: str) -> Unit:
        """Case-insensitive unit name (``second`` … ``year``). Raises KeyError for anything else."""
        return cls[text.upper()]


_BY_WIRE = {unit.wire: unit for unit in Unit}
UNIT_NAMES = ", ".join(u.name.lower() for u in Unit)
