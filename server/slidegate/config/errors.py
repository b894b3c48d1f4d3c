"""Config errors that name the file, the line and the field, and a YAML syntax error made one.

What an error says is bounded: a few lines of YAML aliases can repeat one mistake a million times, and a "config
file" can be a link to anything (a private key, /etc/passwd). So a refused load keeps and says the first
MAX_SHOWN problems and counts the rest, an error never repeats the text of a line, and a value it quotes is
escaped (a newline in it must not forge a log line) and cut to QUOTED_CHARS characters.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

MAX_SHOWN = 18  # problems a ConfigError keeps and says (a refused reload logs 20 lines: these, a heading, a count)
QUOTED_CHARS = 80  # of a value repeated in a message
_PART_CHARS = 400  # of a file name, a field path or a message
NULL_TAG = "tag:yaml.org,2002:null"
MAX_METADATA_DEPTH = 20  # a response nests ~10 messages around metadata, 3 for each mapping; protobuf reads 100


def escaped(text: str, limit: int) -> str:
    """``text`` with what is not printable escaped, its middle cut out when longer than ``limit``."""
    if len(text) > limit:
        text = f"{text[:limit // 2]}…{text[-(limit // 2):]}"  # cut before escaping: it may be megabytes
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def quoted(text: str) -> str:
    """``text`` as a message repeats it: in quotes, escaped, at most QUOTED_CHARS characters of it."""
    if len(text) <= QUOTED_CHARS:
        return f"'{escaped(text, QUOTED_CHARS)}'"
    return f"'{escaped(text[:QUOTED_CHARS], QUOTED_CHARS)}…' ({len(text)} characters)"


def kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return "null" if node.tag == NULL_TAG else "a scalar"


def describe(node: yaml.Node) -> str:
    """A node as a message names it: a scalar quoted, anything else by its kind."""
    if isinstance(node, yaml.ScalarNode) and node.tag != NULL_TAG:
        return quoted(str(node.value))
    return kind(node)


@dataclass(frozen=True, slots=True)
class ConfigIssue:
    """One problem in a config file. ``line`` is 1-based (0 when the whole file is meant); ``field`` is a
    path such as ``descriptors[0].rate_limit.unit`` (empty for file-level problems)."""

    file: str
    line: int
    field: str
    message: str

    def __str__(self) -> str:
        # the field holds the keys it passed through, as written (an unknown key of a megabyte, too)
        file, field, message = (escaped(part, _PART_CHARS) for part in (self.file, self.field, self.message))
        where = f"{file}:{self.line}" if self.line else file
        return f"{where}: {field}: {message}" if field else f"{where}: {message}"


class Issues:
    """Issues as they are found, bounded: the first MAX_SHOWN (by line when ``by_line``, else as added) are kept,
    the others only counted. ``len()`` counts them all."""

    def __init__(self, issues: Iterable[ConfigIssue] = (), by_line: bool = True) -> None:
        self._by_line = by_line
        self._kept: list[tuple[int, int, ConfigIssue]] = []  # a heap whose top is the last kept: keys negated
        self._count = 0
        for issue in issues:
            self.add(issue)

    def __len__(self) -> int:
        return self._count

    def add(self, issue: ConfigIssue) -> None:
        self._count += 1
        entry = (-issue.line if self._by_line else 0, -self._count, issue)
        if len(self._kept) < MAX_SHOWN:
            heapq.heappush(self._kept, entry)
        elif entry > self._kept[0]:  # comes before the last kept
            heapq.heapreplace(self._kept, entry)

    def add_all(self, other: Issues) -> None:
        for issue in other.first():
            self.add(issue)
        self._count += other.more

    def first(self) -> list[ConfigIssue]:
        """The issues kept, in order."""
        return [issue for _, _, issue in sorted(self._kept, reverse=True)]

    @property
    def more(self) -> int:
        """How many were found and not kept."""
        return self._count - len(self._kept)


class ConfigError(Exception):
    """Raised when a config directory or file cannot be loaded. ``issues``: the first MAX_SHOWN problems found
    (file by file, each file's by line); ``more``: how many others there were. ``str()`` says them, a line each."""

    def __init__(self, issues: Sequence[ConfigIssue], more: int = 0) -> None:
        self.issues = list(issues[:MAX_SHOWN])
        self.more = more + len(issues) - len(self.issues)
        lines = [str(i) for i in self.issues]
        if self.more:
            lines.append(f"… and {self.more:,} more problem{'s' if self.more > 1 else ''}")
        super().__init__("\n".join(lines))

    @classmethod
    def of(cls, issues: Issues) -> ConfigError:
        return cls(issues.first(), issues.more)


def yaml_issue(name: str, text: str, exc: yaml.YAMLError) -> ConfigIssue:
    """The issue of a file that is not YAML, at the line to look at. Its text is not repeated (``str(exc)``
    would quote the line): the file may be a secret that was never meant to be a config."""
    reason = getattr(exc, "problem", None) or getattr(exc, "reason", None) or "cannot be parsed"
    reason = escaped(reason, 2 * QUOTED_CHARS)  # PyYAML without LibYAML quotes what it found (an alias, a tag)
    mark = getattr(exc, "problem_mark", None)
    position = getattr(exc, "position", None)  # a reader error (e.g. a control character) has no mark
    if mark is None:
        return ConfigIssue(name, text[:position].count("\n") + 1 if position is not None else 0, "",
                           f"invalid YAML: {reason}")
    last = max(len(text.splitlines()), 1)
    context = getattr(exc, "context", None)
    context_mark = getattr(exc, "context_mark", None)
    if mark.line + 1 <= last:
        if context and context_mark and context.endswith("; first occurrence"):  # the reason: "second occurrence"
            found = escaped(context.removesuffix("; first occurrence"), 2 * QUOTED_CHARS)
            reason = f"{found} (first on line {context_mark.line + 1})"
        return ConfigIssue(name, mark.line + 1, "", f"invalid YAML: {reason}")
    # found past the last line (the end of the file): what was left open is where to look
    if context_mark is None:
        return ConfigIssue(name, last, "", f"invalid YAML: {reason}")
    return ConfigIssue(name, min(context_mark.line + 1, last), "",
                       f"invalid YAML: {reason} ({context or 'a value'} begun on this line, never closed)")


def second_document_issue(name: str, text: str, document: yaml.Node) -> ConfigIssue:
    """The issue of a file holding a second YAML document, at the line of its ``---``."""
    lines, at = text.split("\n"), document.start_mark.line
    while at > 0 and not lines[at].startswith("---"):  # the line of its '---', not of its content
        at -= 1
    # envoyproxy/ratelimit reads the first document and drops the rest without a word: limits its operator wrote
    # and never had. Refused, so that nobody is surprised either way.
    return ConfigIssue(name, at + 1, "", "a second YAML document ('---'): one file holds one domain "
                       "(envoyproxy/ratelimit reads only the first and ignores the rest); put each in a file of its "
                       "own")


def struct_problem(value: Any, depth: int = 1) -> str | None:
    """Why ``value`` cannot be sent as a protobuf Struct (Envoy's dynamic metadata), or None."""
    if isinstance(value, dict | list) and depth > MAX_METADATA_DEPTH:
        return (f"nests more than {MAX_METADATA_DEPTH} mappings and lists deep (a response nesting deeper cannot "
                "be read by protobuf, Envoy's included)")
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            return "must have text keys only"
        return next((p for v in value.values() if (p := struct_problem(v, depth + 1))), None)
    if isinstance(value, list):
        return next((p for v in value if (p := struct_problem(v, depth + 1))), None)
    if value is None or isinstance(value, str | bool):
        return None
    if isinstance(value, int):
        # a Struct number is a double: a whole number beyond 2^53 would change on the way
        if abs(value) <= 2**53:
            return None
        return f"holds a whole number of {len(str(abs(value)))} digits, which a protobuf Struct (a double) cannot hold"
    if isinstance(value, float):
        return None if math.isfinite(value) else f"holds {value}, which JSON and a protobuf Struct cannot carry"
    return "must hold only strings, numbers, booleans, lists and mappings with text keys"
