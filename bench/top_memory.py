"""The top limited callers' memory under a million distinct over-limit callers: what slidegate.limited's watcher
keeps (traced by tracemalloc, but for the free tuples the bench's copies of a decision leave) after 10k, 100k and 1M
decisions, each over its limit and each of a caller never seen before, beside what a plain Counter of every caller
would keep.

A real decision of the memory backend (a rule of limit 0: every call over) is made once; the watcher is then told
of a million copies of it, each with another caller's value, as the decider would tell it (the storage's own
memory is not what is measured here).

    python -m bench.top_memory [--callers 1000000] [--capacity 64]   # from the root
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import tempfile
import tracemalloc
from collections import Counter
from pathlib import Path

from slidegate.application import build
from slidegate.decider import Decision, LimitRequest
from slidegate.limited import TopLimited
from slidegate.limited_settings import ShownValues
from slidegate.limiter import Descriptor
from slidegate.settings import Settings

CONFIG = """
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 0}
"""


async def one_decision() -> Decision:
    """A real over-limit decision of the memory backend."""
    with tempfile.TemporaryDirectory(prefix="slidegate-top-memory-") as work:
        (Path(work) / "bench.yaml").write_text(CONFIG)
        app = build(Settings.load({}, {"config_dir": work, "backend_type": "memory"}))
    heard: list[Decision] = []
    app.service.decider.watch(heard.append)
    await app.service.decider.decide(LimitRequest("bench", [Descriptor((("user", "first"),))]))
    assert heard and heard[0].statuses[0].over, "the bench's rule must put every call over its limit"
    return heard[0]


def _traced() -> int:
    """The bytes traced now, less the copies' NamedTuple allocations (collections' ``_make``): CPython keeps up to
    2,000 freed tuples of each size for reuse, which tracemalloc counts as allocated."""
    kept = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, collections.__file__)])
    return sum(stat.size for stat in kept.statistics("filename"))


def measure(decision: Decision, callers: int, capacity: int, kept_by: str) -> list[tuple[int, int]]:
    """(callers so far, bytes kept) at 10k, 100k and 1M (up to ``callers``), by ``kept_by``: ``top`` the
    watcher, ``counter`` a Counter of every caller."""
    marks = [m for m in (10_000, 100_000, 1_000_000) if m <= callers] or [callers]
    top = TopLimited(ShownValues.PLAIN, capacity=capacity)
    counted: Counter[tuple[tuple[str, str], ...]] = Counter()
    prepared = decision.prepared
    rows = []
    tracemalloc.start()
    base = _traced()
    for n in range(1, marks[-1] + 1):
        entries = (("user", f"caller-{n}"),)
        copy = decision._replace(prepared=prepared._replace(descriptors=[Descriptor(entries)]))
        if kept_by == "counter":
            counted[entries] += 1
        elif kept_by == "top":
            top.watch(copy)
        if n in marks:
            rows.append((n, _traced() - base))
    tracemalloc.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--callers", type=int, default=1_000_000)
    parser.add_argument("--capacity", type=int, default=64)
    args = parser.parse_args()
    decision = asyncio.run(one_decision())
    print(f"distinct over-limit callers, one rule, TOP_LIMITED_CAPACITY={args.capacity} (tracemalloc, KiB kept)")
    print(f"{'callers':>10} {'top limited':>12} {'a Counter of all':>17}")
    bounded = measure(decision, args.callers, args.capacity, "top")
    everyone = measure(decision, args.callers, args.capacity, "counter")
    for (n, kept), (_, all_kept) in zip(bounded, everyone, strict=True):
        print(f"{n:>10,} {kept / 1024:>12,.1f} {all_kept / 1024:>17,.1f}")


if __name__ == "__main__":
    main()
