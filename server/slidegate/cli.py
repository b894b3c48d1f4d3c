"""The ``slidegate`` command: ``serve``, ``demo`` and ``check-config``.

Every option of ``serve`` can also be set through the environment variable shown in ``--help`` (names
follow envoyproxy/ratelimit where it has one).
"""

from __future__ import annotations

import logging
import re
import sys

import click

from slidegate import __version__
from slidegate.config import ConfigError, load_directory

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s)?\s*$")


def parse_duration(text: str) -> float:
    """``"250ms"``, ``"0.25s"`` or ``"0.25"`` (seconds) → seconds. Raises ValueError."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"invalid duration {text!r} (use e.g. 250ms or 0.25s)")
    value = float(match.group(1))
    return value / 1000 if match.group(2) == "ms" else value


class _Duration(click.ParamType):  # type: ignore[type-arg]  # generic only in newer click stubs
    name = "duration"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, float):
            return value
        try:
            seconds = parse_duration(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if seconds <= 0:
            self.fail("must be greater than zero", param, ctx)
        return seconds


@click.group(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.version_option(__version__, prog_name="slidegate")
def main() -> None:
    """slidegate: an Envoy-compatible global rate-limit service with sliding windows."""


@main.command()
@click.option("--config", "config_dir", required=True, envvar="CONFIG_DIR",
              type=click.Path(file_okay=False), help="Directory of rate-limit YAML files.")
@click.option("--redis-url", envvar="REDIS_URL", default="redis://127.0.0.1:6379/0",
              help="Redis to keep the counters in.")
@click.option("--host", envvar="GRPC_HOST", default="0.0.0.0", help="Address to listen on for gRPC.")
@click.option("--grpc-port", envvar="GRPC_PORT", default=8081, type=click.IntRange(0, 65535),
              help="gRPC port (0 picks a free one).")
@click.option("--redis-timeout", envvar="REDIS_TIMEOUT", default="250ms", type=_Duration(),
              help="Time allowed for one Redis decision before answering UNAVAILABLE.")
@click.option("--cache-key-prefix", envvar="CACHE_KEY_PREFIX", default="", help="Prefix of every Redis key.")
@click.option("--log-level", envvar="LOG_LEVEL", default="info",
              type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False))
def serve(
    config_dir: str, redis_url: str, host: str, grpc_port: int, redis_timeout: float,
    cache_key_prefix: str, log_level: str,
) -> None:
    """Serve envoy.service.ratelimit.v3.RateLimitService over gRPC until SIGTERM."""
    from slidegate.server import ServeOptions, run

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    options = ServeOptions(
        config_dir=config_dir, redis_url=redis_url, host=host, grpc_port=grpc_port,
        redis_timeout=redis_timeout, key_prefix=cache_key_prefix,
    )
    try:
        run(options)
    except ConfigError as exc:
        click.echo(f"invalid config in {config_dir}:\n{exc}", err=True)
        sys.exit(1)
    except OSError as exc:
        click.echo(f"cannot start: {exc}", err=True)
        sys.exit(1)


@main.command("check-config")
@click.argument("config_dir", type=click.Path(file_okay=False))
def check_config(config_dir: str) -> None:
    """Validate a config directory offline: print every error, or a summary of what loads."""
    try:
        config = load_directory(config_dir)
    except ConfigError as exc:
        for issue in exc.issues:
            click.echo(str(issue), err=True)
        click.echo(f"{len(exc.issues)} error(s)", err=True)
        sys.exit(1)
    for name, domain in sorted(config.domains.items()):
        click.echo(f"domain {name} ({domain.source}):")
        for path, limit in domain.limits():
            where = ", ".join(f"{k}={v}" if v is not None else k for k, v in path)
            if limit.unlimited:
                what = "unlimited"
            else:
                assert limit.unit is not None
                what = f"{limit.requests_per_unit}/{limit.unit.name.lower()}"
            named = f" name={limit.name}" if limit.name else ""
            click.echo(f"  [{where}] {what}{named}")
    click.echo(f"OK: {len(config.domains)} domain(s), {config.limit_count()} limit(s)")


@main.command()
@click.option("--redis-url", envvar="REDIS_URL", default="redis://127.0.0.1:6379/0",
              help="Redis the demo's slidegate uses (its keys get a fresh prefix each run).")
def demo(redis_url: str) -> None:
    """Start slidegate, a demo upstream and Envoy; send traffic through Envoy; show what each request got."""
    from slidegate.demo import run_demo

    sys.exit(run_demo(redis_url))
