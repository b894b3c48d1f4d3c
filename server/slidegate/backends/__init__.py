"""Storage backends: where the algorithms keep their state. The service never talks to storage directly."""

from slidegate.backends.base import Backend, BackendUnavailable, Check, Decision, Outcome

__all__ = ["Backend", "BackendUnavailable", "Check", "Decision", "Outcome"]
