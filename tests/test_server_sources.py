"""Either config source drives `slidegate serve` the same way (slidegate.config_source): a Server on the test's
loop, fed from a config directory or from a real ADS server (tests/ads_server.py), reaches ready with the first
config, serves a changed one, takes SIGHUP (a forced reload of the files; a note for xDS, the process alive) and
stops when told."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import aiohttp
import pytest

from slidegate.protos import rls_conf_pb2 as conf
from slidegate.server import Server
from slidegate.settings import Settings
from tests.ads_server import AdsServer

LOCAL = {"BACKEND_TYPE": "memory", "GRPC_HOST": "127.0.0.1", "GRPC_PORT": "0", "HOST": "127.0.0.1", "PORT": "0",
         "DEBUG_HOST": "127.0.0.1", "DEBUG_PORT": "0", "USE_STATSD": "false"}


class Files:
    """The config directory as the source; ``set`` rewrites its one file with one domain."""

    sighup = "config reloaded: 1 domains"  # the files loaded again, unchanged as they are

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.set("d1")
        self.settings = Settings.load({**LOCAL, "CONFIG_DIR": str(directory), "CONFIG_SETTLE_TIME": "50ms"})

    def set(self, domain: str) -> None:
        (self.directory / "limits.yaml").write_text(
            f"domain: {domain}\ndescriptors:\n  - key: k\n    rate_limit: {{unit: minute, requests_per_unit: 5}}\n")


class Xds:
    """An ADS server as the source; ``set`` serves a snapshot of one domain. A slow control plane: the first
    snapshot comes 0.5 s after the start, which serve must wait for before it is ready."""

    sighup = "SIGHUP: the config comes over xDS, nothing to reload"

    def __init__(self, ads: AdsServer) -> None:
        self.ads = ads
        self.first = threading.Timer(0.5, self.set, ("d1",))
        self.first.start()
        self.settings = Settings.load({
            **LOCAL, "CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": f"127.0.0.1:{ads.port}",
            "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "100ms", "XDS_CLIENT_BACKOFF_MAX_INTERVAL": "200ms"})

    def set(self, domain: str) -> None:
        self.ads.set([conf.RateLimitConfig(name=domain, domain=domain, descriptors=[conf.RateLimitDescriptor(
            key="k", rate_limit=conf.RateLimitPolicy(unit=conf.MINUTE, requests_per_unit=5))])])


@pytest.fixture(params=["files", "xds"])
def source(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Files | Xds]:
    if request.param == "files":
        yield Files(tmp_path)
        return
    ads = AdsServer()
    ads.start()
    xds = Xds(ads)
    try:
        yield xds
    finally:
        xds.first.cancel()
        ads.stop()


async def until(condition: Callable[[], Awaitable[bool]], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        assert time.monotonic() < deadline, "not within the time"
        await asyncio.sleep(0.05)


async def started(server: Server) -> asyncio.Task[None]:
    """``server`` serving on this loop, once ready; its start's error is raised."""
    ready = asyncio.Event()
    serving = asyncio.create_task(server.serve(ready))
    readied = asyncio.create_task(ready.wait())
    await asyncio.wait((serving, readied), timeout=15, return_when=asyncio.FIRST_COMPLETED)
    readied.cancel()
    if serving.done():
        serving.result()
    assert ready.is_set(), "not ready within 15 s"
    return serving


async def test_either_source_serves_reloads_and_takes_sighup(source: Files | Xds,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    server = Server(source.settings)
    serving = await started(server)
    try:
        async with aiohttp.ClientSession() as http:

            async def rlconfig() -> str:
                async with http.get(f"http://127.0.0.1:{server.http_port}/rlconfig") as reply:
                    assert reply.status == 200
                    return await reply.text()

            async def loaded(domain: str) -> bool:
                return f"domain {domain} (" in await rlconfig()

            assert await loaded("d1")  # ready only with the first config in force
            source.set("d2")
            await until(lambda: loaded("d2"))
            assert not await loaded("d1")

            before = len(caplog.records)
            os.kill(os.getpid(), signal.SIGHUP)  # the handler serve set: the test's process is not ended

            async def sighup_taken() -> bool:
                return any(source.sighup in record.getMessage() for record in caplog.records[before:])

            await until(sighup_taken)
            assert await loaded("d2")
    finally:
        server.stop.set()
        await asyncio.wait_for(serving, 10)
    assert "stopped" in caplog.messages
