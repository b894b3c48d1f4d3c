"""fixed_window: envoyproxy/ratelimit's fixed, epoch-aligned windows, identical to the reference.

Guarantee: at most the limit per window, so up to twice the limit across a window boundary; denied hits count
too unless STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT. The Redis twin is lua/fixed_window.lua; this is the
in-memory backend's, step for step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slidegate.algorithms.base import Algorithm, Answer, Rules, Store, the_limit, window_params


@dataclass
class Fixed:
    """fixed_window: hits in the current epoch-aligned window, as envoyproxy/ratelimit counts them."""

    key: str
    limit: int
    window: int
    idx: int
    count: int
    counts_denied: bool
    changed: bool = field(default=False)

    @classmethod
    def load(cls, store: Store, key: str, limit: int, window: int, stop_when_over: int, now: int) -> Fixed:
        idx = now // window
        stored = store.get(key)
        if stored is not None and (stored[2] != window or stored[0] > idx + 1):
            stored = None  # counted in windows of another length (a reload): not carried over, as in the Lua
        if stored is not None:
            idx = max(idx, stored[0])  # the clock went back: keep counting in the newest window seen
        count = stored[1] if stored is not None and stored[0] == idx else 0
        return cls(key, limit, window, idx, count, counts_denied=stop_when_over != 1)

    def evaluate(self, hits: int, now: int) -> Answer:
        reset = (self.idx + 1) * self.window - now
        rem_before = max(0, self.limit - self.count)
        if hits < 0:
            self.count = max(0, self.count + hits)
            self.changed = True
            return False, rem_before, reset, max(0, self.limit - self.count), reset, 0
        over = self.count + hits > self.limit
        if hits > 0 and (not over or self.counts_denied):
            self.count = min(self.count + hits, 2**52)  # stays exact (as in Lua); far over any limit
            self.changed = True
        if over:
            return True, rem_before, reset, 0, 0, reset
        return False, rem_before, reset, max(0, self.limit - self.count), reset, 0

    def save(self, store: Store, now: int) -> None:
        if self.changed:
            store.set(self.key, (self.idx, self.count, self.window), (self.idx + 1) * self.window - now)

    def keep(self, store: Store, now: int) -> None:
        return None  # a rejection it does not count writes nothing


def counts_denied(stop_when_over: bool) -> bool:
    """As envoyproxy/ratelimit: a rejected request's hits are counted, unless
    STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT."""
    return not stop_when_over


RULES = Rules(Algorithm.FIXED_WINDOW, window_params, counts_denied, the_limit, takes_burst=False, load=Fixed.load)
