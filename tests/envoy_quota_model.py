"""A plain model of Envoy 1.40's quota filter enforcing slidegate's assignments, for simulations: Envoys that
receive requests, enforce their bucket as the filter does (source/extensions/filters/http/rate_limit_quota/
global_client_impl.cc: a token bucket that starts full and refills continuously at tokens_per_fill per
whole-second fill_interval, kept — tokens and fill interval — when a new assignment's max_tokens and
tokens_per_fill are unchanged; an assignment that expires falls back (DENY_ALL here) and the next starts full;
every request allowed before the first assignment), report every 5 s and take the answer a little later.
Each of these was seen with Envoy 1.40 and a scripted server (docs/quotas.md, "Envoy 1.40 facts")."""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from slidegate.quotas import ledger
from slidegate.quotas.ledger import Assignment

T0 = 1_700_000_000_000  # ms


@dataclass
class EnvoyBucket:
    """One Envoy's bucket of one quota."""

    assignment: Assignment | None = None  # None: no assignment yet, every request allowed
    tokens: float = 0.0
    updated: float = 0.0  # seconds
    allowed: int = 0  # since the last report
    denied: int = 0
    reported: float = 0.0
    admitted_at: list[tuple[float, bool]] = field(default_factory=list)  # (time, before any assignment)

    expires: float = 0.0  # when the assignment's TTL runs out (then the fallback: DENY_ALL here, the strictest)

    def apply(self, assignment: Assignment, now: float) -> None:
        self.expire(now)
        old = self.assignment
        self.expires = now + ledger.TTL_MS / 1000
        if (old is not None and not old.denies and not assignment.denies and old.max_tokens == assignment.max_tokens
                and old.tokens_per_fill == assignment.tokens_per_fill):
            return  # the same bucket to Envoy: tokens and fill interval kept (it compares fill_interval's nanos)
        self.assignment = assignment
        self.tokens, self.updated = float(assignment.max_tokens), now

    def expire(self, now: float) -> None:
        if self.assignment is not None and not self.assignment.denies and now >= self.expires:
            self.assignment = ledger.DENY

    def request(self, now: float) -> bool:
        self.expire(now)
        a = self.assignment
        if a is None:
            admitted, free = True, True
        elif a.denies:
            admitted, free = False, False
        else:
            rate = a.tokens_per_fill / (a.fill_interval_ms // 1000)
            self.tokens = min(float(a.max_tokens), self.tokens + (now - self.updated) * rate)
            self.updated = now
            admitted, free = self.tokens >= 1.0, False
            if admitted:
                self.tokens -= 1.0
        if admitted:
            self.allowed += 1
            self.admitted_at.append((now, free))
        else:
            self.denied += 1
        return admitted

    def take_report(self, now: float) -> tuple[int, int, int]:
        """(allowed, denied, elapsed ms) since the last report, as Envoy sends them (whole seconds)."""
        report = (self.allowed, self.denied, int(now - self.reported) * 1000)
        self.allowed, self.denied, self.reported = 0, 0, now
        return report


def most_in_a_window(times: list[float], window: float) -> int:
    """The most of ``times`` (sorted) inside any window of ``window`` seconds (closed at both ends)."""
    best, start = 0, 0
    for end, at in enumerate(times):
        while times[start] < at - window:
            start += 1
        best = max(best, end - start + 1)
    return best


def simulate(limit: int, window_s: int, rates: list[float], seconds: float, delay: float, seed: int,
             reconnect_every: float = 0.0) -> tuple[list[EnvoyBucket], int]:
    """Envoys receiving requests at ``rates`` (per second, random arrivals) for ``seconds``, reporting every 5 s
    to one ledger and applying its answers ``delay`` seconds later; with ``reconnect_every``, an Envoy's stream
    ends and starts again that often (its holder released, a new one reporting). Returns the Envoys' buckets and
    the most requests admitted, after their first assignment, in any window."""
    rng = random.Random(seed)
    state: dict[str, str] = {}
    envoys = [EnvoyBucket() for _ in rates]
    names = [f"e{i}-0" for i in range(len(rates))]
    events: list[tuple[float, int, str, int, Assignment | None]] = []
    for i, rate in enumerate(rates):
        if rate > 0:
            heapq.heappush(events, (rng.expovariate(rate), 0, "request", i, None))
        if reconnect_every:
            heapq.heappush(events, (rng.uniform(0, reconnect_every), 1, "reconnect", i, None))
    reported: set[int] = set()
    while events:
        at, _, kind, i, assignment = heapq.heappop(events)
        if at > seconds:
            break
        now_ms = T0 + int(at * 1000)
        envoy = envoys[i]
        if kind == "request":
            envoy.request(at)
            if i not in reported:  # a new bucket is reported at once, then every 5 s
                reported.add(i)
                envoy.reported = at
                answer = ledger.report(state, limit, window_s * 1000, names[i], 1, 0, 0, now_ms)
                envoy.allowed = 0
                heapq.heappush(events, (at + delay, 2, "apply", i, answer))
                heapq.heappush(events, (at + 5, 3, "report", i, None))
            heapq.heappush(events, (at + rng.expovariate(rates[i]), 0, "request", i, None))
        elif kind == "report":
            allowed, denied, elapsed = envoy.take_report(at)
            answer = ledger.report(state, limit, window_s * 1000, names[i], allowed, denied, elapsed, now_ms)
            heapq.heappush(events, (at + delay, 2, "apply", i, answer))
            heapq.heappush(events, (at + 5, 3, "report", i, None))
        elif kind == "apply":
            assert assignment is not None
            envoy.apply(assignment, at)
        elif kind == "reconnect":
            ledger.release(state, window_s * 1000, names[i], now_ms)
            names[i] = names[i].rsplit("-", 1)[0] + f"-{int(at * 1000)}"
            heapq.heappush(events, (at + reconnect_every, 1, "reconnect", i, None))
        assert ledger.booked(state, window_s * 1000, now_ms) <= limit * 1000
    counted = sorted(t for e in envoys for t, free in e.admitted_at if not free)
    return envoys, most_in_a_window(counted, window_s)
