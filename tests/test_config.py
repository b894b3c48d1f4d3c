"""Config loading and matching (envoyproxy/ratelimit's format and rules), with exact error texts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from slidegate.cli import main
from slidegate.config import ConfigError, RateLimit, load_directory
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
    return lambda *entries: config.match(list(entries))


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
    assert d.match([("port", "8080")]) == RateLimit(16, Unit.SECOND)
    assert d.match([("flag", "true")]) == RateLimit(1, Unit.SECOND)


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
            "config.yaml:2: extra: unknown key 'extra' (expected one of: domain, descriptors)"]),
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
            "config.yaml:4: descriptors[0].rate_limit.burst: unknown key 'burst' "
            "(expected one of: unit, requests_per_unit, unlimited, name)"]),
        ("domain: d\ndescriptors: {key: k}\n", [
            "config.yaml:2: descriptors: must be a list of descriptors, got a mapping"]),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: [1]\n", [
            "config.yaml:4: descriptors[0].rate_limit: must be a mapping, got a list"]),
        ("domain: [d]\n", ["config.yaml:1: domain: must be a string, got a list",
                           "config.yaml:1: domain: is required and must not be empty"]),
        ("domain: d\n  bad: indentation\n", ["config.yaml:2: invalid YAML: mapping values are not allowed here"]),
        ("domain: d\ndescriptors:\n  - key: k\n    shadow_mode: true\n", [
            "config.yaml:4: descriptors[0].shadow_mode: 'shadow_mode' is not supported yet by slidegate"]),
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
        "c.yaml:2: bad: unknown key 'bad' (expected one of: domain, descriptors)",
    ]


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config directory does not exist"):
        load_directory(tmp_path / "nope")


def test_check_config_command(write_config: WriteConfig) -> None:
    directory = write_config(MATCHING)
    result = CliRunner().invoke(main, ["check-config", str(directory)])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == "OK: 1 domain(s), 5 limit(s)"
    assert "  [parent=p, child] 3/hour name=nested" in result.output
    write_config("domain: x\nbad: 1\n", "z.yaml")
    result = CliRunner().invoke(main, ["check-config", str(directory)])
    assert result.exit_code == 1
    assert "z.yaml:2: bad: unknown key 'bad'" in result.output
