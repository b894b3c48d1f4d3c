"""The ``slidegate`` command: ``serve``, ``demo`` and ``check-config``.

Every option of ``serve`` can also be set through the environment variable shown in ``--help`` (names
follow envoyproxy/ratelimit where it has one).
"""

from __future__ import annotations

import functools
import json
import logging
import re
import sys

import click

from slidegate import __version__
from slidegate.algorithms import Algorithm
from slidegate.config import ConfigError, DescriptorNode, LoadOptions, RateLimit, load_directory

# every option of slidegate's commands also reads the environment variable --help shows
option = functools.partial(click.option, show_envvar=True)
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(us|ms|s|m|h)?\s*$")
_SECONDS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str) -> float:
    """``"250ms"``, ``"0.25s"``, ``"1m"`` (Go-style units us, ms, s, m, h) or ``"0.25"`` (seconds) →
    seconds. Raises ValueError."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"invalid duration {text!r} (use e.g. 250ms or 0.25s)")
    return float(match.group(1)) * _SECONDS[match.group(2)]


class _Duration(click.ParamType):  # type: ignore[type-arg]  # generic only in newer click stubs
    name = "duration"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, float):
            return value
        try:
            seconds = parse_duration(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if not 0 < seconds <= 60:
            self.fail("must be more than 0 and at most 60 s", param, ctx)
        return seconds


@click.group(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.version_option(__version__, prog_name="slidegate")
def main() -> None:
    """slidegate: an Envoy-compatible global rate-limit service with sliding windows."""


@main.command()
@option("--config", "config_dir", required=True, envvar="CONFIG_DIR",
              type=click.Path(file_okay=False), help="Directory of rate-limit YAML files.")
@option("--backend", envvar="BACKEND_TYPE", default="redis", type=click.Choice(["redis", "memory"]),
              help="Where counters live: Redis (shared by replicas) or this process's memory.")
@option("--redis-url", envvar="REDIS_URL", default="redis://127.0.0.1:6379/0",
              help="Redis to keep the counters in.")
@option("--redis-pool-size", envvar="REDIS_POOL_SIZE", default=64, type=click.IntRange(1, 10_000),
              help="Redis connections at most; calls beyond wait for one (within the Redis timeout).")
@option("--redis-timeout", envvar="REDIS_TIMEOUT", default="250ms", type=_Duration(),
              help="Time allowed for one Redis decision before answering UNAVAILABLE.")
@option("--host", envvar="GRPC_HOST", default="0.0.0.0", help="Address to listen on for gRPC.")
@option("--grpc-port", envvar="GRPC_PORT", default=8081, type=click.IntRange(0, 65535),
              help="gRPC port (0 picks a free one).")
@option("--cache-key-prefix", envvar="CACHE_KEY_PREFIX", default="", help="Prefix of every Redis key.")
@option("--default-algorithm", envvar="DEFAULT_ALGORITHM", default=Algorithm.SLIDING_WINDOW_LOG.value,
              type=click.Choice([a.value for a in Algorithm]), help="Algorithm of limits that name none.")
@option("--merge-domain-config/--no-merge-domain-config", envvar="MERGE_DOMAIN_CONFIG", default=False,
              help="Let several files add descriptors to one domain.")
@option("--shadow-mode/--no-shadow-mode", envvar="SHADOW_MODE", default=False,
              help="Evaluate and count every limit but answer OK overall (descriptors keep their codes).")
@option("--stop-cache-key-increment-when-overlimit/--no-stop-cache-key-increment-when-overlimit",
              envvar="STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", default=False,
              help="fixed_window: do not count hits of requests that are over limit.")
@option("--response-dynamic-metadata/--no-response-dynamic-metadata", envvar="RESPONSE_DYNAMIC_METADATA",
              default=False, help="Describe the request and matched rules' metadata in dynamic_metadata.")
@option("--log-level", envvar="LOG_LEVEL", default="info",
              type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False))
def serve(
    config_dir: str, backend: str, redis_url: str, redis_pool_size: int, redis_timeout: float, host: str,
    grpc_port: int, cache_key_prefix: str, default_algorithm: str, merge_domain_config: bool, shadow_mode: bool,
    stop_cache_key_increment_when_overlimit: bool, response_dynamic_metadata: bool, log_level: str,
) -> None:
    """Serve envoy.service.ratelimit.v3.RateLimitService over gRPC until SIGTERM."""
    from slidegate.server import ServeOptions, run

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    options = ServeOptions(
        config_dir=config_dir, backend=backend, redis_url=redis_url, redis_pool_size=redis_pool_size,
        host=host, grpc_port=grpc_port, redis_timeout=redis_timeout, key_prefix=cache_key_prefix,
        default_algorithm=Algorithm(default_algorithm), merge_domain_config=merge_domain_config,
        shadow_mode=shadow_mode, stop_when_over=stop_cache_key_increment_when_overlimit,
        response_dynamic_metadata=response_dynamic_metadata,
    )
    try:
        run(options)
    except ConfigError as exc:
        click.echo(f"invalid config in {config_dir}:\n{exc}", err=True)
        sys.exit(1)
    except ValueError as exc:
        click.echo(f"invalid setting: {exc}", err=True)
        sys.exit(1)
    except OSError as exc:
        click.echo(f"cannot start: {exc}", err=True)
        sys.exit(1)


@main.command("check-config")
@click.argument("config_dir", type=click.Path(file_okay=False))
@option("--default-algorithm", envvar="DEFAULT_ALGORITHM", default=Algorithm.SLIDING_WINDOW_LOG.value,
              type=click.Choice([a.value for a in Algorithm]), help="Algorithm of limits that name none.")
@option("--merge-domain-config/--no-merge-domain-config", envvar="MERGE_DOMAIN_CONFIG", default=False,
              help="Let several files add descriptors to one domain.")
def check_config(config_dir: str, default_algorithm: str, merge_domain_config: bool) -> None:
    """Validate a config directory offline: print every error, or a summary of what loads."""
    try:
        config = load_directory(config_dir, LoadOptions(merge_domain_config, Algorithm(default_algorithm)))
    except ConfigError as exc:
        for issue in exc.issues:
            click.echo(str(issue), err=True)
        click.echo(f"{len(exc.issues)} error(s)", err=True)
        sys.exit(1)
    if not config.domains:
        click.echo(f"warning: no domain in {config_dir} (no *.yaml or *.yml files)", err=True)
    for name, domain in sorted(config.domains.items()):
        click.echo(f"domain {name} ({domain.source}):")
        for path, rule in domain.rules():
            where = ", ".join(f"{node.key}={node.value}" if node.value is not None else node.key for node in path)
            click.echo(f"  [{where}] {describe_rule(rule)}")
    click.echo(f"OK: {len(config.domains)} domain(s), {config.limit_count()} limit(s)")


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


@main.command()
@option("--redis-url", envvar="REDIS_URL", default="redis://127.0.0.1:6379/0",
              help="Redis the demo's slidegate uses (its keys get a fresh prefix each run).")
def demo(redis_url: str) -> None:
    """Start slidegate, a demo upstream and Envoy; send traffic through Envoy; show what each request got."""
    from slidegate.demo import run_demo

    sys.exit(run_demo(redis_url))
