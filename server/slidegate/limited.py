"""Who is limited: for each rule, its decisions, over-limit and near-limit counts every TICK_SECONDS over the last
MINUTES minutes, and, for each minute, the descriptor values most often over the limit and most often near it (a
Space-Saving summary of TOP_LIMITED_CAPACITY values each: slidegate.heavy_hitters), so that the memory stays the
same whatever the number of distinct callers: at most rules x 2 x SLOTS x capacity values.

``TopLimited`` is a Decider watcher (Decider.watch): told of every decision in the event loop, it does a few
dictionary operations for a descriptor with a rule, and counts a value only when over or near the limit. Near is
the reference's near_limit: more than NEAR_LIMIT_RATIO of the limit used. A request's own limit (an override)
and unlimited rules are not counted. The clock is read by ``advance`` (once a second, by slidegate.limited_view's
ticker), never by the watcher.

``snapshot`` gives it all as JSON-able data with the values shown as TOP_LIMITED_VALUES asks (plain, a keyed
hash, or not kept at all); slidegate.limited_view merges the snapshots of several workers and renders them.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

from slidegate.config.model import Config, DescriptorNode, RateLimit
from slidegate.decider import Decision
from slidegate.heavy_hitters import SpaceSaving
from slidegate.limited_settings import ShownValues
from slidegate.metrics import near_threshold
from slidegate.rule_names import rule_name
from slidegate.text import printable

TICK_SECONDS = 10  # one point of each rule's series
MINUTES = 15  # the longest window of the top limited callers
TICKS_PER_MINUTE = 60 // TICK_SECONDS
POINTS = MINUTES * TICKS_PER_MINUTE
# a window of N minutes takes the values of the current minute and the N before it (between N and N + 1 minutes
# of them), so that the last minute's callers do not vanish as a new minute starts
SLOTS = MINUTES + 1
Entries = tuple[tuple[str, str], ...]


class _Minutes:
    """One kind of value (over limit, near it) of one rule: a summary per minute of the last SLOTS, made as its
    minute starts; a finished minute's shown form is kept (it no longer changes)."""

    __slots__ = ("_shown", "minutes", "summaries")

    def __init__(self) -> None:
        self.summaries: list[SpaceSaving[Entries] | None] = [None] * SLOTS
        self.minutes = [-1] * SLOTS
        self._shown: dict[int, dict[str, Any]] = {}

    def current(self, minute: int, capacity: int) -> SpaceSaving[Entries]:
        """The summary of ``minute``, made when it is not there yet."""
        slot = minute % SLOTS
        summary = self.summaries[slot]
        if summary is None or self.minutes[slot] != minute:
            summary = self.summaries[slot] = SpaceSaving(capacity)
            self.minutes[slot] = minute
        return summary

    def shown(self, minute: int, show: Callable[[Entries], str]) -> list[dict[str, Any]]:
        """The summaries of the last SLOTS minutes up to ``minute``, values as ``show`` shows them."""
        out = []
        for slot, summary in enumerate(self.summaries):
            at = self.minutes[slot]
            if summary is None or not summary or not minute - SLOTS < at <= minute:
                continue
            kept = self._shown.get(at)
            if kept is None:
                kept = {"minute": at, "least": summary.least,
                        "top": [[show(c.item), c.seen, c.error] for c in summary.top()]}
                if at < minute:
                    self._shown[at] = kept
            out.append(kept)
        for old in [at for at in self._shown if at <= minute - SLOTS]:
            del self._shown[old]
        return out


class _Tally:
    """One rule's counts: those of the current tick (``decided``, ``overs``, ``nears``, what the watcher adds to)
    and a ring of POINTS per series, by tick, for the ticks before; and its values."""

    __slots__ = ("decided", "decisions", "domain", "limit", "name", "near", "near_below", "near_now", "near_values",
                 "nears", "over", "over_now", "over_values", "overs", "shadow", "source")

    def __init__(self, domain: str, rule: DescriptorNode, limit: RateLimit, near_limit_ratio: float,
                 minute: int, capacity: int) -> None:
        self.domain, self.name, self.source, self.limit = domain, rule_name(rule), rule.source, limit
        self.shadow = rule.shadow_mode
        # near: more than the near threshold used, that is fewer than this many remaining
        self.near_below = limit.requests_per_unit - near_threshold(limit.requests_per_unit, near_limit_ratio)
        self.decided = self.overs = self.nears = 0
        self.decisions, self.over, self.near = [0] * POINTS, [0] * POINTS, [0] * POINTS
        self.over_values, self.near_values = _Minutes(), _Minutes()
        self.turn(minute, capacity)

    def turn(self, minute: int, capacity: int) -> None:
        """Count the values from now on in ``minute``'s summaries."""
        self.over_now = self.over_values.current(minute, capacity)
        self.near_now = self.near_values.current(minute, capacity)

    def close(self, point: int, passed: range) -> None:
        """The current tick's counts to ``point``, and the ``passed`` points cleared."""
        self.decisions[point], self.over[point], self.near[point] = self.decided, self.overs, self.nears
        self.decided = self.overs = self.nears = 0
        for cleared in passed:
            self.decisions[cleared % POINTS] = self.over[cleared % POINTS] = self.near[cleared % POINTS] = 0

    def series(self, order: list[int]) -> dict[str, list[int]]:
        """Each series in ``order`` of points, the current tick's counts last."""
        return {"decisions": [self.decisions[i] for i in order[:-1]] + [self.decided],
                "over_limit": [self.over[i] for i in order[:-1]] + [self.overs],
                "near_limit": [self.near[i] for i in order[:-1]] + [self.nears]}

    def idle(self) -> bool:
        return not self.decided and not any(self.decisions)


# what a rule without a limit (unlimited, replaced) is counted in: nothing reads it, and nothing is near in it
_UNCOUNTED = _Tally.__new__(_Tally)
_UNCOUNTED.decided = _UNCOUNTED.overs = _UNCOUNTED.nears = 0
_UNCOUNTED.near_below = -1
_UNCOUNTED.over_now = _UNCOUNTED.near_now = SpaceSaving(1)  # bounded as any; never over without a limit


class TopLimited:
    """The watcher is ``watch`` (see the module docstring). ``clock``: seconds since the epoch, read by ``advance``
    only."""

    def __init__(self, values: ShownValues, *, capacity: int = 64, near_limit_ratio: float = 0.8,
                 hash_key: bytes = b"", clock: Callable[[], float] = time.time) -> None:
        self.values, self.capacity, self._ratio = values, capacity, near_limit_ratio
        self._keep = values is not ShownValues.NONE
        self._hash_key, self._clock = hash_key, clock
        self._tallies: dict[tuple[str, str], _Tally] = {}
        self._by_rule: dict[int, _Tally] = {}  # by the rule's id, for the config below (which keeps them alive)
        self._config: Config | None = None
        self.tick = int(clock() // TICK_SECONDS)

    def watch(self, decision: Decision) -> None:
        """Count ``decision`` (Decider.watch). Kept to a few operations a descriptor: it is in every call's path."""
        if decision.prepared.plan.config is not self._config:
            self._config, self._by_rule = decision.prepared.plan.config, {}
        by_rule = self._by_rule
        for index, status in enumerate(decision.statuses):
            rule = status.rule
            if rule is None:  # no rule, or the request's own limit
                continue
            tally = by_rule.get(id(rule))
            if tally is None:
                tally = self._tally(decision, rule, status.limit)
            tally.decided += 1
            if status.over:
                tally.overs += 1
                if self._keep:
                    tally.over_now.add(decision.prepared.descriptors[index].entries)
            elif status.remaining < tally.near_below:
                tally.nears += 1
                if self._keep:
                    tally.near_now.add(decision.prepared.descriptors[index].entries)

    def _tally(self, decision: Decision, rule: DescriptorNode, limit: RateLimit | None) -> _Tally:
        """The rule's tally: the one of the same domain and name (a reload keeps its history), else a new one."""
        if limit is None:
            self._by_rule[id(rule)] = _UNCOUNTED
            return _UNCOUNTED
        domain = decision.domain
        tally = _Tally(domain, rule, limit, self._ratio, self.tick // TICKS_PER_MINUTE, self.capacity)
        tally = self._tallies.setdefault((domain, tally.name), tally)
        tally.limit, tally.source, tally.shadow = limit, rule.source, rule.shadow_mode
        self._by_rule[id(rule)] = tally
        return tally

    def advance(self) -> None:
        """Move to the clock's tick: the points passed since are cleared, and rules idle for MINUTES dropped."""
        tick = int(self._clock() // TICK_SECONDS)
        if tick <= self.tick:
            return
        passed = range(self.tick + 1, min(tick, self.tick + POINTS) + 1)
        minute = tick // TICKS_PER_MINUTE
        for tally in self._tallies.values():
            tally.close(self.tick % POINTS, passed)
            if minute != self.tick // TICKS_PER_MINUTE:
                tally.turn(minute, self.capacity)
        self.tick = tick
        idle = [key for key, tally in self._tallies.items() if tally.idle()]
        if idle:
            for key in idle:
                del self._tallies[key]
            self._by_rule = {}

    def show(self, entries: Entries) -> str:
        """A descriptor's values as TOP_LIMITED_VALUES shows them: ``key=value, …`` or its keyed hash."""
        text = ", ".join(printable(f"{key}={value}") for key, value in entries)
        if self.values is ShownValues.HASHED:
            return hashlib.blake2b(text.encode(), key=self._hash_key, digest_size=8).hexdigest()
        return text

    def snapshot(self) -> dict[str, Any]:
        """Everything, JSON-able: each rule's series oldest first (POINTS ticks up to ``tick``) and its minutes'
        values (none with TOP_LIMITED_VALUES=none)."""
        tick, minute = self.tick, self.tick // TICKS_PER_MINUTE
        order = [(tick - POINTS + 1 + i) % POINTS for i in range(POINTS)]
        rules = []
        for tally in self._tallies.values():
            limit = tally.limit
            rules.append({
                "domain": printable(tally.domain), "rule": tally.name, "source": printable(tally.source),
                "limit": {"requests_per_unit": limit.requests_per_unit,
                          "unit": limit.unit.name.lower() if limit.unit else None,
                          "unit_multiplier": limit.unit_multiplier, "name": printable(limit.name)},
                "shadow_mode": tally.shadow,
                **tally.series(order),
                "over_limit_values": tally.over_values.shown(minute, self.show),
                "near_limit_values": tally.near_values.shown(minute, self.show)})
        return {"tick": tick, "tick_seconds": TICK_SECONDS, "values": str(self.values), "rules": rules}
