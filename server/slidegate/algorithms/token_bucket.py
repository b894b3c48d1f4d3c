"""token_bucket: a bucket of ``burst`` tokens (default: the limit) refilled at the limit's rate, with exact
integer arithmetic.

Guarantee: at most burst + rate x time over any span. The Redis twin is lua/token_bucket.lua; this is the
in-memory backend's, computing its products in Python's integers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from slidegate.algorithms.base import Algorithm, Answer, Rules, Store, never_counts_denied


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


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


NEVER_US = 31_536_000_000_000  # a year: the lifetime of a bucket that never refills, as lua/token_bucket.lua
LONGEST_US = 2**51  # about 71 years: the longest wait told and the longest a bucket's key lives, as the Lua


@dataclass
class Bucket:
    """token_bucket: whole tokens and ticks of the next one (see lua/token_bucket.lua, whose products this
    computes in Python's integers); no key means full."""

    key: str
    burst: int
    per_token: int  # W: ticks per token
    per_us: int  # R: ticks refilled per microsecond
    tokens: int
    ticks: int  # of the next token, below per_token
    updated: int  # time of the last update; never moves back
    stored: bool = False  # the key existed
    counts_denied: bool = False

    @classmethod
    def load(cls, store: Store, key: str, burst: int, per_token: int, per_us: int, now: int) -> Bucket:
        stored = store.get(key)
        if stored is None:
            return cls(key, burst, per_token, per_us, burst, 0, now)
        tokens, ticks, before, was = stored
        if was != per_token:  # a reload changed a tick's size: the fraction is converted, rounded down
            ticks = ticks * per_token // was
        if tokens >= burst:
            tokens, ticks = burst, 0
        elapsed = now - before
        if elapsed > 0 and per_us > 0 and tokens < burst:
            more, ticks = divmod(ticks + elapsed * per_us, per_token)
            tokens += more
            if tokens >= burst:
                tokens, ticks = burst, 0
        return cls(key, burst, per_token, per_us, tokens, ticks, max(now, before), stored=True)

    def _refill_time(self, tokens: int, less_ticks: int) -> int:
        """Microseconds until ``tokens`` whole tokens less ``less_ticks`` ticks have refilled (per_us > 0)."""
        return min(LONGEST_US, _ceil_div(tokens * self.per_token - less_ticks, self.per_us))

    def _until_full(self) -> int:
        if self.tokens >= self.burst or self.per_us == 0:
            return 0
        return self._refill_time(self.burst - self.tokens, self.ticks)

    def _lifetime(self) -> int:
        return self._until_full() if self.per_us else NEVER_US

    def evaluate(self, hits: int, now: int) -> Answer:
        rem_before, reset_before = self.tokens, self._until_full()
        if hits < 0:
            self.tokens = min(self.burst, self.tokens - hits)
            if self.tokens >= self.burst:
                self.ticks = 0
            return False, rem_before, reset_before, self.tokens, self._until_full(), 0
        if hits > self.tokens:
            if self.per_us == 0:
                over_reset = NEVER_US  # never refills: never fits (as lua/token_bucket.lua)
            elif hits > self.burst:
                over_reset = self._refill_time(self.burst, 0)  # never fits: the time to fill from empty
            else:
                over_reset = self._refill_time(hits - self.tokens, self.ticks)
            return True, rem_before, reset_before, 0, 0, over_reset
        self.tokens -= hits
        return False, rem_before, reset_before, self.tokens, self._until_full(), 0

    def keep(self, store: Store, now: int) -> None:
        """Renew the key's expiry on a request that writes nothing (as lua/token_bucket.lua's keep)."""
        if self.stored and self.tokens < self.burst:
            store.extend(self.key, self._lifetime())

    def save(self, store: Store, now: int) -> None:
        if self.tokens >= self.burst:
            store.delete(self.key)
            return
        store.set(self.key, (self.tokens, self.ticks, self.updated, self.per_token), self._lifetime())


def params(limit: int, window_us: int, burst: int | None, stop_when_over: bool) -> tuple[int, int, int]:
    """burst (tokens), ticks per token, ticks refilled per microsecond (see token_bucket_ticks)."""
    return (limit if burst is None else burst, *token_bucket_ticks(limit, window_us))


def most_hits(limit: int, burst: int | None) -> int:
    return limit if burst is None else burst


RULES = Rules(Algorithm.TOKEN_BUCKET, params, never_counts_denied, most_hits, takes_burst=True, load=Bucket.load)
