"""Plain-Python reference models of the algorithms, written for clarity, not speed, and independently of the
Lua scripts and the memory backend. ``decide`` follows the contract of lua/decide.lua: checks are evaluated
in order (a limit named twice sees the earlier hits), all-or-nothing, fixed windows count denied hits."""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from dataclasses import dataclass
from fractions import Fraction

LONGEST_US = 2**51  # about 71 years: a bucket's longest wait told (and its key's longest life)


def _told(wait: Fraction) -> int:
    """A bucket's wait in whole microseconds, rounded up and saturated at LONGEST_US."""
    return min(math.ceil(wait), LONGEST_US)


@dataclass
class Answer:
    over: bool
    remaining: int
    reset_us: int


@dataclass
class Check:
    key: str
    algorithm: str
    limit: int
    window: int  # microseconds
    hits: int  # negative: give back
    burst: int | None = None
    stop_when_over: bool = False
    shadow: bool = False  # over limit does not reject the request
    quota: bool = False  # over limit rejects the request only if every quota check of it is over


class Model:
    def __init__(self) -> None:
        self.log: dict[str, list[list[int]]] = defaultdict(list)  # key -> [[time, hits]] oldest first
        # key -> the newest time of hits given back: no hit is recorded at or before it while the log has hits,
        # or while it is not past
        self.removed: dict[str, int] = {}
        self.windows: dict[str, dict[int, int]] = defaultdict(dict)  # key -> window index -> hits
        self.buckets: dict[str, tuple[Fraction, int]] = {}  # key -> (tokens, time of last update)
        self._request_at: dict[str, int] = {}

    # --- the state of one limit as seen by one check, and what applying hits does to it -----------------

    def _live(self, c: Check, now: int) -> list[list[int]]:
        """The log's hits still in the window: a hit counts while now - t < window."""
        return [e for e in self.log[c.key] if now - e[0] < c.window]

    def _at(self, c: Check, now: int) -> int:
        """When hits are recorded: time never moves back for a limit, so not before its newest record (as it
        stood when the request came)."""
        if c.key in self._request_at:
            return self._request_at[c.key]
        if c.algorithm == "sliding_window_log":
            # after the newest hit, 1 µs later if the clock has not moved past it, and after any given back
            gone = [self.removed[c.key] + 1] if c.key in self.removed else []
            return max([now, *(t + 1 for t, _ in self._live(c, now)), *gone])
        if c.algorithm == "token_bucket" and c.key in self.buckets:
            return max(now, self.buckets[c.key][1])
        return now

    def _tokens(self, c: Check, now: int) -> Fraction:
        burst = c.limit if c.burst is None else c.burst
        if c.key not in self.buckets:
            return Fraction(burst)
        tokens, then = self.buckets[c.key]
        if c.limit and now > then:
            tokens += Fraction(now - then) * c.limit / c.window
        return min(tokens, Fraction(burst))

    def _view(self, c: Check, now: int) -> tuple[int, int]:
        """(remaining, reset) for the state as it stands."""
        if c.algorithm == "sliding_window_log":
            live = self._live(c, now)
            counted = sum(h for _, h in live)
            reset = live[0][0] + c.window - now if live else 0
            return max(0, c.limit - counted), reset
        if c.algorithm == "sliding_window_counter":
            idx, e = divmod(now, c.window)
            cur, prev = self.windows[c.key].get(idx, 0), self.windows[c.key].get(idx - 1, 0)
            # the previous window's hits, weighted by the share of it still inside the sliding window: exact
            weighted = Fraction(prev * (c.window - e), c.window)
            return max(0, math.floor(c.limit - cur - weighted)), (c.window - e if cur or prev else 0)
        if c.algorithm == "fixed_window":
            idx, e = divmod(now, c.window)
            return max(0, c.limit - self.windows[c.key].get(idx, 0)), c.window - e
        tokens = self._tokens(c, now)
        burst = c.limit if c.burst is None else c.burst
        full = 0 if tokens >= burst or c.limit == 0 else _told((burst - tokens) * c.window / c.limit)
        return math.floor(tokens), full

    def _over(self, c: Check, now: int) -> int | None:
        """None when the check's hits fit now; else the time until they would."""
        h = c.hits
        if c.algorithm == "sliding_window_log":
            live = sorted(self._live(c, now))
            counted = sum(x for _, x in live)
            if counted + h <= c.limit:
                return None
            freed = 0
            for t, x in live:
                freed += x
                if freed >= counted + h - c.limit and h <= c.limit:
                    return t + c.window - now
            return c.window
        if c.algorithm == "sliding_window_counter":
            idx, e = divmod(now, c.window)
            cur, prev = self.windows[c.key].get(idx, 0), self.windows[c.key].get(idx - 1, 0)
            w = c.window
            room = c.limit - cur - h
            if room >= Fraction(prev * (w - e), w):
                return None
            if h > c.limit:
                return w
            if room >= 0:  # fits once the previous window's weight has shrunk to room: at d from now
                return max(1, math.ceil(w - Fraction(room * w, prev)) - e)
            # fits in the next window, once this one's hits (then the previous) have shrunk to limit - h
            return max(1, (w - e) + math.ceil(w - Fraction((c.limit - h) * w, cur)))
        if c.algorithm == "fixed_window":
            idx, e = divmod(now, c.window)
            return None if self.windows[c.key].get(idx, 0) + h <= c.limit else c.window - e
        tokens = self._tokens(c, now)
        burst = c.limit if c.burst is None else c.burst
        if h <= tokens:
            return None
        if c.limit == 0:
            return 31_536_000_000_000  # never refills: a year, the key's lifetime
        if h > burst:
            return _told(Fraction(burst * c.window, c.limit))  # never fits: the time to fill from empty
        return _told((h - tokens) * c.window / c.limit)

    def _apply(self, c: Check, now: int) -> None:
        if c.algorithm == "sliding_window_log":
            if c.hits > 0:
                self.log[c.key].append([self._at(c, now), c.hits])
            give = -c.hits
            while give > 0 and self.log[c.key]:
                newest = self.log[c.key][-1]
                taken = min(give, newest[1])
                newest[1] -= taken
                give -= taken
                if newest[1] == 0:
                    self.log[c.key].pop()
                    if newest[0] != self._at(c, now):  # stored before this request (which was never stored)
                        self.removed[c.key] = max(newest[0], self.removed.get(c.key, newest[0]))
        elif c.algorithm in ("sliding_window_counter", "fixed_window"):
            idx = now // c.window
            counts = self.windows[c.key]
            if c.hits >= 0:
                counts[idx] = counts.get(idx, 0) + c.hits
            elif c.algorithm == "fixed_window":
                counts[idx] = max(0, counts.get(idx, 0) + c.hits)
            else:
                take = min(-c.hits, counts.get(idx, 0))
                counts[idx] = counts.get(idx, 0) - take
                counts[idx - 1] = max(0, counts.get(idx - 1, 0) - (-c.hits - take))
        else:
            burst = c.limit if c.burst is None else c.burst
            tokens = min(self._tokens(c, now) - c.hits, Fraction(burst))
            if tokens >= burst:
                self.buckets.pop(c.key, None)  # a full bucket is no bucket at all
            else:
                self.buckets[c.key] = (tokens, self._at(c, now))

    # --- the request ---------------------------------------------------------------------------------------

    def _forget_removed(self, key: str, now: int) -> None:
        """A log with no hits forgets the time given back once it is past (its key is deleted)."""
        if not self.log[key] and self.removed.get(key, now) < now:
            del self.removed[key]

    def decide(self, now: int, checks: list[Check]) -> tuple[bool, list[Answer]]:
        self._request_at = {}
        for c in checks:
            # hits that have left the window are gone for good, even if the clock later steps back
            if c.algorithm == "sliding_window_log":
                self.log[c.key] = self._live(c, now)
                self._forget_removed(c.key, now)
        self._request_at = {c.key: self._at(c, now) for c in checks}
        snapshot = (
            {k: [list(e) for e in v] for k, v in self.log.items()},
            {k: dict(v) for k, v in self.windows.items()},
            dict(self.buckets),
            dict(self.removed),
        )
        answers: list[Answer] = []
        befores: list[tuple[int, int]] = []
        counted_anyway: set[int] = set()
        admitted = True
        quotas_over = []
        for i, c in enumerate(checks):
            befores.append(self._view(c, now))
            wait = self._over(c, now) if c.hits >= 0 else None
            if c.quota:
                quotas_over.append(wait is not None)
            if wait is not None:
                admitted = admitted and (c.shadow or c.quota)
                answers.append(Answer(True, 0, wait))
                if c.algorithm == "token_bucket":
                    self._apply(dataclasses.replace(c, hits=0), now)  # the bucket's refill so far is kept
                if c.algorithm == "fixed_window" and not c.stop_when_over:
                    self._apply(c, now)
                    counted_anyway.add(i)
                continue
            self._apply(c, now)
            if c.algorithm == "fixed_window" and not c.stop_when_over:
                counted_anyway.add(i)
            answers.append(Answer(False, *self._view(c, now)))
        if quotas_over and all(quotas_over):
            admitted = False  # envoyproxy/ratelimit's quota mode: every quota limit of the request is over
        if admitted:
            for c in checks:
                if c.algorithm == "sliding_window_log":
                    self._forget_removed(c.key, now)
            return True, answers
        # rejected: only fixed windows that count denied hits keep what this request did
        kept_windows = {checks[i].key: self.windows[checks[i].key] for i in counted_anyway}
        self.log, self.windows, self.buckets, self.removed = (
            defaultdict(list, snapshot[0]), defaultdict(dict, snapshot[1]), snapshot[2], snapshot[3])
        self.windows.update(kept_windows)
        first_before: dict[str, tuple[int, int]] = {}
        for c, seen in zip(checks, befores, strict=True):
            first_before.setdefault(c.key, seen)
        for i, c in enumerate(checks):
            if not answers[i].over and i not in counted_anyway:
                answers[i] = Answer(False, *first_before[c.key])
        return False, answers
