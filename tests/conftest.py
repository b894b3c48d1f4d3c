"""Shared fixtures. Tests use the Redis at REDIS_URL (default 127.0.0.1:6379) when it answers, else a private
redis-server started here; every test works under its own key prefix and never flushes a shared Redis."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import textwrap
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path

import grpc
import pytest
import redis

from slidegate.algorithms import Algorithm
from slidegate.application import Application, build, make_backend
from slidegate.backends.base import Backend, BackendUnavailable, Check, Decision
from slidegate.protos import lenient_pb2, rls_pb2, rls_pb2_grpc
from slidegate.request import parse_request
from slidegate.resources import lua_script
from slidegate.server import start_server
from slidegate.settings import Settings
from tests import redis_servers
from tests.backends import STORAGES, Backing, params, redis_urls, settings_for
from tests.redis_servers import INSTALL_HINT, RedisServer
from tests.redis_topologies import Cluster, SentinelGroup
from tests.served import Served, Starter

TIERS = ("unit", "redis", "topology", "envoy")
# what puts a test in a tier when it is not marked with one: a module of its (Envoy started by the test itself or
# by the demo) or a fixture it asks for, the later tiers first; a test needing none of them is a unit test
ENVOY_MODULES = {"test_envoy", "test_rlqs_envoy", "test_demo"}
TOPOLOGY_MODULES = {"test_topologies", "test_failover", "test_cluster_all_or_nothing", "test_fault_suite"}
TOPOLOGY_FIXTURES = {"private_redis", "cluster", "sentinel", "serve"}
REDIS_FIXTURES = {"redis_url"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        marked = [tier for tier in TIERS if item.get_closest_marker(tier)]
        if len(marked) > 1:
            raise pytest.UsageError(f"{item.nodeid} is marked with tiers {', '.join(marked)}: one at most")
        if not marked:
            item.add_marker(_tier_of(item))


def _tier_of(item: pytest.Item) -> str:
    module = item.module.__name__.rpartition(".")[2] if isinstance(item, pytest.Function) else ""
    fixtures = set(getattr(item, "fixturenames", ()))
    if module in ENVOY_MODULES:
        return "envoy"
    if module in TOPOLOGY_MODULES or fixtures & TOPOLOGY_FIXTURES:
        return "topology"
    if fixtures & REDIS_FIXTURES:
        return "redis"
    return "unit"


@pytest.fixture(autouse=True)
def unit_tests_start_no_server(request: pytest.FixtureRequest) -> Iterator[None]:
    """A unit-tier test that starts a redis-server or asks for the suite's Redis fails, saying so: the tier is
    what answers in a minute on any machine."""
    if request.node.get_closest_marker("unit") is None:
        yield
        return
    redis_servers.REFUSED = f"{request.node.nodeid} is a unit test: it may not start a redis-server (mark it redis)"
    try:
        yield
    finally:
        redis_servers.REFUSED = ""


@pytest.fixture(scope="session", autouse=True)
def no_lock_files_left() -> Iterator[None]:
    """`serve --workers` leaves a lock file per port in the temporary directory (removing it while running would
    race its lock): the ones this session made go when it ends, unless someone holds them still."""
    directory = Path(tempfile.gettempdir())
    before = set(directory.glob("slidegate-port-*.lock"))
    yield
    for path in set(directory.glob("slidegate-port-*.lock")) - before:
        with contextlib.suppress(OSError), path.open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            path.unlink()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    if redis_servers.REFUSED:
        raise RuntimeError(redis_servers.REFUSED)
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
        client.ping()
        client.close()
        yield url
        return
    except ValueError as exc:
        pytest.exit(f"REDIS_URL={url!r} is not a Redis URL ({exc}); unset it or fix it", returncode=3)
    except (redis.RedisError, OSError):
        pass
    try:
        server = RedisServer().start()
    except RuntimeError as exc:
        pytest.exit(f"no Redis at {url} and {exc}" if "not found" not in str(exc) else INSTALL_HINT, returncode=3)
    yield server.url
    server.cleanup()


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture(scope="session")
def keep_alive(redis_url: str) -> Iterator[str]:
    """The name of a Redis function (loaded for the session, deleted after it) that runs lua/decide.lua and then
    makes every key it was given live at least ten minutes more: tests that inject a clock far from real time
    must not see a key expire on real time first (a bucket 2 ms from full has a TTL of 2 ms)."""
    library = f"sgtest_{uuid.uuid4().hex}"
    source = "\n".join([
        f"#!lua name={library}",
        "local function decide(KEYS, ARGV)", lua_script([a.value for a in Algorithm]), "end",
        f"redis.register_function('{library}', function(keys, args)",
        "  local reply = decide(keys, args)",
        "  for _, key in ipairs(keys) do redis.call('PEXPIRE', key, 600000, 'GT') end",
        "  return reply",
        "end)",
    ])
    client = redis.Redis.from_url(redis_url)
    client.execute_command("FUNCTION", "LOAD", source)
    yield library
    client.execute_command("FUNCTION", "DELETE", library)
    client.close()


def delete_keys(url: str, prefix: str) -> None:
    client = redis.Redis.from_url(url)  # keys as bytes: some tests store values that are not UTF-8
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def key_prefix(request: pytest.FixtureRequest) -> Iterator[str]:
    """A prefix no other test uses; the test's keys are deleted afterwards from the suite's Redis, if the test
    asked for it (a test on the memory backend needs no server)."""
    prefix = f"sgtest-{uuid.uuid4().hex[:12]}:"
    yield prefix
    if "redis_url" in request.fixturenames:
        delete_keys(request.getfixturevalue("redis_url"), prefix)


@pytest.fixture(scope="session")
def persecond_redis() -> Iterator[RedisServer]:
    """The per-second Redis of the ``persecond`` backends (tests/backends.py), the session's own."""
    server = RedisServer().start()
    yield server
    server.cleanup()


@pytest.fixture(scope="session")
def shared_sentinel() -> Iterator[SentinelGroup]:
    """The Sentinel set of the ``sentinel`` backends: the session's own, never failed over."""
    group = SentinelGroup()
    yield group
    group.cleanup()


@pytest.fixture(scope="session")
def shared_cluster() -> Iterator[Cluster]:
    """The Cluster of the ``cluster`` backends: three masters with a replica each, the session's own."""
    cluster = Cluster()
    yield cluster
    cluster.cleanup()


@pytest.fixture(params=params())
def backing(request: pytest.FixtureRequest) -> Backing:
    """Each backend the product offers in turn (tests/backends.py)."""
    chosen: Backing = request.param
    return chosen


@pytest.fixture(params=params(STORAGES))
def storage(request: pytest.FixtureRequest) -> Backing:
    """Each storage in turn (tests/backends.py's STORAGES): for tests that make their checks by hand."""
    chosen: Backing = request.param
    return chosen


@pytest.fixture
def backend_settings(backing: Backing, request: pytest.FixtureRequest, key_prefix: str) -> Iterator[dict[str, str]]:
    """The settings (flag names, values as text) choosing ``backing``, under the test's ``key_prefix``; the
    test's keys on a Redis it may share with others are deleted afterwards."""
    flags = {**settings_for(backing, request), "cache_key_prefix": key_prefix}
    yield flags
    for url in redis_urls(flags):
        delete_keys(url, key_prefix)


@pytest.fixture
async def backend(storage: Backing, request: pytest.FixtureRequest, key_prefix: str) -> AsyncIterator[Backend]:
    """Each storage in turn, made as `slidegate serve` makes it; keys are the test's to prefix (``key_prefix``),
    and deleted after it from a Redis it may share."""
    flags = settings_for(storage, request)
    made = make_backend(Settings.load({}, flags))
    yield made
    await made.close()
    for url in redis_urls(flags):
        delete_keys(url, key_prefix)


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    """A redis-server of the test's own, already started; the test may stop and start it."""
    server = RedisServer().start()
    yield server
    server.cleanup()


@pytest.fixture
def write_config(tmp_path: Path) -> Callable[..., Path]:
    """``write_config(yaml_text, name="config.yaml")`` writes a config file into a fresh directory and returns
    the directory."""
    directory = tmp_path / "config"
    directory.mkdir()

    def write(text: str, name: str = "config.yaml") -> Path:
        (directory / name).write_text(textwrap.dedent(text))
        return directory

    return write


class Clock:
    """An injectable clock in microseconds."""

    def __init__(self, now_us: int = 1_700_000_000_000_000) -> None:
        self.now_us = now_us

    def __call__(self) -> int:
        return self.now_us

    def advance(self, seconds: float) -> None:
        self.now_us += round(seconds * 1_000_000)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def rls(
    write_config: Callable[..., Path], redis_url: str, key_prefix: str, clock: Clock
) -> AsyncIterator[Callable[..., Awaitable[rls_pb2_grpc.RateLimitServiceStub]]]:
    """``await rls(yaml_text, url=None, timeout=0.25, use_clock=True, **settings)`` starts an in-process gRPC
    service on a free port, built as `slidegate serve` builds it (slidegate.application) with ``settings``
    (field names, values as their flags' text), and returns a stub for it."""
    started: list[tuple[grpc.aio.Server, Backend, grpc.aio.Channel]] = []

    async def start(
        text: str, *, url: str | None = None, timeout: float = 0.25, use_clock: bool = True, **settings: str,
    ) -> rls_pb2_grpc.RateLimitServiceStub:
        flags = {"config_dir": str(write_config(text)), "redis_url": url or redis_url,
                 "redis_timeout": str(timeout), "cache_key_prefix": key_prefix, **settings}
        app = build(Settings.load({}, flags), clock=clock if use_clock else None)
        server, _, port = await start_server(app.service, "127.0.0.1", 0)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        started.append((server, app.backend, channel))
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        stub.channel = channel  # type: ignore[attr-defined]  # for tests that call the method with their own serializer
        return stub

    yield start
    for server, backend, channel in started:
        await channel.close(None)
        await server.stop(0)
        await backend.close()


class Decider:
    """A service built as `slidegate serve` builds it, asked without a gRPC server: a request is read as a call's
    bytes are (slidegate.request.parse_request), then decided by the service, its limiter and its storage. For the
    rules' tests; the wire contract has its own (test_service.py, test_wire.py)."""

    def __init__(self, app: Application) -> None:
        self.app = app

    async def should_rate_limit(self, request: rls_pb2.RateLimitRequest,
                                timeout: float | None = None) -> rls_pb2.RateLimitResponse:
        """The answer to ``request`` within ``timeout`` seconds (a call's deadline). Raises InvalidRequest,
        InvalidOverride and BackendUnavailable (DeadlineExceeded)."""
        domain, descriptors = parse_request(
            lenient_pb2.LenientRateLimitRequest.FromString(request.SerializeToString()),
            self.app.service.decider.policy)
        return await self.app.service.decide(domain, descriptors, request.hits_addend, timeout)


class FailingBackend:
    """Storage that fails every call with ``error`` (BackendUnavailable: as a Redis that is down; DeadlineExceeded:
    as a caller's deadline running out): for tests of what the failure policy answers. ``calls`` counts them."""

    def __init__(self, error: BackendUnavailable | None = None) -> None:
        self.error = error or BackendUnavailable("failing storage: down")
        self.calls = 0

    async def decide(self, checks: Sequence[Check], now_us: int | None = None,
                     timeout: float | None = None) -> Decision:
        self.calls += 1
        raise self.error

    async def ping(self) -> None:
        raise self.error

    async def close(self) -> None:
        pass

    def describe(self) -> str:
        return "failing storage"


@pytest.fixture
async def limits(write_config: Callable[..., Path], backend_settings: dict[str, str],
                 clock: Clock) -> AsyncIterator[Callable[..., Awaitable[Decider]]]:
    """``await limits(yaml_text, **settings)``: a Decider for the config, on each backend in turn (``backing``)
    with the injected ``clock``; ``settings`` as in ``rls``."""
    built: list[Backend] = []

    async def start(text: str, **settings: str) -> Decider:
        flags = {"config_dir": str(write_config(text)), **backend_settings, **settings}
        app = build(Settings.load({}, flags), clock=clock)
        built.append(app.backend)
        return Decider(app)

    yield start
    for backend in built:
        await backend.close()


@pytest.fixture
def failing(write_config: Callable[..., Path], clock: Clock) -> Callable[..., Decider]:
    """``failing(yaml_text, error=None, **settings)``: a Decider for the config whose storage is a
    FailingBackend raising ``error`` (see there), with the injected ``clock``; ``settings`` as in ``rls``."""

    def start(text: str, error: BackendUnavailable | None = None, **settings: str) -> Decider:
        flags = {"config_dir": str(write_config(text)), **settings}
        return Decider(build(Settings.load({}, flags), clock=clock, backend=FailingBackend(error)))

    return start


@pytest.fixture
def serve(redis_url: str, key_prefix: str) -> Iterator[Callable[..., Served]]:
    """``serve(config_dir, *flags, url=None, wait=True, env=None)`` starts `slidegate serve` on free ports."""
    starter = Starter(redis_url, key_prefix)
    yield starter.start
    starter.stop_all()
