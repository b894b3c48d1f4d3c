"""Load envoyproxy/ratelimit YAML config files into the model, reporting errors with file, line and field.

The format (one ``domain`` per file, nested ``descriptors`` with ``key``/``value``/``rate_limit``) and its
validation rules follow envoyproxy/ratelimit (``src/config/config_impl.go``); see docs/configuration.md.
YAML is composed into nodes (not plain dicts) so that each error can point at its line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from slidegate.algorithms import ALGORITHM_NAMES, MAX_WINDOW_SECONDS, RULES, Algorithm
from slidegate.config.errors import (
    NULL_TAG,
    ConfigError,
    ConfigIssue,
    Issues,
    describe,
    kind,
    quoted,
    second_document_issue,
    struct_problem,
    yaml_issue,
)
from slidegate.config.model import Config, DescriptorNode, DomainConfig, Level, RateLimit, wildcard_pattern
from slidegate.failure_modes import FAILURE_MODE_NAMES, FailureMode
from slidegate.units import UNIT_NAMES, Unit

UINT32_MAX = 4294967295
# name: accepted and unused, as by envoyproxy/ratelimit (its YamlRoot has no use for it); failure_mode: slidegate's
_TOP_KEYS = ("domain", "descriptors", "failure_mode", "name")
_DESCRIPTOR_KEYS = (
    "key", "value", "rate_limit", "descriptors", "shadow_mode", "quota_mode", "detailed_metric",
    "value_to_metric", "share_threshold", "metadata",
)
# slidegate's own keys follow envoyproxy/ratelimit's (unit_multiplier, algorithm, burst)
_RATE_LIMIT_KEYS = (
    "unit", "requests_per_unit", "unlimited", "name", "replaces", "unit_multiplier", "algorithm", "burst",
)


MAX_MAPPINGS = 100_000  # mappings (and metadata nodes) read from one file, after expanding YAML aliases
# characters of one file's rule paths (key_value.key2_value2, each rule's) and metadata, after expanding aliases:
# each repeat of a value shared by aliases is kept whole (and check-config prints it)
MAX_TEXT_CHARS = 64 * 1024 * 1024
MAX_COUNTED = 100_000  # problems counted in one file before the rest of it is left unread: each is work
MAX_FILE_BYTES = 16 * 1024 * 1024


class _GiveUp(Exception):
    """The rest of the file is left unread; the message says why."""


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """How to load: ``merge_domains`` lets several files add to one domain (MERGE_DOMAIN_CONFIG);
    ``default_algorithm`` counts every limit that names none (DEFAULT_ALGORITHM)."""

    merge_domains: bool = False
    default_algorithm: Algorithm = Algorithm.SLIDING_WINDOW_LOG


# LibYAML's composer when PyYAML was built with it (much faster on large files); marks are the same
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_INT = "tag:yaml.org,2002:int"
_BOOL = "tag:yaml.org,2002:bool"
_NULL = NULL_TAG
# what SafeConstructor raises for a tagged scalar it cannot read: it assumes well-formed text (an empty !!int is
# indexed at [0], a !!timestamp that does not match calls None.groupdict())
_UNREADABLE = (ArithmeticError, AttributeError, LookupError, TypeError, ValueError, yaml.YAMLError)


class _File:
    """Walks one file's node tree, collecting issues instead of stopping at the first."""

    def __init__(self, path: str, options: LoadOptions) -> None:
        self.path = path
        self.options = options
        self.issues = Issues()
        self._constructor = yaml.SafeLoader("")
        self._mappings = 0
        self._chars = 0

    def issue(self, node: yaml.Node | None, field: str, message: str) -> None:
        line = node.start_mark.line + 1 if node is not None else 0
        self.issues.add(ConfigIssue(self.path, line, field, message))
        if len(self.issues) >= MAX_COUNTED:  # a few lines of aliases can repeat one mistake 10^8 times
            raise _GiveUp(f"{MAX_COUNTED:,} problems found (after expanding YAML aliases): the rest of the file "
                          "was not read")

    def count(self, mappings: int = 1, chars: int = 0) -> None:
        """Count mappings (or metadata nodes) and characters read: YAML aliases can make a few lines expand a
        millionfold."""
        self._mappings += mappings
        self._chars += chars
        if self._mappings > MAX_MAPPINGS:
            raise _GiveUp(f"more than {MAX_MAPPINGS} descriptors and limits (after expanding YAML aliases): "
                          "split it or drop aliases")
        if self._chars > MAX_TEXT_CHARS:
            raise _GiveUp(f"more than {MAX_TEXT_CHARS // 1024 // 1024} MiB of descriptor paths and metadata (after "
                          "expanding YAML aliases): split it or drop aliases")

    def mapping(self, node: yaml.Node, field: str, allowed: tuple[str, ...]) -> dict[str, yaml.Node] | None:
        self.count()
        if not isinstance(node, yaml.MappingNode):
            self.issue(node, field, f"must be a mapping, got {kind(node)}")
            return None
        out: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            name = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            sub = f"{field}.{name}" if field else str(name)
            if name is None:
                self.issue(key_node, field, "mapping keys must be plain strings")
            elif name in out:
                self.issue(key_node, sub, "duplicate key in the same mapping")
            elif name not in allowed:
                self.issue(key_node, sub, f"unknown key {quoted(name)} (expected one of: {', '.join(allowed)})")
            else:
                out[name] = value_node
        return out

    def string(self, node: yaml.Node, field: str) -> str | None:
        """A scalar read as text, as envoyproxy/ratelimit's YAML decoder reads it into a string field
        (``value: 123`` is "123"); null is None."""
        if not isinstance(node, yaml.ScalarNode):
            self.issue(node, field, f"must be a string, got {kind(node)}")
            return None
        if node.tag == _NULL:
            return None
        return str(node.value)

    def integer(self, node: yaml.Node, field: str, maximum: int, minimum: int = 0) -> int | None:
        # YAML 1.1 reads 1:30 as 90 (base 60); nobody means that in a limit
        if not isinstance(node, yaml.ScalarNode) or node.tag != _INT or ":" in node.value or len(node.value) > 40:
            self.issue(node, field, f"must be a whole number, got {describe(node)}")
            return None
        try:
            value = self._constructor.construct_object(node)
        except _UNREADABLE:
            self.issue(node, field, f"must be a whole number, got {describe(node)}")
            return None
        if not minimum <= value <= maximum:
            self.issue(node, field, f"must be between {minimum} and {maximum}, got {value}")
            return None
        return int(value)

    def data(self, node: yaml.Node, field: str) -> dict[str, Any] | None:
        """A mapping of plain data (for ``metadata``), as JSON would hold it."""
        if not isinstance(node, yaml.MappingNode):
            self.issue(node, field, f"must be a mapping, got {kind(node)}")
            return None
        # count every node it expands to before building it: aliases can multiply a few lines a millionfold
        stack: list[yaml.Node] = [node]
        while stack:
            current = stack.pop()
            self.count(chars=len(current.value) if isinstance(current, yaml.ScalarNode) else 0)
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
        problem = struct_problem(value) if isinstance(value, dict) else "must be a mapping"
        if problem:
            self.issue(node, field, problem)
            return None
        return dict(value)

    def boolean(self, node: yaml.Node, field: str) -> bool | None:
        if not isinstance(node, yaml.ScalarNode) or node.tag != _BOOL:
            self.issue(node, field, f"must be true or false, got {describe(node)}")
            return None
        try:
            return bool(self._constructor.construct_object(node))
        except _UNREADABLE:
            self.issue(node, field, f"must be true or false, got {describe(node)}")
            return None


def _parse_rate_limit(f: _File, node: yaml.Node, field: str) -> RateLimit | None:
    fields = f.mapping(node, field, _RATE_LIMIT_KEYS)
    if fields is None:
        return None
    issues_before = len(f.issues)
    unlimited = bool(f.boolean(fields["unlimited"], f"{field}.unlimited")) if "unlimited" in fields else False
    name = (f.string(fields["name"], f"{field}.name") or "") if "name" in fields else ""
    requests = 0  # as in envoyproxy/ratelimit, an absent requests_per_unit is 0: always over limit
    if "requests_per_unit" in fields:
        requests = f.integer(fields["requests_per_unit"], f"{field}.requests_per_unit", UINT32_MAX) or 0
    multiplier = 1
    if "unit_multiplier" in fields:
        multiplier = f.integer(fields["unit_multiplier"], f"{field}.unit_multiplier", UINT32_MAX, 1) or 1
    unit: Unit | None = None
    unit_text = f.string(fields["unit"], f"{field}.unit") if "unit" in fields else None
    if unlimited:
        if unit_text:
            f.issue(fields["unit"], f"{field}.unit", "must not be set when unlimited is true")
    elif not unit_text:
        f.issue(fields.get("unit", node), f"{field}.unit", f"is required (one of: {UNIT_NAMES})")
    else:
        try:
            if not unit_text.isascii():  # str.upper() maps some non-ASCII letters onto ASCII ones
                raise KeyError(unit_text)
            unit = Unit.parse(unit_text)
        except KeyError:
            f.issue(fields["unit"], f"{field}.unit",
                    f"unknown unit {quoted(unit_text)} (expected one of: {UNIT_NAMES})")
    if unit is not None and unit.seconds * multiplier > MAX_WINDOW_SECONDS:
        f.issue(fields["unit_multiplier"], f"{field}.unit_multiplier",
                f"makes a window of {unit.seconds * multiplier} s, longer than the {MAX_WINDOW_SECONDS} s allowed")
    algorithm = f.options.default_algorithm
    if "algorithm" in fields:
        text = f.string(fields["algorithm"], f"{field}.algorithm") or ""
        try:
            algorithm = Algorithm(text)
        except ValueError:
            f.issue(fields["algorithm"], f"{field}.algorithm",
                    f"unknown algorithm {quoted(text)} (expected one of: {ALGORITHM_NAMES})")
    burst = None
    if "burst" in fields:
        burst = f.integer(fields["burst"], f"{field}.burst", UINT32_MAX)
        if not RULES[algorithm].takes_burst:
            takers = ", ".join(a for a, rules in RULES.items() if rules.takes_burst)
            f.issue(fields["burst"], f"{field}.burst", f"is only for algorithm: {takers}")
    replaces: list[str] = []
    if "replaces" in fields:
        replaces = _parse_replaces(f, fields["replaces"], f"{field}.replaces", name)
    if len(f.issues) > issues_before:
        return None
    return RateLimit(
        requests_per_unit=requests, unit=unit, name=name, unlimited=unlimited, unit_multiplier=multiplier,
        algorithm=algorithm, burst=burst, replaces=tuple(replaces),
    )


def _parse_replaces(f: _File, node: yaml.Node, field: str, own_name: str) -> list[str]:
    if not isinstance(node, yaml.SequenceNode):
        f.issue(node, field, f"must be a list of {{name: ...}}, got {kind(node)}")
        return []
    names = []
    for index, item in enumerate(node.value):
        here = f"{field}[{index}]"
        entry = f.mapping(item, here, ("name",))
        if entry is None:
            continue
        name = f.string(entry["name"], f"{here}.name") if "name" in entry else None
        if not name:
            f.issue(entry.get("name", item), f"{here}.name", "must not be empty")
        elif name == own_name:
            f.issue(entry["name"], f"{here}.name", f"a limit cannot replace its own name {quoted(name)}")
        else:
            names.append(name)
    return names


_FLAGS = ("shadow_mode", "quota_mode", "detailed_metric", "value_to_metric", "share_threshold")


def _parse_descriptors(
    f: _File, node: yaml.Node, field: str, level: Level, domain: str, parent: str = "",
    parent_node: DescriptorNode | None = None,
) -> None:
    if not isinstance(node, yaml.SequenceNode):
        if node.tag != _NULL:
            f.issue(node, field, f"must be a list of descriptors, got {kind(node)}")
        return
    for index, item in enumerate(node.value):
        here = f"{field}[{index}]"
        fields = f.mapping(item, here, _DESCRIPTOR_KEYS)
        if fields is None:
            continue
        key = f.string(fields["key"], f"{here}.key") if "key" in fields else None
        if not key:
            f.issue(fields.get("key", item), f"{here}.key", "is required and must not be empty")
            continue
        value = (f.string(fields["value"], f"{here}.value") if "value" in fields else None) or None
        rate_limit = None
        if "rate_limit" in fields and fields["rate_limit"].tag != _NULL:  # null: none, as the reference reads it
            rate_limit = _parse_rate_limit(f, fields["rate_limit"], f"{here}.rate_limit")
        flags = {name: bool(f.boolean(fields[name], f"{here}.{name}")) for name in _FLAGS if name in fields}
        wildcard = value is not None and "*" in value
        if flags.get("share_threshold") and not wildcard:
            f.issue(fields["share_threshold"], f"{here}.share_threshold", "needs a value with '*' to share")
        metadata = f.data(fields["metadata"], f"{here}.metadata") if "metadata" in fields else None
        f.count(0, len(parent) + len(key) + len(value or ""))  # its path (metric_key), before it is made
        node_out = DescriptorNode(
            key=key, value=value, rate_limit=rate_limit, children=Level(),
            source=f"{f.path}:{item.start_mark.line + 1}",
            pattern=wildcard_pattern(value) if wildcard and value is not None else None,
            metadata=metadata, metric_key=f"{parent}{key}_{value}" if value else f"{parent}{key}",
            parent=parent_node, **flags,
        )
        if "descriptors" in fields:
            _parse_descriptors(f, fields["descriptors"], f"{here}.descriptors", node_out.children, domain,
                               f"{node_out.metric_key}.", node_out)
        if not _add(level, node_out):
            composite = f"{key}_{value}" if value else key
            f.issue(item, here, f"duplicate descriptor composite key {quoted(f'{domain}.{composite}')}")


def _add(level: Level, node: DescriptorNode) -> bool:
    """Add a rule to a level; False when the level already has one for the same key and value."""
    if node.pattern is not None:
        if any(n.key == node.key and n.value == node.value for n in level.wildcards):
            return False
        level.wildcards.append(node)
    elif node.value is not None:
        if (node.key, node.value) in level.exact:
            return False
        level.exact[(node.key, node.value)] = node
    else:
        if node.key in level.key_only:
            return False
        level.key_only[node.key] = node
    return True


_Parsed = tuple[DomainConfig, int, Issues]  # a file's config (possibly partial), the line of its domain, its issues


def _refused(issue: ConfigIssue) -> _Parsed:
    return DomainConfig(domain="", root=Level(), source=issue.file), 0, Issues([issue])


def _parse_file(path: Path, options: LoadOptions) -> _Parsed:
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
    return _parse_text(str(path), text, options)


def _parse_text(name: str, text: str, options: LoadOptions) -> _Parsed:
    """Parse one file's text (``name``: the file, in errors)."""
    try:
        documents = list(yaml.compose_all(text, Loader=_YAML_LOADER))
    except yaml.YAMLError as exc:
        return _refused(yaml_issue(name, text, exc))
    except RecursionError:
        return _refused(ConfigIssue(name, 0, "", "invalid YAML: nested too deeply"))
    root = documents[0] if documents else None
    if root is None:
        return _refused(ConfigIssue(name, 0, "domain", "is required (the file is empty)"))
    for extra in documents[1:]:
        if extra is not None and extra.tag != _NULL:  # an empty document (a file ending in '---') says nothing
            return _refused(second_document_issue(name, text, extra))
    f = _File(name, options)
    config = DomainConfig(domain="", root=Level(), source=name)
    line = 0
    try:
        line = _parse_root(f, root, config)
    except _GiveUp as exc:
        f.issues.add(ConfigIssue(name, 0, "", str(exc)))
    except RecursionError:
        f.issues.add(ConfigIssue(name, 0, "", "descriptors nested too deeply, or a YAML alias that contains itself"))
    return config, line, f.issues


def _parse_root(f: _File, root: yaml.Node, config: DomainConfig) -> int:
    """Parse a file's top level into ``config``; return the line of its domain."""
    fields = f.mapping(root, "", _TOP_KEYS)
    line = 0
    if fields is not None:
        domain_node = fields.get("domain", root)
        line = domain_node.start_mark.line + 1
        issues_before = len(f.issues)
        config.domain = (f.string(domain_node, "domain") if "domain" in fields else None) or ""
        if not config.domain and len(f.issues) == issues_before:
            f.issue(domain_node, "domain", "is required and must not be empty")
        if "descriptors" in fields:
            _parse_descriptors(f, fields["descriptors"], "descriptors", config.root, config.domain)
        if "failure_mode" in fields:
            issues_before = len(f.issues)
            mode = f.string(fields["failure_mode"], "failure_mode")
            if mode is not None and mode.lower() in tuple(FailureMode):
                config.failure_mode = FailureMode(mode.lower())
            elif len(f.issues) == issues_before:
                f.issue(fields["failure_mode"], "failure_mode",
                        f"unknown failure mode {quoted(str(mode))} (expected one of: {FAILURE_MODE_NAMES})")
    return line


def load_file(path: str | Path, options: LoadOptions = LoadOptions()) -> DomainConfig:
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


def load_directory(directory: str | Path, options: LoadOptions = LoadOptions()) -> Config:
    """Load every config file of ``directory``. Raises ConfigError with the problems of every file (a
    missing directory, a file error, a domain defined in two files without ``merge_domains``, or, when
    merging, the same rule in two files)."""
    directory = Path(directory)
    try:
        if not directory.is_dir():
            raise ConfigError([ConfigIssue(str(directory), 0, "", "config directory does not exist")])
        paths = config_files(directory)
    except OSError as exc:  # a name too long, a directory this process may not read
        issue = ConfigIssue(str(directory), 0, "", f"cannot read config directory: {exc.strerror or exc}")
        raise ConfigError([issue]) from None
    return _assemble([_parse_file(path, options) for path in paths], options)


def load_texts(files: Sequence[tuple[str, str]], options: LoadOptions = LoadOptions()) -> Config:
    """Load files given as (name, YAML text), as ``load_directory`` loads a directory's (the config over xDS
    comes this way, each resource's name standing for a file). Raises ConfigError with the problems."""
    return _assemble([_parse_text(name, text, options) for name, text in files], options)


def _assemble(parsed: list[_Parsed], options: LoadOptions) -> Config:
    """One Config of the parsed files. Raises ConfigError with the problems of every file, and a domain defined
    in two files without ``merge_domains`` (or, when merging, the same rule in two files)."""
    issues = Issues(by_line=False)
    domains: dict[str, DomainConfig] = {}
    for config, line, file_issues in parsed:
        issues.add_all(file_issues)
        if not config.domain:
            continue
        first = domains.get(config.domain)
        if first is None:
            domains[config.domain] = config
        elif not options.merge_domains:
            issues.add(ConfigIssue(
                config.source, line, "domain", f"duplicate domain {quoted(config.domain)} (also in {first.source})"))
        else:
            _merge(first.root, config.root, config.domain, config.source, issues)
            if config.failure_mode and first.failure_mode not in (None, config.failure_mode):
                issues.add(ConfigIssue(
                    config.source, 0, "failure_mode", f"'{config.failure_mode}' conflicts with '{first.failure_mode}' "
                    f"for domain {quoted(config.domain)} (merging domain files)"))
            elif config.failure_mode:
                first.failure_mode = config.failure_mode
    if issues:
        raise ConfigError.of(issues)
    return Config(domains=domains)


def _merge(into: Level, extra: Level, domain: str, path: str, issues: Issues) -> None:
    """Add the top-level rules of ``extra`` (one file) to ``into`` (the domain so far); a rule both define
    is an error (MERGE_DOMAIN_CONFIG merges descriptors, it never overrides one)."""
    for node in extra.nodes():
        composite = f"{node.key}_{node.value}" if node.value else node.key
        if not _add(into, node):
            line = int(node.source.rsplit(":", 1)[1])
            issues.add(ConfigIssue(path, line, "", f"duplicate descriptor composite key "
                                   f"{quoted(f'{domain}.{composite}')} (merging domain files)"))
