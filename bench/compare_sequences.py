"""The hand-written sequences of bench/compare.py: each a config of its own domain (the sequence's name) and the
requests sent to both servers in order, covering the config language (nested descriptors, wildcards, replaces,
shadow mode, unlimited, quota mode, share_threshold, metadata) and the protocol (hits_addend, a descriptor's own
hits_addend and limit, unknown domains, empty and many descriptors, values with separators, long values, /json)."""

from __future__ import annotations

from bench.compare_model import Descriptor, Request, Scenario, ask


def _limit(key: str, rpu: int, unit: str = "minute", value: str = "", extra: str = "") -> str:
    value_line = f"\n    value: {value!r}" if value else ""
    return f"""
  - key: {key}{value_line}
    rate_limit: {{unit: {unit}, requests_per_unit: {rpu}}}{extra}"""


def _seq(name: str, descriptors: str, requests: list[Request], note: str = "", deliberate: str = "") -> Scenario:
    return Scenario(name, f"domain: {name}\ndescriptors:{descriptors}\n", requests, note, deliberate)


def _repeat(request: Request, times: int) -> list[Request]:
    return [request] * times


def _many(name: str, *descriptors: tuple[tuple[str, str], ...], hits: int = 0, via: str = "grpc") -> Request:
    return Request(name, tuple(Descriptor(d) for d in descriptors), hits, via)


def basics() -> list[Scenario]:
    """One limit per unit, counted past its limit, over gRPC and /json."""
    out = []
    for unit, rpu in (("second", 2), ("minute", 3), ("hour", 4), ("day", 2), ("week", 2), ("month", 2), ("year", 2)):
        name = f"basic_{unit}"
        out.append(_seq(name, _limit("k", rpu, unit), _repeat(ask(name, ("k", "v")), rpu + 2), f"{rpu}/{unit}"))
    for rpu in (0, 1):
        name = f"limit_{rpu}"
        out.append(_seq(name, _limit("k", rpu), _repeat(ask(name, ("k", "v")), 3), f"requests_per_unit {rpu}"))
    name = "json_basic"
    out.append(_seq(name, _limit("k", 2), _repeat(ask(name, ("k", "v"), via="json"), 4), "POST /json"))
    name = "json_mixed"
    out.append(_seq(name, _limit("k", 3), [ask(name, ("k", "v")), ask(name, ("k", "v"), via="json")] * 3,
                    "gRPC and /json share the counter"))
    name = "named_limit"
    out.append(_seq(name, "\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2, name: mine}",
                    _repeat(ask(name, ("k", "v")), 3), "a limit's name in current_limit"))
    return out


def matching() -> list[Scenario]:
    """Which limit a descriptor finds: values, defaults, nesting, wildcards, unknown keys."""
    name = "value_and_default"
    specific = _limit("k", 1, value="special") + _limit("k", 3)
    out = [_seq(name, specific, [ask(name, ("k", "special")), ask(name, ("k", "special")), ask(name, ("k", "a")),
                                    ask(name, ("k", "b")), ask(name, ("k", "a")), ask(name, ("k", "a")),
                                    ask(name, ("k", "a"))], "a value's limit and the key's default")]
    name = "nested"
    nested = """
  - key: a
    value: x
    descriptors:
      - key: b
        rate_limit: {unit: minute, requests_per_unit: 2}
      - key: c
        value: z
        rate_limit: {unit: hour, requests_per_unit: 1}"""
    out.append(_seq(name, nested, [ask(name, ("a", "x"), ("b", "1")), ask(name, ("a", "x"), ("b", "2")),
                                      ask(name, ("a", "x"), ("b", "1")), ask(name, ("a", "x"), ("b", "1")),
                                      ask(name, ("a", "x")), ask(name, ("a", "y"), ("b", "1")),
                                      ask(name, ("a", "x"), ("c", "z")), ask(name, ("a", "x"), ("c", "z")),
                                      ask(name, ("a", "x"), ("c", "q")), ask(name, ("b", "1"), ("a", "x"))],
                       "nested descriptors; the parent alone, another value, the order of entries"))
    name = "parent_and_child"
    both = """
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 1}
    descriptors:
      - key: b
        rate_limit: {unit: minute, requests_per_unit: 3}"""
    out.append(_seq(name, both, [ask(name, ("a", "1")), ask(name, ("a", "1")), ask(name, ("a", "1"), ("b", "2")),
                                    ask(name, ("a", "1"), ("b", "2")), ask(name, ("a", "1"), ("b", "2")),
                                    ask(name, ("a", "1"), ("b", "2")), ask(name, ("a", "1"), ("b", "2"), ("c", "3"))],
                       "a limit on the parent and on the child: the deepest match"))
    name = "deep"
    deep = "".join(f"\n{'  ' * (2 * i)}  - key: l{i}\n{'  ' * (2 * i)}    descriptors:" for i in range(4))
    deep += f"\n{'  ' * 8}  - key: l4\n{'  ' * 8}    rate_limit: {{unit: hour, requests_per_unit: 2}}"
    entries = tuple((f"l{i}", str(i)) for i in range(5))
    out.append(_seq(name, deep, [ask(name, *entries)] * 3 + [ask(name, *entries[:4])], "five levels of nesting"))
    name = "unknown_key"
    out.append(_seq(name, _limit("k", 1), [ask(name, ("other", "v")), ask(name, ("other", "v")),
                                              ask(name, ("k", "v"), ("extra", "e")), ask(name, ("k", "v"))],
                       "a key without a limit, and extra entries past a leaf"))
    name = "empty_value"
    out.append(_seq(name, _limit("k", 2), [ask(name, ("k", ""))] * 3, "an entry with an empty value"))
    return out


def wildcards() -> list[Scenario]:
    """Wildcard values, before a key's default, each value counted apart unless share_threshold."""
    out = []
    for pattern, values in (("/api/*", ["/api/x", "/api/y", "/api/", "/apix", "/other", "/api/x/y"]),
                            ("*", ["", "a", "*"]), ("foo*bar", ["foobar", "foo-bar", "foobarx", "xfoobar"]),
                            ("a*b*c", ["abc", "a1b2c", "acb"])):
        name = "wildcard_" + "".join(c if c.isalnum() else "_" for c in pattern)
        requests = [ask(name, ("path", v)) for v in values for _ in range(2)]
        out.append(_seq(name, _limit("path", 1, value=pattern) + _limit("path", 5), requests,
                           f"wildcard {pattern!r} before the key's default"))
    name = "share_threshold"
    shared = _limit("path", 2, value="/api/*", extra="\n    share_threshold: true")
    out.append(_seq(name, shared, [ask(name, ("path", f"/api/{i}")) for i in range(4)],
                       "share_threshold: every value of the wildcard counts on one counter"))
    name = "not_shared"
    out.append(_seq(name, _limit("path", 2, value="/api/*"),
                       [ask(name, ("path", f"/api/{i % 2}")) for i in range(5)],
                       "without share_threshold each value counts on its own"))
    return out


def modes() -> list[Scenario]:
    """replaces, shadow mode, unlimited, quota mode, metadata."""
    out = []
    name = "replaces"
    replaces = """
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1, name: per_user}
  - key: vip
    rate_limit: {unit: minute, requests_per_unit: 3, replaces: [{name: per_user}]}"""
    out.append(_seq(name, replaces, [_many(name, (("user", "u"),), (("vip", "v"),))] * 4 +
                    [ask(name, ("user", "u")), ask(name, ("user", "u"))], "a limit replacing a named one"))
    name = "replaces_unlimited"
    out.append(_seq(name, """
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1, name: per_user}
  - key: admin
    rate_limit: {unlimited: true, replaces: [{name: per_user}]}""",
                    [_many(name, (("user", "u"),), (("admin", "a"),))] * 3 + [ask(name, ("user", "u"))] * 2,
                    "an unlimited descriptor replacing a limit"))
    name = "shadow"
    out.append(_seq(name, _limit("k", 1, extra="\n    shadow_mode: true"), _repeat(ask(name, ("k", "v")), 3),
                    "shadow_mode: over limit, answered OK"))
    name = "shadow_and_real"
    out.append(_seq(name, _limit("s", 1, extra="\n    shadow_mode: true") + _limit("r", 2),
                    [_many(name, (("s", "1"),), (("r", "1"),))] * 4, "a shadow limit beside a real one"))
    name = "unlimited"
    out.append(_seq(name, "\n  - key: k\n    rate_limit: {unlimited: true}" + _limit("l", 1),
                    [ask(name, ("k", "v"))] * 2 + [_many(name, (("k", "v"),), (("l", "v"),))] * 3,
                    "unlimited, alone and beside a limit"))
    name = "quota_one"
    out.append(_seq(name, _limit("q", 1, extra="\n    quota_mode: true") + _limit("r", 5),
                    [_many(name, (("q", "1"),), (("r", "1"),))] * 3 + [ask(name, ("q", "1"))] * 2,
                    "quota_mode: an over quota beside a limit with room; a quota alone"))
    name = "quota_two"
    quota = "\n    quota_mode: true"
    out.append(_seq(name, _limit("q", 1, extra=quota) + _limit("p", 2, extra=quota),
                    [_many(name, (("q", "1"),), (("p", "1"),))] * 4, "two quotas: over when every one is over"))
    name = "quota_beside_nothing"
    out.append(_seq(name, _limit("q", 1, extra=quota) + "\n  - key: free\n    rate_limit: {unlimited: true}",
                    [_many(name, (("q", "1"),), (("other", "1"),))] * 3 + [_many(name, (("q", "1"),), (("free", "1"),))]
                    + [ask(name, ("q", "1"))] * 2, "an over quota beside a descriptor with no limit, or unlimited"))
    name = "quota_and_over"
    out.append(_seq(name, _limit("q", 3, extra="\n    quota_mode: true") + _limit("r", 1),
                    [_many(name, (("q", "1"),), (("r", "1"),))] * 3, "a quota with room beside a limit over"))
    name = "metadata"
    out.append(_seq(name, _limit("k", 2, extra="\n    metadata: {team: payments, tier: {level: 1}}") +
                    _limit("j", 5, extra="\n    metadata: {team: search, other: x}"),
                    [_many(name, (("k", "1"),), (("j", "1"),))] * 3 + [ask(name, ("k", "1"))],
                    "a limit's metadata in the dynamic metadata of passed descriptors"))
    name = "detailed"
    out.append(_seq(name, _limit("k", 2, extra="\n    detailed_metric: true") +
                    _limit("m", 2, extra="\n    value_to_metric: true"),
                    [ask(name, ("k", "a")), ask(name, ("m", "b"))] * 3, "detailed_metric, value_to_metric"))
    return out


def protocol() -> list[Scenario]:
    """hits_addend, descriptors' own hits and limits, domains and descriptors out of the ordinary."""
    out = []
    for hits in (0, 1, 3, 7, 4294967295):
        name = f"hits_{hits}"
        out.append(_seq(name, _limit("k", 5), [ask(name, ("k", "v"), hits=hits)] * 3, f"hits_addend {hits}"))
    name = "own_hits"
    own = Request(name, (Descriptor((("k", "v"),), 2), Descriptor((("j", "v"),), 0), Descriptor((("i", "v"),))), 3)
    out.append(_seq(name, _limit("k", 5) + _limit("j", 5) + _limit("i", 5), [own] * 3,
                    "a descriptor's own hits_addend (2, 0) beside the request's (3)"))
    name = "override"
    over = Request(name, (Descriptor((("k", "v"),), limit=(2, "MINUTE")),))
    out.append(_seq(name, _limit("k", 5), [over] * 3 + [ask(name, ("k", "v"))] * 2,
                    "Envoy's limit override on a descriptor (2/minute over the config's 5)"))
    name = "unknown_domain"
    out.append(Scenario(name, f"domain: {name}_known\ndescriptors:{_limit('k', 1)}\n",
                        [ask("no_such_domain", ("k", "v"))] * 2 + [ask("", ("k", "v"))],
                        "an unknown and an empty domain"))
    name = "no_descriptors"
    empty = Descriptor(())
    out.append(_seq(name, _limit("k", 1), [Request(name, ()), Request(name, (), via="json"), Request(name, (empty,)),
                                           Request(name, (empty,), via="json"),
                                           Request(name, (Descriptor((("", ""),)),))],
                    "no descriptors; a descriptor with no entries; an empty key"))
    name = "many"
    out.append(_seq(name, _limit("k", 30) + _limit("j", 10),
                    [Request(name, tuple(Descriptor((("k", str(i)),)) for i in range(20)) +
                             tuple(Descriptor((("j", "x"),)) for _ in range(3)))] * 5,
                    "23 descriptors, 3 of them the same"))
    name = "duplicates"
    out.append(_seq(name, _limit("k", 3), [_many(name, (("k", "v"),), (("k", "v"),))] * 3,
                    "the same descriptor twice in a request"))
    name = "all_or_nothing"
    out.append(_seq(name, _limit("a", 1) + _limit("b", 3),
                    [_many(name, (("a", "1"),), (("b", "1"),))] * 4 + [ask(name, ("b", "1"))] * 2,
                    "one descriptor over: what the other counts"))
    name = "mixed_units"
    out.append(_seq(name, _limit("s", 5, "second") + _limit("m", 3) + _limit("h", 2, "hour"),
                    [_many(name, (("s", "1"),), (("m", "1"),), (("h", "1"),))] * 4, "three units in one request"))
    return out


def values() -> list[Scenario]:
    """Values with the reference's separators, long values, other scripts."""
    out = []
    name = "separators"
    out.append(_seq(name, """
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
    descriptors:
      - key: id
        rate_limit: {unit: minute, requests_per_unit: 2}""",
                    [ask(name, ("user", "a_id_b")), ask(name, ("user", "a"), ("id", "b")),
                     ask(name, ("user", "a_id_b")), ask(name, ("user", "a"), ("id", "b"))],
                    "(user, a_id_b) and (user, a), (id, b): one key in the reference", "injective keys"))
    for i, value in enumerate(("a:b", "a_b", "a:b_c:", "_", ":", "a b", "ü→€", "x" * 1000, "y" * 20000)):
        name = f"value_{i}"
        out.append(_seq(name, _limit("k", 2), [ask(name, ("k", value))] * 3, f"a value {value[:16]!r} ({len(value)})"))
    name = "colon_key"
    out.append(_seq(name, _limit("k:x", 1) + _limit("k_x", 2), [ask(name, ("k:x", "v")), ask(name, ("k:x", "v")),
                                                                ask(name, ("k_x", "v")), ask(name, ("k_x", "v"))],
                    "keys with separators in them"))
    name = "prefix_collision"
    out.append(_seq(name, _limit("a", 2) + "\n  - key: a_b\n    rate_limit: {unit: minute, requests_per_unit: 2}",
                    [ask(name, ("a", "b_c")), ask(name, ("a_b", "c")), ask(name, ("a", "b_c"))],
                    "(a, b_c) and (a_b, c): one key in the reference", "injective keys"))
    return out


def _reload(name: str, descriptors: str) -> Request:
    return Request(name, (), via="reload", config=f"domain: {name}\ndescriptors:{descriptors}\n")


def reloads() -> list[Scenario]:
    """The config changed between requests: a limit raised, a limit removed, a file that does not load."""
    out = []
    name = "reload_raise"
    out.append(_seq(name, _limit("k", 2), [ask(name, ("k", "v"))] * 3 + [_reload(name, _limit("k", 4))]
                    + [ask(name, ("k", "v"))] * 3, "a limit raised from 2 to 4 after 3 hits"))
    name = "reload_unit"
    out.append(_seq(name, _limit("k", 2), [ask(name, ("k", "v"))] * 2 + [_reload(name, _limit("k", 2, "hour"))]
                    + [ask(name, ("k", "v"))] * 2, "the same limit moved from a minute to an hour"))
    name = "reload_remove"
    out.append(_seq(name, _limit("k", 1) + _limit("j", 1), [_many(name, (("k", "v"),), (("j", "v"),))] * 2
                    + [_reload(name, _limit("j", 1))] + [_many(name, (("k", "v"),), (("j", "v"),))] * 2,
                    "a limit removed"))
    name = "reload_broken"
    out.append(_seq(name, _limit("k", 2), [ask(name, ("k", "v"))] * 2
                    + [Request(name, (), via="reload", config=f"domain: {name}\ndescriptors: [{{key: k, rate_limit: "
                               "{unit: fortnight, requests_per_unit: 1}}]\n")]
                    + [ask(name, ("k", "v"))] * 2 + [_reload(name, _limit("k", 5))] + [ask(name, ("k", "v"))] * 2,
                    "a file that does not load (the old config stays), then a good one"))
    return out


def hand_written() -> list[Scenario]:
    return [*basics(), *matching(), *wildcards(), *modes(), *protocol(), *values(), *reloads()]
