"""Config loading and matching (envoyproxy/ratelimit's format and rules), with exact error texts."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from slidegate.algorithms import Algorithm
from slidegate.cli import main
from slidegate.config import ConfigError, LoadOptions, RateLimit, load_directory
from slidegate.config.model import wildcard_pattern
from slidegate.units import Unit

WriteConfig = Callable[..., Path]

MATCHING = """
domain: m
descriptors:
  - key: k
    value: exact
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: parent
    value: p
    descriptors:
      - key: child
        rate_limit: {unit: HOUR, requests_per_unit: 3, name: nested}
  - key: only_parent
    rate_limit: {unit: Day, requests_per_unit: 4}
    descriptors:
      - key: child
        value: c
  - key: white
  - key: Case
    value: Value
    rate_limit: {unit: year, requests_per_unit: 5}
"""


@pytest.fixture
def domain(write_config: WriteConfig) -> Callable[..., RateLimit | None]:
    config = load_directory(write_config(MATCHING)).domains["m"]

    def limit(*entries: tuple[str, str]) -> RateLimit | None:
        match = config.match(entries)
        return match.rule.rate_limit if match else None

    return limit


def test_exact_value_beats_key_only(domain: Callable[..., RateLimit | None]) -> None:
    assert domain(("k", "exact")) == RateLimit(1, Unit.SECOND)
    assert domain(("k", "other")) == RateLimit(2, Unit.MINUTE)


def test_depth_must_equal_entry_count(domain: Callable[..., RateLimit | None]) -> None:
    assert domain(("parent", "p"), ("child", "x")) == RateLimit(3, Unit.HOUR, "nested")
    assert domain(("parent", "p")) is None  # no limit at the first level
    assert domain(("parent", "p"), ("child", "x"), ("more", "y")) is None  # ran out of tree
    assert domain(("only_parent", "x")) == RateLimit(4, Unit.DAY)
    assert domain(("only_parent", "x"), ("child", "c")) is None  # whitelisted child: no limit
    assert domain(("k", "exact"), ("k", "exact")) is None


def test_whitelist_unknown_empty_and_case(domain: Callable[..., RateLimit | None]) -> None:
    assert domain(("white", "anything")) is None
    assert domain(("unknown", "x")) is None
    assert domain() is None
    assert domain(("Case", "Value")) == RateLimit(5, Unit.YEAR)
    assert domain(("Case", "value")) is None
    assert domain(("case", "Value")) is None


def test_scalar_values_read_as_text(write_config: WriteConfig) -> None:
    config = load_directory(write_config("""
        domain: 42
        descriptors:
          - key: port
            value: 8080
            rate_limit: {unit: second, requests_per_unit: 0x10}
          - key: flag
            value: true
            rate_limit: {unit: second, requests_per_unit: 1}
    """))
    d = config.domains["42"]
    matches = [d.match((("port", "8080"),)), d.match((("flag", "true"),))]
    assert [m.rule.rate_limit if m else None for m in matches] == [
        RateLimit(16, Unit.SECOND), RateLimit(1, Unit.SECOND)]


def test_every_file_of_the_directory_is_loaded(write_config: WriteConfig) -> None:
    write_config("domain: a\n", "a.yaml")
    write_config("domain: b\n", "b.yml")
    write_config("not: yaml config\n", "notes.txt")
    directory = write_config("domain: hidden\n", ".hidden.yaml")
    assert sorted(load_directory(directory).domains) == ["a", "b"]


def errors(write_config: WriteConfig, text: str) -> list[str]:
    directory = write_config(text)
    with pytest.raises(ConfigError) as caught:
        load_directory(directory)
    return [str(i).replace(f"{directory}/", "") for i in caught.value.issues]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", ["config.yaml: domain: is required (the file is empty)"]),
        ("descriptors: []\n", ["config.yaml:1: domain: is required and must not be empty"]),
        ('domain: ""\n', ["config.yaml:1: domain: is required and must not be empty"]),
        ("- a\n- b\n", ["config.yaml:1: must be a mapping, got a list"]),
        ("domain: d\nextra: 1\n", [
            "config.yaml:2: extra: unknown key 'extra' (expected one of: domain, descriptors, failure_mode, name)"]),
        ("domain: d\ndescriptors:\n  - value: v\n", [
            "config.yaml:3: descriptors[0].key: is required and must not be empty"]),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n", [
            "config.yaml:4: descriptors[0].rate_limit.unit: unknown unit 'fortnight' "
            "(expected one of: second, minute, hour, day, week, month, year)"]),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1}\n", [
            "config.yaml:4: descriptors[0].rate_limit.unit: is required "
            "(one of: second, minute, hour, day, week, month, year)"]),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n", [
            "config.yaml:4: descriptors[0].rate_limit.requests_per_unit: must be between 0 and 4294967295, got -1"]),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 4294967296}\n", [
            "config.yaml:4: descriptors[0].rate_limit.requests_per_unit: "
            "must be between 0 and 4294967295, got 4294967296"]),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1.5}\n", [
            "config.yaml:4: descriptors[0].rate_limit.requests_per_unit: must be a whole number, got '1.5'"]),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: '5'}\n", [
            "config.yaml:4: descriptors[0].rate_limit.requests_per_unit: must be a whole number, got '5'"]),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n", [
            "config.yaml:4: descriptors[0].rate_limit.unit: must not be set when unlimited is true"]),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: 1, unit: second}\n", [
            "config.yaml:4: descriptors[0].rate_limit.unlimited: must be true or false, got '1'"]),
        ("domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n", [
            "config.yaml:5: descriptors[1]: duplicate descriptor composite key 'd.k_v'"]),
        ("domain: d\ndescriptors:\n  - key: k\n  - key: k\n", [
            "config.yaml:4: descriptors[1]: duplicate descriptor composite key 'd.k'"]),
        ("domain: d\ndescriptors:\n  - key: k\n    key: j\n", [
            "config.yaml:4: descriptors[0].key: duplicate key in the same mapping"]),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 2}\n", [
            "config.yaml:4: descriptors[0].rate_limit.burst: is only for algorithm: token_bucket"]),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, per: 2}\n", [
            "config.yaml:4: descriptors[0].rate_limit.per: unknown key 'per' (expected one of: unit, "
            "requests_per_unit, unlimited, name, replaces, unit_multiplier, algorithm, burst)"]),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, algorithm: leaky}\n", [
            "config.yaml:4: descriptors[0].rate_limit.algorithm: unknown algorithm 'leaky' (expected one of: "
            "sliding_window_log, sliding_window_counter, token_bucket, fixed_window)"]),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, unit_multiplier: 0}\n", [
            "config.yaml:4: descriptors[0].rate_limit.unit_multiplier: must be between 1 and 4294967295, got 0"]),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, unit_multiplier: 300}\n", [
            "config.yaml:4: descriptors[0].rate_limit.unit_multiplier: makes a window of 9460800000 s, "
            "longer than the 9007199254 s allowed"]),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, name: a, replaces: [{name: a}]}\n", [
            "config.yaml:4: descriptors[0].rate_limit.replaces[0].name: a limit cannot replace its own name 'a'"]),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, replaces: [{name: ''}]}\n", [
            "config.yaml:4: descriptors[0].rate_limit.replaces[0].name: must not be empty"]),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, replaces: x}\n", [
            "config.yaml:4: descriptors[0].rate_limit.replaces: must be a list of {name: ...}, got a scalar"]),
        ("domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n", [
            "config.yaml:5: descriptors[0].share_threshold: needs a value with '*' to share"]),
        ("domain: d\ndescriptors:\n  - key: k\n    value: a*\n  - key: k\n    value: a*\n", [
            "config.yaml:5: descriptors[1]: duplicate descriptor composite key 'd.k_a*'"]),
        ("domain: d\ndescriptors:\n  - key: k\n    shadow_mode: yes please\n", [
            "config.yaml:4: descriptors[0].shadow_mode: must be true or false, got 'yes please'"]),
        ("domain: d\ndescriptors:\n  - key: k\n    metadata: [1]\n", [
            "config.yaml:4: descriptors[0].metadata: must be a mapping, got a list"]),
        ("domain: d\ndescriptors:\n  - key: k\n    metadata: {1: a}\n", [
            "config.yaml:4: descriptors[0].metadata: must have text keys only"]),
        ("domain: d\ndescriptors:\n  - key: k\n    metadata: {a: [!!binary aGk=]}\n", [
            "config.yaml:4: descriptors[0].metadata: must hold only strings, numbers, booleans, lists and "
            "mappings with text keys"]),
        ("domain: d\ndescriptors:\n  - key: k\n    metadata: {big: 1" + "0" * 400 + "}\n", [
            "config.yaml:4: descriptors[0].metadata: holds a whole number of 401 digits, which a protobuf Struct "
            "(a double) cannot hold"]),
        ("domain: d\ndescriptors:\n  - key: k\n    metadata: {x: [.nan]}\n", [
            "config.yaml:4: descriptors[0].metadata: holds nan, which JSON and a protobuf Struct cannot carry"]),
        ("domain: d\ndescriptors:\n  - key: k\n    metadata: {x: " + "[" * 20 + "]" * 20 + "}\n", [
            "config.yaml:4: descriptors[0].metadata: nests more than 20 mappings and lists deep (a response "
            "nesting deeper cannot be read by protobuf, Envoy's included)"]),
        ("domain: d\ndescriptors: {key: k}\n", [
            "config.yaml:2: descriptors: must be a list of descriptors, got a mapping"]),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: [1]\n", [
            "config.yaml:4: descriptors[0].rate_limit: must be a mapping, got a list"]),
        ("domain: [d]\n", ["config.yaml:1: domain: must be a string, got a list"]),
        ("domain: \"\\ud800\"\n", [
            "config.yaml:1: invalid YAML: found invalid Unicode character escape code"]),
        ("domain: d\x01\n", ["config.yaml:1: invalid YAML: control characters are not allowed"]),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: !!int abc}\n", [
            "config.yaml:4: descriptors[0].rate_limit.requests_per_unit: must be a whole number, got 'abc'"]),
        # SafeConstructor indexes an empty !!int at [0] and calls None.groupdict() on a !!timestamp it cannot match
        ('domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: !!int ""}\n', [
            "config.yaml:4: descriptors[0].rate_limit.requests_per_unit: must be a whole number, got ''"]),
        ("domain: d\ndescriptors:\n  - key: k\n    metadata: {a: !!timestamp x, b: !!float ''}\n", [
            "config.yaml:4: descriptors[0].metadata: cannot be read: a value does not fit its tag"]),
        ("domain: d\ndescriptors:\n  - key: k\n    metadata: {? [a] : 1}\n", [
            "config.yaml:4: descriptors[0].metadata: cannot be read: found unhashable key"]),
        ("domain: &a d\nname: &a n\n", ["config.yaml:2: invalid YAML: found duplicate anchor (first on line 1)"]),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1:30}\n", [
            "config.yaml:4: descriptors[0].rate_limit.requests_per_unit: must be a whole number, got '1:30'"]),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: " + "9" * 5000
         + "}\n", ["config.yaml:4: descriptors[0].rate_limit.requests_per_unit: must be a whole number, got '"
                   + "9" * 80 + "…' (5000 characters)"]),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: !!bool maybe}\n", [
            "config.yaml:4: descriptors[0].rate_limit.unlimited: must be true or false, got 'maybe'",
            "config.yaml:4: descriptors[0].rate_limit.unit: is required "
            "(one of: second, minute, hour, day, week, month, year)"]),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: \u017fecond}\n", [
            "config.yaml:4: descriptors[0].rate_limit.unit: unknown unit '\u017fecond' "
            "(expected one of: second, minute, hour, day, week, month, year)"]),
        ("domain: d\ndescriptors: &d [{key: k, descriptors: *d}]\n", [
            "config.yaml: descriptors nested too deeply, or a YAML alias that contains itself"]),
        ("domain: d\n  bad: indentation\n", [
            "config.yaml:2: invalid YAML: mapping values are not allowed in this context"]),
        # left open until the end of the file: the line where it was opened, never one past the file's last
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1\n", [
            "config.yaml:4: invalid YAML: did not find expected ',' or '}' (while parsing a flow mapping begun on "
            "this line, never closed)"]),
        ('domain: d\ndescriptors:\n  - key: "k\n  - key: j\n', [
            "config.yaml:3: invalid YAML: found unexpected end of stream (while scanning a quoted scalar begun on "
            "this line, never closed)"]),
        ("domain: d\ndescriptors: [", [
            "config.yaml:2: invalid YAML: did not find expected node content (while parsing a flow node begun on "
            "this line, never closed)"]),
        # in line order: a rule's own problems (on its later lines) before the duplicate key on its first
        ("domain: d\ndescriptors:\n  - key: a\n  - key: a\n    rate_limit:\n      requests_per_unit: 2\n"
         "  - key: b\n    descriptors:\n      - key: c\n      - key: c\n        rate_limit: {unit: bogus}\n", [
             "config.yaml:4: descriptors[1]: duplicate descriptor composite key 'd.a'",
             "config.yaml:6: descriptors[1].rate_limit.unit: is required "
             "(one of: second, minute, hour, day, week, month, year)",
             "config.yaml:10: descriptors[2].descriptors[1]: duplicate descriptor composite key 'd.c'",
             "config.yaml:11: descriptors[2].descriptors[1].rate_limit.unit: unknown unit 'bogus' "
             "(expected one of: second, minute, hour, day, week, month, year)"]),
    ],
)
def test_errors_name_file_line_and_field(write_config: WriteConfig, text: str, expected: list[str]) -> None:
    assert errors(write_config, text) == expected


def test_every_error_of_every_file_is_reported(write_config: WriteConfig) -> None:
    write_config("domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: x}\n  - value: v\n", "a.yaml")
    write_config("domain: a\n", "b.yaml")
    directory = write_config("domain: c\nbad: 1\n", "c.yaml")
    with pytest.raises(ConfigError) as caught:
        load_directory(directory)
    assert [str(i).replace(f"{directory}/", "") for i in caught.value.issues] == [
        "a.yaml:4: descriptors[0].rate_limit.unit: unknown unit 'x' "
        "(expected one of: second, minute, hour, day, week, month, year)",
        "a.yaml:5: descriptors[1].key: is required and must not be empty",
        "b.yaml:1: domain: duplicate domain 'a' (also in a.yaml)",
        "c.yaml:2: bad: unknown key 'bad' (expected one of: domain, descriptors, failure_mode, name)",
    ]


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config directory does not exist"):
        load_directory(tmp_path / "nope")


def test_check_config_command(write_config: WriteConfig) -> None:
    directory = write_config(MATCHING)
    result = CliRunner().invoke(main, ["check-config", str(directory)])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == "OK: 1 domain(s), 5 limit(s)"
    assert "  [parent=p, child] 3/hour sliding_window_log name=nested" in result.output
    assert "  [white] no limit" in result.output and "  [only_parent, child=c] no limit" in result.output
    shadow = write_config("domain: s\ndescriptors:\n  - key: k\n    value: a*\n    share_threshold: true\n"
                          "    shadow_mode: true\n    metadata: {t: 1}\n    rate_limit: {unit: day}\n", "s.yaml")
    result = CliRunner().invoke(main, ["check-config", str(shadow)])
    assert '  [k=a*] 0/day sliding_window_log share_threshold shadow_mode metadata={"t": 1}' in result.output
    write_config("domain: x\nbad: 1\n", "z.yaml")
    result = CliRunner().invoke(main, ["check-config", str(directory)])
    assert result.exit_code == 1
    assert "z.yaml:2: bad: unknown key 'bad'" in result.output
    for not_a_directory in (directory / "z.yaml", directory / "missing"):
        result = CliRunner().invoke(main, ["check-config", str(not_a_directory)])
        assert result.exit_code == 2 and "Directory" in result.output, result.output


WILDCARDS = """
domain: w
descriptors:
  - key: path
    value: /api/v1/users
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: /api/*/users
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: path
    value: /api/*
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: path
    value: "*.json"
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: path
    rate_limit: {unit: second, requests_per_unit: 5}
"""


def test_wildcards_exact_then_first_pattern_then_key_only(write_config: WriteConfig) -> None:
    config = load_directory(write_config(WILDCARDS)).domains["w"]

    def limit(value: str) -> tuple[int, tuple[tuple[str, str], ...]]:
        match = config.match((("path", value),))
        assert match is not None and match.rule.rate_limit is not None
        return match.rule.rate_limit.requests_per_unit, match.key_entries

    assert limit("/api/v1/users") == (1, (("path", "/api/v1/users"),))  # exact beats wildcard
    assert limit("/api/v2/users") == (2, (("path", "/api/v2/users"),))  # per-value counter
    assert limit("/api//users") == (2, (("path", "/api//users"),))  # * matches zero characters
    assert limit("/api/v2/users.json") == (3, (("path", "/api/*"),))  # first pattern in config order; shared
    assert limit("/api/v2/orders") == (3, (("path", "/api/*"),))
    assert limit("/x.json") == (4, (("path", "/x.json"),))
    assert limit("/x.jsonp") == (5, (("path", "/x.jsonp"),))  # patterns match the whole value
    assert limit("/API/v1") == (5, (("path", "/API/v1"),))  # case-sensitive


@given(pattern=st.lists(st.text("ab/", max_size=3), min_size=2, max_size=5).map("*".join),
       value=st.text("ab/", max_size=12))
def test_a_wildcard_matches_as_the_plain_glob_would(pattern: str, value: str) -> None:
    # the reference: each * is ".*", the rest literal, the whole value
    reference = re.fullmatch(".*".join(re.escape(p) for p in pattern.split("*")), value, re.DOTALL) is not None
    assert wildcard_pattern(pattern).matches(value) is reference


def test_a_wildcard_does_not_backtrack() -> None:
    # as a regular expression (/api/.*/.*/.*/items) the 16 KiB value took hours; an attacker chooses the value
    assert not wildcard_pattern("/api/*/*/*/items").matches("/api/" + "/" * 16_000)
    assert wildcard_pattern("/api/*/*/*/items").matches("/api/" + "/" * 16_000 + "items")


def test_merge_domain_config(write_config: WriteConfig) -> None:
    write_config("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
                 "1.yaml")
    directory = write_config("domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: hour}\n", "2.yaml")
    with pytest.raises(ConfigError, match="duplicate domain 'd'"):
        load_directory(directory)
    domain = load_directory(directory, LoadOptions(merge_domains=True)).domains["d"]
    assert [path for path, _ in domain.limits()] == [[("a", None)], [("b", None)]]
    write_config("domain: d\ndescriptors:\n  - key: a\n", "3.yaml")
    with pytest.raises(ConfigError) as caught:
        load_directory(directory, LoadOptions(merge_domains=True))
    assert [str(i).replace(f"{directory}/", "") for i in caught.value.issues] == [
        "3.yaml:3: duplicate descriptor composite key 'd.a' (merging domain files)"]


def test_extensions_and_reference_keys_load(write_config: WriteConfig) -> None:
    config = load_directory(write_config("""
        domain: x
        descriptors:
          - key: k
            shadow_mode: true
            quota_mode: false
            detailed_metric: true
            value_to_metric: true
            metadata: {tier: gold, n: 3, tags: [a, b]}
            rate_limit:
              unit: minute
              unit_multiplier: 5
              requests_per_unit: 10
              algorithm: token_bucket
              burst: 20
              name: five
              replaces: [{name: other}]
    """), LoadOptions(default_algorithm=Algorithm.FIXED_WINDOW)).domains["x"]
    match = config.match((("k", "v"),))
    assert match is not None
    rule = match.rule
    assert (rule.shadow_mode, rule.quota_mode, rule.detailed_metric, rule.value_to_metric) == (True, False, True, True)
    assert rule.metadata == {"tier": "gold", "n": 3, "tags": ["a", "b"]}
    assert rule.rate_limit == RateLimit(10, Unit.MINUTE, "five", unit_multiplier=5, algorithm=Algorithm.TOKEN_BUCKET,
                                        burst=20, replaces=("other",))
    assert rule.rate_limit.window_seconds == 300
    plain = load_directory(write_config("domain: y\ndescriptors:\n  - key: k\n    rate_limit: {unit: day}\n", "y.yaml"),
                           LoadOptions(default_algorithm=Algorithm.FIXED_WINDOW)).domains["y"].limits()
    assert plain[0][1].algorithm is Algorithm.FIXED_WINDOW


def test_alias_expansion_is_bounded(write_config: WriteConfig) -> None:
    # "billion laughs": 8 levels of 10 aliases would expand to 10^8 descriptors
    # (the anchors sit under unknown keys, which are reported too)
    lines = ["domain: d", "x0: &l0 [{key: k, rate_limit: {unit: second}}]"]
    for n in range(1, 9):
        refs = ", ".join(f"{{key: k{i}, descriptors: *l{n - 1}}}" for i in range(10))
        lines.append(f"x{n}: &l{n} [{refs}]")
    lines.append("descriptors: *l8")
    with pytest.raises(ConfigError) as caught:
        load_directory(write_config("\n".join(lines) + "\n"))
    assert str(caught.value.issues[0]).endswith(
        "config.yaml: more than 100000 descriptors and limits (after expanding YAML aliases): split it or drop aliases")


def test_unreadable_entries_are_reported(write_config: WriteConfig) -> None:
    directory = write_config("domain: a\n", "a.YAML")
    (directory / "broken.yaml").symlink_to(directory / "missing")
    (directory / "dir.yml").mkdir()
    os.mkfifo(directory / "pipe.yaml")
    with pytest.raises(ConfigError) as caught:
        load_directory(directory)
    assert [str(i).replace(f"{directory}/", "") for i in caught.value.issues] == [
        "broken.yaml: cannot read file: No such file or directory",
        "dir.yml: not a regular file",
        "pipe.yaml: not a regular file",
    ]


def test_metadata_alias_expansion_is_bounded(write_config: WriteConfig) -> None:
    lines = ["domain: d", "descriptors:", "  - key: k", "    metadata:", "      l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    for n in range(1, 8):
        lines.append(f"      l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 10)}]")
    with pytest.raises(ConfigError, match="more than 100000 descriptors and limits"):
        load_directory(write_config("\n".join(lines) + "\n"))


def test_huge_files_are_refused(write_config: WriteConfig) -> None:
    directory = write_config("domain: big\n# " + "x" * (16 * 1024 * 1024) + "\n")
    with pytest.raises(ConfigError, match=r"config\.yaml: larger than 16 MiB"):
        load_directory(directory)


def test_yaml_the_reference_accepts(write_config: WriteConfig) -> None:
    """envoyproxy/ratelimit (src/config/config_impl.go: yaml.Unmarshal into its YamlRoot) reads a top-level
    ``name`` and ``rate_limit: null``, and a file ending in an empty document."""
    directory = write_config("name: mine\ndomain: r\ndescriptors:\n  - key: k\n    rate_limit: null\n"
                             "  - key: j\n    rate_limit: {unit: second, requests_per_unit: 1}\n---\n")
    config = load_directory(directory).domains["r"]
    nothing, limited = config.match((("k", "v"),)), config.match((("j", "v"),))
    assert nothing is not None and nothing.rule.rate_limit is None  # whitelisted, as with no rate_limit at all
    assert limited is not None and limited.rule.rate_limit is not None


def test_a_second_yaml_document_is_refused(write_config: WriteConfig) -> None:
    # the reference reads the first document and drops the rest without a word; refused here with its line
    assert errors(write_config, "domain: a\ndescriptors: []\n---\ndomain: b\ndescriptors: []\n") == [
        "config.yaml:3: a second YAML document ('---'): one file holds one domain (envoyproxy/ratelimit reads "
        "only the first and ignores the rest); put each in a file of its own"]
