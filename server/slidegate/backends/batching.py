"""Natural batching: calls that arrive while earlier ones are at Redis travel together in the next round trip.

No timer decides when a batch leaves (a timer-based coalescer lost 20% of throughput on this kind of machine;
docs/performance.md says what limits a call): a call is sent at once when fewer than ``max_in_flight`` batches are
out, and otherwise waits for one of them to return, when everything waiting leaves as one batch. An idle
service therefore answers with no added latency, and a busy one sends fewer, larger round trips — each saves
the client's fixed per-command cost, the main cost of a Redis call from Python.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, Generic, TypeVar

from slidegate.backends.deadlines import LATE_TIMER, Deadlines

Item = TypeVar("Item")
Result = TypeVar("Result")


class Batcher(Generic[Item, Result]):
    """Sends items through ``send`` (items → one result each, in order, an exception for an item that failed
    alone; may raise for the whole batch) in natural batches.

    ``batch_timeout``: seconds a batch may take before it is cut off (its task cancelled) and its callers
    still waiting get TimeoutError (LATE_TIMER more, once, when the cut-off itself came late: this process was
    held up, and Redis's answer may be waiting unread); None: no bound.
    ``on_cut_off`` is called for each batch cut off. A batch carries items of ``max_weight`` at most together
    (by ``weight``), so that a few heavy items cannot make every other item's round trip long; an item heavier
    than that goes alone, and only one such batch is out at a time (it takes a free place before the light items
    waiting, never more), so that light items always have a place of their own: two heavy requests in flight
    had every 20 ms caller behind them late.

    ``start``, when given, sends a batch without a task of its own: it writes the batch at once and returns a
    future of its results (cancelled when the batch is cut off), or None when it cannot, and the batch then goes
    through ``send``. A task and the awaits that carry a batch through it cost each batch two more turns of the
    event loop, a measured part of a call's cost (docs/performance.md)."""

    def __init__(self, send: Callable[[list[Item]], Awaitable[Sequence[Result | Exception]]], max_in_flight: int = 2,
                 batch_timeout: float | None = None, on_cut_off: Callable[[], object] = lambda: None,
                 weight: Callable[[Item], int] = lambda _: 1, max_weight: int = 2**31,
                 start: Callable[[list[Item]], asyncio.Future[Sequence[Result | Exception]] | None] | None = None,
                 ) -> None:
        self._send = send
        self._start = start
        self._max_in_flight = max_in_flight
        self._weight = weight
        self._max_weight = max_weight
        self._batch_timeout = batch_timeout
        self._on_cut_off = on_cut_off
        self._in_flight = 0
        self._heavy_in_flight = False
        self._waiting: list[tuple[Item, asyncio.Future[Result], int]] = []  # with each item's weight
        self._tasks: set[asyncio.Task[None]] = set()
        self._deadlines = Deadlines()

    async def submit(self, item: Item, timeout: float | None = None, *, grace: bool = False,
                     settle: bool = False) -> Result:
        """``item``'s result, or the exception its batch raised; TimeoutError once ``timeout`` seconds have
        passed (with ``grace``, LATE_TIMER more when that moment itself came late, as for a batch: right for the
        backend's own bound, wrong for a caller's deadline). A caller that stops waiting (cancelled, timed out)
        before its batch leaves is not sent at all; once sent, its batch runs to the end (or to
        ``batch_timeout``). With ``settle``, ``timeout`` only bounds the wait to be sent: once sent, the item's
        result is awaited whatever the time (until ``batch_timeout``), for a caller that must know what it did
        (an answer it could not undo)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Result] = loop.create_future()
        if timeout is not None and timeout <= 0:
            raise TimeoutError
        due = loop.time()  # before the item may be sent: its time counts from here
        weight = self._weight(item)
        alone = (not self._waiting and self._in_flight < self._max_in_flight
                 and (weight <= self._max_weight or not self._heavy_in_flight))
        if alone:
            # the common case, what _flush would do with this item alone, without its scans of the items waiting
            self._send_batch(loop, [(item, future, weight)], weight > self._max_weight)
        else:
            self._waiting.append((item, future, weight))
            if self._in_flight < self._max_in_flight:
                self._flush(loop)
        if timeout is not None:
            # still waiting, the item is the last one: nothing was added since, and a flush keeps the order
            sent = alone or not (self._waiting and self._waiting[-1][1] is future)
            # sent at once, an item's own deadline is its batch's (settled: none) unless it comes sooner; a
            # deadline fewer is a heap entry and a timer check fewer on every call
            if not sent or not (settle or (grace and self._batch_timeout is not None
                                           and timeout >= self._batch_timeout)):
                due += timeout
                self._deadlines.add(loop, due, partial(self._expire, loop, future, due, grace, settle), future.done)
        return await future

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        most = self._max_weight
        while self._in_flight < self._max_in_flight:
            waiting = [entry for entry in self._waiting if not entry[1].done()]
            heavy = None
            if not self._heavy_in_flight:
                for n, entry in enumerate(waiting):
                    if entry[2] > most:
                        heavy = n
                        break
            if heavy is not None:
                batch = [waiting.pop(heavy)]
            else:
                batch, rest, weight = [], [], 0
                for entry in waiting:
                    w = entry[2]
                    if w > most or (batch and weight + w > most):
                        rest.append(entry)
                    else:
                        batch.append(entry)
                        weight += w
                waiting = rest
            self._waiting = waiting
            if not batch:
                return
            self._send_batch(loop, batch, heavy is not None)

    def _send_batch(self, loop: asyncio.AbstractEventLoop, batch: list[tuple[Item, asyncio.Future[Result], int]],
                    heavy: bool) -> None:
        """Send ``batch`` in a free place (``heavy``: an item heavier than ``max_weight``, alone)."""
        self._in_flight += 1
        self._heavy_in_flight = self._heavy_in_flight or heavy
        expired: list[bool] = []
        try:
            started = self._start([item for item, _, _ in batch]) if self._start is not None else None
        except Exception as exc:  # as from ``send``: its callers hear of it, and its place is free again
            self._failed(batch, expired, exc)
            self._in_flight -= 1
            self._heavy_in_flight = self._heavy_in_flight and not heavy
            return
        work: asyncio.Future[Any]
        if started is not None:
            started.add_done_callback(partial(self._landed, loop, batch, expired, heavy))
            work = started
        else:
            task = loop.create_task(self._run(batch, expired, heavy))
            self._tasks.add(task)  # the loop keeps only weak references to tasks
            task.add_done_callback(self._tasks.discard)
            work = task
        if self._batch_timeout is not None:
            due = loop.time() + self._batch_timeout
            self._deadlines.add(loop, due, partial(self._cut_off, loop, work, expired, due, True), work.done)

    async def _run(self, batch: list[tuple[Item, asyncio.Future[Result], int]], expired: list[bool],
                   heavy: bool) -> None:
        try:
            results = await self._send([item for item, _, _ in batch])
        except BaseException as exc:
            self._failed(batch, expired, exc)
            if not isinstance(exc, Exception) and not expired:
                raise
        else:
            self._answer(batch, results)
        finally:
            self._sent(asyncio.get_running_loop(), heavy)

    def _landed(self, loop: asyncio.AbstractEventLoop, batch: list[tuple[Item, asyncio.Future[Result], int]],
                expired: list[bool], heavy: bool, started: asyncio.Future[Sequence[Result | Exception]]) -> None:
        """A batch ``start`` sent has its results, or was cut off (cancelled)."""
        try:
            if started.cancelled():
                self._failed(batch, expired, asyncio.CancelledError())
            elif (error := started.exception()) is not None:
                self._failed(batch, expired, error)
            else:
                self._answer(batch, started.result())
        finally:
            self._sent(loop, heavy)

    @staticmethod
    def _answer(batch: list[tuple[Item, asyncio.Future[Result], int]], results: Sequence[Result | Exception]) -> None:
        for (_, future, _), result in zip(batch, results, strict=True):
            if future.done():
                continue
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)

    @staticmethod
    def _failed(batch: list[tuple[Item, asyncio.Future[Result], int]], expired: list[bool],
                exc: BaseException) -> None:
        # cut off at batch_timeout: for its callers, a timeout like any other
        error = TimeoutError() if expired else exc
        for _, future, _ in batch:
            if not future.done():
                if isinstance(error, asyncio.CancelledError):
                    future.cancel()
                else:
                    future.set_exception(error)

    def _sent(self, loop: asyncio.AbstractEventLoop, heavy: bool) -> None:
        """A batch is back (answered, failed or cut off): its place goes to the items waiting."""
        self._in_flight -= 1
        if heavy:
            self._heavy_in_flight = False
        if self._waiting:
            self._flush(loop)

    def _cut_off(self, loop: asyncio.AbstractEventLoop, task: asyncio.Future[Any], expired: list[bool], due: float,
                 grace: bool) -> None:
        if task.done():
            return
        now = loop.time()
        if grace and now - due > LATE_TIMER:
            # the loop did not run for a while: an answer that came meanwhile is read before the batch is judged
            self._deadlines.add(loop, now + LATE_TIMER, partial(self._cut_off, loop, task, expired, now, False),
                                task.done)
            return
        expired.append(True)
        task.cancel()
        self._on_cut_off()

    def _expire(self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[Result], due: float,
                grace: bool, settle: bool) -> None:
        if future.done():
            return
        if settle and not any(waiting is future for _, waiting, _ in self._waiting):
            return  # sent: its batch settles it (a scan, but only of an item whose time ran out)
        now = loop.time()
        if grace and now - due > LATE_TIMER:
            self._deadlines.add(loop, now + LATE_TIMER, partial(self._expire, loop, future, now, False, settle),
                                future.done)
            return
        future.set_exception(TimeoutError())
