"""lua/decide.lua's calls and replies, without I/O: the keys and arguments that decide a batch of requests or
undo a request's hits, and the answers read back from the reply. The script's header names KEYS, ARGV and the
reply; this module is their one reader and writer in Python."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import hiredis

from slidegate.backends.base import BackendUnavailable, Check, Decision, Outcome

Receipt = tuple[int, int]  # what one call wrote for a limit, to undo it
# A request's checks, its clock ("" for Redis TIME) and whether it may be undone (one share of a request decided
# in several places, slidegate.backends.spanning)
Request = tuple[Sequence[Check], str | int, bool]


class Unconfirmed(BackendUnavailable):
    """A script call ran, but its writes did not reach REDIS_WAIT_REPLICAS replicas in time: ``reply`` is its
    reply."""

    def __init__(self, reply: Any, message: str) -> None:
        super().__init__(message)
        self.reply = reply


@dataclass(frozen=True, slots=True)
class Part:
    """One place's share of a request, decided so that it can be undone: ``decision``; per check, ``unchanged``
    (its remaining and reset as if the request had not come) and ``receipts`` (None: nothing to undo)."""

    decision: Decision
    unchanged: list[Outcome]
    receipts: list[Receipt | None]


def limit_args(c: Check) -> tuple[str | int, ...]:
    """A limit's arguments of lua/decide.lua: algorithm, its three parameters, hits, mode (for tools that write
    limits with the script themselves, as bench/scale.py does)."""
    return (c.algorithm.value, *c.params(), c.clamped_hits(), 2 if c.quota else int(c.shadow))


def decide_args(requests: Sequence[Request], hold_us: int,
                jitter: tuple[int, ...]) -> tuple[list[str], list[str | int]]:
    """The keys and arguments of one call deciding ``requests``, all of one clock. A request that may be undone
    holds a token bucket's room ``hold_us`` µs; ``jitter``: EXPIRATION_JITTER_MAX_SECONDS's trailing arguments."""
    keys: list[str] = []
    args: list[str | int] = [requests[0][1], len(requests)]
    for checks, _, undoable in requests:
        args += (-len(checks), hold_us) if undoable else (len(checks),)
        for c in checks:
            keys.append(c.key)
            args += limit_args(c)
    args += jitter
    return keys, args


def undo_args(items: Sequence[tuple[Check, Receipt]], clock: str | int,
              jitter: tuple[int, ...]) -> tuple[list[str], list[str | int]]:
    """The keys and arguments of the compensating call that takes back what ``items``' receipts name."""
    args: list[str | int] = [clock, "undo", len(items)]
    for c, (r1, r2) in items:
        args += (c.algorithm.value, *c.params(), r1, r2)
    args += jitter
    return [c.key for c, _ in items], args


def read_answers(requests: Sequence[Request], reply: list[int],
                 unconfirmed: Unconfirmed | None) -> list[Decision | Part | Unconfirmed]:
    """Each request's answer in ``reply`` (a Decision, or a Part for one that may be undone); ``unconfirmed``
    instead for a request admitted with hits, when the writes did not reach REDIS_WAIT_REPLICAS replicas."""
    answers: list[Decision | Part | Unconfirmed] = []
    at = 0
    for checks, _, undoable in requests:
        answer: Decision | Part
        if undoable:
            answer, at = read_part(reply, at, len(checks))
            decision = answer.decision
        else:
            answer = decision = read_decision(reply, at, len(checks))
            at += 1 + 3 * len(checks)
        # admitted with hits that a failover would lose
        if unconfirmed is not None and decision.admitted and any(c.hits > 0 for c in checks):
            answers.append(unconfirmed)
        else:
            answers.append(answer)
    return answers


def read_decision(reply: list[int], at: int, n: int) -> Decision:
    """The decision of a request of ``n`` limits starting at ``reply[at]`` (admitted, then three values a limit),
    read positionally: keywords cost each of a call's outcomes their parsing."""
    if n == 1:  # most requests: without the comprehension's range and frame
        return Decision(bool(reply[at]), [Outcome(bool(reply[at + 1]), int(reply[at + 2]), int(reply[at + 3]))])
    return Decision(bool(reply[at]), [Outcome(bool(reply[i]), int(reply[i + 1]), int(reply[i + 2]))
                                      for i in range(at + 1, at + 1 + 3 * n, 3)])


def read_part(reply: list[int], at: int, n: int) -> tuple[Part, int]:
    """The answer to a request of ``n`` limits that may be undone, starting at ``reply[at]`` (admitted, then seven
    values a limit), and where the next answer starts."""
    outcomes, unchanged, receipts = [], [], []
    for i in range(at + 1, at + 1 + 7 * n, 7):
        over, remaining, reset, before, before_reset, r1, r2 = (int(x) for x in reply[i:i + 7])
        outcomes.append(Outcome(bool(over), remaining, reset))
        unchanged.append(Outcome(False, before, before_reset))
        receipts.append((r1, r2) if r1 >= 0 else None)
    return Part(Decision(bool(reply[at]), outcomes), unchanged, receipts), at + 1 + 7 * n


def pack(command: tuple[str | int, ...]) -> bytes:
    """``command`` in the Redis protocol, packed by hiredis (redis-py's asyncio packer is pure Python and costs
    more than the round trip's own system calls); text that came from request bytes which are not UTF-8 goes
    back to those bytes."""
    args: Any = command  # its stubs declare a one-element tuple
    try:
        packed: bytes = hiredis.pack_command(args)
    except UnicodeEncodeError:  # only text from bytes that were not UTF-8: the rest is packed as it is
        args = tuple(a.encode("utf-8", "surrogateescape") if isinstance(a, str) else a for a in command)
        packed = hiredis.pack_command(args)
    return packed
