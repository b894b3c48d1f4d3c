"""What Envoy 1.40's quota filter does with slidegate's assignments, recorded: real Envoys in front of `slidegate
serve` on a private Redis (tests/rlqs_rig.py), steady traffic, and every usage report and every assignment on
each Envoy's RLQS stream logged with the requests each Envoy admitted in between.

Usage: python bench/rlqs_record.py [--window 20] [--limit 20] [--seconds 70] [--envoys 1] [--rate 2]
(``--rate``: each Envoy's requests a second; the limit is ``--limit`` per ``--window`` s.)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.rlqs_rig import rig, user


def config(limit: int, window: int) -> str:
    return f"""
domain: rig
descriptors:
  - key: name
    value: per_user
    descriptors:
      - key: user
        rate_limit: {{unit: second, unit_multiplier: {window}, requests_per_unit: {limit}}}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--window", type=int, default=20)
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=70.0)
    parser.add_argument("--envoys", type=int, default=1)
    parser.add_argument("--rate", type=float, default=2.0)
    opts = parser.parse_args()
    with rig(config(opts.limit, opts.window)) as run:
        envoys = [run.envoy() for _ in range(opts.envoys)]
        who = user()
        start = run.now() + 0.5
        threads = [run.send(e, who, opts.rate, start, start + opts.seconds) for e in envoys]
        for thread in threads:
            thread.join()
        time.sleep(0.5)
        assert run.recorder is not None
        timeline: list[tuple[float, str]] = [(e.at, f"envoy {e.envoy} {e.kind:6} {e.what}")
                                             for e in run.recorder.events if e.user == who]
        for e in envoys:
            timeline += [(at, f"envoy {e.number} admit") for at in run.admitted[(e.number, who)]]
        timeline.sort()
        # admissions between two messages shown as one line
        pending: dict[str, tuple[float, float, int]] = {}
        for at, line in timeline:
            if line.endswith(" admit"):
                first, _, count = pending.get(line, (at, at, 0))
                pending[line] = (first, at, count + 1)
                continue
            for key, (first, last, count) in sorted(pending.items()):
                print(f"{first:7.2f}-{last:6.2f} {key} x{count}")
            pending.clear()
            print(f"{at:7.2f}        {line}")
        for key, (first, last, count) in sorted(pending.items()):
            print(f"{first:7.2f}-{last:6.2f} {key} x{count}")
        for e in envoys:
            times = run.admitted[(e.number, who)]
            bins = [sum(1 for t in times if start + k * opts.window <= t < start + (k + 1) * opts.window)
                    for k in range(int(opts.seconds // opts.window) + 1)]
            print(f"envoy {e.number}: admitted per window {bins}, denied {run.denied[(e.number, who)]}")
        if run.errors:
            print("errors:", run.errors[:10])


if __name__ == "__main__":
    main()
