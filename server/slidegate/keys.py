"""Storage keys for limits.

A key is ``<prefix><algorithm>{<domain and entries>}``. Every string is written as ``<length>:<text>``, so
the encoding is injective: no choice of separators in keys or values can make two different descriptors share
a key (the reference's ``domain_key_value`` joining lets ``(user, "a_id_b")`` collide with
``(user, a), (id, b)``). A string longer than MAX_TEXT_CHARS is written as ``#`` and its BLAKE2b-256 digest
(64 hex digits) instead, so that a key stays small whatever a client sends (Envoy forwards header values of up
to 60 KiB by default) and the limit still applies to it: a digest part starts with ``#`` where a literal part
starts with a digit, so the two can never be read as each other, and equal digests of different strings are
not found in practice (2^128 work). The braces are a Redis Cluster hash tag: each limit is one key, in a slot
of its own choosing. With ``domain_slot`` the tag holds the domain alone —
``<prefix><algorithm>{<domain>}<entries>`` — so every limit of a domain shares one slot
(REDIS_HASH_TAG=domain). A prefix holding braces makes its own tag, since Redis hashes the first ``{…}`` it
finds.
"""

from __future__ import annotations

from collections.abc import Iterable

from slidegate.text import MAX_TEXT_CHARS, digest


def _part(text: str) -> str:
    return digest(text) if len(text) > MAX_TEXT_CHARS else f"{len(text)}:{text}"


def limit_key(prefix: str, algorithm: str, domain: str, entries: Iterable[tuple[str, str]], *,
              domain_slot: bool = False) -> str:
    """Key for one limit: ``prefix`` (operator-chosen, may be empty), an algorithm tag (its data layout),
    the domain and the (key, value) entries of the descriptor, in order; ``domain_slot``: the hash tag holds
    only the domain."""
    body = "".join(_part(k) + _part(v) for k, v in entries)
    if domain_slot:
        return f"{prefix}{algorithm}{{{_part(domain)}}}{body}"
    return f"{prefix}{algorithm}{{{_part(domain)}{body}}}"
