"""Load envoyproxy/ratelimit YAML config files into the model, reporting errors with file, line and field.

The format is one ``domain`` per file, nested ``descriptors`` with ``key``/``value``/``rate_limit``; see
docs/configuration.md. This module reads a file's YAML into Fields (slidegate.config.builder), checking what
only YAML can get wrong (a key nobody reads, a list where a string goes, a tag its text does not fit, aliases
that expand a millionfold); the builder checks the rest, as it does for a config over xDS. YAML is composed
into nodes (not plain dicts) so that each error can point at its line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from slidegate.config.builder import Built, Fields, GiveUp, LoadOptions, Sink, assemble, build_domain
from slidegate.config.errors import (
    NULL_TAG,
    ConfigError,
    ConfigIssue,
    Issues,
    describe,
    kind,
    quoted,
    second_document_issue,
    yaml_issue,
)
from slidegate.config.model import Config, DomainConfig, Level

MAX_FILE_BYTES = 16 * 1024 * 1024
PIECE = 2048  # characters the YAML parser reads at a time: about 0.4 ms of composing
_DEFAULTS = LoadOptions()
Pause = Callable[[], None]  # called between pieces of a load's work (see load_directory)


def _no_pause() -> None:
    return None


# LibYAML's composer when PyYAML was built with it (much faster on large files); marks are the same
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_INT = "tag:yaml.org,2002:int"
_BOOL = "tag:yaml.org,2002:bool"
# what SafeConstructor raises for a tagged scalar it cannot read: it assumes well-formed text (an empty !!int is
# indexed at [0], a !!timestamp that does not match calls None.groupdict())
_UNREADABLE = (ArithmeticError, AttributeError, LookupError, TypeError, ValueError, yaml.YAMLError)


def _line(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1


class _File:
    """Reads one file's node tree into Fields, collecting issues instead of stopping at the first."""

    def __init__(self, sink: Sink, pause: Pause) -> None:
        self.sink = sink
        self._pause = pause
        # a constructor alone: a SafeLoader is a reference cycle, which made its cache of every node it read
        # (3,000 objects for 1,000 descriptors) garbage for the collector to walk after each load
        self._constructor = yaml.constructor.SafeConstructor()

    def issue(self, node: yaml.Node, field: str, message: str) -> None:
        self.sink.issue(_line(node), field, message)

    def fields(self, node: yaml.Node, field: str, schema: _Schema) -> Fields | None:
        """A mapping's values, each read as ``schema`` says; None when it is not a mapping."""
        self.sink.count()
        if not isinstance(node, yaml.MappingNode):
            self.issue(node, field, f"must be a mapping, got {kind(node)}")
            return None
        out = Fields({}, _line(node), {})
        for key_node, value_node in node.value:
            name = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            sub = f"{field}.{name}" if field else str(name)
            if name is None:
                self.issue(key_node, field, "mapping keys must be plain strings")
            elif name in out.lines:
                self.issue(key_node, sub, "duplicate key in the same mapping")
            elif name not in schema:
                self.issue(key_node, sub, f"unknown key {quoted(name)} (expected one of: {', '.join(schema)})")
            else:
                out.lines[name] = _line(value_node)
                out.values[name] = schema[name](self, value_node, sub)
        return out

    def string(self, node: yaml.Node, field: str) -> str | None:
        """A scalar read as text, as envoyproxy/ratelimit's YAML decoder reads it into a string field
        (``value: 123`` is "123"); null is "", as in a protobuf."""
        if not isinstance(node, yaml.ScalarNode):
            self.issue(node, field, f"must be a string, got {kind(node)}")
            return None
        return "" if node.tag == NULL_TAG else str(node.value)

    def integer(self, node: yaml.Node, field: str) -> int | None:
        # YAML 1.1 reads 1:30 as 90 (base 60); nobody means that in a limit
        if not isinstance(node, yaml.ScalarNode) or node.tag != _INT or ":" in node.value or len(node.value) > 40:
            self.issue(node, field, f"must be a whole number, got {describe(node)}")
            return None
        try:
            return int(self._constructor.construct_object(node))
        except _UNREADABLE:
            self.issue(node, field, f"must be a whole number, got {describe(node)}")
            return None

    def boolean(self, node: yaml.Node, field: str) -> bool | None:
        if not isinstance(node, yaml.ScalarNode) or node.tag != _BOOL:
            self.issue(node, field, f"must be true or false, got {describe(node)}")
            return None
        try:
            return bool(self._constructor.construct_object(node))
        except _UNREADABLE:
            self.issue(node, field, f"must be true or false, got {describe(node)}")
            return None

    def data(self, node: yaml.Node, field: str) -> dict[str, Any] | None:
        """A mapping of plain data (for ``metadata``), as JSON would hold it."""
        if not isinstance(node, yaml.MappingNode):
            self.issue(node, field, f"must be a mapping, got {kind(node)}")
            return None
        # count every node it expands to before building it: aliases can multiply a few lines a millionfold
        stack: list[yaml.Node] = [node]
        while stack:
            current = stack.pop()
            self.sink.count(chars=len(current.value) if isinstance(current, yaml.ScalarNode) else 0)
            if isinstance(current, yaml.MappingNode):
                stack.extend(v for pair in current.value for v in pair)
            elif isinstance(current, yaml.SequenceNode):
                stack.extend(current.value)
        try:
            value = self._constructor.construct_object(node, deep=True)
        except _UNREADABLE as exc:  # a tag its text does not fit (!!int x), a list or a mapping as a key
            reason = getattr(exc, "problem", None) or "a value does not fit its tag"
            self.issue(node, field, f"cannot be read: {reason}")
            return None
        return dict(value)

    def rate_limit(self, node: yaml.Node, field: str) -> Fields | None:
        if node.tag == NULL_TAG:  # null: no limit, as the reference reads it
            return None
        return self.fields(node, field, _RATE_LIMIT)

    def replaces(self, node: yaml.Node, field: str) -> list[Fields | None]:
        if not isinstance(node, yaml.SequenceNode):
            self.issue(node, field, f"must be a list of {{name: ...}}, got {kind(node)}")
            return []
        return [self.fields(item, f"{field}[{index}]", _REPLACE) for index, item in enumerate(node.value)]

    def descriptors(self, node: yaml.Node, field: str) -> Iterator[Fields | None] | None:
        """The descriptors, each read when the builder comes to it: aliases can make a tree of a few lines hold
        a million rules, and the builder holds only the path to the one it builds."""
        if not isinstance(node, yaml.SequenceNode):
            if node.tag != NULL_TAG:
                self.issue(node, field, f"must be a list of descriptors, got {kind(node)}")
            return None
        return (self._descriptor(item, f"{field}[{index}]") for index, item in enumerate(node.value))

    def _descriptor(self, node: yaml.Node, field: str) -> Fields | None:
        self._pause()
        return self.fields(node, field, _DESCRIPTOR)

    def unread(self, node: yaml.Node, field: str) -> None:
        return None


_Schema = dict[str, Callable[[_File, yaml.Node, str], Any]]
# name: accepted and unused, as by envoyproxy/ratelimit (its YamlRoot has no use for it); failure_mode: slidegate's
_TOP: _Schema = {"domain": _File.string, "descriptors": _File.descriptors, "failure_mode": _File.string,
                 "name": _File.unread}
_DESCRIPTOR: _Schema = {
    "key": _File.string, "value": _File.string, "rate_limit": _File.rate_limit, "descriptors": _File.descriptors,
    "shadow_mode": _File.boolean, "quota_mode": _File.boolean, "detailed_metric": _File.boolean,
    "value_to_metric": _File.boolean, "share_threshold": _File.boolean, "metadata": _File.data,
}
# slidegate's own keys follow envoyproxy/ratelimit's (unit_multiplier, algorithm, burst)
_RATE_LIMIT: _Schema = {
    "unit": _File.string, "requests_per_unit": _File.integer, "unlimited": _File.boolean, "name": _File.string,
    "replaces": _File.replaces, "unit_multiplier": _File.integer, "algorithm": _File.string, "burst": _File.integer,
}
_REPLACE: _Schema = {"name": _File.string}


class _Pieces:
    """A text handed to the YAML parser PIECE characters at a time. LibYAML composes a whole document in one C
    call that holds the GIL throughout (15-17 ms for 1,000 descriptors, measured), so the event loop could not
    answer a call while a reload's worker thread composed; it comes back to this Python method for each piece,
    where the interpreter can hand the GIL over. Marks (lines, columns) are those of the whole text."""

    name = "<unicode string>"  # as the parser names a text it is given whole

    def __init__(self, text: str, pause: Pause) -> None:
        self._text = text
        self._at = 0
        self._pause = pause

    def read(self, size: int = PIECE, /) -> str:
        self._pause()
        piece = self._text[self._at:self._at + min(size, PIECE)]
        self._at += len(piece)
        return piece


def _refused(issue: ConfigIssue) -> Built:
    return DomainConfig(domain="", root=Level(), source=issue.file), 0, Issues([issue])


def _parse_file(path: Path, options: LoadOptions, pause: Pause = _no_pause) -> Built:
    """Parse one file."""
    try:
        if path.exists() and not path.is_file():  # reading a FIFO would block the load forever
            return _refused(ConfigIssue(str(path), 0, "", "not a regular file"))
        if path.is_file() and path.stat().st_size > MAX_FILE_BYTES:
            return _refused(ConfigIssue(str(path), 0, "", f"larger than {MAX_FILE_BYTES // 1024 // 1024} MiB"))
        text = path.read_text(encoding="utf-8")
    except OSError as exc:  # a link into a directory this process may not enter, too
        return _refused(ConfigIssue(str(path), 0, "", f"cannot read file: {exc.strerror or exc}"))
    except UnicodeDecodeError as exc:
        return _refused(ConfigIssue(str(path), 0, "", f"not UTF-8 text: {exc.reason}"))
    return _parse_text(str(path), text, options, pause)


def _parse_text(name: str, text: str, options: LoadOptions, pause: Pause = _no_pause) -> Built:
    """Parse one file's text (``name``: the file, in errors)."""
    try:
        documents = list(yaml.compose_all(_Pieces(text, pause), Loader=_YAML_LOADER))
    except yaml.YAMLError as exc:
        return _refused(yaml_issue(name, text, exc))
    except RecursionError:
        return _refused(ConfigIssue(name, 0, "", "invalid YAML: nested too deeply"))
    root = documents[0] if documents else None
    if root is None:
        return _refused(ConfigIssue(name, 0, "domain", "is required (the file is empty)"))
    for extra in documents[1:]:
        if extra is not None and extra.tag != NULL_TAG:  # an empty document (a file ending in '---') says nothing
            return _refused(second_document_issue(name, text, extra))
    sink = Sink(name, options)
    config = DomainConfig(domain="", root=Level(), source=name)
    line = 0
    try:
        fields = _File(sink, pause).fields(root, "", _TOP)
        if fields is not None:
            config, line = build_domain(sink, fields), fields.at("domain")
    except GiveUp as exc:
        sink.issues.add(ConfigIssue(name, 0, "", str(exc)))
    except RecursionError:
        sink.issues.add(ConfigIssue(name, 0, "", "descriptors nested too deeply, or a YAML alias that contains itself"))
    return config, line, sink.issues


def load_file(path: str | Path, options: LoadOptions = _DEFAULTS) -> DomainConfig:
    """Load one YAML file (one domain). Raises ConfigError with the problems found (the first, and a count)."""
    config, _, issues = _parse_file(Path(path), options)
    if issues:
        raise ConfigError.of(issues)
    return config


def config_files(directory: str | Path) -> list[Path]:
    """The config files of a directory: every ``*.yaml``/``*.yml`` (any case) directly in it, hidden
    files excluded, in name order. Anything else that bears such a name (a broken link, a directory) is
    listed too, so that loading it reports why it cannot be read."""
    directory = Path(directory)
    return sorted(
        p for p in directory.iterdir()
        if p.suffix.lower() in (".yaml", ".yml") and not p.name.startswith(".")
    )


def load_directory(directory: str | Path, options: LoadOptions = _DEFAULTS, pause: Pause = _no_pause) -> Config:
    """Load every config file of ``directory``. Raises ConfigError with the problems of every file (a
    missing directory, a file error, a domain defined in two files without ``merge_domains``, or, when
    merging, the same rule in two files). ``pause`` is called before each piece of text the parser reads and
    each descriptor read: a reload (slidegate.reload) rests there, so that its thread leaves the GIL to the
    event loop."""
    directory = Path(directory)
    try:
        if not directory.is_dir():
            raise ConfigError([ConfigIssue(str(directory), 0, "", "config directory does not exist")])
        paths = config_files(directory)
    except OSError as exc:  # a name too long, a directory this process may not read
        issue = ConfigIssue(str(directory), 0, "", f"cannot read config directory: {exc.strerror or exc}")
        raise ConfigError([issue]) from None
    return assemble([_parse_file(path, options, pause) for path in paths], options)


def load_texts(files: Sequence[tuple[str, str]], options: LoadOptions = _DEFAULTS) -> Config:
    """Load files given as (name, YAML text), as ``load_directory`` loads a directory's. Raises ConfigError with
    the problems."""
    return assemble([_parse_text(name, text, options) for name, text in files], options)
