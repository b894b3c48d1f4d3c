"""The top limited callers of a running `slidegate serve`: GET /limited on the debug port, one merged view of every
worker whichever answers, and the page /limited/page as headless Chromium shows it.

SLIDEGATE_SCREENSHOT=docs/limited-page.png writes the page's screenshot there (docs/operations.md shows it);
without it the screenshot goes to the test's temporary directory."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from slidegate.protos import rls_pb2_grpc
from tests.helpers import OK, descriptor, request
from tests.served import Served, wait_for
from tests.test_limited import CONFIG, rule

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def limited(served: Served) -> dict[str, Any]:
    status, text = served.http("/limited", port=served.debug_port)
    assert status == 200, text
    found: dict[str, Any] = json.loads(text)
    return found


def calls(served: Served, entries: list[tuple[str, str]]) -> list[int]:
    """One call per entry, each on a connection of its own (so that workers share them), 16 at a time."""
    def call(entry: tuple[str, str]) -> int:
        with grpc.insecure_channel(f"127.0.0.1:{served.grpc_port}",
                                   options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
            stub = rls_pb2_grpc.RateLimitServiceStub(channel)
            return int(stub.ShouldRateLimit(request("web", descriptor(entry)), timeout=5).overall_code)

    with ThreadPoolExecutor(16) as pool:
        return list(pool.map(call, entries))


def test_every_worker_answers_the_view_of_all(write_config: Callable[..., Path],
                                              serve: Callable[..., Served]) -> None:
    served = serve(write_config(CONFIG), "--workers", "2", "--redis-timeout", "5s")  # the machine may be loaded
    assert wait_for(lambda: served.output().count("listening for gRPC") == 2, timeout=15)
    codes = calls(served, [("generic_key", "api.login")] * 60 + [("user", "mallory")] * 25 + [("user", "eve")] * 12)
    assert codes.count(OK) == 40 + 10 + 10

    def merged() -> bool:  # each GET a connection of its own: either worker may answer
        views = [limited(served) for _ in range(8)]
        return all(v["workers"] == 2 and rule(v, "login")["windows"]["1m"]["over_limit"] == 20
                   and rule(v, "user")["windows"]["1m"]["over_limit"] == 17 for v in views)

    assert wait_for(merged, timeout=10)
    user = rule(limited(served), "user")["windows"]["15m"]
    assert user["decisions"] == 37
    assert [(c["value"], c["count"]) for c in user["top_over_limit"]] == [("user=mallory", 15), ("user=eve", 2)]


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")
def test_the_page_shows_each_rule_and_its_top_callers(write_config: Callable[..., Path],
                                                      serve: Callable[..., Served], tmp_path: Path) -> None:
    served = serve(write_config(CONFIG), "--top-limited-values", "plain", "--redis-timeout", "5s")
    calls(served, [("user", "mallory")] * 18 + [("user", "alice")] * 9 + [("user", "<b>bob</b>")] * 11
          + [("generic_key", "api.login")] * 45)
    page = f"http://127.0.0.1:{served.debug_port}/limited/page"
    browser = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}",
               "--virtual-time-budget=4000"]
    dom = subprocess.run([*browser, "--dump-dom", page], capture_output=True, text=True, timeout=90).stdout
    cards = dict(re.findall(r'<section class="rule" data-rule="([^"]+)">(.*?)</section>', dom))
    assert list(cards) == ["user", "login"]  # the most over limit first
    user = cards["user"]
    assert 'limit 10 per hour' in user and 'class="over-limit">9</b> (23.7%)' in user
    over, near = re.findall(r"<table>(.*?)</table>", user)
    callers = re.findall(r'<tr class="caller"><td>(.*?)</td><td class="n">(\d+)</td></tr>', over)
    assert callers == [("user=mallory", "8"), ("user=&lt;b&gt;bob&lt;/b&gt;", "1")]  # a value is text, never HTML
    nearest = re.findall(r'<tr class="caller"><td>(.*?)</td><td class="n">(\d+)</td></tr>', near)
    assert sorted(nearest) == [("user=&lt;b&gt;bob&lt;/b&gt;", "2"), ("user=alice", "1"), ("user=mallory", "2")]
    assert "<b>bob</b>" not in dom
    assert re.search(r'class="over-limit">5</b>', cards["login"])
    shot = Path(os.environ.get("SLIDEGATE_SCREENSHOT") or tmp_path / "limited-page.png").resolve()
    subprocess.run([*browser, "--hide-scrollbars", "--window-size=1000,820", f"--screenshot={shot}", page],
                   capture_output=True, timeout=90, check=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
