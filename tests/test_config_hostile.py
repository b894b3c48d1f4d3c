"""Config files written to hurt: YAML aliases repeating a mistake tens of thousands of times, values of megabytes
or with newlines, links to files that are not config. A refused load says a bounded summary, keeps bounded
memory, quotes nothing whole and never fails with a traceback."""

from __future__ import annotations

import gc
import logging
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from slidegate.cli import main
from slidegate.config import ConfigError, LoadOptions, load_directory
from slidegate.config.errors import yaml_issue
from slidegate.metrics import Metrics
from slidegate.reload import ConfigHolder, ConfigWatcher

WriteConfig = Callable[..., Path]


def duplicates_bomb(width: int = 15) -> str:
    """7 lines of YAML aliases: 4 levels, each of ``width`` times the same rule. With 15, 54,240 descriptors
    (under the 100,000 mappings allowed), 50,624 of them duplicate keys. The anchors sit under ``name``, which is
    read and unused."""
    lines = ["domain: d", "name:", f"  - &l0 [&m0 {{key: k}}{', *m0' * (width - 1)}]"]
    for n in range(1, 4):
        lines.append(f"  - &l{n} [&m{n} {{key: k, descriptors: *l{n - 1}}}{f', *m{n}' * (width - 1)}]")
    lines.append("descriptors: *l3")
    return "\n".join(lines) + "\n"


def refused(directory: Path, options: LoadOptions | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        load_directory(directory, options or LoadOptions())
    return caught.value


def test_a_mistake_repeated_by_aliases_is_said_once_with_a_count(write_config: WriteConfig) -> None:
    exc = refused(write_config(duplicates_bomb()))
    lines = str(exc).splitlines()
    assert len(lines) == 19 and len(exc.issues) == 18 and exc.more == 50_606
    assert lines[0].endswith("config.yaml:3: descriptors[0].descriptors[0].descriptors[0].descriptors[1]: "
                             "duplicate descriptor composite key 'd.k'")
    assert lines[-1] == "… and 50,606 more problems"
    result = CliRunner().invoke(main, ["check-config", str(write_config(duplicates_bomb()))])
    assert result.exit_code == 1 and len(result.output.splitlines()) == 20, result.output
    assert result.output.splitlines()[-1] == "50,624 error(s)"


async def test_a_refused_reload_logs_a_bounded_summary_and_keeps_the_config(
        write_config: WriteConfig, caplog: pytest.LogCaptureFixture) -> None:
    directory = write_config("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second}\n")
    config = load_directory(directory)
    holder = ConfigHolder(config)
    watcher = ConfigWatcher(directory, LoadOptions(), holder, Metrics())
    write_config(duplicates_bomb())
    caplog.set_level(logging.DEBUG)
    assert await watcher.reload() is False
    assert holder.current is config
    logged = [line for record in caplog.records for line in record.getMessage().splitlines()]
    assert len(logged) <= 20, logged[:25]
    assert logged[-1] == "… and 50,606 more problems"


def test_refused_loads_keep_bounded_memory(write_config: WriteConfig) -> None:
    directory = write_config(duplicates_bomb(width=10))  # 9,990 duplicates: tracemalloc makes loads slow
    kept = [refused(directory)]  # as a log handler might keep the error
    tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(2):
            tracemalloc.reset_peak()
            kept.append(refused(directory))
            gc.collect()
            now, peak = tracemalloc.get_traced_memory()
            # every problem held took 4 MB a refused load here (20 MB with 15 a level), kept with the error
            assert now - before < 200_000 * len(kept) and peak - before < 5_000_000, (now - before, peak - before)
    finally:
        tracemalloc.stop()


def test_a_file_stops_being_read_past_100000_problems(write_config: WriteConfig) -> None:
    # 200 unknown keys in a rule its aliases repeat 1,000 times: 200,000 problems, each work to find and say (the
    # same with 1,000 keys and 100,000 repeats took minutes and 24 GB)
    keys = ", ".join(f"u{i}: 1" for i in range(200))
    lines = ["domain: d", "name:", f"  - &m0 {{key: k, {keys}}}", f"  - &l1 [*m0{', *m0' * 9}]"]
    for n in (2, 3):
        lines.append(f"  - &l{n} [{', '.join([f'{{key: k, descriptors: *l{n - 1}}}'] * 10)}]")
    exc = refused(write_config("\n".join([*lines, "descriptors: *l3"]) + "\n"))
    lines = str(exc).splitlines()
    assert lines[0].endswith("config.yaml: 100,000 problems found (after expanding YAML aliases): the rest of the "
                             "file was not read")
    assert len(lines) == 19 and exc.more == 100_001 - 18


def test_merged_files_repeating_every_rule_are_said_once_with_a_count(write_config: WriteConfig) -> None:
    rules = "".join(f"  - key: k{i}\n" for i in range(1000))
    write_config(f"domain: d\ndescriptors:\n{rules}", "a.yaml")
    exc = refused(write_config(f"domain: d\ndescriptors:\n{rules}", "b.yaml"), LoadOptions(merge_domains=True))
    lines = str(exc).splitlines()
    assert lines[0].endswith("b.yaml:3: duplicate descriptor composite key 'd.k0' (merging domain files)")
    assert len(lines) == 19 and lines[-1] == "… and 982 more problems"


def test_a_value_aliases_repeat_into_gigabytes_is_refused(write_config: WriteConfig) -> None:
    # a 10 KB value in each of 11,110 rules, 4 deep: their paths (metric keys) alone were 400 MB
    lines = ["domain: d", "name:", f"  - &v {'x' * 10_000}",
             f"  - &l0 [{', '.join(f'{{key: k{i}, value: *v}}' for i in range(10))}]"]
    for n in range(1, 4):
        lines.append(f"  - &l{n} [{', '.join(f'{{key: k{i}, value: *v, descriptors: *l{n - 1}}}' for i in range(10))}]")
    exc = refused(write_config("\n".join([*lines, "descriptors: *l3"]) + "\n"))
    assert str(exc).endswith("config.yaml: more than 64 MiB of descriptor paths and metadata (after expanding YAML "
                             "aliases): split it or drop aliases")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('domain: d\n? "' + "a\\n" * 5000 + '"\n: 1\n',  # a key of 10,000 characters, half of them newlines
         "config.yaml:2: " + "a\\n" * 100 + "…" + "a\\n" * 100 + ": unknown key '" + "a\\n" * 40
         + "…' (10000 characters) (expected one of: domain, descriptors, failure_mode, name)"),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: " + "s" * 1000 + "}\n",
         "config.yaml:4: descriptors[0].rate_limit.unit: unknown unit '" + "s" * 80 + "…' (1000 characters) "
         "(expected one of: second, minute, hour, day, week, month, year)"),
        ('domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: "\\e[2Jsec\\nond"}\n',
         "config.yaml:4: descriptors[0].rate_limit.unit: unknown unit '\\x1b[2Jsec\\nond' "
         "(expected one of: second, minute, hour, day, week, month, year)"),
    ],
)
def test_a_value_an_error_repeats_is_escaped_and_cut(write_config: WriteConfig, text: str, expected: str) -> None:
    directory = write_config(text)
    assert str(refused(directory)).replace(f"{directory}/", "") == expected


def test_a_yaml_error_does_not_repeat_what_it_read() -> None:
    # PyYAML without LibYAML (the loader's fallback) quotes what it found, and its str() the whole line
    secret = "AKIA" + "S3CR3T" * 100
    text = f"domain: d\ntoken: *{secret}\n"
    with pytest.raises(yaml.YAMLError) as caught:
        yaml.compose(text, Loader=yaml.SafeLoader)
    issue = str(yaml_issue("config.yaml", text, caught.value))
    assert issue.startswith("config.yaml:2: invalid YAML: found undefined alias 'AKIA")
    assert secret not in issue and len(issue) < 200, issue


def test_names_the_system_cannot_resolve_are_problems_not_tracebacks(write_config: WriteConfig,
                                                                      tmp_path: Path) -> None:
    directory = write_config("domain: a\nbad: 1\n", "a.yaml")
    (directory / "long.yaml").symlink_to("x" * 300)  # a name longer than any file system takes
    (directory / "loop.yaml").symlink_to("loop.yaml")
    assert [str(i).replace(f"{directory}/", "") for i in refused(directory).issues] == [
        "a.yaml:2: bad: unknown key 'bad' (expected one of: domain, descriptors, failure_mode, name)",
        "long.yaml: cannot read file: File name too long",
        "loop.yaml: cannot read file: Too many levels of symbolic links",
    ]
    with pytest.raises(ConfigError):
        load_directory(tmp_path / ("x" * 300))
