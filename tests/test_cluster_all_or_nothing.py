"""On Redis Cluster a request whose limits fall in several hash slots is all-or-nothing, as on one Redis: a slot
that admitted is undone when another rejects (backends/redis.py, lua/decide.lua's receipts and undo). Every test
runs on a private cluster (tests/redis_topologies.py) with each limit's key in its own slot (the default)."""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

from slidegate.algorithms import Algorithm
from slidegate.backends.base import BackendUnavailable, Check
from slidegate.backends.redis import RedisBackend, Topology
from slidegate.config import load_directory
from slidegate.failure_modes import FailureMode
from slidegate.keys import limit_key
from slidegate.limiter import Descriptor, Limiter, LimiterOptions, Status
from tests.helpers import decided
from tests.redis_monitor import Monitor
from tests.redis_topologies import Cluster

LOG, COUNTER, BUCKET, FIXED = (Algorithm.SLIDING_WINDOW_LOG, Algorithm.SLIDING_WINDOW_COUNTER,
                               Algorithm.TOKEN_BUCKET, Algorithm.FIXED_WINDOW)
# (algorithm, STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT): a fixed window that counts denied hits keeps them by
# design (envoyproxy/ratelimit's semantics, as on one Redis), so it is tested apart
UNDONE = [(LOG, False), (COUNTER, False), (BUCKET, False), (FIXED, True)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    yield c
    c.cleanup()


Start = Callable[..., tuple[Limiter, RedisBackend]]


@pytest.fixture
def start(cluster: Cluster, write_config: Callable[..., Path]) -> Start:
    """``start(org, user, algorithm, stop_when_over, domain_slot=False, failure_mode=, quota_mode=, key_prefix=)``:
    a limiter whose domain ``o`` has an org limit and a user limit per day (a day: nothing refills or rolls over
    during a test), and its backend, which the test closes."""

    def make(org: int, user: int, algorithm: Algorithm, stop_when_over: bool = False, *, domain_slot: bool = False,
             failure_mode: FailureMode = FailureMode.ERROR, quota_mode: bool = False,
             key_prefix: str = "") -> tuple[Limiter, RedisBackend]:
        config = load_directory(write_config(f"""
            domain: o
            descriptors:
              - key: org
                rate_limit: {{unit: day, requests_per_unit: {org}, algorithm: {algorithm.value}}}
              - key: user
                rate_limit: {{unit: day, requests_per_unit: {user}, algorithm: {algorithm.value}}}
        """))  # the directory's one file: a second limiter of a test replaces it
        backend = RedisBackend(Topology("cluster", cluster.url), timeout=2.0)
        options = LimiterOptions(key_prefix=key_prefix or f"t-{uuid.uuid4().hex[:8]}:", stop_when_over=stop_when_over,
                                 domain_slot=domain_slot, failure_mode=failure_mode, quota_mode=quota_mode)
        return Limiter(lambda: config, backend, options), backend

    return make


def both(org: str, user: str, hits: int | None = None) -> list[Descriptor]:
    return [Descriptor((("org", org),), hits_addend=hits), Descriptor((("user", user),), hits_addend=hits)]


def admitted(statuses: list[Status]) -> bool:
    return not any(s.over for s in statuses)


def key_of(limiter: Limiter, domain: str, key: str, value: str) -> str:
    """The Redis key ``limiter`` counts the descriptor (key, value) of ``domain`` under (Limiter.prepare's)."""
    [check] = limiter.prepare(domain, [Descriptor(((key, value),))]).checks
    return check.key


async def remaining(limiter: Limiter, key: str, value: str) -> int:
    [status] = await limiter.should_rate_limit("o", [Descriptor(((key, value),), hits_addend=0)])
    return status.remaining


def spread(limiter: Limiter, algorithm: Algorithm, users: int) -> None:
    """The org's key and every user's fall in different slots: every request spans two slots."""
    org = key_slot(key_of(limiter, "o", "org", "acme").encode())
    assert all(key_slot(key_of(limiter, "o", "user", f"u{u}").encode()) != org
               for u in range(users))


@pytest.mark.parametrize(("algorithm", "stop_when_over"), UNDONE)
async def test_users_sharing_an_org_limit_each_get_exactly_theirs(
    start: Start, algorithm: Algorithm, stop_when_over: bool
) -> None:
    # 30 users x 7 requests, 5 a user, 150 for the org in another slot: a user's 6th and 7th requests are
    # rejected by the user's limit and must not keep the org's hit (they drained it: 21 users got their 5)
    limiter, backend = start(150, 5, algorithm, stop_when_over)
    spread(limiter, algorithm, 30)
    try:
        got: Counter[int] = Counter()
        for u in range(30):
            for _ in range(7):
                got[u] += admitted(await limiter.should_rate_limit("o", both("acme", f"u{u}")))
        assert got == {u: 5 for u in range(30)}
        assert await remaining(limiter, "org", "acme") == 0
        assert {await remaining(limiter, "user", f"u{u}") for u in range(30)} == {0}
    finally:
        await backend.close()


async def test_fixed_windows_that_count_denied_hits_keep_them_as_on_one_slot(start: Start) -> None:
    # envoyproxy/ratelimit's fixed window counts every hit, admitted or not: across slots as in one slot
    # (REDIS_HASH_TAG=domain), where one script call decides the whole request
    results = []
    for domain_slot in (False, True):
        limiter, backend = start(20, 5, FIXED, domain_slot=domain_slot)
        try:
            got = [admitted(await limiter.should_rate_limit("o", both("acme", f"u{u}")))
                   for u in range(5) for _ in range(7)]
            left = [await remaining(limiter, "org", "acme"), *[await remaining(limiter, "user", f"u{u}")
                                                               for u in range(5)]]
            results.append((got, left))
        finally:
            await backend.close()
    assert results[0] == results[1]
    assert sum(results[0][0]) < 20  # the denied 6th and 7th requests took the org's room, by design


async def test_quota_limits_in_several_slots_reject_only_when_all_are_over(
        cluster: Cluster, write_config: Callable[..., Path]) -> None:
    # envoyproxy/ratelimit's quota mode (src/service/ratelimit.go): each slot sees some of the request's quota
    # limits, so the rule is applied to them all at once, and a rejection undoes what the slots wrote
    def limiter(limit: int) -> Limiter:
        config = load_directory(write_config(f"""
            domain: o
            descriptors:
              - key: org
                rate_limit: {{unit: day, requests_per_unit: {limit}}}
              - key: user
                quota_mode: true
                rate_limit: {{unit: day, requests_per_unit: {limit // 50}}}
              - key: team
                quota_mode: true
                rate_limit: {{unit: day, requests_per_unit: {limit // 25}}}
        """))
        return Limiter(lambda: config, backend, LimiterOptions(key_prefix=prefix))

    backend = RedisBackend(Topology("cluster", cluster.url), timeout=2.0)
    prefix = f"t-{uuid.uuid4().hex[:8]}:"
    slots = {key_slot(limit_key(prefix, LOG.value, "o", [(k, "a")]).encode()) for k in ("org", "user", "team")}
    assert len(slots) == 3
    request = [Descriptor((("org", "a"),)), Descriptor((("user", "a"),)), Descriptor((("team", "a"),))]
    try:
        quota = limiter(100)  # org 100, user 2, team 4 a day
        answers = [[s.over for s in await quota.should_rate_limit("o", request)] for _ in range(5)]
        # the user's limit over from the 3rd: admitted while the team's is not; the 5th: both over, rejected
        assert answers == [[False] * 3, [False] * 3, [False, True, False], [False, True, False], [False, True, True]]
        # the same keys under higher limits: the org counted the 4 admitted requests, not the rejected 5th
        roomy = limiter(5000)
        left = [s.remaining for s in await roomy.should_rate_limit("o", [Descriptor(d.entries, hits_addend=0)
                                                                          for d in request])]
        assert left == [4996, 98, 196]
    finally:
        await backend.close()


@pytest.mark.parametrize(("algorithm", "stop_when_over"), UNDONE)
async def test_concurrent_clients_across_slots_admit_exactly_the_limit(
    start: Start, algorithm: Algorithm, stop_when_over: bool
) -> None:
    # 20 clients of 3 each, 40 for the org: rounds of 100 concurrent requests (5 a client, in a new order each
    # round) until the org is full. A request may briefly hold room another is refused for (sent in the same
    # order every round, the full clients' requests would take the org's last room first every time), but
    # every limit ends counting exactly the requests it admitted, and the org exactly its limit
    limiter, backend = start(40, 3, algorithm, stop_when_over)
    spread(limiter, algorithm, 20)
    order = random.Random(40)
    try:
        got: Counter[int] = Counter()
        for _ in range(30):
            clients = [u for u in range(20) for _ in range(5)]
            order.shuffle(clients)
            answers = await asyncio.gather(*(limiter.should_rate_limit("o", both("acme", f"u{u}")) for u in clients))
            for u, answer in zip(clients, answers, strict=True):
                got[u] += admitted(answer)
            if await remaining(limiter, "org", "acme") == 0:
                break
        assert sum(got.values()) == 40
        assert all(n <= 3 for n in got.values())
        assert [await remaining(limiter, "user", f"u{u}") for u in range(20)] == [3 - got[u] for u in range(20)]
    finally:
        await backend.close()


async def test_hits_given_back_wait_for_the_request_to_be_admitted(start: Start) -> None:
    # a give-back never rejects and cannot be undone exactly: it is applied once every slot has admitted
    limiter, backend = start(10, 1, LOG)
    spread(limiter, LOG, 3)
    try:
        assert admitted(await limiter.should_rate_limit("o", both("acme", "u1", hits=3)[:1]))
        assert admitted(await limiter.should_rate_limit("o", both("acme", "u1")[1:]))  # u1 is full now
        refund = [Descriptor((("org", "acme"),), hits_addend=2, negative=True), Descriptor((("user", "u1"),))]
        [org, user] = await limiter.should_rate_limit("o", refund)
        assert (org.over, org.remaining, user.over) == (False, 7, True)  # as it stood: nothing given back
        assert await remaining(limiter, "org", "acme") == 7
        [org, user] = await limiter.should_rate_limit("o", [refund[0], Descriptor((("user", "u2"),))])
        assert (org.over, org.remaining, user.over) == (False, 9, False)  # admitted: given back
    finally:
        await backend.close()


async def test_a_failed_compensating_call_leaves_the_request_rejected_and_its_hits_counted(
    start: Start, cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    # The org is full; a user's request is admitted by the user's slot and rejected by the org's, and the call
    # that would undo the user's hit is refused by the user's node (its scripts denied in between: the org's node
    # is paused, so its rejection comes well after the user's admission).
    limiter, backend = start(1, 5, LOG)
    spread(limiter, LOG, 100)
    try:
        assert admitted(await limiter.should_rate_limit("o", both("acme", "u0")))
        org_master = cluster.master_of(key_of(limiter, "o", "org", "acme"))
        # a user whose limit another master holds (that one is not paused)
        user_name = next(f"u{u}" for u in range(1, 100)
                         if cluster.master_of(key_of(limiter, "o", "user", f"u{u}")) is not org_master)
        user_key = key_of(limiter, "o", "user", user_name)
        node = cluster.client(cluster.master_of(user_key))
        org_node = cluster.client(org_master)
        with caplog.at_level(logging.WARNING, logger="slidegate"):
            org_node.execute_command("CLIENT", "PAUSE", 1000, "ALL")  # the org's slot answers a second late
            asking = asyncio.create_task(decided(limiter, "o", both("acme", user_name)))
            try:
                # the user's slot admitted (its hit is written): from now its node refuses every script, so the
                # undo that the org's rejection calls for fails
                async with asyncio.timeout(0.9):
                    while not node.exists(user_key):
                        await asyncio.sleep(0.002)
                node.execute_command("ACL", "SETUSER", "default", "-@scripting")
                [org, user], degraded = await asking
                await asyncio.sleep(0)
            finally:
                node.execute_command("ACL", "SETUSER", "default", "+@all")
                org_node.close()
        assert (org.over, user.over, degraded) == (True, False, None)  # rejected, not the failure mode
        assert "a compensating call failed" in caplog.text
        assert await remaining(limiter, "user", user_name) == 4  # conservative: the hit stays counted
    finally:
        node.close()
        await backend.close()


async def test_a_slot_that_rejects_decides_even_when_another_fails(start: Start, cluster: Cluster) -> None:
    # the user's limit (a live slot) says over while the org's node fails: the request is rejected, not handed
    # to the failure mode (allow would have let every user of the org past their own limit)
    limiter, backend = start(100, 1, LOG, failure_mode=FailureMode.ALLOW)
    spread(limiter, LOG, 1)
    org_key = key_of(limiter, "o", "org", "acme")
    node = cluster.client(cluster.master_of(org_key))
    try:
        assert admitted(await limiter.should_rate_limit("o", both("acme", "u0")))
        node.execute_command("ACL", "SETUSER", "default", "-@scripting")  # the org's node fails every script
        try:
            [_org, user], degraded = await decided(limiter, "o", both("acme", "u0"))
        finally:
            node.execute_command("ACL", "SETUSER", "default", "+@all")
        assert (user.over, degraded) == (True, None)
        # and a request no live slot rejects still gets the failure mode when a slot fails
        node.execute_command("ACL", "SETUSER", "default", "-@scripting")
        try:
            [_org, user], degraded = await decided(limiter, "o", both("acme", "u-new"))
        finally:
            node.execute_command("ACL", "SETUSER", "default", "+@all")
        assert (degraded, user.over) == ("allow", False)
        assert await remaining(limiter, "user", "u-new") == 1  # the slot that admitted was undone
    finally:
        node.close()
        await backend.close()


async def test_a_caller_that_stops_waiting_does_not_stop_the_undo(start: Start, cluster: Cluster) -> None:
    # the org is full; the org's node is paused, so the caller (20 ms) gives up while the user's slot has
    # already admitted: when the org's slot rejects at last, the user's hit is taken back all the same
    limiter, backend = start(1, 5, LOG)
    org_master = cluster.master_of(key_of(limiter, "o", "org", "acme"))
    # a user whose limit another master holds (that one is not paused)
    user = next(f"u{u}" for u in range(1, 100)
                if cluster.master_of(key_of(limiter, "o", "user", f"u{u}")) is not org_master)
    node = cluster.client(org_master)
    try:
        assert admitted(await limiter.should_rate_limit("o", both("acme", "u0")))
        node.execute_command("CLIENT", "PAUSE", 300, "WRITE")
        with pytest.raises(BackendUnavailable):
            await limiter.should_rate_limit("o", both("acme", user), timeout=0.02)
        await asyncio.sleep(0.6)  # the pause ends, the org's slot rejects, the user's is undone
        assert await remaining(limiter, "user", user) == 5
        assert await remaining(limiter, "org", "acme") == 0
    finally:
        node.close()
        await backend.close()


def spare_slot(cluster: Cluster, key: str) -> int:
    """A slot of the master serving ``key``, not ``key``'s: taking it away (CLUSTER DELSLOTS) makes that master
    answer CLUSTERDOWN to every command while the cluster goes on."""
    master = cluster.master_of(key)
    with cluster.client(master) as node:
        served = [(a, b) for a, b, owner, *_ in node.execute_command("CLUSTER", "SLOTS") if owner[1] == master.port]
    return next(slot for slot in range(16384)
                if slot != key_slot(key.encode()) and any(a <= slot <= b for a, b in served))


async def test_a_cluster_down_for_a_moment_is_waited_out(start: Start, cluster: Cluster) -> None:
    # while a slot has no master, every node answers CLUSTERDOWN (cluster-require-full-coverage): the command did
    # not run, so it is tried again within the call's time. Here the undo meets it: the org's slot admitted at
    # once, the user's (paused) rejected 0.2 s later, and by then the org's master says CLUSTERDOWN; given up,
    # the undo would have left the rejected request's hit counted on the org
    limiter, backend = start(10, 1, LOG)
    org_key = key_of(limiter, "o", "org", "acme")
    org_master = cluster.master_of(org_key)
    user = next(f"u{u}" for u in range(100)
                if cluster.master_of(key_of(limiter, "o", "user", f"u{u}")) is not org_master)
    org_node = cluster.client(org_master)
    user_node = cluster.client(cluster.master_of(key_of(limiter, "o", "user", user)))
    gone = spare_slot(cluster, org_key)

    def hole() -> None:
        time.sleep(0.05)
        org_node.execute_command("CLUSTER", "DELSLOTS", gone)
        time.sleep(0.3)
        org_node.execute_command("CLUSTER", "ADDSLOTS", gone)

    try:
        assert admitted(await limiter.should_rate_limit("o", both("acme", user)))  # the user's one
        user_node.execute_command("CLIENT", "PAUSE", 200, "WRITE")
        holing = asyncio.create_task(asyncio.to_thread(hole))
        [org, user_status], degraded = await decided(limiter, "o", both("acme", user), timeout=2.0)
        await holing
        assert (org.over, user_status.over, degraded) == (False, True, None)
        assert await remaining(limiter, "org", "acme") == 9  # the rejected request's org hit was taken back
    finally:
        org_node.close()
        user_node.close()
        await backend.close()


async def test_a_slot_call_kept_back_past_the_callers_time_is_never_sent(start: Start, cluster: Cluster) -> None:
    # CLUSTERDOWN for longer than the caller waits: its slot calls are given up (they never ran), not sent once
    # the cluster is back, which would count hits for a request answered with an error long before
    limiter, backend = start(10, 10, LOG)
    org_key = key_of(limiter, "o", "org", "acme")
    org_node = cluster.client(cluster.master_of(org_key))
    gone = spare_slot(cluster, org_key)
    try:
        org_node.execute_command("CLUSTER", "DELSLOTS", gone)
        try:
            for u in range(5):
                with pytest.raises(BackendUnavailable):
                    await limiter.should_rate_limit("o", both("acme", f"v{u}"), timeout=0.1)
            await asyncio.sleep(0.3)
        finally:
            org_node.execute_command("CLUSTER", "ADDSLOTS", gone)
        await asyncio.sleep(0.5)  # the cluster is whole again
        assert await remaining(limiter, "org", "acme") == 10
        assert {await remaining(limiter, "user", f"v{u}") for u in range(5)} == {10}
    finally:
        org_node.close()
        await backend.close()


def test_the_single_redis_path_sends_no_receipts(redis_url: str, key_prefix: str) -> None:
    # receipts cost nothing where no request is undone: one Redis gets the plain call and the plain reply
    async def run() -> None:
        backend = RedisBackend(redis_url)
        try:
            await backend.decide([Check(f"{key_prefix}a", 3, 10_000_000, 1), Check(f"{key_prefix}b", 3, 10_000_000, 1)])
        finally:
            await backend.close()

    with Monitor(redis_url) as seen:
        asyncio.run(run())
        sent = [c for c in seen.commands() if c[0].upper() in ("EVALSHA", "EVAL") and f"{key_prefix}a" in c]
    # one call; a NOSCRIPT (a Redis that never saw the script) sends it again as EVAL
    assert 1 <= len(sent) <= 2 and all(c[2:] == sent[0][2:] for c in sent), sent
    command = sent[-1]
    # EVALSHA (or EVAL), the script, 2 keys, the keys, the clock, one request of n = 2 limits (not -2 and a
    # hold lifetime); the reply has three values a limit: the same call, made again here on keys of its own
    assert command[5:8] == ["", "1", "2"]
    client = redis.Redis.from_url(redis_url)
    try:
        again = [*command[:3], f"{key_prefix}c", f"{key_prefix}d", *command[5:]]
        reply = client.execute_command(*again)
    finally:
        client.close()
    assert reply == [1, 0, 2, 10_000_000, 0, 2, 10_000_000]
