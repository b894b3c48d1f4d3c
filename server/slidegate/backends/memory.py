"""The in-memory backend: the same algorithms as the Lua scripts, in this process.

For a single slidegate instance, development and the demo: state lives in a dict, so it is not shared between
processes and is lost on restart. Each algorithm's state (slidegate/algorithms/<name>.py) mirrors its
``lua/<name>.lua`` step for step (the property tests hold both to one reference model); this module is the
all-or-nothing driver of ``lua/decide.lua``. A decision runs without awaiting, so it is atomic on the event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from slidegate.algorithms import RULES, Answer, State, Store
from slidegate.backends.base import Check, Decision, Outcome, admits


class MemoryBackend:
    """Every algorithm in this process. ``clock`` (microseconds since the epoch) is the default time source;
    ``decide(now_us=...)`` overrides it per call (tests). ``expiry_clock`` (monotonic microseconds) is the one
    keys expire on, real time as Redis's PEXPIRE by default; a test whose decisions' clock stands still while
    real time passes gives one that stands still too."""

    def __init__(self, clock: Callable[[], int] = lambda: time.time_ns() // 1000,
                 expiry_clock: Callable[[], int] | None = None) -> None:
        self._store = Store() if expiry_clock is None else Store(expiry_clock=expiry_clock)
        self._clock = clock

    def describe(self) -> str:
        return "memory (this process only)"

    async def decide(
        self, checks: Sequence[Check], now_us: int | None = None, timeout: float | None = None
    ) -> Decision:
        """Decide ``checks`` all-or-nothing, as lua/decide.lua does. Never raises BackendUnavailable."""
        now = self._clock() if now_us is None else now_us
        self._store.sweep()
        states: dict[str, State] = {}
        before: dict[str, tuple[int, int]] = {}  # a rejected request reports each limit as it was before it
        answers: list[tuple[State, Answer]] = []
        for check in checks:
            state = states.get(check.key)
            if state is None:
                state = RULES[check.algorithm].load(self._store, check.key, *check.params(), now)
                states[check.key] = state
            answer = state.evaluate(check.clamped_hits(), now)
            before.setdefault(check.key, (answer[1], answer[2]))
            answers.append((state, answer))
        admitted = admits(checks, [answer[0] for _, answer in answers])
        for state in states.values():
            if admitted or state.counts_denied:
                state.save(self._store, now)
            else:
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
