"""Config from xDS resources (envoyproxy/ratelimit's RateLimitConfig messages): each resource is turned into the
YAML document a file would hold and loaded by the same loader, so that a config over xDS is valid exactly when the
same limits in files are, with the same errors; the resource's ``name`` stands for the file in them.

The mapping is the reference's (``src/config/config_xds.go``): ``unit`` is the enum's name (UNKNOWN, the unset
unit, is left out, so it is an error unless ``unlimited``); flags that are false and empty strings are absent,
as proto3 cannot tell them from unset; ``metadata`` is the Struct as JSON holds it (numbers are doubles).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml
from google.protobuf import json_format

from slidegate._proto.ratelimit.config.ratelimit.v3 import rls_conf_pb2
from slidegate.config.errors import ConfigError, ConfigIssue
from slidegate.config.loader import MAX_MAPPINGS, LoadOptions, load_texts
from slidegate.config.model import Config

TYPE_URL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"
_FLAGS = ("shadow_mode", "detailed_metric", "quota_mode")


def _policy(policy: rls_conf_pb2.RateLimitPolicy) -> dict[str, Any]:
    out: dict[str, Any] = {"requests_per_unit": policy.requests_per_unit}
    if policy.unit != rls_conf_pb2.UNKNOWN:
        # a number the enum does not name is written as the number, as Go's String() does, and refused by the
        # loader as any unknown unit
        named = policy.unit in rls_conf_pb2.RateLimitUnit.values()
        out["unit"] = rls_conf_pb2.RateLimitUnit.Name(policy.unit) if named else str(policy.unit)
    if policy.unlimited:
        out["unlimited"] = True
    if policy.name:
        out["name"] = policy.name
    if policy.replaces:
        out["replaces"] = [{"name": r.name} for r in policy.replaces]
    return out


def _descriptor(descriptor: rls_conf_pb2.RateLimitDescriptor) -> dict[str, Any]:
    out: dict[str, Any] = {"key": descriptor.key}
    if descriptor.value:
        out["value"] = descriptor.value
    if descriptor.HasField("rate_limit"):
        out["rate_limit"] = _policy(descriptor.rate_limit)
    if descriptor.descriptors:
        out["descriptors"] = [_descriptor(d) for d in descriptor.descriptors]
    for flag in _FLAGS:
        if getattr(descriptor, flag):
            out[flag] = True
    if descriptor.HasField("metadata"):
        out["metadata"] = json_format.MessageToDict(descriptor.metadata)
    return out


def to_yaml(resource: rls_conf_pb2.RateLimitConfig) -> str:
    """The YAML document of ``resource``, as a config file would say it."""
    document: dict[str, Any] = {"domain": resource.domain}
    if resource.descriptors:
        document["descriptors"] = [_descriptor(d) for d in resource.descriptors]
    return yaml.safe_dump(document, sort_keys=False, allow_unicode=True)


def _count(descriptors: Sequence[rls_conf_pb2.RateLimitDescriptor]) -> int:
    return sum(1 + d.HasField("rate_limit") + _count(d.descriptors) for d in descriptors)


def load_resources(resources: Sequence[rls_conf_pb2.RateLimitConfig], version: str, options: LoadOptions) -> Config:
    """The config of a whole state-of-the-world response (``version``: its version_info). Raises ConfigError with
    every problem, each naming its resource; their lines are left out (they would count lines of YAML that only
    this module ever saw), the field paths say where."""
    for resource in resources:
        # the loader's bound, counted on the message: a snapshot far past it is refused before its YAML is built
        if _count(resource.descriptors) > MAX_MAPPINGS:
            raise ConfigError([ConfigIssue(resource.name, 0, "", f"more than {MAX_MAPPINGS} descriptors and limits")])
    try:
        config = load_texts([(r.name, to_yaml(r)) for r in resources], options)
    except ConfigError as exc:
        raise ConfigError([ConfigIssue(i.file, 0, i.field, i.message) for i in exc.issues], exc.more) from None
    return Config(domains=config.domains, version=version)
