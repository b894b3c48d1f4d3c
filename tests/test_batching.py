"""Natural batching (slidegate.backends.batching) and the Redis backend's own connections under it."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio

from slidegate.algorithms import Algorithm
from slidegate.backends.base import BackendUnavailable, Check, Checks
from slidegate.backends.batching import Batcher, Flight
from slidegate.backends.deadlines import COMPACT_AT, GRANULARITY, Deadlines
from slidegate.backends.permits import Permits
from slidegate.backends.redis import RedisBackend
from slidegate.backends.redis_connections import Connections
from slidegate.backends.script_codec import Request, decide_args, pack, read_answers
from slidegate.backends.silence import Silence
from slidegate.backends.taskless import Resend, TasklessCalls
from slidegate.config import load_directory
from slidegate.limiter import Descriptor, Limiter, LimiterOptions
from slidegate.resources import lua_script
from tests.redis_servers import RedisServer


class Recorder:
    """A ``send`` that records each batch and answers ``item * 10`` once ``release`` is set."""

    def __init__(self, fail: bool = False) -> None:
        self.batches: list[list[int]] = []
        self.release = asyncio.Event()
        self.fail = fail

    async def send(self, items: list[int]) -> list[int]:
        self.batches.append(list(items))
        await self.release.wait()
        if self.fail:
            raise ConnectionError("storage gone")
        return [i * 10 for i in items]


async def test_an_idle_batcher_sends_at_once_and_alone() -> None:
    recorder = Recorder()
    recorder.release.set()
    batcher = Batcher(recorder.send)
    assert [await batcher.submit(i) for i in range(3)] == [0, 10, 20]
    assert recorder.batches == [[0], [1], [2]]


async def test_calls_arriving_while_batches_are_out_leave_together_in_order() -> None:
    recorder = Recorder()
    batcher = Batcher(recorder.send, max_in_flight=2)
    calls = [asyncio.create_task(batcher.submit(i)) for i in range(7)]
    await asyncio.sleep(0.01)
    assert recorder.batches == [[0], [1]]  # two out; the rest wait for one of them
    recorder.release.set()
    assert await asyncio.gather(*calls) == [i * 10 for i in range(7)]
    assert recorder.batches == [[0], [1], [2, 3, 4, 5, 6]]


async def test_a_failed_batch_fails_each_of_its_callers() -> None:
    recorder = Recorder(fail=True)
    batcher = Batcher(recorder.send, max_in_flight=1)
    calls = [asyncio.create_task(batcher.submit(i)) for i in range(4)]
    await asyncio.sleep(0.01)
    recorder.release.set()
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in results)
    assert recorder.batches == [[0], [1, 2, 3]]


async def test_a_caller_gone_before_its_batch_leaves_is_not_sent() -> None:
    recorder = Recorder()
    batcher = Batcher(recorder.send, max_in_flight=1)
    first = asyncio.create_task(batcher.submit(1))
    gone = asyncio.create_task(batcher.submit(2))
    kept = asyncio.create_task(batcher.submit(3))
    await asyncio.sleep(0.01)
    gone.cancel()
    recorder.release.set()
    assert (await first, await kept) == (10, 30)
    assert recorder.batches == [[1], [3]]


async def test_a_settling_caller_waits_for_the_batch_it_went_in_but_not_to_be_sent() -> None:
    """No counterpart in envoyproxy/ratelimit (src/redis/driver_impl.go's pipelines have no undo to settle)."""
    # settle (a part of a request that may have to be undone): its time bounds the wait to be sent; once sent, the
    # answer is what it needs, however late, since what it wrote is undone from it
    recorder = Recorder()
    batcher = Batcher(recorder.send, max_in_flight=1)
    sent = asyncio.create_task(batcher.submit(1, 0.02, settle=True))
    unsent = asyncio.create_task(batcher.submit(2, 0.02, settle=True))
    plain = asyncio.create_task(batcher.submit(3, 0.02))
    await asyncio.sleep(0.05)
    assert unsent.done() and isinstance(unsent.exception(), TimeoutError)  # never sent
    assert plain.done() and isinstance(plain.exception(), TimeoutError)
    assert not sent.done()  # sent: it waits for its batch's answer
    recorder.release.set()
    assert await sent == 10
    assert recorder.batches == [[1]]


async def test_a_batch_that_left_runs_to_the_end_and_holds_its_place() -> None:
    # a caller giving up (Envoy's deadline) must not cut its batch short: the batch keeps its place in flight
    # until Redis answers, so a slow Redis never has more than max_in_flight batches queued by one service
    recorder = Recorder()
    batcher = Batcher(recorder.send, max_in_flight=1)
    lone = asyncio.create_task(batcher.submit(1))
    await asyncio.sleep(0.01)
    waiting = asyncio.create_task(batcher.submit(2))
    await asyncio.sleep(0.01)
    lone.cancel()
    await asyncio.sleep(0.01)
    assert recorder.batches == [[1]]  # the waiting call still waits for the place
    recorder.release.set()
    assert await asyncio.wait_for(waiting, 1) == 20
    assert recorder.batches == [[1], [2]]


@pytest.mark.redis  # a redis-server of its own
async def test_a_call_cut_off_mid_reply_never_hands_its_reply_to_the_next() -> None:
    # Redis is held busy past the backend's timeout, so the script call is cut off with its reply still on
    # the way; the connection must not be reused in that state (redis-py closes it on a cut-off read, and
    # the backend on anything else), or the next call would read that reply as its own
    server = RedisServer().start()
    backend = RedisBackend(server.url, timeout=0.1)
    busy = redis.Redis(port=server.port)
    try:
        first = Check("first", 5, 60_000_000, 1)
        assert (await backend.decide([first])).outcomes[0].remaining == 4
        sleep = asyncio.get_running_loop().run_in_executor(None, busy.execute_command, "DEBUG", "SLEEP", "0.3")
        await asyncio.sleep(0.05)
        with pytest.raises(BackendUnavailable):
            await backend.decide([first])
        await sleep
        await asyncio.sleep(0.05)  # the cut-off call's reply, if it ran, has come back by now
        for expected in (93, 86):
            [outcome] = (await backend.decide([Check("other", 100, 60_000_000, 7)])).outcomes
            assert outcome.remaining == expected
    finally:
        busy.close()
        await backend.close()
        server.stop()


@pytest.mark.redis  # a redis-server of its own
async def test_a_closed_backend_keeps_no_connection_open() -> None:
    server = RedisServer().start()
    backend = RedisBackend(server.url, timeout=1)
    watcher = redis.Redis(port=server.port)
    try:
        def clients() -> int:
            return len(watcher.client_list()) - 1  # less the watcher itself

        calls = [backend.decide([Check(f"k{i}", 100, 60_000_000, 1)]) for i in range(20)]
        racing = asyncio.gather(*calls)  # some of them still at Redis when the backend closes
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        await backend.close()
        await racing
        await asyncio.sleep(0.05)
        assert clients() == 0
    finally:
        watcher.close()
        server.stop()


@pytest.mark.redis  # a redis-server of its own
async def test_connections_redis_closed_while_idle_are_not_used() -> None:
    # After a Redis restart the idle connections are dead; the first call after it must not fail on one.
    server = RedisServer().start()
    backend = RedisBackend(server.url, timeout=1)
    try:
        # two batches in flight at once leave two idle connections behind
        await asyncio.gather(*(backend.decide([Check(f"k{i}", 100, 60_000_000, 1)]) for i in range(10)))
        server.stop()
        server.start()
        await asyncio.sleep(0.05)  # the end of file reaches the idle connections
        for _ in range(3):
            [outcome] = (await backend.decide([Check("after", 100, 60_000_000, 1)])).outcomes
        assert outcome.remaining == 97
    finally:
        await backend.close()
        server.stop()


async def test_deadlines_run_when_due_in_order_and_never_early() -> None:
    loop = asyncio.get_running_loop()
    deadlines = Deadlines()
    ran: list[tuple[str, float]] = []
    start = loop.time()

    def record(name: str, after: float) -> Callable[[], None]:
        return lambda: ran.append((name, loop.time() - start - after))

    for name, after in (("late", 0.06), ("early", 0.02), ("middle", 0.04), ("early-too", 0.02)):
        deadlines.add(loop, start + after, record(name, after), lambda: False)
    await asyncio.sleep(0.03)
    assert [name for name, _ in ran] == ["early", "early-too"]  # an earlier deadline added later re-arms
    await asyncio.sleep(0.05)
    assert [name for name, _ in ran] == ["early", "early-too", "middle", "late"]
    assert all(0 <= late < GRANULARITY + 0.01 for _, late in ran), ran


async def test_a_callers_deadline_ends_its_wait_and_not_its_batch() -> None:
    recorder = Recorder()
    batcher = Batcher(recorder.send, max_in_flight=1)
    loop = asyncio.get_running_loop()
    with pytest.raises(TimeoutError):
        await batcher.submit(0, -1)  # already past: not even queued
    started = loop.time()
    out = asyncio.create_task(batcher.submit(1, 0.02))
    waiting = asyncio.create_task(batcher.submit(2, 0.02))
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(out, 2)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(waiting, 2)
    assert loop.time() - started < 1  # ended by their deadline, not by wait_for's
    assert recorder.batches == [[1]]  # the batch that left still holds its place; the expired caller never left
    recorder.release.set()
    assert await batcher.submit(3, 1) == 30
    assert recorder.batches == [[1], [3]]


async def test_a_batch_past_its_timeout_is_cut_off_and_frees_its_place() -> None:
    recorder = Recorder()  # never released: a Redis that stopped answering
    batcher = Batcher(recorder.send, max_in_flight=1, batch_timeout=0.05)
    stuck = asyncio.create_task(batcher.submit(1))
    queued = asyncio.create_task(batcher.submit(2))
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(stuck, 1)
    assert recorder.batches == [[1], [2]]  # its place went to the next batch
    recorder.release.set()
    assert await asyncio.wait_for(queued, 1) == 20


def test_deadlines_survive_a_change_of_event_loop() -> None:
    # a backend used from one asyncio.run and then another: the first loop's armed timer never fires
    deadlines = Deadlines()
    fired: list[str] = []

    async def one(name: str, after: float, wait: float) -> None:
        loop = asyncio.get_running_loop()
        deadlines.add(loop, loop.time() + after, lambda: fired.append(name), lambda: False)
        await asyncio.sleep(wait)

    asyncio.run(one("first", 0.5, 0))  # its timer, armed in a loop that is gone, never fires
    asyncio.run(one("second", 0.6, 0.7))  # later than that timer: it needs one of its own
    assert fired == ["second"]


async def test_a_failing_deadline_callback_does_not_stop_the_others() -> None:
    loop = asyncio.get_running_loop()
    errors: list[object] = []
    loop.set_exception_handler(lambda _, context: errors.append(context["exception"]))
    deadlines = Deadlines()
    fired: list[str] = []

    def fail() -> None:
        raise RuntimeError("boom")

    deadlines.add(loop, loop.time() + 0.01, fail, lambda: False)
    deadlines.add(loop, loop.time() + 0.01, lambda: fired.append("after"), lambda: False)
    deadlines.add(loop, loop.time() + 0.05, lambda: fired.append("later"), lambda: False)
    await asyncio.sleep(0.1)
    assert fired == ["after", "later"] and len(errors) == 1


async def test_finished_calls_do_not_pile_up_under_long_deadlines() -> None:
    # REDIS_TIMEOUT may be up to 60 s: the entries of calls long finished must not be kept that long
    loop = asyncio.get_running_loop()
    deadlines = Deadlines()
    finished = loop.create_future()
    finished.set_result(None)
    live = loop.create_future()
    deadlines.add(loop, loop.time() + 60, lambda: live.set_result("expired"), live.done)
    for _ in range(5 * COMPACT_AT):
        deadlines.add(loop, loop.time() + 60, lambda: None, finished.done)
    assert len(deadlines) <= COMPACT_AT
    deadlines.add(loop, loop.time() + 0.01, lambda: None, finished.done)
    deadlines.add(loop, loop.time() + 0.02, lambda: live.set_result("due"), live.done)
    assert await asyncio.wait_for(live, 1) == "due"


def test_a_backend_used_from_one_event_loop_then_another(redis_url: str, key_prefix: str) -> None:
    # the in-process modes may run calls on several loops: connections and deadlines of a loop that is gone
    # must not be used (a bare RuntimeError, or deadlines that never fire)
    backend = RedisBackend(redis_url, timeout=1)

    async def one() -> int:
        [outcome] = (await backend.decide([Check(f"{key_prefix}loops", 100, 60_000_000, 1)])).outcomes
        return outcome.remaining

    assert [asyncio.run(one()) for _ in range(3)] == [99, 98, 97]
    asyncio.run(backend.close())


def connections_made(server: RedisServer) -> int:
    """How many connections ``server`` has accepted so far (INFO stats), this one's own included."""
    with redis.Redis.from_url(server.url) as admin:
        return int(admin.info("stats")["total_connections_received"])


async def test_a_live_idle_connection_is_seen_as_open(private_redis: RedisServer) -> None:
    # were the check wrong, every call would quietly reconnect
    backend = RedisBackend(private_redis.url, timeout=1)
    try:
        await backend.decide([Check("open", 100, 60_000_000, 1)])
        made = connections_made(private_redis)
        for _ in range(3):
            await backend.decide([Check("open", 100, 60_000_000, 1)])
        assert connections_made(private_redis) == made + 1  # only the count's own
    finally:
        await backend.close()


async def test_a_settled_item_that_waited_to_be_sent_is_not_given_up_once_sent() -> None:
    # its time bounds only the wait to be sent (an item sent at once has no deadline of its own at all)
    async def send(items: list[int]) -> list[int]:
        await asyncio.sleep(0.02 if items == [1] else 0.1)
        return [i * 10 for i in items]

    batcher: Batcher[int, int] = Batcher(send, max_in_flight=1)
    first = asyncio.create_task(batcher.submit(1))
    await asyncio.sleep(0)
    assert await batcher.submit(2, 0.05, settle=True) == 20  # sent at 20 ms, answered at 120 ms
    assert await first == 10


async def test_an_item_sent_at_once_still_times_out_with_its_batch() -> None:
    # sent at once, an item's deadline is its batch's: it has none of its own, and the batch's cut-off answers it
    release = asyncio.Event()

    async def send(items: list[int]) -> list[int]:
        await release.wait()
        return items

    cut_off: list[bool] = []
    batcher: Batcher[int, int] = Batcher(send, batch_timeout=0.03, on_cut_off=lambda: cut_off.append(True))
    with pytest.raises(TimeoutError):
        await batcher.submit(1, 0.03, grace=True)
    assert cut_off == [True]
    # a caller in a hurry keeps its own, sooner deadline
    hurried: Batcher[int, int] = Batcher(send, batch_timeout=0.5)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await hurried.submit(2, 0.01)
    assert time.monotonic() - started < 0.25
    release.set()


async def test_a_batch_carries_at_most_its_weight_and_a_heavy_item_goes_alone() -> None:
    # a few requests of a thousand limits must not make everyone's round trip outlast REDIS_TIMEOUT
    recorder = Recorder()
    batcher = Batcher(recorder.send, max_in_flight=1, weight=lambda item: item, max_weight=10)
    calls = [asyncio.create_task(batcher.submit(i)) for i in (1, 4, 5, 3, 20, 2)]
    await asyncio.sleep(0.01)
    recorder.release.set()
    assert await asyncio.gather(*calls) == [10, 40, 50, 30, 200, 20]
    # the heavy one takes the first free place; the light ones go in batches of 10 at most
    assert recorder.batches == [[1], [20], [4, 5], [3, 2]]


async def test_light_items_always_have_a_place_of_their_own() -> None:
    # two heavy requests in flight had every caller behind them late (Envoy's 20 ms)
    heavy = Recorder()
    light: list[list[int]] = []

    async def send(items: list[int]) -> list[int]:
        if items[0] > 10:
            return await heavy.send(items)
        light.append(items)
        return [i * 10 for i in items]

    batcher = Batcher(send, max_in_flight=2, weight=lambda item: item, max_weight=10)
    slow = [asyncio.create_task(batcher.submit(i)) for i in (20, 30)]
    await asyncio.sleep(0.01)
    assert heavy.batches == [[20]]  # one heavy batch out, the other waits
    assert [await batcher.submit(i) for i in (1, 2, 3)] == [10, 20, 30]  # through the other place, one by one
    assert light == [[1], [2], [3]]
    heavy.release.set()
    assert await asyncio.gather(*slow) == [200, 300]
    assert heavy.batches == [[20], [30]]


async def test_the_first_ping_makes_the_first_call_quick(private_redis: RedisServer) -> None:
    # the script loaded and the batches' two connections opened before the service says it is serving: the
    # first call to a cold service took 19-23 ms, past Envoy's default deadline of 20 ms
    backend = RedisBackend(private_redis.url)
    sha = hashlib.sha1(lua_script([a.value for a in Algorithm]).encode()).hexdigest()
    with redis.Redis.from_url(private_redis.url) as admin:
        assert admin.script_exists(sha) == [False]
        await backend.ping()
        assert admin.script_exists(sha) == [True]
    # two batches out at once, each on a connection the ping opened: none is made now
    made = connections_made(private_redis)
    decisions = await asyncio.gather(*(backend.decide([Check(f"warm{i}", 10, 60_000_000, 1)]) for i in range(2)))
    assert all(d.admitted for d in decisions)
    assert connections_made(private_redis) == made + 1  # only the count's own
    await backend.close()


class Starter:
    """A ``start`` that sends a batch without a task: landed ``item * 10`` once ``release`` is called, or not sent
    (the batch then goes through ``send``) while ``refuse`` is set; ``cut``: the batches cut off, by number."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.flights: list[Flight[int]] = []
        self.cut: list[int] = []
        self.refuse = False

    def start(self, items: list[int], flight: Flight[int]) -> bool:
        if self.refuse:
            return False
        self.batches.append(list(items))
        self.flights.append(flight)
        flight.cut = partial(self.cut.append, len(self.flights) - 1)
        return True

    def release(self) -> None:
        for batch, flight in zip(self.batches, self.flights, strict=True):
            if not flight.done():
                flight.landed([ValueError(i) if i < 0 else i * 10 for i in batch])


async def test_batches_started_without_a_task_are_answered_and_batched_the_same() -> None:
    recorder, starter = Recorder(), Starter()
    batcher = Batcher(recorder.send, max_in_flight=2, start=starter.start)
    calls = [asyncio.create_task(batcher.submit(i)) for i in (1, 2, -3, 4, 5)]
    await asyncio.sleep(0.01)
    assert starter.batches == [[1], [2]]
    starter.release()
    await asyncio.sleep(0.01)
    starter.release()  # the rest went as one batch once a place was free
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert results[:2] == [10, 20] and results[3:] == [40, 50]
    assert isinstance(results[2], ValueError)  # an item's own error is its own
    assert starter.batches == [[1], [2], [-3, 4, 5]] and recorder.batches == []


async def test_a_batch_start_cannot_send_goes_through_send() -> None:
    recorder, starter = Recorder(), Starter()
    recorder.release.set()
    starter.refuse = True
    batcher = Batcher(recorder.send, start=starter.start)
    assert await batcher.submit(7) == 70
    assert recorder.batches == [[7]] and starter.batches == []


async def test_a_started_batch_that_fails_or_is_cut_off_fails_its_callers_and_frees_its_place() -> None:
    starter = Starter()
    cut_off: list[bool] = []
    batcher = Batcher(Recorder().send, max_in_flight=1, batch_timeout=0.03, start=starter.start,
                      on_cut_off=lambda: cut_off.append(True))
    with pytest.raises(TimeoutError):
        await batcher.submit(1)  # never answered: cut off at 30 ms
    assert cut_off == [True] and starter.cut == [0]
    failing = asyncio.create_task(batcher.submit(2))
    await asyncio.sleep(0.01)
    starter.flights[1].landed(ConnectionError("storage gone"))
    with pytest.raises(ConnectionError):
        await failing
    following = asyncio.create_task(batcher.submit(3))  # the place is free again
    await asyncio.sleep(0.01)
    starter.release()
    assert await following == 30


async def test_permits_are_never_taken_past_their_number_nor_waiters_overtaken() -> None:
    permits = Permits(1)
    assert permits.take_now() and not permits.take_now()
    waiter = asyncio.create_task(permits.take())
    await asyncio.sleep(0)
    permits.give()  # handed to the waiter, not freed
    assert not permits.take_now()
    await waiter
    permits.give()
    assert permits.take_now()
    # a waiter that gives up after a permit was handed to it passes it on
    first, second = asyncio.create_task(permits.take()), asyncio.create_task(permits.take())
    await asyncio.sleep(0)
    permits.give()
    first.cancel()
    await asyncio.sleep(0)
    assert first.cancelled()
    await asyncio.wait_for(second, 1)
    permits.give()
    assert permits.take_now()


async def test_the_common_path_sends_no_task_and_a_full_pool_still_answers_every_call(
        redis_url: str, key_prefix: str) -> None:
    backend = RedisBackend(redis_url, pool_size=1)
    loop = asyncio.get_running_loop()
    tasks: list[str] = []  # the coroutine of every task made from here on
    factory = loop.get_task_factory()

    def counted(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Future[Any]:
        tasks.append(coro.__qualname__)
        return asyncio.Task(coro, loop=loop, **kwargs) if factory is None else factory(loop, coro, **kwargs)

    try:
        await backend.ping()  # connections made, script loaded
        check = Check(f"{key_prefix}common", 1000, 60_000_000, 1)
        loop.set_task_factory(counted)
        for expected in (999, 998):
            assert (await backend.decide([check])).outcomes[0].remaining == expected
        assert tasks == []  # written from the caller's batch at once, answered by a callback
        # one permit: the second batch out must wait for it, the general way (a task of its own)
        decisions = await asyncio.gather(*(backend.decide([check]) for _ in range(30)))
        assert sorted(d.outcomes[0].remaining for d in decisions) == list(range(968, 998))
        assert len(tasks) > 30  # the 30 calls' own, and the batches sent the general way
    finally:
        loop.set_task_factory(factory)
        await backend.close()


def test_a_call_in_flight_when_its_event_loop_ends_leaves_no_permit_or_round_trip_behind(
        private_redis: RedisServer) -> None:
    # written without a task (_start_many), its reply's callback never runs once the loop is gone: the next loop
    # must not find the one permit taken for good (every call then cut off) nor Redis "asked" since then
    backend = RedisBackend(private_redis.url, timeout=0.25, pool_size=1)
    check = Check("loopgone", 100, 60_000_000, 1)

    async def abandoned() -> None:
        await backend.ping()  # the script loaded and the connections made: the call goes without a task
        with redis.Redis.from_url(private_redis.url) as admin:
            admin.execute_command("CLIENT", "PAUSE", 150, "ALL")
        with pytest.raises(BackendUnavailable):  # DeadlineExceeded: the caller gave up before Redis answered
            await backend.decide([check], timeout=0.02)

    async def healthy() -> tuple[int, int]:
        await asyncio.sleep(0.3)  # the pause is over
        first = (await backend.decide([check])).outcomes[0].remaining
        # no answer for a while: a round trip left "at Redis" would now count as Redis silent longer than a call
        # with a short deadline can wait, and fail it at once, unasked
        await asyncio.sleep(0.1)
        return first, (await backend.decide([check], timeout=0.05)).outcomes[0].remaining

    asyncio.run(abandoned())
    first, then = asyncio.run(healthy())
    assert first in (98, 99) and then == first - 1
    asyncio.run(backend.close())


class Taskless:
    """The Redis backend's task-free batches built from their public parts over one Redis (the script called by
    its SHA, Redis's clock), with ``resend`` in place of the backend's resend the general way: a fault or a delay
    where no outside trigger reaches. ``general`` sends a request as that resend does (EVAL, nothing kept)."""

    def __init__(self, url: str, resend: Resend, timeout: float) -> None:
        self.client = redis.asyncio.Redis.from_url(url)
        self.silence = Silence(url, None)
        self.connections = Connections(url, self.silence, pool=self.client.connection_pool)
        self.script = lua_script([a.value for a in Algorithm])
        sha = hashlib.sha1(self.script.encode()).hexdigest()

        def packed(requests: list[Request]) -> bytes:
            keys, args = decide_args(requests, 0, ())
            return pack(("EVALSHA", sha, len(keys), *keys, *args))

        async def with_a_task(requests: list[Request]) -> list[Any]:
            raise AssertionError("every batch here is written without a task")

        calls = TasklessCalls(self.connections, Permits(4), self.silence, packed, resend)
        self.batcher: Batcher[Request, Any] = Batcher(with_a_task, batch_timeout=timeout, start=calls.start)

    async def general(self, requests: list[Request]) -> list[Any]:
        keys, args = decide_args(requests, 0, ())
        reply, _, _ = await self.connections.execute(("EVAL", self.script, len(keys), *keys, *args), script=True)
        return read_answers(requests, reply, None)

    async def decide(self, key: str) -> Any:
        return await self.batcher.send(([Check(key, 100, 60_000_000, 1)], "", False))

    async def close(self) -> None:
        await self.connections.close()
        await self.client.aclose()


async def test_a_batch_cut_off_after_noscript_does_not_close_the_connection_another_batch_now_uses(
        private_redis: RedisServer) -> None:
    # NOSCRIPT gives the connection back (in step) and the batch is sent again the general way; the batch's
    # cut-off must then close nothing of another batch's, nor leave its resend running on
    resent: list[str] = []

    async def slow(requests: list[Request], told: Exception) -> list[Any]:  # longer than the batch may take
        resent.append("started")
        await asyncio.sleep(0.8)
        resent.append("sent")
        return await taskless.general(requests)

    taskless = Taskless(private_redis.url, slow, timeout=0.4)
    with redis.Redis.from_url(private_redis.url) as admin:
        try:
            await taskless.connections.warm(2)  # idle connections: the batches go without a task
            admin.script_flush()
            first = asyncio.create_task(taskless.decide("noscript-a"))
            await asyncio.sleep(0.25)
            assert resent == ["started"]
            admin.script_load(taskless.script)
            admin.execute_command("CLIENT", "PAUSE", 300, "ALL")  # the next batch is out when the first is cut off
            # on the connection the first gave back
            second = await taskless.decide("noscript-b")
            assert second.admitted and second.outcomes[0].remaining == 99
            with pytest.raises(TimeoutError):
                await first  # cut off at 400 ms
            await asyncio.sleep(0.7)
            assert resent == ["started"]  # cut off: not sent after its callers were told it failed
            assert admin.get("noscript-a") is None
            # nothing left "at Redis": a call with a short deadline, after a while without answers, is not
            # refused as if Redis had been silent all that time
            assert taskless.silence.refusal(0.05) is None
        finally:
            await taskless.close()


async def test_a_flushed_script_costs_one_round_trip_more_not_two(private_redis: RedisServer) -> None:
    # NOSCRIPT to a batch sent without a task: it is sent again with EVAL at once, not with EVALSHA first
    backend = RedisBackend(private_redis.url)
    try:
        await backend.ping()  # the script loaded, a connection idle: the next batch goes without a task
        with redis.Redis.from_url(private_redis.url) as admin:
            admin.script_flush()
            admin.config_resetstat()
            decision = await backend.decide([Check("flushed", 100, 60_000_000, 1)])
            stats = admin.info("commandstats")
        assert decision.admitted and decision.outcomes[0].remaining == 99
        assert (stats["cmdstat_evalsha"]["calls"], stats["cmdstat_eval"]["calls"]) == (1, 1)
    finally:
        await backend.close()


async def test_a_start_that_raises_fails_its_batch_and_frees_its_place() -> None:
    # as a ``send`` that raises: the batch's callers hear of it, and the place it took is free again (else its
    # callers wait forever, and once max_in_flight batches are lost so does every later call)
    gate = Recorder()
    starts: list[list[int]] = []

    def start(items: list[int], flight: Flight[int]) -> bool:
        starts.append(list(items))
        if len(starts) == 2:
            raise RuntimeError("a bug in start")
        return False

    batcher = Batcher(gate.send, max_in_flight=1, start=start)
    first = asyncio.create_task(batcher.submit(1))
    await asyncio.sleep(0.01)
    queued = [asyncio.create_task(batcher.submit(i)) for i in (2, 3)]
    await asyncio.sleep(0.01)
    gate.release.set()  # the queued items leave from the first batch's end, through the start that raises
    assert await first == 10
    results = await asyncio.wait_for(asyncio.gather(*queued, return_exceptions=True), 1)
    assert all(isinstance(r, RuntimeError) for r in results)
    assert await asyncio.wait_for(batcher.submit(4), 1) == 40


async def test_a_lone_request_is_packed_once_on_its_plans_checks_and_only_for_them(
        redis_url: str, key_prefix: str) -> None:
    backend, another = RedisBackend(redis_url), RedisBackend(redis_url)
    try:
        await backend.ping()  # a connection idle: each call below goes alone, without a task
        await another.ping()
        mine = Checks((Check(f"{key_prefix}mine", 100, 60_000_000, 1),))
        assert (await backend.decide(mine)).outcomes[0].remaining == 99
        kept = mine.packed
        assert kept is not None and kept[0] is backend
        assert [(await backend.decide(mine)).outcomes[0].remaining for _ in range(2)] == [98, 97]
        assert mine.packed is kept  # packed once: a call packed again would have been kept anew
        # another backend (say REDIS_PERSECOND's) packs its own
        assert (await another.decide(mine)).outcomes[0].remaining == 96
        assert mine.packed is not None and mine.packed[0] is another
        # checks that may change under the same identity, or that no plan holds (they keep nothing: only a plan's
        # Checks has a place for it), are packed every time: a call kept for the list would count the first key
        refilled = [Check(f"{key_prefix}first", 100, 60_000_000, 1)]
        assert (await backend.decide(refilled)).outcomes[0].remaining == 99
        refilled[0] = Check(f"{key_prefix}second", 100, 60_000_000, 5)
        assert (await backend.decide(refilled)).outcomes[0].remaining == 95
        plain = (Check(f"{key_prefix}plain", 100, 60_000_000, 1),)
        assert [(await backend.decide(plain)).outcomes[0].remaining for _ in range(2)] == [99, 98]
        with redis.Redis.from_url(redis_url) as admin:
            assert len(admin.keys(f"{key_prefix}*")) == 4
    finally:
        await backend.close()
        await another.close()


async def test_a_plans_checks_keep_their_packed_call_and_nothing_else_does(
        write_config: Callable[..., Path], redis_url: str, key_prefix: str) -> None:
    config = load_directory(write_config(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 10}\n"))
    backend = RedisBackend(redis_url)
    limiter = Limiter(lambda: config, backend, LimiterOptions(key_prefix=key_prefix))
    try:
        await backend.ping()
        plan = limiter.prepare("d", [Descriptor((("k", "v"),))])
        checks = plan.checks
        assert isinstance(checks, Checks)
        assert checks.packed is None
        held = sys.getrefcount(checks)
        for expected in (9, 8):
            statuses = (await limiter.decide(plan)).statuses
            assert statuses[0].remaining == expected
        gc.collect()
        references = sys.getrefcount(checks)  # before an assertion's own references to them
        assert references == held  # the backend holds nothing of them: they are freed with the plan
        assert checks.packed is not None and checks.packed[0] is backend
    finally:
        await backend.close()


async def test_with_expiration_jitter_no_call_is_kept(redis_url: str, key_prefix: str) -> None:
    backend = RedisBackend(redis_url, expiry_jitter=5)
    try:
        await backend.ping()
        checks = Checks((Check(f"{key_prefix}jittered", 100, 60_000_000, 1),))
        assert [(await backend.decide(checks)).outcomes[0].remaining for _ in range(2)] == [99, 98]
        assert checks.packed is None  # each call carries its own random jitter
    finally:
        await backend.close()


async def test_an_item_sent_alone_whose_start_raises_fails_and_frees_its_place() -> None:
    recorder = Recorder()
    recorder.release.set()
    failing = [True]

    def start(items: list[int], flight: Flight[int]) -> bool:
        if failing.pop() if failing else False:
            raise RuntimeError("a bug in start")
        return False

    batcher = Batcher(recorder.send, max_in_flight=1, start=start)
    with pytest.raises(RuntimeError, match="a bug in start"):
        await asyncio.wait_for(batcher.submit(1), 1)
    assert await asyncio.wait_for(batcher.submit(2), 1) == 20  # its place was given back


async def test_nothing_of_a_call_outlives_it_in_the_batchers_bookkeeping() -> None:
    # batch bounds and the deadlines of callers whose item went alone are forgotten as each batch lands: a deadline
    # entry per call that lived for the whole timeout (thousands under load) cost each call ~10 µs of event loop
    starter = Starter()
    batcher = Batcher(Recorder().send, max_in_flight=2, batch_timeout=0.5, start=starter.start)
    for i in range(200):
        call = batcher.send(i, 0.05)  # a caller's deadline shorter than the batch's: the caller's own
        starter.release()
        assert await call == i * 10
    assert batcher.kept() == 0


async def test_a_lone_items_caller_deadline_fails_it_and_its_batch_goes_on() -> None:
    starter = Starter()
    batcher = Batcher(Recorder().send, max_in_flight=1, batch_timeout=0.3, start=starter.start)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await batcher.send(1, 0.03)
    assert 0.025 < time.monotonic() - started < 0.2  # its own deadline, not its batch's
    assert starter.cut == [] and not starter.flights[0].done()  # the batch is still out (its answer may matter)
    queued = batcher.send(2)
    await asyncio.sleep(0.01)
    assert starter.batches == [[1]]  # the place is the batch's until it lands
    starter.release()
    await asyncio.sleep(0.01)
    starter.release()
    assert await queued == 20
    assert batcher.kept() == 0


async def test_the_sweep_cuts_off_each_batch_at_its_own_time() -> None:
    starter = Starter()
    cut_off: list[float] = []
    batcher = Batcher(Recorder().send, max_in_flight=3, batch_timeout=0.3, start=starter.start,
                      on_cut_off=lambda: cut_off.append(time.monotonic()))
    started = time.monotonic()
    first = batcher.send(1)
    await asyncio.sleep(0.15)
    second = batcher.send(2)
    # sent alone, with a caller's deadline sooner than the sweep armed for the first batch's bound
    with pytest.raises(TimeoutError):
        await batcher.send(3, 0.03)
    assert time.monotonic() - started < 0.27
    starter.flights[2].landed([30])  # its batch lands after its caller gave up
    for call in (first, second):
        with pytest.raises(TimeoutError):
            await call
    assert starter.cut == [0, 1]
    assert 0.3 <= cut_off[0] - started < 0.4 and 0.45 <= cut_off[1] - started < 0.55  # each at its own bound
    assert batcher.kept() == 0


async def test_a_cut_off_that_fails_keeps_neither_the_others_nor_the_next_sweep_from_coming() -> None:
    starter = Starter()
    failures: list[BaseException] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: failures.append(context["exception"]))

    def on_cut_off() -> None:
        if not failures:
            raise RuntimeError("a bug in on_cut_off")

    try:
        batcher = Batcher(Recorder().send, max_in_flight=3, batch_timeout=0.1, start=starter.start,
                          on_cut_off=on_cut_off)
        calls = [batcher.send(1), batcher.send(2)]  # both due in one sweep: the first's cut-off raises
        await asyncio.sleep(0.05)
        calls.append(batcher.send(3))  # due after that sweep: the next one must still come
        for call in calls:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(call, 1)
        assert [type(failure) for failure in failures] == [RuntimeError]
        assert starter.cut == [0, 1, 2]
    finally:
        loop.set_exception_handler(None)


async def test_a_start_that_raises_after_keeping_its_flight_frees_its_place_once() -> None:
    kept: list[Flight[int]] = []

    def start(items: list[int], flight: Flight[int]) -> bool:
        kept.append(flight)  # as a call queued on a connection whose write then raised
        raise RuntimeError("the write failed")

    batcher = Batcher(Recorder().send, max_in_flight=1, start=start)
    with pytest.raises(RuntimeError):
        await batcher.send(1)
    kept[0].landed(ConnectionError("the connection is lost later"))  # its reply's callback still runs
    assert batcher.in_flight == 0


async def test_a_batch_cut_off_after_its_reply_came_closes_no_connection_given_back(
        private_redis: RedisServer) -> None:
    # NOSCRIPT gives the connection back (in step); should what follows fail before the resend can be cut off, the
    # batch's cut-off must not close that connection, which may be another batch's by then
    loop = asyncio.get_running_loop()
    reported: list[BaseException] = []
    loop.set_exception_handler(lambda _, context: reported.append(context["exception"]))

    def broken(requests: list[Request], told: Exception) -> Any:
        raise RuntimeError("a bug before the resend")

    taskless = Taskless(private_redis.url, broken, timeout=0.2)
    try:
        await taskless.connections.warm(1)  # an idle connection: the call goes without a task
        with redis.Redis.from_url(private_redis.url) as admin:
            admin.script_flush()
        with pytest.raises(TimeoutError):
            await taskless.decide("uncut")  # cut off at 200 ms
        assert [type(e) for e in reported] == [RuntimeError]
        # the connection given back is still open: the next call uses it, and none is made
        made = connections_made(private_redis)
        with redis.Redis.from_url(private_redis.url) as admin:
            admin.script_load(taskless.script)
        assert (await taskless.decide("uncut")).admitted
        assert connections_made(private_redis) == made + 2  # the two counts' own and the script load's only
    finally:
        loop.set_exception_handler(None)
        await taskless.close()
