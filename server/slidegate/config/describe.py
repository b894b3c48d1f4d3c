"""A config as text, one line per rule: what ``check-config`` prints and ``GET /rlconfig`` serves."""

from __future__ import annotations

import json

from slidegate.config.model import Config, DescriptorNode, RateLimit


def describe_config(config: Config) -> str:
    """``domain NAME (FILE):`` (and ``failure_mode: MODE`` when the domain sets one) then
    ``  [key=value, key2] LIMIT FLAGS`` for every rule, domains by name; a config over xDS first says its
    version (FILE is then the resource's name)."""
    if not config.loaded:
        return "no rate limit configuration loaded\n"
    lines = [f"xds version {config.version}"] if config.version else []
    for name, domain in sorted(config.domains.items()):
        mode = f" failure_mode: {domain.failure_mode}" if domain.failure_mode else ""
        lines.append(f"domain {name} ({domain.source}):{mode}")
        for path, rule in domain.rules():
            where = ", ".join(f"{node.key}={node.value}" if node.value is not None else node.key for node in path)
            lines.append(f"  [{where}] {describe_rule(rule)}")
    return "".join(f"{line}\n" for line in lines)


def describe_rule(rule: DescriptorNode) -> str:
    """``10/minute sliding_window_log name=x shadow_mode`` (or ``unlimited``, or ``no limit`` for a
    whitelist entry), with the rule's flags."""
    text = describe_limit(rule.rate_limit) if rule.rate_limit else "no limit"
    flags = [f for f in ("share_threshold", "shadow_mode", "quota_mode", "detailed_metric", "value_to_metric")
             if getattr(rule, f)]
    if rule.metadata:
        flags.append(f"metadata={json.dumps(rule.metadata, sort_keys=True)}")
    return " ".join([text, *flags])


def describe_limit(limit: RateLimit) -> str:
    """``10/minute sliding_window_log name=x`` (or ``unlimited``)."""
    if limit.unlimited or limit.unit is None:
        return "unlimited"
    unit = limit.unit.name.lower()
    per = unit if limit.unit_multiplier == 1 else f"{limit.unit_multiplier} {unit}s"
    text = f"{limit.requests_per_unit}/{per} {limit.algorithm.value}"
    if limit.burst is not None:
        text += f" burst={limit.burst}"
    if limit.name:
        text += f" name={limit.name}"
    if limit.replaces:
        text += f" replaces={','.join(limit.replaces)}"
    return text
