"""The sampled over-limit log (OVER_LIMIT_LOG_INTERVAL): one line per rule at most every interval, with a descriptor
it rejected and the count since its last line; none for admitted requests; on every backend."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import pytest

from slidegate.decider import Decision
from slidegate.overlimit_log import OverLimitLog
from tests.conftest import Decider
from tests.helpers import OVER_LIMIT, descriptor, request

CONFIG = """
domain: o
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1, name: per-user}
  - key: path
    rate_limit: {unit: hour, requests_per_unit: 1}
"""


class Seconds:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "slidegate.overlimit"]


async def test_one_line_per_rule_an_interval_with_the_count_since_the_last(
        limits: Callable[..., Awaitable[Decider]], caplog: pytest.LogCaptureFixture) -> None:
    service = await limits(CONFIG, over_limit_log_interval="0")  # the log the settings would add: none
    clock = Seconds()
    service.app.service.decider.watch(OverLimitLog(10.0, clock=clock))
    caplog.set_level(logging.INFO, logger="slidegate.overlimit")
    codes = [(await service.should_rate_limit(request("o", descriptor(("user", f"u{n % 2}"))))).overall_code
             for n in range(52)]
    assert codes.count(OVER_LIMIT) == 50  # each of the two users' first is admitted
    assert lines(caplog) == ["over limit: rule per-user rejected 1 request in the last 10 s, the latest with "
                             "descriptor user=u0"]
    clock.now += 10
    await service.should_rate_limit(request("o", descriptor(("path", "/a"))))  # admitted: no line
    await service.should_rate_limit(request("o", descriptor(("path", "/a"))))
    await service.should_rate_limit(request("o", descriptor(("user", "u1"))))
    assert lines(caplog)[1:] == [
        "over limit: rule path rejected 1 request in the last 10 s, the latest with descriptor path=/a",
        "over limit: rule per-user rejected 50 requests in the last 10 s, the latest with descriptor user=u1"]
    record = [r for r in caplog.records if r.name == "slidegate.overlimit"][2]
    assert (record.rule, record.denied, record.descriptor) == ("per-user", 50, "user=u1")  # type: ignore[attr-defined]


async def test_a_burst_ends_with_its_count_written_after_the_interval(
        limits: Callable[..., Awaitable[Decider]], caplog: pytest.LogCaptureFixture) -> None:
    service = await limits(CONFIG, over_limit_log_interval="0")
    service.app.service.decider.watch(OverLimitLog(0.2))
    caplog.set_level(logging.INFO, logger="slidegate.overlimit")
    for _ in range(6):
        await service.should_rate_limit(request("o", descriptor(("user", "b"))))
    assert len(lines(caplog)) == 1
    await asyncio.sleep(0.5)  # no rejection since: the timer writes the 4 others
    assert lines(caplog)[1].startswith("over limit: rule per-user rejected 4 requests")


async def test_a_rules_first_rejection_is_written_at_once_whatever_the_clock_reads(
        limits: Callable[..., Awaitable[Decider]], caplog: pytest.LogCaptureFixture) -> None:
    service = await limits(CONFIG, over_limit_log_interval="0")
    clock = Seconds()
    clock.now = 5000.7  # 5000.7 - (5000.7 - 0.2) < 0.2 in floating point: "an interval ago" must not be computed
    service.app.service.decider.watch(OverLimitLog(0.2, clock=clock))
    caplog.set_level(logging.INFO, logger="slidegate.overlimit")
    for _ in range(2):
        await service.should_rate_limit(request("o", descriptor(("user", "f"))))
    assert lines(caplog) == ["over limit: rule per-user rejected 1 request in the last 0 s, the latest with "
                             "descriptor user=f"]


async def test_a_request_rejected_twice_by_one_rule_is_counted_once(
        limits: Callable[..., Awaitable[Decider]], caplog: pytest.LogCaptureFixture) -> None:
    service = await limits(CONFIG, over_limit_log_interval="0")
    clock = Seconds()
    service.app.service.decider.watch(OverLimitLog(10.0, clock=clock))
    caplog.set_level(logging.INFO, logger="slidegate.overlimit")
    for user in ("a", "b"):
        await service.should_rate_limit(request("o", descriptor(("user", user))))
    both = request("o", descriptor(("user", "a")), descriptor(("user", "b")), descriptor(("user", "a")))
    codes = [(await service.should_rate_limit(both)).overall_code for _ in range(5)]
    assert codes == [OVER_LIMIT] * 5
    clock.now += 10
    await service.should_rate_limit(request("o", descriptor(("path", "/p")), descriptor(("path", "/p"))))
    await service.should_rate_limit(both)
    assert [line.split(" in the last")[0] for line in lines(caplog)] == [
        "over limit: rule per-user rejected 1 request",  # each of its descriptors over, one request
        "over limit: rule path rejected 1 request",  # named twice: 2 hits where 1 fits
        "over limit: rule per-user rejected 5 requests"]


async def test_a_log_written_in_a_new_event_loop_still_gets_its_delayed_line(
        limits: Callable[..., Awaitable[Decider]], caplog: pytest.LogCaptureFixture) -> None:
    service = await limits(CONFIG, over_limit_log_interval="0")
    decisions: list[Decision] = []
    service.app.service.decider.watch(decisions.append)
    for _ in range(4):
        await service.should_rate_limit(request("o", descriptor(("user", "n"))))
    rejected = [d for d in decisions if d.rejected]
    assert len(rejected) == 3
    caplog.set_level(logging.INFO, logger="slidegate.overlimit")
    overlimit = OverLimitLog(0.2)

    async def burst(wait: float) -> None:
        for decision in rejected:
            overlimit(decision)
        await asyncio.sleep(wait)

    await asyncio.to_thread(asyncio.run, burst(0))  # its loop closed before the delayed line was due
    assert len(lines(caplog)) == 1
    await asyncio.to_thread(asyncio.run, burst(0.5))  # a new loop (as after a restart) within the interval
    assert [line.split(" in the last")[0] for line in lines(caplog)] == [
        "over limit: rule per-user rejected 1 request",
        "over limit: rule per-user rejected 5 requests"]  # the first loop's 2 and the new one's 3, by its timer
