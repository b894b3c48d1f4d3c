"""The statsd sink: what the stats store (slidegate.stats) counted, sent as envoyproxy/ratelimit's gostats client
sends it (lyft/gostats ``net_sink.go``, ``stats.go``, ``tags.go``), or to DogStatsD as its godogstats sink does
(``src/godogstats/``).

- Counters go every STATS_FLUSH_INTERVAL, each as ``name:N|c`` with the amount added since the last flush; a
  counter that did not change is not sent. Timers go every second (gostats' sink flushes its buffer every
  second), one ``name:V|ms`` line per value; they are the calls' times in whole milliseconds.
- Plain statsd goes over TCP by default (gostats' ``STATSD_PROTOCOL``), or UDP in datagrams of at most 1432
  bytes of whole lines; EXTRA_TAGS are written into the name as gostats does: ``.__key=value`` per tag, sorted
  by key, ``.``, ``:`` and ``|`` in a value replaced by ``_``.
- DogStatsD goes over UDP, with the tags as ``|#key:value,…`` (EXTRA_TAGS first, then a mogrifier's); a name
  may first be rewritten by the mogrifiers named in USE_DOG_STATSD_MOGRIFIERS: the first, in that order, whose
  PATTERN (a regular expression) matches gives the NAME and TAGS, where ``$N`` stands for the N-th group.
- Lines that cannot be sent (statsd down or slow: a connection is tried at most every 3 s, a write may take 1 s)
  are dropped, as gostats drops them, and the loss is logged at most once a minute.

Why no client library: the ``statsd`` package (jsocol/pystatsd, the maintained one) blocks on its sockets (a
statsd host that does not answer would stall the event loop, so every decision), encodes names as ASCII (a
request value with any other character in a detailed_metric key raises) and has no tags; ``datadog``'s
DogStatsd has no TCP. The line format itself is one line of code; what matters is sending without blocking,
which asyncio's streams and datagram endpoints do.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from slidegate.stats import StatsStore

log = logging.getLogger(__name__)

TIMER_FLUSH_SECONDS = 1.0  # gostats' net sink writes its buffer every second
UDP_PAYLOAD = 1432  # gostats' (and datadog-go's) datagram size: no fragmenting on a 1500-byte MTU
DIAL_TIMEOUT = 1.5  # gostats' defaultDialTimeout
WRITE_TIMEOUT = 1.0  # gostats' defaultWriteTimeout
RETRY_SECONDS = 3.0  # gostats' defaultRetryInterval
LOSS_LOG_EVERY = 60.0
_TAG_VALUE = str.maketrans({".": "_", ":": "_", "|": "_"})  # gostats' replaceChars
_GROUP = re.compile(r"\$(\d+)")


class Transport(enum.StrEnum):
    """How plain statsd is reached (STATSD_PROTOCOL)."""

    TCP = "tcp"
    UDP = "udp"


def parse_pairs(text: str) -> tuple[tuple[str, str], ...]:
    """``k1:v1,k2:v2`` (envconfig's map form, as envoyproxy/ratelimit reads EXTRA_TAGS and a mogrifier's TAGS)
    as (key, value) pairs; empty: none. Raises ValueError."""
    found = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition(":")
        if not sep or not key:
            raise ValueError(f"{item!r} is not key:value")
        found.append((key, value))
    return tuple(found)


@dataclass(frozen=True, slots=True)
class Mogrifier:
    """One DogStatsD mogrifier: a name ``pattern`` matches is renamed ``name`` and tagged with ``tags``, where
    ``$N`` stands for the pattern's N-th group (``$0``: the whole match)."""

    pattern: re.Pattern[str]
    name: str
    tags: tuple[tuple[str, str], ...]

    def apply(self, stat: str) -> tuple[str, list[str]] | None:
        """(new name, tags) when the pattern matches ``stat``, else None."""
        found = self.pattern.search(stat)
        if found is None:
            return None
        groups = [found.group(0), *(g or "" for g in found.groups())]

        def fill(template: str) -> str:
            return _GROUP.sub(lambda m: groups[int(m.group(1))] if int(m.group(1)) < len(groups) else "", template)

        return fill(self.name), [f"{key}:{fill(value)}" for key, value in self.tags]


def mogrifiers_from_env(names: Sequence[str], environ: Mapping[str, str]) -> tuple[Mogrifier, ...]:
    """The mogrifiers ``names`` (USE_DOG_STATSD_MOGRIFIERS), each from DOG_STATSD_MOGRIFIER_<NAME>_PATTERN,
    _NAME and _TAGS as the reference reads them. Raises ValueError naming what is missing or malformed."""
    found = []
    for name in names:
        prefix = f"DOG_STATSD_MOGRIFIER_{name}_"
        pattern, rename = environ.get(prefix + "PATTERN", ""), environ.get(prefix + "NAME", "")
        if not pattern:
            raise ValueError(f"no {prefix}PATTERN for mogrifier {name}")
        if not rename:
            raise ValueError(f"no {prefix}NAME for mogrifier {name}")
        try:
            compiled = re.compile(pattern)
            tags = parse_pairs(environ.get(prefix + "TAGS", ""))
        except (re.error, ValueError) as exc:
            raise ValueError(f"mogrifier {name}: {exc}") from exc
        if any(not value for _, value in tags):
            raise ValueError(f"mogrifier {name}: {prefix}TAGS has a tag with no value")
        found.append(Mogrifier(compiled, rename, tags))
    return tuple(found)


def _number(value: float) -> str:
    return str(int(value)) if value == int(value) else f"{value:f}"


class LineFormat:
    """How one stat becomes one line: plain statsd (tags in the name) or DogStatsD (``|#tags``, mogrifiers)."""

    def __init__(self, *, dog: bool, extra_tags: Sequence[tuple[str, str]] = (),
                 mogrifiers: Sequence[Mogrifier] = ()) -> None:
        tags = dict(extra_tags)  # a map, as the reference's: a key given twice keeps its last value
        self._tags = sorted((k, v.translate(_TAG_VALUE)) for k, v in tags.items() if k and v)
        self._dog = dog
        self._mogrifiers = tuple(mogrifiers)
        self._names: dict[str, tuple[str, str]] = {}  # stat → (name as sent, what follows the value's kind)

    def _name(self, stat: str) -> tuple[str, str]:
        known = self._names.get(stat)
        if known is not None:
            return known
        if not self._dog:
            known = (stat + "".join(f".__{k}={v}" for k, v in self._tags), "")
        else:
            name, tags = stat, [f"{k}:{v}" for k, v in self._tags]
            for mogrifier in self._mogrifiers:
                applied = mogrifier.apply(stat)
                if applied is not None:
                    name, tags = applied[0], tags + applied[1]
                    break
            known = (name, f"|#{','.join(tags)}" if tags else "")
        self._names[stat] = known
        return known

    def counter(self, stat: str, amount: int) -> str:
        name, tags = self._name(stat)
        return f"{name}:{amount}|c{tags}"

    def timer(self, stat: str, milliseconds: float) -> str:
        name, tags = self._name(stat)
        return f"{name}:{_number(milliseconds)}|ms{tags}"


class StatsdSink:
    """Sends ``store``'s counters every ``flush_interval`` seconds and its timers every second to
    ``host:port`` over ``transport``, in ``line_format``."""

    def __init__(self, store: StatsStore, host: str, port: int, transport: Transport, flush_interval: float,
                 line_format: LineFormat) -> None:
        self._store = store
        self._host, self._port = host, port
        self._transport = transport
        self._interval = flush_interval
        self._format = line_format
        self._writer: asyncio.StreamWriter | None = None
        self._datagrams: asyncio.DatagramTransport | None = None
        self._retry_at = 0.0
        self._lost = 0  # lines dropped since the last line of the log
        self._logged_at: float | None = None

    def describe(self) -> str:
        return f"statsd {self._transport.value}://{self._host}:{self._port}"

    def lines(self, counters: bool) -> list[str]:
        """The lines of one flush: every timer value, and with ``counters`` every counter that changed."""
        out = [self._format.timer(name, value) for name, value in self._store.take_timers()]
        if counters:
            out.extend(self._format.counter(name, amount) for name, amount in self._store.take_counters())
        return out

    async def run(self, stop: asyncio.Event) -> None:
        """Flush until ``stop`` is set, then once more (everything counted so far) and close."""
        loop = asyncio.get_running_loop()
        tick = min(TIMER_FLUSH_SECONDS, self._interval)
        next_counters = loop.time() + self._interval
        try:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), tick)
                now = loop.time()
                with_counters = stop.is_set() or now >= next_counters
                if with_counters:
                    next_counters = now + self._interval
                await self.send(self.lines(with_counters))
        finally:
            await self.close()

    async def send(self, lines: list[str]) -> None:
        """Send ``lines`` (each ends with a newline, as gostats writes them); drop them when statsd cannot take
        them now."""
        if not lines:
            return
        if self._transport is Transport.UDP:
            await self._send_udp(lines)
        else:
            await self._send_tcp("".join(line + "\n" for line in lines).encode(), len(lines))

    async def _send_tcp(self, payload: bytes, count: int) -> None:
        writer = self._writer
        if writer is None:
            if time.monotonic() < self._retry_at:
                self._drop(count, "not connected")
                return
            try:
                connection = await asyncio.wait_for(asyncio.open_connection(self._host, self._port), DIAL_TIMEOUT)
            except (OSError, TimeoutError) as exc:
                self._retry_at = time.monotonic() + RETRY_SECONDS
                self._drop(count, f"cannot connect: {_reason(exc)}")
                return
            writer = self._writer = connection[1]
        try:
            writer.write(payload)
            await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT)
        except (OSError, TimeoutError) as exc:
            self._writer = None
            # abort, not close: close waits to flush what statsd never reads, and the socket and its buffer would
            # stay behind with every reconnect
            writer.transport.abort()
            self._retry_at = time.monotonic() + RETRY_SECONDS
            self._drop(count, f"write failed: {_reason(exc)}")

    async def _send_udp(self, lines: list[str]) -> None:
        if self._datagrams is None:
            try:
                self._datagrams, _ = await asyncio.get_running_loop().create_datagram_endpoint(
                    asyncio.DatagramProtocol, remote_addr=(self._host, self._port))
            except OSError as exc:
                self._drop(len(lines), f"cannot resolve or open: {exc}")
                return
        packet: list[bytes] = []
        size = 0
        for line in lines:
            data = (line + "\n").encode()
            if packet and size + len(data) > UDP_PAYLOAD:
                self._datagrams.sendto(b"".join(packet))
                packet, size = [], 0
            packet.append(data)
            size += len(data)
        if packet:
            self._datagrams.sendto(b"".join(packet))

    def _drop(self, count: int, reason: str) -> None:
        self._lost += count
        now = time.monotonic()
        if self._logged_at is None or now - self._logged_at >= LOSS_LOG_EVERY:
            log.warning("stats not sent to %s (%s): %d lines dropped", self.describe(), reason, self._lost)
            self._lost, self._logged_at = 0, now

    async def close(self) -> None:
        if self._writer is not None:
            writer, self._writer = self._writer, None
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        if self._datagrams is not None:
            self._datagrams.close()
            self._datagrams = None


def _reason(exc: BaseException) -> str:
    return str(exc) or ("timed out" if isinstance(exc, TimeoutError) else type(exc).__name__)
