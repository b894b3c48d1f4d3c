"""sliding_window_log: an exact log of admitted hits; a hit counts while it is younger than the window.

Guarantee: no rolling window ever holds more than the limit. Memory: one entry per admitted request in the window.
The Redis twin is lua/sliding_window_log.lua; this is the in-memory backend's, step for step.
"""

from __future__ import annotations

import bisect
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
class LogHits:
    """A log's admitted requests, oldest first: their times in microseconds (strictly increasing) and the
    running count of hits after each (``counts``, from ``base``: the count after the newest request that has
    left the window), as the Lua keeps them in its sorted set — so pruning and the time until enough hits have
    left are binary searches, not scans."""

    times: list[int]
    counts: list[int]
    base: int = 0
    removed: int | None = None  # the newest time given back: never used again while the key lives ("@")


@dataclass
class Log:
    """sliding_window_log (mirrors lua/sliding_window_log.lua)."""

    key: str
    limit: int
    window: int
    hits: LogHits
    at: int  # when this request's hits are recorded: after the newest recorded hit
    pend: int = 0
    give: int = 0
    counts_denied: bool = False

    @classmethod
    def load(cls, store: Store, key: str, limit: int, window: int, _: int, now: int) -> Log:
        hits: LogHits = store.get(key) or LogHits([], [])
        gone = bisect.bisect_right(hits.times, now - window)
        if gone:
            # pruned hits are gone for good, as in Redis, even when this request is rejected
            hits.base = hits.counts[gone - 1]
            del hits.times[:gone], hits.counts[:gone]
        if not hits.times and not (hits.removed is not None and hits.removed >= now):
            store.delete(key)
            hits = LogHits([], [])
        # after the newest hit and after any hit given back, as lua/sliding_window_log.lua
        at = max(now, hits.times[-1] + 1 if hits.times else now, now if hits.removed is None else hits.removed + 1)
        return cls(key, limit, window, hits, at)

    def _total(self) -> int:
        return self.hits.counts[-1] - self.hits.base if self.hits.times else 0

    def _counted(self) -> int:
        return self._total() - self.give + self.pend

    def _reset(self, now: int) -> int:
        if self.hits.times and self.give < self._total():
            return self.hits.times[0] + self.window - now
        return self.at + self.window - now if self.pend > 0 else 0

    def evaluate(self, hits: int, now: int) -> Answer:
        rem_before, reset_before = max(0, self.limit - self._counted()), self._reset(now)
        if hits < 0:
            take = min(-hits, self.pend)
            self.pend -= take
            self.give = min(self._total(), self.give - hits - take)
            return False, rem_before, reset_before, max(0, self.limit - self._counted()), self._reset(now), 0
        if self._counted() + hits > self.limit:
            over_reset = self.window
            if hits <= self.limit:
                # the oldest stored hits leave first; hits being given back (the newest) never count
                need = self._counted() + hits - self.limit
                over_reset = self.at + self.window - now
                if need <= self._total() - self.give:
                    first = bisect.bisect_left(self.hits.counts, self.hits.base + need)
                    over_reset = self.hits.times[first] + self.window - now
            return True, rem_before, reset_before, 0, 0, over_reset
        self.pend += hits
        return False, rem_before, reset_before, max(0, self.limit - self._counted()), self._reset(now), 0

    def save(self, store: Store, now: int) -> None:
        log, give = self.hits, self.give
        while give > 0 and log.times:
            # the newest request gives back first; one heavier than what is left keeps the difference
            newest = log.counts[-1] - (log.counts[-2] if len(log.counts) > 1 else log.base)
            if newest > give:
                log.counts[-1] -= give
                break
            give -= newest
            gone = log.times.pop()
            log.counts.pop()
            log.removed = gone if log.removed is None else max(log.removed, gone)
        if self.pend > 0:
            log.times.append(self.at)
            log.counts.append((log.counts[-1] if log.counts else log.base) + self.pend)
        if not log.times and log.removed is not None and log.removed >= now:
            store.update(self.key, log)  # no hits left, but the time given back is not past yet
        elif not log.times:
            store.delete(self.key)
        elif self.pend > 0:
            store.set(self.key, log, self.at + self.window - now)
        else:
            # only given back, or nothing: the expiry set with the newest hit still holds, renewed as by a
            # rejection (keep)
            store.update(self.key, log)
            self.keep(store, now)

    def keep(self, store: Store, now: int) -> None:
        """Renew the key's expiry from its newest hit (as lua/sliding_window_log.lua's keep): a reload that made
        the window longer must not let it vanish with the old window's time."""
        if self.hits.times:
            store.extend(self.key, self.hits.times[-1] + self.window - now)


RULES = Rules(Algorithm.SLIDING_WINDOW_LOG, window_params, never_counts_denied, the_limit, takes_burst=False,
              load=Log.load)
