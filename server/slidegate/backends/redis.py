"""The Redis backend: a request's limits are decided by one Lua script call (EVALSHA), or on Redis Cluster by
one call per hash slot its keys fall in, sent together. On one Redis (or Sentinel's master), requests that
arrive while others are at Redis share the next script call (slidegate.backends.batching); each is still
decided on its own, all-or-nothing, in arrival order.

On a cluster a request spanning slots is all-or-nothing too (slidegate.backends.spanning: each slot's call may
be undone, and is when another rejects); a RedisBackend is one of that module's places, as each Redis of
REDIS_PERSECOND is (one Redis's parts travel in its batches). lua/decide.lua's arguments and replies are
slidegate.backends.script_codec's.

Connection errors and timeouts become BackendUnavailable within ``timeout`` seconds (a few ms more at most:
deadlines share one timer, slidegate.backends.deadlines). Nothing is retried
except a NOSCRIPT reply (after SCRIPT FLUSH, a Redis restart or a failover to a node that never saw the
script), which means the script did not run, with Sentinel a READONLY reply (the node is a replica now: the
script's first write failed, so nothing was written; it goes once more, to the master the Sentinels name), and
on a cluster the replies that also mean it did not run (MOVED, ASK, TRYAGAIN, CLUSTERDOWN: see
slidegate.backends.redis_cluster): a call that may have executed is never sent twice, so no hit is counted
twice. With Sentinel, the master in use
follows the Sentinels' announcements (slidegate.backends.redis_sentinel).

``wait_replicas`` (REDIS_WAIT_REPLICAS; one Redis with replicas, or Sentinel): each script call is followed,
in the same write, by ``WAIT wait_replicas wait_timeout``; when the writes did not reach that many replicas in
time, each request of the call that was admitted with hits raises BackendUnavailable (the failure mode answers
it) instead of being answered as if a failover could not lose it; its hits stay counted on the master (the call
is not sent again). A rejected request keeps its answer: a replica that lags does not lift a limit.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import random
from collections.abc import Sequence

from redis.exceptions import ResponseError

from slidegate.algorithms import Algorithm
from slidegate.backends.base import BackendUnavailable, Check, Checks, DeadlineExceeded, Decision
from slidegate.backends.batching import Batcher
from slidegate.backends.breaker import Breaker
from slidegate.backends.deadlines import GRANULARITY
from slidegate.backends.permits import Permits
from slidegate.backends.redis_cluster import RETRY_FOR
from slidegate.backends.redis_connect import TlsOptions, Topology, check_url, redact
from slidegate.backends.redis_errors import STORAGE_ERRORS, reason
from slidegate.backends.redis_sentinel import SentinelMaster
from slidegate.backends.script_codec import (
    Part,
    Receipt,
    Request,
    Unconfirmed,
    decide_args,
    limit_args,
    pack,
    read_answers,
    read_part,
    undo_args,
)
from slidegate.backends.script_runner import ScriptRunner
from slidegate.backends.silence import Silence
from slidegate.backends.spanning import decide_across, places
from slidegate.backends.taskless import TasklessCalls
from slidegate.backends.transport import open_transport
from slidegate.logs import Repeated
from slidegate.resources import lua_script

__all__ = ["RedisBackend", "TlsOptions", "Topology", "check_url", "limit_args", "redact"]

log = logging.getLogger(__name__)

# Limits one script call decides at most for a batch of requests (a larger request goes alone): eight callers'
# requests of 1,000 descriptors in one call outlasted REDIS_TIMEOUT, and every request batched with them failed
MAX_BATCH_CHECKS = 256


class RedisBackend:
    """Limits of every algorithm in Redis: ``target`` is a single Redis's URL or a Topology (single, Sentinel
    or Cluster).

    ``timeout``: seconds allowed for one decision, connecting and waiting for a connection included
    (default 0.25 s); ``pool_size``: script calls in flight at most (REDIS_POOL_SIZE), so connections at most
    (per node on a cluster), plus one kept for the health ping; calls beyond it wait. ``breaker``: fail calls
    at once while Redis is failing (slidegate.backends.breaker). Raises ValueError for a malformed URL.

    On a cluster the checks of one request are grouped by hash slot and each group is decided by its own
    script call, all sent at once; the request is admitted when every group admits it, and when one rejects
    (or fails) the groups that admitted are undone (see the module docstring). Keys built with
    REDIS_HASH_TAG=domain put a whole domain in one slot, so a request is one call.

    ``wait_replicas``, ``wait_timeout`` (seconds, whole ms, shorter than ``timeout``): see the module
    docstring; not offered on a cluster (ValueError).

    ``expiry_jitter`` (EXPIRATION_JITTER_MAX_SECONDS): every key's expiry is up to this many seconds (whole ms)
    later, drawn afresh for each key (lua/decide.lua) from a seed ``rng`` gives each script call.

    ``function``: the name of a Redis function (FUNCTION LOAD) called with FCALL in place of lua/decide.lua, with
    the same keys and arguments and answering as it does: a decision script kept as a function, or wrapped by
    one (the property tests' keeps every key it names alive while their injected clock stands still).
    """

    def __init__(self, target: str | Topology, *, timeout: float = 0.25, pool_size: int = 64,
                 breaker: Breaker | None = None, wait_replicas: int = 0, wait_timeout: float = 0.05,
                 expiry_jitter: float = 0.0, rng: random.Random | None = None, function: str = "") -> None:
        self._topology = target if isinstance(target, Topology) else Topology("single", target)
        self._timeout = timeout
        self._jitter_ms = round(expiry_jitter * 1000)
        self._rng = rng or random.Random()
        if wait_replicas and not 0.001 <= wait_timeout < timeout:
            raise ValueError(f"the wait for replicas ({wait_timeout:g} s) must be at least 1 ms and shorter than "
                             f"the timeout ({timeout:g} s)")
        # redis-py's pools fail when full: waiting here keeps every node within pool_size connections
        self._permits = Permits(pool_size)
        self._silence = Silence(self.describe(), breaker)
        self._transport = open_transport(self._topology, timeout=timeout, pool_size=pool_size,
                                         silence=self._silence, wait_replicas=wait_replicas,
                                         wait_ms=math.ceil(wait_timeout * 1000))
        self._runner = ScriptRunner(self._transport, lua_script([a.value for a in Algorithm]),
                                    permits=self._permits, silence=self._silence, function=function)
        # most batches are written without a task; with REDIS_WAIT_REPLICAS each waits for its WAIT in one
        connections = self._batches = self._transport.batches
        taskless = None
        if connections is not None and not wait_replicas:
            taskless = TasklessCalls(connections, self._permits, self._silence, self._packed,
                                     lambda requests, told: self._decide_many(requests, told=told))
        # only one Redis (or Sentinel's master) takes batches of requests: a cluster's span slots (a batch's
        # own bound: it outlives the callers that gave up on it, and a Redis that stopped answering would
        # otherwise hold its place in flight for good; cut off, its connection is closed)
        self._batcher: Batcher[Request, Decision | Part] = Batcher(
            self._decide_many, batch_timeout=timeout,
            on_cut_off=lambda: self._silence.failed(f"no answer within {timeout * 1000:.0f} ms"),
            weight=lambda request: len(request[0]), max_weight=MAX_BATCH_CHECKS,
            start=None if taskless is None else taskless.start)
        self._warm = False  # the script loaded and connections opened (by the first ping that worked)
        # a token bucket's hold waits this long for its undo (a decision and a compensating call, each within
        # the timeout), then is confirmed: an undo arriving later gives nothing back. Longer holds would cost
        # every admitted request spanning slots (several holds give back less than exact, and each is a field)
        self._hold_us = round((2 * timeout + 0.1) * 1_000_000)
        self._undoing: set[asyncio.Task[None]] = set()  # compensating calls that outlived their request
        self._undo_failed = Repeated(log, self.describe().replace("%", "%%") + ": a compensating call failed, so "
                                     "the hits of a rejected request stay counted on some limits until they leave "
                                     "their windows (%s)")

    def describe(self) -> str:
        return self._topology.describe()

    @property
    def sentinel(self) -> SentinelMaster | None:
        """With Sentinel (REDIS_TYPE=sentinel), what follows the master its calls go to; None otherwise."""
        return self._transport.sentinel

    async def decide(
        self, checks: Sequence[Check], now_us: int | None = None, timeout: float | None = None
    ) -> Decision:
        """Decide ``checks`` (one script call per hash slot on a cluster, else one). Raises BackendUnavailable
        on any Redis failure or timeout, DeadlineExceeded when ``timeout`` (shorter than the backend's) ran out."""
        if not checks:
            return Decision(True, [])
        if timeout is not None and timeout <= GRANULARITY:
            # the caller is gone, or will be before any answer could reach it: no evidence about Redis
            raise DeadlineExceeded(f"{self.describe()}: the caller's deadline ({timeout:.3f} s) ran out")
        refusal = self._silence.refusal(timeout)
        if refusal is not None:
            raise refusal
        clock: str | int = "" if now_us is None else now_us
        caller_first = timeout is not None and timeout < self._timeout
        bound = timeout if timeout is not None and caller_first else self._timeout
        try:
            if self._batches is not None:
                # a caller's own deadline counts from now, whatever it waits for (its failure mode must answer
                # in time); only a call without one is bounded by its batch once sent (the wait for a place is
                # then not time at Redis)
                decision = await self._batcher.send((checks, clock, False), bound, grace=timeout is None)
                if not isinstance(decision, Decision):
                    raise TypeError("a request that cannot be undone is answered with a Decision")
                return decision
            async with asyncio.timeout(bound) as scope:
                where = places(checks, lambda _: self)
                if len(where) == 1:
                    return await self.decide_given(checks, clock)
                return await decide_across(checks, where, lambda _: self, clock, scope)
        except STORAGE_ERRORS as exc:
            if caller_first and isinstance(exc, TimeoutError):
                raise DeadlineExceeded(f"{self.describe()}: the caller's deadline ({timeout:.3f} s) ran out") from exc
            raise self.unavailable(exc) from exc

    def refusal(self, timeout: float | None) -> BackendUnavailable | None:
        """Why a call must not go to Redis now (its failure mode answers at once), or None: the breaker is open,
        or Redis has been silent for longer than the call can wait."""
        return self._silence.refusal(timeout)

    def unavailable(self, exc: BaseException) -> BackendUnavailable:
        """The one mapping of a storage error (STORAGE_ERRORS) to what the limiter's failure mode answers."""
        return BackendUnavailable(f"{self.describe()}: {reason(exc)}")

    async def decide_undoable(self, checks: Sequence[Check], clock: str | int, until: float | None) -> Part:
        """One place's ``checks`` as a request that may be undone (lua/decide.lua: -n and the holds' lifetime),
        sent before ``until`` (the event loop's time) or not at all. One Redis (or Sentinel's master): in the
        next batch, whose answer is awaited once it is sent, whatever the time (so that it can be undone); a
        cluster: a script call of its own."""
        if self._batches is not None:
            left = None if until is None else until - asyncio.get_running_loop().time()
            part = await self._batcher.submit((checks, clock, True), left, settle=True)
            if not isinstance(part, Part):
                raise TypeError("a request that may be undone is answered with a Part")
            return part
        keys, args = decide_args([(checks, clock, True)], self._hold_us, self._jitter())
        reply = await self._runner.run(keys, args, until)
        return read_part(reply, 0, len(checks))[0]

    def start_undo(self, undo: list[tuple[Check, Receipt]], clock: str | int) -> asyncio.Task[None]:
        """Take back what ``undo``'s receipts name, in a task that outlives the request (a failure is logged)."""
        task = asyncio.create_task(self._undo(undo, clock))
        self._undoing.add(task)
        task.add_done_callback(self._undone)
        return task

    def _undone(self, task: asyncio.Task[None]) -> None:
        self._undoing.discard(task)
        failure = None if task.cancelled() else task.exception()
        if failure is not None:
            self._undo_failed(reason(failure))

    async def _undo(self, undo: list[tuple[Check, Receipt]], clock: str | int) -> None:
        """One compensating call per slot (lua/decide.lua's undo), tried again while the cluster says CLUSTERDOWN
        or TRYAGAIN for RETRY_FOR seconds (a token bucket's hold, confirmed sooner, then gives nothing back)."""
        slots: dict[int, list[tuple[Check, Receipt]]] = {}
        for item in undo:
            slots.setdefault(self.slot(item[0].key), []).append(item)
        calls = []
        until = asyncio.get_running_loop().time() + RETRY_FOR
        for items in slots.values():
            calls.append(self._runner.run(*undo_args(items, clock, self._jitter()), until))
        for result in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(result, BaseException):
                raise result

    def _jitter(self) -> tuple[int, ...]:
        """The script's trailing arguments for EXPIRATION_JITTER_MAX_SECONDS: none when it is 0."""
        return (self._jitter_ms, self._rng.getrandbits(31)) if self._jitter_ms else ()

    @property
    def timeout(self) -> float:
        """Seconds one decision may take (REDIS_TIMEOUT)."""
        return self._timeout

    def slot(self, key: str) -> int:
        """``key``'s hash slot on a cluster; 0 elsewhere (one Redis decides every key in one call)."""
        return self._transport.slot(key)

    async def _decide_many(self, requests: list[Request], *,
                           told: ResponseError | None = None) -> list[Decision | Part | Unconfirmed]:
        """One answer per request (its checks, its clock, whether it may be undone), in order: a Decision, or a
        Part for a request that may be undone; one script call for each run of requests with the same clock (so
        one in production, where Redis's clock decides). With REDIS_WAIT_REPLICAS, a request admitted with hits
        that did not reach the replicas in time gets an Unconfirmed instead. ``told``: the error reply (NOSCRIPT or
        READONLY) a first send of these requests got (slidegate.backends.taskless), so nothing ran."""
        answers: list[Decision | Part | Unconfirmed] = []
        for _, run in itertools.groupby(requests, key=lambda r: r[1]):
            batch = list(run)
            keys, args = decide_args(batch, self._hold_us, self._jitter())
            unconfirmed = None
            try:
                reply = await self._runner.run(keys, args, told=told)
            except Unconfirmed as exc:
                reply, unconfirmed = exc.reply, exc
            answers += read_answers(batch, reply, unconfirmed)
        return answers


    def _packed(self, requests: list[Request]) -> bytes:
        """The packed script call deciding ``requests`` (all of one clock) in one round trip."""
        if len(requests) == 1 and requests[0][1] == "" and not self._jitter_ms:
            return self._lone_call(requests[0])
        keys, args = decide_args(requests, self._hold_us, self._jitter())
        return pack(self._runner.command(keys, args))

    def _lone_call(self, request: Request) -> bytes:
        """The packed script call deciding ``request`` alone, with Redis's clock and no jitter. A request that goes
        to Redis alone (under gRPC load nearly every one: a call finds a place free and nothing waiting) is the
        same call every time, and building and packing its arguments again cost a call about 10 µs: kept on its
        plan's checks (base.Checks), and so freed with the request the service remembers, never on checks that
        can change (a caller's list) or are made anew each call (a part of a request spanning several Redis)."""
        checks, _, undoable = request
        kept = checks.packed if type(checks) is Checks and not undoable else None
        if kept is not None and kept[0] is self:
            return kept[1]
        keys, args = decide_args([request], self._hold_us, self._jitter())
        packed = pack(self._runner.command(keys, args))
        if type(checks) is Checks and not undoable:
            checks.packed = (self, packed)
        return packed

    async def decide_given(self, checks: Sequence[Check], clock: str | int) -> Decision:
        """``checks`` in one call that cannot be undone, where none can be unconfirmed (a cluster slot's, or hits
        given back: they never admit with hits)."""
        [answer] = await self._decide_many([(checks, clock, False)])
        if isinstance(answer, Unconfirmed):
            raise answer
        if not isinstance(answer, Decision):
            raise TypeError("a request that cannot be undone is answered with a Decision")
        return answer

    async def ping(self) -> None:
        """Raise BackendUnavailable unless Redis (on a cluster: every master) answers in time (the transport's
        ping). A ping that fails is tried once more, on another connection: a killed idle connection is no sign
        of Redis failing, and a second failure counts for the breaker. Takes no place of the calls': load cannot
        starve it. The first that works warms the service up: the script loaded on every master and the
        connections batches use opened (the first call to a cold service took 19 ms, past Envoy's default
        deadline of 20 ms with its own way there)."""
        for attempt in range(2):
            try:
                async with asyncio.timeout(self._timeout):
                    await self._transport.ping()
                    if not self._warm:
                        await self._runner.load()
                        self._warm = True
                return
            except STORAGE_ERRORS as exc:
                if attempt == 1:
                    self._silence.failed(f"ping: {reason(exc)}")
                    raise self.unavailable(exc) from exc

    async def close(self) -> None:
        self._silence.stop()
        if self._undoing:  # compensating calls still running: their hits would otherwise stay counted
            await asyncio.wait(set(self._undoing), timeout=self._timeout)
        await self._transport.close()
