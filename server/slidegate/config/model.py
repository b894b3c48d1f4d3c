"""The immutable config model: domains, descriptor trees and limits, built once per load and swapped whole."""

from __future__ import annotations

from dataclasses import dataclass, field

from slidegate.units import Unit


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A limit: ``requests_per_unit`` hits (0 ⇒ always over limit) per window of ``unit``.

    ``unlimited`` limits are never counted (``unit`` is then None). ``name`` is reported to Envoy in
    ``current_limit.name``.
    """

    requests_per_unit: int
    unit: Unit | None
    name: str = ""
    unlimited: bool = False

    @property
    def window_seconds(self) -> int:
        """Window length in seconds (0 for unlimited)."""
        return self.unit.seconds if self.unit else 0


@dataclass(slots=True)
class Level:
    """One level of a descriptor tree: rules matched by exact ``(key, value)`` first, then by ``key`` alone."""

    exact: dict[tuple[str, str], DescriptorNode] = field(default_factory=dict)
    key_only: dict[str, DescriptorNode] = field(default_factory=dict)

    def find(self, key: str, value: str) -> DescriptorNode | None:
        """The rule for one request entry at this level, or None."""
        node = self.exact.get((key, value))
        return node if node is not None else self.key_only.get(key)


@dataclass(slots=True)
class DescriptorNode:
    """A descriptor rule. No ``rate_limit`` and no children ⇒ a whitelist entry (match ⇒ no limit)."""

    key: str
    value: str | None
    rate_limit: RateLimit | None
    children: Level
    source: str  # "file:line", for messages


@dataclass(slots=True)
class DomainConfig:
    """Every rule of one domain."""

    domain: str
    root: Level
    source: str

    def match(self, entries: list[tuple[str, str]]) -> RateLimit | None:
        """The limit for one request descriptor, per envoyproxy/ratelimit's rules: walk the entries down the
        tree (exact value, else key-only); the limit is the one found at the level of the last entry, so the
        depth must equal the number of entries. Empty entries or running out of tree ⇒ None."""
        level = self.root
        node: DescriptorNode | None = None
        for key, value in entries:
            node = level.find(key, value)
            if node is None:
                return None
            level = node.children
        return node.rate_limit if node is not None else None

    def limits(self) -> list[tuple[list[tuple[str, str | None]], RateLimit]]:
        """Every limit of the domain with the path of (key, value) that leads to it, in config order."""
        out: list[tuple[list[tuple[str, str | None]], RateLimit]] = []

        def walk(level: Level, path: list[tuple[str, str | None]]) -> None:
            for node in [*level.exact.values(), *level.key_only.values()]:
                here = [*path, (node.key, node.value)]
                if node.rate_limit is not None:
                    out.append((here, node.rate_limit))
                walk(node.children, here)

        walk(self.root, [])
        return out


@dataclass(frozen=True, slots=True)
class Config:
    """A whole loaded config: domain name → rules."""

    domains: dict[str, DomainConfig]

    def limit_count(self) -> int:
        """How many limits (including unlimited ones) all domains hold."""
        return sum(len(d.limits()) for d in self.domains.values())
