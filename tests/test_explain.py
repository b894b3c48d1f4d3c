"""Explain (Decider.explain, POST /explain, `slidegate explain`): for each descriptor the rule it matched and why,
where it was defined, what the storage holds now and what ShouldRateLimit would answer, counting nothing; on
every backend of the behaviour suite."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from slidegate.decider import LimitRequest
from slidegate.limiter import Descriptor, Override
from slidegate.units import Unit
from tests.ads_server import AdsServer
from tests.conftest import Decider
from tests.helpers import OK, OVER_LIMIT, descriptor, request
from tests.served import wait_for

Limits = Callable[..., Awaitable[Decider]]

CONFIG = """
domain: x
descriptors:
  - key: user
    value: alice
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: path
    value: /api/*
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: path
    value: /health
  - key: internal
    rate_limit: {unlimited: true}
  - key: team
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: org
    descriptors:
      - key: plan
        value: gold
        rate_limit: {unit: second, requests_per_unit: 10, name: gold, replaces: [{name: standard}]}
      - key: plan
        rate_limit: {unit: second, requests_per_unit: 2, name: standard}
"""


def one(*entries: tuple[str, str], override: Override | None = None) -> Descriptor:
    return Descriptor(tuple(entries), override=override)


async def explained(service: Decider, *descriptors: Descriptor, domain: str = "x") -> dict[str, Any]:
    explanation = await service.app.service.decider.explain(LimitRequest(domain, list(descriptors)))
    return explanation.as_json()


async def test_every_kind_of_match_is_named_with_its_rule_and_source(limits: Limits) -> None:
    service = await limits(CONFIG)
    answer = await explained(
        service, one(("user", "alice")), one(("user", "bob")), one(("path", "/api/v1")), one(("path", "/health")),
        one(("internal", "x")), one(("team", "t")), one(("nothing", "here")),
        one(("user", "carol"), override=Override(7, Unit.HOUR)),
        one(("org", "o"), ("plan", "gold")), one(("org", "o"), ("plan", "free")))
    kinds = [d["why"] for d in answer["descriptors"]]
    assert kinds == ["exact value", "default", "wildcard", "no limit", "unlimited", "default", "no rule",
                     "override", "exact value", "replaced"]
    alice, bob, api = answer["descriptors"][:3]
    assert alice["rule"]["name"] == "user=alice" and alice["rule"]["source"].endswith(":4")
    assert alice["rule"]["limit"] == {"requestsPerUnit": 5, "unit": "MINUTE", "unitMultiplier": 1,
                                      "algorithm": alice["rule"]["limit"]["algorithm"]}
    assert (alice["used"], alice["remaining"], alice["code"]) == (0, 5, "OK")
    assert bob["rule"]["name"] == "user" and bob["remaining"] == 3
    assert api["rule"]["name"] == "path=/api/*"
    team = answer["descriptors"][5]
    assert team["rule"]["shadowMode"] is True
    override = answer["descriptors"][7]
    assert "rule" not in override and override["limit"]["requestsPerUnit"] == 7 and override["remaining"] == 7
    replaced = answer["descriptors"][9]
    assert replaced["rule"]["name"] == "standard"
    assert replaced["replacedBy"]["name"] == "gold" and "remaining" not in replaced  # its limit dropped
    assert answer["overallCode"] == "OK"


async def test_an_unknown_domain_is_said_so(limits: Limits) -> None:
    service = await limits(CONFIG)
    answer = await explained(service, one(("user", "alice")), domain="nowhere")
    assert [d["why"] for d in answer["descriptors"]] == ["no such domain"]


async def test_explaining_counts_nothing_and_tells_what_would_be_answered(limits: Limits) -> None:
    service = await limits(CONFIG)
    bob = request("x", descriptor(("user", "bob")))
    for _ in range(2):
        await service.should_rate_limit(bob)
    for _ in range(1000):
        answer = await explained(service, one(("user", "bob")))
    [seen] = answer["descriptors"]
    assert (seen["used"], seen["remaining"], seen["code"]) == (2, 1, "OK")
    assert 0 < seen["resetSeconds"] <= 60
    # the whole rest of the limit is still there: 1 admitted, then over
    assert [(await service.should_rate_limit(bob)).overall_code for _ in range(2)] == [OK, OVER_LIMIT]
    answer = await explained(service, one(("user", "bob")))
    assert answer["overallCode"] == "OVER_LIMIT" and answer["descriptors"][0]["code"] == "OVER_LIMIT"
    # a shadow rule over its limit rejects nothing
    await service.should_rate_limit(request("x", descriptor(("team", "t"))))
    answer = await explained(service, one(("team", "t")))
    assert answer["descriptors"][0]["over"] is True and answer["overallCode"] == "OK"


def test_explain_over_http_and_on_the_command_line(serve: Callable[..., Any], tmp_path: Path,
                                                   redis_url: str, key_prefix: str) -> None:
    (tmp_path / "x.yaml").write_text(CONFIG)
    served = serve(tmp_path)
    body = json.dumps({"domain": "x", "descriptors": [{"entries": [{"key": "user", "value": "alice"}]}]}).encode()
    for _ in range(2):
        urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{served.http_port}/json", body)).close()
    with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{served.http_port}/explain", body)) as r:
        over_http = json.load(r)
    assert over_http["descriptors"][0]["used"] == 2 and over_http["descriptors"][0]["remaining"] == 3
    command = subprocess.run(
        [sys.executable, "-m", "slidegate", "explain", "--config", str(tmp_path), "--redis-url", redis_url,
         "--cache-key-prefix", key_prefix, "-"], input=body, capture_output=True, check=True, timeout=60)
    on_the_command_line = json.loads(command.stdout)
    for answer in (on_the_command_line, over_http):  # the reset moves on between the two
        assert 0 < answer["descriptors"][0].pop("resetSeconds") <= 60
    assert on_the_command_line == over_http


TWICE = """
domain: t
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: fixed
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: fixed_window}
  - key: quota
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
"""


async def explained_then_decided(service: Decider, *entries: tuple[str, str]) -> tuple[list[str], list[str]]:
    """What explain says of a request of one descriptor per entry (the overall code, then each descriptor's), and
    then what ShouldRateLimit answers it."""
    answer = await explained(service, *(one(e) for e in entries), domain="t")
    response = await service.should_rate_limit(request("t", *(descriptor(e) for e in entries)))
    names = {OK: "OK", OVER_LIMIT: "OVER_LIMIT"}
    return ([answer["overallCode"], *(d["code"] for d in answer["descriptors"])],
            [names[response.overall_code], *(names[s.code] for s in response.statuses)])


async def test_a_limit_named_twice_is_explained_on_the_sum_of_its_hits(limits: Limits) -> None:
    service = await limits(TWICE)
    for key in ("user", "fixed"):
        for _ in range(2):
            await service.should_rate_limit(request("t", descriptor((key, "bob"))))
        # one hit left: the first of the two takes it, the second is over, and so is the request
        said, answered = await explained_then_decided(service, (key, "bob"), (key, "bob"))
        assert said == answered == ["OVER_LIMIT", "OK", "OVER_LIMIT"], key
    # a quota limit named twice with room for one: one of the two over is not every one, so it is admitted
    said, answered = await explained_then_decided(service, ("quota", "q"), ("quota", "q"))
    assert said[0] == answered[0] == "OK"
    said, answered = await explained_then_decided(service, ("quota", "q"), ("quota", "q"))
    assert said[0] == answered[0] == "OVER_LIMIT"


def test_a_malformed_explain_body_is_the_clients_error(serve: Callable[..., Any], tmp_path: Path) -> None:
    (tmp_path / "x.yaml").write_text(CONFIG)
    served = serve(tmp_path)

    def errors() -> int:  # the stat is listed once first counted
        return sum(int(line.rsplit(" ", 1)[1]) for line in served.http("/stats", port=served.debug_port)[1].splitlines()
                   if line.startswith("ratelimit.service.call.should_rate_limit.service_error:"))

    for body in (b'{"domain": "", "descriptors": [{"entries": [{"key": "user", "value": "a"}]}]}',
                 b'{"domain": "x", "descriptors": []}',
                 b'{"domain": "x", "descriptors": [{"entries": [{"key": "user", "value": "a"}]}], "hits_addend": 1',
                 b'{"domain": "x", "descriptors": [{"entries": [{"key": "user", "value": "a"}], "hitsAddend": "x"}]}',
                 b'[]'):
        status, text = served.http("/explain", body)
        assert status == 400 and json.loads(text)["error"], body
    assert errors() == 0
    assert served.http("/json", b'{"domain": "x", "descriptors": []}')[0] == 400
    assert errors() == 1  # /json counts it, as the reference does


def test_no_config_loaded_is_answered_as_json_answers_it(serve: Callable[..., Any]) -> None:
    ads = AdsServer()  # that never sends a config
    ads.start()
    try:
        forced = serve(None, env={"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": f"127.0.0.1:{ads.port}",
                                  "BACKEND_TYPE": "memory", "FORCE_START_WITHOUT_INITIAL_CONFIG": "true"}, wait=False)
        assert wait_for(lambda: forced.http("/healthcheck")[0] == 200, 20)
        body = json.dumps({"domain": "x", "descriptors": [{"entries": [{"key": "user", "value": "a"}]}]}).encode()
        # 500, as the reference's plain error (gRPC UNKNOWN): docs/configuration.md, tests/test_xds.py
        assert forced.http("/explain", body) == forced.http("/json", body) == (
            500, '{"error": "no rate limit configuration loaded"}')
    finally:
        ads.stop()
