"""The differences bench/compare.py finds that slidegate makes on purpose: each named by the words of
docs/migrating.md that document it, and marked deliberate only while that text is there."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from bench.compare_model import Request, Scenario
from bench.compare_servers import PROFILES

MIGRATING = Path(__file__).resolve().parent.parent / "docs" / "migrating.md"


@dataclass(frozen=True)
class Seen:
    """One difference: where (the profile, the sequence and request, the field's path) and the two values (A is
    slidegate's, B the reference's)."""

    profile: str
    scenario: Scenario | None
    request: Request | None
    path: str
    a: Any
    b: Any

    @property
    def in_answer(self) -> bool:
        """A difference in what decides (codes, counts, headers), not in the dynamic metadata."""
        return self.scenario is not None and not self.path.startswith("dynamic_metadata")


@dataclass(frozen=True)
class Known:
    name: str
    documented_by: str  # text of docs/migrating.md
    matches: Callable[[Seen], bool]


def _overridden(seen: Seen) -> bool:
    """A count of a request without an override after requests overriding the same descriptor's limit: the
    reference counts both on one key (its key names no limit), slidegate each on its own."""
    if seen.scenario is None or not any(d.limit for r in seen.scenario.requests for d in r.descriptors):
        return False
    if seen.path.startswith("stats."):  # the counts of the configured limit's key
        return True
    return seen.in_answer and seen.request is not None and not any(d.limit for d in seen.request.descriptors)


def _cached_across_reload(seen: Seen) -> bool:
    """With a local cache, after a reload raised a limit: the reference's cache still rejects its key."""
    cache = PROFILES.get(seen.profile, {}).get("LOCAL_CACHE_SIZE_IN_BYTES", "0") != "0"
    return (cache and seen.scenario is not None and not seen.path.startswith("dynamic_metadata")
            and any(r.via == "reload" for r in seen.scenario.requests))


KNOWN = (
    Known("injective keys", "**Injective keys.**",
          lambda seen: seen.in_answer and seen.scenario is not None and seen.scenario.deliberate == "injective keys"),
    Known("all-or-nothing", "With `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true` a rejected request counts nothing",
          lambda seen: seen.in_answer and seen.profile == "stop_increment"),
    Known("an override's own counter", "**A limit override counts on a counter of its own**", _overridden),
    Known("over_limit takes all", "a request over its limit counts all its hits in `over_limit`",
          lambda seen: seen.path.endswith(".near_limit+over_limit") and seen.a[0] <= seen.b[0]
          and seen.a[1] >= seen.b[1]),
    Known("shadow_mode takes all", "shadow rule's all in `shadow_mode`",
          lambda seen: seen.path.endswith(".shadow_mode") and (seen.a or 0) >= (seen.b or 0)),
    Known("no local cache for a fixed window", "so `over_limit_with_local_cache` stays 0",
          lambda seen: seen.path.endswith(".over_limit_with_local_cache") and seen.a is None),
    Known("no Go runtime stats", "The `go.*` runtime stats and the `redis_pool.*` and",
          lambda seen: seen.a is None and seen.path.startswith(
              ("stats.ratelimit.go.", "stats.ratelimit.redis_pool.", "stats.ratelimit.redis_per_second_pool."))),
    Known("one load per settled change", "per settled change, where the reference loads again",
          lambda seen: seen.path.startswith("stats.ratelimit.service.config_load_") and (seen.a or 0) <= (seen.b or 0)),
    Known("a raised limit is not cached over", "keeps rejecting a key for the rest of its unit after a reload",
          _cached_across_reload),
    Known("slidegate's own metadata", "**The dynamic metadata adds `statuses` and `rejectedBy`**",
          lambda seen: seen.b is None and seen.path.startswith(("dynamic_metadata.statuses",
                                                                  "dynamic_metadata.rejectedBy"))),
    Known("an override's limit spaced alike", "**An override's `limit` in the dynamic metadata is spaced alike",
          lambda seen: seen.path.startswith("dynamic_metadata.descriptors[") and seen.path.endswith("].limit")
          and isinstance(seen.a, str) and isinstance(seen.b, str) and seen.a.split() == seen.b.split()),
    Known("INVALID_ARGUMENT", "**A request that cannot be decided is `INVALID_ARGUMENT`**",
          lambda seen: seen.path == "grpc_error" and (seen.a, seen.b) == ("INVALID_ARGUMENT", "UNKNOWN")),
    Known("/json prints zeros", "**`/json` prints every field**",
          lambda seen: seen.path == "printed" and seen.b == []),
    Known("/json errors are JSON", "**`/json` answers an error in JSON**",
          lambda seen: seen.path == "error_body" and (seen.a, seen.b) == ("json", "text")),
)


@cache
def _documented() -> str:
    return MIGRATING.read_text()


def deliberate_reason(seen: Seen) -> str:
    """The name of the documented difference ``seen`` is, or ""."""
    for known in KNOWN:
        if known.documented_by in _documented() and known.matches(seen):
            return known.name
    return ""
