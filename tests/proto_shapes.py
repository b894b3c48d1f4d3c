"""Describe protobuf messages as plain data (names, numbers, types), for comparing two descriptor pools."""

from __future__ import annotations

from typing import Any


def describe_message(desc: Any, out: dict[str, Any]) -> None:  # a protobuf Descriptor (python or upb)
    """Add ``desc``, its enums and nested messages to ``out``: {full name: {field: [number, type, repeated,
    type name]}} and {enum full name: {value name: number}}."""
    out[desc.full_name] = {
        f.name: [f.number, f.type, bool(f.is_repeated), f.message_type.full_name if f.message_type else
                 (f.enum_type.full_name if f.enum_type else "")]
        for f in desc.fields
    }
    for enum in desc.enum_types:
        out[enum.full_name] = {v.name: v.number for v in enum.values}
    for nested in desc.nested_types:
        describe_message(nested, out)
