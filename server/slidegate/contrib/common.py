"""What the Django and ASGI middleware share: options, the client IP, the descriptors built from a request,
and the answers (429 with a JSON body, or the informational headers).

Options (Django: the ``SLIDEGATE`` setting; ASGI: keyword arguments, lower case):

``DOMAIN`` (required); ``MODE``: ``remote`` (ask the service at ``TARGET``, host:port) or ``in-process``
(slidegate's limiter here: ``CONFIG_DIR``, and ``REDIS_URL`` or none for memory; ``KEY_PREFIX``);
``PATHS``: path prefixes to limit (empty: all); ``DESCRIPTORS``: a list of descriptors, each a list of entry
sources — ``client`` (``("user", id)`` when authenticated, else ``("remote_address", ip)``), ``user`` (skipped
for anonymous users), ``remote_address``, ``path``, ``method``, ``header:<Name>`` (skipped when absent),
``generic:<value>``; ``TRUSTED_PROXIES``: networks (CIDR) whose ``X-Forwarded-For`` is believed — from any
other peer it is ignored, or any client could pick its own bucket; ``FAILURE_MODE``: ``open`` (let requests
through) or ``closed`` (answer 503) when the limiter cannot answer within ``TIMEOUT`` seconds.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter

from slidegate.client import Decision, DescriptorSpec

log = logging.getLogger("slidegate.contrib")
FAILURES = Counter("slidegate_middleware_failures", "requests the rate limiter could not decide",
                   ["failure_mode"])
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Options:
    """The middleware options (see the module docstring). Build with ``Options.parse``."""

    domain: str
    mode: str = "remote"
    target: str = "127.0.0.1:8081"
    config_dir: str = ""
    redis_url: str | None = None
    key_prefix: str = ""
    paths: tuple[str, ...] = ()
    descriptors: tuple[tuple[str, ...], ...] = (("client",),)
    trusted_proxies: tuple[Network, ...] = ()
    failure_mode: str = "open"
    timeout: float = 0.25
    clock: Callable[[], int] | None = field(default=None, repr=False)  # in-process mode, for tests

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> Options:
        """Options from a mapping with keys in any case. Raises ValueError naming a bad option."""
        values = {str(k).lower(): v for k, v in raw.items()}
        if len(values) < len(raw):
            raise ValueError("slidegate middleware: an option is given twice (in different case)")
        unknown = set(values) - {f.name for f in cls.__dataclass_fields__.values()}
        if unknown:
            raise ValueError(f"unknown slidegate middleware option(s): {', '.join(sorted(unknown))}")
        if not values.get("domain"):
            raise ValueError("slidegate middleware: DOMAIN is required")
        if values.get("mode", "remote") not in ("remote", "in-process"):
            raise ValueError("slidegate middleware: MODE must be 'remote' or 'in-process'")
        if values.get("failure_mode", "open") not in ("open", "closed"):
            raise ValueError("slidegate middleware: FAILURE_MODE must be 'open' or 'closed'")
        if values.get("mode") == "in-process" and not values.get("config_dir"):
            raise ValueError("slidegate middleware: MODE 'in-process' needs CONFIG_DIR")
        def strings(name: str, default: Any) -> tuple[str, ...]:
            value = values.get(name, default)
            if isinstance(value, str) or not all(isinstance(v, str) for v in value or ()):
                raise ValueError(f"slidegate middleware: {name.upper()} must be a list of strings")
            return tuple(value or ())

        if not isinstance(values["domain"], str):
            raise ValueError("slidegate middleware: DOMAIN must be a string")
        values["paths"] = strings("paths", ())
        raw_descriptors = values.get("descriptors", (("client",),))
        if isinstance(raw_descriptors, str) or not raw_descriptors or not all(
                isinstance(d, list | tuple) and d and all(isinstance(s, str) for s in d) for d in raw_descriptors):
            raise ValueError("slidegate middleware: DESCRIPTORS must be a non-empty list of non-empty lists of "
                             "sources")
        values["descriptors"] = tuple(tuple(d) for d in raw_descriptors)
        for source in (s for d in values["descriptors"] for s in d):
            known = source in ("client", "user", "remote_address", "path", "method")
            if not known and not (source.startswith(("header:", "generic:")) and source.partition(":")[2]):
                raise ValueError(f"slidegate middleware: unknown descriptor source {source!r}")
        try:
            values["trusted_proxies"] = tuple(ipaddress.ip_network(n, strict=False)
                                              for n in strings("trusted_proxies", ()))
        except ValueError as exc:
            raise ValueError(f"slidegate middleware: TRUSTED_PROXIES: {exc}") from exc
        timeout = values.get("timeout", 0.25)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= 60:
            raise ValueError("slidegate middleware: TIMEOUT must be a number of seconds, more than 0, at most 60")
        target = values.get("target", "127.0.0.1:8081")
        host, sep, port = str(target).rpartition(":")
        if values.get("mode", "remote") == "remote" and (not sep or not host or "/" in target or not port.isdigit()):
            raise ValueError(f"slidegate middleware: TARGET must be host:port, got {target!r}")
        return cls(**values)


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """An address from a peer or X-Forwarded-For entry: ``1.2.3.4``, ``1.2.3.4:5678``, ``2001:db8::1``,
    ``[2001:db8::1]:443``; IPv4-mapped IPv6 (``::ffff:10.0.0.5``) as IPv4. None for anything else."""
    text = text.strip()
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def client_ip(peer: str, forwarded_for: str | None, trusted: Sequence[Network]) -> str:
    """The client address: the TCP peer, unless it is a trusted proxy; then the last address of
    X-Forwarded-For (several header lines joined with commas, in order) that is not a trusted proxy, walking
    right to left as each proxy appends the address it saw. Garbage in the header counts as an untrusted
    hop that cannot be used: the answer is then the nearest trusted proxy, never an address the client
    wrote where a trusted proxy should have."""
    peer_ip = _address(peer)

    def is_trusted(ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None) -> bool:
        return ip is not None and any(ip in network for network in trusted)

    if peer_ip is None:
        return peer  # e.g. a Unix socket: nothing better to go by
    if not forwarded_for or not is_trusted(peer_ip):
        return str(peer_ip)
    nearest = peer_ip
    for hop in reversed([h for h in forwarded_for.split(",") if h.strip()]):
        ip = _address(hop)
        if not is_trusted(ip):
            return str(ip) if ip is not None else str(nearest)
        nearest = ip  # type: ignore[assignment]  # trusted, so not None
    return str(nearest)


@dataclass(frozen=True)
class RequestView:
    """What the descriptors are built from, whatever the framework."""

    path: str
    method: str
    headers: Mapping[str, str]  # lower-case names
    client_ip: str
    user_id: str | None


MAX_VALUE = 256  # characters: a longer value is sent as its digest (see _sendable)


def _sendable(value: str) -> str:
    """``value`` as sent to the service: as it is, unless it is longer than MAX_VALUE or not UTF-8 (a path's
    undecodable bytes): then ``#`` and its SHA-256, so that a client cannot make its request too large to be
    decided (past the service's message size, gRPC refuses it and the middleware would fail open) nor
    unsendable. A value that itself starts with ``#`` gets one more ``#``: a digest is ``#`` and a hex digit, an
    escaped value ``##``, so no value sent stands for two others."""
    if len(value) > MAX_VALUE or (not value.isascii() and not _utf8(value)):
        return "#" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()
    return "#" + value if value.startswith("#") else value


def _utf8(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def build_descriptors(options: Options, view: RequestView) -> list[DescriptorSpec]:
    """The descriptors for one request; a descriptor whose source is missing (no such header, anonymous
    ``user``) is left out, as Envoy does. Values are sent as _sendable makes them (long ones as a digest)."""
    return [[(key, _sendable(value)) for key, value in entries] for entries in _descriptors(options, view)]


def _descriptors(options: Options, view: RequestView) -> list[list[tuple[str, str]]]:
    out: list[list[tuple[str, str]]] = []
    for sources in options.descriptors:
        entries: list[tuple[str, str]] = []
        for source in sources:
            if source == "client":
                entries.append(("user", view.user_id) if view.user_id else ("remote_address", view.client_ip))
            elif source == "user":
                if view.user_id is None:
                    break
                entries.append(("user", view.user_id))
            elif source == "remote_address":
                entries.append(("remote_address", view.client_ip))
            elif source == "path":
                entries.append(("path", view.path))
            elif source == "method":
                entries.append(("method", view.method))
            elif source.startswith("header:"):
                name = source.removeprefix("header:").lower()
                if name not in view.headers:
                    break
                entries.append((name, view.headers[name]))
            else:
                entries.append(("generic_key", source.removeprefix("generic:")))
        else:
            out.append(entries)
    return out


def applies(options: Options, path: str) -> bool:
    return not options.paths or any(path.startswith(prefix) for prefix in options.paths)


@dataclass(frozen=True)
class Answer:
    """What the middleware does: ``status`` None lets the request through with ``headers`` added; otherwise
    it answers ``status`` with ``body`` (JSON) and ``headers``."""

    status: int | None
    headers: list[tuple[str, str]]
    body: bytes = b""


def answer(decision: Decision) -> Answer:
    if decision.allowed:
        return Answer(None, decision.headers())
    body = json.dumps({"error": "rate limited", "retry_after": decision.retry_after}).encode()
    return Answer(429, [*decision.headers(), ("Content-Type", "application/json")], body)


_last_warning = [0.0, 0]  # time of the last warning, failures since


def failure(options: Options, reason: str) -> Answer:
    """The configured answer when the limiter could not decide (counted; logged at most every 10 s)."""
    FAILURES.labels(options.failure_mode).inc()
    _last_warning[1] += 1
    if time.monotonic() - _last_warning[0] >= 10:
        log.warning("rate limiter unavailable (%s; %d requests): failing %s", reason, _last_warning[1],
                    options.failure_mode)
        _last_warning[:] = [time.monotonic(), 0]
    if options.failure_mode == "open":
        return Answer(None, [])
    body = json.dumps({"error": "rate limiter unavailable"}).encode()
    return Answer(503, [("Retry-After", "1"), ("Content-Type", "application/json")], body)
