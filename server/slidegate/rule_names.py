"""How a rule is named to operators (the top limited callers, the dynamic metadata, the logs): its limit's YAML
``name`` where the config sets one, else its key path, each level ``key=value`` (``key`` alone for a rule of
the key only, the pattern for a wildcard) joined by ``.``, as ``generic_key=api.user``."""

from __future__ import annotations

from slidegate.config.model import DescriptorNode
from slidegate.text import printable


def rule_name(node: DescriptorNode) -> str:
    """The name of the rule ``node``: its limit's ``name``, else its key path from the top of its domain."""
    if node.rate_limit is not None and node.rate_limit.name:
        return printable(node.rate_limit.name)
    return ".".join(printable(f"{n.key}={n.value}" if n.value is not None else n.key) for n in node.path())
