"""Rate-limit response headers the service can add to Envoy's answer (LIMIT_RESPONSE_HEADERS_ENABLED).

``RateLimit-Limit``, ``RateLimit-Remaining`` and ``RateLimit-Reset`` as envoyproxy/ratelimit sends them, taken
from the limited descriptor with the least remaining (an over-limit one wins; ties go to the first), plus
``Retry-After`` on an over-limit answer. With LIMIT_RESPONSE_HEADERS_IETF the structured fields of the IETF
draft (draft-ietf-httpapi-ratelimit-headers) are added too: ``RateLimit-Policy`` listing every limit and
``RateLimit`` for the one closest to its end. Seconds are rounded up, so a client told to wait never retries
before it may.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from slidegate.client import policy_name
from slidegate.limiter import Status


def _seconds(us: int) -> int:
    return math.ceil(us / 1_000_000)


def _policy_name(status: Status, index: int) -> str:
    return policy_name(status.limit.name if status.limit else "", index)


def rate_limit_headers(statuses: Sequence[Status], over: bool, ietf: bool = False) -> list[tuple[str, str]]:
    """The headers for one answer (empty when no descriptor had a limit). ``over``: the request is rejected."""
    limited = [(i, s) for i, s in enumerate(statuses) if s.limit is not None and s.limit.unit is not None]
    if not limited:
        return []
    index, chosen = min(limited, key=lambda item: (not item[1].over, item[1].remaining))
    assert chosen.limit is not None
    windows = ", ".join(f"{s.limit.requests_per_unit};w={s.limit.window_seconds}" for _, s in limited if s.limit)
    headers = [
        ("RateLimit-Limit", f"{chosen.limit.requests_per_unit}, {windows}"),
        ("RateLimit-Remaining", str(chosen.remaining)),
        ("RateLimit-Reset", str(_seconds(chosen.reset_us))),
    ]
    if over:
        wait = max(s.reset_us for _, s in limited if s.over and not s.shadow)
        headers.append(("Retry-After", str(max(1, _seconds(wait)))))
    if ietf:
        policies = ", ".join(
            f'"{_policy_name(s, i)}";q={s.limit.requests_per_unit};w={s.limit.window_seconds}'
            for i, s in limited if s.limit
        )
        headers.append(("RateLimit-Policy", policies))
        current = f'"{_policy_name(chosen, index)}";r={chosen.remaining};t={_seconds(chosen.reset_us)}'
        headers.append(("RateLimit", current))
    return headers
