"""Rate-limit response headers, written once for the service's answer to Envoy and for the client's middleware.

Both describe one descriptor, as envoyproxy/ratelimit chooses it (src/service/ratelimit.go, and the reference
running beside slidegate: bench/compare.py): the last one whose own limit rejects the request (quota limits aside),
else the one closest to its limit, the least remaining, the first of equals. The service sends exactly
envoyproxy/ratelimit's three headers (LIMIT_RESPONSE_HEADERS_ENABLED): ``RateLimit-Limit`` (the bare number),
``RateLimit-Remaining`` and ``RateLimit-Reset``, named by LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER and
LIMIT_RESET_HEADER. With LIMIT_RESPONSE_HEADERS_IETF, the limit is told in the draft's quota-policy form
(``10, 10;w=60, 100;w=3600``) and the structured fields of the IETF draft (draft-ietf-httpapi-ratelimit-headers)
come too: ``RateLimit-Policy`` listing every limit and ``RateLimit`` for the chosen one, and ``Retry-After`` on a
rejection. The middleware sends ``X-RateLimit-*``, the IETF fields and ``Retry-After``. Seconds are rounded up, so
a client told to wait never retries before it may. This module depends on nothing of slidegate's: callers hand it
``Shown`` values.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass


class ResponseHeaders(enum.Enum):
    """Which headers the service adds to its answers: none; ``RATELIMIT``, envoyproxy/ratelimit's
    (LIMIT_RESPONSE_HEADERS_ENABLED); ``IETF``, those and the IETF draft's fields (LIMIT_RESPONSE_HEADERS_IETF
    too)."""

    NONE = "none"
    RATELIMIT = "ratelimit"
    IETF = "ietf"


@dataclass(frozen=True, slots=True)
class HeaderNames:
    """The names of the three headers (LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER)."""

    limit: str = "RateLimit-Limit"
    remaining: str = "RateLimit-Remaining"
    reset: str = "RateLimit-Reset"


@dataclass(frozen=True, slots=True)
class Shown:
    """One descriptor that has a limit, as the headers tell it. ``name``: the limit's name ("" when it has
    none); ``keys``: the descriptor's entry keys, which name an unnamed limit; ``blocking``: over its limit in
    a way that rejects the request (not shadow mode); ``over_code``: its own code is OVER_LIMIT (over, its rule
    not in shadow mode), whatever the request's (under SHADOW_MODE it is admitted)."""

    name: str
    keys: tuple[str, ...]
    limit: int
    window_seconds: int
    remaining: int
    reset_us: int
    over: bool
    blocking: bool
    quota: bool = False
    over_code: bool = False


def seconds(us: int) -> int:
    """Whole seconds, rounded up."""
    return math.ceil(us / 1_000_000)


def policy_name(name: str, keys: Sequence[str] = ()) -> str:
    """A limit's name as a structured-field string's content: the limit's own name, else its descriptor's keys
    joined by ``.`` (``remote_address.path``); printable ASCII, quotes and backslashes escaped, anything else
    ``_`` (a config name or request key must not break or inject response headers)."""
    text = name or ".".join(keys) or "limit"
    safe = "".join(c if " " <= c <= "~" else "_" for c in text)
    return safe.replace("\\", "\\\\").replace('"', '\\"')


def chosen(shown: Sequence[Shown]) -> Shown:
    """The descriptor the headers describe: the last that rejects the request by a limit not in quota mode, else
    the least remaining, the first of equals."""
    # the descriptor's own code, as the reference's choice is (under SHADOW_MODE too, where nothing rejects)
    rejecting = [s for s in shown if s.over_code and not s.quota]
    return rejecting[-1] if rejecting else min(shown, key=lambda s: s.remaining)


def retry_after(shown: Sequence[Shown]) -> int | None:
    """Whole seconds (at least 1) until a rejected request would fit; None when nothing rejects it. It fits once
    every limit not in quota mode that rejects it has room, and one of its quota limits, when all were over."""
    if not any(s.blocking for s in shown):
        return None
    waits = [s.reset_us for s in shown if s.blocking and not s.quota]
    quota = [s for s in shown if s.quota]
    if quota and all(s.over for s in quota):
        waits.append(min(s.reset_us for s in quota))
    # statuses the caller put together by hand (the client's, the service's skeletons) may reject by a quota limit
    # alone while another quota has room: the longest wait of those rejecting is then the honest answer
    return max(1, seconds(max(waits or [s.reset_us for s in shown if s.blocking])))


def _ietf(shown: Sequence[Shown], current: Shown) -> list[tuple[str, str]]:
    policies = ", ".join(f'"{policy_name(s.name, s.keys)}";q={s.limit};w={s.window_seconds}' for s in shown)
    now = f'"{policy_name(current.name, current.keys)}";r={current.remaining};t={seconds(current.reset_us)}'
    return [("RateLimit-Policy", policies), ("RateLimit", now)]


def envoy_headers(shown: Sequence[Shown], *, ietf: bool, names: HeaderNames = HeaderNames()) -> list[tuple[str, str]]:
    """The headers the service adds to its answer (empty when no descriptor has a limit)."""
    if not shown:
        return []
    current = chosen(shown)
    limit = str(current.limit)
    if ietf:
        limit += ", " + ", ".join(f"{s.limit};w={s.window_seconds}" for s in shown)
    headers = [
        (names.limit, limit),
        (names.remaining, str(current.remaining)),
        (names.reset, str(seconds(current.reset_us))),
    ]
    if not ietf:
        return headers
    wait = retry_after(shown)
    if wait is not None:
        headers.append(("Retry-After", str(wait)))
    return headers + _ietf(shown, current)


def middleware_headers(shown: Sequence[Shown]) -> list[tuple[str, str]]:
    """The headers an application's middleware adds to its response (empty when no descriptor has a limit)."""
    if not shown:
        return []
    current = chosen(shown)
    headers = [
        ("X-RateLimit-Limit", str(current.limit)),
        ("X-RateLimit-Remaining", str(current.remaining)),
        ("X-RateLimit-Reset", str(seconds(current.reset_us))),
        *_ietf(shown, current),
    ]
    wait = retry_after(shown)
    if wait is not None:
        headers.append(("Retry-After", str(wait)))
    return headers
