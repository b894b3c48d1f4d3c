"""Undoing one slot's share of a request (lua/decide.lua's receipts and undo), algorithm by algorithm, against a
real Redis: an undo must take back exactly what that request wrote, whatever other requests did in between,
and never more. The cluster path that sends these calls is tested in test_cluster_all_or_nothing.py."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from fractions import Fraction

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slidegate.algorithms import Algorithm
from slidegate.backends.base import Check

S = 1_000_000
T0 = 1_700_000_000 * S  # a window boundary for windows of 10 s
HOLD = 60 * S  # how long a bucket's hold waits for its undo
LOG, COUNTER, BUCKET, FIXED = (Algorithm.SLIDING_WINDOW_LOG, Algorithm.SLIDING_WINDOW_COUNTER,
                               Algorithm.TOKEN_BUCKET, Algorithm.FIXED_WINDOW)
Receipt = tuple[int, int]


class Script:
    """lua/decide.lua called as RedisBackend calls it, at injected times, through ``function`` (conftest's
    keep_alive: the script, then every key it names kept alive, so that no key expires on real time while the
    test's clock stands still)."""

    def __init__(self, client: redis.Redis, function: str) -> None:
        self.client = client
        self.function = function

    def decide(self, at: float, checks: list[Check], *, undoable: bool = True) -> tuple[bool, list[Receipt | None]]:
        """Decide ``checks`` at ``at`` seconds after T0; with ``undoable``, the receipt of each check."""
        args: list[str | int] = [T0 + round(at * S), 1]
        args += [-len(checks), HOLD] if undoable else [len(checks)]
        for c in checks:
            args += (c.algorithm.value, *c.params(), c.clamped_hits(), int(c.shadow))
        reply = self.client.fcall(self.function, len(checks), *(c.key for c in checks), *args)
        width = 7 if undoable else 3
        receipts: list[Receipt | None] = []
        for i in range(1, 1 + width * len(checks), width):
            receipts.append((reply[i + 5], reply[i + 6]) if undoable and reply[i + 5] >= 0 else None)
        return bool(reply[0]), receipts

    def undo(self, at: float, items: list[tuple[Check, Receipt | None]]) -> list[int]:
        args: list[str | int] = [T0 + round(at * S), "undo", len(items)]
        for c, receipt in items:
            assert receipt is not None
            args += (c.algorithm.value, *c.params(), *receipt)
        return list(self.client.fcall(self.function, len(items), *(c.key for c, _ in items), *args))

    def remaining(self, at: float, check: Check) -> tuple[int, int]:
        """(remaining, reset) of ``check``'s limit at ``at``, counting nothing."""
        reply = self.client.fcall(self.function, 1, check.key, T0 + round(at * S), 1, 1, check.algorithm.value,
                                  *check.params(), 0, 0)
        return reply[2], reply[3]


@pytest.fixture
def script(redis_url: str, keep_alive: str) -> Iterator[Script]:
    client = redis.Redis.from_url(redis_url)
    yield Script(client, keep_alive)
    client.close()


def limit(key: str, algorithm: Algorithm, hits: int = 1, *, n: int = 3, window: int = 10 * S,
          stop_when_over: bool = False) -> Check:
    return Check(key, n, window, hits, algorithm, stop_when_over=stop_when_over)


@pytest.mark.parametrize("algorithm", [LOG, COUNTER, BUCKET])
def test_an_undo_takes_back_exactly_that_request(script: Script, key_prefix: str, algorithm: Algorithm) -> None:
    key = f"{key_prefix}one"
    assert script.decide(1.0, [limit(key, algorithm, 2)], undoable=False)[0]
    admitted, [receipt] = script.decide(1.0, [limit(key, algorithm, 1)])
    assert admitted and receipt is not None
    assert script.remaining(1.0, limit(key, algorithm))[0] == 0
    assert script.undo(1.0, [(limit(key, algorithm), receipt)]) == [1]
    assert script.remaining(1.0, limit(key, algorithm))[0] == 1
    if algorithm is not COUNTER:  # a count cannot tell whose hits it holds: the backend sends an undo once
        assert script.undo(1.0, [(limit(key, algorithm), receipt)]) == [0]
        assert script.remaining(1.0, limit(key, algorithm))[0] == 1


def test_nothing_to_undo_for_check_only_or_denied_hits_that_count(script: Script, key_prefix: str) -> None:
    # a fixed window that counts denied hits keeps them when another limit rejects (envoyproxy/ratelimit's
    # semantics, as on one Redis): its receipt names nothing
    counted = limit(f"{key_prefix}fw", FIXED)
    assert script.decide(1.0, [counted, limit(f"{key_prefix}check", LOG, 0)]) == (True, [None, None])
    stopping = limit(f"{key_prefix}fw-stop", FIXED, stop_when_over=True)
    admitted, [receipt] = script.decide(1.0, [stopping])
    assert admitted and receipt == (T0 // (10 * S), 1)  # the window its hit went to, and the hit


def test_log_undo_removes_its_own_entry_not_the_newest(script: Script, key_prefix: str) -> None:
    # Giving back "the newest hits" would remove a later request's entry and keep ours, which leaves the window
    # earlier: 5 s too early here, when the limit would admit a third hit while two still count.
    key = f"{key_prefix}log"
    _, [ours] = script.decide(0.0, [limit(key, LOG, 1)])
    assert script.decide(5.0, [limit(key, LOG, 2)], undoable=False)[0]
    assert script.undo(6.0, [(limit(key, LOG), ours)]) == [1]
    assert script.remaining(6.0, limit(key, LOG)) == (1, 9 * S)  # the 2 hits at 5 s, leaving at 15 s
    assert not script.decide(12.0, [limit(key, LOG, 2)], undoable=False)[0]
    assert script.decide(15.0, [limit(key, LOG, 3)], undoable=False)[0]


def test_log_undo_counts_later_entries_down(script: Script, key_prefix: str) -> None:
    # members are named by running counts: those after the undone one, and "#", must count its hits no more
    key = f"{key_prefix}counts"
    n = 10
    assert script.decide(0.0, [limit(key, LOG, 1, n=n)], undoable=False)[0]
    _, [ours] = script.decide(1.0, [limit(key, LOG, 3, n=n)])
    for at, hits in [(2.0, 2), (3.0, 1), (4.0, 3)]:
        assert script.decide(at, [limit(key, LOG, hits, n=n)], undoable=False)[0]
    assert script.undo(4.5, [(limit(key, LOG, n=n), ours)]) == [1]
    # 7 hits count, in four entries that leave one by one
    expected = [(4.5, 3), (10.0, 4), (12.0, 6), (13.0, 7), (14.0, 10)]
    assert [script.remaining(at, limit(key, LOG, n=n))[0] for at, _ in expected] == [free for _, free in expected]


def test_log_times_are_never_used_twice(script: Script, key_prefix: str) -> None:
    # An entry given back by another request must not leave its time to a new entry: an undo naming that time
    # would remove the newcomer's hits.
    key = f"{key_prefix}reuse"
    _, [ours] = script.decide(1.0, [limit(key, LOG, 1)])
    assert script.decide(1.0, [limit(key, LOG, -1)], undoable=False)[0]  # ours goes: the newest
    assert script.decide(1.0, [limit(key, LOG, 1)], undoable=False)[0]  # same microsecond
    assert script.undo(1.0, [(limit(key, LOG), ours)]) == [0]
    assert script.remaining(1.0, limit(key, LOG))[0] == 2


def test_log_undo_of_an_entry_gone_from_the_window_does_nothing(script: Script, key_prefix: str) -> None:
    key = f"{key_prefix}gone"
    _, [ours] = script.decide(0.0, [limit(key, LOG, 2)])
    assert script.decide(9.0, [limit(key, LOG, 1)], undoable=False)[0]
    assert script.undo(10.5, [(limit(key, LOG), ours)]) == [0]
    assert script.remaining(10.5, limit(key, LOG))[0] == 2


@pytest.mark.parametrize("algorithm", [COUNTER, FIXED])
def test_window_undo_goes_to_the_window_the_hits_went_to(script: Script, key_prefix: str, algorithm: Algorithm) -> None:
    key = f"{key_prefix}win"
    check = limit(key, algorithm, 2, stop_when_over=True)  # a fixed window that counts denied hits undoes nothing
    _, [ours] = script.decide(9.0, [check])
    assert script.decide(9.5, [limit(key, algorithm, 1, stop_when_over=True)], undoable=False)[0]
    if algorithm is COUNTER:
        # the next window: ours are the older window's hits, weighing 3 x 0.8 at 12 s; taken back from there
        assert script.undo(12.0, [(check, ours)]) == [1]
        assert script.remaining(12.0, check)[0] == 2  # 3 - 1 x 0.8
    else:
        assert script.undo(9.9, [(check, ours)]) == [1]
        assert script.remaining(9.9, check)[0] == 2
    _, [late] = script.decide(15.0, [check])
    assert script.undo(35.0, [(check, late)]) == [0]  # its window is gone: nothing left to undo


def test_bucket_undo_after_a_refill_to_the_brim_gives_back_what_the_bucket_would_hold(
        script: Script, key_prefix: str) -> None:
    # 10 tokens, 1 a second: ours takes 5, the bucket refills to 10, another takes 3. Without ours it would hold
    # 7 (its refill capped at the brim), not 10 as adding 5 back would say.
    key = f"{key_prefix}brim"
    bucket = limit(key, BUCKET, 5, n=10, window=10 * S)
    _, [ours] = script.decide(0.0, [bucket])
    assert script.remaining(5.0, bucket)[0] == 10
    assert script.decide(5.0, [limit(key, BUCKET, 3, n=10)], undoable=False)[0]
    assert script.undo(5.0, [(bucket, ours)]) == [1]
    assert script.remaining(5.0, bucket) == (7, 3 * S)
    # half way: 2.5 of ours would have been capped away, 2.5 come back
    _, [ours] = script.decide(10.0, [limit(key, BUCKET, 5, n=10)])
    assert script.remaining(12.5, bucket)[0] == 7  # 5 + 2.5
    assert script.undo(12.5, [(bucket, ours)]) == [1]
    assert script.remaining(12.5, bucket) == (10, 0)


def test_bucket_hold_is_confirmed_at_its_expiry(script: Script, key_prefix: str) -> None:
    key = f"{key_prefix}expiry"
    bucket = limit(key, BUCKET, 2, n=10, window=1000 * S)
    _, [ours] = script.decide(0.0, [bucket])
    assert script.remaining(4.0, bucket)[0] == 8
    assert script.undo(HOLD / S, [(bucket, ours)]) == [0]  # too late: the request was admitted, or never undone
    assert script.remaining(HOLD / S, bucket)[0] == 8
    assert script.client.hkeys(key) == [b"t", b"u", b"p"]  # no trace of the hold left


def test_bucket_holds_of_several_requests(script: Script, key_prefix: str) -> None:
    key = f"{key_prefix}several"
    bucket = limit(key, BUCKET, 1, n=10, window=10 * S)
    receipts = [script.decide(0.0, [limit(key, BUCKET, k, n=10)])[1][0] for k in (1, 2, 3)]
    assert script.remaining(0.0, bucket)[0] == 4
    assert script.undo(0.0, [(bucket, receipts[1])]) == [1]
    assert script.remaining(0.0, bucket)[0] == 6
    assert script.undo(0.0, [(bucket, receipts[0]), (bucket, receipts[2])]) == [1, 1]
    assert script.remaining(0.0, bucket) == (10, 0)
    assert script.client.exists(key) == 0  # full and no hold left: no key


def test_bucket_holds_are_dropped_when_an_earlier_version_wrote_the_bucket(script: Script, key_prefix: str) -> None:
    # during a rolling upgrade a version without holds may take tokens from a bucket that holds some: it
    # rewrites the level and keeps the hold fields it does not know, whose room no longer fits that level
    key = f"{key_prefix}upgrade"
    bucket = limit(key, BUCKET, 4, n=10, window=10 * S)
    _, [ours] = script.decide(0.0, [bucket])
    script.client.hset(key, mapping={"t": 1 * S, "u": T0, "p": S})  # 1 token left, as an earlier version writes
    assert script.undo(0.0, [(bucket, ours)]) == [0]
    assert script.remaining(0.0, bucket)[0] == 1
    assert sorted(script.client.hkeys(key)) == [b"p", b"t", b"u"]


def test_a_bucket_undo_never_takes_back_another_requests_hold(script: Script, key_prefix: str) -> None:
    # holds dropped by an earlier version's write let hold ids start again: the next hold takes the same id,
    # and an undo still on its way for the dropped one must not give back the new request's tokens
    key = f"{key_prefix}reused"
    bucket = limit(key, BUCKET, 4, n=10, window=1000 * S)
    _, [dropped] = script.decide(0.0, [bucket])
    # an earlier version took a token: it writes the level and knows no holds, so they are dropped
    script.client.hset(key, mapping={"t": 5 * 100 * S, "u": T0, "p": 100 * S})
    _, [ours] = script.decide(1.0, [bucket])
    assert dropped is not None and ours is not None and dropped[0] == ours[0]  # the same id, another hold
    assert script.undo(2.0, [(bucket, dropped)]) == [0]
    assert script.remaining(2.0, bucket)[0] == 1
    assert script.undo(2.0, [(bucket, ours)]) == [1]
    assert script.remaining(2.0, bucket)[0] == 5


# --- the bucket's holds against an exact replay -----------------------------------------------------------

@dataclass
class Replay:
    """The truth: a bucket replayed from its history without the holds that were undone (in Fractions)."""

    burst: int
    rate: Fraction  # tokens per microsecond
    events: list[tuple[int, int, int | None]] = field(default_factory=list)  # (time, tokens taken, hold id)
    undone: set[int] = field(default_factory=set)

    def level(self, now: int) -> Fraction:
        level, then = Fraction(self.burst), self.events[0][0] if self.events else now
        for at, tokens, hold in [*self.events, (now, 0, None)]:
            level = min(Fraction(self.burst), level + (at - then) * self.rate)
            then = at
            if hold not in self.undone:
                level = min(Fraction(self.burst), level - tokens)
        return level


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_bucket_undo_never_gives_back_too_much_and_is_exact_for_one_hold(
    script: Script, key_prefix: str, data: st.DataObject
) -> None:
    """Random takes, give-backs, holds and undos at random times: the bucket never holds more whole tokens than
    its exact replay, and exactly as many (with the same time to fill) while at most one hold was ever out at
    once."""
    burst, per = data.draw(st.sampled_from([(10, 10 * S), (3, 7 * S), (5, S), (1_000, 3 * S)]))
    rate = Fraction(burst, per)
    key = f"{key_prefix}replay-{uuid.uuid4().hex}"  # each example its own bucket
    truth = Replay(burst, rate)
    out: dict[int, tuple[Receipt, int]] = {}  # hold id -> its receipt and expiry
    overlapped = False
    now = 0
    for step in range(data.draw(st.integers(1, 25))):
        now += data.draw(st.sampled_from([0, 1, 1_000, 400_000, S, 3 * S, 8 * S]))
        kind = data.draw(st.sampled_from(["take", "give", "hold", "hold", "undo", "undo"]))
        tokens = data.draw(st.sampled_from([1, 2, 3, burst // 2 or 1]))
        at = now / S
        if kind == "undo" and out:
            hold = data.draw(st.sampled_from(sorted(out)))
            held, expiry = out.pop(hold)
            script.undo(at, [(limit(key, BUCKET, n=burst, window=per), held)])
            if now < expiry:
                truth.undone.add(hold)
        elif kind in ("take", "hold"):
            admitted, [receipt] = script.decide(at, [limit(key, BUCKET, tokens, n=burst, window=per)],
                                                undoable=kind == "hold")
            if admitted:
                truth.events.append((now, tokens, step if kind == "hold" else None))
                if kind == "hold":
                    assert receipt is not None
                    overlapped = overlapped or any(now < expiry for _, expiry in out.values())
                    out[step] = (receipt, now + HOLD)
        elif kind == "give":
            assert script.decide(at, [limit(key, BUCKET, -tokens, n=burst, window=per)], undoable=False)[0]
            truth.events.append((now, -tokens, None))
        remaining, reset = script.remaining(at, limit(key, BUCKET, n=burst, window=per))
        exact = truth.level(now)
        assert remaining <= exact  # never a token the bucket without the undone holds would not have
        if not overlapped:
            full = 0 if exact >= burst else -(-(burst - exact) // rate)
            assert (remaining, reset) == (int(exact), full)
