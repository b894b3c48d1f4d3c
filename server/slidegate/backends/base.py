"""The backend contract: decide the limited descriptors of one request at once, all-or-nothing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class BackendUnavailable(Exception):
    """The backend did not answer in time or at all (Redis down, timeout). The service maps it to gRPC
    UNAVAILABLE so that Envoy's ``failure_mode_deny`` decides."""


@dataclass(frozen=True, slots=True)
class Check:
    """One limited descriptor of a request.

    ``key``: storage key of the limit; ``limit``: hits allowed per window; ``window_us``: window length in
    microseconds; ``hits``: hits this request adds (0 = check only, consume nothing).
    """

    key: str
    limit: int
    window_us: int
    hits: int


@dataclass(frozen=True, slots=True)
class Outcome:
    """The decision for one Check. ``remaining``: hits left in the window after this request;
    ``reset_us``: microseconds until the oldest counted hit leaves the window (within limit) or until this
    request's hits would fit (over limit)."""

    over: bool
    remaining: int
    reset_us: int


@dataclass(frozen=True, slots=True)
class Decision:
    """``admitted``: every check had room, so every check's hits were recorded; otherwise none were."""

    admitted: bool
    outcomes: list[Outcome]


class Backend(Protocol):
    """Storage for the limiter."""

    async def decide(self, checks: Sequence[Check], now_us: int | None = None) -> Decision:
        """Decide ``checks`` together, all-or-nothing. ``now_us`` overrides the backend's clock (tests);
        None uses the backend's own clock (Redis TIME). Raises BackendUnavailable."""
        ...

    async def ping(self) -> None:
        """Raise BackendUnavailable unless the backend answers."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...

    def describe(self) -> str:
        """A short human description (e.g. ``redis://127.0.0.1:6379/0``), never containing a password."""
        ...
