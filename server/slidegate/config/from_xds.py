"""Config from xDS resources (envoyproxy/ratelimit's RateLimitConfig messages), built by the same builder as a
file's (slidegate.config.builder), so that a config over xDS is valid exactly when the same limits in files are,
with the same errors; the resource's ``name`` stands for the file in them, and they have no lines (the field paths
say where).

The mapping is the reference's (``src/config/config_xds.go``): ``unit`` is the enum's name (UNKNOWN, the unset
unit, is left out, so it is an error unless ``unlimited``; a number the enum does not name is its digits, as Go's
String() writes it, and refused as any unknown unit); flags that are false and empty strings are absent, as proto3
cannot tell them from unset; ``metadata`` is the Struct as JSON holds it (numbers are doubles).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from google.protobuf import struct_pb2

from slidegate._proto.ratelimit.config.ratelimit.v3 import rls_conf_pb2
from slidegate.config.builder import MAX_MAPPINGS, Built, Fields, GiveUp, LoadOptions, Sink, assemble, build_domain
from slidegate.config.errors import ConfigError, ConfigIssue
from slidegate.config.model import Config, DomainConfig, Level

TYPE_URL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"
_FLAGS = ("shadow_mode", "detailed_metric", "quota_mode")
_UNITS = dict(rls_conf_pb2.RateLimitUnit.items())
_UNIT_NAMES = {number: name for name, number in _UNITS.items()}


def _policy(policy: rls_conf_pb2.RateLimitPolicy) -> Fields:
    values: dict[str, Any] = {"requests_per_unit": policy.requests_per_unit}
    if policy.unit != rls_conf_pb2.UNKNOWN:
        values["unit"] = _UNIT_NAMES.get(policy.unit) or str(policy.unit)
    if policy.unlimited:
        values["unlimited"] = True
    if policy.name:
        values["name"] = policy.name
    if policy.replaces:
        values["replaces"] = [Fields({"name": r.name}) for r in policy.replaces]
    return Fields(values)


def _descriptor(descriptor: rls_conf_pb2.RateLimitDescriptor) -> Fields:
    values: dict[str, Any] = {"key": descriptor.key}
    if descriptor.value:
        values["value"] = descriptor.value
    if descriptor.HasField("rate_limit"):
        values["rate_limit"] = _policy(descriptor.rate_limit)
    if descriptor.descriptors:
        values["descriptors"] = [_descriptor(d) for d in descriptor.descriptors]
    for flag in _FLAGS:
        if getattr(descriptor, flag):
            values[flag] = True
    if descriptor.HasField("metadata"):
        values["metadata"] = _struct(descriptor.metadata)
    return Fields(values)


def _struct(struct: struct_pb2.Struct) -> dict[str, Any]:
    return {key: _value(value) for key, value in struct.fields.items()}


def _value(value: struct_pb2.Value) -> Any:
    """A Struct's value as JSON holds it; a NaN or an infinity is kept, for the builder to refuse."""
    which = value.WhichOneof("kind")
    if which == "struct_value":
        return _struct(value.struct_value)
    if which == "list_value":
        return [_value(v) for v in value.list_value.values]
    return None if which in (None, "null_value") else getattr(value, which)


def _paced(descriptors: Sequence[rls_conf_pb2.RateLimitDescriptor], pause: Callable[[], None]) -> Iterator[Fields]:
    """The top-level descriptors, each read when the builder comes to it, after a pause."""
    for descriptor in descriptors:
        pause()
        yield _descriptor(descriptor)


def _no_pause() -> None:
    return None


def _count(descriptors: Sequence[rls_conf_pb2.RateLimitDescriptor]) -> int:
    return sum(1 + d.HasField("rate_limit") + _count(d.descriptors) for d in descriptors)


def _build(resource: rls_conf_pb2.RateLimitConfig, options: LoadOptions, pause: Callable[[], None]) -> Built:
    sink = Sink(resource.name, options)
    root: dict[str, Any] = {"domain": resource.domain}
    if resource.descriptors:
        root["descriptors"] = _paced(resource.descriptors, pause)
    try:
        return build_domain(sink, Fields(root)), 0, sink.issues
    except GiveUp as exc:
        sink.issues.add(ConfigIssue(resource.name, 0, "", str(exc)))
    except RecursionError:  # protobuf reads 100 levels; a recursion limit set lower than that
        sink.issues.add(ConfigIssue(resource.name, 0, "", "descriptors nested too deeply"))
    return DomainConfig(domain="", root=Level(), source=resource.name), 0, sink.issues


def load_resources(resources: Sequence[rls_conf_pb2.RateLimitConfig], version: str, options: LoadOptions,
                   pause: Callable[[], None] = _no_pause) -> Config:
    """The config of a whole state-of-the-world response (``version``: its version_info). Raises ConfigError with
    every problem, each naming its resource and the field path. ``pause``: called before each top-level descriptor
    is built, as slidegate.config.loader.load_directory's."""
    for resource in resources:
        # the file loader's bound, counted on the message before anything is built
        if _count(resource.descriptors) > MAX_MAPPINGS:
            raise ConfigError([ConfigIssue(resource.name, 0, "", f"more than {MAX_MAPPINGS} descriptors and limits")])
    return assemble([_build(r, options, pause) for r in resources], options, version)
