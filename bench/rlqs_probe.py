"""What Envoy 1.40's quota filter does with a token bucket assignment that replaces another, probed with a
scripted RLQS server (tests/rlqs_rig.py): one Envoy, one bucket asked 4 requests a second, and at each of its
reports (5 s apart) an assignment from PLAN. Prints what Envoy admitted between two reports beside what each
answer was, so that whether a new bucket starts full, empty or with the old one's tokens can be read off.

Usage: python bench/rlqs_probe.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from slidegate._proto.envoy.service.rate_limit_quota.v3 import rlqs_pb2
from tests.rlqs_rig import rig, user

Response = rlqs_pb2.RateLimitQuotaResponse

# per report (0: the bucket's first): (max_tokens, tokens_per_fill, fill s, ttl s), "deny", or None (no answer)
PLAN: list[tuple[int, int, int, int] | str | None] = [
    (6, 1, 10, 30),   # 0: the first bucket
    (6, 1, 10, 30),   # 1: the same again
    (8, 1, 10, 30),   # 2: max_tokens differs
    (8, 1, 10, 30),   # 3: the same
    (8, 2, 10, 30),   # 4: tokens_per_fill differs
    (8, 2, 20, 30),   # 5: fill_interval differs only in its seconds
    (7, 1, 10, 2),    # 6: a new bucket that expires in 2 s
    (7, 1, 10, 30),   # 7: the same after it expired (fallback ALLOW_ALL meanwhile)
    "deny",           # 8: DENY_ALL
    (7, 1, 10, 30),   # 9: the bucket of report 7 after a DENY_ALL
    (20, 1, 10, 30),  # 10: a larger one
    (20, 1, 10, 30),  # 11
]


def answer(bucket_id: rlqs_pb2.BucketId, step: tuple[int, int, int, int] | str) -> Response:
    reply = Response()
    action = reply.bucket_action.add(bucket_id=bucket_id)
    quota = action.quota_assignment_action
    if step == "deny":
        quota.assignment_time_to_live.FromSeconds(30)
        quota.rate_limit_strategy.blanket_rule = 1  # type: ignore[assignment]  # DENY_ALL
        return reply
    assert not isinstance(step, str)
    max_tokens, per_fill, fill, ttl = step
    quota.assignment_time_to_live.FromSeconds(ttl)
    tb = quota.rate_limit_strategy.token_bucket
    tb.max_tokens, tb.tokens_per_fill.value = max_tokens, per_fill
    tb.fill_interval.FromSeconds(fill)
    return reply


def main() -> None:
    counts: dict[int, int] = {}

    def script(envoy: int, at: float, report: rlqs_pb2.RateLimitQuotaUsageReports) -> Response | None:
        usage = report.bucket_quota_usages[0]
        n = counts.get(envoy, 0)
        counts[envoy] = n + 1
        step = PLAN[n] if n < len(PLAN) else None
        return None if step is None else answer(usage.bucket_id, step)

    with rig("domain: rig\n", script) as run:
        envoy, who = run.envoy(), user()
        start = run.now() + 0.2
        run.send(envoy, who, 4.0, start, start + 5 * len(PLAN) + 3).join()
        time.sleep(0.3)
        assert run.recorder is not None
        events = [e for e in run.recorder.events if e.user == who]
        admitted = run.admitted[(0, who)]
        answers = [e for e in events if e.kind == "answer"]
        for i, e in enumerate(answers):
            end = answers[i + 1].at if i + 1 < len(answers) else run.now()
            times = [t - e.at for t in admitted if e.at <= t < end]
            print(f"{e.at:6.2f}s {e.what:48} then {len(times):2} admitted in {end - e.at:4.1f} s: "
                  + " ".join(f"{t:.1f}" for t in times))
        print("reports:", " | ".join(f"{e.at:.1f} {e.what}" for e in events if e.kind == "report"))


if __name__ == "__main__":
    main()
