"""The top limited callers as the debug port shows them (GET /limited): the snapshots of slidegate.limited merged
and cut into windows of the last 1, 5 and 15 minutes.

With several workers (WORKERS) each writes its snapshot every PUBLISH_SECONDS to ``limited-<pid>.json`` in the
directory they share for their metrics (PROMETHEUS_MULTIPROC_DIR), and the worker that answers merges the others'
files with its own live snapshot: one view of all workers, at most PUBLISH_SECONDS behind for the others. Counts
add up; the values' summaries merge as Space-Saving summaries do (slidegate.heavy_hitters.merge).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from slidegate.decider import Decider
from slidegate.heavy_hitters import Counted, merge
from slidegate.limited import POINTS, TICK_SECONDS, TICKS_PER_MINUTE, TopLimited
from slidegate.logs import Repeated
from slidegate.settings import Settings

WINDOWS = (1, 5, 15)  # minutes
PUBLISH_SECONDS = 1.0
log = logging.getLogger(__name__)
_unpublished = Repeated(log, "cannot publish the top limited callers for the other workers: %s")


def _aligned(series: list[int], shift: int) -> list[int]:
    """A series ending ``shift`` ticks before the newest, as if it ended at the newest (zeros since)."""
    return series[shift:] + [0] * min(shift, POINTS) if shift else series


def _merged_rules(snapshots: list[dict[str, Any]], tick: int) -> dict[tuple[str, str], dict[str, Any]]:
    rules: dict[tuple[str, str], dict[str, Any]] = {}
    for snapshot in snapshots:
        shift = tick - snapshot["tick"]
        for rule in snapshot["rules"]:
            key = (rule["domain"], rule["rule"])
            merged = rules.get(key)
            if merged is None:
                merged = rules[key] = {**rule, "decisions": [0] * POINTS, "over_limit": [0] * POINTS,
                                       "near_limit": [0] * POINTS, "over_limit_values": [], "near_limit_values": []}
            for series in ("decisions", "over_limit", "near_limit"):
                merged[series] = [a + b for a, b in zip(merged[series], _aligned(rule[series], shift), strict=True)]
            merged["over_limit_values"] += rule["over_limit_values"]
            merged["near_limit_values"] += rule["near_limit_values"]
    return rules


def _top(minutes: Iterable[dict[str, Any]], since_minute: int, top: int) -> list[dict[str, Any]]:
    summaries = [([Counted(value, seen, error) for value, seen, error in m["top"]], m["least"])
                 for m in minutes if m["minute"] >= since_minute]
    return [{"value": c.item, "count": c.seen, "error": c.error} for c in merge(summaries, top)]


def _windows(rule: dict[str, Any], minute: int, top: int) -> dict[str, Any]:
    windows = {}
    for length in WINDOWS:
        points = length * TICKS_PER_MINUTE
        since_minute = minute - length  # the current minute and the ``length`` before it (slidegate.limited.SLOTS)
        windows[f"{length}m"] = {
            "decisions": sum(rule["decisions"][-points:]), "over_limit": sum(rule["over_limit"][-points:]),
            "near_limit": sum(rule["near_limit"][-points:]), "values_since": since_minute * 60,
            "top_over_limit": _top(rule["over_limit_values"], since_minute, top),
            "top_near_limit": _top(rule["near_limit_values"], since_minute, top)}
    return windows


def render(snapshots: list[dict[str, Any]], top: int, now: float) -> dict[str, Any]:
    """The view of ``snapshots`` (one per worker): each rule, the most over limit first, with its series (one
    point per ``tick_seconds`` from ``series_start``) and its windows, each with its ``top`` values."""
    tick = max((s["tick"] for s in snapshots), default=int(now // TICK_SECONDS))
    minute = tick // TICKS_PER_MINUTE
    rules = []
    for merged in _merged_rules(snapshots, tick).values():
        rule = {k: merged[k] for k in ("domain", "rule", "source", "limit", "shadow_mode", "decisions", "over_limit",
                                       "near_limit")}
        rule["windows"] = _windows(merged, minute, top)
        rules.append(rule)
    rules.sort(key=lambda r: (-r["windows"]["15m"]["over_limit"], -r["windows"]["15m"]["decisions"], r["rule"]))
    return {"generated_at": round(now, 3), "tick_seconds": TICK_SECONDS,
            "series_start": (tick - POINTS + 1) * TICK_SECONDS, "windows": [f"{m}m" for m in WINDOWS],
            "values": snapshots[0]["values"] if snapshots else "", "workers": len(snapshots), "rules": rules}


class LimitedView:
    """``top_limited``'s view, with the other workers' when ``directory`` (the workers' shared one) is given."""

    def __init__(self, top_limited: TopLimited, directory: str = "") -> None:
        self.top_limited = top_limited
        self._directory = Path(directory) if directory else None
        self._own = f"limited-{os.getpid()}.json"

    async def view(self, top: int = 10) -> dict[str, Any]:
        """The merged view (see ``render``); ``top`` values a window, at most the summaries' capacity."""
        self.top_limited.advance()
        snapshots = [self.top_limited.snapshot()]
        if self._directory is not None:
            snapshots += await asyncio.to_thread(self._others)
        return render(snapshots, min(top, self.top_limited.capacity), time.time())

    def _others(self) -> list[dict[str, Any]]:
        assert self._directory is not None
        found = []
        for path in self._directory.glob("limited-*.json"):
            if path.name == self._own:
                continue
            with contextlib.suppress(OSError, ValueError):  # a worker gone, or a file half replaced
                found.append(json.loads(path.read_text()))
        return found

    def _publish(self, snapshot: dict[str, Any]) -> None:
        assert self._directory is not None
        temporary = self._directory / f".{self._own}.tmp"
        temporary.write_text(json.dumps(snapshot, separators=(",", ":")))
        temporary.replace(self._directory / self._own)  # readers see the old file or the new, never half

    async def run(self, stop: asyncio.Event) -> None:
        """Until ``stop``: the clock followed once a second and, shared, the snapshot published."""
        while not stop.is_set():
            self.top_limited.advance()
            if self._directory is not None:
                try:
                    await asyncio.to_thread(self._publish, self.top_limited.snapshot())
                except OSError as exc:
                    _unpublished(str(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), PUBLISH_SECONDS)


def watching(settings: Settings, decider: Decider) -> LimitedView:
    """The view of a TopLimited told of ``decider``'s decisions, as the TOP_LIMITED_* settings ask, shared with the
    other workers when there are (PROMETHEUS_MULTIPROC_DIR, set by slidegate.workers)."""
    shown = settings.top_limited.keyed()
    top_limited = TopLimited(shown.values, capacity=shown.capacity, near_limit_ratio=settings.near_limit_ratio,
                             hash_key=hashlib.blake2b(shown.hash_key.encode(), digest_size=32).digest())
    decider.watch(top_limited.watch)
    return LimitedView(top_limited, os.environ.get("PROMETHEUS_MULTIPROC_DIR", ""))
