"""xDS resources built into the config model directly (slidegate.config.from_xds): the same rules as a file's,
each error naming its resource and the field path, and the same model as the same limits in a YAML file."""

from __future__ import annotations

import math
from typing import Any

import pytest

from slidegate.config import ConfigError, LoadOptions
from slidegate.config.describe import describe_config
from slidegate.config.from_xds import load_resources
from slidegate.config.loader import load_texts
from slidegate.protos import rls_conf_pb2 as conf


def refused(*resources: conf.RateLimitConfig, options: LoadOptions | None = None) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_resources(resources, "1", options or LoadOptions())
    return [str(i) for i in caught.value.issues]


def policy(**fields: object) -> conf.RateLimitPolicy:
    return conf.RateLimitPolicy(**fields)  # type: ignore[arg-type]


def test_nested_errors_name_the_resource_and_the_path_of_each() -> None:
    resource = conf.RateLimitConfig(name="r", domain="d", descriptors=[
        conf.RateLimitDescriptor(key="a", rate_limit=policy(unit=conf.SECOND, requests_per_unit=1)),
        conf.RateLimitDescriptor(key="a"),
        conf.RateLimitDescriptor(key="b", descriptors=[
            conf.RateLimitDescriptor(key=""),
            conf.RateLimitDescriptor(key="c", rate_limit=policy(unlimited=True, unit=conf.HOUR)),
            conf.RateLimitDescriptor(key="e", rate_limit=policy(
                unit=conf.MINUTE, name="n", replaces=[conf.RateLimitReplace(name="n"), conf.RateLimitReplace()])),
        ]),
    ])
    assert refused(resource) == [
        "r: descriptors[1]: duplicate descriptor composite key 'd.a'",
        "r: descriptors[2].descriptors[0].key: is required and must not be empty",
        "r: descriptors[2].descriptors[1].rate_limit.unit: must not be set when unlimited is true",
        "r: descriptors[2].descriptors[2].rate_limit.replaces[0].name: a limit cannot replace its own name 'n'",
        "r: descriptors[2].descriptors[2].rate_limit.replaces[1].name: must not be empty",
    ]


def test_domain_and_duplicates_across_resources() -> None:
    assert refused(conf.RateLimitConfig(name="empty")) == ["empty: domain: is required and must not be empty"]
    twice = [conf.RateLimitConfig(name=n, domain="d") for n in ("one", "two")]
    assert refused(*twice) == ["two: domain: duplicate domain 'd' (also in one)"]
    merged = load_resources(twice, "1", LoadOptions(merge_domains=True))
    assert list(merged.domains) == ["d"]
    rule = [conf.RateLimitDescriptor(key="k")]
    same_rule = [conf.RateLimitConfig(name=n, domain="d", descriptors=rule) for n in ("one", "two")]
    assert refused(*same_rule, options=LoadOptions(merge_domains=True)) == [
        "two: duplicate descriptor composite key 'd.k' (merging domain files)"]


def test_metadata_a_struct_cannot_carry_is_refused() -> None:
    descriptor = conf.RateLimitDescriptor(key="k")
    descriptor.metadata.update({"x": [math.nan]})
    assert refused(conf.RateLimitConfig(name="r", domain="d", descriptors=[descriptor])) == [
        "r: descriptors[0].metadata: holds nan, which JSON and a protobuf Struct cannot carry"]
    deep = conf.RateLimitDescriptor(key="k")
    top: dict[str, Any] = {}
    inner = top
    for _ in range(25):
        inner["x"] = inner = {}
    deep.metadata.update(top)
    assert refused(conf.RateLimitConfig(name="r", domain="d", descriptors=[deep]))[0].startswith(
        "r: descriptors[0].metadata: nests more than 20 mappings and lists deep")


def test_a_resource_builds_the_model_its_yaml_would() -> None:
    descriptor = conf.RateLimitDescriptor(
        key="k", value="v*", shadow_mode=True, quota_mode=True,
        rate_limit=policy(unit=conf.DAY, requests_per_unit=7, name="n", replaces=[conf.RateLimitReplace(name="m")]),
        descriptors=[conf.RateLimitDescriptor(key="free", rate_limit=policy(unlimited=True)),
                     conf.RateLimitDescriptor(key="zero", value="0", rate_limit=policy(unit=conf.SECOND))])
    descriptor.metadata.update({"team": "a", "n": 2, "list": [True, None, "x"]})
    from_xds = load_resources([conf.RateLimitConfig(name="res", domain="d", descriptors=[descriptor])], "3",
                              LoadOptions())
    from_file = load_texts([("res", """
domain: d
descriptors:
  - key: k
    value: v*
    shadow_mode: true
    quota_mode: true
    metadata: {team: a, n: 2.0, list: [true, null, x]}
    rate_limit: {unit: DAY, requests_per_unit: 7, name: n, replaces: [{name: m}]}
    descriptors:
      - key: free
        rate_limit: {unlimited: true, requests_per_unit: 0}
      - key: zero
        value: "0"
        rate_limit: {unit: SECOND, requests_per_unit: 0}
""")])
    assert describe_config(from_xds) == "xds version 3\n" + describe_config(from_file)
    assert from_xds.domains["d"].match((("k", "vvv"), ("zero", "0"))) is not None
    assert [limit for _, limit in from_xds.domains["d"].limits()] == [
        limit for _, limit in from_file.domains["d"].limits()]
