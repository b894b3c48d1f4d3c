"""What every algorithm shares: its name, the limits of exact arithmetic, the in-memory store its state lives
in, and the rules each algorithm module gives (``Rules``).

Each algorithm exists twice with the same semantics: in Lua for Redis (``lua/<name>.lua``, run by
``lua/decide.lua``) and in Python for the in-memory backend (``slidegate/algorithms/<name>.py``); the property
tests hold both to one reference model (tests/models.py).
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

MAX_EXACT = 2**53  # integers up to here are exact in a Lua (double) number
MAX_WINDOW_SECONDS = MAX_EXACT // 1_000_000  # windows are counted in microseconds, exact in a Lua double


class Algorithm(enum.StrEnum):
    """An algorithm's name, as written in config (``algorithm:``) and in storage keys."""

    SLIDING_WINDOW_LOG = "sliding_window_log"
    SLIDING_WINDOW_COUNTER = "sliding_window_counter"
    TOKEN_BUCKET = "token_bucket"
    FIXED_WINDOW = "fixed_window"


ALGORITHM_NAMES = ", ".join(a.value for a in Algorithm)

# (over, remaining before, reset before, remaining after, reset after, reset when over), as in lua/decide.lua
Answer = tuple[bool, int, int, int, int, int]


def _monotonic_us() -> int:
    return time.monotonic_ns() // 1000


class Store:
    """The in-memory backend's keys, with an expiry time; expired keys vanish on access and in a sweep at most
    once a second, so memory stays bounded by the live limits. As Redis's PEXPIRE, expiry runs on real time (a
    monotonic clock), not on the decisions' clock, which tests may set."""

    def __init__(self, expiry_clock: Callable[[], int] = _monotonic_us) -> None:
        self._data: dict[str, tuple[Any, int]] = {}
        self._next_sweep = 0
        self._clock = expiry_clock  # microseconds, monotonic: a test's may stand still, as its decisions' clock

    def get(self, key: str) -> Any:
        item = self._data.get(key)
        if item is None:
            return None
        if item[1] <= self._clock():
            del self._data[key]
            return None
        return item[0]

    def set(self, key: str, value: Any, ttl_us: int) -> None:
        # whole milliseconds, rounded up, as PEXPIRE in the Lua scripts
        self._data[key] = (value, self._clock() + max(1, math.ceil(ttl_us / 1000)) * 1000)

    def delete(self, key: str) -> None:
        self._data.pop(key, None)

    def extend(self, key: str, ttl_us: int) -> None:
        """Make a key live at least ``ttl_us`` more (never less: the decisions' clock may be a test's)."""
        if key in self._data:
            value, expires = self._data[key]
            self._data[key] = (value, max(expires, self._clock() + max(1, math.ceil(ttl_us / 1000)) * 1000))

    def update(self, key: str, value: Any) -> None:
        """Replace a key's value, keeping its expiry."""
        if key in self._data:
            self._data[key] = (value, self._data[key][1])

    def sweep(self) -> None:
        now = self._clock()
        if now < self._next_sweep:
            return
        self._next_sweep = now + 1_000_000
        for key in [k for k, (_, expires) in self._data.items() if expires <= now]:
            del self._data[key]


class State(Protocol):
    """One limit's state for one decision, loaded from the store (the in-memory twin of its Lua)."""

    counts_denied: bool  # the hits of a rejected request are written anyway

    def evaluate(self, hits: int, now: int) -> Answer:
        """Count ``hits`` (negative: give back) at ``now``, in this state only."""
        ...

    def save(self, store: Store, now: int) -> None:
        """Write the state back (the request was admitted, or this algorithm counts denied hits)."""
        ...

    def keep(self, store: Store, now: int) -> None:
        """The request was rejected and writes nothing: renew what the Lua renews."""
        ...


@dataclass(frozen=True, slots=True)
class Rules:
    """What one algorithm decides for the code around it. ``params(limit, window_us, burst, stop_when_over)``:
    the three parameters its Lua and its ``load`` take; ``counts_denied(stop_when_over)``: whether a rejected
    request's hits are counted anyway; ``most_hits(limit, burst)``: the most hits that can ever fit (a request
    of more is over limit for good); ``takes_burst``: whether a limit may set ``burst``; ``load(store, key, p1,
    p2, p3, now)``: its in-memory state."""

    algorithm: Algorithm
    params: Callable[[int, int, int | None, bool], tuple[int, int, int]]
    counts_denied: Callable[[bool], bool]
    most_hits: Callable[[int, int | None], int]
    takes_burst: bool
    load: Callable[[Store, str, int, int, int, int], State]


def window_params(limit: int, window_us: int, burst: int | None, stop_when_over: bool) -> tuple[int, int, int]:
    """The parameters of the window algorithms: the limit, the window, and STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT
    (used by fixed_window only)."""
    return limit, window_us, int(stop_when_over)


def never_counts_denied(stop_when_over: bool) -> bool:
    return False


def the_limit(limit: int, burst: int | None) -> int:
    return limit
