"""A request whose limits live in several places (Redis Cluster slots, or the per-second Redis beside the main
one), decided all-or-nothing as on one Redis.

Each place decides its share so that it can be undone (lua/decide.lua returns a receipt of what it wrote), and
when any place rejects, the places that admitted are sent a compensating call that takes back exactly this
request's hits. Until it lands the request holds that room (another request may be refused meanwhile); no
request is ever admitted beyond a limit. When the compensating call fails (a node down), the request stays
rejected and the hits it held stay counted: conservative. Hits given back (is_negative_hits) never reject and
cannot be undone exactly, so in a request that also adds hits they are applied only once every place has
admitted it. A place that rejects decides the request even when another fails: the failure mode must not
admit what a limit refused.

The places are ``UndoableStore``s (slidegate.backends.redis.RedisBackend is one); this module talks to them
through that interface only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Protocol

from slidegate.backends.base import BackendUnavailable, Check, DeadlineExceeded, Decision, Outcome, admits
from slidegate.backends.redis_errors import STORAGE_ERRORS, reason
from slidegate.backends.script_codec import Part, Receipt


class UndoableStore(Protocol):
    """What decides a share of a request so that it can be undone."""

    @property
    def timeout(self) -> float:
        """Seconds one of its decisions may take."""
        ...

    def slot(self, key: str) -> int:
        """The hash slot of ``key`` (0 outside a cluster): keys of one slot are decided by one call."""
        ...

    def refusal(self, timeout: float | None) -> BackendUnavailable | None:
        """Why a call must not be sent now (its breaker is open, it has been silent too long), or None."""
        ...

    def unavailable(self, exc: BaseException) -> BackendUnavailable:
        """A storage error as the failure mode hears of it, naming this store."""
        ...

    async def decide_undoable(self, checks: Sequence[Check], clock: str | int, until: float | None) -> Part:
        """``checks`` decided so that they can be undone, sent before ``until`` (the loop's time) or not at all."""
        ...

    async def decide_given(self, checks: Sequence[Check], clock: str | int) -> Decision:
        """``checks`` that cannot be undone (hits given back: they never reject), in one call."""
        ...

    def start_undo(self, items: list[tuple[Check, Receipt]], clock: str | int) -> asyncio.Task[None]:
        """Take back what ``items``' receipts name; the task outlives its request (a failure is logged)."""
        ...


Place = tuple[UndoableStore, list[int]]  # one call's share of a request: where, and the indexes of its checks
Undo = dict[UndoableStore, list[tuple[Check, Receipt]]]  # what to take back, store by store


def places(checks: Sequence[Check], side: Callable[[Check], UndoableStore]) -> list[Place]:
    """``checks`` grouped by where one call decides them: the store ``side`` names for each, and on a cluster
    its hash slot (first-seen order)."""
    found: dict[tuple[int, int], Place] = {}
    for i, c in enumerate(checks):
        store = side(c)
        found.setdefault((id(store), store.slot(c.key)), (store, []))[1].append(i)
    return list(found.values())


async def decide_spanning(checks: Sequence[Check], side: Callable[[Check], UndoableStore], now_us: int | None,
                          timeout: float | None, name: str) -> Decision:
    """``checks`` kept in several stores (``side`` names each one's), all-or-nothing: see ``decide_across``.
    ``name`` describes them together in errors. Raises BackendUnavailable (a store whose breaker is open, or
    that has been silent too long, fails the request at once), DeadlineExceeded when ``timeout`` (shorter than
    the stores' own) ran out."""
    stores = list({id(s): s for s in map(side, checks)}.values())
    # a store that fails at once fails its places, not the request: the live one may still reject it, and a
    # rejection must not be lost to the failure mode
    refused = {id(s): r for s in stores if (r := s.refusal(timeout)) is not None}
    if len(refused) == len(stores):
        raise next(iter(refused.values()))
    clock: str | int = "" if now_us is None else now_us
    own = max(s.timeout for s in stores)
    caller_first = timeout is not None and timeout < own
    bound = timeout if timeout is not None and caller_first else own
    try:
        async with asyncio.timeout(bound) as scope:
            return await decide_across(checks, places(checks, side), side, clock, scope, refused)
    except STORAGE_ERRORS as exc:  # a TimeoutError: decide_across says which store failed otherwise
        if caller_first and isinstance(exc, TimeoutError):
            raise DeadlineExceeded(f"{name}: the caller's deadline ({timeout:.3f} s) ran out") from exc
        raise BackendUnavailable(f"{name}: {reason(exc)}") from exc


async def decide_across(checks: Sequence[Check], where: list[Place], side: Callable[[Check], UndoableStore],
                        clock: str | int, scope: asyncio.Timeout,
                        refused: Mapping[int, BackendUnavailable] | None = None) -> Decision:
    """``checks`` spanning the places ``where``, all-or-nothing (see the module docstring). When a place fails
    and none rejects, raises its error (BackendUnavailable naming its store, or a TimeoutError), after undoing
    the others. A caller that stops waiting does not stop the undo: the places' answers are settled when they
    come. ``refused``: by id, the stores that fail at once (not asked)."""
    giving = [i for i, c in enumerate(checks) if c.hits < 0]
    if len(giving) == len(checks):  # nothing can reject
        return await _decide_given(checks, where, clock)
    # a check-only shadow stands in for each give-back: the limit as it stands, never a rejection
    first = [c._replace(hits=0, shadow=True) if c.hits < 0 else c for c in checks]
    # quota limits may span places: each place evaluates them as shadows, and _settle applies the quota rule to
    # them all
    sent = [c._replace(shadow=True, quota=False) if c.quota else c for c in first]
    # shielded from the caller's deadline, so that what they did is settled; bounded by it all the same (a place's
    # call not sent by then is not sent at all, and counts as failed)
    until = scope.when()
    calls = asyncio.gather(*(_refused(refused[id(store)]) if refused and id(store) in refused
                             else store.decide_undoable([sent[i] for i in group], clock, until)
                             for store, group in where), return_exceptions=True)
    try:
        parts = await asyncio.shield(calls)
    except asyncio.CancelledError:
        calls.add_done_callback(partial(_settle_late, checks, first, where, clock))
        raise
    admitted, outcomes, undo, decided = _settle(checks, first, where, parts)
    if undo:
        await _give_back(undo, clock, scope)
    if not decided:
        _raise_failure(where, parts)
    if admitted and giving:
        given = [checks[i] for i in giving]
        given_back = await _decide_given(given, places(given, side), clock)
        for i, outcome in zip(giving, given_back.outcomes, strict=True):
            outcomes[i] = outcome
    return Decision(admitted, outcomes)


def _raise_failure(where: list[Place], parts: list[Part | BaseException]) -> None:
    """The first place's failure, as the failure mode hears of it (a TimeoutError stays one: the caller's)."""
    for (store, _), part in zip(where, parts, strict=True):
        if isinstance(part, BaseException):
            if isinstance(part, STORAGE_ERRORS) and not isinstance(part, TimeoutError):
                raise store.unavailable(part) from part
            raise part


async def _decide_given(checks: Sequence[Check], where: list[Place], clock: str | int) -> Decision:
    """``checks`` that cannot reject (give-backs), one call per place."""
    decisions = await asyncio.gather(*(store.decide_given([checks[i] for i in group], clock)
                                       for store, group in where))
    outcomes: list[Outcome] = [Outcome(False, 0, 0)] * len(checks)
    for (_, group), decision in zip(where, decisions, strict=True):
        for i, outcome in zip(group, decision.outcomes, strict=True):
            outcomes[i] = outcome
    return Decision(all(d.admitted for d in decisions), outcomes)


async def _refused(error: BackendUnavailable) -> Part:
    """A place of a store that fails at once: its answer is ``error``, without a call."""
    raise error


def _settle_late(checks: Sequence[Check], first: list[Check], where: list[Place], clock: str | int,
                 calls: asyncio.Future[list[Part | BaseException]]) -> None:
    """The places of a request whose caller stopped waiting have answered: undo them unless all admitted."""
    if calls.cancelled():
        return
    _, _, undo, _ = _settle(checks, first, where, calls.result())
    for store, items in undo.items():
        store.start_undo(items, clock)


async def _give_back(undo: Undo, clock: str | int, scope: asyncio.Timeout) -> None:
    """Undo what ``undo``'s receipts name, waiting for it while the request's time lasts; a compensating call
    still running then goes on without it, one that fails is logged (its hits stay counted)."""
    tasks = {store.start_undo(items, clock) for store, items in undo.items()}
    deadline = scope.when()
    left = None if deadline is None else deadline - asyncio.get_running_loop().time() - 0.002
    if left is None or left > 0:
        await asyncio.wait(tasks, timeout=left)


def _settle(checks: Sequence[Check], first: Sequence[Check], where: list[Place],
            parts: list[Part | BaseException]) -> tuple[bool, list[Outcome], Undo, bool]:
    """What the places' answers (``parts``, one per place of ``first``: ``checks`` with each give-back a check)
    make of a request: whether it is admitted, an Outcome per check, what to undo in each store (the receipts
    of the places that admitted, when the request is not admitted), and whether the answers decide the request
    whatever the places that failed would have said (it is admitted, or rejected by what did answer)."""
    # backends.base.admits on the request's own checks, as Lua and the memory backend apply it: a give-back
    # (its stand-in a check-only shadow) is never over, and a quota give-back is a quota limit not over
    over = [False] * len(checks)
    answered = [False] * len(checks)
    for (_, group), part in zip(where, parts, strict=True):
        if isinstance(part, Part):
            for i, outcome in zip(group, part.decision.outcomes, strict=True):
                over[i], answered[i] = outcome.over and checks[i].hits >= 0, True
    failed = not all(answered)
    admitted = not failed and admits(checks, over)
    quota = [i for i, c in enumerate(checks) if c.quota]
    decided = not failed or any(isinstance(p, Part) and not p.decision.admitted for p in parts) or (
        bool(quota) and all(answered[i] and over[i] for i in quota))
    outcomes: list[Outcome] = [Outcome(False, 0, 0)] * len(checks)
    undo: Undo = {}
    for (store, group), part in zip(where, parts, strict=True):
        if not isinstance(part, Part):
            continue
        taken_back = set()
        if not admitted and part.decision.admitted:
            for i, receipt in zip(group, part.receipts, strict=True):
                if receipt is not None:
                    undo.setdefault(store, []).append((first[i], receipt))
                    taken_back.add(first[i].key)
        for i, outcome, unchanged in zip(group, part.decision.outcomes, part.unchanged, strict=True):
            # a give-back, or hits taken back: the limit as if this request had not come
            outcomes[i] = unchanged if checks[i].hits < 0 or (first[i].key in taken_back and not outcome.over) \
                else outcome
    return admitted, outcomes, undo, decided
