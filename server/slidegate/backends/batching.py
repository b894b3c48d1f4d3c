"""Natural batching: calls that arrive while earlier ones are at Redis travel together in the next round trip.

No timer decides when a batch leaves (a timer-based coalescer lost 20% of throughput on this kind of machine,
see the README's benchmark section): a call is sent at once when fewer than ``max_in_flight`` batches are
out, and otherwise waits for one of them to return, when everything waiting leaves as one batch. An idle
service therefore answers with no added latency, and a busy one sends fewer, larger round trips — each saves
the client's fixed per-command cost, the main cost of a Redis call from Python.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


class Batcher(Generic[Item, Result]):
    """Sends items through ``send`` (items → one result each, in order; may raise) in natural batches."""

    def __init__(self, send: Callable[[list[Item]], Awaitable[list[Result]]], max_in_flight: int = 2) -> None:
        self._send = send
        self._max_in_flight = max_in_flight
        self._in_flight = 0
        self._waiting: list[tuple[Item, asyncio.Future[Result]]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, item: Item) -> Result:
        """``item``'s result, or the exception its batch raised. A caller that stops waiting (cancelled,
        timed out) before its batch leaves is not sent at all; once sent, its batch runs to the end."""
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        if self._in_flight < self._max_in_flight:
            self._flush()
        return await future

    def _flush(self) -> None:
        batch = [(item, future) for item, future in self._waiting if not future.done()]
        self._waiting = []
        if batch:
            self._in_flight += 1
            task = asyncio.get_running_loop().create_task(self._run(batch))
            self._tasks.add(task)  # the loop keeps only weak references to tasks
            task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: list[tuple[Item, asyncio.Future[Result]]]) -> None:
        try:
            results = await self._send([item for item, _ in batch])
        except BaseException as exc:
            for _, future in batch:
                if not future.done():
                    if isinstance(exc, asyncio.CancelledError):
                        future.cancel()
                    else:
                        future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            for (_, future), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(result)
        finally:
            self._in_flight -= 1
            if self._waiting:
                self._flush()
