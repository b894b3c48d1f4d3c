"""The top limited callers (slidegate.limited, slidegate.limited_view) told of real decisions of the memory
backend: each rule's counts, its callers over and near the limit by window, the values as TOP_LIMITED_VALUES
shows them, and the views of several workers merged."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from slidegate.application import Application, build
from slidegate.decider import LimitRequest
from slidegate.heavy_hitters import SpaceSaving
from slidegate.limited import TopLimited
from slidegate.limited_settings import ShownValues
from slidegate.limited_view import LimitedView, render
from slidegate.limiter import Descriptor
from slidegate.page import routes
from slidegate.settings import Settings

CONFIG = """
domain: web
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: generic_key
    value: api.login
    rate_limit: {unit: hour, requests_per_unit: 40, name: login}
  - key: free
    rate_limit: {unlimited: true}
"""
START = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


def app_for(write_config: Callable[..., Path]) -> Application:
    return build(Settings.load({}, {"config_dir": str(write_config(CONFIG)), "backend_type": "memory"}))


async def send(app: Application, key: str, value: str, times: int) -> None:
    for _ in range(times):
        await app.service.decider.decide(LimitRequest("web", [_descriptor(key, value)]))


def _descriptor(key: str, value: str) -> Descriptor:
    return Descriptor(((key, value),))


def watched(app: Application, values: ShownValues = ShownValues.PLAIN, clock: Clock | None = None,
            hash_key: bytes = b"") -> TopLimited:
    top = TopLimited(values, capacity=8, hash_key=hash_key, clock=clock or Clock())
    app.service.decider.watch(top.watch)
    return top


def rule(view: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for r in view["rules"] if r["rule"] == name)


async def test_callers_over_and_near_their_limit_are_counted_by_rule(write_config: Callable[..., Path]) -> None:
    app = app_for(write_config)
    top = watched(app)
    await send(app, "user", "mallory", 25)  # 10 admitted (the 9th and 10th near: 80% used), 15 over
    await send(app, "user", "alice", 9)  # the 9th near
    await send(app, "user", "bob", 3)
    await send(app, "free", "x", 5)  # unlimited: not counted
    view = await LimitedView(top).view(top=5)
    user = rule(view, "user")
    one = user["windows"]["1m"]
    assert (one["decisions"], one["over_limit"], one["near_limit"]) == (37, 15, 3)
    assert one["top_over_limit"] == [{"value": "user=mallory", "count": 15, "error": 0}]
    assert [(c["value"], c["count"]) for c in one["top_near_limit"]] == [("user=mallory", 2), ("user=alice", 1)]
    assert user["limit"] == {"requests_per_unit": 10, "unit": "hour", "unit_multiplier": 1, "name": ""}
    assert user["source"].endswith("config.yaml:4")
    assert [r["rule"] for r in view["rules"]] == ["user"]
    assert sum(user["decisions"]) == 37 and user["decisions"][-1] == 37


async def test_windows_keep_the_last_one_five_and_fifteen_minutes(write_config: Callable[..., Path]) -> None:
    app = app_for(write_config)
    clock = Clock()
    top = watched(app, clock=clock)
    view = LimitedView(top)
    await send(app, "generic_key", "api.login", 43)  # 3 over
    clock.now += 4 * 60
    await view.view()  # the clock followed
    await send(app, "generic_key", "api.login", 2)
    login = rule(await view.view(), "login")["windows"]
    assert [login[w]["over_limit"] for w in ("1m", "5m", "15m")] == [2, 5, 5]
    assert login["1m"]["top_over_limit"][0]["count"] == 2
    assert login["5m"]["top_over_limit"] == [{"value": "generic_key=api.login", "count": 5, "error": 0}]
    clock.now += 16 * 60  # nothing since: the rule has gone idle and is dropped
    assert (await view.view())["rules"] == []


async def test_values_are_shown_hashed_or_not_kept(write_config: Callable[..., Path]) -> None:
    app = app_for(write_config)
    hashed = watched(app, ShownValues.HASHED, hash_key=b"k" * 32)
    other_key = watched(app, ShownValues.HASHED, hash_key=b"j" * 32)
    none = watched(app, ShownValues.NONE)
    await send(app, "user", "mallory@example.com", 12)
    shown = [rule(await LimitedView(t).view(), "user")["windows"]["1m"] for t in (hashed, other_key, none)]
    assert len(shown[0]["top_over_limit"]) == 1
    digest = shown[0]["top_over_limit"][0]["value"]
    assert "mallory" not in str(shown[0]) and len(digest) == 16
    assert shown[1]["top_over_limit"][0]["value"] != digest  # keyed: another key, another hash
    assert shown[2]["top_over_limit"] == [] and shown[2]["over_limit"] == 2
    await send(app, "user", "mallory@example.com", 1)
    assert rule(await LimitedView(hashed).view(), "user")["windows"]["1m"]["top_over_limit"][0]["value"] == digest


async def test_the_views_of_several_workers_add_up(write_config: Callable[..., Path]) -> None:
    apps = [app_for(write_config), app_for(write_config)]
    tops = [watched(app) for app in apps]
    await send(apps[0], "user", "mallory", 14)
    await send(apps[1], "user", "mallory", 13)
    await send(apps[1], "user", "eve", 11)
    view = render([t.snapshot() for t in tops], 3, START)
    one = rule(view, "user")["windows"]["1m"]
    assert view["workers"] == 2
    assert (one["decisions"], one["over_limit"]) == (38, 8)
    assert [(c["value"], c["count"]) for c in one["top_over_limit"]] == [("user=mallory", 7), ("user=eve", 1)]


async def test_a_bad_top_is_refused_with_a_reason(write_config: Callable[..., Path]) -> None:
    app = app_for(write_config)
    served = web.Application()
    served.add_routes(routes(LimitedView(watched(app))))
    async with TestClient(TestServer(served)) as client:
        for top in ("x", "0"):
            reply = await client.get(f"/limited?top={top}")
            assert reply.status == 400 and "top" in (await reply.json())["error"]
        page = await client.get("/limited/page")
        assert page.status == 200 and page.content_type == "text/html"


@pytest.mark.parametrize("capacity", [0, -1])
def test_a_summary_of_no_room_is_refused(capacity: int) -> None:
    with pytest.raises(ValueError, match="at least one"):
        SpaceSaving(capacity)
