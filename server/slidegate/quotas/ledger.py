"""How a global quota is shared out among the Envoys that enforce it (the Rate Limit Quota Service).

Each Envoy enforces its own token bucket for a quota bucket and reports its usage every 5 s; slidegate answers
with the bucket it may use: its *share* of the limit. Every Envoy's bucket for one quota is a *holder* in the
quota's ledger, kept in the storage (one Redis hash, or this process's memory), so that every slidegate
replica shares it out from the same books. This module is the ledger's rule and its in-memory twin;
lua/quota.lua is the same rule for Redis, written step for step alike (tests compare the two).

The guarantee: in any window of the limit's length, the Envoys together admit at most the limit, besides the
requests an Envoy lets through before its first assignment arrives (its no_assignment_behavior). It holds
because the ledger never books more than the limit:

- a holder's *share* s becomes a token bucket of a small burst m and a refill t per window W, m + t = s:
  Envoy's bucket starts full and refills continuously, so it admits at most s in any window (``bucket_for``);
- a bucket that replaces another starts, in Envoy 1.40, at the old one's fill ratio rounded down and refills
  at its own rate from then on: in a window the two admit at most the larger burst, the old refill for the
  part of the window before the switch and the new one after. A holder that shrinks books the old refill's
  excess as the old bucket leaves the window; one that grows (or gets its first bucket) books its new refill
  as it comes in, and may have more than the room free now where others' bookings leave the window as its
  own comes in (``Holder.booking``, ``_free``, ``_share``). Either changes no more until its booking is flat
  again. Envoy may use the old bucket until the new assignment reaches it (SLACK_MS);
- a bucket that ends (for a DENY_ALL, or its holder gone: its stream closed, or its replica silent for
  LEASE_MS) stays booked as *retired* while it can count: what it was reported to admit in the window and
  what it may still let through until its TTL runs out (``left``), never more than what it booked;
- a new share is granted only where it fits, in every window ending from now on, in what the limit leaves
  after every other holder and retired booking.

Which holder gets how much: in proportion to its demand (requests allowed and denied per second, each report
moving it a quarter of the way), each holder weighing at least a tenth of the mean, so an idle Envoy holds
little and a busy one is not starved. A holder shrinks when its part falls a fifth below its share (or at all
while another waits with none), once a report said what its Envoy asks; it grows into room as it frees up,
holders with none first. Since Envoy keeps a bucket whose max_tokens and tokens_per_fill are unchanged, and
starts a different one at the old one's ratio, the share is carried by the refill and never "refreshed". A
report also bounds what a bucket holds: what it was sent plus its refill, less what it let through, and below
one token plus the refill since when it denied a request.

The guarantee costs the bursts (a lone busy Envoy gets the limit less its burst, 5% of it and at least 2, per
window) and, while a share shrinks, the window in which the old bucket still counts.

Quantities are kept in thousandths of a token ("mt") as whole numbers, computed in doubles exactly as the Lua
computes them, so both implementations keep the same books digit for digit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from slidegate.quotas.books import (
    LEASE_MS,
    MAX_COUNT,
    MAX_REPORTS,
    MAX_RETIRED,
    REPORT_INTERVAL_MS,
    SETTLE_MS,
    SLACK_MS,
    TTL_MS,
    UNKNOWN,
    Holder,
    Retired,
    expires_of,
    keep_reports,
)

__all__ = ["DENY", "LEASE_MS", "MAX_COUNT", "MAX_REPORTS", "MAX_RETIRED", "REPORT_INTERVAL_MS", "SETTLE_MS",
           "SLACK_MS", "TTL_MS", "Assignment", "Holder", "HolderTaken", "Retired", "booked", "bucket_for",
           "burst_for", "detach", "release", "report", "share_of"]

@dataclass(frozen=True, slots=True)
class Assignment:
    """A holder's bucket: ``max_tokens`` m, ``tokens_per_fill`` t per ``fill_interval_ms`` (whole seconds).
    max_tokens 0: deny every request (no share)."""

    max_tokens: int
    tokens_per_fill: int
    fill_interval_ms: int

    @property
    def denies(self) -> bool:
        return self.max_tokens == 0


DENY = Assignment(0, 0, 0)


class HolderTaken(Exception):
    """Another stream reports this holder (its owner, heard from within LEASE_MS)."""


def share_of(assignment: Assignment, window_ms: int) -> int:
    """The most ``assignment``'s bucket admits in a window of ``window_ms`` (its share, see bucket_for)."""
    if assignment.denies:
        return 0
    return 1 if assignment.fill_interval_ms > window_ms else assignment.max_tokens + assignment.tokens_per_fill


def burst_for(share: int) -> int:
    """The burst of a bucket of ``share`` (2 and more): 5% of it, at least 2 (a bucket of one token loses most of
    its refill to requests that come evenly spaced at more than its rate: its one token waits, full, for the
    next), at most ``share`` - 1."""
    return min(share - 1, max(2, -(-share // 20)))


def bucket_for(share: int, limit: int, window_ms: int, burst: int = 0) -> Assignment:
    """The token bucket that admits at most ``share`` requests in any window of ``window_ms``: a burst of
    ``burst`` tokens (burst_for(share) if 0 or more) and the rest refilled per window. The refill carries the
    share: a bucket that replaces another keeps only the old one's fill ratio in Envoy (rounded down: a drained
    bucket's successor starts empty), so a burst is never given again. A share of 1 is a bucket of 1 refilled
    every two windows (at most one per window), offered only when the limit itself is 1: for a larger limit it
    would look to Envoy like a share of 2's bucket (Envoy compares max_tokens and tokens_per_fill only, and
    would keep the refill of either). DENY for no share."""
    if share <= 0 or (share == 1 and limit > 1):
        return DENY
    if share == 1:
        return Assignment(1, 1, 2 * window_ms)
    m = burst_for(share) if burst <= 0 else min(burst, burst_for(share))
    return Assignment(m, share - m, window_ms)


def _refill(t: int, elapsed: int, m: int, window_ms: int) -> int:
    """An upper bound (mt) of what t tokens per window refill in ``elapsed`` ms: one thousandth more than
    the double's quotient, capped past a bucket's share (m + t: all a bucket can let through in a window), where
    every use of it is capped anyway."""
    if t <= 0:
        return 0
    longest = window_ms * (m // t + 2)
    elapsed = min(elapsed, longest)
    return math.floor(float(t) * 1000 * elapsed / window_ms) + 1  # in doubles, as the Lua


def _retire(state: dict[str, str], entry: Retired, window_ms: int) -> None:
    """Book ``entry``; beyond MAX_RETIRED the two that expire first become one (their shares, lefts and
    reports added: never less booked)."""
    number = int(state.get("n", "0")) + 1
    state["n"] = str(number)
    state[f"r:{number}"] = entry.encode()
    names = sorted((name for name in state if name.startswith("r:")), key=lambda name: int(name[2:]))
    if len(names) <= MAX_RETIRED:
        return
    first, second = sorted(names, key=lambda name: (expires_of(state[name], window_ms), int(name[2:])))[:2]
    a, b = Retired.decode(state[first]), Retired.decode(state[second])
    merged = sorted(a.reports + b.reports)
    while len(merged) > MAX_REPORTS:
        (_, c1), (at, c2) = merged[0], merged[1]
        merged[0:2] = [(at, min(MAX_COUNT, c1 + c2))]
    state[first] = Retired(a.share + b.share, a.left + b.left, max(a.ended, b.ended), merged).encode()
    del state[second]


def _assignment(h: Holder, window_ms: int) -> Assignment:
    """The bucket ``h`` holds (a share of 1 refills every two windows, see bucket_for)."""
    if h.m == 0:
        return DENY
    return Assignment(h.m, h.t, 2 * window_ms if h.share == 1 else window_ms)


def _left(h: Holder, now: int, window_ms: int) -> int:
    """An upper bound (mt) of what ``h``'s bucket may let through from its last report until a replacement sent
    now reaches Envoy: what it held then and what it refills until then (not capped at max_tokens: a full
    bucket goes on refilling as it lets requests through)."""
    return h.level + _refill(h.t, now - h.reported + SLACK_MS, h.m, window_ms)


def _gone(h: Holder, until: int, now: int, window_ms: int) -> Retired:
    """``h``'s bucket once nothing replaces it: Envoy may enforce it until ``until`` (when its assignment's TTL
    runs out), so what it held at its last report and refills until then (and SLACK_MS more) stays booked, with
    its reports, at most the largest share it and the buckets it replaced hold (``Holder.most``)."""
    since = h.since if h.fresh == 1 else h.reported
    left = h.level + _refill(h.t, until + SLACK_MS - since, h.m, window_ms)
    return Retired(-(-h.most(now, window_ms) // 1000), left, until, h.reports)


def _tidy(state: dict[str, str], holder: str, now: int, window_ms: int) -> None:
    """Drop retired bookings that can no longer count; retire holders not heard from for LEASE_MS (their Envoy
    may enforce their bucket until its TTL)."""
    for name in sorted((n for n in state if n.startswith("r:")), key=lambda n: int(n[2:])):
        if now >= expires_of(state[name], window_ms):
            del state[name]
    for name in sorted(n for n in state if n.startswith("h:")):
        if name == "h:" + holder:
            continue
        h = Holder.decode(state[name])
        if now - h.seen >= LEASE_MS:
            del state[name]
            if h.share > 0:
                _retire(state, _gone(h, h.seen + TTL_MS, now, window_ms), window_ms)


def report(state: dict[str, str], limit: int, window_ms: int, holder: str, allowed: int, denied: int,
           elapsed_ms: int, now: int, owner: str = "") -> Assignment:
    """Take ``holder``'s report (``allowed`` and ``denied`` requests over ``elapsed_ms``, as Envoy measured it)
    at ``now`` (ms) into the ledger ``state`` of a quota of ``limit`` per ``window_ms``, from the stream
    ``owner``; return the holder's bucket from now on. Raises HolderTaken when another stream reports it."""
    allowed, denied = min(allowed, MAX_COUNT), min(denied, MAX_COUNT)
    _tidy(state, holder, now, window_ms)
    h = _reporting(state, holder, owner, elapsed_ms, now, window_ms)
    _take_usage(h, allowed, denied, elapsed_ms, now, window_ms)
    name = "h:" + holder
    state[name] = h.encode()
    others, retired, demands, waiting = _others(state, name, now, window_ms)
    free = _free(others, retired, limit, now, window_ms)
    return _grant(state, name, h, (limit, window_ms, _target(limit, demands, h.demand)), free, waiting, now)


def _target(limit: int, demands: list[int], mine: int) -> int:
    """A holder's part of ``limit`` by demand (``mine`` among every holder's ``demands``; UNKNOWN: as the mean
    of those known), each weighing at least a tenth of the mean."""
    known = [d for d in demands if d != UNKNOWN]
    guess = sum(known) // len(known) if known else 1000
    demands = [guess if d == UNKNOWN else d for d in demands]
    mine = guess if mine == UNKNOWN else mine
    least = max(1, math.floor(sum(demands) / len(demands) / 10))
    weights = sum(max(d, least) for d in demands)
    return math.floor(limit * (max(mine, least) / weights))


def _reporting(state: dict[str, str], holder: str, owner: str, elapsed_ms: int, now: int, window_ms: int) -> Holder:
    """The holder ``owner`` reports: as booked, or a new one. Raises HolderTaken."""
    name = "h:" + holder
    h = Holder.decode(state[name]) if name in state else None
    if h is not None and h.owner not in ("", owner) and now - h.seen < LEASE_MS:
        raise HolderTaken(holder)
    restarted = h is not None and h.owner != owner and elapsed_ms == 0
    if h is not None and (now - h.seen >= TTL_MS - SLACK_MS or restarted):
        # unanswered for so long that Envoy's assignment may expire before this answer reaches it, or taken up
        # by a new stream with a bucket Envoy has just made (an Envoy that restarted under its name): either
        # way Envoy starts full whatever comes, so the old bucket is booked as gone and the holder starts again
        del state[name]
        if h.share > 0:
            _retire(state, _gone(h, h.seen + TTL_MS, now, window_ms), window_ms)
        h = None
    if h is None:
        h = Holder(0, 0, 0, now, now, 0, 0, 0, 0, now, [], owner)
    h.owner = owner
    return h


def _take_usage(h: Holder, allowed: int, denied: int, elapsed_ms: int, now: int, window_ms: int) -> None:
    """Bring ``h`` up to the report: its level, its reports and its demand."""
    h.level = max(0, min(h.m * 1000, _level(h, allowed, denied, elapsed_ms, now, window_ms)))
    h.fresh, h.carry = 0, 0
    if h.share > 0 and allowed > 0:  # what a holder lets through before its first bucket is not booked
        h.reports.append((now, allowed))
    h.reports = keep_reports(h.reports, now, window_ms)
    # demand: the reports' rates, each moving it a quarter of the way (a report's noise does not move shares),
    # none at once for a report of none (an Envoy whose clients went gives its share back); not known from a
    # new bucket's first report (its one request, at once), nor moved by a report of under a second
    rate = min(MAX_COUNT, math.floor(float(allowed + denied) * 1000000 / max(elapsed_ms, 1000)))
    if elapsed_ms == 0:
        if h.seen == now and h.demand == 0 and h.m == 0:
            h.demand = UNKNOWN
    elif h.demand == UNKNOWN or rate == 0:
        h.demand = rate
    else:
        h.demand += (rate - h.demand) // 4
    h.reported, h.seen = now, now


def _level(h: Holder, allowed: int, denied: int, elapsed_ms: int, now: int, window_ms: int) -> int:
    """What ``h``'s bucket may hold now (mt, not yet capped), from what it was sent and what it let through."""
    if h.fresh == 1:
        used = max(0, allowed * 1000 - h.carry)
        return h.m * 1000 + _refill(h.t, now - h.since, h.m, window_ms) - used
    # Envoy's interval may be longer than the one between the reports' arrivals (the earlier one may have been
    # slower on its way): it is less than its own elapsed time (whole seconds, rounded down) plus one
    interval = max(now - h.reported, elapsed_ms + 1000)
    level = h.level + _refill(h.t, interval, h.m, window_ms) - allowed * 1000
    if denied > 0 and h.reported >= h.since + SLACK_MS:
        # a request denied since the last report found the bucket below one token (this bucket's: it had
        # reached Envoy by then), and it refilled at most the whole interval since
        level = min(level, 1000 + _refill(h.t, interval, h.m, window_ms))
    return level


def _others(state: dict[str, str], name: str, now: int, window_ms: int) -> tuple[list[Holder], int, list[int], bool]:
    """Every holder but ``name``, what the retired buckets book now (mt), every holder's demand, and whether
    another holder has no share (waits for room)."""
    demands: list[int] = []
    others: list[Holder] = []
    waiting = False
    for other in sorted(n for n in state if n.startswith("h:")):
        o = Holder.decode(state[other])
        demands.append(o.demand)
        if other != name:
            others.append(o)
            waiting = waiting or o.share == 0
    retired = 0
    for entry in sorted((n for n in state if n.startswith("r:")), key=lambda n: int(n[2:])):
        retired += Retired.decode(state[entry]).booked(now, window_ms)
    return others, retired, demands, waiting


def _free(others: list[Holder], retired: int, limit: int, now: int, window_ms: int) -> list[tuple[int, int]]:
    """What the limit leaves (mt) in windows ending from now on, after ``others`` and the ``retired`` bookings
    (as they are now: they only go down): (ms from now, free) now, a window on, and where another holder's
    booking turns (between those it is straight, so these bound it everywhere), in time order."""
    points = {now, now + window_ms}
    for o in others:
        if o.replacing(now, window_ms):
            points.update(x for x in o.turns(window_ms) if x > now)
    return [(x - now, limit * 1000 - retired - sum(o.booking(x, window_ms) for o in others))
            for x in sorted(points)]


def _grant(state: dict[str, str], name: str, h: Holder, quota: tuple[int, int, int], free: list[tuple[int, int]],
           waiting: bool, now: int) -> Assignment:
    """``h``'s bucket from now on, in a quota of (limit, window, ``h``'s target share), with ``free`` as _free
    says: a new one of at most the target when its share is to change and the limit has room, else the same.
    A bucket that replaces another, or a first one, is booked as it comes in or the old one leaves the window
    (``Holder.booking``); one that ends for a DENY_ALL is booked as retired."""
    limit, window_ms, target = quota
    share, ramped = _share(h, target, free, limit, window_ms)
    if not _replaces(h, target, share, limit, now, window_ms, waiting):
        return _assignment(h, window_ms)
    candidate = _bucket_after(h, share, limit, window_ms)
    left = _left(h, now, window_ms) if h.share > 0 else 0
    if candidate.denies:
        if h.share > 0:  # Envoy's bucket ends when the DENY_ALL reaches it
            _retire(state, Retired(-(-h.most(now, window_ms) // 1000), left, now, h.reports), window_ms)
        h.reports = []
        h.pm, h.pt = 0, 0
    elif share < h.share:  # the old burst and refill leave the window
        h.pm, h.pt = h.m, h.t
    elif ramped:  # the new refill comes in (the old one's until then; none after a DENY_ALL)
        h.pm, h.pt = candidate.max_tokens, h.t if h.share > 0 else 0
    else:  # the new bucket's burst and refill are no smaller (_bucket_after): its share is all it books
        h.pm, h.pt = 0, 0
    h.share = 0 if candidate.denies else share
    h.m, h.t = candidate.max_tokens, candidate.tokens_per_fill
    h.since, h.carry, h.fresh = now, left, 1
    h.level = h.m * 1000
    state[name] = h.encode()
    return candidate


def _share(h: Holder, target: int, free: list[tuple[int, int]], limit: int, window_ms: int) -> tuple[int, bool]:
    """The share ``h`` may have, at most ``target``: what is free in every window ending from now on, or more if
    its new bucket, booked as its refill comes in (``Holder.booking``), fits where the room frees up as it comes;
    and whether it is the latter."""
    flat = min(target, max(0, math.floor(min(f for _, f in free) / 1000)))
    if flat >= target:
        return flat, False
    burst = _bucket_after(h, target, limit, window_ms).max_tokens
    old = h.t if h.share > 0 else 0
    base = (burst + old) * 1000
    if burst == 0 or free[0][1] < base:
        return flat, False
    # in the windows to come, the old refill at least (as long as the new one comes in) and the new one's excess
    # as it comes in
    more = min(math.floor(float(f - base) * window_ms / min(d, window_ms) / 1000) for d, f in free if d > 0)
    ramp = min(target, burst + old + more)
    return (ramp, True) if ramp > flat else (flat, False)


def _replaces(h: Holder, target: int, share: int, limit: int, now: int, window_ms: int, waiting: bool) -> bool:
    """Whether ``h``'s bucket is to be replaced by one of ``share``: shrunk for others (by a fifth, or at all
    while another holder waits for room), or grown. Not while the bucket it replaced may still count (what the
    two book would have to be booked again), nor for the same share (Envoy would keep only the old bucket's
    fill ratio)."""
    if h.replacing(now, window_ms):
        return False
    if h.share > 0 and (target <= h.share - max(1, h.share // 5) or (waiting and target < h.share)):
        # asked to shrink (by a fifth: the demands' noise does not make shares go back and forth): others need
        # the room. Not a bucket just sent: its demand is not known yet
        return now - h.since >= min(window_ms, SETTLE_MS)
    # grown by a fiftieth or more: room left unbooked is taken up, first by those that have none
    grows = share >= h.share + max(1, h.share // 50) and not (waiting and h.share > 0)
    return grows and not bucket_for(share, limit, window_ms).denies


def _bucket_after(h: Holder, share: int, limit: int, window_ms: int) -> Assignment:
    """The bucket of ``share`` to replace ``h``'s: after a token bucket, a burst grown by no more than the share
    (so the refill does not shrink as it grows, and what the two book stays the larger share, see
    Holder.booking); after none, or a DENY_ALL, a full one of burst_for(share)."""
    if h.share <= 0:
        return bucket_for(share, limit, window_ms)
    return bucket_for(share, limit, window_ms, burst=h.m + max(0, share - h.share))


def release(state: dict[str, str], window_ms: int, holder: str, now: int, unsure: int = 0) -> None:
    """``holder``'s stream ended at ``now`` (or its storage call failed): its Envoy may enforce its bucket until
    the TTL runs out, so what it may still let through until then stays booked, until a window later. ``unsure``:
    the largest share of another bucket Envoy may hold instead (one sent within the TTL, or whose replacement
    may not have reached it), booked in full as long."""
    name = "h:" + holder
    if name in state:
        h = Holder.decode(state.pop(name))
        if h.share > 0:
            _retire(state, _gone(h, now + TTL_MS, now, window_ms), window_ms)
    _book_unsure(state, unsure, now, window_ms)


def detach(state: dict[str, str], window_ms: int, holder: str, owner: str, now: int, unsure: int = 0) -> None:
    """``owner``'s stream ended at ``now``, and its Envoy (which says who it is) may come back on another: the
    holder stays as it is, for whichever stream reports it next; not heard from within LEASE_MS, it is retired.
    ``unsure`` as for ``release``."""
    name = "h:" + holder
    if name in state:
        h = Holder.decode(state[name])
        if h.owner == owner:
            h.owner = ""
            state[name] = h.encode()
    _book_unsure(state, unsure, now, window_ms)


def _book_unsure(state: dict[str, str], share: int, now: int, window_ms: int) -> None:
    if share > 0:
        _retire(state, Retired(share, share * 1000, now + TTL_MS, []), window_ms)


def booked(state: dict[str, str], window_ms: int, now: int) -> int:
    """Everything the ledger books at ``now`` (mt). Grants keep it within the limit; it may go above only by
    what release and detach book as unsure, by merged retired bookings (each counted whole until the later end)
    and by the bucket of a holder gone while its booking went down (booked as it was then, until it can no
    longer count): all over-count, so new shares wait longer."""
    total = 0
    for name, text in state.items():
        if name.startswith("h:"):
            total += Holder.decode(text).booking(now, window_ms)
        elif name.startswith("r:"):
            total += Retired.decode(text).booked(now, window_ms)
    return total
