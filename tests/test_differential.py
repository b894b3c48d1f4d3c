"""The deliberate differences from envoyproxy/ratelimit, kept: every sequence in which bench/compare.py found
slidegate answering otherwise than the reference on purpose (docs/migrating.md documents each), replayed against
slidegate alone, expecting the answers it gave in that run (tests/differential/deliberate.json, written by
`bench/compare.py --reference BINARY --record tests/differential/deliberate.json`).

The run's settings (its profile) and DEFAULT_ALGORITHM=fixed_window are used here, on the suite's Redis with an
injected clock: every request falls in one window, as in the run (which skipped any sequence a window's end
cut), so counts, codes and headers must be the recorded ones; the seconds until a window's end are the run's
clock's, so they are not compared. The dynamic metadata is not compared either: its layout is an open
difference from the reference (not a deliberate one), which the run prints as such."""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from aiohttp.test_utils import TestClient, TestServer
from google.protobuf import json_format
from grpc_health.v1.health import HealthServicer

from bench.compare_known import KNOWN, MIGRATING
from bench.compare_model import Request, answer_of, differences, json_answer, recordable
from bench.compare_servers import COMMON, PROFILES
from slidegate.application import build
from slidegate.config.errors import ConfigError
from slidegate.health import Health
from slidegate.httpapi import make_app
from slidegate.protos import rls_pb2_grpc
from slidegate.server import start_server
from slidegate.settings import Settings
from tests.conftest import Clock

RECORDED = json.loads((Path(__file__).parent / "differential" / "deliberate.json").read_text())
Ask = Callable[[Request], Awaitable[dict[str, Any]]]


@pytest.fixture
async def slidegate(tmp_path: Path, redis_url: str, key_prefix: str,
                    clock: Clock) -> AsyncIterator[Callable[[str, str], Awaitable[Ask]]]:
    """``await slidegate(profile, config_text)``: a function asking slidegate, built as `slidegate serve` builds
    it with the profile's settings, over gRPC or POST /json as the request says."""
    closing: list[Callable[[], Awaitable[Any]]] = []

    async def start(profile: str, config: str) -> Ask:
        directory = Path(tempfile.mkdtemp(dir=tmp_path, prefix="config"))
        (directory / "config.yaml").write_text(config)
        flags = {"config_dir": str(directory), "redis_url": redis_url, "cache_key_prefix": key_prefix,
                 "default_algorithm": "fixed_window", "redis_persecond_url": redis_url}  # the per-second Redis too
        app = build(Settings.load({**COMMON, **PROFILES[profile]}, flags), clock=clock)
        server, _, port = await start_server(app.service, "127.0.0.1", 0)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        http = TestClient(TestServer(make_app(app.service, lambda: app.holder.current, Health(HealthServicer()))))
        await http.start_server()
        closing.extend([http.close, lambda: channel.close(None), lambda: server.stop(0), app.backend.close])

        async def ask(request: Request) -> dict[str, Any]:
            if request.via == "json":
                reply = await http.post("/json", data=json_format.MessageToJson(request.message()))
                return json_answer(reply.status, await reply.text())
            try:
                return answer_of(await stub.ShouldRateLimit(request.message(), timeout=5))
            except grpc.aio.AioRpcError as error:
                return {"grpc_error": error.code().name}

        return ask

    yield start
    for close in closing:
        await close()


@pytest.mark.redis
@pytest.mark.parametrize("name", sorted(RECORDED))
async def test_slidegate_answers_as_it_did_beside_the_reference(
        name: str, slidegate: Callable[[str, str], Awaitable[Ask]]) -> None:
    """A step that reloaded the config is replayed as a new service on the new config and the same counters (a
    config that does not load keeps the service on the old one, as a reload does); the watcher that notices the
    change has tests of its own (test_reload.py)."""
    recorded = RECORDED[name]
    ask = await slidegate(recorded["profile"], recorded["config"])
    for step, expected in enumerate(recorded["steps"]):
        request = Request.from_data(expected["request"])
        if request.via == "reload":
            with contextlib.suppress(ConfigError):
                ask = await slidegate(recorded["profile"], request.config)
            got = {"reloaded": True}
        else:
            got = recordable(await ask(request))
        changed = list(differences(expected["answer"], got, tolerance=float("inf")))
        assert not changed, f"{name} #{step}: {changed}"


@pytest.mark.unit
def test_every_difference_bench_compare_calls_deliberate_is_documented_in_migrating() -> None:
    """bench/compare.py marks a difference deliberate only while docs/migrating.md holds its words: each
    phrase must be there as written (on one line), or the harness would print those differences unexplained."""
    text = MIGRATING.read_text()
    missing = [known.name for known in KNOWN if known.documented_by not in text]
    assert not missing, f"docs/migrating.md no longer documents: {missing}"
