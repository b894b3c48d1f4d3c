"""sliding_window_counter: two adjacent fixed windows, the previous one weighted by how much of it the sliding
window still covers (Cloudflare's approximation).

Guarantee: approximate, O(1) memory per limit. The Redis twin is lua/sliding_window_counter.lua; this is the
in-memory backend's, step for step (in doubles, as the Lua).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from slidegate.algorithms.base import (
    Algorithm,
    Answer,
    Rules,
    Store,
    never_counts_denied,
    the_limit,
    window_params,
)


@dataclass
class Counter:
    """sliding_window_counter: hits in the current and the previous epoch-aligned window."""

    key: str
    limit: int
    window: int
    idx: int
    cur: int
    prev: int
    counts_denied: bool = False

    @classmethod
    def load(cls, store: Store, key: str, limit: int, window: int, _: int, now: int) -> Counter:
        idx = now // window
        cur = prev = 0
        stored = store.get(key)
        if stored is not None and (stored[3] != window or stored[0] > idx + 1):
            stored = None  # counted in windows of another length (a reload): not carried over, as in the Lua
        if stored is not None:
            idx = max(idx, stored[0])  # the clock went back: keep counting in the newest window seen
            if stored[0] == idx:
                cur, prev = stored[1], stored[2]
            elif stored[0] == idx - 1:
                prev = stored[1]
        return cls(key, limit, window, idx, cur, prev)

    def evaluate(self, hits: int, now: int) -> Answer:
        w = self.window
        e = max(0, now - self.idx * w)

        def weighted() -> float:
            return float(self.prev) * float(w - e) / float(w)

        def remaining() -> int:
            return max(0, math.floor(float(self.limit - self.cur) - weighted()))

        def reset() -> int:
            return w - e if self.cur > 0 or self.prev > 0 else 0

        rem_before, reset_before = remaining(), reset()
        if hits < 0:
            take = min(-hits, self.cur)
            self.cur -= take
            self.prev = max(0, self.prev - (-hits - take))
            return False, rem_before, reset_before, remaining(), reset(), 0
        room = self.limit - self.cur - hits
        if room < weighted():
            over_reset = w
            if hits <= self.limit:
                if room >= 0:
                    over_reset = max(1, math.ceil(float(w) - float(room) * float(w) / float(self.prev)) - e)
                else:
                    nxt = math.ceil(float(w) - float(self.limit - hits) * float(w) / float(self.cur))
                    over_reset = max(1, (w - e) + nxt)
            return True, rem_before, reset_before, 0, 0, over_reset
        self.cur += hits
        return False, rem_before, reset_before, remaining(), reset(), 0

    def save(self, store: Store, now: int) -> None:
        if self.cur == 0 and self.prev == 0:
            store.delete(self.key)
            return
        store.set(self.key, (self.idx, self.cur, self.prev, self.window), (self.idx + 2) * self.window - now)

    def keep(self, store: Store, now: int) -> None:
        return None  # its key's expiry is set with every write; a rejection writes nothing


RULES = Rules(Algorithm.SLIDING_WINDOW_COUNTER, window_params, never_counts_denied, the_limit, takes_burst=False,
              load=Counter.load)
