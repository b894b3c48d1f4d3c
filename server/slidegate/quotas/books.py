"""The quota ledger's books (slidegate.quotas.ledger): its timings and bounds, and what it keeps of each holder
and each retired bucket, in the encodings lua/quota.lua reads and writes alike."""

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
# A bucket is kept this long (or its window, if shorter) before it may be shrunk for others: until a report
# says what its Envoy asks (half an interval: reports come 5 s apart, give or take).
SETTLE_MS = REPORT_INTERVAL_MS // 2
# A holder keeps at most this many reports (older ones merged), a ledger at most this many retired bookings.
MAX_REPORTS = 16
MAX_RETIRED = 32
# A holder's demand before its Envoy's second report.
UNKNOWN = -1
# Counts (as reported, and merged) are capped here, above any limit, so that sums of them in thousandths stay
# exact in a double.
MAX_COUNT = 2**32


@dataclass(slots=True)
class Holder:
    """One Envoy's bucket of a quota: ``share`` booked, its bucket (``m``, ``t``) since ``since`` (ms),
    ``reported`` the time of its last report, ``level`` (mt) an upper bound of its tokens then, ``carry`` (mt)
    what the bucket it replaced may have let through after ``since`` (only until the next report), ``fresh``:
    no report since the bucket was sent, ``demand`` (thousandths of a request per second), ``seen`` (ms),
    ``reports``: (time, allowed) of this bucket's reports within the last window, oldest first; ``owner``: the
    stream that reports it ("": none now, see ``detach``); ``pm`` and ``pt``: the largest burst and refill of
    this bucket and those it replaced within a window (0: none replaced, see ``holds``)."""

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
    pm: int = 0
    pt: int = 0

    def encode(self) -> str:
        numbers = (self.share, self.m, self.t, self.since, self.reported, self.level, self.carry, self.fresh,
                   self.demand, self.seen, self.pm, self.pt)
        return " ".join(str(n) for n in numbers) + "|" + _encode_reports(self.reports) + "|" + self.owner

    @classmethod
    def decode(cls, text: str) -> Holder:
        head, reports, owner = text.split("|")
        n = [int(x) for x in head.split(" ")]
        pm, pt = (n[10], n[11]) if len(n) > 11 else (0, 0)  # a ledger booked before they were kept
        return cls(n[0], n[1], n[2], n[3], n[4], n[5], n[6], n[7], n[8], n[9], _decode_reports(reports), owner,
                   pm, pt)

    def replacing(self, now: int, window_ms: int) -> bool:
        """Whether this holder's bucket replaced another (or started) so lately that what it books in a window
        ending now or later still changes (``booking``)."""
        return self.pm > 0 and now < self.since + SLACK_MS + window_ms

    def booking(self, x: int, window_ms: int) -> int:
        """What this holder may admit (mt) in a window ending at ``x`` (now or later): its share, or while its
        bucket is replacing another, between the two. A bucket that replaces another in Envoy starts at the old
        one's fill ratio, rounded down (never more tokens), and the old refill ends as the new one starts, as
        early as it is sent and by SLACK_MS after (``since``). Shrinking (``pt``, the old refill, above the new):
        the old burst ``pm``, the new refill and the old one's excess for the part of the window it may still
        have been enforced in, going down. Growing, or a first bucket (started full, ``pt`` 0): the burst ``pm``,
        the old refill and the new one's excess for the part of the window since it was sent, going up to the
        share. A replacement books no retired bucket."""
        if not self.replacing(x, window_ms):
            return self.share * 1000
        if self.pt > self.t:
            rest = min(window_ms, self.since + SLACK_MS + window_ms - x)
            ramp = math.ceil(float(self.pt - self.t) * 1000 * rest / window_ms)  # in doubles, as the Lua
            return max(self.share * 1000, (self.pm + self.t) * 1000 + ramp)
        passed = min(window_ms, x - self.since)
        ramp = math.ceil(float(self.t - self.pt) * 1000 * passed / window_ms)
        return min(self.share * 1000, (self.pm + self.pt) * 1000 + ramp)

    def most(self, now: int, window_ms: int) -> int:
        """The most (mt) ``booking`` gives for a window ending now or later."""
        return self.booking(now, window_ms) if self.pt > self.t else self.share * 1000

    def turns(self, window_ms: int) -> tuple[int, int, int]:
        """When ``booking`` changes course: its ramps start and end."""
        return self.since + SLACK_MS, self.since + window_ms, self.since + SLACK_MS + window_ms


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


def expires_of(text: str, window_ms: int) -> int:
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


def keep_reports(reports: list[tuple[int, int]], now: int, window_ms: int) -> list[tuple[int, int]]:
    """Reports still inside the window; beyond MAX_REPORTS the two oldest become one at the later time (it
    then counts a little longer: never less)."""
    kept = [(at, allowed) for at, allowed in reports if at > now - window_ms]
    while len(kept) > MAX_REPORTS:
        (_, first), (at, second) = kept[0], kept[1]
        kept[0:2] = [(at, min(MAX_COUNT, first + second))]
    return kept
