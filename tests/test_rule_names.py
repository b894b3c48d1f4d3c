"""rule_name: a limit's YAML name where set, else its key path."""

from __future__ import annotations

import pytest

from slidegate.config.loader import load_texts
from slidegate.rule_names import rule_name

CONFIG = """
domain: names
descriptors:
  - key: generic_key
    value: api.user
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: remote_address
    descriptors:
      - key: path
        value: /login*
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5, name: per-user}
"""


@pytest.mark.parametrize(("entries", "name"), [
    ((("generic_key", "api.user"),), "generic_key=api.user"),
    ((("remote_address", "10.0.0.1"), ("path", "/login/x")), "remote_address.path=/login*"),
    ((("user", "u1"),), "per-user"),
])
def test_a_rule_is_named_by_its_limit_name_or_its_key_path(entries: tuple[tuple[str, str], ...], name: str) -> None:
    domain = load_texts([("names.yaml", CONFIG)]).domains["names"]
    match = domain.match(entries)
    assert match is not None
    assert rule_name(match.rule) == name
