"""The in-memory backend: the same algorithms as the Lua scripts, in this process.

For a single slidegate instance, development and the demo: state lives in a dict, so it is not shared between
processes and is lost on restart. Each algorithm mirrors its ``lua/<algorithm>.lua`` step for step (the
property tests hold both to one reference model), including the all-or-nothing driver of
``lua/decide.lua``. A decision runs without awaiting, so it is atomic on the event loop.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from slidegate.algorithms import Algorithm
from slidegate.backends.base import Check, Decision, Outcome

# (over, remaining before, reset before, remaining after, reset after, reset when over), as in decide.lua
Answer = tuple[bool, int, int, int, int, int]


def _monotonic_us() -> int:
    return time.monotonic_ns() // 1000


class _Store:
    """Keys with an expiry time; expired keys vanish on access and in a sweep at most once a second, so memory
    stays bounded by the live limits. As Redis's PEXPIRE, expiry runs on real time (a monotonic clock), not on
    the decisions' clock, which tests may set."""

    def __init__(self) -> None:
        self._data: dict[str, tuple[Any, int]] = {}
        self._next_sweep = 0

    def get(self, key: str) -> Any:
        item = self._data.get(key)
        if item is None:
            return None
        if item[1] <= _monotonic_us():
            del self._data[key]
            return None
        return item[0]

    def set(self, key: str, value: Any, ttl_us: int) -> None:
        # whole milliseconds, rounded up, as PEXPIRE in the Lua scripts
        self._data[key] = (value, _monotonic_us() + max(1, math.ceil(ttl_us / 1000)) * 1000)

    def delete(self, key: str) -> None:
        self._data.pop(key, None)

    def extend(self, key: str, ttl_us: int) -> None:
        """Make a key live at least ``ttl_us`` more (never less: the decisions' clock may be a test's)."""
        if key in self._data:
            value, expires = self._data[key]
            self._data[key] = (value, max(expires, _monotonic_us() + max(1, math.ceil(ttl_us / 1000)) * 1000))

    def update(self, key: str, value: Any) -> None:
        """Replace a key's value, keeping its expiry."""
        if key in self._data:
            self._data[key] = (value, self._data[key][1])

    def sweep(self) -> None:
        now = _monotonic_us()
        if now < self._next_sweep:
            return
        self._next_sweep = now + 1_000_000
        for key in [k for k, (_, expires) in self._data.items() if expires <= now]:
            del self._data[key]


class _State(Protocol):
    counts_denied: bool

    def evaluate(self, hits: int, now: int) -> Answer: ...

    def save(self, store: _Store, now: int) -> None: ...


@dataclass
class _LogHits:
    """A log's admitted requests, oldest first: their times in microseconds (strictly increasing) and the
    running count of hits after each (``counts``, from ``base``: the count after the newest request that has
    left the window), as the Lua keeps them in its sorted set — so pruning and the time until enough hits have
    left are binary searches, not scans."""

    times: list[int]
    counts: list[int]
    base: int = 0
    removed: int | None = None  # the newest time given back: never used again while the key lives ("@")


@dataclass
class _Log:
    """sliding_window_log (mirrors lua/sliding_window_log.lua)."""

    key: str
    limit: int
    window: int
    hits: _LogHits
    at: int  # when this request's hits are recorded: after the newest recorded hit
    pend: int = 0
    give: int = 0
    counts_denied: bool = False

    @classmethod
    def load(cls, store: _Store, key: str, limit: int, window: int, _: int, now: int) -> _Log:
        hits: _LogHits = store.get(key) or _LogHits([], [])
        gone = bisect.bisect_right(hits.times, now - window)
        if gone:
            # pruned hits are gone for good, as in Redis, even when this request is rejected
            hits.base = hits.counts[gone - 1]
            del hits.times[:gone], hits.counts[:gone]
        if not hits.times and not (hits.removed is not None and hits.removed >= now):
            store.delete(key)
            hits = _LogHits([], [])
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

    def save(self, store: _Store, now: int) -> None:
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

    def keep(self, store: _Store, now: int) -> None:
        """Renew the key's expiry from its newest hit (as lua/sliding_window_log.lua's keep): a reload that made
        the window longer must not let it vanish with the old window's time."""
        if self.hits.times:
            store.extend(self.key, self.hits.times[-1] + self.window - now)


@dataclass
class _Counter:
    """sliding_window_counter: hits in the current and the previous epoch-aligned window."""

    key: str
    limit: int
    window: int
    idx: int
    cur: int
    prev: int
    counts_denied: bool = False

    @classmethod
    def load(cls, store: _Store, key: str, limit: int, window: int, _: int, now: int) -> _Counter:
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

    def save(self, store: _Store, now: int) -> None:
        if self.cur == 0 and self.prev == 0:
            store.delete(self.key)
            return
        store.set(self.key, (self.idx, self.cur, self.prev, self.window), (self.idx + 2) * self.window - now)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


NEVER_US = 31_536_000_000_000  # a year: the lifetime of a bucket that never refills, as lua/token_bucket.lua
LONGEST_US = 2**51  # about 71 years: the longest wait told and the longest a bucket's key lives, as the Lua


@dataclass
class _Bucket:
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
    def load(cls, store: _Store, key: str, burst: int, per_token: int, per_us: int, now: int) -> _Bucket:
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

    def keep(self, store: _Store, now: int) -> None:
        """Renew the key's expiry on a request that writes nothing (as lua/token_bucket.lua's keep)."""
        if self.stored and self.tokens < self.burst:
            store.extend(self.key, self._lifetime())

    def save(self, store: _Store, now: int) -> None:
        if self.tokens >= self.burst:
            store.delete(self.key)
            return
        store.set(self.key, (self.tokens, self.ticks, self.updated, self.per_token), self._lifetime())


@dataclass
class _Fixed:
    """fixed_window: hits in the current epoch-aligned window, as envoyproxy/ratelimit counts them."""

    key: str
    limit: int
    window: int
    idx: int
    count: int
    counts_denied: bool
    changed: bool = field(default=False)

    @classmethod
    def load(cls, store: _Store, key: str, limit: int, window: int, stop_when_over: int, now: int) -> _Fixed:
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

    def save(self, store: _Store, now: int) -> None:
        if self.changed:
            store.set(self.key, (self.idx, self.count, self.window), (self.idx + 1) * self.window - now)


_LOADERS: dict[Algorithm, Callable[..., _State]] = {
    Algorithm.SLIDING_WINDOW_LOG: _Log.load,
    Algorithm.SLIDING_WINDOW_COUNTER: _Counter.load,
    Algorithm.TOKEN_BUCKET: _Bucket.load,
    Algorithm.FIXED_WINDOW: _Fixed.load,
}


class MemoryBackend:
    """Every algorithm in this process. ``clock`` (microseconds since the epoch) is the default time source;
    ``decide(now_us=...)`` overrides it per call (tests)."""

    def __init__(self, clock: Callable[[], int] = lambda: time.time_ns() // 1000) -> None:
        self._store = _Store()
        self._clock = clock

    def describe(self) -> str:
        return "memory (this process only)"

    async def decide(
        self, checks: Sequence[Check], now_us: int | None = None, timeout: float | None = None
    ) -> Decision:
        """Decide ``checks`` all-or-nothing, as lua/decide.lua does. Never raises BackendUnavailable."""
        now = self._clock() if now_us is None else now_us
        self._store.sweep()
        states: dict[str, _State] = {}
        before: dict[str, tuple[int, int]] = {}  # a rejected request reports each limit as it was before it
        answers: list[tuple[_State, Answer]] = []
        for check in checks:
            state = states.get(check.key)
            if state is None:
                state = _LOADERS[check.algorithm](self._store, check.key, *check.params(), now)
                states[check.key] = state
            answer = state.evaluate(check.clamped_hits(), now)
            before.setdefault(check.key, (answer[1], answer[2]))
            answers.append((state, answer))
        admitted = not any(answer[0] and not check.shadow for check, (_, answer) in zip(checks, answers, strict=True))
        for state in states.values():
            if admitted or state.counts_denied:
                state.save(self._store, now)
            elif isinstance(state, _Log | _Bucket):
                state.keep(self._store, now)
        outcomes = []
        for check, (state, (over, _, _, rem_after, reset_after, over_reset)) in zip(checks, answers, strict=True):
            if over:
                outcomes.append(Outcome(True, 0, over_reset))
            elif admitted or state.counts_denied:
                outcomes.append(Outcome(False, rem_after, reset_after))
            else:
                outcomes.append(Outcome(False, *before[check.key]))
        return Decision(admitted, outcomes)

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        return None
