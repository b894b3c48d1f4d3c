"""Config errors that name the file, the line and the field, and a YAML syntax error made one."""

from __future__ import annotations

from dataclasses import dataclass

import yaml


@dataclass(frozen=True, slots=True)
class ConfigIssue:
    """One problem in a config file. ``line`` is 1-based (0 when the whole file is meant); ``field`` is a
    path such as ``descriptors[0].rate_limit.unit`` (empty for file-level problems)."""

    file: str
    line: int
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"


class ConfigError(Exception):
    """Raised when a config directory or file cannot be loaded; ``issues`` lists every problem found."""

    def __init__(self, issues: list[ConfigIssue]) -> None:
        self.issues = issues
        super().__init__("\n".join(str(i) for i in issues))


def yaml_issue(name: str, text: str, exc: yaml.YAMLError) -> ConfigIssue:
    """The issue of a file that is not YAML, at the line to look at."""
    reason = getattr(exc, "problem", None) or getattr(exc, "reason", None) or str(exc)
    mark = getattr(exc, "problem_mark", None)
    position = getattr(exc, "position", None)  # a reader error (e.g. a control character) has no mark
    if mark is None:
        return ConfigIssue(name, text[:position].count("\n") + 1 if position is not None else 0, "",
                           f"invalid YAML: {reason}")
    last = max(len(text.splitlines()), 1)
    context = getattr(exc, "context_mark", None)
    if mark.line + 1 <= last:
        return ConfigIssue(name, mark.line + 1, "", f"invalid YAML: {reason}")
    # found past the last line (the end of the file): what was left open is where to look
    if context is None:
        return ConfigIssue(name, last, "", f"invalid YAML: {reason}")
    opened = getattr(exc, "context", None) or "a value"
    return ConfigIssue(name, min(context.line + 1, last), "",
                       f"invalid YAML: {reason} ({opened} begun on this line, never closed)")
