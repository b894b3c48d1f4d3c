"""Side by side with envoyproxy/ratelimit: the same ShouldRateLimit sequences sent to two Rate Limit Services, and
every difference in their answers printed.

    # both servers started here, on a private redis-server, once per profile (compare_servers.PROFILES):
    python bench/compare.py --reference /path/to/ratelimit          # the reference's ./src/service_cmd, built by hand
    # or two servers already running on the config this writes (fresh counters, the same settings):
    python bench/compare.py --write-config DIR
    python bench/compare.py --a 127.0.0.1:8081 --a-http 127.0.0.1:8080 --b 127.0.0.1:9081 --b-http 127.0.0.1:9080 \
        --config-dir DIR/ratelimit/config    # where the sequences that reload the config write

A is slidegate (DEFAULT_ALGORITHM=fixed_window when started here), B the reference. Each sequence is a config of
its own domain and requests sent in order, each to A and then to B; the answers are compared field by field:
the overall code, each status's code, current_limit, limit_remaining and duration_until_reset (within
--tolerance seconds), the response headers, the dynamic metadata, the HTTP status and body of /json, and
/healthcheck. A difference that docs/migrating.md documents (bench/compare_known.py) is printed too, marked
deliberate. --record writes the sequences that showed a deliberate difference with A's answers, for
tests/test_differential.py. Exit code 1 when any difference is not deliberate.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format

if __package__ in (None, ""):  # run as a script: the repository's root on the path, for `bench.*`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.compare_generated import generated
from bench.compare_known import Seen, deliberate_reason
from bench.compare_model import Request, Scenario, answer_of, differences, dumps, json_answer, recordable
from bench.compare_sequences import hand_written
from bench.compare_servers import PROFILES, STATS_FLUSH_SECONDS, Server, config_dir, scratch, started
from bench.compare_stats import stat_differences
from slidegate.protos import rls_pb2_grpc

STAT_PREFIXES = ("ratelimit",)  # every counter of both
RULE_STATS = "ratelimit.service.rate_limit."  # then <domain>.<key>…
RELOAD_SECONDS = 2.0  # slidegate's CONFIG_SETTLE_TIME (0.5 s) and its watcher's poll, with room
RECORD_GENERATED = 8  # generated sequences recorded per profile, at most: the hand-written ones show each difference
UNIT_SECONDS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}


@dataclass
class Difference:
    profile: str
    scenario: str
    step: int
    path: str
    a: Any
    b: Any
    deliberate: str = ""

    def line(self) -> str:
        mark = f"  [deliberate: {self.deliberate}]" if self.deliberate else ""
        return (f"[{self.profile}] {self.scenario} #{self.step} {self.path}: "
                f"A={_short(self.a)} B={_short(self.b)}{mark}")


@dataclass
class Tally:
    sequences: int = 0
    requests: int = 0
    edge_skipped: list[str] = field(default_factory=list)
    found: list[Difference] = field(default_factory=list)
    recorded: dict[str, Any] = field(default_factory=dict)
    limited: int = 0  # statuses of B's answers with a limit
    over: int = 0  # of those, OVER_LIMIT

    def count(self, answer: dict[str, Any]) -> None:
        self.requests += 1
        for status in answer.get("statuses", []):
            self.limited += "current_limit" in status
            self.over += status["code"] == "OVER_LIMIT"


def _short(value: Any) -> str:
    text = dumps(value)
    return text if len(text) <= 160 else text[:150] + f"…({len(text)} chars)"


class Client:
    """One server's gRPC stub, and its HTTP endpoints when known."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.channel = grpc.insecure_channel(server.grpc, options=[("grpc.max_receive_message_length", 1 << 24)])
        self.stub = rls_pb2_grpc.RateLimitServiceStub(self.channel)

    def ask(self, request: Request) -> dict[str, Any]:
        if request.via == "json":
            if not self.server.http:
                return {"skipped": "no HTTP address"}
            body = json_format.MessageToJson(request.message()).encode()
            return json_answer(*self.server.get("/json", body))
        try:
            return answer_of(self.stub.ShouldRateLimit(request.message(), timeout=5))
        except grpc.RpcError as error:
            return {"grpc_error": error.code().name}

    def close(self) -> None:
        self.channel.close()


def write_config(root: Path, scenarios: list[Scenario]) -> Path:
    directory = config_dir(root)
    directory.mkdir(parents=True, exist_ok=True)
    for scenario in scenarios:
        (directory / f"{scenario.name}.yaml").write_text(scenario.config)
    return directory


def _smallest_window(scenario: Scenario) -> int:
    units = [seconds for unit, seconds in UNIT_SECONDS.items() if f"unit: {unit}" in scenario.config]
    for request in scenario.requests:  # an override's unit
        units += [UNIT_SECONDS[d.limit[1].lower()] for d in request.descriptors if d.limit]
    return min(units, default=86400)


def _wait_for_room(window: int, needed: float) -> None:
    """Sleep past the current window's end if the sequence might not fit in what is left of it."""
    left = window - time.time() % window
    if left < needed:
        time.sleep(left + 0.02)


@dataclass
class Run:
    """One profile's run: its name, the clock tolerance, where the sequences' config files are (None: not known,
    so sequences that reload are skipped), and what was found."""

    profile: str
    tolerance: float
    config: Path | None
    tally: Tally


def _reload(request: Request, scenario: Scenario, run: Run) -> dict[str, Any]:
    """A step rewriting the sequence's config file, then waiting for both servers to load it (slidegate waits
    for CONFIG_SETTLE_TIME of quiet, the reference for its file watcher)."""
    assert run.config is not None
    (run.config / f"{scenario.name}.yaml").write_text(request.config)
    time.sleep(RELOAD_SECONDS)
    return {"reloaded": True}


def run_scenario(scenario: Scenario, a: Client, b: Client, run: Run) -> None:
    reloads = sum(r.via == "reload" for r in scenario.requests)
    if reloads and run.config is None:
        run.tally.edge_skipped.append(f"[{run.profile}] {scenario.name} (reloads, and no config directory given)")
        return
    window = _smallest_window(scenario)
    _wait_for_room(window, 0.1 + 0.02 * len(scenario.requests) + RELOAD_SECONDS * reloads)
    start = int(time.time() // window)
    steps = []
    for step, request in enumerate(scenario.requests):
        if request.via == "reload":
            answers = (_reload(request, scenario, run),) * 2
        else:
            answers = a.ask(request), b.ask(request)
        steps.append((step, request, answers))
    if int(time.time() // window) != start:  # a window ended during the sequence: the counts are not comparable
        run.tally.edge_skipped.append(f"[{run.profile}] {scenario.name}")
        return
    _compare_steps(scenario, steps, run)


def _compare_steps(scenario: Scenario, steps: list[tuple[int, Request, tuple[dict[str, Any], dict[str, Any]]]],
                   run: Run) -> None:
    tally = run.tally
    tally.sequences += 1
    shown = False
    for step, request, (answer_a, answer_b) in steps:
        if request.via != "reload":
            tally.count(answer_b)
        for path, value_a, value_b in differences(answer_a, answer_b, run.tolerance):
            reason = deliberate_reason(Seen(run.profile, scenario, request, path, value_a, value_b))
            tally.found.append(Difference(run.profile, scenario.name, step, path, value_a, value_b, reason))
            shown = shown or bool(reason)
    generated_ones = sum(1 for key in tally.recorded if key.startswith(f"{run.profile}/gen"))
    if shown and (scenario.note != "generated" or generated_ones < RECORD_GENERATED):
        tally.recorded[f"{run.profile}/{scenario.name}"] = {
            "profile": run.profile, "config": scenario.config, "note": scenario.note,
            "steps": [{"request": r.to_data(), "answer": recordable(ans[0])} for _, r, ans in steps]}


def compare_http(a: Server, b: Server, profile: str, tally: Tally) -> None:
    """/healthcheck of both: its status and body."""
    if not (a.http and b.http):
        return
    got = {s.name: s.get("/healthcheck") for s in (a, b)}
    (status_a, body_a), (status_b, body_b) = got[a.name], got[b.name]
    for path, x, y in (("healthcheck.status", status_a, status_b), ("healthcheck.body", body_a, body_b)):
        if x != y:
            reason = deliberate_reason(Seen(profile, None, None, path, x, y))
            tally.found.append(Difference(profile, "http", 0, path, x, y, reason))


def _flushed(server: Server) -> dict[str, int]:
    """What ``server`` sent to statsd so far, once it has flushed it."""
    time.sleep(STATS_FLUSH_SECONDS * 3)
    return server.stats.snapshot() if server.stats else {}


def compare_stats(before: tuple[dict[str, int], dict[str, int]], after: tuple[dict[str, int], dict[str, int]],
                  profile: str, scenarios: list[Scenario], tally: Tally) -> None:
    """The counters both sent to statsd: a limit's (under its sequence's domain, whose difference it is) at the
    end, the service's own (``before``) as they were before the sequences written to show a deliberate
    difference, which would show in them too."""
    by_domain = {s.name: s for s in scenarios}
    for (a, b), rules in ((before, False), (after, True)):
        for name, x, y in stat_differences(a, b, STAT_PREFIXES):
            if name.startswith(RULE_STATS) != rules:
                continue
            scenario = by_domain.get(name.removeprefix(RULE_STATS).split(".", 1)[0]) if rules else None
            reason = deliberate_reason(Seen(profile, scenario, None, f"stats.{name}", x, y))
            tally.found.append(Difference(profile, scenario.name if scenario else "stats", -1, f"stats.{name}", x,
                                          y, reason))


def run_profile(a: Server, b: Server, scenarios: list[Scenario], run: Run) -> None:
    client_a, client_b = Client(a), Client(b)
    try:
        compare_http(a, b, run.profile, run.tally)
        for scenario in [s for s in scenarios if not s.deliberate]:
            run_scenario(scenario, client_a, client_b, run)
        before = _flushed(a), _flushed(b)
        for scenario in [s for s in scenarios if s.deliberate]:
            run_scenario(scenario, client_a, client_b, run)
        if a.stats and b.stats:
            compare_stats(before, (_flushed(a), _flushed(b)), run.profile, scenarios, run.tally)
    finally:
        client_a.close()
        client_b.close()


def report(tally: Tally, out: Any = sys.stdout) -> int:
    for difference in tally.found:
        print(difference.line(), file=out)
    for skipped in tally.edge_skipped:
        print(f"{skipped}: not compared, a window ended during it", file=out)
    deliberate = sum(1 for d in tally.found if d.deliberate)
    unexplained = len(tally.found) - deliberate
    print(f"\n{tally.sequences} sequences, {tally.requests} requests compared ({tally.limited} statuses with a limit, "
          f"{tally.over} over it); {len(tally.found)} differences "
          f"({deliberate} deliberate, {unexplained} not); {len(tally.edge_skipped)} sequences skipped at a window's "
          "end", file=out)
    return 1 if unexplained else 0


def scenarios_of(args: argparse.Namespace) -> list[Scenario]:
    chosen = [*hand_written(), *generated(args.generated)]
    if args.only:
        chosen = [s for s in chosen if any(s.name.startswith(o) for o in args.only)]
    return chosen


def profiles_of(args: argparse.Namespace) -> Iterator[str]:
    yield from args.profile or PROFILES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference", help="envoyproxy/ratelimit's binary: start both servers here")
    parser.add_argument("--a", help="slidegate's gRPC address (host:port)")
    parser.add_argument("--a-http", default="", help="its HTTP address (/json, /healthcheck)")
    parser.add_argument("--b", help="the reference's gRPC address")
    parser.add_argument("--b-http", default="")
    parser.add_argument("--write-config", type=Path, help="write the config of every sequence to DIR and exit")
    parser.add_argument("--config-dir", type=Path,
                        help="with --a and --b: the directory both load, which --write-config printed (sequences "
                             "that reload write there)")
    parser.add_argument("--profile", action="append", choices=sorted(PROFILES),
                        help="with --reference: the settings to run with (repeatable; default: every profile)")
    parser.add_argument("--generated", type=int, default=100, help="generated sequences (20 requests each)")
    parser.add_argument("--only", action="append", help="only the sequences whose names start so (repeatable)")
    parser.add_argument("--tolerance", type=float, default=1.0, help="seconds durations may differ by")
    parser.add_argument("--record", type=Path, help="write the deliberate differences' sequences (JSON) here")
    args = parser.parse_args(argv)
    scenarios = scenarios_of(args)
    tally = Tally()
    if args.write_config:
        print(write_config(args.write_config, scenarios))
        return 0
    if args.reference:
        for profile in profiles_of(args):
            root = scratch()
            write_config(root, scenarios)
            with started(args.reference, root, PROFILES[profile], root) as (a, b):
                run_profile(a, b, scenarios, Run(profile, args.tolerance, config_dir(root), tally))
            shutil.rmtree(root)  # its servers' logs too: kept (and named) only when one does not start
    elif args.a and args.b:
        run_profile(Server("slidegate", args.a, args.a_http), Server("reference", args.b, args.b_http), scenarios,
                    Run("given", args.tolerance, args.config_dir, tally))
    else:
        parser.error("give --reference, or --a and --b, or --write-config")
    if args.record:
        lines = (f"{json.dumps(k)}: {json.dumps(v, sort_keys=True, ensure_ascii=False)}"
                 for k, v in sorted(tally.recorded.items()))
        args.record.write_text("{\n" + ",\n".join(lines) + "\n}\n")  # a sequence a line
    return report(tally)


if __name__ == "__main__":
    sys.exit(main())
