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

from slidegate.backends.deadlines import LATE_TIMER, Alarm, Deadlines

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
    than that goes alone, in a place of its own beside the ``max_in_flight`` of the light items, one at a time:
    two heavy requests in flight had every 20 ms caller behind them late, and one taking a light item's place
    left a single place to light batches, each waiting at Redis behind a heavy script, so that a light item
    arriving waited for two of them (3% of the 20 ms callers late beside eight callers of 1,000 limits).

    ``start``, when given, sends a batch without a task of its own: it writes the batch's items at once and
    returns True, then tells the Flight it was given what became of them (``Flight.landed``, from the code that
    read the reply) and keeps ``Flight.cut`` set to what stops the batch when it is cut off; or it returns False
    when it cannot, and the batch goes through ``send``. A task, and the futures and awaits that would carry a
    batch's reply to its callers, cost each call about a fifth of its event-loop CPU under load
    (docs/performance.md)."""

    def __init__(self, send: Callable[[list[Item]], Awaitable[Sequence[Result | Exception]]], max_in_flight: int = 2,
                 batch_timeout: float | None = None, on_cut_off: Callable[[], object] = lambda: None,
                 weight: Callable[[Item], int] = lambda _: 1, max_weight: int = 2**31,
                 start: Callable[[list[Item], Flight[Result]], bool] | None = None,
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
        # The batches out, by their ``expired`` (alive as long as they are): when each is due, and what it is; and
        # the deadlines of the callers whose item ``send`` sent at once, alone, by their future: (due, future,
        # grace, settle). Each is forgotten as its batch lands, and one timer sweeps the few left (at the earliest
        # due) instead of a deadline each: a deadline outlived its call by the whole timeout, and under load the
        # thousands alive cost each call about 10 µs of event-loop CPU (measured side by side; in one process, 1-2).
        self._out: dict[int, tuple[float, asyncio.Future[Any] | Flight[Result], list[bool]]] = {}
        self._callers: dict[int, tuple[float, asyncio.Future[Result], bool, bool]] = {}
        self._sweeper = Alarm(self._sweep)
        self._sweeper_loop: asyncio.AbstractEventLoop | None = None

    @property
    def in_flight(self) -> int:
        """The batches of light items out now (at most ``max_in_flight``; a heavy one's place is its own)."""
        return self._in_flight

    def kept(self) -> int:
        """The entries kept for calls now: the bounds of the batches out, the deadlines of the callers whose
        item went alone, and the other deadlines not yet dropped (slidegate.backends.deadlines); 0 once every
        call has landed and its deadlines have gone."""
        return len(self._out) + len(self._callers) + len(self._deadlines)

    async def submit(self, item: Item, timeout: float | None = None, *, grace: bool = False,
                     settle: bool = False) -> Result:
        """``item``'s result: ``send``'s future, awaited."""
        return await self.send(item, timeout, grace=grace, settle=settle)

    def send(self, item: Item, timeout: float | None = None, *, grace: bool = False,
             settle: bool = False) -> asyncio.Future[Result]:
        """A future of ``item``'s result, or of the exception its batch raised; TimeoutError once ``timeout``
        seconds have passed (with ``grace``, LATE_TIMER more when that moment itself came late, as for a batch:
        right for the backend's own bound, wrong for a caller's deadline). A caller that stops waiting (cancels the
        future, or its ``timeout`` ran out) before its batch leaves is not sent at all; once sent, its batch runs to
        the end (or to ``batch_timeout``). With ``settle``, ``timeout`` only bounds the wait to be sent: once sent,
        the item's result is awaited whatever the time (until ``batch_timeout``), for a caller that must know what
        it did (an answer it could not undo); so too with ``grace`` and a ``timeout`` no shorter than ``batch_timeout``
        (the wait for a place is not time at Redis). Raises TimeoutError at once for a ``timeout`` that has run out."""
        if timeout is not None and timeout <= 0:
            raise TimeoutError
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Result] = loop.create_future()
        due = loop.time()  # before the item may be sent: its time counts from here
        weight = self._weight(item)
        alone = not self._waiting and (self._in_flight < self._max_in_flight if weight <= self._max_weight
                                       else not self._heavy_in_flight)
        lone = None
        if alone:
            # the common case, what _flush would do with this item alone, without its scans of the items waiting
            lone = self._send_batch(loop, [(item, future, weight)], weight > self._max_weight, [item])
        else:
            self._waiting.append((item, future, weight))
            if self._in_flight < self._max_in_flight or not self._heavy_in_flight:
                self._flush(loop)
        if timeout is not None:
            # still waiting, the item is the last one: nothing was added since, and a flush keeps the order
            sent = alone or not (self._waiting and self._waiting[-1][1] is future)
            # an item whose own deadline is no sooner than its batch's (the backend's bound) or that is settled
            # is bounded by its batch once sent: the wait for a place is not time at Redis (a heavy request
            # behind another one was failed as if Redis were slow). Sent at once, it keeps no deadline: a
            # deadline fewer is a heap entry and a timer check fewer on every call
            bounded = settle or (grace and self._batch_timeout is not None and timeout >= self._batch_timeout)
            if not sent or not bounded:
                due += timeout
                if lone is not None:
                    if not future.done():  # forgotten when its flight lands (Lone.landed)
                        self._arm(loop, due)
                        self._callers[id(future)] = (due, future, grace, settle)
                else:
                    self._deadlines.add(loop, due, partial(self._expire, loop, future, due, grace, bounded),
                                        future.done)
        return future

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        """Send what waits and has a place: the light items first, so that at Redis they come before the heavy
        item sent with them (a heavy script holds Redis for milliseconds, and every light batch behind it)."""
        most = self._max_weight
        waiting = [entry for entry in self._waiting if not entry[1].done()]
        while self._in_flight < self._max_in_flight:
            batch: list[tuple[Item, asyncio.Future[Result], int]] = []
            rest: list[tuple[Item, asyncio.Future[Result], int]] = []
            weight = 0
            for entry in waiting:
                w = entry[2]
                if w > most or (batch and weight + w > most):
                    rest.append(entry)
                else:
                    batch.append(entry)
                    weight += w
            self._waiting = waiting = rest
            if not batch:
                break
            self._send_batch(loop, batch, False)
        if not self._heavy_in_flight:
            for n, entry in enumerate(self._waiting):
                if entry[2] > most and not entry[1].done():
                    del self._waiting[n]
                    self._send_batch(loop, [entry], True)
                    return

    def _send_batch(self, loop: asyncio.AbstractEventLoop, batch: list[tuple[Item, asyncio.Future[Result], int]],
                    heavy: bool, items: list[Item] | None = None) -> Lone[Result] | None:
        """Send ``batch`` in a free place (``heavy``: an item heavier than ``max_weight``, alone; ``items``: its
        items, when the caller has them). Its flight when it is one item that ``start`` sent."""
        if heavy:
            self._heavy_in_flight = True
        else:
            self._in_flight += 1
        expired: list[bool] = []
        work: asyncio.Future[Any] | Flight[Result]
        flight = None
        try:
            if self._start is not None:
                # a Lone flight's caller deadline is forgotten as it lands (see ``_callers``)
                flight = (Flight(partial(self._sent, loop, heavy, expired), batch, expired) if len(batch) > 1
                          else Lone(partial(self._sent, loop, heavy, expired, id(batch[0][1])), batch, expired))
                if not self._start([item for item, _, _ in batch] if items is None else items, flight):
                    flight = None
        except Exception as exc:  # as from ``send``: its callers hear of it, and its place is free again
            if flight is not None:
                flight.abandon()  # whatever ``start`` did with it before it raised: its place is given back here
            _fail(batch, expired, exc)
            self._back(heavy)
            return None
        if flight is not None:
            work = flight
        else:
            task = loop.create_task(self._run(batch, expired, heavy))
            self._tasks.add(task)  # the loop keeps only weak references to tasks
            task.add_done_callback(self._tasks.discard)
            work = task
        if self._batch_timeout is not None and not work.done():
            due = loop.time() + self._batch_timeout
            self._arm(loop, due)
            self._out[id(expired)] = (due, work, expired)
        return flight if isinstance(flight, Lone) else None

    def _arm(self, loop: asyncio.AbstractEventLoop, due: float) -> None:
        """Sweep at ``due`` (GRANULARITY later) unless a sweep comes sooner; before what is due is kept (a change of
        event loop forgets what was)."""
        if self._sweeper_loop is not loop:  # used from another event loop: the old one's calls went with it
            self._sweeper.cancel()
            self._out, self._callers, self._sweeper_loop = {}, {}, loop
        self._sweeper.arm(loop, due)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        """Cut off the batches out past their due, fail the callers past theirs, and wait for the next due."""
        now = loop.time()
        due_now: list[Callable[[], None]] = []
        for key, (due, work, expired) in list(self._out.items()):
            if due <= now:
                del self._out[key]
                due_now.append(partial(self._cut_off, loop, work, expired, due, True))
        for key, (due, future, grace, settle) in list(self._callers.items()):
            if due <= now:
                del self._callers[key]
                due_now.append(partial(self._expire, loop, future, due, grace, settle))
        try:
            for callback in due_now:
                try:
                    callback()
                except Exception as exc:  # one failing must not keep the others, nor the next sweep, from coming
                    loop.call_exception_handler({"message": "a batch's cut-off failed", "exception": exc})
        finally:
            dues = [due for due, _, _ in self._out.values()] + [due for due, _, _, _ in self._callers.values()]
            if dues:
                self._arm(loop, min(dues))

    async def _run(self, batch: list[tuple[Item, asyncio.Future[Result], int]], expired: list[bool],
                   heavy: bool) -> None:
        try:
            results = await self._send([item for item, _, _ in batch])
        except BaseException as exc:
            _fail(batch, expired, exc)
            if not isinstance(exc, Exception) and not expired:
                raise
        else:
            _answer(batch, results)
        finally:
            self._sent(asyncio.get_running_loop(), heavy, expired)

    def _sent(self, loop: asyncio.AbstractEventLoop, heavy: bool, expired: list[bool], caller: int = 0) -> None:
        """A batch is back (answered, failed or cut off): its place goes to the items waiting; ``caller``: the key
        in ``_callers`` of a Lone flight's caller, forgotten with it. (``_back`` inlined: this runs for every
        batch.)"""
        self._out.pop(id(expired), None)
        if caller:
            self._callers.pop(caller, None)
        if heavy:
            self._heavy_in_flight = False
        else:
            self._in_flight -= 1
        if self._waiting:
            self._flush(loop)

    def _back(self, heavy: bool) -> None:
        """A batch's place is free again."""
        if heavy:
            self._heavy_in_flight = False
        else:
            self._in_flight -= 1

    def _cut_off(self, loop: asyncio.AbstractEventLoop, task: asyncio.Future[Any] | Flight[Result],
                 expired: list[bool], due: float, grace: bool) -> None:
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


class Flight(Generic[Result]):
    """A batch that ``start`` sent without a task, until it lands: ``landed`` with its results (one per item, an
    exception for an item that failed alone) or the exception that failed it all, once; or cut off by the Batcher
    (``cancel``, as a task would be), which calls ``cut`` — what ``start`` set to stop it (close its connection)
    — and ignores what lands after."""

    __slots__ = ("_back", "_batch", "_expired", "_over", "cut")

    def __init__(self, back: Callable[[], None], batch: list[tuple[Any, asyncio.Future[Result], int]],
                 expired: list[bool]) -> None:
        self._back = back  # the Batcher's: the batch's place goes to the items waiting
        self._batch = batch
        self._expired = expired
        self._over = False
        self.cut: Callable[[], object] = _nothing

    def done(self) -> bool:
        return self._over

    def landed(self, results: Sequence[Result | Exception] | BaseException) -> None:
        """The batch's results, or the exception that failed it; its place goes to the items waiting."""
        if self._over:
            return  # cut off already: its callers were told
        self._over = True
        # what may still hold this flight (a late cut-off's second look, the connection's close) keeps no items
        batch, self._batch = self._batch, []
        try:
            if isinstance(results, BaseException):
                _fail(batch, self._expired, results)
            else:
                _answer(batch, results)
        finally:
            self._back()

    def abandon(self) -> None:
        """Over without landing: what lands later is ignored, nothing is cut (its batch's place and callers are
        seen to by whoever abandons it)."""
        self._over = True
        self.cut = _nothing

    def uncut(self) -> None:
        """Nothing stops the batch any more (its reply came: the connection it was on may be another's now)."""
        self.cut = _nothing

    def cancel(self) -> None:
        """Cut off: stopped (``cut``), its callers failed (TimeoutError once the Batcher marked it expired)."""
        if self._over:
            return
        try:
            self.cut()
        finally:
            self.landed(asyncio.CancelledError())


class Lone(Flight[Result]):
    """A Flight of one item that ``send`` sent at once (under load nearly every batch): its caller's own deadline,
    if it has one, is kept by the Batcher until the flight lands (its ``back`` forgets it)."""

    __slots__ = ()


def _nothing() -> None:
    pass


def _answer(batch: list[tuple[Item, asyncio.Future[Result], int]], results: Sequence[Result | Exception]) -> None:
    """Each caller still waiting gets its item's result (an exception: it failed alone)."""
    for (_, future, _), result in zip(batch, results, strict=True):
        if future.done():
            continue
        if isinstance(result, Exception):
            future.set_exception(result)
        else:
            future.set_result(result)


def _fail(batch: list[tuple[Item, asyncio.Future[Result], int]], expired: list[bool], exc: BaseException) -> None:
    # cut off at batch_timeout: for its callers, a timeout like any other
    error = TimeoutError() if expired else exc
    for _, future, _ in batch:
        if not future.done():
            if isinstance(error, asyncio.CancelledError):
                future.cancel()
            else:
                future.set_exception(error)
