"""The config model built from a source's values, with every rule of the format checked in one place.

A source (a YAML file: slidegate.config.loader; an xDS resource: slidegate.config.from_xds) reads each mapping
into Fields, its values already of their fields' types; what is left to check (a unit that exists, a limit that
does not replace itself, a rule defined twice, ...) is checked here, so that a config over xDS is valid exactly
when the same limits in files are, with the same errors. The rules follow envoyproxy/ratelimit
(``src/config/config_impl.go``); see docs/configuration.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from slidegate.algorithms import ALGORITHM_NAMES, MAX_WINDOW_SECONDS, RULES, Algorithm
from slidegate.config.errors import ConfigError, ConfigIssue, Issues, quoted, struct_problem
from slidegate.config.model import Config, DescriptorNode, DomainConfig, Level, RateLimit, wildcard_pattern
from slidegate.failure_modes import FAILURE_MODE_NAMES, FailureMode
from slidegate.units import UNIT_NAMES, Unit

UINT32_MAX = 4294967295
MAX_MAPPINGS = 100_000  # mappings (and metadata nodes) read from one file, after expanding YAML aliases
# characters of one file's rule paths (key_value.key2_value2, each rule's) and metadata, after expanding aliases:
# each repeat of a value shared by aliases is kept whole (and check-config prints it)
MAX_TEXT_CHARS = 64 * 1024 * 1024
MAX_COUNTED = 100_000  # problems counted in one file before the rest of it is left unread: each is work
FLAGS = ("shadow_mode", "quota_mode", "detailed_metric", "value_to_metric", "share_threshold")


class GiveUp(Exception):
    """The rest of the source is left unread; the message says why."""


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """How to load: ``merge_domains`` lets several files add to one domain (MERGE_DOMAIN_CONFIG);
    ``default_algorithm`` counts every limit that names none (DEFAULT_ALGORITHM)."""

    merge_domains: bool = False
    default_algorithm: Algorithm = Algorithm.SLIDING_WINDOW_LOG


@dataclass(slots=True)
class Fields:
    """One mapping of a source: the values it sets, each of its field's type (a string, a whole number, a
    boolean, Fields, Fields one after another for ``descriptors``, or plain data for ``metadata``), or None when
    the source already said why it could not be read; ``line``: where the mapping is, ``lines``: where each
    value is (0: the source has no lines)."""

    values: dict[str, Any]
    line: int = 0
    lines: dict[str, int] = field(default_factory=dict)

    def at(self, name: str) -> int:
        """The line of a value, or of the mapping when the value is not there."""
        return self.lines.get(name, self.line)


class Sink:
    """The issues of one source (a file, a resource), and the bounds on how much of it is read."""

    def __init__(self, source: str, options: LoadOptions) -> None:
        self.source = source
        self.options = options
        self.issues = Issues()
        self._mappings = 0
        self._chars = 0

    def issue(self, line: int, field: str, message: str) -> None:
        self.issues.add(ConfigIssue(self.source, line, field, message))
        if len(self.issues) >= MAX_COUNTED:  # a few lines of aliases can repeat one mistake 10^8 times
            raise GiveUp(f"{MAX_COUNTED:,} problems found (after expanding YAML aliases): the rest of the file "
                         "was not read")

    def count(self, mappings: int = 1, chars: int = 0) -> None:
        """Count mappings (or metadata nodes) and characters read: YAML aliases can make a few lines expand a
        millionfold."""
        self._mappings += mappings
        self._chars += chars
        if self._mappings > MAX_MAPPINGS:
            raise GiveUp(f"more than {MAX_MAPPINGS} descriptors and limits (after expanding YAML aliases): "
                         "split it or drop aliases")
        if self._chars > MAX_TEXT_CHARS:
            raise GiveUp(f"more than {MAX_TEXT_CHARS // 1024 // 1024} MiB of descriptor paths and metadata (after "
                         "expanding YAML aliases): split it or drop aliases")


def build_domain(sink: Sink, root: Fields) -> DomainConfig:
    """The domain of a source's top level (``domain``, ``descriptors``, ``failure_mode``); its issues go to
    ``sink``."""
    values = root.values
    config = DomainConfig(domain=values.get("domain") or "", root=Level(), source=sink.source)
    if values.get("domain", "") == "":  # None: it could not be read, and the source said why
        sink.issue(root.at("domain"), "domain", "is required and must not be empty")
    if values.get("descriptors") is not None:
        _build_descriptors(sink, values["descriptors"], "descriptors", config.root, config.domain)
    mode = values.get("failure_mode")
    if mode is not None:
        if mode.lower() in tuple(FailureMode):
            config.failure_mode = FailureMode(mode.lower())
        else:
            sink.issue(root.at("failure_mode"), "failure_mode",
                       f"unknown failure mode {quoted(mode)} (expected one of: {FAILURE_MODE_NAMES})")
    return config


def _build_descriptors(
    sink: Sink, items: Iterable[Fields | None], field: str, level: Level, domain: str, parent: str = "",
    parent_node: DescriptorNode | None = None,
) -> None:
    for index, item in enumerate(items):
        if item is None:  # not a mapping: the source said so
            continue
        here = f"{field}[{index}]"
        node = _build_descriptor(sink, item, here, parent, parent_node)
        if node is None:
            continue
        children = item.values.get("descriptors")
        if children is not None:
            _build_descriptors(sink, children, f"{here}.descriptors", node.children, domain,
                               f"{node.metric_key}.", node)
        if not _add(level, node):
            composite = f"{node.key}_{node.value}" if node.value else node.key
            sink.issue(item.line, here, f"duplicate descriptor composite key {quoted(f'{domain}.{composite}')}")


def _build_descriptor(
    sink: Sink, item: Fields, here: str, parent: str, parent_node: DescriptorNode | None,
) -> DescriptorNode | None:
    values = item.values
    key = values.get("key")
    if not key:
        sink.issue(item.at("key"), f"{here}.key", "is required and must not be empty")
        return None
    value = values.get("value") or None
    rate_limit = None
    if values.get("rate_limit") is not None:  # null: none, as the reference reads it
        rate_limit = _build_rate_limit(sink, values["rate_limit"], f"{here}.rate_limit")
    flags = {name: bool(values[name]) for name in FLAGS if name in values}
    wildcard = value is not None and "*" in value
    if flags.get("share_threshold") and not wildcard:
        sink.issue(item.at("share_threshold"), f"{here}.share_threshold", "needs a value with '*' to share")
    metadata = values.get("metadata")
    if metadata is not None and (problem := struct_problem(metadata)):
        sink.issue(item.at("metadata"), f"{here}.metadata", problem)
        metadata = None
    sink.count(0, len(parent) + len(key) + len(value or ""))  # its path (metric_key), before it is made
    return DescriptorNode(
        key=key, value=value, rate_limit=rate_limit, children=Level(), source=f"{sink.source}:{item.line}",
        pattern=wildcard_pattern(value) if wildcard and value is not None else None,
        metadata=metadata, metric_key=f"{parent}{key}_{value}" if value else f"{parent}{key}",
        parent=parent_node, **flags,
    )


def _build_rate_limit(sink: Sink, fields: Fields, field: str) -> RateLimit | None:
    issues_before = len(sink.issues)
    values = fields.values
    unlimited = bool(values.get("unlimited"))
    name = values.get("name") or ""
    # as in envoyproxy/ratelimit, an absent requests_per_unit is 0: always over limit
    requests = _whole(sink, fields, "requests_per_unit", field, 0) or 0
    multiplier = _whole(sink, fields, "unit_multiplier", field, 1) or 1
    unit = _unit(sink, fields, field, unlimited)
    if unit is not None and unit.seconds * multiplier > MAX_WINDOW_SECONDS:
        sink.issue(fields.at("unit_multiplier"), f"{field}.unit_multiplier",
                   f"makes a window of {unit.seconds * multiplier} s, longer than the {MAX_WINDOW_SECONDS} s allowed")
    algorithm = sink.options.default_algorithm
    if "algorithm" in values:
        text = values["algorithm"] or ""
        try:
            algorithm = Algorithm(text)
        except ValueError:
            sink.issue(fields.at("algorithm"), f"{field}.algorithm",
                       f"unknown algorithm {quoted(text)} (expected one of: {ALGORITHM_NAMES})")
    burst = None
    if "burst" in values:
        burst = _whole(sink, fields, "burst", field, 0)
        if not RULES[algorithm].takes_burst:
            takers = ", ".join(a for a, rules in RULES.items() if rules.takes_burst)
            sink.issue(fields.at("burst"), f"{field}.burst", f"is only for algorithm: {takers}")
    replaces = _replaces(sink, values.get("replaces", ()), f"{field}.replaces", name)
    if len(sink.issues) > issues_before:
        return None
    return RateLimit(
        requests_per_unit=requests, unit=unit, name=name, unlimited=unlimited, unit_multiplier=multiplier,
        algorithm=algorithm, burst=burst, replaces=tuple(replaces),
    )


def _whole(sink: Sink, fields: Fields, name: str, field: str, minimum: int) -> int | None:
    """A whole number between ``minimum`` and UINT32_MAX, or None (absent, unreadable or out of range)."""
    value: int | None = fields.values.get(name)
    if value is not None and not minimum <= value <= UINT32_MAX:
        sink.issue(fields.at(name), f"{field}.{name}", f"must be between {minimum} and {UINT32_MAX}, got {value}")
        return None
    return value


def _unit(sink: Sink, fields: Fields, field: str, unlimited: bool) -> Unit | None:
    text = fields.values.get("unit")
    if unlimited:
        if text:
            sink.issue(fields.at("unit"), f"{field}.unit", "must not be set when unlimited is true")
        return None
    if not text:
        sink.issue(fields.at("unit"), f"{field}.unit", f"is required (one of: {UNIT_NAMES})")
        return None
    try:
        if not text.isascii():  # str.upper() maps some non-ASCII letters onto ASCII ones
            raise KeyError(text)
        return Unit.parse(text)
    except KeyError:
        sink.issue(fields.at("unit"), f"{field}.unit", f"unknown unit {quoted(text)} (expected one of: {UNIT_NAMES})")
        return None


def _replaces(sink: Sink, items: Sequence[Fields | None], field: str, own_name: str) -> list[str]:
    names = []
    for index, item in enumerate(items):
        if item is None:  # not a mapping: the source said so
            continue
        here = f"{field}[{index}].name"
        name = item.values.get("name")
        if not name:
            sink.issue(item.at("name"), here, "must not be empty")
        elif name == own_name:
            sink.issue(item.at("name"), here, f"a limit cannot replace its own name {quoted(name)}")
        else:
            names.append(name)
    return names


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


Built = tuple[DomainConfig, int, Issues]  # a source's config (possibly partial), the line of its domain, its issues


def assemble(built: Sequence[Built], options: LoadOptions, version: str = "") -> Config:
    """One Config of the sources' domains. Raises ConfigError with the problems of every source, and a domain
    defined in two without ``merge_domains`` (or, when merging, the same rule in two)."""
    issues = Issues(by_line=False)
    domains: dict[str, DomainConfig] = {}
    for config, line, source_issues in built:
        issues.add_all(source_issues)
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
    return Config(domains=domains, version=version)


def _merge(into: Level, extra: Level, domain: str, path: str, issues: Issues) -> None:
    """Add the top-level rules of ``extra`` (one file) to ``into`` (the domain so far); a rule both define
    is an error (MERGE_DOMAIN_CONFIG merges descriptors, it never overrides one)."""
    for node in extra.nodes():
        composite = f"{node.key}_{node.value}" if node.value else node.key
        if not _add(into, node):
            line = int(node.source.rsplit(":", 1)[1])
            issues.add(ConfigIssue(path, line, "", f"duplicate descriptor composite key "
                                   f"{quoted(f'{domain}.{composite}')} (merging domain files)"))
