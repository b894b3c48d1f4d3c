"""The sampled over-limit log: one line per rule at most every OVER_LIMIT_LOG_INTERVAL seconds, naming the rule, one
request it rejected (its descriptor) and how many it rejected since its last line — never a line per request (the
reference's answer is to log every decision at debug). Told of every decision (Decider.watch)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from slidegate.decider import Decision, rule_of
from slidegate.text import printable

log = logging.getLogger("slidegate.overlimit")

MAX_RULES = 1000  # rules followed at once: an override's name comes from the request, so the set must be bounded
SAMPLE_CHARS = 200  # of the descriptor shown


@dataclass(slots=True)
class _Tally:
    last_line: float  # when this rule's last line was written
    denied: int = 0  # requests rejected since then
    sample: str = ""  # the descriptor of the latest of them


class OverLimitLog:
    """Told of each decision (``__call__``); writes a rule's first rejection at once, then at most one line every
    ``interval`` seconds with the count since its last line, the last line of a burst after ``interval`` even if
    no rejection follows (a timer of the running loop). ``clock``: seconds, monotonic (tests)."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval = interval
        self._clock = clock
        self._rules: dict[str, _Tally] = {}
        self._timer: asyncio.TimerHandle | None = None

    def __call__(self, decision: Decision) -> None:
        if not decision.rejected:
            return
        now = self._clock()
        for name in decision.rejecting_rules():
            tally = self._rules.get(name)
            if tally is None:
                if len(self._rules) >= MAX_RULES:
                    self._forget_quiet(now)
                    if len(self._rules) >= MAX_RULES:
                        continue
                tally = self._rules[name] = _Tally(now - self._interval)
            tally.denied += 1
            tally.sample = _sample(decision, name)
            if now - tally.last_line >= self._interval:
                self._write(name, tally, now)
            else:
                self._later()

    def _write(self, name: str, tally: _Tally, now: float) -> None:
        log.info("over limit: rule %s rejected %d request%s in the last %.0f s, the latest with descriptor %s",
                 name, tally.denied, "" if tally.denied == 1 else "s", min(now - tally.last_line, self._interval),
                 tally.sample, extra={"rule": name, "denied": tally.denied, "descriptor": tally.sample})
        tally.last_line, tally.denied = now, 0

    def _later(self) -> None:
        """Write what is pending once its interval is over, should no rejection come to write it."""
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._interval, self._flush)

    def _flush(self) -> None:
        self._timer = None
        now = self._clock()
        pending = False
        for name, tally in self._rules.items():
            if tally.denied and now - tally.last_line >= self._interval:
                self._write(name, tally, now)
            pending = pending or bool(tally.denied)
        if pending:
            self._later()

    def _forget_quiet(self, now: float) -> None:
        """Drop the rules with nothing pending whose last line is an interval old."""
        for name in [n for n, t in self._rules.items() if not t.denied and now - t.last_line >= self._interval]:
            del self._rules[name]


def _sample(decision: Decision, name: str) -> str:
    for descriptor, status in zip(decision.prepared.descriptors, decision.statuses, strict=True):
        if status.over and rule_of(descriptor, status) == name:
            return printable(",".join(f"{k}={v}" for k, v in descriptor.entries))[:SAMPLE_CHARS]
    return ""
