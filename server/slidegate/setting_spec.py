"""How a setting is declared: once, as a field of a frozen dataclass whose metadata holds its environment variable,
flag, default (as text), parser and help (``setting``), or as a section of several (``section``) that names them
under a prefix. ``specs`` lists them, in field order, for the command line, the docs' table and Settings.load.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

_SETTING = "slidegate.setting"
_SECTION = "slidegate.section"


class SettingsError(ValueError):
    """A setting that cannot be used; the message names it (flag and variable) and the value."""


@dataclass(frozen=True, slots=True)
class Spec:
    """One setting: its key (the name Settings.load's flags and the command's parameter give it), environment
    variable, flag, default (as text, as the variable would hold it), parser, help, and its place in Settings
    (``path``: the attribute, or the section's and the section's attribute)."""

    field: str
    env: str
    flag: str
    default: str
    parse: Callable[[str], Any]
    help: str
    path: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Declared:
    env: str
    default: str
    parse: Callable[[str], Any]
    help: str
    flag: str | None


@dataclass(frozen=True, slots=True)
class _Section:
    kind: type[Any]
    prefix: str
    defaults: Mapping[str, str]
    helps: Mapping[str, str]


def setting(env: str, default: str, parse: Callable[[str], Any], help: str, *, flag: str | None = None) -> Any:  # noqa: A002 - Spec's word
    """A dataclass field that is a setting. ``flag`` defaults to ``env`` in lower case with dashes (REDIS_URL:
    --redis-url); in a section, ``env`` follows the section's prefix (URL: REDIS_URL under REDIS_)."""
    return dataclasses.field(metadata={_SETTING: _Declared(env, default, parse, help, flag)})


def section(kind: type[Any], prefix: str, *, defaults: Mapping[str, str] | None = None,
            helps: Mapping[str, str] | None = None) -> Any:
    """A dataclass field holding a ``kind`` whose settings are named under ``prefix``; ``defaults`` and ``helps``
    (by ``kind``'s attribute) replace its own where this one differs (the per-second Redis: no URL by default)."""
    return dataclasses.field(metadata={_SECTION: _Section(kind, prefix, defaults or {}, helps or {})})


def _flag(env: str) -> str:
    return "--" + env.lower().replace("_", "-")


def named(env: str) -> str:
    """How an error or warning names a setting whose flag is its variable's (all REDIS_* settings):
    ``--redis-url / REDIS_URL``."""
    return f"{_flag(env)} / {env}"


def specs(cls: type[Any]) -> tuple[Spec, ...]:
    """Every setting of the dataclass ``cls``, its sections' in their place."""
    found: list[Spec] = []
    for field in dataclasses.fields(cls):
        if _SETTING in field.metadata:
            declared: _Declared = field.metadata[_SETTING]
            found.append(Spec(field.name, declared.env, declared.flag or _flag(declared.env), declared.default,
                              declared.parse, declared.help, (field.name,)))
        elif _SECTION in field.metadata:
            held: _Section = field.metadata[_SECTION]
            for inner in specs(held.kind):
                env = held.prefix + inner.env
                found.append(Spec(env.lower(), env, _flag(env), held.defaults.get(inner.field, inner.default),
                                  inner.parse, held.helps.get(inner.field, inner.help), (field.name, *inner.path)))
    return tuple(found)


def assemble(cls: type[Any], values: Mapping[tuple[str, ...], Any]) -> Any:
    """A ``cls`` from the parsed ``values`` by their Spec's path, its sections built first."""
    given: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if _SECTION in field.metadata:
            held: _Section = field.metadata[_SECTION]
            given[field.name] = assemble(held.kind, {path[1:]: value for path, value in values.items()
                                                     if path[0] == field.name})
        elif _SETTING in field.metadata:
            given[field.name] = values[(field.name,)]
    return cls(**given)
