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

import ipaddress
import json
import logging
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
    timeout: float = 0.05
    clock: Callable[[], int] | None = field(default=None, repr=False)  # in-process mode, for tests

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> Options:
        """Options from a mapping with keys in any case. Raises ValueError naming a bad option."""
        values = {str(k).lower(): v for k, v in raw.items()}
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
        values["paths"] = tuple(values.get("paths", ()))
        values["descriptors"] = tuple(tuple(d) for d in values.get("descriptors", (("client",),)))
        for source in (s for d in values["descriptors"] for s in d):
            if source not in ("client", "user", "remote_address", "path", "method") and not source.startswith(
                    ("header:", "generic:")):
                raise ValueError(f"slidegate middleware: unknown descriptor source {source!r}")
        values["trusted_proxies"] = tuple(ipaddress.ip_network(n, strict=False)
                                          for n in values.get("trusted_proxies", ()))
        return cls(**values)


def client_ip(peer: str, forwarded_for: str | None, trusted: Sequence[Network]) -> str:
    """The client address: the TCP peer, unless it is a trusted proxy; then the last address of
    X-Forwarded-For that is not a trusted proxy (walking right to left, as each proxy appends the one it saw)."""

    def is_trusted(address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in trusted)

    if not forwarded_for or not is_trusted(peer):
        return peer
    hops = [hop.strip() for hop in forwarded_for.split(",") if hop.strip()]
    for hop in reversed(hops):
        if not is_trusted(hop):
            try:
                return str(ipaddress.ip_address(hop))
            except ValueError:
                return peer  # garbage from the client: fall back to what we saw
    return hops[0] if hops else peer


@dataclass(frozen=True)
class RequestView:
    """What the descriptors are built from, whatever the framework."""

    path: str
    method: str
    headers: Mapping[str, str]  # lower-case names
    client_ip: str
    user_id: str | None


def build_descriptors(options: Options, view: RequestView) -> list[DescriptorSpec]:
    """The descriptors for one request; a descriptor whose source is missing (no such header, anonymous
    ``user``) is left out, as Envoy does."""
    out: list[DescriptorSpec] = []
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


def failure(options: Options, reason: str) -> Answer:
    """The configured answer when the limiter could not decide (logged and counted)."""
    FAILURES.labels(options.failure_mode).inc()
    log.warning("rate limiter unavailable (%s): failing %s", reason, options.failure_mode)
    if options.failure_mode == "open":
        return Answer(None, [])
    body = json.dumps({"error": "rate limiter unavailable"}).encode()
    return Answer(503, [("Retry-After", "1"), ("Content-Type", "application/json")], body)
