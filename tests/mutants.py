"""A short mutation check of slidegate's core: each mutant is a small change to the code (a boundary moved, a
rounding turned, a check dropped); the tests that guard that code run against it, and must fail. A mutant
they pass ("survived") is a hole in the tests. Run it from the repository's root:

    python tests/mutants.py [--only NAME ...]

It edits the files in place one mutant at a time and always puts them back. The survivors of the latest run
are listed in docs/testing.md.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # from the repository's root
    original: str  # found exactly once in the file
    mutated: str
    tests: tuple[str, ...]  # test files (or node ids) that must catch it


MUTANTS = [
    Mutant("cache answers at its exact retry time", "server/slidegate/backends/blocked.py",
           "entry[1] <= now", "entry[1] < now", ("tests/test_blocked_cache.py",)),
    Mutant("headers round a wait down", "server/slidegate/headers.py",
           "math.ceil(us / 1_000_000)", "math.floor(us / 1_000_000)", ("tests/test_headers.py",)),
    Mutant("an over-limit answer's seconds rounded down", "server/slidegate/service.py",
           "-(-status.reset_us // 1_000_000)", "status.reset_us // 1_000_000", ("tests/test_service.py",)),
    Mutant("keys without the length of a part", "server/slidegate/keys.py",
           'f"{len(text)}:{text}"', 'f":{text}"', ("tests/test_long_values.py",)),
    Mutant("the overall code is the last descriptor's", "server/slidegate/service.py",
           "                rejected = not admits(statuses, [s.over for s in statuses])",
           "                rejected = not admits(statuses[-1:], [s.over for s in statuses[-1:]])",
           ("tests/test_headers.py",)),
    Mutant("a bucket counts a token it lacks a tick of (Lua)", "lua/token_bucket.lua",
           "if q >= burst - st.n then", "if q + 1 >= burst - st.n then", ("tests/test_algorithms.py",)),
    Mutant("a bucket counts a token it lacks a tick of (memory)", "server/slidegate/algorithms/token_bucket.py",
           "            tokens += more\n            if tokens >= burst:",
           "            tokens += more\n            if tokens + 1 >= burst:", ("tests/test_algorithms.py",)),
    Mutant("the log admits one past its limit", "lua/sliding_window_log.lua",
           "if counted() + hits > st.limit then", "if counted() + hits > st.limit + 1 then",
           ("tests/test_algorithms.py",)),
    Mutant("a fixed window's hit counts one window late", "lua/fixed_window.lua",
           "local over = st.count + hits > st.limit", "local over = st.count + hits > st.limit + 1",
           ("tests/test_algorithms.py",)),
    Mutant("a rejected request is written anyway", "lua/decide.lua",
           "if admitted == 1 or st.counts_denied then\n      st.algorithm.save(st, now, hold)",
           "if true then\n      st.algorithm.save(st, now, hold)", ("tests/test_algorithms.py",)),
    Mutant("a long part is kept whole", "server/slidegate/keys.py",
           "digest(text) if len(text) > MAX_TEXT_CHARS else", "digest(text) if False else",
           ("tests/test_long_values.py",)),
    Mutant("the breaker opens on one failure", "server/slidegate/backends/breaker.py",
           "and now - self._first_failure >= self._open_after", "", ("tests/test_failure_policy.py",)),
    Mutant("a batch's late deadline has no grace", "server/slidegate/backends/batching.py",
           "        if grace and now - due > LATE_TIMER:\n            # the loop",
           "        if False:\n            # the loop", ("tests/test_failure_policy.py",)),
    Mutant("a cluster slot (or a Redis) that rejects does not decide", "server/slidegate/backends/redis.py",
           "    if not decided:", "    if True:", ("tests/test_cluster_all_or_nothing.py", "tests/test_persecond.py")),
    Mutant("a Redis that fails at once fails the request", "server/slidegate/backends/redis.py",
           "    if len(refused) == len(backends):", "    if refused:", ("tests/test_persecond.py",)),
    Mutant("a part that may be undone is given up once sent", "server/slidegate/backends/batching.py",
           "        if settle and not any(waiting is future for _, waiting, _ in self._waiting):",
           "        if False:", ("tests/test_batching.py", "tests/test_persecond.py")),
    Mutant("every limit of seconds goes to the per-second Redis", "server/slidegate/backends/persecond.py",
           "return check.window_us == ONE_SECOND_US", "return check.window_us < 60 * ONE_SECOND_US",
           ("tests/test_persecond.py",)),
    Mutant("expiries get no jitter", "lua/decide.lua",
           "  if jitter_ms > 0 then ms = ms + math.random(0, jitter_ms) end\n  redis.call('PEXPIRE'",
           "  redis.call('PEXPIRE'", ("tests/test_expiry_jitter.py",)),
    Mutant("the over-limit cache charges less than an entry takes", "server/slidegate/backends/blocked.py",
           "ENTRY_BYTES = 320", "ENTRY_BYTES = 120", ("tests/test_blocked_cache.py",)),
    Mutant("a SAN's wildcard stands anywhere", "server/slidegate/tls.py",
           'p == h or (i == 0 and p == "*")', 'p == h or p == "*"', ("tests/test_tls.py",)),
    Mutant("a failure mode answers a caller with no time left", "server/slidegate/limiter.py",
           "timeout > 2 * ANSWER_MARGIN", "timeout >= 2 * ANSWER_MARGIN", ("tests/test_failure_policy.py",)),
    Mutant("storage failing told as the caller's deadline", "server/slidegate/service.py",
           "    if isinstance(exc, DeadlineExceeded):", "    if isinstance(exc, BackendUnavailable):",
           ("tests/test_service.py",)),
    Mutant("an unlimited rule replaces nothing", "server/slidegate/limiter.py",
           "if status.rule and status.rule.rate_limit\n",
           "if status.limit and status.rule and status.rule.rate_limit\n",
           ("tests/test_rules.py",)),
    Mutant("quota limits never reject (Lua)", "lua/decide.lua",
           "  if quotas > 0 and quotas_over == quotas then admitted = 0 end", "",
           ("tests/test_rules.py",)),
]


def run(mutant: Mutant) -> tuple[bool, float]:
    """Apply ``mutant``, run its tests, put the file back; (killed, seconds)."""
    path = ROOT / mutant.path
    original = path.read_text()
    if original.count(mutant.original) != 1:
        raise SystemExit(f"{mutant.name}: the code to change is not found once in {mutant.path}: update MUTANTS")
    started = time.monotonic()
    try:
        path.write_text(original.replace(mutant.original, mutant.mutated))
        done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *mutant.tests],
                              cwd=ROOT, capture_output=True, text=True)
    finally:
        path.write_text(original)
    return done.returncode != 0, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", help="mutants whose name holds one of these words")
    args = parser.parse_args()
    survivors = []
    for mutant in MUTANTS:
        if args.only and not any(word in mutant.name for word in args.only):
            continue
        killed, seconds = run(mutant)
        print(f"{'killed  ' if killed else 'SURVIVED'} {seconds:5.0f} s  {mutant.name} ({mutant.path})", flush=True)
        if not killed:
            survivors.append(mutant.name)
    print(f"\n{len(survivors)} survived" + (": " + "; ".join(survivors) if survivors else ""))
    sys.exit(1 if survivors else 0)


if __name__ == "__main__":
    main()
