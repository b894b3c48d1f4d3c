"""Load envoyproxy/ratelimit YAML config files into the model, reporting every error with file, line and field.

The format (one ``domain`` per file, nested ``descriptors`` with ``key``/``value``/``rate_limit``) and its
validation rules follow envoyproxy/ratelimit (``src/config/config_impl.go``); see README "Configuration".
YAML is composed into nodes (not plain dicts) so that each error can point at its line.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from slidegate.config.errors import ConfigError, ConfigIssue
from slidegate.config.model import Config, DescriptorNode, DomainConfig, Level, RateLimit
from slidegate.units import UNIT_NAMES, Unit

UINT32_MAX = 4294967295
_TOP_KEYS = ("domain", "descriptors")
_DESCRIPTOR_KEYS = ("key", "value", "rate_limit", "descriptors")
_RATE_LIMIT_KEYS = ("unit", "requests_per_unit", "unlimited", "name")
# Keys envoyproxy/ratelimit knows that slidegate does not implement yet: an error names them plainly.
_NOT_YET = {
    "replaces",
    "shadow_mode",
    "quota_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
}
_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_BOOL = "tag:yaml.org,2002:bool"
_NULL = "tag:yaml.org,2002:null"


class _File:
    """Walks one file's node tree, collecting issues instead of stopping at the first."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.issues: list[ConfigIssue] = []
        self._constructor = yaml.SafeLoader("")

    def issue(self, node: yaml.Node | None, field: str, message: str) -> None:
        line = node.start_mark.line + 1 if node is not None else 0
        self.issues.append(ConfigIssue(self.path, line, field, message))

    def mapping(self, node: yaml.Node, field: str, allowed: tuple[str, ...]) -> dict[str, yaml.Node] | None:
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
            elif name in _NOT_YET:
                self.issue(key_node, sub, f"'{name}' is not supported yet by slidegate")
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

    def integer(self, node: yaml.Node, field: str, maximum: int) -> int | None:
        if not isinstance(node, yaml.ScalarNode) or node.tag != _INT:
            self.issue(node, field, f"must be a whole number, got {_describe(node)}")
            return None
        value = self._constructor.construct_object(node)
        if not 0 <= value <= maximum:
            self.issue(node, field, f"must be between 0 and {maximum}, got {value}")
            return None
        return int(value)

    def boolean(self, node: yaml.Node, field: str) -> bool | None:
        if not isinstance(node, yaml.ScalarNode) or node.tag != _BOOL:
            self.issue(node, field, f"must be true or false, got {_describe(node)}")
            return None
        return bool(self._constructor.construct_object(node))


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
    ok = True
    unlimited = False
    if "unlimited" in fields:
        parsed = f.boolean(fields["unlimited"], f"{field}.unlimited")
        ok &= parsed is not None
        unlimited = bool(parsed)
    name = ""
    if "name" in fields:
        name = f.string(fields["name"], f"{field}.name") or ""
    requests = 0  # as in envoyproxy/ratelimit, an absent requests_per_unit is 0: always over limit
    if "requests_per_unit" in fields:
        parsed_int = f.integer(fields["requests_per_unit"], f"{field}.requests_per_unit", UINT32_MAX)
        ok &= parsed_int is not None
        requests = parsed_int or 0
    unit: Unit | None = None
    unit_text = f.string(fields["unit"], f"{field}.unit") if "unit" in fields else None
    if unlimited:
        if unit_text:
            f.issue(fields["unit"], f"{field}.unit", "must not be set when unlimited is true")
            ok = False
    elif not unit_text:
        f.issue(fields.get("unit", node), f"{field}.unit", f"is required (one of: {UNIT_NAMES})")
        ok = False
    else:
        try:
            unit = Unit.parse(unit_text)
        except KeyError:
            f.issue(fields["unit"], f"{field}.unit", f"unknown unit '{unit_text}' (expected one of: {UNIT_NAMES})")
            ok = False
    if not ok:
        return None
    return RateLimit(requests_per_unit=requests, unit=unit, name=name, unlimited=unlimited)


def _parse_descriptors(f: _File, node: yaml.Node, field: str, level: Level, domain: str) -> None:
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
        value = f.string(fields["value"], f"{here}.value") if "value" in fields else None
        rate_limit = None
        if "rate_limit" in fields:
            rate_limit = _parse_rate_limit(f, fields["rate_limit"], f"{here}.rate_limit")
        node_out = DescriptorNode(
            key=key,
            value=value or None,
            rate_limit=rate_limit,
            children=Level(),
            source=f"{f.path}:{item.start_mark.line + 1}",
        )
        if "descriptors" in fields:
            _parse_descriptors(f, fields["descriptors"], f"{here}.descriptors", node_out.children, domain)
        if value:
            duplicate = (key, value) in level.exact
            level.exact.setdefault((key, value), node_out)
        else:
            duplicate = key in level.key_only
            level.key_only.setdefault(key, node_out)
        if duplicate:
            composite = f"{key}_{value}" if value else key
            f.issue(item, here, f"duplicate descriptor composite key '{domain}.{composite}'")


def _parse_file(path: Path) -> tuple[DomainConfig, int, list[ConfigIssue]]:
    """Parse one file; return its config (possibly partial), the line of its domain and every issue."""
    f = _File(str(path))
    config = DomainConfig(domain="", root=Level(), source=str(path))
    try:
        text = path.read_text(encoding="utf-8")
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except OSError as exc:
        return config, 0, [ConfigIssue(str(path), 0, "", f"cannot read file: {exc.strerror or exc}")]
    except UnicodeDecodeError as exc:
        return config, 0, [ConfigIssue(str(path), 0, "", f"not UTF-8 text: {exc.reason}")]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 0
        reason = getattr(exc, "problem", None) or str(exc)
        return config, 0, [ConfigIssue(str(path), line, "", f"invalid YAML: {reason}")]
    if root is None:
        return config, 0, [ConfigIssue(str(path), 0, "domain", "is required (the file is empty)")]
    fields = f.mapping(root, "", _TOP_KEYS)
    line = 0
    if fields is not None:
        domain_node = fields.get("domain", root)
        line = domain_node.start_mark.line + 1
        config.domain = (f.string(domain_node, "domain") if "domain" in fields else None) or ""
        if not config.domain:
            f.issue(domain_node, "domain", "is required and must not be empty")
        if "descriptors" in fields:
            _parse_descriptors(f, fields["descriptors"], "descriptors", config.root, config.domain)
    return config, line, f.issues


def load_file(path: str | Path) -> DomainConfig:
    """Load one YAML file (one domain). Raises ConfigError listing every problem found."""
    config, _, issues = _parse_file(Path(path))
    if issues:
        raise ConfigError(issues)
    return config


def config_files(directory: str | Path) -> list[Path]:
    """The config files of a directory: every ``*.yaml``/``*.yml`` directly in it, hidden files excluded,
    in name order."""
    directory = Path(directory)
    return sorted(
        p for p in directory.iterdir()
        if p.suffix in (".yaml", ".yml") and not p.name.startswith(".") and p.is_file()
    )


def load_directory(directory: str | Path) -> Config:
    """Load every config file of ``directory``. Raises ConfigError with every problem of every file
    (a missing directory, a file error, or a domain defined in two files)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ConfigError([ConfigIssue(str(directory), 0, "", "config directory does not exist")])
    issues: list[ConfigIssue] = []
    domains: dict[str, DomainConfig] = {}
    for path in config_files(directory):
        config, line, file_issues = _parse_file(path)
        issues.extend(file_issues)
        if not config.domain:
            continue
        if config.domain in domains:
            issues.append(ConfigIssue(
                str(path), line, "domain",
                f"duplicate domain '{config.domain}' (also in {domains[config.domain].source})",
            ))
            continue
        domains[config.domain] = config
    if issues:
        raise ConfigError(issues)
    return Config(domains=domains)
