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
    def parse(cls, text: str) -> Unit:
        """Case-insensitive unit name (``second`` … ``year``). Raises KeyError for anything else."""
        return cls[text.upper()]


UNIT_NAMES = ", ".join(u.name.lower() for u in Unit)
