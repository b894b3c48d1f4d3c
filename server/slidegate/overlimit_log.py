"""The sampled over-limit log: one line per rule at most every OVER_LIMIT_LOG_INTERVAL seconds, naming the rule, one
request it rejected (its descriptor) and how many it rejected since its last line — never a line per request (the
reference's answer is to log every decision at debug). Told of every decision (Decider.watch)."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from slidegate.decider import Decision, rule_of
from slidegate.limiter import Descriptor, Status
from slidegate.text import printable

log = logging.getLogger("slidegate.overlimit")

MAX_RULES = 1000  # rules followed at once: an override's name comes from the request, so the set must be bounded
SAMPLE_CHARS = 200  # of the descriptor shown


@dataclass(slots=True)
class _Tally:
    name: str  # the rule's (rule_of), made when its first rejection of this config came
    last_line: float  # when this rule's last line was written (-inf: never)
    denied: int = 0  # requests rejected since then
    sample: tuple[tuple[str, str], ...] = ()  # the entries of the latest of them


class OverLimitLog:
    """Told of each decision (``__call__``); writes a rule's first rejection at once, then at most one line every
    ``interval`` seconds with the count since its last line, the last line of a burst after ``interval`` even if
    no rejection follows (a timer of the running loop). ``clock``: seconds, monotonic (tests).

    A rejection costs a lookup of its rule (by the rule itself, or an override's keys): the rule's name and the
    descriptor are written out only with a line (an attack is thousands of rejections a second). A new config
    writes what is pending and starts afresh, so that no old config is kept alive."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval = interval
        self._clock = clock
        self._rules: dict[object, _Tally] = {}
        self._config: object = None
        self._armed_in: asyncio.AbstractEventLoop | None = None  # the loop whose timer will write what is pending

    def __call__(self, decision: Decision) -> None:
        if not decision.rejected:
            return
        config = decision.prepared.plan.config
        now = self._clock()
        if config is not self._config:
            self._flush(now, every=True)
            self._rules, self._config = {}, config
        statuses = decision.statuses
        # a request of one descriptor rejected was rejected by it (most of an attack): no scan of the statuses
        rejecting = (((_key(decision.prepared.descriptors[0], statuses[0]), decision.prepared.descriptors[0],
                       statuses[0]),) if len(statuses) == 1 else _once_per_rule(decision))
        for key, descriptor, status in rejecting:
            tally = self._rules.get(key)
            if tally is None:
                if len(self._rules) >= MAX_RULES:
                    self._forget_quiet(now)
                    if len(self._rules) >= MAX_RULES:
                        continue
                # never written: not ``now - interval``, which floating point may make less than an interval ago
                tally = self._rules[key] = _Tally(rule_of(descriptor, status), -math.inf)
            elif tally.sample is descriptor.entries and tally.denied:
                tally.denied += 1  # the same request again (a remembered one): nothing else changes
                if now - tally.last_line >= self._interval:
                    self._write(tally, now)
                elif self._armed_in is None or self._armed_in.is_closed():
                    self._later()  # what is pending was left to a loop that closed before its timer rang
                continue
            tally.denied += 1
            tally.sample = descriptor.entries
            if now - tally.last_line >= self._interval:
                self._write(tally, now)
            else:
                self._later()

    def _write(self, tally: _Tally, now: float) -> None:
        # control characters escaped: a caller's value must not start a log line of its own
        sample = printable(",".join(f"{k}={v}" for k, v in tally.sample)).encode("unicode_escape").decode(
            "ascii")[:SAMPLE_CHARS]
        log.info("over limit: rule %s rejected %d request%s in the last %.0f s, the latest with descriptor %s",
                 tally.name, tally.denied, "" if tally.denied == 1 else "s", min(now - tally.last_line, self._interval),
                 sample, extra={"rule": tally.name, "denied": tally.denied, "descriptor": sample})
        tally.last_line, tally.denied = now, 0

    def _later(self) -> None:
        """Write what is pending once its interval is over, should no rejection come to write it."""
        armed = self._armed_in
        # a timer of a loop closed since (a restart, a test's loop) never rings: the running loop's must
        if armed is None or armed.is_closed():
            self._armed_in = loop = asyncio.get_running_loop()
            loop.call_later(self._interval, self._rang)

    def _rang(self) -> None:
        self._armed_in = None
        self._flush(self._clock())

    def _flush(self, now: float, *, every: bool = False) -> None:
        """Write each rule's pending count whose interval is over (``every``: all of them)."""
        pending = False
        for tally in self._rules.values():
            if tally.denied and (every or now - tally.last_line >= self._interval):
                self._write(tally, now)
            pending = pending or bool(tally.denied)
        if pending:
            self._later()

    def _forget_quiet(self, now: float) -> None:
        """Drop the rules with nothing pending whose last line is an interval old."""
        for key in [k for k, t in self._rules.items() if not t.denied and now - t.last_line >= self._interval]:
            del self._rules[key]


def _key(descriptor: Descriptor, status: Status) -> object:
    """What a rule is followed by: a rule by itself (its config is the current one, and keeps it alive), an
    override by its keys (cut short)."""
    return id(status.rule) if status.rule is not None else rule_of(descriptor, status)


def _once_per_rule(decision: Decision) -> list[tuple[object, Descriptor, Status]]:
    """The descriptors that rejected ``decision``, the first of each rule only: a request is counted once per rule
    that rejected it, however many of its descriptors that rule rejected."""
    first: dict[object, tuple[object, Descriptor, Status]] = {}
    for descriptor, status in decision.rejecting():
        key = _key(descriptor, status)
        first.setdefault(key, (key, descriptor, status))
    return list(first.values())
