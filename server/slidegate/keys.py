"""Storage keys for limits.

A key is ``<prefix><algorithm>{<domain and entries>}``. Every string is written as ``<length>:<text>``, so
the encoding is injective: no choice of separators in keys or values can make two different descriptors share
a key (the reference's ``domain_key_value`` joining lets ``(user, "a_id_b")`` collide with
``(user, a), (id, b)``). The braces are a Redis Cluster hash tag, so every key an algorithm keeps for one limit
lands in one slot.
"""

from __future__ import annotations

from collections.abc import Iterable


def _part(text: str) -> str:
    return f"{len(text)}:{text}"


def limit_key(prefix: str, algorithm: str, domain: str, entries: Iterable[tuple[str, str]]) -> str:
    """Key for one limit: ``prefix`` (operator-chosen, may be empty), an algorithm tag (its data layout),
    the domain and the (key, value) entries of the descriptor, in order."""
    body = _part(domain) + "".join(_part(k) + _part(v) for k, v in entries)
    return f"{prefix}{algorithm}{{{body}}}"
