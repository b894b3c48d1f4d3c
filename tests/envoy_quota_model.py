"""A plain model of Envoy 1.40's quota filter enforcing slidegate's assignments, for simulations: Envoys that
receive requests, enforce their bucket as the filter does (source/extensions/filters/http/rate_limit_quota/
global_client_impl.cc: a token bucket that starts full and refills continuously at tokens_per_fill per
whole-second fill_interval, kept when a new assignment's max_tokens and tokens_per_fill are unchanged; every
request allowed before the first assignment), report every 5 s and take the answer a little later."""

from __future__ import annotations

from dataclasses import dataclass, field

from slidegate.quotas.ledger import Assignment


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

    def apply(self, assignment: Assignment, now: float) -> None:
        old = self.assignment
        if (old is not None and old.max_tokens == assignment.max_tokens
                and old.tokens_per_fill == assignment.tokens_per_fill and not assignment.denies):
            self.assignment = assignment  # Envoy keeps the bucket and its tokens
            return
        self.assignment = assignment
        self.tokens, self.updated = float(assignment.max_tokens), now

    def request(self, now: float) -> bool:
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
