"""The limiter: which limits a request's descriptors hit, and the backend's all-or-nothing decision on them.

Transport-neutral: the gRPC service translates protobuf to ``Descriptor`` and ``Status`` back. Matching and
``replaces`` follow envoyproxy/ratelimit (see docs/configuration.md, "Matching").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from slidegate.algorithms import MAX_WINDOW_SECONDS, Algorithm
from slidegate.backends.base import Backend, BackendUnavailable, Check, Checks, DeadlineExceeded, Decision, Outcome
from slidegate.backends.memory import MemoryBackend
from slidegate.config.model import Config, DescriptorNode, RateLimit
from slidegate.failure_modes import FailureMode
from slidegate.keys import limit_key
from slidegate.units import Unit

UNLIMITED_REMAINING = 4294967295  # what envoyproxy/ratelimit reports for unlimited rules (uint32 max)


class InvalidOverride(ValueError):
    """A request's limit override that cannot be counted exactly (a window longer than config allows)."""


class NoConfigLoaded(Exception):
    """No config has come yet (an xDS config source started with FORCE_START_WITHOUT_INITIAL_CONFIG): every
    request is refused, as envoyproxy/ratelimit refuses it."""


@dataclass(frozen=True, slots=True)
class Override:
    """A request's own limit for a descriptor (Envoy's RateLimitOverride): ``requests_per_unit`` per
    ``unit_multiplier`` x ``unit``."""

    requests_per_unit: int
    unit: Unit
    unit_multiplier: int = 1


class Descriptor(NamedTuple):
    """A request descriptor: ordered (key, value) ``entries``; the descriptor's own ``hits_addend`` (None
    when unset; an explicit 0 means check only); ``negative``: give the hits back (is_negative_hits);
    ``override``: a limit that replaces the configured one."""

    entries: tuple[tuple[str, str], ...]
    hits_addend: int | None = None
    negative: bool = False
    override: Override | None = None


class Status(NamedTuple):
    """The answer for one descriptor. ``limit`` is None when no limit applies. ``over``: the limit had no
    room for the hits (even when that does not reject the request); ``shadow``: being over does not reject
    the request (the rule's shadow_mode); ``quota``: quota mode (the rule's quota_mode, or QUOTA_MODE), being
    over rejects the request only when all its quota limits are over; ``rule``: the matched config rule, if any.
    ``remaining`` is hits left (uint32 max for unlimited); ``reset_us`` microseconds until reset."""

    limit: RateLimit | None
    over: bool = False
    remaining: int = 0
    reset_us: int = 0
    shadow: bool = False
    rule: DescriptorNode | None = None
    quota: bool = False
    hits: int = 0


class Decided(NamedTuple):
    """A plan's statuses (one per descriptor, in order) and how the request was decided: ``degraded``, the
    failure mode that decided when the storage did not; ``late``: degraded because the caller's deadline was
    running out, not because the storage failed; ``cached``: answered from this process's memory of over-limit
    answers, not by the storage."""

    statuses: list[Status]
    degraded: FailureMode | None = None
    late: bool = False
    cached: bool = False


NO_LIMIT = Status(limit=None)
_tuple_new = tuple.__new__

# seconds before the caller's deadline that a failure mode other than error answers, when the storage has not:
# the backend's deadlines fire up to 4 ms late (backends/deadlines.py), and the answer must still be built and sent
ANSWER_MARGIN = 0.008


class Plan(NamedTuple):
    """A request matched against one config, ready to decide: ``statuses`` holds one Status per descriptor
    before the storage's answer (limit, rule and hits known), ``checks`` the limits to count and ``counted``
    the index in ``statuses`` of each. Valid while ``config`` is the current config (Limiter.is_current)."""

    config: Config
    domain: str
    statuses: tuple[Status, ...]
    checks: tuple[Check, ...]
    counted: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class LimiterOptions:
    """``key_prefix`` starts every storage key (CACHE_KEY_PREFIX); ``default_algorithm`` counts limits that
    come with the request (overrides); ``stop_when_over``: fixed windows do not count hits of over-limit
    requests (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT); ``shadow_mode``: no limit rejects anything, every
    limit is still evaluated and counted (SHADOW_MODE; the service reports the overall code as OK);
    ``quota_mode``: every limit but a shadow rule's is in quota mode (QUOTA_MODE, see Status);
    ``failure_mode`` (FAILURE_MODE, a domain's ``failure_mode`` wins) when the storage cannot decide:
    ``error`` raises BackendUnavailable (gRPC UNAVAILABLE: Envoy's failure_mode_deny decides), ``allow``
    answers OK, ``deny`` answers OVER_LIMIT, ``local`` decides in this process's memory with every limit
    divided by ``local_replicas`` (the number of slidegate replicas), until the storage answers again;
    ``domain_slot``: every key of a domain in one Redis Cluster slot (REDIS_HASH_TAG=domain)."""

    key_prefix: str = ""
    default_algorithm: Algorithm = Algorithm.SLIDING_WINDOW_LOG
    stop_when_over: bool = False
    shadow_mode: bool = False
    quota_mode: bool = False
    failure_mode: FailureMode = FailureMode.ERROR
    local_replicas: int = 1
    domain_slot: bool = False


class Limiter:
    """Decides requests against the config returned by ``config()`` (read once per request, so a reload
    swaps it atomically) using ``backend``.

    ``clock`` (microseconds since the epoch) replaces the backend's clock — for tests; production uses Redis
    TIME so every replica shares one clock.
    """

    def __init__(
        self,
        config: Callable[[], Config],
        backend: Backend,
        options: LimiterOptions = LimiterOptions(),
        *,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self._config = config
        self._backend = backend
        self._options = options
        self._clock = clock
        self._local: Backend | None = None

    def _match(self, domain: str, descriptor: Descriptor, config: Config) -> tuple[Status, str | None]:
        """The status skeleton for one descriptor and the storage key of its limit (None: not counted)."""
        domain_config = config.domains[domain]
        override = descriptor.override
        if override is not None:
            limit = RateLimit(override.requests_per_unit, override.unit, unit_multiplier=override.unit_multiplier,
                              algorithm=self._options.default_algorithm)
            # the same bounds as config: every algorithm counts exactly within them
            if limit.window_seconds > MAX_WINDOW_SECONDS:
                raise InvalidOverride(f"limit override window of {limit.window_seconds} s is longer than the "
                                      f"{MAX_WINDOW_SECONDS} s allowed")
            # an override is its own limit: it does not share a counter with the configured one
            identity = f"{limit.algorithm.value}/{override.requests_per_unit}/{limit.window_seconds}"
            return Status(limit, quota=self._options.quota_mode), limit_key(
                self._options.key_prefix, identity, domain, descriptor.entries, domain_slot=self._options.domain_slot)
        match = domain_config.match(descriptor.entries)
        if match is None or match.rule.rate_limit is None:
            return NO_LIMIT, None
        rule, limit = match.rule, match.rule.rate_limit
        if limit.unlimited:
            return Status(None, remaining=UNLIMITED_REMAINING, rule=rule), None
        # a shadow rule stays a shadow under QUOTA_MODE: it was never meant to reject anything
        quota = (rule.quota_mode or self._options.quota_mode) and not rule.shadow_mode
        key = limit_key(self._options.key_prefix, limit.algorithm.value, domain, match.key_entries,
                        domain_slot=self._options.domain_slot)
        return Status(limit, shadow=rule.shadow_mode, rule=rule, quota=quota), key

    def prepare(self, domain: str, descriptors: Sequence[Descriptor], hits_addend: int = 0) -> Plan:
        """Match ``descriptors`` against the current config: the Plan that ``decide`` carries out.
        ``hits_addend`` is the request-level value (0 ⇒ 1). Raises InvalidOverride for an override that
        cannot be counted."""
        config = self._config()
        if not config.loaded:
            raise NoConfigLoaded("no rate limit configuration loaded")
        if domain not in config.domains:
            return Plan(config, domain, (NO_LIMIT,) * len(descriptors), (), ())
        matched = [self._match(domain, d, config) for d in descriptors]
        # a matched limit's `replaces` (an unlimited one's too) drops every other matched limit of that name
        replaced = {name for status, _ in matched if status.rule and status.rule.rate_limit
                    for name in status.rule.rate_limit.replaces}
        default_hits = hits_addend or 1
        statuses: list[Status] = []
        checks: list[Check] = []
        counted: list[int] = []
        for index, (descriptor, (status, key)) in enumerate(zip(descriptors, matched, strict=True)):
            limit = status.limit
            if limit is not None and limit.name and limit.name in replaced:
                status, key = NO_LIMIT, None
            if limit is None or key is None:
                statuses.append(status)
                continue
            hits = default_hits if descriptor.hits_addend is None else descriptor.hits_addend
            if descriptor.negative:
                hits = -hits
            # built anew (_replace goes through every field by name): a matched limit's status has nothing else set yet
            statuses.append(Status(limit, shadow=status.shadow, rule=status.rule, quota=status.quota, hits=hits))
            checks.append(Check(
                key, limit.requests_per_unit, limit.window_seconds * 1_000_000, hits, limit.algorithm,
                burst=limit.burst, stop_when_over=self._options.stop_when_over,
                shadow=status.shadow or self._options.shadow_mode, quota=status.quota and not self._options.shadow_mode,
            ))
            counted.append(index)
        return Plan(config, domain, tuple(statuses), Checks(checks), tuple(counted))

    @property
    def shadow_mode(self) -> bool:
        """SHADOW_MODE: no limit rejects anything (the service answers OK overall)."""
        return self._options.shadow_mode

    def is_current(self, plan: Plan) -> bool:
        """Whether ``plan`` was matched against the config in force now (after a reload it must be redone)."""
        return plan.config is self._config()

    async def decide(self, plan: Plan, timeout: float | None = None) -> Decided:
        """One Status per descriptor of ``plan``, in order, and how they were decided; ``timeout`` (seconds)
        bounds the backend call.
        Raises BackendUnavailable when the backend cannot decide and the failure mode is ``error``, and
        DeadlineExceeded when ``timeout`` ran out first and the failure mode is ``error`` (or ``timeout`` is
        too short for any other to answer in it). Any other failure mode answers ``ANSWER_MARGIN`` seconds
        before ``timeout`` runs out, so that the caller (Envoy: its filter's timeout) still hears it."""
        statuses = list(plan.statuses)
        if not plan.checks:
            return _tuple_new(Decided, (statuses, None, False, False))
        now = self._clock() if self._clock else None
        mode = plan.config.domains[plan.domain].failure_mode or self._options.failure_mode
        answer_late = mode is not FailureMode.ERROR and timeout is not None and timeout > 2 * ANSWER_MARGIN
        degraded, late = None, False
        try:
            decision = await self._backend.decide(
                plan.checks, now, timeout - ANSWER_MARGIN if answer_late and timeout is not None else timeout)
        except DeadlineExceeded:
            if not answer_late:
                raise  # the caller has gone, or is about to: no failure mode answers it, the storage may be fine
            degraded, late = mode, True
            decision = await self._degraded(mode, plan.checks, now)
        except BackendUnavailable:
            if mode is FailureMode.ERROR:
                raise
            degraded = mode
            decision = await self._degraded(mode, plan.checks, now)
        for index, outcome in zip(plan.counted, decision.outcomes, strict=True):
            s = statuses[index]
            # built by position, as a tuple: _replace goes through every field by name, and the NamedTuple's own
            # __new__ is a Python function of eight arguments (a third of the cost), every decision
            statuses[index] = _tuple_new(Status, (s.limit, outcome.over, outcome.remaining, outcome.reset_us,
                                                  s.shadow, s.rule, s.quota, s.hits))
        return _tuple_new(Decided, (statuses, degraded, late, decision.cached))

    async def peek(self, plan: Plan, timeout: float | None = None) -> list[Status]:
        """``plan``'s statuses as the storage holds its limits now, counting nothing: each check with no hits
        (backends.base.Check), so ``over`` says a limit has no room left. Raises BackendUnavailable and
        DeadlineExceeded whatever the failure mode: no failure mode can say what the storage holds."""
        statuses = list(plan.statuses)
        if not plan.checks:
            return statuses
        now = self._clock() if self._clock else None
        decision = await self._backend.decide([c._replace(hits=0) for c in plan.checks], now, timeout)
        for index, outcome in zip(plan.counted, decision.outcomes, strict=True):
            statuses[index] = statuses[index]._replace(over=outcome.over, remaining=outcome.remaining,
                                                       reset_us=outcome.reset_us)
        return statuses

    async def should_rate_limit(
        self, domain: str, descriptors: Sequence[Descriptor], hits_addend: int = 0, timeout: float | None = None
    ) -> list[Status]:
        """``decide(prepare(domain, descriptors, hits_addend), timeout)``: one Status per descriptor, in order.
        Raises BackendUnavailable and InvalidOverride."""
        return (await self.decide(self.prepare(domain, descriptors, hits_addend), timeout)).statuses

    async def _degraded(self, mode: FailureMode, checks: Sequence[Check], now: int | None) -> Decision:
        """The decision of failure mode ``mode`` (allow, deny or local) for ``checks``."""
        if mode is FailureMode.ALLOW:
            return Decision(True, [Outcome(False, c.limit, 0) for c in checks])
        if mode is FailureMode.DENY:
            return Decision(False, [Outcome(c.hits > 0, 0, c.window_us) for c in checks])
        if self._local is None:
            self._local = MemoryBackend()
        share = max(1, self._options.local_replicas)

        def part(n: int) -> int:  # this replica's share, rounded up: a limit of 1 stays usable, 0 stays 0
            return -(-n // share)

        return await self._local.decide(
            [c._replace(limit=part(c.limit), burst=None if c.burst is None else part(c.burst))
             for c in checks], now)
