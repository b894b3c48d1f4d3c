"""Envoy's rate_limit_quota filter against slidegate's Rate Limit Quota Service, end to end: real Envoy 1.40
(envoy/rlqs.yaml on loopback, a bucket per x-user header), real `slidegate serve` processes, real Redis.

Envoy reports a new bucket at once and then every bucket every 5 s; slidegate answers each report with the
bucket's assignment, this Envoy's share of the quota as a token bucket. Until a bucket's first assignment
arrives, the filter's no_assignment_behavior (ALLOW_ALL) admits every request: the tests send a user's first
request through each Envoy and wait ``SETTLE`` s for that round trip before sending more, so that exactly one
request per Envoy and bucket passes unassigned (quick requests sent during the round trip would all pass: that
is Envoy's fallback, not slidegate's quota). The bound checked everywhere is the service's guarantee: within
any window of the limit's length, all Envoys together admit at most the limit plus one request per Envoy.

The Envoys and slidegates are started once for the module (each test its own users); only the test of a killed
Envoy starts its own, and it is the slow one (about 35 s: a dead stream's share is released after the
assignment's TTL 15 s, the ledger's slack 2 s and the window, 10 s there).
"""

from __future__ import annotations

import contextlib
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from slidegate import stack, upstream
from slidegate.quotas.ledger import SLACK_MS, TTL_MS
from tests.served import read_log

DOMAIN = "rlqs_e2e"
LIMIT = 5  # per minute, every user without a rule of their own
SHORT = 4  # per 10 s, users "ten-*"
SHORT_WINDOW = 10.0
REPORT_EVERY = 5.0  # Envoy 1.40's reporting period, whatever reporting_interval says
TTL = TTL_MS / 1000  # slidegate's assignment_time_to_live
SETTLE = 0.5  # time for a first report's answer to reach Envoy
CONFIG = f"""
domain: {DOMAIN}
descriptors:
  - key: name
    value: per_user
    descriptors:
      - key: user
        rate_limit: {{unit: minute, requests_per_unit: {LIMIT}}}
      - key: user
        value: "ten-*"
        rate_limit: {{unit: second, unit_multiplier: {int(SHORT_WINDOW)}, requests_per_unit: {SHORT}}}
      - key: user
        value: "vip-*"
        rate_limit: {{unlimited: true}}
      - key: user
        value: "blocked-*"
        rate_limit: {{unit: minute, requests_per_unit: 0}}
"""


def user(kind: str = "u") -> str:
    return f"{kind}-{uuid.uuid4().hex[:10]}"


@dataclass
class Envoy:
    port: int
    admin_port: int
    process: Any
    log: Any

    def get(self, who: str | None) -> int:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/q", headers={"x-user": who} if who else {})
        try:
            with urllib.request.urlopen(request, timeout=5) as reply:
                return int(reply.status)
        except urllib.error.HTTPError as reply:
            return int(reply.code)

    def admitted(self, who: str, n: int) -> int:
        """How many of ``n`` quick requests as ``who`` got a 200 (every other answer must be a 429)."""
        statuses = [self.get(who) for _ in range(n)]
        assert set(statuses) <= {200, 429}, statuses
        return statuses.count(200)


@dataclass
class Stack:
    """Processes started for the module; ``output()`` shows their logs when a test fails."""

    web: Any
    work: Path
    prefix: str
    redis_url: str
    slidegates: list[tuple[int, Any]] = field(default_factory=list)
    envoys: list[Envoy] = field(default_factory=list)
    logs: list[tuple[str, Any]] = field(default_factory=list)

    def _log(self, name: str) -> Any:
        handle = tempfile.TemporaryFile()  # noqa: SIM115 - closed by close()
        self.logs.append((name, handle))
        return handle

    def slidegate(self, backend: str = "redis") -> int:
        """Another `slidegate serve` on the same Redis and key prefix (a replica); its gRPC port."""
        port = stack.free_port()
        log = self._log(f"slidegate :{port} ({backend})")
        process = stack.start_slidegate(self.work, port, redis_url=self.redis_url, key_prefix=self.prefix,
                                        backend=backend, log_file=log)
        self.slidegates.append((port, process))
        return port

    def envoy(self, rlqs_port: int) -> Envoy:
        port, admin = stack.free_port(), stack.free_port()
        log = self._log(f"envoy :{port} -> slidegate :{rlqs_port}")
        config = stack.local_rlqs_envoy_config(listener_port=port, admin_port=admin, rlqs_port=rlqs_port,
                                               upstream_port=self.web.server_address[1],
                                               filter_overrides={"domain": DOMAIN})
        envoy = Envoy(port, admin, stack.start_envoy(config, admin, log_file=log), log)
        self.envoys.append(envoy)
        return envoy

    def output(self) -> str:
        parts = []
        for name, handle in self.logs:
            parts.append(f"--- {name}\n{read_log(handle)[-3000:]}")
        return "\n".join(parts)

    def close(self) -> None:
        for envoy in self.envoys:
            stack.stop(envoy.process)
        for _, process in self.slidegates:
            stack.stop(process)
        self.web.shutdown()
        for _, handle in self.logs:
            handle.close()


@contextlib.contextmanager
def running(redis_url: str, tmp: Path) -> Iterator[Stack]:
    (tmp / "config.yaml").write_text(CONFIG)
    prefix = f"sgtest-{uuid.uuid4().hex[:12]}:"
    running_stack = Stack(upstream.start(), tmp, prefix, redis_url)
    try:
        yield running_stack
    finally:
        running_stack.close()
        client = redis.Redis.from_url(redis_url)
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()


@pytest.fixture(scope="module")
def module_stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """slidegate A with two Envoys, slidegate B (a replica of A on the same Redis and prefix) with one."""
    with running(redis_url, tmp_path_factory.mktemp("rlqs")) as running_stack:
        a, b = running_stack.slidegate(), running_stack.slidegate()
        running_stack.envoy(a), running_stack.envoy(a), running_stack.envoy(b)
        yield running_stack


def first_requests(envoys: list[Envoy], who: str) -> int:
    """Each Envoy's first request as ``who`` (admitted: no assignment yet), then time for the assignments."""
    statuses = [envoy.get(who) for envoy in envoys]
    time.sleep(SETTLE)
    assert statuses == [200] * len(envoys), statuses
    return len(envoys)


def test_one_envoy_admits_the_quota_per_user(module_stack: Stack) -> None:
    envoy = module_stack.envoys[0]
    alice, bob = user(), user()
    started = time.monotonic()
    got = {who: first_requests([envoy], who) + envoy.admitted(who, 12) for who in (alice, bob)}
    # the first request before the assignment, then the quota: the first request was reported as admitted, so
    # the assignment holds LIMIT - 1 (or LIMIT, if the first is not counted against it)
    assert got[alice] in (LIMIT, LIMIT + 1), (got, module_stack.output())
    assert got[bob] in (LIMIT, LIMIT + 1), (got, module_stack.output())  # a bucket of its own
    # two report cycles later the window still holds the quota: at most LIMIT + 1 in the minute
    while time.monotonic() - started < 2 * REPORT_EVERY + 1:
        for who in (alice, bob):
            got[who] += envoy.admitted(who, 1)
        time.sleep(0.25)
    assert got[alice] <= LIMIT + 1 and got[bob] <= LIMIT + 1, (got, module_stack.output())
    # (the rest of the minute is not waited for here)


def test_one_envoy_on_the_memory_backend(redis_url: str, tmp_path: Path) -> None:
    with running(redis_url, tmp_path) as own:
        envoy, who = own.envoy(own.slidegate(backend="memory")), user()
        assert first_requests([envoy], who) + envoy.admitted(who, 12) in (LIMIT, LIMIT + 1), own.output()


def test_a_user_with_no_quota_is_denied_after_the_first_request(module_stack: Stack) -> None:
    envoy, nobody = module_stack.envoys[0], user("blocked")
    first_requests([envoy], nobody)
    assert envoy.admitted(nobody, 10) == 0


def test_an_unlimited_user_and_a_request_without_a_bucket_get_everything(module_stack: Stack) -> None:
    envoy, vip = module_stack.envoys[0], user("vip")
    first_requests([envoy], vip)
    assert envoy.admitted(vip, 30) == 30
    assert [envoy.get(None) for _ in range(10)] == [200] * 10  # no x-user header: no bucket, not limited


def shared_quota(envoys: list[Envoy], stack_: Stack) -> list[int]:
    """One user's quota from ``envoys`` at once: first requests, bursts, a report cycle later bursts again.
    Returns how many each Envoy admitted."""
    who = user()
    got = [1] * first_requests(envoys, who)
    started = time.monotonic()
    for round_ in range(2):
        for i, envoy in enumerate(envoys):
            got[i] += envoy.admitted(who, 8)
        if round_ == 0:
            time.sleep(max(0.0, REPORT_EVERY + 1 - (time.monotonic() - started)))
    assert sum(got) <= LIMIT + len(envoys), (got, stack_.output())
    return got


def test_two_envoys_share_one_quota(module_stack: Stack) -> None:
    got = shared_quota(module_stack.envoys[:2], module_stack)
    assert sum(got) >= LIMIT, got  # the quota is used, not lost between the shares


def test_two_replicas_on_one_redis_share_one_quota(module_stack: Stack) -> None:
    got = shared_quota([module_stack.envoys[0], module_stack.envoys[2]], module_stack)
    assert sum(got) >= LIMIT, got


def test_a_killed_envoys_share_is_released(redis_url: str, tmp_path: Path) -> None:
    with running(redis_url, tmp_path) as own:
        port = own.slidegate()
        survivor, doomed = own.envoy(port), own.envoy(port)
        who = user("ten")  # SHORT requests per SHORT_WINDOW s
        # the doomed Envoy asks first and gets the whole quota as its share; the survivor's report finds none left
        got = [0, first_requests([doomed], who) + doomed.admitted(who, 6)]
        got[0] = first_requests([survivor], who) + survivor.admitted(who, 6)
        assert got[1] >= SHORT - 1 and sum(got) <= SHORT + 2, (got, own.output())
        doomed.process.kill()  # SIGKILL: its stream ends without a goodbye
        doomed.process.wait()
        killed = time.monotonic()
        # slidegate keeps serving the others: a new user's quota on the survivor is enforced at once
        other = user()
        assert first_requests([survivor], other) + survivor.admitted(other, 8) in (LIMIT, LIMIT + 1), own.output()
        assert own.slidegates[0][1].poll() is None
        # the dead stream's share stays booked while its Envoy may still be enforcing it (until the TTL) and a
        # window longer; it is released after TTL + slack + window, and the survivor's next report (within 5 s)
        # gets it: then the survivor alone admits the quota's burst at once, never more than SHORT in a window
        release = TTL + SLACK_MS / 1000 + SHORT_WINDOW
        admitted: list[float] = []
        while time.monotonic() - killed < release + REPORT_EVERY + 2:
            if survivor.get(who) == 200:
                admitted.append(time.monotonic() - killed)
            if admitted and time.monotonic() - killed > admitted[0] + 1.5:
                break
            time.sleep(0.1)
        assert admitted, f"nothing admitted {release + REPORT_EVERY + 2:.0f} s after the kill\n{own.output()}"
        assert TTL + SHORT_WINDOW - 2 < admitted[0] < release + REPORT_EVERY + 1, (admitted, own.output())
        assert sum(1 for at in admitted if at - admitted[0] < 1) >= SHORT - 1, (admitted, own.output())
        assert all(sum(1 for at in admitted if start <= at < start + SHORT_WINDOW) <= SHORT for start in admitted)
