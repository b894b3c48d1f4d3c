"""What the limiter answers when the storage cannot decide in time (FAILURE_MODE; a domain's ``failure_mode``
wins). Envoy's filter lets a request through on any error unless its ``failure_mode_deny`` is set, so every mode
but ``error`` answers before the caller's deadline instead of failing (slidegate.limiter)."""

from __future__ import annotations

import enum


class FailureMode(enum.StrEnum):
    """``error``: gRPC UNAVAILABLE, and Envoy's ``failure_mode_deny`` decides; ``allow``: OK; ``deny``:
    OVER_LIMIT; ``local``: decided in this process's memory, each limit divided among the replicas
    (LOCAL_LIMIT_REPLICAS), until the storage answers again."""

    ERROR = "error"
    ALLOW = "allow"
    DENY = "deny"
    LOCAL = "local"


FAILURE_MODE_NAMES = ", ".join(FailureMode)
