"""Config errors that name the file, the line and the field."""

from __future__ import annotations

from dataclasses import dataclass


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
