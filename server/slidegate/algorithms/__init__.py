"""The rate-limit algorithms slidegate offers: one module each (``sliding_window_log`` …), next to its
``lua/<name>.lua``, with its parameters, its rules and its in-memory state (see ``base.Rules``)."""

from __future__ import annotations

from slidegate.algorithms import fixed_window, sliding_window_counter, sliding_window_log, token_bucket
from slidegate.algorithms.base import (
    ALGORITHM_NAMES,
    MAX_EXACT,
    MAX_WINDOW_SECONDS,
    Algorithm,
    Answer,
    Rules,
    State,
    Store,
)

RULES: dict[Algorithm, Rules] = {
    module.RULES.algorithm: module.RULES
    for module in (sliding_window_log, sliding_window_counter, token_bucket, fixed_window)
}

__all__ = ["ALGORITHM_NAMES", "MAX_EXACT", "MAX_WINDOW_SECONDS", "RULES", "Algorithm", "Answer", "Rules", "State",
           "Store"]
