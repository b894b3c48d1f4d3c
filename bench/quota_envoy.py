"""How much of a quota the Rate Limit Quota Service lets through real Envoys, and never more: Envoy 1.40
processes in front of `slidegate serve` on a private Redis (tests/rlqs_rig.py), clients sending evenly spaced
requests through them for several windows, each answer timed at the client. The scenarios run side by side on
one slidegate and three Envoys (each its own users), then a run where slidegate restarts mid-way. Prints a
Markdown table: per scenario the requests admitted per window, the mean from the second window on as a share of
what the guarantee leaves (the limit less the bursts of the Envoys' buckets), the most admitted in any rolling
window, and the simulated Envoy's mean for the same traffic (tests/envoy_quota_model.py). Exits 1 when a
figure of issue 36 is missed: from the second window on, a lone Envoy gets 90% of the limit less one, Envoys
sharing 85% of the limit, 10 a minute at least 7, and no rolling window holds more than the limit and the
first request of each Envoy's bucket.

Usage: python bench/quota_envoy.py        (about six minutes)
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.envoy_quota_model import most_in_a_window, simulate
from tests.rlqs_rig import Rig, rig, user

RUN = 190.0  # seconds of traffic in the main run
RESTART_RUN = 100.0
RESTART_AT = 40.0  # slidegate stopped then, started again 2 s later

CONFIG = """
domain: rig
descriptors:
  - key: name
    value: per_user
    descriptors:
      - key: user
        value: "w40-*"
        rate_limit: {unit: second, unit_multiplier: 20, requests_per_unit: 40}
      - key: user
        value: "w60-*"
        rate_limit: {unit: second, unit_multiplier: 20, requests_per_unit: 60}
      - key: user
        value: "m10-*"
        rate_limit: {unit: minute, requests_per_unit: 10}
"""


@dataclass
class Scenario:
    """Clients as one user: (Envoy, requests a second, from, until) in seconds of the run; ``least``: the share
    of the limit the windows from the second on must hold (0: none checked)."""

    what: str
    prefix: str
    limit: int
    window: int
    traffic: list[tuple[int, float, float, float]]
    least: float
    who: str = ""

    def __post_init__(self) -> None:
        self.who = f"{self.prefix}-{user()}"


def scenarios() -> list[Scenario]:
    end = RUN
    return [
        Scenario("1 Envoy asking twice the limit", "w40", 40, 20, [(0, 4.0, 0, end)], 0.9 * 39 / 40),
        Scenario("2 Envoys sharing, each asking the limit", "w60", 60, 20, [(0, 3.0, 0, end), (1, 3.0, 0, end)],
                 0.85),
        Scenario("3 Envoys sharing, each asking the limit", "w60", 60, 20,
                 [(0, 3.0, 0, end), (1, 3.0, 0, end), (2, 3.0, 0, end)], 0.85),
        Scenario("a busy Envoy (6/s) and an idle one (0.2/s)", "w60", 60, 20, [(0, 6.0, 0, end), (1, 0.2, 0, end)],
                 0.85),
        Scenario("10 a minute asked once a second", "m10", 10, 60, [(0, 1.0, 0, end)], 0.7),
        Scenario("a second Envoy joins at 60 s", "w60", 60, 20, [(0, 3.0, 0, end), (1, 3.0, 60, end)], 0.85),
        Scenario("one of 2 Envoys leaves at 80 s", "w60", 60, 20, [(0, 3.0, 0, end), (1, 3.0, 0, 80)], 0.85),
    ]


def restart_scenarios() -> list[Scenario]:
    end = RESTART_RUN
    return [
        Scenario("1 Envoy at twice the limit, slidegate restarted at 40 s", "w40", 40, 20, [(0, 4.0, 0, end)],
                 0.0),
        Scenario("2 Envoys sharing, slidegate restarted at 40 s", "w60", 60, 20, [(0, 3.0, 0, end), (1, 3.0, 0, end)],
                 0.0),
    ]


def run(cases: list[Scenario], seconds: float, restart_at: float = 0.0) -> tuple[Rig, float]:
    """Every case's traffic at once through three Envoys (named, for the restart); the rig and when the traffic
    started (s since the rig's start)."""
    with rig(CONFIG) as r:
        for n in range(3):
            r.envoy(instance=f"bench-envoy-{n}" if restart_at else "")
        start = r.now() + 1.0
        threads = [r.send(r.envoys[e], case.who, rate, start + a, start + b)
                   for case in cases for e, rate, a, b in case.traffic]
        if restart_at:
            time.sleep(max(0.0, start + restart_at - r.now()))
            r.stop_slidegate()
            time.sleep(2.0)
            r.start_slidegate()
        for thread in threads:
            thread.join()
        return r, start


def windows(times: list[float], start: float, window: int, seconds: float) -> list[int]:
    """Admissions per whole window from ``start``."""
    count = int(seconds // window)
    return [sum(1 for t in times if start + k * window <= t < start + (k + 1) * window) for k in range(count)]


def simulated(case: Scenario, seconds: float) -> float:
    """The simulated Envoy's mean admitted per window from the second on, for the same traffic."""
    rates = [rate for _, rate, _, _ in case.traffic]
    spans = [(a, b) for _, _, a, b in case.traffic]
    envoys, _ = simulate(case.limit, case.window, rates, seconds, delay=0.005, seed=1, spans=spans, steady=True)
    times = sorted(t for e in envoys for t, _ in e.admitted_at)
    return statistics.mean(windows(times, 0.0, case.window, seconds)[1:])


def row(r: Rig, start: float, case: Scenario, seconds: float, sim: bool) -> tuple[str, list[str]]:
    """The table's row for ``case`` and what it misses."""
    times = sorted(t for (_, who), ts in r.admitted.items() if who == case.who for t in ts)
    per = windows(times, start, case.window, seconds)
    steady = statistics.mean(per[1:])
    envoys = len({e for e, _, _, _ in case.traffic})
    most = most_in_a_window(times, case.window)
    missed = []
    if most > case.limit + envoys:
        missed.append(f"{case.what}: {most} in a rolling window, limit {case.limit} + {envoys} first requests")
    low = [n for n in per[1:] if n < case.least * case.limit]
    if low:
        missed.append(f"{case.what}: windows of {low} below {case.least:.0%} of {case.limit}")
    model = f"{simulated(case, seconds):.1f}" if sim else "-"
    text = (f"| {case.what} | {case.limit} per {case.window} s | {' '.join(map(str, per))} | {steady:.1f} "
            f"({steady / case.limit:.0%}) | {most} | {model} |")
    return text, missed


def main() -> None:
    print("| scenario | limit | admitted per window | from the 2nd window | most in a rolling window | simulated |")
    print("|---|---|---|---|---|---|")
    missed: list[str] = []
    errors: list[str] = []
    for cases, seconds, restart in ((scenarios(), RUN, 0.0), (restart_scenarios(), RESTART_RUN, RESTART_AT)):
        r, start = run(cases, seconds, restart)
        errors += r.errors
        for case in cases:
            text, misses = row(r, start, case, seconds, sim=not restart)
            print(text, flush=True)
            missed += misses
    for line in missed + errors[:10]:
        print("MISSED:" if line in missed else "ERROR:", line)
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    threading.stack_size(256 * 1024)
    main()
