"""The ``slidegate`` command: ``serve``, ``check-config``, ``explain``, ``client``, ``demo``, ``simulate``.

``serve`` takes every setting of slidegate.settings as a flag or as the environment variable ``--help`` shows
(names follow envoyproxy/ratelimit where it has one).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import grpc
from google.protobuf import json_format

from slidegate import __version__
from slidegate import simulate as simulation
from slidegate.algorithms import Algorithm
from slidegate.client import RateLimitClient, RateLimitUnavailable
from slidegate.config import ConfigError, LoadOptions, load_directory
from slidegate.config.describe import describe_config
from slidegate.demo import run_demo, run_rlqs_demo
from slidegate.explain_command import explain_request
from slidegate.logs import configure_logging
from slidegate.reference_env import unread_line
from slidegate.server import run, tracing_missing
from slidegate.settings import SPECS, Settings, SettingsError
from slidegate.workers import run_workers

log = logging.getLogger("slidegate")
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
    """Serve envoy.service.ratelimit.v3.RateLimitService (and the Rate Limit Quota Service, on the same port) over
    gRPC, and HTTP, until SIGTERM."""
    try:
        settings = Settings.load(os.environ, flags)
    except SettingsError as exc:
        click.echo(str(exc), err=True)
        sys.exit(2)
    configure_logging(settings.log_level, settings.log_format)
    missing = tracing_missing(settings)
    if missing:
        click.echo(missing, err=True)
        sys.exit(2)
    unread = unread_line(os.environ)
    if unread:
        log.warning("%s", unread)
    for leftover in settings.leftovers():
        log.warning("%s", leftover)
    if not settings.uses_xds and not settings.config_path.is_dir():
        where = ("--config / CONFIG_DIR" if settings.config_dir else
                 "--config / CONFIG_DIR (or RUNTIME_ROOT, RUNTIME_SUBDIRECTORY and RUNTIME_APPDIRECTORY, whose "
                 "directory this is)")
        click.echo(f"config directory {settings.config_path} does not exist: pass the directory of your limits' "
                   f"YAML files with {where}", err=True)
        sys.exit(1)
    try:
        if settings.workers > 1:
            # the workers load it too: an invalid config is reported once, here
            load_directory(settings.config_path, LoadOptions(settings.merge_domain_config, settings.default_algorithm))
            sys.exit(run_workers(settings))
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


@main.command(epilog=_ENV_NOTE)
@click.argument("request_file", metavar="REQUEST", type=click.File("rb"))
@settings_options
def explain(request_file: Any, **flags: str | None) -> None:
    """Explain a RateLimitRequest (proto-JSON, as POST /json takes it; "-" for stdin) against the config and the
    storage these settings name, counting nothing: each descriptor's rule and why, where it is defined, its usage,
    and what ShouldRateLimit would answer now (JSON, as POST /explain). Exit code 2 for an error."""
    try:
        settings = Settings.load(os.environ, flags)
        answer = asyncio.run(explain_request(settings, request_file.read().decode("utf-8")))
    except (SettingsError, ConfigError, ValueError, OSError, json_format.Error) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    click.echo(json.dumps(answer, indent=2))


@main.command("check-config")
@click.argument("config_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--default-algorithm", envvar="DEFAULT_ALGORITHM", default=Algorithm.SLIDING_WINDOW_LOG.value,
              type=click.Choice([a.value for a in Algorithm]), help="Algorithm of limits that name none.")
@click.option("--merge-domain-config/--no-merge-domain-config", envvar="MERGE_DOMAIN_CONFIG", default=False,
              help="Let several files add descriptors to one domain.")
def check_config(config_dir: str, default_algorithm: str, merge_domain_config: bool) -> None:
    """Validate a config directory offline: print the first errors and how many there are, or a summary of what
    loads."""
    try:
        config = load_directory(config_dir, LoadOptions(merge_domain_config, Algorithm(default_algorithm)))
    except ConfigError as exc:
        click.echo(str(exc), err=True)  # the first problems and how many more: aliases can make millions
        click.echo(f"{len(exc.issues) + exc.more:,} error(s)", err=True)
        sys.exit(1)
    if not config.domains:
        click.echo(f"warning: no domain in {config_dir} (no *.yaml or *.yml files)", err=True)
    click.echo(describe_config(config), nl=False)
    click.echo(f"OK: {len(config.domains)} domain(s), {config.limit_count()} limit(s)")


@main.command()
@click.option("--limit", type=click.IntRange(1, 1000), default=10, show_default=True,
              help="Requests per window.")
@click.option("--window", type=click.FloatRange(0.001, 86400), default=1.0, show_default=True,
              help="The window's length in seconds.")
@click.option("--out", type=click.Path(dir_okay=False, writable=True, path_type=Path),
              help="Draw the results into this PNG too (needs matplotlib: pip install -e '.[plot]' in a checkout).")
def simulate(limit: int, window: float, out: Path | None) -> None:
    """Replay the same traffic through each algorithm (in memory, on a simulated clock) and show what each
    admits: a burst across a window boundary, steady traffic at twice the limit, on/off bursts."""
    window_us = round(window * 1_000_000)
    outcomes = simulation.simulate(limit, window_us)
    click.echo(simulation.table(outcomes, limit, window))
    if out is None:
        return
    try:
        simulation.draw(outcomes, limit, window_us, out)
    except ImportError:
        click.echo("cannot draw: matplotlib is not installed (pip install -e '.[plot]' in a checkout); the table above "
                   "has the same results", err=True)
        sys.exit(1)
    click.echo(f"drawn: {out}")


@main.command()
@click.option("--redis-url", envvar="REDIS_URL", default="redis://127.0.0.1:6379/0",
              help="Redis the demo's slidegate uses (its keys get a fresh prefix each run).")
@click.option("--rlqs", is_flag=True,
              help="Envoy's rate_limit_quota filter and slidegate's Rate Limit Quota Service (envoy/rlqs.yaml) "
                   "instead of the rate-limit filter.")
def demo(redis_url: str, rlqs: bool) -> None:
    """Start slidegate, a demo upstream and Envoy; send traffic through Envoy; show what each request got."""
    sys.exit(run_rlqs_demo(redis_url) if rlqs else run_demo(redis_url))


def split_entries(text: str) -> list[str]:
    """``k=v,k2=v2`` → its entries; ``\\,`` is a comma inside a value and ``\\\\`` a backslash."""
    entries, current, chars = [], [], iter(text)
    for char in chars:
        if char == "\\":
            current.append(next(chars, "\\"))
        elif char == ",":
            entries.append("".join(current))
            current = []
        else:
            current.append(char)
    entries.append("".join(current))
    return entries


def _check_utf8(text: str, option: str) -> None:
    """Raise BadParameter (exit code 2) for an argument that is not UTF-8: a request carries UTF-8 text only."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise click.BadParameter(f"{text.encode('utf-8', 'surrogateescape')!r} is not UTF-8",
                                 param_hint=option) from None


@main.command()
@click.option("--target", default="127.0.0.1:8081", show_default=True, help="host:port of the rate-limit service.")
@click.option("--domain", required=True, help="Rate-limit domain.")
@click.option("--descriptor", "descriptors", multiple=True, required=True, metavar="K=V[,K2=V2...]",
              help="One descriptor (repeat for several): its entries in order; a value may hold '=', and '\\,' "
                   "for a comma.")
@click.option("--hits", type=click.IntRange(0, 4294967295), default=0, help="Request hits_addend (0 means 1).")
@click.option("--timeout", default=2.0, show_default=True, type=click.FloatRange(min=0.001), help="Seconds.")
@click.option("--json", "as_json", is_flag=True, help="Print the decision as JSON.")
@click.option("--tls", is_flag=True, help="Talk TLS (the system's CAs unless --tls-cacert).")
@click.option("--tls-cacert", type=click.Path(exists=True, dir_okay=False), help="CA of the server's certificate "
              "(implies --tls).")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), help="Client certificate (mutual TLS).")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), help="Client certificate's key.")
def client(target: str, domain: str, descriptors: tuple[str, ...], hits: int, timeout: float, as_json: bool,
           tls: bool, tls_cacert: str | None, tls_cert: str | None, tls_key: str | None) -> None:
    """Call ShouldRateLimit on any Envoy-compatible rate-limit service and print the decision.

    Exit code 0 when allowed, 1 when over limit, 2 for an error.
    """



    if not math.isfinite(timeout) or timeout > 3600:
        raise click.BadParameter(f"{timeout} is not a number of seconds up to 3600", param_hint="--timeout")
    _check_utf8(domain, "--domain")
    _check_utf8(target, "--target")
    specs = []
    for text in descriptors:
        _check_utf8(text, "--descriptor")
        entries = []
        for pair in split_entries(text):
            key, sep, value = pair.partition("=")
            if not sep or not key:
                raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--descriptor")
            entries.append((key, value))
        specs.append(entries)
    if bool(tls_cert) != bool(tls_key):
        raise click.BadParameter("--tls-cert and --tls-key go together", param_hint="--tls-cert")
    credentials = None
    if tls or tls_cacert or tls_cert:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=Path(tls_cacert).read_bytes() if tls_cacert else None,
            private_key=Path(tls_key).read_bytes() if tls_key else None,
            certificate_chain=Path(tls_cert).read_bytes() if tls_cert else None)
    rls = RateLimitClient(target, timeout=timeout, credentials=credentials)
    try:
        decision = rls.should_rate_limit(domain, specs, hits)
    except RateLimitUnavailable as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    finally:
        rls.close()
    if as_json:
        click.echo(json.dumps({**dataclasses.asdict(decision), "retry_after": decision.retry_after}, indent=2))
    else:
        click.echo(f"overall: {'OK' if decision.allowed else 'OVER_LIMIT'}")
        click.echo(f"{'#':<3} {'descriptor':<40} {'code':<11} {'limit':<18} {'name':<16} {'remaining':>10} "
                   f"{'reset s':>9}")
        for index, (text, d) in enumerate(zip(descriptors, decision.descriptors, strict=False)):
            limited = d.limit is not None  # no limit applies: no name, nothing remains, nothing resets
            limit = f"{d.limit}/{d.window_seconds}s" if limited else "-"
            remaining = str(d.remaining) if limited else "-"
            reset = f"{d.reset_seconds:.3f}" if limited else "-"
            code = "OVER_LIMIT" if d.over else "OK"
            click.echo(f"{index:<3} {text:<40} {code:<11} {limit:<18} {(d.name or '-') if limited else '-':<16} "
                       f"{remaining:>10} {reset:>9}")
    sys.exit(0 if decision.allowed else 1)
