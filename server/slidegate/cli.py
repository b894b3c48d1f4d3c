"""The ``slidegate`` command: ``serve``, ``check-config``, ``demo``.

``serve`` takes every setting of slidegate.settings as a flag or as the environment variable ``--help`` shows
(names follow envoyproxy/ratelimit where it has one).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import click

from slidegate import __version__
from slidegate.algorithms import Algorithm
from slidegate.config import ConfigError, LoadOptions, load_directory
from slidegate.config.describe import describe_config
from slidegate.logs import configure_logging
from slidegate.settings import SPECS, Settings, SettingsError

_ENV_NOTE = "Every setting can also be given by the environment variable shown; a flag wins over it."


def settings_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add a flag for every setting (slidegate.settings.SPECS) to ``command``."""
    for spec in reversed(SPECS):
        default = spec.default or "empty"
        command = click.option(spec.flag, spec.field, default=None, metavar="TEXT",
                               help=f"{spec.help}  [env: {spec.env}; default: {default}]")(command)
    return command


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120})
@click.version_option(__version__, prog_name="slidegate")
def main() -> None:
    """slidegate: an Envoy-compatible global rate-limit service with sliding windows."""


@main.command(epilog=_ENV_NOTE)
@settings_options
def serve(**flags: str | None) -> None:
    """Serve envoy.service.ratelimit.v3.RateLimitService over gRPC (and HTTP) until SIGTERM."""
    from slidegate.server import run

    try:
        settings = Settings.load(os.environ, flags)
    except SettingsError as exc:
        click.echo(str(exc), err=True)
        sys.exit(2)
    configure_logging(settings.log_level, settings.log_format)
    try:
        run(settings)
    except ConfigError as exc:
        click.echo(f"invalid config in {settings.config_path}:\n{exc}", err=True)
        sys.exit(1)
    except ValueError as exc:
        click.echo(f"invalid setting: {exc}", err=True)
        sys.exit(1)
    except OSError as exc:
        click.echo(f"cannot start: {exc}", err=True)
        sys.exit(1)


@main.command("check-config")
@click.argument("config_dir", type=click.Path(file_okay=False))
@click.option("--default-algorithm", envvar="DEFAULT_ALGORITHM", default=Algorithm.SLIDING_WINDOW_LOG.value,
              type=click.Choice([a.value for a in Algorithm]), help="Algorithm of limits that name none.")
@click.option("--merge-domain-config/--no-merge-domain-config", envvar="MERGE_DOMAIN_CONFIG", default=False,
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
    click.echo(describe_config(config), nl=False)
    click.echo(f"OK: {len(config.domains)} domain(s), {config.limit_count()} limit(s)")


@main.command()
@click.option("--redis-url", envvar="REDIS_URL", default="redis://127.0.0.1:6379/0",
              help="Redis the demo's slidegate uses (its keys get a fresh prefix each run).")
def demo(redis_url: str) -> None:
    """Start slidegate, a demo upstream and Envoy; send traffic through Envoy; show what each request got."""
    from slidegate.demo import run_demo

    sys.exit(run_demo(redis_url))


@main.command()
@click.option("--target", default="127.0.0.1:8081", show_default=True, help="host:port of the rate-limit service.")
@click.option("--domain", required=True, help="Rate-limit domain.")
@click.option("--descriptor", "descriptors", multiple=True, required=True, metavar="K=V[,K2=V2...]",
              help="One descriptor (repeat for several): its entries in order.")
@click.option("--hits", type=click.IntRange(0, 4294967295), default=0, help="Request hits_addend (0 means 1).")
@click.option("--timeout", default=2.0, show_default=True, type=click.FloatRange(min=0.001), help="Seconds.")
@click.option("--json", "as_json", is_flag=True, help="Print the response as proto-JSON.")
def client(target: str, domain: str, descriptors: tuple[str, ...], hits: int, timeout: float, as_json: bool) -> None:
    """Call ShouldRateLimit on any Envoy-compatible rate-limit service and print the answer.

    Exit code 0 for OK, 1 for OVER_LIMIT, 2 for an error.
    """
    import grpc
    from google.protobuf import json_format

    from slidegate._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

    request = rls_pb2.RateLimitRequest(domain=domain, hits_addend=hits)
    for text in descriptors:
        entries = request.descriptors.add().entries
        for pair in text.split(","):
            key, sep, value = pair.partition("=")
            if not sep or not key:
                raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--descriptor")
            entries.add(key=key, value=value)
    try:
        with grpc.insecure_channel(target) as channel:
            response = rls_pb2_grpc.RateLimitServiceStub(channel).ShouldRateLimit(request, timeout=timeout)
    except grpc.RpcError as exc:
        click.echo(f"error: {exc.code().name}: {exc.details()}", err=True)
        sys.exit(2)
    if as_json:
        click.echo(json_format.MessageToJson(response, indent=2))
    else:
        code = rls_pb2.RateLimitResponse.Code.Name
        click.echo(f"overall: {code(response.overall_code)}")
        click.echo(f"{'#':<3} {'descriptor':<40} {'code':<11} {'limit':<18} {'remaining':>10} {'reset s':>9}")
        for index, (text, status) in enumerate(zip(descriptors, response.statuses, strict=False)):
            limit = "-"
            if status.HasField("current_limit"):
                unit = rls_pb2.RateLimitResponse.RateLimit.Unit.Name(status.current_limit.unit).lower()
                multiplier = status.current_limit.unit_multiplier.value
                per = f"{multiplier} {unit}s" if multiplier > 1 else unit
                limit = f"{status.current_limit.requests_per_unit}/{per}"
            reset = status.duration_until_reset.seconds + status.duration_until_reset.nanos / 1e9
            click.echo(f"{index:<3} {text:<40} {code(status.code):<11} {limit:<18} {status.limit_remaining:>10} "
                       f"{reset:>9.3f}")
    sys.exit(1 if response.overall_code == rls_pb2.RateLimitResponse.OVER_LIMIT else 0)
