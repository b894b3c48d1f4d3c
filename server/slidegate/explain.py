"""Explain a request without deciding it: for each descriptor the rule it matched and why, where that rule was
defined, what the storage holds for its limit now (used, remaining, when it resets) and what ShouldRateLimit
would answer now. Nothing is counted: each limit is read with a check of no hits (backends.base.Check), through
the same limiter, keys and storage as a decision (the over-limit cache included)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from slidegate.backends.base import admits
from slidegate.config.model import DescriptorNode, RateLimit
from slidegate.limiter import Descriptor, Limiter, Plan, Status
from slidegate.rule_names import rule_name


class Why(Enum):
    """How a descriptor came to its limit (or to none)."""

    EXACT = "exact value"  # its last entry's value is the rule's
    WILDCARD = "wildcard"  # the rule's value is a pattern with *
    DEFAULT = "default"  # the rule names the key only: any value
    OVERRIDE = "override"  # the request carried its own limit
    UNLIMITED = "unlimited"
    REPLACED = "replaced"  # another matched rule's `replaces` dropped its limit
    WHITELISTED = "no limit"  # the rule matched has no rate_limit
    NO_RULE = "no rule"
    NO_DOMAIN = "no such domain"


@dataclass(frozen=True, slots=True)
class Explained:
    """One descriptor: ``why`` it has its limit, ``rule`` the rule matched (None for none or an override),
    ``replaced_by`` the rule whose ``replaces`` dropped it, ``status`` what the storage holds now (its ``over``:
    the descriptor would be over limit with its hits), ``shadow`` whether being over rejects nothing."""

    descriptor: Descriptor
    why: Why
    rule: DescriptorNode | None
    replaced_by: DescriptorNode | None
    status: Status


@dataclass(frozen=True, slots=True)
class Explanation:
    """A request's explanation: each descriptor's, in order, and ``rejected``: what ShouldRateLimit would answer
    overall now (under SHADOW_MODE, never)."""

    domain: str
    descriptors: list[Explained]
    rejected: bool

    def as_json(self) -> dict[str, Any]:
        return {"domain": self.domain, "overallCode": "OVER_LIMIT" if self.rejected else "OK",
                "descriptors": [_described(e) for e in self.descriptors]}


async def explain(limiter: Limiter, domain: str, descriptors: Sequence[Descriptor], hits_addend: int = 0,
                  timeout: float | None = None) -> Explanation:
    """The explanation of a validated request. Raises InvalidOverride, NoConfigLoaded, and BackendUnavailable
    when the storage does not answer (no failure mode stands in: the point is what the storage holds)."""
    plan = limiter.prepare(domain, descriptors, hits_addend)
    peeked = await limiter.peek(plan, timeout)
    statuses = _predicted(plan, peeked)
    domain_config = plan.config.domains.get(domain)
    matched = [None if domain_config is None or d.override is not None else domain_config.match(d.entries)
               for d in descriptors]
    replacing = [m.rule for m in matched if m is not None and m.rule.rate_limit and m.rule.rate_limit.replaces]
    explained = []
    for descriptor, match, status in zip(descriptors, matched, statuses, strict=True):
        rule = None if match is None else match.rule
        replaced_by = _replaced_by(rule, replacing)
        why = _why(domain_config is not None, descriptor, rule, replaced_by)
        explained.append(Explained(descriptor, why, rule, replaced_by, status))
    rejected = not limiter.shadow_mode and any(s.over for s in statuses) and not admits(
        statuses, [s.over for s in statuses])
    return Explanation(domain, explained, rejected)


def _predicted(plan: Plan, peeked: list[Status]) -> list[Status]:
    """``peeked`` as read (no hits), each ``over`` what its hits would meet now. A limit named twice (two
    descriptors, one key) is decided on one state, in order, as ShouldRateLimit decides it (lua/decide.lua):
    each descriptor meets the hits its earlier ones took from it — all of them when its algorithm counts denied
    hits, the admitted ones otherwise."""
    statuses = list(peeked)
    taken: dict[str, int] = {}  # key -> hits the earlier descriptors of this request took from its limit
    for index, check in zip(plan.counted, plan.checks, strict=True):
        status = statuses[index]
        before = taken.get(check.key, 0)
        over = status.hits > 0 and before + status.hits > status.remaining
        if not over or check.counts_denied():
            # hits given back free at most what the storage holds
            taken[check.key] = max(before + status.hits, status.remaining - check.most_hits())
        statuses[index] = status._replace(over=over)
    return statuses


def _replaced_by(rule: DescriptorNode | None, replacing: list[DescriptorNode]) -> DescriptorNode | None:
    limit = None if rule is None else rule.rate_limit
    if limit is None or not limit.name:
        return None
    return next((r for r in replacing if r.rate_limit and limit.name in r.rate_limit.replaces), None)


def _why(known_domain: bool, descriptor: Descriptor, rule: DescriptorNode | None,
         replaced_by: DescriptorNode | None) -> Why:
    if not known_domain:
        return Why.NO_DOMAIN
    if descriptor.override is not None:
        return Why.OVERRIDE
    if rule is None:
        return Why.NO_RULE
    if rule.rate_limit is None:
        return Why.WHITELISTED
    if replaced_by is not None:
        return Why.REPLACED
    if rule.rate_limit.unlimited:
        return Why.UNLIMITED
    if rule.pattern is not None:
        return Why.WILDCARD
    return Why.DEFAULT if rule.value is None else Why.EXACT


def _described(explained: Explained) -> dict[str, Any]:
    status, rule = explained.status, explained.rule
    described: dict[str, Any] = {
        "entries": [{"key": k, "value": v} for k, v in explained.descriptor.entries],
        "why": explained.why.value,
    }
    if rule is not None:
        described["rule"] = {"name": rule_name(rule), "source": rule.source, "shadowMode": rule.shadow_mode,
                             "quotaMode": rule.quota_mode}
        if rule.rate_limit is not None:
            described["rule"]["limit"] = _limit(rule.rate_limit)
    if explained.replaced_by is not None:
        described["replacedBy"] = {"name": rule_name(explained.replaced_by), "source": explained.replaced_by.source}
    limit = status.limit
    if limit is not None and limit.unit is not None:
        if explained.why is Why.OVERRIDE:
            described["limit"] = _limit(limit)
        described.update(used=max(limit.requests_per_unit - status.remaining, 0), remaining=status.remaining,
                         resetSeconds=round(status.reset_us / 1_000_000, 3), hits=status.hits,
                         code="OVER_LIMIT" if status.over and not status.shadow else "OK", over=status.over)
    return described


def _limit(limit: RateLimit) -> dict[str, Any]:
    shown: dict[str, Any] = {"unlimited": True} if limit.unlimited else {
        "requestsPerUnit": limit.requests_per_unit, "unit": limit.unit.name if limit.unit else None,
        "unitMultiplier": limit.unit_multiplier, "algorithm": limit.algorithm.value}
    if limit.name:
        shown["name"] = limit.name
    return shown
