"""How much of a limit the Rate Limit Quota Service lets Envoys use, and never more: Envoys modelled as Envoy
1.40's quota filter enforces assignments (tests/envoy_quota_model.py) send requests above the limit to one
quota ledger (slidegate.quotas.ledger), reporting every 5 s. Prints a Markdown table: per scenario, the
requests admitted per window once the first windows passed (as a share of the limit), and the most admitted in
any window (never above the limit: the requests an Envoy lets through before its first assignment aside).

Usage: python bench/quota_accuracy.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.envoy_quota_model import simulate  # the model lives with the tests that check it

# (what, limit, window in seconds, each Envoy's requests per second)
SCENARIOS: list[tuple[str, int, int, list[float]]] = [
    ("1 Envoy, 100 a second, asked 200/s", 100, 1, [200.0]),
    ("1 Envoy, 100 per 10 s, asked 20/s", 100, 10, [20.0]),
    ("1 Envoy, 100 a minute, asked 4/s", 100, 60, [4.0]),
    ("1 Envoy, 1000 a minute, asked 40/s", 1000, 60, [40.0]),
    ("1 Envoy, 5 a minute, asked 1/s", 5, 60, [1.0]),
    ("3 Envoys, 1000 a minute, each asked 15/s", 1000, 60, [15.0, 15.0, 15.0]),
    ("2 Envoys, 100 a minute, one busy (5/s), one idle (0.1/s)", 100, 60, [5.0, 0.1]),
    ("1 Envoy, 1000 an hour, asked 1/s", 1000, 3600, [1.0]),
    ("2 Envoys, 5 a minute, each asked 1/s", 5, 60, [1.0, 1.0]),
    ("10 Envoys, 100 a second, each asked 20/s", 100, 1, [20.0] * 10),
]


def main() -> None:
    print("| scenario | admitted per window | of the limit | most in any window |")
    print("|---|---|---|---|")
    for what, limit, window, rates in SCENARIOS:
        warm = 2 * window + 10
        seconds = warm + max(10 * window, 300)
        envoys, most = simulate(limit, window, rates, seconds=seconds, delay=0.005, seed=1)
        admitted = sum(1 for e in envoys for at, free in e.admitted_at if not free and at > warm)
        per_window = admitted / ((seconds - warm) / window)
        print(f"| {what} | {per_window:.1f} | {per_window / limit:.0%} | {most} (limit {limit}) |", flush=True)


if __name__ == "__main__":
    main()
