"""What a Redis was sent, seen from outside: its MONITOR stream, read up to a mark of our own.

Tests that must know what slidegate sent (one script call for a batch, the arguments of a call) read it here
rather than from the backend's insides.
"""

from __future__ import annotations

import re
import uuid
from types import TracebackType

import redis

_ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')  # MONITOR quotes each argument, escaping as a C string


class Monitor:
    """``with Monitor(url) as seen: ...; seen.commands()``: every command the Redis at ``url`` ran since the
    ``with`` began (the script's own calls left out), each as its arguments, in the order Redis ran them.
    ``commands`` marks the stream with an ECHO of its own and reads up to it, so everything sent before the call
    is in, whatever the timing; call it once the traffic to be seen has been answered."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._client = redis.Redis.from_url(url)
        self._monitor = self._client.monitor()

    def __enter__(self) -> Monitor:
        self._monitor.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._monitor.__exit__(kind, error, trace)
        self._client.close()

    def commands(self) -> list[list[str]]:
        mark = f"monitor-mark-{uuid.uuid4().hex}"
        with redis.Redis.from_url(self._url) as other:
            other.echo(mark)
        seen: list[list[str]] = []
        while True:
            line = self._monitor.connection.read_response()
            text = line.decode("utf-8", "replace") if isinstance(line, bytes) else str(line)
            # 1700000000.123456 [0 127.0.0.1:5000] "EVALSHA" "…" …
            head, _, command = text.partition("] ")
            args = [bytes(a, "utf-8").decode("unicode_escape") for a in _ARG.findall(command)]
            if args == ["ECHO", mark]:
                return seen
            if not head.endswith(" lua") and args:
                seen.append(args)
