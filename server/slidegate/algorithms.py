"""The rate-limit algorithms slidegate offers, and the parameters each one's implementations take.

Each algorithm exists twice with the same semantics: in Lua for Redis (``lua/<name>.lua``, run by
``lua/decide.lua``) and in Python for the in-memory backend (``backends/memory.py``). The README's algorithm
table compares them.
"""

from __future__ import annotations

import enum
import math

MAX_EXACT = 2**53  # integers up to here are exact in a Lua (double) number


class Algorithm(enum.StrEnum):
    """An algorithm's name, as written in config (``algorithm:``) and in storage keys."""

    SLIDING_WINDOW_LOG = "sliding_window_log"
    SLIDING_WINDOW_COUNTER = "sliding_window_counter"
    TOKEN_BUCKET = "token_bucket"
    FIXED_WINDOW = "fixed_window"


ALGORITHM_NAMES = ", ".join(a.value for a in Algorithm)


def token_bucket_ticks(requests_per_unit: int, window_us: int, burst: int) -> tuple[int, int, int]:
    """Exact integer units of a token bucket that holds ``burst`` tokens and refills ``requests_per_unit``
    tokens per ``window_us`` microseconds: (capacity in ticks, ticks per token, ticks refilled per
    microsecond). With g = gcd(requests_per_unit, window_us): a token is window_us / g ticks and a
    microsecond refills requests_per_unit / g ticks, so refill never loses a fraction. A bucket that never
    refills (requests_per_unit 0) has one tick per token and refills 0."""
    if requests_per_unit == 0:
        return burst, 1, 0
    g = math.gcd(requests_per_unit, window_us)
    per_token = window_us // g
    return burst * per_token, per_token, requests_per_unit // g


def token_bucket_is_exact(requests_per_unit: int, window_us: int, burst: int) -> bool:
    """Whether the bucket's tick counts stay exact in Lua (capacity plus a refill step below 2^53)."""
    capacity, _, per_us = token_bucket_ticks(requests_per_unit, window_us, burst)
    return capacity + per_us < MAX_EXACT
