"""Plain-Python reference models of the algorithms, written for clarity, not speed."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass


@dataclass
class ModelOutcome:
    over: bool
    remaining: int
    reset_us: int


class SlidingWindowLogModel:
    """An exact sliding-window log: a hit made at t counts while now - t < window."""

    def __init__(self) -> None:
        self.log: dict[str, list[tuple[int, int]]] = defaultdict(list)  # key -> [(time us, hits)]

    def _live(self, key: str, now: int, window: int) -> list[tuple[int, int]]:
        self.log[key] = [(t, h) for t, h in self.log[key] if now - t < window]
        return sorted(self.log[key])

    def decide(self, now: int, checks: list[tuple[str, int, int, int]]) -> tuple[bool, list[ModelOutcome]]:
        """``checks``: (key, limit, window us, hits). All-or-nothing."""
        outcomes: list[ModelOutcome] = []
        pending: dict[str, int] = {}
        for key, limit, window, hits in checks:
            live = self._live(key, now, window)
            total = pending.get(key, sum(h for _, h in live))
            if total + hits > limit:
                reset = window
                if hits <= limit:
                    freed = 0
                    for t, h in live:
                        freed += h
                        if freed >= total + hits - limit:
                            reset = t + window - now
                            break
                outcomes.append(ModelOutcome(True, 0, reset))
            else:
                outcomes.append(ModelOutcome(False, limit - total - hits, 0))
            pending[key] = total + hits
        admitted = not any(o.over for o in outcomes)
        if admitted:
            for key, _, _, hits in checks:
                if hits > 0:
                    self.log[key].append((now, hits))
        for (key, _, window, hits), outcome in zip(checks, outcomes, strict=True):
            if outcome.over:
                continue
            live = self._live(key, now, window)
            outcome.reset_us = live[0][0] + window - now if live else 0
            if not admitted:
                outcome.remaining += hits
        return admitted, outcomes
