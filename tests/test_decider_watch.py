"""Decider.watch: a watcher hears of every decision, on every backend, and of nothing that went undecided."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from slidegate.decider import Decision
from slidegate.request import InvalidRequest
from tests.conftest import Decider
from tests.helpers import OVER_LIMIT, descriptor, request

CONFIG = """
domain: w
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
"""


async def test_a_watcher_hears_each_decision_with_its_rule(limits: Callable[..., Awaitable[Decider]]) -> None:
    service = await limits(CONFIG)
    heard: list[Decision] = []
    service.app.service.decider.watch(heard.append)
    codes = [(await service.should_rate_limit(request("w", descriptor(("user", "u1"))))).overall_code
             for _ in range(3)]
    with pytest.raises(InvalidRequest):
        await service.should_rate_limit(request("", descriptor(("user", "u1"))))  # no domain: refused, undecided
    assert codes[2] == OVER_LIMIT
    assert [d.rejected for d in heard] == [False, False, True]
    assert [d.statuses[0].remaining for d in heard] == [1, 0, 0]
    rule = heard[2].statuses[0].rule
    assert rule is not None and rule.key == "user" and rule.source.endswith(":4")
