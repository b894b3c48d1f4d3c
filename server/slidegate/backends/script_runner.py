"""One Lua script run on a transport (slidegate.backends.transport), for decisions and quota ledgers alike:
EVALSHA (or FCALL of a Redis function), EVAL after a NOSCRIPT reply, each call within a permit of the
connections' (slidegate.backends.permits) and told to the Silence as a round trip at Redis.

A NOSCRIPT reply (after SCRIPT FLUSH, a Redis restart, or a failover to a node that never saw the script) means
the script did not run, so sending it again with EVAL cannot count a hit twice; EVAL caches it on the node that
ran it. Nothing else is sent again here (a transport may send a call that ran nowhere to another node).
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from redis.exceptions import NoScriptError, ReadOnlyError, ResponseError

from slidegate.backends.permits import Permits
from slidegate.backends.silence import Silence
from slidegate.backends.transport import Transport


def ran_nowhere(reply: ResponseError, follows_master: bool) -> bool:
    """Whether the error reply to a script call means it ran nowhere and may be sent again: NOSCRIPT, or
    READONLY from a master the Sentinels demoted (``follows_master``)."""
    return isinstance(reply, NoScriptError) or (follows_master and isinstance(reply, ReadOnlyError))


class ScriptRunner:
    """``script`` (or the Redis function ``function``, FCALL with the same keys and arguments) on ``transport``."""

    def __init__(self, transport: Transport, script: str, *, permits: Permits, silence: Silence,
                 function: str = "") -> None:
        self._transport = transport
        self._script = script
        self._sha = hashlib.sha1(script.encode()).hexdigest()
        self._function = function
        self._permits = permits
        self._silence = silence

    def command(self, keys: list[str], args: list[str | int]) -> tuple[str | int, ...]:
        """The command that runs the script on ``keys`` with ``args`` (also what a batch writes itself)."""
        if self._function:
            return ("FCALL", self._function, len(keys), *keys, *args)
        return ("EVALSHA", self._sha, len(keys), *keys, *args)

    async def run(self, keys: list[str], args: list[str | int], until: float | None = None, *,
                  told: ResponseError | None = None) -> Any:
        """The script's reply; ``until`` (the event loop's time): a call not sent by then is not sent (a
        TimeoutError waiting for a permit, or the transport's). ``told``: the error reply a first send of this
        call already had (ran_nowhere): NOSCRIPT, so it goes with EVAL at once, or READONLY, so the transport
        does not send it to another node again. Raises the transport's errors."""
        if until is None:
            await self._permits.take()
        else:
            async with asyncio.timeout_at(until):
                await self._permits.take()
        once = isinstance(told, ReadOnlyError)
        try:
            if not isinstance(told, NoScriptError):
                try:
                    return await self._send(keys[0], self.command(keys, args), until, once)
                except NoScriptError:
                    pass
            return await self._send(keys[0], ("EVAL", self._script, len(keys), *keys, *args), until, once)
        finally:
            self._permits.give()

    async def _send(self, key: str, command: tuple[str | int, ...], until: float | None, once: bool) -> Any:
        asking = self._silence.ask(asyncio.get_running_loop())
        try:
            return await self._transport.execute(key, command, until, once=once)
        finally:
            self._silence.forget(asking)

    async def load(self) -> None:
        """Load the script on every master (the first calls then need no EVAL)."""
        await self._transport.on_every_master("SCRIPT", "LOAD", self._script)
