"""Stat keys as envoyproxy/ratelimit composes them: the cases of its test/config/config_test.go (TestBasicConfig,
TestConfigLimitOverride, TestWildcardConfig, TestDetailedMetric, TestValueToMetric_*, TestShareThreshold and
TestWildcardStatsBehavior, with their configs basic_config.yaml, wildcard.yaml and share_threshold.yaml), decided
by the service on the memory backend and read back from the stats store under the names its statsd sink sends."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from slidegate.backends.base import Backend, BackendUnavailable
from slidegate.backends.blocked import OverLimitCache
from slidegate.backends.memory import MemoryBackend
from slidegate.config import load_directory
from slidegate.limiter import Descriptor, InvalidOverride, Limiter, LimiterOptions, Override
from slidegate.metric_keys import sanitize
from slidegate.metrics import DETAILED_VALUES
from slidegate.service import RateLimitService
from slidegate.units import Unit
from tests.conftest import FailingBackend

# test/config/basic_config.yaml, the parts its cases use
BASIC = """
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: subkey1
        value: subvalue1
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key2
    value: value2
    rate_limit: {unit: minute, requests_per_unit: 30}
  - key: key6
    rate_limit: {unlimited: true}
  - key: key7
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 70}
"""

# test/config/wildcard.yaml, and TestWildcardConfig's nested case
WILDCARD = """
domain: test-domain
descriptors:
  - key: wild
    value: foo*
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: noVal
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: midWild
    value: bar*b
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: multiWild
    value: foo*bar*baz
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: nestedWild
    value: val1
    descriptors:
      - key: wild
        value: goo*
        rate_limit: {unit: minute, requests_per_unit: 20}
"""

# TestDetailedMetric's realistic nested config
NESTED = """
domain: nested
descriptors:
  - key: key_1
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 500}
  - key: key_1
    value: some-value-for-key-1
    rate_limit: {unit: minute, requests_per_unit: 500}
  - key: key_2
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5000}
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 5}
"""

# TestDetailedMetric's two-level configs, detailed or not
TWO_LEVELS = """
domain: nested
descriptors:
  - key: key-1
    detailed_metric: {detailed}
    rate_limit: {{unit: minute, requests_per_unit: 100}}
    descriptors:
      - key: key-2
        detailed_metric: {detailed}
        rate_limit: {{unit: minute, requests_per_unit: 5}}
"""

# TestValueToMetric_*'s configs
VALUE_TO_METRIC = """
domain: d
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
      - key: http_method
        value: POST
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 30}
      - key: detailed
        value_to_metric: true
        descriptors:
          - key: subject_id
            detailed_metric: true
            rate_limit: {unit: minute, requests_per_unit: 60}
  - key: k1
    descriptors:
      - key: k2
        value_to_metric: true
        descriptors:
          - key: k3
            rate_limit: {unit: second, requests_per_unit: 1}
      - key: k2b
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: {unit: minute, requests_per_unit: 100}
  - key: wild
    value: foo*
    descriptors:
      - key: other
        value_to_metric: true
        descriptors:
          - key: limit
            rate_limit: {unit: minute, requests_per_unit: 20}
  - key: wild2
    value: foo*bar*
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 20}
"""

# test/config/share_threshold.yaml
SHARE_THRESHOLD = """
domain: test-domain
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: nested
    value: parent
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 200}
  - key: files
    value: top/*
    share_threshold: true
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 300}
  - key: route
    value: api/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: service
    value: svc/*
    share_threshold: true
    descriptors:
      - key: endpoint
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 80}
  - key: path
    value: path/*
    share_threshold: true
    descriptors:
      - key: file
        value: file/*
        share_threshold: false
        descriptors:
          - key: type
            rate_limit: {unit: minute, requests_per_unit: 120}
  - key: user
    value: user/*
    share_threshold: true
    descriptors:
      - key: resource
        value: res/*
        share_threshold: true
        descriptors:
          - key: action
            rate_limit: {unit: minute, requests_per_unit: 150}
  - key: file
    value: test1
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: file
    value: test*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: midpath
    value: /api*v1
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: multiroute
    value: svc*ep*rpc
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: midroute
    value: /api*v2
    share_threshold: true
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 80}
  - key: tenant
    value: t*prod
    share_threshold: true
    descriptors:
      - key: resource
        value: res*v2
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 60}
"""

Entries = tuple[tuple[str, str], ...]

CASES: list[tuple[str, str, Entries, str]] = [
    # TestBasicConfig
    (BASIC, "test-domain", (("key1", "value1"), ("subkey1", "something")), "test-domain.key1_value1.subkey1"),
    (BASIC, "test-domain", (("key1", "value1"), ("subkey1", "subvalue1")), "test-domain.key1_value1.subkey1_subvalue1"),
    (BASIC, "test-domain", (("key2", "something"),), "test-domain.key2"),
    (BASIC, "test-domain", (("key2", "value2"),), "test-domain.key2_value2"),
    (BASIC, "test-domain", (("key7", "unspecified_value"),), "test-domain.key7_unspecified_value"),
    (BASIC, "test-domain", (("key7", "another_value"),), "test-domain.key7_another_value"),
    # TestWildcardConfig
    (WILDCARD, "test-domain", (("noVal", "foo1"),), "test-domain.noVal"),
    (WILDCARD, "test-domain", (("wild", "foo1"),), "test-domain.wild_foo*"),
    (WILDCARD, "test-domain", (("nestedWild", "val1"), ("wild", "goo2")), "test-domain.nestedWild_val1.wild_goo*"),
    (WILDCARD, "test-domain", (("midWild", "bar123b"),), "test-domain.midWild_bar*b"),
    (WILDCARD, "test-domain", (("multiWild", "foo123bar456baz"),), "test-domain.multiWild_foo*bar*baz"),
    # TestDetailedMetric
    (TWO_LEVELS.format(detailed="true"), "nested", (("key-1", "value-1"),), "nested.key-1_value-1"),
    (TWO_LEVELS.format(detailed="false"), "nested", (("key-1", "value-1"),), "nested.key-1"),
    (TWO_LEVELS.format(detailed="true"), "nested", (("key-1", "value-1"), ("key-2", "value-2")),
     "nested.key-1_value-1.key-2_value-2"),
    (TWO_LEVELS.format(detailed="false"), "nested", (("key-1", "value-1"), ("key-2", "value-2")), "nested.key-1.key-2"),
    (NESTED, "nested", (("key_1", "value-for-key-1"),), "nested.key_1_value-for-key-1"),
    (NESTED, "nested", (("key_2", "key-2-value"),), "nested.key_2_key-2-value"),
    (NESTED, "nested", (("key_2", "key-2-value"), ("key_3", "requested-key3-value")),
     "nested.key_2_key-2-value.key_3_requested-key3-value"),
    # TestValueToMetric_*
    (VALUE_TO_METRIC, "d", (("route", "draw"), ("http_method", "GET"), ("subject_id", "123")),
     "d.route_draw.http_method_GET.subject_id"),
    (VALUE_TO_METRIC, "d", (("k1", "X"), ("k2", "Y"), ("k3", "Z")), "d.k1.k2_Y.k3"),
    (VALUE_TO_METRIC, "d", (("k1", "X"), ("k2b", "Y")), "d.k1.k2b"),
    (VALUE_TO_METRIC, "d", (("route", "draw"), ("detailed", "GET"), ("subject_id", "123")),
     "d.route_draw.detailed_GET.subject_id_123"),
    (VALUE_TO_METRIC, "d", (("route", "api"), ("http_method", "POST"), ("subject_id", "user456")),
     "d.route_api.http_method_POST.subject_id"),
    (VALUE_TO_METRIC, "d", (("user", "alice"), ("action", "readfile"), ("resource", "documents")),
     "d.user_alice.action_readfile.resource"),
    (VALUE_TO_METRIC, "d", (("route", ""), ("http_method", ""), ("subject_id", "123")),
     "d.route.http_method.subject_id"),
    (VALUE_TO_METRIC, "d", (("wild", "foo1"), ("other", "bar"), ("limit", "X")), "d.wild_foo*.other_bar.limit"),
    (VALUE_TO_METRIC, "d", (("wild2", "foo123bar456"),), "d.wild2_foo123bar456"),
    # TestShareThreshold
    (SHARE_THRESHOLD, "test-domain", (("files", "files/a.pdf"),), "test-domain.files_files/*"),
    (SHARE_THRESHOLD, "test-domain", (("files", "files/b.csv"),), "test-domain.files_files/*"),
    (SHARE_THRESHOLD, "test-domain", (("route", "api/v1"), ("method", "GET")), "test-domain.route_api/*.method"),
    (SHARE_THRESHOLD, "test-domain", (("service", "svc/user"), ("endpoint", "get")),
     "test-domain.service_svc/*.endpoint_get"),
    (SHARE_THRESHOLD, "test-domain", (("nested", "parent"), ("files", "nested/file1.txt")),
     "test-domain.nested_parent.files_nested/*"),
    (SHARE_THRESHOLD, "test-domain", (("files", "top/file1.txt"), ("files", "nested/file1.txt")),
     "test-domain.files_top/*.files_nested/*"),
    (SHARE_THRESHOLD, "test-domain", (("path", "path/foo"), ("file", "file/doc1"), ("type", "pdf")),
     "test-domain.path_path/*.file_file/*.type"),
    (SHARE_THRESHOLD, "test-domain", (("user", "user/alice"), ("resource", "res/file1"), ("action", "read")),
     "test-domain.user_user/*.resource_res/*.action"),
    (SHARE_THRESHOLD, "test-domain", (("file", "test1"),), "test-domain.file_test1"),
    (SHARE_THRESHOLD, "test-domain", (("file", "test123"),), "test-domain.file_test*"),
    (SHARE_THRESHOLD, "test-domain", (("midpath", "/api-beta-v1"),), "test-domain.midpath_/api*v1"),
    (SHARE_THRESHOLD, "test-domain", (("multiroute", "svcXXXepYYYrpc"),), "test-domain.multiroute_svc*ep*rpc"),
    (SHARE_THRESHOLD, "test-domain", (("midroute", "/api/v2"),), "test-domain.midroute_/api*v2"),
    (SHARE_THRESHOLD, "test-domain", (("midroute", "/api-beta-v2"),), "test-domain.midroute_/api*v2"),
    (SHARE_THRESHOLD, "test-domain", (("tenant", "t1prod"), ("resource", "resAv2")),
     "test-domain.tenant_t*prod.resource_res*v2"),
]


def service_for(tmp_path: Path, config_text: str) -> RateLimitService:
    directory = tmp_path / f"config-{len(list(tmp_path.iterdir()))}"
    directory.mkdir()
    (directory / "config.yaml").write_text(textwrap.dedent(config_text))
    config = load_directory(directory)
    return RateLimitService(Limiter(lambda: config, MemoryBackend(), LimiterOptions()))


def counted(service: RateLimitService) -> dict[str, int]:
    """Every counter that counted something, by name."""
    return {name: total for name, total in service.metrics.store.totals() if total}


@pytest.mark.parametrize(("config_text", "domain", "entries", "key"), CASES, ids=[case[3] for case in CASES])
async def test_a_decision_is_counted_under_the_references_key(tmp_path: Path, config_text: str, domain: str,
                                                              entries: Entries, key: str) -> None:
    """test/config/config_test.go: the stats key of each GetLimit there (rl.Stats.Key)."""
    service = service_for(tmp_path, config_text)
    await service.decide(domain, [Descriptor(entries)], 0)
    totals = counted(service)
    assert totals[f"ratelimit.service.rate_limit.{key}.total_hits"] == 1
    assert {name.rsplit(".", 1)[0] for name in totals} == {f"ratelimit.service.rate_limit.{key}"}


async def test_one_service_counts_every_request_under_its_own_key(tmp_path: Path) -> None:
    """The same cases, one after another through one service per config: a key remembered for a rule (one that
    shows no request value) must never be given to a request whose key shows its values."""
    by_config: dict[str, list[tuple[str, Entries, str]]] = {}
    for config_text, domain, entries, key in CASES:
        by_config.setdefault(config_text, []).append((domain, entries, key))
    for config_text, cases in by_config.items():
        service = service_for(tmp_path, config_text)
        expected: dict[str, int] = {}
        for domain, entries, key in cases + cases:
            await service.decide(domain, [Descriptor(entries)], 0)
            name = f"ratelimit.service.rate_limit.{key}.total_hits"
            expected[name] = expected.get(name, 0) + 1
        hits = {name: n for name, n in counted(service).items() if name.endswith(".total_hits")}
        assert hits == expected


async def test_an_override_is_counted_under_its_descriptor(tmp_path: Path) -> None:
    """test/config/config_test.go TestConfigLimitOverride: an override's key is its descriptor's entries (and a
    change of the override's value keeps counting there); a different value is another key."""
    service = service_for(tmp_path, BASIC)
    entries = (("key1", "value1"), ("subkey1", "something"))
    for override in (Override(10, Unit.DAY), Override(42, Unit.HOUR)):
        await service.decide("test-domain", [Descriptor(entries, override=override)], 0)
    await service.decide("test-domain", [Descriptor((("key1", "value1"), ("subkey1", "something_else")),
                                                    override=Override(42, Unit.HOUR))], 0)
    totals = counted(service)
    assert totals["ratelimit.service.rate_limit.test-domain.key1_value1.subkey1_something.total_hits"] == 2
    assert totals["ratelimit.service.rate_limit.test-domain.key1_value1.subkey1_something_else.total_hits"] == 1
    assert not any("override" in name for name in totals)


async def test_unlimited_and_unknown_domains(tmp_path: Path) -> None:
    """src/service/ratelimit.go constructLimitsToCheck hands an unlimited limit to the cache as no limit, and
    src/limiter/base_limiter.go counts total_hits only for limits it is given: an unlimited rule counts nothing
    (config_test.go's key6 case adds to its stats by hand). src/config/config_impl.go GetLimit counts
    domain_not_found once per descriptor looked up in a domain no config has."""
    service = service_for(tmp_path, BASIC)
    await service.decide("test-domain", [Descriptor((("key6", "foo"),))], 0)
    await service.decide("foo_domain", [Descriptor((("key2", "x"),)), Descriptor((("key2", "y"),))], 0)
    assert counted(service) == {"ratelimit.service.rate_limit.foo_domain.domain_not_found": 2}


@pytest.mark.parametrize(("name", "expected"), [
    ("domain.foo|bar", "domain.foo_bar"),
    ("domain.foo:bar", "domain.foo_bar"),
    ("domain.masked_remote_address_0.0.0.0/0", "domain.masked_remote_address_0_0_0_0/0"),
    ("domain.remote_address_172.18.0.1", "domain.remote_address_172_18_0_1"),
    ("domain.masked_remote_address_0.0.0.0/0_remote_address_172.18.0.1",
     "domain.masked_remote_address_0_0_0_0/0_remote_address_172_18_0_1"),
    ("domain.line\nend", "domain.line_end"),  # slidegate's: a line end would start another statsd line
])
def test_names_are_sanitized_as_the_reference(name: str, expected: str) -> None:
    """src/utils/utilities_test.go TestSanitizeStatName's cases."""
    assert sanitize(name) == expected


async def test_a_sanitized_key_is_counted_and_labelled_alike(tmp_path: Path) -> None:
    """src/stats/manager_impl.go NewStats sanitizes the key it names stats by: statsd and Prometheus get the same
    key."""
    service = service_for(tmp_path, BASIC)
    await service.decide("test-domain", [Descriptor((("key7", "10.1.2.3:80|x"),))], 0)
    assert "ratelimit.service.rate_limit.test-domain.key7_10_1_2_3_80_x.total_hits" in counted(service)
    text = service.metrics.render().decode()
    assert 'ratelimit_service_rate_limit_total_hits_total{domain="test-domain",key="key7_10_1_2_3_80_x"} 1.0' in text


async def test_keys_with_request_values_are_bounded(tmp_path: Path) -> None:
    """slidegate's bound (the reference has none): DETAILED_VALUES keys per rule, later ones under
    ``<config path>__other``; a value seen before keeps its key."""
    service = service_for(tmp_path, BASIC)
    for i in range(DETAILED_VALUES + 5):
        await service.decide("test-domain", [Descriptor((("key7", f"v{i}"),))], 0)
    await service.decide("test-domain", [Descriptor((("key7", "v0"),))], 0)
    totals = counted(service)
    hits = {name: n for name, n in totals.items() if name.endswith(".total_hits")}
    assert len(hits) == DETAILED_VALUES + 1
    assert hits["ratelimit.service.rate_limit.test-domain.key7__other.total_hits"] == 5
    assert hits["ratelimit.service.rate_limit.test-domain.key7_v0.total_hits"] == 2


def service_with(tmp_path: Path, config_text: str, backend: Backend, options: LimiterOptions) -> RateLimitService:
    (tmp_path / "config.yaml").write_text(textwrap.dedent(config_text))
    config = load_directory(tmp_path)
    return RateLimitService(Limiter(lambda: config, backend, options))


async def test_global_shadow_mode_counts_the_requests_it_lets_through(tmp_path: Path) -> None:
    """src/service/ratelimit.go: with SHADOW_MODE a request over limit is answered OK and counted in
    global_shadow_mode; its limit counts over_limit as usual (shadow_mode is a rule's)."""
    service = service_with(tmp_path, BASIC, MemoryBackend(), LimiterOptions(shadow_mode=True))
    for _ in range(3):
        await service.decide("test-domain", [Descriptor((("key2", "value2"),), hits_addend=15)], 0)
    totals = counted(service)
    assert totals["ratelimit.service.global_shadow_mode"] == 1
    assert totals["ratelimit.service.rate_limit.test-domain.key2_value2.over_limit"] == 15
    assert not any(name.endswith(".shadow_mode") for name in totals)


async def test_answers_of_the_over_limit_cache_count_as_the_reference_local_cache(tmp_path: Path) -> None:
    """src/limiter/base_limiter.go: an over-limit answer from the local cache counts over_limit and
    over_limit_with_local_cache."""
    backend = OverLimitCache(MemoryBackend())
    service = service_with(tmp_path, BASIC, backend, LimiterOptions())
    for _ in range(4):
        await service.decide("test-domain", [Descriptor((("key2", "value2"),), hits_addend=20)], 0)
    totals = counted(service)
    cached = totals.get("ratelimit.service.rate_limit.test-domain.key2_value2.over_limit_with_local_cache", 0)
    assert totals["ratelimit.service.rate_limit.test-domain.key2_value2.over_limit"] == 60
    assert cached > 0 and cached % 20 == 0


async def test_storage_and_request_errors_are_counted(tmp_path: Path) -> None:
    """src/service/ratelimit.go ShouldRateLimit: a Redis error counts call.should_rate_limit.redis_error, a
    request the service refuses service_error."""
    service = service_with(tmp_path, BASIC, FailingBackend(), LimiterOptions())
    with pytest.raises(BackendUnavailable):
        await service.decide("test-domain", [Descriptor((("key2", "x"),))], 0)
    with pytest.raises(InvalidOverride):
        await service.decide("test-domain", [Descriptor((("key2", "x"),), override=Override(1, Unit.YEAR, 10**9))], 0)
    totals = counted(service)
    assert totals["ratelimit.service.call.should_rate_limit.redis_error"] == 1
    assert totals["ratelimit.service.call.should_rate_limit.service_error"] == 1
