"""The stat key of a decision, composed as envoyproxy/ratelimit composes it (its ``src/config/config_impl.go``
``GetLimit`` and ``descriptorKey``, ``src/stats/manager_impl.go`` and ``src/utils/utilities.go``
``SanitizeStatName``), so that its stats keep their names under slidegate.

A key is ``<domain>.<level>.<level>…``, one level per request entry, each ``key`` or ``key_value``:

- a rule with ``detailed_metric`` names every level by the request's own ``key_value`` (always with the
  ``_``, even for an empty value, as the reference writes it), except a level matched by a ``share_threshold``
  wildcard, which keeps its pattern (the other levels are then written ``key`` for an empty value);
- otherwise each level is named as the config names it (its key, its value or wildcard pattern), except that
  a level whose rule has ``value_to_metric`` takes the request's value when the rule has no value (key only)
  or a wildcard value without ``share_threshold``;
- a request's limit override is keyed by its descriptor: ``key_value`` per entry (``key`` alone for an empty
  value).

Unlimited and replaced limits have no key: the reference counts nothing for them (its service hands them to
the cache as no limit). Request text is shown as slidegate shows it everywhere (slidegate.text): bytes that are
not UTF-8 as ``\\xNN``, text longer than MAX_TEXT_CHARS as its digest.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from slidegate.config.model import DescriptorNode
from slidegate.text import MAX_TEXT_CHARS, digest, printable

_IPV4 = re.compile(r"[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}")
# ':' and '|' end a statsd name and its value (the reference's SanitizeStatName); line ends are slidegate's
# addition: a value holding one would end the statsd line and start another
_UNSAFE = str.maketrans({":": "_", "|": "_", "\n": "_", "\r": "_"})


def shown(text: str) -> str:
    """Request text as a stat name may hold it: UTF-8 (other bytes as ``\\xNN``), and short."""
    return digest(text) if len(text) > MAX_TEXT_CHARS else printable(text)


def sanitize(name: str) -> str:
    """``name`` with the characters statsd cannot carry replaced by ``_``, as the reference's
    ``SanitizeStatName``: ``:`` and ``|``, and the dots of an IPv4 address (``remote_address_10.0.0.1``
    would otherwise be four levels). Every replacement is one character for one: lengths stay."""
    name = name.translate(_UNSAFE)
    return _IPV4.sub(lambda found: found.group().replace(".", "_"), name)


def _level(key: str, value: str | None) -> str:
    return f"{key}_{value}" if value else key


def rule_key(entries: Sequence[tuple[str, str]], rule: DescriptorNode) -> str:
    """The key (without the domain) of a request descriptor whose ``entries`` matched ``rule``."""
    path = rule.path()
    if rule.detailed_metric:
        shared = [node.value if node.pattern is not None and node.share_threshold else None for node in path]
        if not any(shared):
            return ".".join(f"{shown(key)}_{shown(value)}" for key, value in entries)
        # with a shared level the reference writes the others as an override's (no "_" for an empty value)
        return ".".join(_level(shown(key), pattern or shown(value))
                        for (key, value), pattern in zip(entries, shared, strict=True))
    levels = []
    for (key, value), node in zip(entries, path, strict=True):
        if node.pattern is not None:  # a wildcard: its pattern, or the request's value when asked for
            named = shown(value) if node.value_to_metric and not node.share_threshold else node.value
        elif node.value is not None:  # the same value as the request's
            named = node.value
        else:  # the key alone
            named = shown(value) if node.value_to_metric else None
        levels.append(_level(shown(key), named))
    return ".".join(levels)


def same_for_every_request(rule: DescriptorNode) -> bool:
    """Whether ``rule_key`` gives every request descriptor matching ``rule`` the same key: no level shows the
    request's value (a request's keys are the rule's own, since they matched)."""
    return not rule.detailed_metric and not any(node.value_to_metric for node in rule.path())


def override_key(entries: Sequence[tuple[str, str]]) -> str:
    """The key (without the domain) of a request descriptor that brought its own limit."""
    return ".".join(_level(shown(key), shown(value)) for key, value in entries)
