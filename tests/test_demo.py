"""`slidegate demo`, the main job: real Envoy → slidegate → Redis, and the statuses the limits predict."""

from __future__ import annotations

import subprocess
import sys

from slidegate.stack import free_port


def test_demo_runs_and_every_request_gets_the_predicted_status(redis_url: str) -> None:
    done = subprocess.run([sys.executable, "-m", "slidegate", "demo", "--redis-url", redis_url],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "GET /burst   -> 429" in out and "GET /hello   -> 429" in out
    assert out.count("-> 200") == 19 and out.count("-> 429") == 8
    # across the second boundary: the fixed window admits all 6, the sliding window log the first 3 only
    assert out.count("GET /fixed   -> 200") == 6 and out.count("GET /sliding -> 200") == 3
    assert out.count("GET /sliding -> 429") == 3
    assert "Every request got the status the limits predict. Stack stopped." in out


def test_demo_without_redis_falls_back_to_memory() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    done = subprocess.run([sys.executable, "-m", "slidegate", "demo", "--redis-url", url],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(f"Redis at {url} cannot be used (ConnectionError:")
    assert "Using the in-memory backend instead" in done.stdout
    assert "(storage: in-memory backend)" in done.stdout
    assert "Every request got the status the limits predict. Stack stopped." in done.stdout


def test_rlqs_demo_runs_and_every_request_gets_the_predicted_status(redis_url: str) -> None:
    done = subprocess.run([sys.executable, "-m", "slidegate", "demo", "--rlqs", "--redis-url", redis_url],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    # 5 a minute: the first request (before slidegate's first answer) and 4 more
    assert out.count("x-user: alice    -> 200") == 5 and out.count("x-user: alice    -> 429") == 2
    assert out.count("x-user: bob      -> 200") == 5 and out.count("x-user: bob      -> 429") == 1
    assert out.count("x-user: vip      -> 200") == 6
    assert out.count("x-user: blocked  -> 200") == 1 and out.count("x-user: blocked  -> 429") == 3
    assert out.count("(no x-user)      -> 200") == 2
    assert "Every request got the status the limits predict. Stack stopped." in out
