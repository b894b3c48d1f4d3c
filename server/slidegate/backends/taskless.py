"""The common case of a batch's script call, without a task: written at once on an idle connection of our own,
its answers told to the batch's Flight (slidegate.backends.batching) by the callback that reads the reply. A
task, and the futures and awaits that would carry the reply to its callers, cost each call about a fifth of its
event-loop CPU under load (docs/performance.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from redis.exceptions import ReadOnlyError, ResponseError

from slidegate.backends.base import Decision
from slidegate.backends.batching import Flight
from slidegate.backends.permits import Permits
from slidegate.backends.redis_connections import Connections
from slidegate.backends.redis_wire import WireConnection
from slidegate.backends.script_codec import Part, Request, Unconfirmed, read_answers, read_decision
from slidegate.backends.script_runner import ran_nowhere
from slidegate.backends.silence import Silence

Resend = Callable[[list[Request], ResponseError], Awaitable[list[Decision | Part | Unconfirmed]]]


class TasklessCalls:
    """Batches of ``requests`` written by ``start`` (the Batcher's), each as ``packed`` makes it, on
    ``connections`` with a permit of ``permits``; ``silence`` hears of their round trips. A batch answered
    NOSCRIPT, or READONLY by a demoted Sentinel master, ran nowhere: ``resend`` sends it the general way."""

    def __init__(self, connections: Connections, permits: Permits, silence: Silence,
                 packed: Callable[[list[Request]], bytes], resend: Resend) -> None:
        self._connections = connections
        self._permits = permits
        self._silence = silence
        self._packed = packed
        self._resend = resend
        self._resending: set[asyncio.Future[list[Decision | Part | Unconfirmed]]] = set()
        # calls written whose reply has not been handled, by their round trip's number (each holds a permit and a
        # round trip of the silence's), with their loop: once it is closed, _replied never runs for them
        self._started: dict[int, asyncio.AbstractEventLoop] = {}
        self._started_loop: asyncio.AbstractEventLoop | None = None  # the last call's

    def start(self, requests: list[Request], flight: Flight[Decision | Part]) -> bool:
        """Write the batch, or return False (the Batcher then sends it with a task): no idle connection on this
        loop to use (one to make, or to drop), no permit free, or several clocks in one batch (tests' only)."""
        loop = asyncio.get_running_loop()
        if self._started and self._started_loop is not loop:
            self._forget_started()
        clock = requests[0][1]
        if len(requests) > 1 and any(request[1] != clock for request in requests):
            return False
        connection = self._connections.take_idle(loop)
        if connection is None:
            return False
        if not self._permits.take_now():
            self._connections.keep(connection)
            return False
        packed = self._packed(requests)
        asking = self._silence.ask(loop)
        self._started[asking] = self._started_loop = loop
        # cut off (no answer within the timeout): a late reply must never be read as the next call's. Only while
        # the reply is awaited: once it came, _replied gives the connection back (or closes it) and sets what
        # cuts the batch off then
        flight.cut = connection.close
        connection.send(packed, partial(self._replied, requests, connection, flight, asking))
        return True

    def _forget_started(self) -> None:
        """The calls written on an event loop that is closed (asyncio.run after another): their replies will
        never be handled, so their permits and round trips are given up here (their connections went with their
        loop). A loop still open (the in-process limiter's own, beside its callers') hands its replies over."""
        for asking, loop in list(self._started.items()):
            if loop.is_closed():
                del self._started[asking]
                self._silence.forget(asking)
                self._permits.give()

    def _replied(self, requests: list[Request], connection: WireConnection, flight: Flight[Decision | Part],
                 asking: int, replies: list[Any] | None, error: Exception | None) -> None:
        """The reply to a call ``start`` wrote (or the connection failed): ``flight``'s answers."""
        del self._started[asking]
        self._silence.forget(asking)
        self._permits.give()
        if flight.done():
            connection.close()  # cut off (closed already, or the reply came just before: not read as the next's)
            return
        if error is not None:  # the connection broke: it says nothing of Redis (see Connections.execute)
            connection.close()
            flight.landed(error)
            return
        assert replies is not None
        reply = replies[0]
        flight.uncut()  # the connection goes back: a cut-off from now on must not close it under another batch
        self._silence.answered()  # an error reply too: Redis is there
        self._connections.keep(connection)
        if isinstance(reply, ResponseError):
            if ran_nowhere(reply, self._connections.follows_master):
                self._send_again(requests, flight, reply, connection)
            else:
                flight.landed(reply)
            return
        try:
            # a request sent alone (under load nearly every call) read without read_answers' loop
            answers = ([read_decision(reply, 0, len(requests[0][0]))] if len(requests) == 1 and not requests[0][2]
                       else read_answers(requests, reply, None))
        except Exception as exc:  # a reply not of the script's shape: the callers hear of it, as from a task's
            flight.landed(exc)
        else:
            flight.landed(answers)

    def _send_again(self, requests: list[Request], flight: Flight[Decision | Part], reply: ResponseError,
                    connection: WireConnection) -> None:
        """Nothing ran: ``requests`` sent again the general way, with EVAL, or to the master the Sentinels name
        now (the once more: a second READONLY fails the batch)."""
        if isinstance(reply, ReadOnlyError):
            self._connections.demoted(connection)
        again = asyncio.ensure_future(self._resend(requests, reply))
        self._resending.add(again)  # the loop keeps only weak references to tasks
        again.add_done_callback(self._resending.discard)
        again.add_done_callback(partial(_land, flight))
        # the batch cut off: its resend too (as a batch sent with a task is), never sent once its callers were
        # told it failed, nor holding a permit and a round trip past the batch's bound; the connection given
        # back may be another batch's now
        flight.cut = again.cancel


def _land(flight: Flight[Any], done: asyncio.Future[Any]) -> None:
    """What ``done`` (a batch sent again) came to, told to ``flight``."""
    if done.cancelled():
        flight.landed(asyncio.CancelledError())
    elif (error := done.exception()) is not None:
        flight.landed(error)
    else:
        flight.landed(done.result())
