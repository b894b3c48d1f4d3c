"""bench/instructions.py counts only calls that were decided: its calls are checked, answer by answer and in Redis."""

from __future__ import annotations

import pytest
import redis

from bench import instructions


async def test_the_counted_calls_are_decided_and_their_key_removed(redis_url: str) -> None:
    before = set(redis.Redis.from_url(redis_url).scan_iter("bench-instructions-*"))
    await instructions.calls(redis_url, 3)  # exits with the reason when a call is answered or counted wrongly
    assert set(redis.Redis.from_url(redis_url).scan_iter("bench-instructions-*")) == before


async def test_a_wrong_count_stops_the_run(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # a limit other than the one the calls hit: nothing is counted under the key the check reads
    monkeypatch.setattr(instructions, "CONFIG", instructions.CONFIG.replace("sliding_window_log", "fixed_window"))
    with pytest.raises(SystemExit, match="0 calls counted in Redis, 8 made"):
        await instructions.calls(redis_url, 3)
