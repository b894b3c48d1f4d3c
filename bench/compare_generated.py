"""Generated sequences for bench/compare.py: random configs (nested descriptors, values and wildcards, every unit
but the second, shadow and quota mode, unlimited, names and replaces) and random requests against them (known and
unknown entries, several descriptors, hits_addend), drawn by hypothesis with derandomize on: the same sequences
in every run."""

from __future__ import annotations

from typing import Any

import yaml
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from bench.compare_model import Descriptor, Request, Scenario

KEYS = ("a", "b", "c")
VALUES = ("x", "y", "x_y")
UNITS = ("minute", "hour", "day")


@st.composite
def _rule(draw: st.DrawFn, depth: int, names: list[str]) -> dict[str, Any]:
    rule: dict[str, Any] = {"key": draw(st.sampled_from(KEYS))}
    value = draw(st.sampled_from(("", "", *VALUES, "x*")))
    if value:
        rule["value"] = value
    if depth < 2 and draw(st.integers(0, 2)) == 0:
        rule["descriptors"] = draw(_rules(depth + 1, names))
    if "descriptors" not in rule or draw(st.booleans()):
        rule["rate_limit"] = draw(_rate_limit(names))
        flag = draw(st.sampled_from(("", "", "", "shadow_mode", "quota_mode")))
        if flag:
            rule[flag] = True
    return rule


@st.composite
def _rate_limit(draw: st.DrawFn, names: list[str]) -> dict[str, Any]:
    if draw(st.integers(0, 9)) == 0:
        limit: dict[str, Any] = {"unlimited": True}
    else:
        limit = {"unit": draw(st.sampled_from(UNITS)), "requests_per_unit": draw(st.integers(0, 4))}
    if draw(st.integers(0, 3)) == 0:
        limit["name"] = f"n{len(names)}"
        names.append(limit["name"])
    elif names and draw(st.integers(0, 3)) == 0:
        limit["replaces"] = [{"name": draw(st.sampled_from(names))}]
    return limit


def _rules(depth: int, names: list[str]) -> st.SearchStrategy[list[dict[str, Any]]]:
    # one rule per (key, value) at a level: the config loaders refuse repeated ones
    return st.lists(_rule(depth, names), min_size=1, max_size=3,
                    unique_by=lambda r: (r["key"], r.get("value", "")))


def _paths(rules: list[dict[str, Any]], above: tuple[tuple[str, str], ...] = ()) -> list[tuple[tuple[str, str], ...]]:
    """Every path of (key, value pattern) from the top to a rule."""
    out = []
    for rule in rules:
        path = (*above, (rule["key"], rule.get("value", "")))
        out.append(path)
        out += _paths(rule.get("descriptors", []), path)
    return out


@st.composite
def _entry_for(draw: st.DrawFn, key: str, pattern: str) -> tuple[str, str]:
    if not pattern:
        return key, draw(st.sampled_from(VALUES))
    if pattern.endswith("*"):
        return key, pattern[:-1] + draw(st.sampled_from(("", "1", "_z")))
    return key, pattern


@st.composite
def _descriptor(draw: st.DrawFn, paths: list[tuple[tuple[str, str], ...]]) -> Descriptor:
    if draw(st.integers(0, 3)) == 0:  # entries at random: mostly matching nothing, or a rule by chance
        entries = draw(st.lists(st.tuples(st.sampled_from(KEYS), st.sampled_from((*VALUES, "xz", "z"))),
                                min_size=1, max_size=3))
    else:  # a rule's path, with values its patterns match (or, past its end, an entry more)
        path = draw(st.sampled_from(paths))
        entries = [draw(_entry_for(key, pattern)) for key, pattern in path]
        if draw(st.integers(0, 4)) == 0:
            entries.append((draw(st.sampled_from(KEYS)), "z"))
    hits = draw(st.sampled_from((None, None, None, 0, 1, 2)))
    return Descriptor(tuple(entries), hits)


@st.composite
def scenario(draw: st.DrawFn, number: int) -> Scenario:
    names: list[str] = []
    rules = draw(_rules(0, names))
    paths = _paths(rules)
    name = f"gen{number:03d}"
    requests = draw(st.lists(st.builds(
        Request, st.just(name), st.lists(_descriptor(paths), min_size=1, max_size=3).map(tuple),
        st.sampled_from((0, 0, 0, 1, 2))), min_size=20, max_size=20))
    config = _yaml({"domain": name, "descriptors": rules})
    return Scenario(name, config, requests, "generated")


def _yaml(document: dict[str, Any]) -> str:
    return str(yaml.safe_dump(document, sort_keys=False))


def generated(count: int, batch: int = 5) -> list[Scenario]:
    """``count`` sequences of 20 requests each, the same ones in every run (hypothesis, seeded). Drawn ``batch``
    to an example: hypothesis builds later examples from earlier ones, so one a draw gave a quarter of them the
    same config; the sequences of one example are drawn afresh."""
    out: list[Scenario] = []
    if count <= 0:
        return out

    @seed(37)
    @settings(max_examples=max(1, count // batch) * 3, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def draw(data: st.DataObject) -> None:
        for _ in range(batch):  # drawn every time: hypothesis replays what it drew
            drawn = data.draw(scenario(len(out)))
            if len(out) < count and drawn.config.split("\n", 1)[1] not in seen:
                seen.add(drawn.config.split("\n", 1)[1])
                out.append(drawn)

    seen: set[str] = set()
    draw()
    return out
