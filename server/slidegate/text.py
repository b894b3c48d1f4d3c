"""Request text that may not be UTF-8."""

from __future__ import annotations


def printable(text: str) -> str:
    """``text`` with request bytes that were not UTF-8 (kept as surrogate escapes when the request was read)
    shown as ``\\xNN``, so it can go where only UTF-8 may: protobuf strings, metric labels, logs."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
