"""What bench/compare.py sends and compares: a sequence (a config and the requests sent in order), a request as
plain data (JSON-able, so a run can be recorded and replayed), an answer reduced to comparable data, and the
differences between two answers (durations and reset headers within a clock tolerance)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format

from slidegate.protos import ratelimit_unit_pb2, rls_pb2

# the reset headers, whose values are seconds until a window's end and differ by the clock as durations do
RESET_HEADERS = frozenset({"ratelimit-reset", "x-ratelimit-reset", "retry-after"})


@dataclass(frozen=True)
class Descriptor:
    entries: tuple[tuple[str, str], ...]
    hits_addend: int | None = None  # the descriptor's own (Envoy 1.33+); None: not set
    limit: tuple[int, str] | None = None  # Envoy's override: requests_per_unit and a unit's name


@dataclass(frozen=True)
class Request:
    domain: str
    descriptors: tuple[Descriptor, ...]
    hits_addend: int = 0
    via: str = "grpc"  # or "json": POST /json on the HTTP port; or "reload": the sequence's file becomes ``config``
    config: str = ""

    def message(self) -> rls_pb2.RateLimitRequest:
        request = rls_pb2.RateLimitRequest(domain=self.domain, hits_addend=self.hits_addend)
        for descriptor in self.descriptors:
            made = request.descriptors.add()
            for key, value in descriptor.entries:
                made.entries.add(key=key, value=value)
            if descriptor.hits_addend is not None:
                made.hits_addend.value = descriptor.hits_addend
            if descriptor.limit is not None:
                made.limit.requests_per_unit = descriptor.limit[0]
                made.limit.unit = ratelimit_unit_pb2.RateLimitUnit.Value(descriptor.limit[1])  # type: ignore[assignment]
        return request

    def to_data(self) -> dict[str, Any]:
        return {"domain": self.domain, "hits_addend": self.hits_addend, "via": self.via, "config": self.config,
                "descriptors": [{"entries": [list(e) for e in d.entries], "hits_addend": d.hits_addend,
                                 "limit": list(d.limit) if d.limit else None} for d in self.descriptors]}

    @staticmethod
    def from_data(data: dict[str, Any]) -> Request:
        descriptors = tuple(Descriptor(tuple((k, v) for k, v in d["entries"]), d["hits_addend"],
                                       (d["limit"][0], d["limit"][1]) if d.get("limit") else None)
                            for d in data["descriptors"])
        return Request(data["domain"], descriptors, data["hits_addend"], data["via"], data.get("config", ""))


@dataclass
class Scenario:
    """A config (one file's YAML; its domain is the sequence's own) and the requests sent in order. ``note``
    says what it covers; ``deliberate`` names the documented difference it is expected to show (compare_known)."""

    name: str
    config: str
    requests: list[Request] = field(default_factory=list)
    note: str = ""
    deliberate: str = ""


def ask(name: str, *entries: tuple[str, str], domain: str = "", hits: int = 0, via: str = "grpc") -> Request:
    """A request of one descriptor (the common case of the hand-written sequences)."""
    return Request(domain or name, (Descriptor(tuple(entries)),), hits, via)


def answer_of(response: rls_pb2.RateLimitResponse) -> dict[str, Any]:
    """The answer as comparable data: codes by name, durations in seconds, headers by lower-case name."""
    data: dict[str, Any] = json_format.MessageToDict(response, preserving_proto_field_name=True)
    data.setdefault("overall_code", "UNKNOWN")
    for status in data.get("statuses", []):
        status.setdefault("code", "UNKNOWN")
        status.setdefault("limit_remaining", 0)
        if "duration_until_reset" in status:
            status["duration_until_reset"] = float(status["duration_until_reset"].rstrip("s"))
    for name in ("response_headers_to_add", "request_headers_to_add"):
        if name in data:
            data[name] = {h["key"].lower(): h.get("value", "") for h in data[name]}
    return data


def json_answer(status: int, body: str) -> dict[str, Any]:
    """An answer of POST /json: its HTTP status, the fields its body prints (``printed``: which are there, zeros
    included or not), and the response in it read as the gRPC one is; a body that is not a RateLimitResponse
    (an error's) counts by its status and whether it is JSON."""
    try:
        document = json.loads(body)
        parsed = json_format.Parse(body, rls_pb2.RateLimitResponse())
    except json.JSONDecodeError:
        return {"http_status": status, "error_body": "text"}
    except json_format.ParseError:
        return {"http_status": status, "error_body": "json"}
    return {"http_status": status, "printed": sorted(set(_printed(document))), **answer_of(parsed)}


def _printed(document: Any, path: str = "") -> Iterator[str]:
    if isinstance(document, dict):
        for key, value in document.items():
            yield f"{path}.{key}" if path else key
            yield from _printed(value, f"{path}.{key}" if path else key)
    elif isinstance(document, list):
        for value in document:
            yield from _printed(value, path + "[]")


def differences(a: Any, b: Any, tolerance: float, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    """(path, a's value, b's value) for every leaf that differs; durations and reset headers within
    ``tolerance`` seconds are equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            yield from differences(a.get(key), b.get(key), tolerance, f"{path}.{key}" if path else key)
        return
    if path == "printed" and isinstance(a, list) and isinstance(b, list):  # the fields only one of them prints
        if set(a) != set(b):
            yield path, sorted(set(a) - set(b)), sorted(set(b) - set(a))
        return
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from differences(x, y, tolerance, f"{path}[{i}]")
        return
    leaf = path.rsplit(".", 1)[-1]
    if (leaf == "duration_until_reset" or leaf in RESET_HEADERS) and _near(a, b, tolerance):
        return
    if a != b:
        yield path, a, b


def _near(a: Any, b: Any, tolerance: float) -> bool:
    try:
        return abs(float(a) - float(b)) <= tolerance
    except (TypeError, ValueError):
        return False


def recordable(answer: dict[str, Any]) -> dict[str, Any]:
    """An answer without its dynamic metadata, whose layout is an open difference from the reference's (so
    kept out of the answers recorded for tests of slidegate alone)."""
    kept = {k: v for k, v in answer.items() if k != "dynamic_metadata"}
    if "printed" in kept:
        kept["printed"] = [p for p in kept["printed"] if not p.startswith("dynamicMetadata")]
    return kept


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)

