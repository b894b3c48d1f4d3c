"""bench/instructions.py counts only calls that were decided: its calls are checked, answer by answer and in Redis."""

from __future__ import annotations

from dataclasses import replace

import pytest
import redis

from bench import instructions
from slidegate.application import build


@pytest.mark.parametrize(("flat", "over"), [(False, False), (True, False), (False, True)],
                         ids=["service", "flat path", "over its limit"])
async def test_the_counted_calls_are_decided_and_their_key_removed(redis_url: str, key_prefix: str,
                                                                   flat: bool, over: bool) -> None:
    # exits with the reason when a call goes wrong
    await instructions.calls(redis_url, 3, key_prefix, flat=flat, over=over)
    assert list(redis.Redis.from_url(redis_url).scan_iter(f"{key_prefix}*")) == []


@pytest.mark.parametrize("over", [False, True], ids=["service", "over its limit"])
async def test_the_calls_told_to_the_top_limited_callers_are_decided_too(redis_url: str, key_prefix: str,
                                                                         over: bool) -> None:
    await instructions.calls(redis_url, 3, key_prefix, over=over, top=True)
    assert list(redis.Redis.from_url(redis_url).scan_iter(f"{key_prefix}*")) == []


async def test_a_wrong_count_stops_the_run(redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # a rule the calls' descriptor does not match: each call is answered OK, and none is counted
    monkeypatch.setattr(instructions, "CONFIG", instructions.CONFIG.replace("sliding_window_log", "fixed_window"))
    with pytest.raises(SystemExit, match="0 calls counted in Redis, 8 expected of 8 made"):
        await instructions.calls(redis_url, 3, key_prefix)


async def test_calls_over_their_limit_are_answered_over_limit(redis_url: str, key_prefix: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # a limit the calls fit in: the second is answered OK where OVER_LIMIT is due
    monkeypatch.setattr(instructions, "CONFIG", instructions.CONFIG.replace("requests_per_unit: 1}",
                                                                            "requests_per_unit: 100}"))
    with pytest.raises(SystemExit, match=r"(?s)call 2 was answered .*, not OVER_LIMIT"):
        await instructions.calls(redis_url, 3, key_prefix, over=True)


async def test_calls_over_their_limit_are_answered_from_the_over_limit_cache(
        redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # without the cache (a size of 0) every call over its limit goes to Redis: not the path --over counts
    monkeypatch.setattr(instructions, "build", lambda settings: build(replace(settings, local_cache_size_in_bytes=0)))
    with pytest.raises(SystemExit, match="0 calls answered from the over-limit cache, 6 expected"):
        await instructions.calls(redis_url, 3, key_prefix, over=True)
