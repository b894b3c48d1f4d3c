"""bench/run.py fails a run that answers any call wrongly: what its check reads from slidegate's counters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.run import parse_counters, wrong_answers
from slidegate.backends.memory import MemoryBackend
from slidegate.client import build_request
from slidegate.config import load_directory
from slidegate.limiter import Limiter, LimiterOptions
from slidegate.service import RateLimitService
from tests.conftest import FailingBackend


class Context:
    """What the service asks of a gRPC call's context."""

    def time_remaining(self) -> float | None:
        return None

    async def abort(self, code: Any, details: str) -> None:
        raise RuntimeError(f"{code}: {details}")


def service_for(tmp_path: Path, backend: Any = None) -> RateLimitService:
    (tmp_path / "config.yaml").write_text(
        "domain: bench\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n")
    config = load_directory(tmp_path)
    return RateLimitService(Limiter(lambda: config, backend or MemoryBackend(), LimiterOptions()))


def counters(service: RateLimitService) -> dict[Any, float]:
    return parse_counters(service.metrics.render().decode())


async def test_calls_decided_as_expected_are_not_wrong(tmp_path: Path) -> None:
    service = service_for(tmp_path)
    before = counters(service)
    request = build_request("bench", [[("k", "v")]]).SerializeToString()
    for _ in range(3):
        await service.should_rate_limit(request, Context())  # type: ignore[arg-type]
    after = counters(service)
    assert wrong_answers(before, after, 3, 3, 1) == []  # a limit of 2: the third is over
    assert wrong_answers(before, after, 3, 3, 0) == ["hits over limit: 1, expected 0"]
    assert wrong_answers(before, after, 4, 4, 1) == ["calls: 3, expected 4", "hits: 3, expected 4"]


async def test_calls_refused_or_decided_by_the_failure_mode_are_wrong(tmp_path: Path) -> None:
    service = service_for(tmp_path, FailingBackend())
    before = counters(service)
    with pytest.raises(RuntimeError, match="UNAVAILABLE"):
        await service.should_rate_limit(build_request("bench", [[("k", "v")]]).SerializeToString(),
                                        Context())  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="INVALID_ARGUMENT"):
        await service.should_rate_limit(b"\xff not a request", Context())  # type: ignore[arg-type]
    assert wrong_answers(before, counters(service), 2, 0, 0) == [
        "calls refused as invalid: 1, expected 0", "storage errors: 1, expected 0"]
