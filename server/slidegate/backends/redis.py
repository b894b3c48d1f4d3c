"""The Redis backend: a request's limits are decided by one Lua script call (EVALSHA), or on Redis Cluster by
one call per hash slot its keys fall in, sent together. On one Redis (or Sentinel's master), requests that
arrive while others are at Redis share the next script call (slidegate.backends.batching); each is still
decided on its own, all-or-nothing, in arrival order.

On a cluster a request spanning slots is all-or-nothing too: each slot's call may be undone (lua/decide.lua
returns a receipt of what it wrote), and when any slot rejects, the slots that admitted are sent a
compensating call that takes back exactly this request's hits. Until it lands the request holds that room
(another request may be refused meanwhile); no request is ever admitted beyond a limit. When the compensating
call fails (a node down), the request stays rejected and the hits it held stay counted: conservative. Hits
given back (is_negative_hits) never reject and cannot be undone exactly, so in a request that also adds hits
they are applied only once every slot has admitted it. The same protocol decides a request whose limits are
kept in two Redis (REDIS_PERSECOND, slidegate.backends.persecond: ``decide_spanning``), each place a Redis and,
on a cluster, a slot of it; one Redis's parts travel in its batches.

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
import hashlib
import itertools
import logging
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import hiredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import (
    AuthenticationError,
    NoPermissionError,
    NoScriptError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
)

from slidegate.algorithms import Algorithm
from slidegate.backends.base import BackendUnavailable, Check, Checks, DeadlineExceeded, Decision, Outcome, admits
from slidegate.backends.batching import Batcher, Flight
from slidegate.backends.breaker import Breaker
from slidegate.backends.deadlines import LoopWatch
from slidegate.backends.permits import Permits
from slidegate.backends.redis_cluster import RETRY_FOR, ClusterRouter
from slidegate.backends.redis_connect import TlsOptions, Topology, check_url, make_client, redact
from slidegate.backends.redis_sentinel import SentinelMaster
from slidegate.backends.redis_wire import WireConnection
from slidegate.logs import Repeated
from slidegate.resources import lua_script

__all__ = ["RedisBackend", "TlsOptions", "Topology", "check_url", "redact"]

log = logging.getLogger(__name__)

Receipt = tuple[int, int]  # what one slot's call wrote for a limit (lua/decide.lua), to undo it
# A request's checks, its clock ("" for Redis TIME) and whether it may be undone (one part of a request decided in
# several places, see _decide_across)
_Request = tuple[Sequence[Check], str | int, bool]
# Limits one script call decides at most for a batch of requests (a larger request goes alone): eight callers'
# requests of 1,000 descriptors in one call outlasted REDIS_TIMEOUT, and every request batched with them failed
MAX_BATCH_CHECKS = 256
# What a Redis that fails or cannot be reached raises, through redis-py or our own connections (TimeoutError, an
# OSError: no answer in time). Each becomes BackendUnavailable, in RedisBackend._unavailable, and nothing else
# does: any other exception is a bug and goes up as itself.
STORAGE_ERRORS = (RedisError, RedisClusterException, OSError)


class Unconfirmed(BackendUnavailable):
    """A script call ran, but its writes did not reach REDIS_WAIT_REPLICAS replicas in time: ``reply`` is its
    reply."""

    def __init__(self, reply: Any, message: str) -> None:
        super().__init__(message)
        self.reply = reply


# One script call's share of a request: the Redis that decides it and the indexes of its checks
Place = tuple["RedisBackend", list[int]]
Undo = dict["RedisBackend", list[tuple[Check, Receipt]]]  # what to take back, Redis by Redis


@dataclass(frozen=True, slots=True)
class _Part:
    """One slot's share of a request, decided so that it can be undone: ``decision``; per check, ``unchanged``
    (its remaining and reset as if the request had not come) and ``receipts`` (None: nothing to undo)."""

    decision: Decision
    unchanged: list[Outcome]
    receipts: list[Receipt | None]


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
        self._function = function
        self._timeout = timeout
        self._breaker = breaker
        self._jitter_ms = round(expiry_jitter * 1000)
        self._rng = rng or random.Random()
        if wait_replicas and self._topology.type == "cluster":
            raise ValueError("waiting for replicas (REDIS_WAIT_REPLICAS) is not offered on a Redis Cluster")
        if wait_replicas and not 0.001 <= wait_timeout < timeout:
            raise ValueError(f"the wait for replicas ({wait_timeout:g} s) must be at least 1 ms and shorter than "
                             f"the timeout ({timeout:g} s)")
        self._wait_replicas = wait_replicas
        self._wait_ms = math.ceil(wait_timeout * 1000)
        self._wait = _pack(("WAIT", wait_replicas, self._wait_ms)) if wait_replicas else b""
        # one connection more than calls may take: the health ping never waits behind the load
        self._client = make_client(self._topology, timeout=timeout, pool_size=pool_size + 1)
        # redis-py's pools fail when full: waiting here keeps every node within pool_size connections
        self._permits = Permits(pool_size)
        self._router = ClusterRouter(self._client) if isinstance(self._client, RedisCluster) else None
        # one Redis: connections of our own between calls (redis-py's Sentinel and Cluster clients follow
        # failovers and redirects inside execute_command, so those keep it)
        self._pool = None
        if self._topology.type == "single" and not isinstance(self._client, RedisCluster):
            self._pool = self._client.connection_pool
        # Sentinel: connections of our own too, to the master it names, followed as it moves
        self._master: SentinelMaster | None = None
        if self._topology.type == "sentinel" and not isinstance(self._client, RedisCluster):
            self._master = SentinelMaster(self._client)
        self._role_refused = False  # an ACL without ROLE: the Sentinel master's health ping is a PING
        self._idle: list[WireConnection] = []
        self._idle_loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        # a cluster's requests span slots: only one Redis (or Sentinel's master) takes batches of requests
        # (a batch's own bound: it outlives the callers that gave up on it, and a Redis that stopped answering
        # would otherwise hold its place in flight for good; cut off, its connection is closed in _direct)
        self._batcher: Batcher[_Request, Decision | _Part] = Batcher(
            self._decide_many, batch_timeout=timeout,
            on_cut_off=lambda: self._failed(f"no answer within {timeout * 1000:.0f} ms"),
            weight=lambda request: len(request[0]), max_weight=MAX_BATCH_CHECKS, start=self._start_many)
        self._script = lua_script([a.value for a in Algorithm])
        self._sha = hashlib.sha1(self._script.encode()).hexdigest()
        # round trips at Redis now (their start, by a number of their own) and Redis's last answer: how long it
        # has been silent while asked
        self._asked: dict[int, float] = {}
        self._asking = itertools.count()
        self._last_answer = 0.0
        self._watch = LoopWatch(lambda: bool(self._asked))
        self._warm = False  # the script loaded and connections opened (by the first ping that worked)
        # a token bucket's hold waits this long for its undo (a decision and a compensating call, each within
        # the timeout), then is confirmed: an undo arriving later gives nothing back. Longer holds would cost
        # every admitted request spanning slots (several holds give back less than exact, and each is a field)
        self._hold_us = round((2 * timeout + 0.1) * 1_000_000)
        self._undoing: set[asyncio.Task[None]] = set()  # compensating calls that outlived their request
        self._resending: set[asyncio.Future[list[Decision | _Part | Unconfirmed]]] = set()  # see _send_again
        # script calls _start_many wrote and whose reply has not been handled, by their round trip's number (each
        # holds a permit and an entry of _asked), with their loop: once it is closed, _replied never runs for them
        self._started: dict[int, asyncio.AbstractEventLoop] = {}
        self._started_loop: asyncio.AbstractEventLoop | None = None  # the last call's
        self._undo_failed = Repeated(log, self.describe().replace("%", "%%") + ": a compensating call failed, so "
                                     "the hits of a rejected request stay counted on some limits until they leave "
                                     "their windows (%s)")

    def describe(self) -> str:
        return self._topology.describe()

    @property
    def sentinel(self) -> SentinelMaster | None:
        """With Sentinel (REDIS_TYPE=sentinel), what follows the master its calls go to; None otherwise."""
        return self._master

    async def decide(
        self, checks: Sequence[Check], now_us: int | None = None, timeout: float | None = None
    ) -> Decision:
        """Decide ``checks`` (one script call per hash slot on a cluster, else one). Raises BackendUnavailable
        on any Redis failure or timeout, DeadlineExceeded when ``timeout`` (shorter than the backend's) ran out."""
        if not checks:
            return Decision(True, [])
        refusal = self._refusal(timeout)
        if refusal is not None:
            raise refusal
        clock: str | int = "" if now_us is None else now_us
        caller_first = timeout is not None and timeout < self._timeout
        bound = timeout if timeout is not None and caller_first else self._timeout
        try:
            if self._router is None:
                decision = await self._batcher.send((checks, clock, False), bound, grace=not caller_first)
                if not isinstance(decision, Decision):
                    raise TypeError("a request that cannot be undone is answered with a Decision")
                return decision
            async with asyncio.timeout(bound) as scope:
                places = _places(checks, lambda _: self)
                if len(places) == 1:
                    return (await self._decided([(checks, clock, False)]))[0]
                return await _decide_across(checks, places, lambda _: self, clock, scope)
        except STORAGE_ERRORS as exc:
            if caller_first and isinstance(exc, TimeoutError):
                raise DeadlineExceeded(f"{self.describe()}: the caller's deadline ({timeout:.3f} s) ran out") from exc
            raise self._unavailable(exc) from exc

    def _refusal(self, timeout: float | None) -> BackendUnavailable | None:
        """Why a call must not go to Redis now (its failure mode answers at once), or None: the breaker is open,
        or Redis has been silent for longer than the call can wait."""
        if self._breaker is not None and not self._breaker.allow():
            return BackendUnavailable(f"{self.describe()}: failing ({self._breaker.reason}); calls fail at once "
                                      "until Redis answers again")
        if timeout is not None and self._asked:
            # a call does not queue behind a Redis that has already been silent longer than the call can wait
            # (Envoy's 20 ms): its failure mode answers at once instead of just before the deadline, when the
            # answer may no longer make it (measured: 15% late under load with CLIENT PAUSE). Silent while this
            # process ran, that is: an answer may be waiting unread after a pause of our own.
            now = time.monotonic()
            # a stall of ours shorter than the watch can tell (LoopWatch.UNSEEN) may hide in that silence
            longest = timeout + LoopWatch.UNSEEN
            if now - self._last_answer < longest:
                return None  # an answer came lately (under load, nearly always): silent for less than that
            oldest = next(iter(self._asked.values()))  # round trips are kept in the order they began
            silent = now - max(self._last_answer, oldest, self._watch.steady_since(now))
            if silent >= longest:
                return BackendUnavailable(f"{self.describe()}: silent for {silent * 1000:.0f} ms, longer than the "
                                          f"call can wait ({timeout * 1000:.0f} ms)")
        return None

    def _unavailable(self, exc: BaseException) -> BackendUnavailable:
        """The one mapping of a storage error (STORAGE_ERRORS) to what the limiter's failure mode answers."""
        return BackendUnavailable(f"{self.describe()}: {_reason(exc)}")

    async def _decide_undoable(self, checks: Sequence[Check], clock: str | int, until: float | None) -> _Part:
        """One place's ``checks`` as a request that may be undone (lua/decide.lua: -n and the holds' lifetime),
        sent before ``until`` (the event loop's time) or not at all. One Redis (or Sentinel's master): in the
        next batch, whose answer is awaited once it is sent, whatever the time (so that it can be undone); a
        cluster: a script call of its own."""
        if self._router is None:
            left = None if until is None else until - asyncio.get_running_loop().time()
            part = await self._batcher.submit((checks, clock, True), left, settle=True)
            if not isinstance(part, _Part):
                raise TypeError("a request that may be undone is answered with a _Part")
            return part
        keys = [c.key for c in checks]
        args: list[str | int] = [clock, 1, -len(checks), self._hold_us]
        for c in checks:
            args += limit_args(c)
        args += self._jitter()
        reply = await self._eval(keys, args, until)
        return _read_part(reply, 0, len(checks))[0]

    def _start_undo(self, undo: list[tuple[Check, Receipt]], clock: str | int) -> asyncio.Task[None]:
        task = asyncio.create_task(self._undo(undo, clock))
        self._undoing.add(task)
        task.add_done_callback(self._undone)
        return task

    def _undone(self, task: asyncio.Task[None]) -> None:
        self._undoing.discard(task)
        failure = None if task.cancelled() else task.exception()
        if failure is not None:
            self._undo_failed(_reason(failure))

    async def _undo(self, undo: list[tuple[Check, Receipt]], clock: str | int) -> None:
        """One compensating call per slot (lua/decide.lua's undo), tried again while the cluster says CLUSTERDOWN
        or TRYAGAIN for RETRY_FOR seconds (a token bucket's hold, confirmed sooner, then gives nothing back)."""
        slots: dict[int, list[tuple[Check, Receipt]]] = {}
        for item in undo:
            slots.setdefault(self._slot(item[0].key), []).append(item)
        calls = []
        until = asyncio.get_running_loop().time() + RETRY_FOR
        for items in slots.values():
            args: list[str | int] = [clock, "undo", len(items)]
            for c, (r1, r2) in items:
                args += (c.algorithm.value, *c.params(), r1, r2)
            args += self._jitter()
            calls.append(self._eval([c.key for c, _ in items], args, until))
        for result in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(result, BaseException):
                raise result

    def _jitter(self) -> tuple[int, ...]:
        """The script's trailing arguments for EXPIRATION_JITTER_MAX_SECONDS: none when it is 0."""
        return (self._jitter_ms, self._rng.getrandbits(31)) if self._jitter_ms else ()

    def _slot(self, key: str) -> int:
        return 0 if self._router is None else self._router.slot(key)

    async def _decide_many(self, requests: list[_Request], *,
                           told: ResponseError | None = None) -> list[Decision | _Part | Unconfirmed]:
        """One answer per request (its checks, its clock, whether it may be undone), in order: a Decision, or a
        _Part for a request that may be undone; one script call for each run of requests with the same clock (so
        one in production, where Redis's clock decides). With REDIS_WAIT_REPLICAS, a request admitted with hits
        that did not reach the replicas in time gets an Unconfirmed instead. ``told``: the error reply (NOSCRIPT or
        READONLY) a first send of these requests got (_replied), so nothing ran."""
        answers: list[Decision | _Part | Unconfirmed] = []
        for _, run in itertools.groupby(requests, key=lambda r: r[1]):
            batch = list(run)
            keys, args = self._script_args(batch)
            unconfirmed = None
            try:
                reply = await self._eval(keys, args, told=told)
            except Unconfirmed as exc:
                reply, unconfirmed = exc.reply, exc
            answers += _read_answers(batch, reply, unconfirmed)
        return answers

    def _script_args(self, requests: Sequence[_Request]) -> tuple[list[str], list[str | int]]:
        """The keys and arguments of one script call (lua/decide.lua) deciding ``requests``, all of one clock."""
        keys: list[str] = []
        args: list[str | int] = [requests[0][1], len(requests)]
        for checks, _, undoable in requests:
            args += (-len(checks), self._hold_us) if undoable else (len(checks),)
            for c in checks:
                keys.append(c.key)
                args += limit_args(c)
        args += self._jitter()
        return keys, args

    def _start_many(self, requests: list[_Request], flight: Flight[Decision | _Part]) -> bool:
        """The common case of ``_decide_many``, without a task: the batch's script call written at once on an idle
        connection, its answers told to ``flight`` by ``_replied`` as soon as the reply is read (the Batcher cuts it
        off by closing the connection). False when that is not the case, and ``_decide_many`` sends the batch: no
        idle connection on this loop to use (one to make, or to drop), no permit free, REDIS_WAIT_REPLICAS, or
        several clocks in one batch (tests' clocks only)."""
        loop = asyncio.get_running_loop()
        if self._started and self._started_loop is not loop:
            self._forget_started()
        if self._wait_replicas or not self._idle:
            return False
        connection = self._idle[-1]
        clock = requests[0][1]
        if (self._idle_loop is not loop or connection.closed or not self._current(connection)
                or (len(requests) > 1 and any(request[1] != clock for request in requests))
                or not self._permits.take_now()):
            return False
        self._idle.pop()
        if len(requests) == 1 and clock == "" and not self._jitter_ms:
            packed = self._lone_call(requests[0])
        else:
            keys, args = self._script_args(requests)
            packed = _pack(self._script_call(keys, args))
        asking = next(self._asking)
        self._asked[asking] = time.monotonic()
        self._started[asking] = self._started_loop = loop
        self._watch.watch(loop)
        # cut off (no answer within the timeout): a late reply must never be read as the next call's. Only while
        # the reply is awaited: once it came, _replied gives the connection back (or closes it) and sets what
        # cuts the batch off then
        flight.cut = connection.close
        connection.send(packed, partial(self._replied, requests, connection, flight, asking))
        return True

    def _lone_call(self, request: _Request) -> bytes:
        """The packed script call deciding ``request`` alone, with Redis's clock and no jitter. A request that goes
        to Redis alone (under gRPC load nearly every one: a call finds a place free and nothing waiting) is the
        same call every time, and building and packing its arguments again cost a call about 10 µs: kept on its
        plan's checks (base.Checks), and so freed with the request the service remembers, never on checks that
        can change (a caller's list) or are made anew each call (a part of a request spanning several Redis)."""
        checks, _, undoable = request
        kept = checks.packed if type(checks) is Checks and not undoable else None
        if kept is not None and kept[0] is self:
            return kept[1]
        keys, args = self._script_args([request])
        packed = _pack(self._script_call(keys, args))
        if type(checks) is Checks and not undoable:
            checks.packed = (self, packed)
        return packed

    def _script_call(self, keys: list[str], args: list[str | int]) -> tuple[str | int, ...]:
        """The command that runs the script (or ``function``) on ``keys`` with ``args``, both ways a batch is sent."""
        if self._function:
            return ("FCALL", self._function, len(keys), *keys, *args)
        return ("EVALSHA", self._sha, len(keys), *keys, *args)

    def _forget_started(self) -> None:
        """The script calls _start_many wrote on an event loop that is closed (asyncio.run after another): their
        replies will never be handled, so their permits and round trips are given up here (their connections
        went with their loop). A loop still open (the in-process limiter's own, beside its callers') hands its
        replies over itself."""
        for asking, loop in list(self._started.items()):
            if loop.is_closed():
                del self._started[asking]
                self._asked.pop(asking, None)
                self._permits.give()

    def _replied(self, requests: list[_Request], connection: WireConnection, flight: Flight[Decision | _Part],
                 asking: int, replies: list[Any] | None, error: Exception | None) -> None:
        """The reply to a script call ``_start_many`` wrote (or the connection failed): ``flight``'s answers."""
        del self._started[asking]
        del self._asked[asking]
        self._permits.give()
        if flight.done():
            connection.close()  # cut off (closed already, or the reply came just before: not read as the next's)
            return
        if error is not None:  # the connection broke: it says nothing of Redis (see _direct)
            connection.close()
            flight.landed(error)
            return
        assert replies is not None
        reply = replies[0]
        flight.uncut()  # the connection goes back: a cut-off from now on must not close it under another batch
        self._answered()  # an error reply too: Redis is there
        if self._closed or not self._current(connection):
            connection.close()
        else:
            self._idle.append(connection)
        if isinstance(reply, ResponseError):
            if isinstance(reply, NoScriptError) or (isinstance(reply, ReadOnlyError) and self._master is not None):
                self._send_again(requests, flight, reply, connection)
            else:
                flight.landed(reply)
            return
        try:
            # a request sent alone (under load nearly every call) read without _read_answers' loop
            answers = ([_read_decision(reply, 0, len(requests[0][0]))] if len(requests) == 1 and not requests[0][2]
                       else _read_answers(requests, reply, None))
        except Exception as exc:  # a reply not of the script's shape: the callers hear of it, as from _decide_many
            flight.landed(exc)
        else:
            flight.landed(answers)

    def _send_again(self, requests: list[_Request], flight: Flight[Decision | _Part], reply: ResponseError,
                    connection: WireConnection) -> None:
        """Nothing ran (see the module docstring): ``requests`` sent again the general way, with EVAL, or to the
        master the Sentinels name now (the once more: a second READONLY fails the batch, as in _execute)."""
        if isinstance(reply, ReadOnlyError) and self._master is not None:
            self._master.demoted(connection)
        again = asyncio.ensure_future(self._decide_many(requests, told=reply))
        self._resending.add(again)  # the loop keeps only weak references to tasks
        again.add_done_callback(self._resending.discard)
        again.add_done_callback(partial(_land, flight))
        # the batch cut off: its resend too (as a batch sent by _decide_many is), never sent once its callers were
        # told it failed, nor holding a permit and a round trip past the batch's bound; the connection given
        # back may be another batch's now
        flight.cut = again.cancel

    async def _decided(self, requests: list[_Request]) -> list[Decision]:
        """``_decide_many`` of requests that cannot be undone, where none can be unconfirmed (a cluster, or hits
        given back: they never admit with hits)."""
        decisions = []
        for answer in await self._decide_many(requests):
            if isinstance(answer, Unconfirmed):
                raise answer
            if not isinstance(answer, Decision):
                raise TypeError("a request that cannot be undone is answered with a Decision")
            decisions.append(answer)
        return decisions

    async def _eval(self, keys: list[str], args: list[str | int], until: float | None = None, *,
                    told: ResponseError | None = None) -> list[int]:
        """The script's reply; ``until`` (the event loop's time): a call not sent by then is not sent (on a cluster,
        TimeoutError waiting for a connection, or the CLUSTERDOWN or TRYAGAIN reply that kept it back).
        ``told``: the call was already answered (_replied) NOSCRIPT, so it goes with EVAL at once, or READONLY, so
        it is not sent again for another."""
        if until is None:
            await self._permits.take()
        else:
            async with asyncio.timeout_at(until):
                await self._permits.take()
        told_readonly = isinstance(told, ReadOnlyError)
        try:
            if not isinstance(told, NoScriptError):
                try:
                    return await self._execute(keys, until, *self._script_call(keys, args),
                                               told_readonly=told_readonly)
                except NoScriptError:
                    pass
            # Nothing ran. EVAL caches the script on the node that runs it (a new master after a failover).
            return await self._execute(keys, until, "EVAL", self._script, len(keys), *keys, *args,
                                       told_readonly=told_readonly)
        finally:
            self._permits.give()

    async def _execute(self, keys: list[str], until: float | None, *command: str | int,
                       told_readonly: bool = False) -> list[int]:
        asking = next(self._asking)
        self._asked[asking] = time.monotonic()
        self._watch.watch(asyncio.get_running_loop())
        try:
            try:
                return await self._round_trip(keys, command, until)
            except ReadOnlyError:
                if self._master is None or told_readonly:
                    raise
                # a replica, so nothing was written (see the module docstring): once more, to the master the
                # Sentinels name now (a second READONLY fails the call)
                return await self._round_trip(keys, command, until)
        finally:
            del self._asked[asking]

    async def _round_trip(self, keys: list[str], command: tuple[str | int, ...], until: float | None) -> list[int]:
        if self._router is not None:
            try:
                reply: list[int] = await self._router.execute(keys[0], *command, until=until)
            except ResponseError:
                self._answered()  # an error reply: Redis is there
                raise
            except STORAGE_ERRORS as exc:
                # redis-py's Cluster client does not say whether the connection was new: counted
                self._failed(_reason(exc))
                raise
            self._answered()
            return reply
        reply, _ = await self._direct(command, script=True)
        return reply

    async def _direct(self, command: tuple[str | int, ...], *, script: bool) -> tuple[Any, WireConnection]:
        """``command``'s reply on a connection of our own to the one Redis, or to Sentinel's master, and that
        connection (released: it tells which node answered). ``script``: a script call, followed by WAIT when
        wait_replicas is set, and counted for the breaker. Raises an error reply as its ResponseError."""
        # Batches are at most two at a time (each runs to its end, whoever waits for it), so two connections do;
        # redis-py opens them (slidegate.backends.redis_wire) and the calls skip its pool, retry, observability
        # and stream layers, two thirds of a call's cost on the event loop.
        loop = asyncio.get_running_loop()
        if self._idle and self._idle_loop is not loop:
            self._idle = []  # made on an event loop that is gone (asyncio.run after another): unusable here
        connection = self._idle.pop() if self._idle else None
        # after a Redis restart or CLIENT KILL it would fail a batch; to a master Sentinel no longer names, it
        # would write where the hits are lost
        while connection is not None and (connection.closed or not self._current(connection)):
            connection.close()
            connection = self._idle.pop() if self._idle else None
        if connection is None:
            try:
                # Sentinel's: connected to the master in use, which it still is (nothing awaited until the send)
                connection = await self._connect()
            except STORAGE_ERRORS as exc:
                if script:
                    self._failed(_reason(exc))  # no connection to be had: evidence that Redis is failing
                raise
        waits = script and bool(self._wait_replicas)
        try:
            # bounded by the batch's timeout (the Batcher cuts a batch off by cancelling it)
            replies = await connection.call(_pack(command) + self._wait if waits else _pack(command), 1 + waits)
        except BaseException:
            # cut off or broken mid-call (a killed connection fails its calls, but says nothing of Redis): a late
            # reply must never be read as the next call's
            connection.close()
            raise
        # an error reply (NOSCRIPT, READONLY; WAIT refused by a replica or an ACL): the connection is in step
        reply, acked = replies[0], replies[1] if waits else 0
        error = reply if isinstance(reply, ResponseError) else acked if isinstance(acked, ResponseError) else None
        if script:
            self._answered()  # an error reply too: Redis is there
        await self._release(connection, loop)
        if error is not None:
            if isinstance(error, ReadOnlyError) and self._master is not None:
                self._master.demoted(connection)
            raise error
        if waits and acked < self._wait_replicas:
            # the script ran and counted: not sent again, but its admissions not answered as if a failover
            # could not lose them (_decide_many)
            raise Unconfirmed(reply, f"{self.describe()}: the hits reached {acked} of {self._wait_replicas} "
                                     f"replicas within {self._wait_ms} ms (REDIS_WAIT_REPLICAS)")
        return reply, connection

    async def _connect(self) -> WireConnection:
        """A new connection, connected: to the one Redis, or to the master Sentinel names."""
        if self._master is not None:
            return await WireConnection.take_over(await self._master.connection())
        if self._pool is None:
            raise RuntimeError("a cluster's connections are redis-py's")
        connection: AbstractConnection = self._pool.make_connection()
        try:
            await connection.connect()
        except BaseException:
            await connection.disconnect(nowait=True)
            raise
        return await WireConnection.take_over(connection)

    def _current(self, connection: WireConnection) -> bool:
        return self._master is None or self._master.current(connection)

    def _answered(self) -> None:
        self._last_answer = time.monotonic()
        if self._breaker is not None:
            self._breaker.answered()

    def _failed(self, reason: str) -> None:
        if self._breaker is not None:
            self._breaker.failed(reason)

    async def _release(self, connection: WireConnection, loop: asyncio.AbstractEventLoop) -> None:
        if self._closed or not self._current(connection):
            await connection.aclose()
        else:
            self._idle.append(connection)
            self._idle_loop = loop

    async def ping(self) -> None:
        """Raise BackendUnavailable unless Redis (on a cluster: every master) answers PING in time (Sentinel's
        master: ROLE, as a master, _check_master). A ping that fails is tried once more, on another connection:
        a killed idle connection is no sign of Redis failing, and a second failure counts for the breaker.
        Takes no place of the calls': load cannot starve it."""
        for attempt in range(2):
            try:
                async with asyncio.timeout(self._timeout):
                    if self._router is not None:
                        await self._router.ping()
                    elif self._master is not None:
                        await self._check_master()
                    else:
                        await self._client.ping()
                    if not self._warm:
                        await self._warm_up()
                    if self._wait_replicas:
                        await self._check_replicas()
                return
            except STORAGE_ERRORS as exc:
                if attempt == 1:
                    self._failed(f"ping: {_reason(exc)}")
                    raise self._unavailable(exc) from exc

    async def _check_replicas(self) -> None:
        """Raise BackendUnavailable (no evidence for the breaker: Redis answers) when the master has fewer
        replicas than REDIS_WAIT_REPLICAS: every admission would then wait for WAIT and get the failure mode."""
        try:
            role, _ = await self._direct(("ROLE",), script=False)
        except NoPermissionError:
            return  # an ACL without ROLE: the failed WAITs tell
        replicas = len(role[2]) if role[0] in (b"master", "master") and len(role) > 2 else 0
        if replicas < self._wait_replicas:
            raise BackendUnavailable(f"{self.describe()}: {replicas} replicas connected; REDIS_WAIT_REPLICAS needs "
                                     f"{self._wait_replicas}, so no admission can be confirmed")

    async def _warm_up(self) -> None:
        """Make the first calls as quick as the next (the health ping does this before the service says it is
        serving): the script loaded on every master, and the two connections batches use opened (the first call
        to a cold service took 19 ms, past Envoy's default deadline of 20 ms with its own way there)."""
        if self._router is not None:
            await self._router.on_every_master("SCRIPT", "LOAD", self._script)
        else:
            await self._direct(("SCRIPT", "LOAD", self._script), script=False)
            loop = asyncio.get_running_loop()
            while len(self._idle) < 2:
                await self._release(await self._connect(), loop)
        self._warm = True

    async def _check_master(self) -> None:
        """Sentinel's master answers ROLE as a master (one that says it is a replica is forgotten, and the one
        the Sentinels name then is asked), on the connections the calls use. PING where an ACL refuses ROLE."""
        if self._role_refused:
            await self._direct(("PING",), script=False)
            return
        for _ in range(2):
            try:
                role, connection = await self._direct(("ROLE",), script=False)
            except NoPermissionError:
                log.warning("%s: ROLE is not allowed for this Redis user; the health ping cannot tell a demoted "
                            "master (READONLY replies still do)", self.describe())
                self._role_refused = True
                await self._direct(("PING",), script=False)
                return
            if role[0] in (b"master", "master"):
                return
            if self._master is not None:
                self._master.demoted(connection)  # the next connection asks the Sentinels
        raise ReadOnlyError("the node the Sentinels name says it is a replica")

    async def close(self) -> None:
        self._watch.stop()
        self._closed = True  # a call still running closes its connection itself
        if self._undoing:  # compensating calls still running: their hits would otherwise stay counted
            await asyncio.wait(set(self._undoing), timeout=self._timeout)
        if self._idle_loop is not asyncio.get_running_loop():
            self._idle = []  # their loop is gone, and their sockets with it
        for connection in self._idle:
            await connection.aclose()
        self._idle.clear()
        if self._master is not None:
            await self._master.close()
        await self._client.aclose()


def limit_args(c: Check) -> tuple[str | int, ...]:
    """A limit's arguments of lua/decide.lua: algorithm, its three parameters, hits, mode (for tools that write
    limits with the script themselves, as bench/scale.py does)."""
    return (c.algorithm.value, *c.params(), c.clamped_hits(), 2 if c.quota else int(c.shadow))


def _places(checks: Sequence[Check], side: Callable[[Check], RedisBackend]) -> list[Place]:
    """``checks`` grouped by where one script call decides them: the Redis ``side`` names for each, and on a
    cluster its hash slot (first-seen order)."""
    places: dict[tuple[int, int], Place] = {}
    for i, c in enumerate(checks):
        backend = side(c)
        place = places.setdefault((id(backend), backend._slot(c.key)), (backend, []))
        place[1].append(i)
    return list(places.values())


async def decide_spanning(checks: Sequence[Check], side: Callable[[Check], RedisBackend], now_us: int | None,
                          timeout: float | None, name: str) -> Decision:
    """``checks`` kept in several Redis (``side`` names each one's), all-or-nothing as on one: see
    ``_decide_across``. ``name`` describes them together in errors. Raises BackendUnavailable (a Redis whose
    breaker is open, or that has been silent too long, fails the request at once), DeadlineExceeded when
    ``timeout`` (shorter than the backends' own) ran out."""
    backends = list({id(b): b for b in map(side, checks)}.values())
    # a Redis that fails at once (its breaker open, or silent too long) fails its places, not the request: the
    # live one may still reject it, and a rejection must not be lost to the failure mode
    refused = {id(b): r for b in backends if (r := b._refusal(timeout)) is not None}
    if len(refused) == len(backends):
        raise next(iter(refused.values()))
    clock: str | int = "" if now_us is None else now_us
    own = max(b._timeout for b in backends)
    caller_first = timeout is not None and timeout < own
    bound = timeout if timeout is not None and caller_first else own
    try:
        async with asyncio.timeout(bound) as scope:
            return await _decide_across(checks, _places(checks, side), side, clock, scope, refused)
    except STORAGE_ERRORS as exc:  # a TimeoutError: _decide_across says which Redis failed otherwise
        if caller_first and isinstance(exc, TimeoutError):
            raise DeadlineExceeded(f"{name}: the caller's deadline ({timeout:.3f} s) ran out") from exc
        raise BackendUnavailable(f"{name}: {_reason(exc)}") from exc


async def _decide_across(checks: Sequence[Check], places: list[Place], side: Callable[[Check], RedisBackend],
                         clock: str | int, scope: asyncio.Timeout,
                         refused: Mapping[int, BackendUnavailable] | None = None) -> Decision:
    """``checks`` spanning several places (cluster slots, or Redis: see ``_places``), all-or-nothing: every place
    decides its checks so that it can be undone; when one rejects (or fails), the places that admitted are
    undone. Hits given back wait until every place has admitted (they never reject, and taking them again would
    not be exact). A place that rejects decides the request even when another fails (the failure mode must not
    admit what a limit refused); when a place fails and none rejects, raises its error (BackendUnavailable naming
    its Redis, or a TimeoutError), after undoing the others. A caller that stops waiting does not stop the undo:
    the places' answers are settled when they come. ``refused``: by id, the Redis that fail at once (not asked)."""
    giving = [i for i, c in enumerate(checks) if c.hits < 0]
    if len(giving) == len(checks):  # nothing can reject
        return await _decide_in_places(checks, places, clock)
    # a check-only shadow stands in for each give-back: the limit as it stands, never a rejection
    first = [c._replace(hits=0, shadow=True) if c.hits < 0 else c for c in checks]
    # quota limits may span places: each place evaluates them as shadows, and _settle applies the quota rule to
    # them all
    sent = [c._replace(shadow=True, quota=False) if c.quota else c for c in first]
    # shielded from the caller's deadline, so that what they did is settled; bounded by it all the same (a place's
    # call not sent by then is not sent at all, and counts as failed)
    until = scope.when()
    calls = asyncio.gather(*(_failed(refused[id(backend)]) if refused and id(backend) in refused
                             else backend._decide_undoable([sent[i] for i in group], clock, until)
                             for backend, group in places), return_exceptions=True)
    try:
        parts = await asyncio.shield(calls)
    except asyncio.CancelledError:
        calls.add_done_callback(partial(_settle_late, checks, first, places, clock))
        raise
    admitted, outcomes, undo, decided = _settle(checks, first, places, parts)
    if undo:
        await _give_back(undo, clock, scope)
    if not decided:
        for (backend, _), part in zip(places, parts, strict=True):
            if isinstance(part, BaseException):
                if isinstance(part, STORAGE_ERRORS) and not isinstance(part, TimeoutError):
                    raise backend._unavailable(part) from part
                raise part
    if admitted and giving:
        given = [checks[i] for i in giving]
        given_back = await _decide_in_places(given, _places(given, side), clock)
        for i, outcome in zip(giving, given_back.outcomes, strict=True):
            outcomes[i] = outcome
    return Decision(admitted, outcomes)


async def _decide_in_places(checks: Sequence[Check], places: list[Place], clock: str | int) -> Decision:
    """``checks`` that cannot reject (give-backs), one call per place."""
    decisions = await asyncio.gather(*(backend._decided([([checks[i] for i in group], clock, False)])
                                       for backend, group in places))
    outcomes: list[Outcome] = [Outcome(False, 0, 0)] * len(checks)
    for (_, group), [decision] in zip(places, decisions, strict=True):
        for i, outcome in zip(group, decision.outcomes, strict=True):
            outcomes[i] = outcome
    return Decision(all(d.admitted for [d] in decisions), outcomes)


async def _failed(error: BackendUnavailable) -> _Part:
    """A place of a Redis that fails at once: its answer is ``error``, without a call."""
    raise error


def _settle_late(checks: Sequence[Check], first: list[Check], places: list[Place], clock: str | int,
                 calls: asyncio.Future[list[_Part | BaseException]]) -> None:
    """The places of a request whose caller stopped waiting have answered: undo them unless all admitted."""
    if calls.cancelled():
        return
    _, _, undo, _ = _settle(checks, first, places, calls.result())
    for backend, items in undo.items():
        backend._start_undo(items, clock)


async def _give_back(undo: Undo, clock: str | int, scope: asyncio.Timeout) -> None:
    """Undo what ``undo``'s receipts name, waiting for it while the request's time lasts; a compensating call
    still running then goes on without it, one that fails is logged (its hits stay counted)."""
    tasks = {backend._start_undo(items, clock) for backend, items in undo.items()}
    deadline = scope.when()
    left = None if deadline is None else deadline - asyncio.get_running_loop().time() - 0.002
    if left is None or left > 0:
        await asyncio.wait(tasks, timeout=left)


def _read_answers(requests: Sequence[_Request], reply: list[int],
                  unconfirmed: Unconfirmed | None) -> list[Decision | _Part | Unconfirmed]:
    """Each request's answer in ``reply`` (lua/decide.lua: admitted and three values a limit, or a _Part for one
    that may be undone); ``unconfirmed`` instead for a request admitted with hits, when the writes did not reach
    REDIS_WAIT_REPLICAS replicas."""
    answers: list[Decision | _Part | Unconfirmed] = []
    at = 0
    for checks, _, undoable in requests:
        answer: Decision | _Part
        if undoable:
            answer, at = _read_part(reply, at, len(checks))
            decision = answer.decision
        else:
            answer = decision = _read_decision(reply, at, len(checks))
            at += 1 + 3 * len(checks)
        # admitted with hits that a failover would lose
        if unconfirmed is not None and decision.admitted and any(c.hits > 0 for c in checks):
            answers.append(unconfirmed)
        else:
            answers.append(answer)
    return answers


def _read_decision(reply: list[int], at: int, n: int) -> Decision:
    """The decision of a request of ``n`` limits starting at ``reply[at]`` (lua/decide.lua: admitted, then three
    values a limit), read positionally: keywords cost each of a call's outcomes their parsing."""
    if n == 1:  # most requests: without the comprehension's range and frame
        return Decision(bool(reply[at]), [Outcome(bool(reply[at + 1]), int(reply[at + 2]), int(reply[at + 3]))])
    return Decision(bool(reply[at]), [Outcome(bool(reply[i]), int(reply[i + 1]), int(reply[i + 2]))
                                      for i in range(at + 1, at + 1 + 3 * n, 3)])


def _land(flight: Flight[Any], done: asyncio.Future[Any]) -> None:
    """What ``done`` (a batch sent again) came to, told to ``flight``."""
    if done.cancelled():
        flight.landed(asyncio.CancelledError())
    elif (error := done.exception()) is not None:
        flight.landed(error)
    else:
        flight.landed(done.result())


def _read_part(reply: list[int], at: int, n: int) -> tuple[_Part, int]:
    """The answer to a request of ``n`` limits that may be undone, starting at ``reply[at]`` (lua/decide.lua:
    admitted, then seven values a limit), and where the next answer starts."""
    outcomes, unchanged, receipts = [], [], []
    for i in range(at + 1, at + 1 + 7 * n, 7):
        over, remaining, reset, before, before_reset, r1, r2 = (int(x) for x in reply[i:i + 7])
        outcomes.append(Outcome(bool(over), remaining, reset))
        unchanged.append(Outcome(False, before, before_reset))
        receipts.append((r1, r2) if r1 >= 0 else None)
    return _Part(Decision(bool(reply[at]), outcomes), unchanged, receipts), at + 1 + 7 * n


def _settle(checks: Sequence[Check], first: Sequence[Check], places: list[Place],
            parts: list[_Part | BaseException]) -> tuple[bool, list[Outcome], Undo, bool]:
    """What the places' answers (``parts``, one per place of ``first``: ``checks`` with each give-back a check)
    make of a request: whether it is admitted, an Outcome per check, what to undo in each Redis (the receipts
    of the places that admitted, when the request is not admitted), and whether the answers decide the request
    whatever the places that failed would have said (it is admitted, or rejected by what did answer)."""
    # backends.base.admits on the request's own checks, as Lua and the memory backend apply it: a give-back
    # (its stand-in a check-only shadow) is never over, and a quota give-back is a quota limit not over
    over = [False] * len(checks)
    answered = [False] * len(checks)
    for (_, group), part in zip(places, parts, strict=True):
        if isinstance(part, _Part):
            for i, outcome in zip(group, part.decision.outcomes, strict=True):
                over[i], answered[i] = outcome.over and checks[i].hits >= 0, True
    failed = not all(answered)
    admitted = not failed and admits(checks, over)
    quota = [i for i, c in enumerate(checks) if c.quota]
    decided = not failed or any(isinstance(p, _Part) and not p.decision.admitted for p in parts) or (
        bool(quota) and all(answered[i] and over[i] for i in quota))
    outcomes: list[Outcome] = [Outcome(False, 0, 0)] * len(checks)
    undo: Undo = {}
    for (backend, group), part in zip(places, parts, strict=True):
        if not isinstance(part, _Part):
            continue
        taken_back = set()
        if not admitted and part.decision.admitted:
            for i, receipt in zip(group, part.receipts, strict=True):
                if receipt is not None:
                    undo.setdefault(backend, []).append((first[i], receipt))
                    taken_back.add(first[i].key)
        for i, outcome, unchanged in zip(group, part.decision.outcomes, part.unchanged, strict=True):
            # a give-back, or hits taken back: the limit as if this request had not come
            outcomes[i] = unchanged if checks[i].hits < 0 or (first[i].key in taken_back and not outcome.over) \
                else outcome
    return admitted, outcomes, undo, decided


def _pack(command: tuple[str | int, ...]) -> bytes:
    """``command`` in the Redis protocol, packed by hiredis (redis-py's asyncio packer is pure Python and
    costs more than the round trip's own system calls); text that came from request bytes which are not
    UTF-8 goes back to those bytes."""
    args: Any = command  # its stubs declare a one-element tuple
    try:
        packed: bytes = hiredis.pack_command(args)
    except UnicodeEncodeError:  # only text from bytes that were not UTF-8: the rest is packed as it is
        args = tuple(a.encode("utf-8", "surrogateescape") if isinstance(a, str) else a for a in command)
        packed = hiredis.pack_command(args)
    return packed


def _reason(exc: BaseException) -> str:
    if isinstance(exc, AuthenticationError) and ("HELLO must be called" in str(exc) or "NOAUTH" in str(exc)):
        # Redis's own words for a missing password name a command the operator never sent
        return f"{type(exc).__name__}: Redis wants a password and none was given (set REDIS_AUTH)"
    return f"{type(exc).__name__}: {exc}" if str(exc) else f"{type(exc).__name__} (no answer in time)"
