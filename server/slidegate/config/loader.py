"""Load envoyproxy/ratelimit YAML config files into the model, reporting every error with file, line and field.

The format (one ``domain`` per file, nested ``descriptors`` with ``key``/``value``/``rate_limit``) and its
validation rules follow envoyproxy/ratelimit (``src/config/config_impl.go``); see docs/configuration.md.
YAML is composed into nodes (not plain dicts) so that each error can point at its line.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from slidegate.algorithms import ALGORITHM_NAMES, MAX_WINDOW_SECONDS, RULES, Algorithm
from slidegate.config.errors import ConfigError, ConfigIssue, yaml_issue
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


MAX_METADATA_DEPTH = 20  # a response nests ~10 messages around metadata, 3 for each mapping; protobuf reads 100
MAX_MAPPINGS = 100_000  # mappings (and metadata nodes) read from one file, after expanding YAML aliases
MAX_FILE_BYTES = 16 * 1024 * 1024


class _TooLarge(Exception):
    """The file expands to more than MAX_MAPPINGS mappings."""


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
_NULL = "tag:yaml.org,2002:null"


class _File:
    """Walks one file's node tree, collecting issues instead of stopping at the first."""

    def __init__(self, path: str, options: LoadOptions) -> None:
        self.path = path
        self.options = options
        self.issues: list[ConfigIssue] = []
        self._constructor = yaml.SafeLoader("")
        self._mappings = 0

    def issue(self, node: yaml.Node | None, field: str, message: str) -> None:
        line = node.start_mark.line + 1 if node is not None else 0
        self.issues.append(ConfigIssue(self.path, line, field, message))

    def mapping(self, node: yaml.Node, field: str, allowed: tuple[str, ...]) -> dict[str, yaml.Node] | None:
        # YAML aliases can make a few lines expand to millions of descriptors ("billion laughs")
        self._mappings += 1
        if self._mappings > MAX_MAPPINGS:
            raise _TooLarge
        if not isinstance(node, yaml.MappingNode):
            self.issue(node, field, f"must be a mapping, got {_kind(node)}")
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
                self.issue(key_node, sub, f"unknown key '{name}' (expected one of: {', '.join(allowed)})")
            else:
                out[name] = value_node
        return out

    def string(self, node: yaml.Node, field: str) -> str | None:
        """A scalar read as text, as envoyproxy/ratelimit's YAML decoder reads it into a string field
        (``value: 123`` is "123"); null is None."""
        if not isinstance(node, yaml.ScalarNode):
            self.issue(node, field, f"must be a string, got {_kind(node)}")
            return None
        if node.tag == _NULL:
            return None
        return str(node.value)

    def integer(self, node: yaml.Node, field: str, maximum: int, minimum: int = 0) -> int | None:
        # YAML 1.1 reads 1:30 as 90 (base 60); nobody means that in a limit
        if not isinstance(node, yaml.ScalarNode) or node.tag != _INT or ":" in node.value or len(node.value) > 40:
            self.issue(node, field, f"must be a whole number, got {_describe(node)}")
            return None
        try:
            value = self._constructor.construct_object(node)
        except (ValueError, yaml.YAMLError):
            self.issue(node, field, f"must be a whole number, got {_describe(node)}")
            return None
        if not minimum <= value <= maximum:
            self.issue(node, field, f"must be between {minimum} and {maximum}, got {value}")
            return None
        return int(value)

    def data(self, node: yaml.Node, field: str) -> dict[str, Any] | None:
        """A mapping of plain data (for ``metadata``), as JSON would hold it."""
        if not isinstance(node, yaml.MappingNode):
            self.issue(node, field, f"must be a mapping, got {_kind(node)}")
            return None
        # count every node it expands to before building it: aliases can multiply a few lines a millionfold
        stack: list[yaml.Node] = [node]
        while stack:
            self._mappings += 1
            if self._mappings > MAX_MAPPINGS:
                raise _TooLarge
            current = stack.pop()
            if isinstance(current, yaml.MappingNode):
                stack.extend(v for pair in current.value for v in pair)
            elif isinstance(current, yaml.SequenceNode):
                stack.extend(current.value)
        try:
            value = self._constructor.construct_object(node, deep=True)
        except (TypeError, ValueError, yaml.YAMLError):
            value = None
        problem = _not_struct(value, 1) if isinstance(value, dict) else "must be a mapping"
        if problem:
            self.issue(node, field, problem)
            return None
        return dict(value)

    def boolean(self, node: yaml.Node, field: str) -> bool | None:
        if not isinstance(node, yaml.ScalarNode) or node.tag != _BOOL:
            self.issue(node, field, f"must be true or false, got {_describe(node)}")
            return None
        try:
            return bool(self._constructor.construct_object(node))
        except (KeyError, yaml.YAMLError):
            self.issue(node, field, f"must be true or false, got {_describe(node)}")
            return None


def _not_struct(value: Any, depth: int) -> str | None:
    """Why ``value`` cannot be sent as a protobuf Struct (Envoy's dynamic metadata), or None."""
    if isinstance(value, dict | list) and depth > MAX_METADATA_DEPTH:
        return (f"nests more than {MAX_METADATA_DEPTH} mappings and lists deep (a response nesting deeper cannot "
                "be read by protobuf, Envoy's included)")
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            return "must have text keys only"
        return next((p for v in value.values() if (p := _not_struct(v, depth + 1))), None)
    if isinstance(value, list):
        return next((p for v in value if (p := _not_struct(v, depth + 1))), None)
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


def _kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return "null" if node.tag == _NULL else "a scalar"


def _describe(node: yaml.Node) -> str:
    if isinstance(node, yaml.ScalarNode) and node.tag != _NULL:
        return repr(node.value)
    return _kind(node)


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
            f.issue(fields["unit"], f"{field}.unit", f"unknown unit '{unit_text}' (expected one of: {UNIT_NAMES})")
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
                    f"unknown algorithm '{text}' (expected one of: {ALGORITHM_NAMES})")
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
        f.issue(node, field, f"must be a list of {{name: ...}}, got {_kind(node)}")
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
            f.issue(entry["name"], f"{here}.name", f"a limit cannot replace its own name '{name}'")
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
            f.issue(node, field, f"must be a list of descriptors, got {_kind(node)}")
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
            f.issue(item, here, f"duplicate descriptor composite key '{domain}.{composite}'")


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


def _parse_file(path: Path, options: LoadOptions) -> tuple[DomainConfig, int, list[ConfigIssue]]:
    """Parse one file; return its config (possibly partial), the line of its domain and every issue."""
    config = DomainConfig(domain="", root=Level(), source=str(path))
    if path.exists() and not path.is_file():  # reading a FIFO would block the load forever
        return config, 0, [ConfigIssue(str(path), 0, "", "not a regular file")]
    if path.is_file() and path.stat().st_size > MAX_FILE_BYTES:
        return config, 0, [ConfigIssue(str(path), 0, "", f"larger than {MAX_FILE_BYTES // 1024 // 1024} MiB")]
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        return config, 0, [ConfigIssue(str(path), 0, "", f"cannot read file: {exc.strerror or exc}")]
    except UnicodeDecodeError as exc:
        return config, 0, [ConfigIssue(str(path), 0, "", f"not UTF-8 text: {exc.reason}")]
    return _parse_text(str(path), text, options)


def _parse_text(name: str, text: str, options: LoadOptions) -> tuple[DomainConfig, int, list[ConfigIssue]]:
    """Parse one file's text (``name``: the file, in errors); return its config (possibly partial), the line of
    its domain and every issue."""
    f = _File(name, options)
    config = DomainConfig(domain="", root=Level(), source=name)
    try:
        documents = list(yaml.compose_all(text, Loader=_YAML_LOADER))
    except yaml.YAMLError as exc:
        return config, 0, [yaml_issue(name, text, exc)]
    except RecursionError:
        return config, 0, [ConfigIssue(name, 0, "", "invalid YAML: nested too deeply")]
    root = documents[0] if documents else None
    if root is None:
        return config, 0, [ConfigIssue(name, 0, "domain", "is required (the file is empty)")]
    for extra in documents[1:]:
        # envoyproxy/ratelimit reads the first document and drops the rest without a word: limits its
        # operator wrote and never had. Refused, so that nobody is surprised either way.
        if extra is not None and extra.tag != _NULL:  # an empty document (a file ending in '---') says nothing
            lines, at = text.split("\n"), extra.start_mark.line
            while at > 0 and not lines[at].startswith("---"):  # the line of its '---', not of its content
                at -= 1
            return config, 0, [ConfigIssue(name, at + 1, "", "a second YAML document "
                                           "('---'): one file holds one domain (envoyproxy/ratelimit reads only "
                                           "the first and ignores the rest); put each in a file of its own")]
    try:
        line = _parse_root(f, root, config)
    except _TooLarge:
        f.issues.append(ConfigIssue(name, 0, "", f"more than {MAX_MAPPINGS} descriptors and limits "
                                    "(after expanding YAML aliases): split it or drop aliases"))
        line = 0
    except RecursionError:
        f.issues.append(ConfigIssue(name, 0, "", "descriptors nested too deeply, or a YAML alias "
                                    "that contains itself"))
        line = 0
    # in the order a reader meets them (a rule's own problems are found before its duplicate key, for one)
    return config, line, sorted(f.issues, key=lambda issue: issue.line)


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
                        f"unknown failure mode '{mode}' (expected one of: {FAILURE_MODE_NAMES})")
    return line


def load_file(path: str | Path, options: LoadOptions = LoadOptions()) -> DomainConfig:
    """Load one YAML file (one domain). Raises ConfigError listing every problem found."""
    config, _, issues = _parse_file(Path(path), options)
    if issues:
        raise ConfigError(issues)
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
    """Load every config file of ``directory``. Raises ConfigError with every problem of every file (a
    missing directory, a file error, a domain defined in two files without ``merge_domains``, or, when
    merging, the same rule in two files)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ConfigError([ConfigIssue(str(directory), 0, "", "config directory does not exist")])
    return _assemble([_parse_file(path, options) for path in config_files(directory)], options)


def load_texts(files: Sequence[tuple[str, str]], options: LoadOptions = LoadOptions()) -> Config:
    """Load files given as (name, YAML text), as ``load_directory`` loads a directory's (the config over xDS
    comes this way, each resource's name standing for a file). Raises ConfigError with every problem."""
    return _assemble([_parse_text(name, text, options) for name, text in files], options)


def _assemble(parsed: list[tuple[DomainConfig, int, list[ConfigIssue]]], options: LoadOptions) -> Config:
    """One Config of the parsed files. Raises ConfigError with every problem of every file, and a domain defined
    in two files without ``merge_domains`` (or, when merging, the same rule in two files)."""
    issues: list[ConfigIssue] = []
    domains: dict[str, DomainConfig] = {}
    for config, line, file_issues in parsed:
        issues.extend(file_issues)
        if not config.domain:
            continue
        first = domains.get(config.domain)
        if first is None:
            domains[config.domain] = config
        elif not options.merge_domains:
            issues.append(ConfigIssue(
                config.source, line, "domain", f"duplicate domain '{config.domain}' (also in {first.source})"))
        else:
            issues.extend(_merge(first.root, config.root, config.domain, config.source))
            if config.failure_mode and first.failure_mode not in (None, config.failure_mode):
                issues.append(ConfigIssue(
                    config.source, 0, "failure_mode", f"'{config.failure_mode}' conflicts with '{first.failure_mode}' "
                    f"for domain '{config.domain}' (merging domain files)"))
            elif config.failure_mode:
                first.failure_mode = config.failure_mode
    if issues:
        raise ConfigError(issues)
    return Config(domains=domains)


def _merge(into: Level, extra: Level, domain: str, path: str) -> list[ConfigIssue]:
    """Add the top-level rules of ``extra`` (one file) to ``into`` (the domain so far); a rule both define
    is an error (MERGE_DOMAIN_CONFIG merges descriptors, it never overrides one)."""
    issues = []
    for node in extra.nodes():
        composite = f"{node.key}_{node.value}" if node.value else node.key
        if not _add(into, node):
            line = int(node.source.rsplit(":", 1)[1])
            issues.append(ConfigIssue(path, line, "", f"duplicate descriptor composite key '{domain}.{composite}' "
                                      "(merging domain files)"))
    return issues
