"""The service's stats by their envoyproxy/ratelimit names (``ratelimit.service.rate_limit.<domain>.<key>.
total_hits`` …), as its gostats store keeps them: counters that only add, and timers whose values wait for the
next flush. The statsd sink (slidegate.statsd) sends what was added since it last looked; ``GET /stats`` on the
debug port shows every counter's total. Prometheus keeps its own series of the same counts (slidegate.metrics
adds to both at once)."""

from __future__ import annotations

# values a timer keeps between two flushes; past it they are dropped (gostats drops what its buffer cannot hold)
MAX_TIMER_VALUES = 65_536


class StatCounter:
    """One counter: ``total`` since the start; ``take`` returns what was added since the last ``take``."""

    __slots__ = ("_taken", "name", "total")

    def __init__(self, name: str) -> None:
        self.name = name
        self.total = 0
        self._taken = 0

    def add(self, amount: int) -> None:
        self.total += amount

    def take(self) -> int:
        added, self._taken = self.total - self._taken, self.total
        return added


class StatTimer:
    """One timer: values in milliseconds, kept until ``take`` (only while ``keep``: with no sink to send them,
    they would only pile up)."""

    __slots__ = ("_values", "keep", "name")

    def __init__(self, name: str, keep: bool) -> None:
        self.name = name
        self.keep = keep
        self._values: list[float] = []

    def record(self, milliseconds: float) -> None:
        if self.keep and len(self._values) < MAX_TIMER_VALUES:
            self._values.append(milliseconds)

    def take(self) -> list[float]:
        values, self._values = self._values, []
        return values


class StatsStore:
    """Every counter and timer by name, created on first use. ``keep_timers``: a sink will take the timers'
    values."""

    def __init__(self, keep_timers: bool = False) -> None:
        self.keep_timers = keep_timers
        self._counters: dict[str, StatCounter] = {}
        self._timers: dict[str, StatTimer] = {}

    def counter(self, name: str) -> StatCounter:
        counter = self._counters.get(name)
        if counter is None:
            counter = self._counters[name] = StatCounter(name)
        return counter

    def timer(self, name: str) -> StatTimer:
        timer = self._timers.get(name)
        if timer is None:
            timer = self._timers[name] = StatTimer(name, self.keep_timers)
        return timer

    def take_counters(self) -> list[tuple[str, int]]:
        """(name, amount added since the last call) of every counter that changed, as gostats flushes them
        (a counter that did not change is not sent)."""
        taken = ((c.name, c.take()) for c in list(self._counters.values()))
        return [(name, added) for name, added in taken if added]

    def take_timers(self) -> list[tuple[str, float]]:
        """(name, value) of every timer value recorded since the last call."""
        return [(t.name, value) for t in list(self._timers.values()) for value in t.take()]

    def totals(self) -> list[tuple[str, int]]:
        """(name, total since the start) of every counter, by name."""
        return sorted((c.name, c.total) for c in self._counters.values())
