"""The stats each server sends while bench/compare.py runs: a statsd listener over TCP (the reference's gostats
client speaks TCP, and slidegate's plain statsd does by default) that sums each counter, and the comparison of
two listeners' sums, counter by counter (timers and gauges vary by run, so only counters are compared)."""

from __future__ import annotations

import socketserver
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any


class _Lines(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        listener: StatsdListener = self.server.listener  # type: ignore[attr-defined]
        for raw in self.rfile:
            listener.take(raw.decode("utf-8", "replace").strip())


class StatsdListener:
    """A statsd server on a free loopback port, in a thread of its own; ``counters`` are the sums so far."""

    def __init__(self) -> None:
        self.counters: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Lines)
        self.server.daemon_threads = True
        self.server.listener = self  # type: ignore[attr-defined]
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def take(self, line: str) -> None:
        name, _, rest = line.rpartition(":")
        value, _, kind = rest.partition("|")
        if name and kind.startswith("c"):
            with self.lock:
                self.counters[name] += int(float(value))

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return dict(self.counters)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def stat_differences(a: dict[str, int], b: dict[str, int], prefixes: tuple[str, ...]) -> Iterator[tuple[str, Any, Any]]:
    """(name, A's sum, B's sum) for every counter under ``prefixes`` whose sums differ (a counter one of them
    never sent is None there). A limit's near_limit and over_limit go together, as
    ``<limit>.near_limit+over_limit`` with (near, over) sums: how the hits of a request going over its limit
    are split between the two is one difference."""
    told = set()
    for name in sorted(set(a) | set(b)):
        if not name.startswith(prefixes) or a.get(name) == b.get(name):
            continue
        base, _, leaf = name.rpartition(".")
        if leaf not in ("near_limit", "over_limit"):
            yield name, a.get(name), b.get(name)
        elif base not in told:
            told.add(base)
            pair = f"{base}.near_limit", f"{base}.over_limit"
            yield f"{base}.near_limit+over_limit", [a.get(n, 0) for n in pair], [b.get(n, 0) for n in pair]
