"""Request text: bytes that may not be UTF-8, and values of any length."""

from __future__ import annotations

import hashlib


def printable(text: str) -> str:
    """``text`` with request bytes that were not UTF-8 (kept as surrogate escapes when the request was read)
    shown as ``\\xNN``, so it can go where only UTF-8 may: protobuf strings, metric labels, logs."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


MAX_TEXT_CHARS = 128  # longer request text is kept (in storage keys, metric labels) as its digest


def digest(text: str) -> str:
    """What stands for ``text`` where it is too long to keep: ``#`` and the BLAKE2b-256 digest of its bytes (as
    the request carried them) in 64 hex digits."""
    return "#" + hashlib.blake2b(text.encode("utf-8", "surrogateescape"), digest_size=32).hexdigest()
