"""Where the quota ledgers live: Redis (lua/quota.lua, one atomic call per report through the script runner,
shared by every replica) or this process's memory (slidegate.quotas.ledger itself). Both keep the same books
(tests compare them)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from slidegate.backends.base import BackendUnavailable
from slidegate.backends.breaker import Breaker
from slidegate.backends.permits import Permits
from slidegate.backends.redis_connect import Topology
from slidegate.backends.redis_errors import STORAGE_ERRORS, reason
from slidegate.backends.script_runner import ScriptRunner
from slidegate.backends.silence import Silence
from slidegate.backends.transport import open_transport
from slidegate.quotas import ledger
from slidegate.quotas.ledger import Assignment, HolderTaken
from slidegate.resources import resource_dir


@dataclass(frozen=True, slots=True)
class Quota:
    """A global quota: the ledger's storage ``key``, ``limit`` requests per ``window_ms``."""

    key: str
    limit: int
    window_ms: int


# how many holders go back at once: each its own script call (a ledger is one key, each in its own slot on a
# cluster), at most the permits' at Redis; a stream's hundreds of buckets in a few rounds, each short enough
# not to hold other streams' reports back for long
GIVE_BACK_BATCH = 128


@dataclass(frozen=True, slots=True)
class Departure:
    """A holder whose stream ended: released, or, with ``owner`` (that stream), detached for its Envoy's next
    stream; ``unsure`` as for release and detach."""

    quota: Quota
    holder: str
    unsure: int = 0
    owner: str = ""


class QuotaStorage(Protocol):
    async def report(self, quota: Quota, holder: str, allowed: int, denied: int, elapsed_ms: int, owner: str,
                     now_ms: int | None = None) -> Assignment:
        """Book ``holder``'s report from the stream ``owner``; return its bucket from now on
        (slidegate.quotas.ledger.report). ``now_ms`` overrides the storage's clock (tests). Raises HolderTaken
        when another stream reports it, BackendUnavailable on a storage failure (or a refusal: the storage is
        known to be failing)."""
        ...

    async def release(self, quota: Quota, holder: str, unsure: int = 0, now_ms: int | None = None) -> None:
        """``holder`` went away (slidegate.quotas.ledger.release)."""
        ...

    async def detach(self, quota: Quota, holder: str, owner: str, unsure: int = 0) -> None:
        """``owner``'s stream of ``holder`` ended; another may take it up (slidegate.quotas.ledger.detach)."""
        ...

    async def give_back(self, departures: Sequence[Departure]) -> list[Exception]:
        """Release or detach every holder of ``departures``, as a call each would (in few round trips); the
        storage failures, one per holder it may not have taken back (none: every one went)."""
        ...

    async def booked(self, quota: Quota, now_ms: int | None = None) -> int:
        """What ``quota``'s ledger books now, in thousandths of a request."""
        ...

    async def warm(self) -> None:
        """Be ready to answer a first report at once (a connection open, the script loaded). Raises on a
        storage failure."""
        ...

    async def close(self) -> None: ...


class MemoryQuotas:
    """Ledgers in this process's memory (BACKEND_TYPE=memory: one replica), on the monotonic clock (a wall clock
    stepping forward would end bookings early). A ledger nobody reported to for its lifetime (as
    lua/quota.lua's key expiry) is dropped."""

    def __init__(self, clock: Callable[[], int] = lambda: time.monotonic_ns() // 1_000_000) -> None:
        self._clock = clock
        self._ledgers: dict[str, tuple[dict[str, str], int]] = {}
        self._calls = 0

    def _state(self, quota: Quota, now: int) -> dict[str, str]:
        self._calls += 1
        if self._calls % 1024 == 0:  # sweep now and then: ledgers of quotas nobody uses any more
            for key in [k for k, (_, until) in self._ledgers.items() if until <= now]:
                del self._ledgers[key]
        state, until = self._ledgers.get(quota.key, ({}, 0))
        return state if until > now else {}

    def _keep(self, quota: Quota, state: dict[str, str], now: int) -> None:
        self._ledgers[quota.key] = (state, now + ledger.LEASE_MS + ledger.TTL_MS + ledger.SLACK_MS + quota.window_ms)

    async def report(self, quota: Quota, holder: str, allowed: int, denied: int, elapsed_ms: int, owner: str,
                     now_ms: int | None = None) -> Assignment:
        now = self._clock() if now_ms is None else now_ms
        state = self._state(quota, now)
        assignment = ledger.report(state, quota.limit, quota.window_ms, holder, allowed, denied, elapsed_ms, now,
                                   owner)
        self._keep(quota, state, now)
        return assignment

    async def release(self, quota: Quota, holder: str, unsure: int = 0, now_ms: int | None = None) -> None:
        now = self._clock() if now_ms is None else now_ms
        state = self._state(quota, now)
        ledger.release(state, quota.window_ms, holder, now, unsure)
        self._keep(quota, state, now)

    async def detach(self, quota: Quota, holder: str, owner: str, unsure: int = 0) -> None:
        now = self._clock()
        state = self._state(quota, now)
        ledger.detach(state, quota.window_ms, holder, owner, now, unsure)
        self._keep(quota, state, now)

    async def give_back(self, departures: Sequence[Departure]) -> list[Exception]:
        for d in departures:
            if d.owner:
                await self.detach(d.quota, d.holder, d.owner, d.unsure)
            else:
                await self.release(d.quota, d.holder, d.unsure)
        return []

    async def booked(self, quota: Quota, now_ms: int | None = None) -> int:
        now = self._clock() if now_ms is None else now_ms
        return ledger.booked(self._state(quota, now), quota.window_ms, now)

    async def warm(self) -> None:
        pass

    def state(self, key: str) -> dict[str, str]:
        """A ledger's fields (tests)."""
        return dict(self._ledgers.get(key, ({}, 0))[0])

    def ledgers(self) -> dict[str, dict[str, str]]:
        """Every ledger kept, by its quota's key, each a copy of its fields: what the Redis storage's hashes
        would hold (a ledger past its lifetime may still be here until the next sweep)."""
        return {key: dict(state) for key, (state, _) in self._ledgers.items()}

    async def close(self) -> None:
        self._ledgers.clear()


class RedisQuotas:
    """Ledgers in Redis, one hash per quota, changed by lua/quota.lua (Redis TIME: one clock for every
    replica), run by the script runner on the topology's transport as the decisions are. Calls queue for one of
    ``pool_size`` places at Redis without a deadline, then may take ``timeout`` seconds there; ``breaker``:
    calls fail at once while Redis is failing (slidegate.backends.breaker), as do calls while Redis has been
    silent longer than ``timeout`` (Silence.refusal), at the head of the queue. Every failure is a
    BackendUnavailable."""

    def __init__(self, topology: Topology, *, timeout: float, pool_size: int = 8,
                 breaker: Breaker | None = None) -> None:
        self._name = f"quotas at {topology.describe()}"
        self._timeout = timeout
        self._silence = Silence(self._name, breaker)
        self._transport = open_transport(topology, timeout=timeout, pool_size=pool_size, silence=self._silence)
        script = (resource_dir("lua") / "quota.lua").read_text(encoding="utf-8")
        self._runner = ScriptRunner(self._transport, script, permits=Permits(pool_size), silence=self._silence)
        # a report waits here untimed: the ledger books it at Redis's clock when the script runs, so time in the
        # queue costs its answer nothing, and a healthy Redis must book every bucket of thousands reported at
        # once (measured: 29 streams of 150 buckets, 1033 calls timed out waiting for a permit, each bucket
        # answered by the failure mode and the breaker opened on a healthy Redis)
        self._queue = asyncio.Semaphore(pool_size)
        self._warm = False

    async def warm(self) -> None:
        # the first answer of a new bucket is awaited by every request Envoy lets through meanwhile
        if self._warm:
            return
        try:
            async with asyncio.timeout(self._timeout):
                await self._transport.ping()
                await self._runner.load()
        except STORAGE_ERRORS as exc:
            raise self._unavailable(exc) from exc
        self._warm = True

    def _unavailable(self, exc: BaseException) -> BackendUnavailable:
        return BackendUnavailable(f"{self._name}: {reason(exc)}")

    async def _call(self, quota: Quota, *args: str | int) -> Any:
        async with self._queue:
            return await self._run(quota, list(args))

    async def _run(self, quota: Quota, args: list[str | int]) -> Any:
        # asked at the head of the queue: behind a Redis that stopped answering, the queue drains at once (and
        # once the breaker opens, at every call) instead of a timeout per place at Redis in turn
        refusal = self._silence.refusal(self._timeout)
        if refusal is not None:
            raise refusal
        # a Redis that stops answering (paused, a network black hole) must not hold a stream's answers forever
        try:
            async with asyncio.timeout(self._timeout):
                return await self._runner.run([quota.key], args)
        except TimeoutError as exc:
            self._silence.failed(f"no answer within {self._timeout * 1000:.0f} ms")
            raise self._unavailable(exc) from exc
        except STORAGE_ERRORS as exc:
            raise self._unavailable(exc) from exc

    async def report(self, quota: Quota, holder: str, allowed: int, denied: int, elapsed_ms: int, owner: str,
                     now_ms: int | None = None) -> Assignment:
        reply = await self._call(quota, "report", "" if now_ms is None else now_ms, quota.limit, quota.window_ms,
                                 holder, allowed, denied, elapsed_ms, owner)
        if int(reply[0]) < 0:
            raise HolderTaken(holder)
        return Assignment(int(reply[0]), int(reply[1]), int(reply[2]))

    async def release(self, quota: Quota, holder: str, unsure: int = 0, now_ms: int | None = None) -> None:
        await self._call(quota, "release", "" if now_ms is None else now_ms, quota.limit, quota.window_ms, holder,
                         unsure)

    async def detach(self, quota: Quota, holder: str, owner: str, unsure: int = 0) -> None:
        await self._call(quota, "detach", "", quota.limit, quota.window_ms, holder, owner, unsure)

    async def give_back(self, departures: Sequence[Departure]) -> list[Exception]:
        # a call per holder, GIVE_BACK_BATCH at once (the permits bound those at Redis): awaited one by one, each
        # would cost a round trip, which thousands of holders of streams ending at once would wait for in turn
        failed: list[Exception] = []
        for start in range(0, len(departures), GIVE_BACK_BATCH):
            batch = departures[start:start + GIVE_BACK_BATCH]
            replies = await asyncio.gather(*(self._depart(d) for d in batch), return_exceptions=True)
            for reply in replies:
                if isinstance(reply, BackendUnavailable):
                    failed.append(reply)
                elif isinstance(reply, BaseException):
                    raise reply
        return failed

    async def _depart(self, d: Departure) -> None:
        if d.owner:
            await self.detach(d.quota, d.holder, d.owner, d.unsure)
        else:
            await self.release(d.quota, d.holder, d.unsure)

    async def booked(self, quota: Quota, now_ms: int | None = None) -> int:
        return int(await self._call(quota, "booked", "" if now_ms is None else now_ms, quota.limit,
                                    quota.window_ms))

    async def close(self) -> None:
        self._silence.stop()
        await self._transport.close()
