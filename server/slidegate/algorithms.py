"""The rate-limit algorithms slidegate offers, and the parameters each one's implementations take.

Each algorithm exists twice with the same semantics: in Lua for Redis (``lua/<name>.lua``, run by
``lua/decide.lua``) and in Python for the in-memory backend (``backends/memory.py``). The README's algorithm
table compares them.
"""

from __future__ import annotations

import enum
import math

MAX_EXACT = 2**53  # integers up to here are exact in a Lua (double) number
MAX_WINDOW_SECONDS = MAX_EXACT // 1_000_000  # windows are counted in microseconds, exact in a Lua double


class Algorithm(enum.StrEnum):
    """An algorithm's name, as written in config (``algorithm:``) and in storage keys."""

    SLIDING_WINDOW_LOG = "sliding_window_log"
    SLIDING_WINDOW_COUNTER = "sliding_window_counter"
    TOKEN_BUCKET = "token_bucket"
    FIXED_WINDOW = "fixed_window"


ALGORITHM_NAMES = ", ".join(a.value for a in Algorithm)


def token_bucket_ticks(requests_per_unit: int, window_us: int) -> tuple[int, int]:
    """The integer units in which a token bucket refilling ``requests_per_unit`` tokens per ``window_us``
    microseconds counts the fraction of its next token: (ticks per token, ticks refilled per microsecond).
    With g = gcd(requests_per_unit, window_us): a token is window_us / g ticks and a microsecond refills
    requests_per_unit / g ticks, so refill never loses a fraction. A bucket that never refills
    (requests_per_unit 0) has one tick per token and refills 0. Both are below 2^53 for every limit the
    config allows, so exact in Lua; lua/token_bucket.lua says how products of them are kept exact."""
    if requests_per_unit == 0:
        return 1, 0
    g = math.gcd(requests_per_unit, window_us)
    return window_us // g, requests_per_unit // g
