"""Storage keys for limits.

A key is ``<prefix><algorithm>{<domain and entries>}``. Every string is written as ``<length>:<text>``, so
the encoding is injective: no choice of separators in keys or values can make two different descriptors share
a key (the reference's ``domain_key_value`` joining lets ``(user, "a_id_b")`` collide with
``(user, a), (id, b)``). The braces are a Redis Cluster hash tag: each limit is one key, in a slot of its own
choosing. With ``domain_slot`` the tag holds the domain alone — ``<prefix><algorithm>{<domain>}<entries>`` —
so every limit of a domain shares one slot (REDIS_HASH_TAG=domain). A prefix holding braces makes its own
tag, since Redis hashes the first ``{…}`` it finds.
"""

from __future__ import annotations

from collections.abc import Iterable


def _part(text: str) -> str:
    return f"{len(text)}:{text}"


def limit_key(prefix: str, algorithm: str, domain: str, entries: Iterable[tuple[str, str]], *,
              domain_slot: bool = False) -> str:
    """Key for one limit: ``prefix`` (operator-chosen, may be empty), an algorithm tag (its data layout),
    the domain and the (key, value) entries of the descriptor, in order; ``domain_slot``: the hash tag holds
    only the domain."""
    body = "".join(_part(k) + _part(v) for k, v in entries)
    if domain_slot:
        return f"{prefix}{algorithm}{{{_part(domain)}}}{body}"
    return f"{prefix}{algorithm}{{{_part(domain)}{body}}}"
