"""The immutable config model: domains, descriptor trees and limits, built once per load and swapped whole."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from slidegate.algorithms import Algorithm
from slidegate.failure_modes import FailureMode
from slidegate.units import Unit


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A limit: ``requests_per_unit`` hits (0 ⇒ always over limit) per window of ``unit_multiplier`` x
    ``unit``, counted with ``algorithm`` (``burst``: token-bucket capacity, None = requests_per_unit).

    ``unlimited`` limits are never counted (``unit`` is then None). ``name`` is reported to Envoy in
    ``current_limit.name``; ``replaces`` names the limits this one drops from a request where both match.
    """

    requests_per_unit: int
    unit: Unit | None
    name: str = ""
    unlimited: bool = False
    unit_multiplier: int = 1
    algorithm: Algorithm = Algorithm.SLIDING_WINDOW_LOG
    burst: int | None = None
    replaces: tuple[str, ...] = ()

    @property
    def window_seconds(self) -> int:
        """Window length in seconds (0 for unlimited)."""
        return self.unit.seconds * self.unit_multiplier if self.unit else 0


@dataclass(slots=True)
class Level:
    """One level of a descriptor tree. A request entry matches, in this order: the rule with the same key
    and value, the first rule (in config order) whose value pattern matches, the rule with the key alone."""

    exact: dict[tuple[str, str], DescriptorNode] = field(default_factory=dict)
    wildcards: list[DescriptorNode] = field(default_factory=list)
    key_only: dict[str, DescriptorNode] = field(default_factory=dict)

    def find(self, key: str, value: str) -> DescriptorNode | None:
        """The rule for one request entry at this level, or None."""
        node = self.exact.get((key, value))
        if node is not None:
            return node
        for candidate in self.wildcards:
            if candidate.key == key and candidate.pattern is not None and candidate.pattern.matches(value):
                return candidate
        return self.key_only.get(key)

    def nodes(self) -> list[DescriptorNode]:
        """Every rule of this level."""
        return [*self.exact.values(), *self.wildcards, *self.key_only.values()]


@dataclass(frozen=True, slots=True)
class WildcardPattern:
    """A rule value with ``*`` (each matching zero or more characters, anywhere, any number of times), as
    envoyproxy/ratelimit's wildcards. ``matches`` runs in time linear in the value's length, whatever the
    pattern: a regular expression of several ``.*`` backtracks (a 16 KiB value against ``/a/*/*/*/b``
    would hold the event loop for hours)."""

    parts: tuple[str, ...]  # the value split at each "*": at least two

    def matches(self, value: str) -> bool:
        """Whether the whole of ``value`` matches."""
        first, *middle, last = self.parts
        if len(value) < len(first) + len(last) or not value.startswith(first) or not value.endswith(last):
            return False
        # the first place each middle part fits, in order, is as good as any later one: what follows a
        # part is then as long as it can be
        at, end = len(first), len(value) - len(last)
        for part in middle:
            found = value.find(part, at, end)
            if found < 0:
                return False
            at = found + len(part)
        return True


def wildcard_pattern(value: str) -> WildcardPattern:
    """The WildcardPattern of a rule value holding at least one ``*``."""
    return WildcardPattern(tuple(value.split("*")))


@dataclass(slots=True)
class DescriptorNode:
    """A descriptor rule. No ``rate_limit`` and no children ⇒ a whitelist entry (match ⇒ no limit).

    ``pattern`` is set for a wildcard value; ``share_threshold`` makes every value matching it share one
    counter. ``shadow_mode``: evaluated and counted, but never makes the request over limit.
    ``quota_mode``: over its limit, the descriptor is OVER_LIMIT but rejects the request only when every
    quota-mode descriptor of the request is over (slidegate.backends.base.admits); reported in the dynamic
    metadata.
    ``detailed_metric``/``value_to_metric`` shape metric names; ``metadata`` is returned in the dynamic
    metadata when enabled.
    """

    key: str
    value: str | None
    rate_limit: RateLimit | None
    children: Level
    source: str  # "file:line", for messages
    pattern: WildcardPattern | None = None
    share_threshold: bool = False
    shadow_mode: bool = False
    quota_mode: bool = False
    detailed_metric: bool = False
    value_to_metric: bool = False
    metadata: dict[str, Any] | None = None
    metric_key: str = ""  # the rule's path, as envoyproxy/ratelimit names its stats ("key_value.key2")
    # the rule whose ``descriptors`` hold this one (None at the top), so that a match knows every level it went
    # through (slidegate.metric_keys); left out of repr and ==, which would otherwise walk back up the tree
    parent: DescriptorNode | None = field(default=None, repr=False, compare=False)

    def path(self) -> list[DescriptorNode]:
        """The rules from the top of the tree down to this one."""
        nodes: list[DescriptorNode] = []
        node: DescriptorNode | None = self
        while node is not None:
            nodes.append(node)
            node = node.parent
        return nodes[::-1]


class Match(NamedTuple):  # made for every request never seen before (see slidegate.backends.base's Check)
    """The rule a request descriptor matched and the entries its counter is keyed by (the request's own
    entries, except that a ``share_threshold`` rule puts its pattern in place of the value)."""

    rule: DescriptorNode
    key_entries: tuple[tuple[str, str], ...]


@dataclass(slots=True)
class DomainConfig:
    """Every rule of one domain."""

    domain: str
    root: Level
    source: str
    failure_mode: FailureMode | None = None  # slidegate: overrides FAILURE_MODE for this domain

    def match(self, entries: tuple[tuple[str, str], ...]) -> Match | None:
        """The rule for one request descriptor, per envoyproxy/ratelimit's rules: walk the entries down the
        tree; the rule is the one found at the level of the last entry, so the depth must equal the number
        of entries. Empty entries or running out of tree ⇒ None."""
        level = self.root
        node: DescriptorNode | None = None
        key_entries: list[tuple[str, str]] = []
        for key, value in entries:
            node = level.find(key, value)
            if node is None:
                return None
            key_entries.append((key, node.value) if node.share_threshold and node.value else (key, value))
            level = node.children
        return Match(node, tuple(key_entries)) if node is not None else None

    def rules(self) -> list[tuple[list[DescriptorNode], DescriptorNode]]:
        """Every rule that ends a descriptor (it has a limit, or it has no children: a whitelist entry), with
        the rules that lead to it, in config order."""
        out: list[tuple[list[DescriptorNode], DescriptorNode]] = []

        def walk(level: Level, path: list[DescriptorNode]) -> None:
            for node in level.nodes():
                here = [*path, node]
                if node.rate_limit is not None or not node.children.nodes():
                    out.append((here, node))
                walk(node.children, here)

        walk(self.root, [])
        return out

    def limits(self) -> list[tuple[list[tuple[str, str | None]], RateLimit]]:
        """Every limit of the domain with the path of (key, value) that leads to it, in config order."""
        out: list[tuple[list[tuple[str, str | None]], RateLimit]] = []

        def walk(level: Level, path: list[tuple[str, str | None]]) -> None:
            for node in level.nodes():
                here = [*path, (node.key, node.value)]
                if node.rate_limit is not None:
                    out.append((here, node.rate_limit))
                walk(node.children, here)

        walk(self.root, [])
        return out


@dataclass(frozen=True, slots=True)
class Config:
    """A whole loaded config: domain name → rules. ``version``: the xDS version it came in ("" from files);
    ``loaded``: False only for the placeholder served before an xDS config source's first config
    (FORCE_START_WITHOUT_INITIAL_CONFIG), which every request is refused with."""

    domains: dict[str, DomainConfig]
    version: str = ""
    loaded: bool = True

    def limit_count(self) -> int:
        """How many limits (including unlimited ones) all domains hold."""
        return sum(len(d.limits()) for d in self.domains.values())
