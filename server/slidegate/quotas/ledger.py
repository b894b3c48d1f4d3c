"""How a global quota is shared out among the Envoys that enforce it (the Rate Limit Quota Service).

Each Envoy enforces its own token bucket for a quota bucket and reports its usage every 5 s; slidegate answers
with the bucket it may use: its *share* of the limit. Every Envoy's bucket for one quota is a *holder* in the
quota's ledger, kept in the storage (one Redis hash, or this process's memory), so that every slidegate
replica shares it out from the same books. This module is the ledger's rule and its in-memory twin;
lua/quota.lua is the same rule for Redis, written step for step alike (tests compare the two).

The guarantee: in any window of the limit's length, the Envoys together admit at most the limit, besides the
requests an Envoy lets through before its first assignment arrives (its no_assignment_behavior). It holds
because the ledger never books more than the limit:

- a holder's *share* s becomes a token bucket of max_tokens m and tokens_per_fill t per window W, with
  m + t = s: Envoy's bucket starts full and refills continuously, so it admits at most m + t = s in any
  window (``bucket_for``);
- when a holder's bucket is replaced (a new share, or a fresh bucket for a holder that used its own), the old
  bucket stays booked as *retired* for as long as it can still count in a window: what it was reported to
  admit in the last window, plus what it may still have held when it was replaced (``left``: the reports
  bound its level from above), never more than its share. Envoy may use the old bucket until the new
  assignment reaches it (allowed for: SLACK_MS);
- a holder that goes away (its stream closed, or its replica stopped reporting for LEASE_MS) may still be
  enforced by its Envoy until the assignment's TTL runs out: its whole share stays booked until then, and a
  window longer;
- a new share is granted only from what the limit leaves after every other holder's share and every retired
  booking.

Which holder gets how much: in proportion to its demand (requests allowed and denied per second in its last
report, or half its demand before if that is more), each holder weighing at least a tenth of the mean, so an
idle Envoy holds little and a busy one is not starved. A holder asked to shrink gets a smaller bucket (once it
has held its bucket for a window, or SETTLE_MS if shorter); one that used up its bucket gets a fresh one when
the limit has room again (the reports show its old admissions leaving the window). Envoy keeps its bucket,
tokens and all, when an assignment's max_tokens and tokens_per_fill are unchanged, so a new bucket always
differs in one of them. A report also bounds what a bucket holds: what it was sent plus its refill, less what
it let through, and below one token plus the refill since when it denied a request.

The guarantee costs some of the limit: what a replaced bucket may still hold is booked until its window ends,
and a bucket that holds a share is booked in full. In simulations (tests/test_quota_ledger.py) a busy Envoy
gets 80 to 90% of a per-second or per-minute limit, about half of a limit whose window is two report
intervals long (10 s).

Quantities are kept in thousandths of a token ("mt") as whole numbers, computed in doubles exactly as the Lua
computes them, so both implementations keep the same books digit for digit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Envoy 1.40 reports every bucket every 5 s, whatever the filter's reporting_interval says.
REPORT_INTERVAL_MS = 5_000
# An assignment lives this long in Envoy without being renewed: two reports may go unanswered.
TTL_MS = 3 * REPORT_INTERVAL_MS
# How long Envoy may keep using a bucket after the ledger replaced it: the storage's answer (at most half of
# this, slidegate.application bounds its timeout) and the answer's way to Envoy.
SLACK_MS = 2_000
# A holder not heard from for this long is gone (its slidegate replica stopped): its share is retired.
LEASE_MS = 3 * REPORT_INTERVAL_MS
# A bucket is kept this long (or its window, if shorter) before it may be shrunk for others.
SETTLE_MS = 60_000
# A holder keeps at most this many reports (older ones merged), a ledger at most this many retired bookings.
MAX_REPORTS = 16
MAX_RETIRED = 32
# Counts (as reported, and merged) are capped here, above any limit, so that sums of them in thousandths stay
# exact in a double.
MAX_COUNT = 2**32


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


def bucket_for(share: int, limit: int, window_ms: int, shift: int = 0) -> Assignment:
    """The token bucket that admits at most ``share`` requests in any window of ``window_ms``: m + t = share
    with t refilled per window. The refill's part grows with how many windows pass between two reports (for
    a per-second limit the refill carries the load; for a minute or more the burst does, and fresh buckets
    follow the reports). ``shift``
    moves that many tokens more from the burst to the refill (a fresh bucket of the same share, see report).
    A share of 1 is a bucket of 1 refilled every two windows (at most one per window), offered only when the
    limit itself is 1: for a larger limit it would look to Envoy like a share of 2's bucket (Envoy compares
    max_tokens and tokens_per_fill only). DENY when no such bucket exists."""
    if share <= 0 or (share == 1 and limit > 1):
        return DENY
    if share == 1:
        return DENY if shift else Assignment(1, 1, 2 * window_ms)
    refill = min(share - 1, max(1, math.floor(share * REPORT_INTERVAL_MS / (REPORT_INTERVAL_MS + window_ms) + 0.5)))
    refill += shift
    if refill > share - 1:
        return DENY
    return Assignment(share - refill, refill, window_ms)


@dataclass(slots=True)
class Holder:
    """One Envoy's bucket of a quota: ``share`` booked, its bucket (``m``, ``t``) since ``since`` (ms),
    ``reported`` the time of its last report, ``level`` (mt) an upper bound of its tokens then, ``carry`` (mt)
    what the bucket it replaced may have let through after ``since`` (only until the next report), ``fresh``:
    no report since the bucket was sent, ``demand`` (thousandths of a request per second), ``seen`` (ms),
    ``reports``: (time, allowed) of this bucket's reports within the last window, oldest first; ``owner``: the
    stream that reports it ("": none now, see ``detach``)."""

    share: int
    m: int
    t: int
    since: int
    reported: int
    level: int
    carry: int
    fresh: int
    demand: int
    seen: int
    reports: list[tuple[int, int]]
    owner: str

    def encode(self) -> str:
        numbers = (self.share, self.m, self.t, self.since, self.reported, self.level, self.carry, self.fresh,
                   self.demand, self.seen)
        return " ".join(str(n) for n in numbers) + "|" + _encode_reports(self.reports) + "|" + self.owner

    @classmethod
    def decode(cls, text: str) -> Holder:
        head, reports, owner = text.split("|")
        n = [int(x) for x in head.split(" ")]
        return cls(n[0], n[1], n[2], n[3], n[4], n[5], n[6], n[7], n[8], n[9], _decode_reports(reports), owner)


@dataclass(slots=True)
class Retired:
    """A replaced bucket, booked for as long as it can count in a window: at most ``share``; what it may have
    held when replaced at ``ended`` (``left``, mt) until a window after ``ended`` + SLACK_MS; each report's
    allowed requests until a window after the report."""

    share: int
    left: int
    ended: int
    reports: list[tuple[int, int]]

    def encode(self) -> str:
        return f"{self.share} {self.left} {self.ended}|" + _encode_reports(self.reports)

    @classmethod
    def decode(cls, text: str) -> Retired:
        head, _, tail = text.partition("|")
        n = [int(x) for x in head.split(" ")]
        return cls(n[0], n[1], n[2], _decode_reports(tail))

    def booked(self, now: int, window_ms: int) -> int:
        """What it may still admit in a window ending now or later (mt)."""
        total = self.left if now < self.ended + SLACK_MS + window_ms else 0
        for at, allowed in self.reports:
            if at > now - window_ms:
                total += allowed * 1000
        return min(self.share * 1000, total)


def _expires_of(text: str, window_ms: int) -> int:
    """When the retired booking ``text`` can no longer count: a window after the later of its end (and SLACK_MS)
    and its last report. Read from those alone: a ledger's retired bookings are many, each looked at whenever one
    is added."""
    head, _, reports = text.partition("|")
    last = int(reports.rpartition(",")[2].partition(":")[0]) if reports else 0
    return max(int(head.split(" ")[2]) + SLACK_MS, last) + window_ms


def _encode_reports(reports: list[tuple[int, int]]) -> str:
    return ",".join(f"{at}:{allowed}" for at, allowed in reports)


def _decode_reports(text: str) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for item in text.split(",") if text else []:
        at, _, allowed = item.partition(":")
        out.append((int(at), int(allowed)))
    return out


def _keep_reports(reports: list[tuple[int, int]], now: int, window_ms: int) -> list[tuple[int, int]]:
    """Reports still inside the window; beyond MAX_REPORTS the two oldest become one at the later time (it
    then counts a little longer: never less)."""
    kept = [(at, allowed) for at, allowed in reports if at > now - window_ms]
    while len(kept) > MAX_REPORTS:
        (_, first), (at, second) = kept[0], kept[1]
        kept[0:2] = [(at, min(MAX_COUNT, first + second))]
    return kept


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
    first, second = sorted(names, key=lambda name: (_expires_of(state[name], window_ms), int(name[2:])))[:2]
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


def _gone(h: Holder, until: int, window_ms: int) -> Retired:
    """``h``'s bucket once nothing replaces it: Envoy may enforce it until ``until`` (when its assignment's TTL
    runs out), so what it held at its last report and refills until then (and SLACK_MS more) stays booked."""
    since = h.since if h.fresh == 1 else h.reported
    return Retired(h.share, h.level + _refill(h.t, until + SLACK_MS - since, h.m, window_ms), until, h.reports)


def _tidy(state: dict[str, str], holder: str, now: int, window_ms: int) -> None:
    """Drop retired bookings that can no longer count; retire holders not heard from for LEASE_MS (their Envoy
    may enforce their bucket until its TTL)."""
    for name in sorted((n for n in state if n.startswith("r:")), key=lambda n: int(n[2:])):
        if now >= _expires_of(state[name], window_ms):
            del state[name]
    for name in sorted(n for n in state if n.startswith("h:")):
        if name == "h:" + holder:
            continue
        h = Holder.decode(state[name])
        if now - h.seen >= LEASE_MS:
            del state[name]
            if h.share > 0:
                _retire(state, _gone(h, h.seen + TTL_MS, window_ms), window_ms)


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
    others, demands = _others(state, name, now, window_ms)
    # this holder's part of the limit, by demand
    least = max(1, math.floor(sum(demands) / len(demands) / 10))
    weights = sum(max(d, least) for d in demands)
    target = math.floor(limit * (max(h.demand, least) / weights))
    return _grant(state, name, h, limit, window_ms, target, others, now)


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
            _retire(state, _gone(h, h.seen + TTL_MS, window_ms), window_ms)
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
    h.reports = _keep_reports(h.reports, now, window_ms)
    # demand: the last report's rate, or half the demand before (a lull does not give the share away at once)
    rate = min(MAX_COUNT, math.floor(float(allowed + denied) * 1000000 / max(elapsed_ms, 1000)))
    h.demand = max(rate, h.demand // 2)
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


def _others(state: dict[str, str], name: str, now: int, window_ms: int) -> tuple[int, list[int]]:
    """What every holder but ``name`` and every retired bucket books (mt), and every holder's demand."""
    demands: list[int] = []
    others = 0
    for other in sorted(n for n in state if n.startswith("h:")):
        o = Holder.decode(state[other])
        demands.append(o.demand)
        if other != name:
            others += o.share * 1000
    for retired in sorted((n for n in state if n.startswith("r:")), key=lambda n: int(n[2:])):
        others += Retired.decode(state[retired]).booked(now, window_ms)
    return others, demands


def _grant(state: dict[str, str], name: str, h: Holder, limit: int, window_ms: int, target: int, others: int,
           now: int) -> Assignment:
    """``h``'s bucket from now on: a new one of at most ``target`` when the limit has room and it is worth
    replacing the one it holds (booked as retired), else the same."""
    # what replacing the bucket now would leave booked for the old one, and what the limit then has room for
    left = _left(h, now, window_ms) if h.share > 0 else 0
    old = Retired(h.share, left, now, h.reports).booked(now, window_ms) if h.share > 0 else 0
    room = max(0, math.floor((limit * 1000 - others - old) / 1000))
    current = _assignment(h, window_ms)
    share, candidate = _fresh_bucket(min(target, room), current, limit, window_ms)
    if not _replaces(h, target, candidate, current, now, window_ms):
        return current
    if old > 0:
        _retire(state, Retired(h.share, left, now, h.reports), window_ms)
    h.share = 0 if candidate.denies else share
    h.m, h.t = candidate.max_tokens, candidate.tokens_per_fill
    h.since, h.carry, h.fresh = now, left, 1
    h.level = h.m * 1000
    h.reports = []
    state[name] = h.encode()
    return candidate


def _fresh_bucket(share: int, current: Assignment, limit: int, window_ms: int) -> tuple[int, Assignment]:
    """The bucket for ``share`` (or one less) that differs from ``current``, and its share."""
    candidate = bucket_for(share, limit, window_ms)
    if candidate == current:  # the same bucket would not be a fresh one in Envoy: the same share split otherwise
        candidate = bucket_for(share, limit, window_ms, shift=1)
        if candidate.denies:
            share -= 1
            candidate = bucket_for(share, limit, window_ms)
    return share, candidate


def _replaces(h: Holder, target: int, candidate: Assignment, current: Assignment, now: int, window_ms: int) -> bool:
    """Whether ``candidate`` is to replace ``h``'s bucket (``current``)."""
    margin = max(1, h.share // 10)
    if h.share > 0 and target <= h.share - margin and now - h.since >= min(window_ms, SETTLE_MS):
        # asked to shrink: others need the room. Not a bucket just sent: what it may still let through stays
        # booked for a window, so shrinking it at once would only leave everyone without
        return True
    # a larger or fresher bucket than what this one may still give in the coming window
    gain = (candidate.max_tokens + candidate.tokens_per_fill) * 1000 - (h.level + h.t * 1000)
    return not candidate.denies and candidate != current and gain >= margin * 1000


def release(state: dict[str, str], window_ms: int, holder: str, now: int, unsure: int = 0) -> None:
    """``holder``'s stream ended at ``now`` (or its storage call failed): its Envoy may enforce its bucket until
    the TTL runs out, so what it may still let through until then stays booked, until a window later. ``unsure``:
    the largest share of another bucket Envoy may hold instead (one sent within the TTL, or whose replacement
    may not have reached it), booked in full as long."""
    name = "h:" + holder
    if name in state:
        h = Holder.decode(state.pop(name))
        if h.share > 0:
            _retire(state, _gone(h, now + TTL_MS, window_ms), window_ms)
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
    what release and detach book as unsure, and by merged retired bookings (each counted whole until the later
    end): both over-count, so new shares wait longer."""
    total = 0
    for name, text in state.items():
        if name.startswith("h:"):
            total += Holder.decode(text).share * 1000
        elif name.startswith("r:"):
            total += Retired.decode(text).booked(now, window_ms)
    return total
