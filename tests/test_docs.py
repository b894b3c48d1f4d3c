"""The README and docs/ say what the code does: every relative link and #anchor resolves, every `slidegate`
command they show exists with the flags they give it, every full config example loads (or, marked
``<!-- invalid -->``, fails to), the README's example is the demo's own config, and the Layout names the files
that are there."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from slidegate.cli import main
from slidegate.config import ConfigError, load_file

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
INVALID = "<!-- invalid -->"
SHELL = ("sh", "bash", "shell", "console", "")

_FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"`[^`]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$", re.MULTILINE)
# `slidegate <command>`, also as .venv/bin/slidegate; not slidegate.client, slidegate[plot] or slidegate-port
_COMMAND = re.compile(r"(?<![\w.-])slidegate[ \t]+([a-z][\w-]*)")
_FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def fenced_blocks(text: str) -> list[tuple[str, str, int]]:
    """Every fenced code block: (language, body, offset of its opening fence)."""
    return [(m.group(1), m.group(2), m.start()) for m in _FENCE.finditer(text)]


def _blank(match: re.Match[str]) -> str:
    return re.sub(r"[^\n]", " ", match.group(0))


def without_blocks(text: str) -> str:
    """The text with fenced blocks blanked out (a '# comment' in a block is no heading); offsets kept, so that
    a reported line is right."""
    return _FENCE.sub(_blank, text)


def prose(text: str) -> str:
    """The text outside fenced blocks and code spans, where links are."""
    return _CODE_SPAN.sub(_blank, without_blocks(text))


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text without markup, lower case, punctuation dropped (letters,
    digits, '_' and '-' stay), each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link is its text
    text = re.sub(r"[`*]", "", text)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a page's headings; a repeated slug gets -1, -2 … as on GitHub."""
    seen: Counter[str] = Counter()
    found = set()
    for match in _HEADING.finditer(without_blocks(path.read_text())):
        slug = github_slug(match.group(2))
        found.add(f"{slug}-{seen[slug]}" if seen[slug] else slug)
        seen[slug] += 1
    return found


def broken_links(page: Path) -> list[str]:
    text = page.read_text()
    broken = []
    for match in _LINK.finditer(prose(text)):
        target = match.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: …
            continue
        where = f"{_relative(page)}:{text.count(chr(10), 0, match.start()) + 1}: {target}"
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{where} (no such file)")
        elif anchor and (file.suffix != ".md" or anchor not in anchors(file)):
            broken.append(f"{where} (no such heading in {_relative(file)})")
    return broken


def test_github_slugs() -> None:
    assert github_slug("Sentinel failovers: what can be lost, and REDIS_WAIT_REPLICAS") == (
        "sentinel-failovers-what-can-be-lost-and-redis_wait_replicas")
    assert github_slug("Replica confirmation (`REDIS_WAIT_REPLICAS`)") == "replica-confirmation-redis_wait_replicas"
    assert github_slug("FastAPI / Starlette") == "fastapi--starlette"
    assert github_slug("Kubernetes and Docker Compose") == "kubernetes-and-docker-compose"


@pytest.mark.parametrize("page", PAGES, ids=_relative)
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_a_broken_link_or_anchor_is_found(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## A heading, with `code`\n")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n## Here\n\n[ok](other.md#a-heading-with-code) [ok](#here) [ok](https://x.example/#y)\n"
                    "[gone](missing.md) [no anchor](other.md#nowhere) [self](#there)\n"
                    "`[in code](missing.md)`\n```\n[in a block](missing.md)\n```\n")
    assert broken_links(page) == [
        f"{page}:6: missing.md (no such file)",
        f"{page}:6: other.md#nowhere (no such heading in {tmp_path / 'other.md'})",
        f"{page}:6: #there (no such heading in {page})",
    ]


@pytest.mark.parametrize("page", PAGES[1:], ids=_relative)
def test_every_page_starts_with_a_summary_and_links_back(page: Path) -> None:
    title, blank, *rest = page.read_text().split("\n")
    summary = "\n".join(rest).split("\n\n")[0]
    assert title.startswith("# ") and blank == "", page
    assert "](../README.md)" in summary, f"{_relative(page)}: the first paragraph links back to the README"


def test_the_readme_links_every_page() -> None:
    linked = {m.group(1).partition("#")[0] for m in _LINK.finditer(prose(README.read_text()))}
    assert {f"docs/{p.name}" for p in PAGES[1:]} <= linked


def _commands() -> dict[str, click.Command]:
    """The subcommands `slidegate --help` lists, by name."""
    text = CliRunner().invoke(main, ["--help"]).output
    names = re.findall(r"^  ([a-z][\w-]*)  ", text.split("Commands:")[1], re.MULTILINE)
    assert isinstance(main, click.Group)
    return {name: main.commands[name] for name in names}


def _options(command: click.Command) -> set[str]:
    options = {"--help"}
    for param in command.params:
        if isinstance(param, click.Option):
            options |= {o for o in (*param.opts, *param.secondary_opts) if o.startswith("--")}
    return options


def shown_commands(text: str) -> list[tuple[str, list[str]]]:
    """Each `slidegate <command>` in shell blocks and code spans, with the flags that follow it: in a block, on
    its line; in a code span, within the span (which may wrap). Other blocks' comments are prose."""
    pieces = [line for language, body, _ in fenced_blocks(text) if language in SHELL for line in body.split("\n")]
    pieces += [m.group(0) for m in _CODE_SPAN.finditer(without_blocks(text))]
    shown = []
    for piece in pieces:
        matches = list(_COMMAND.finditer(piece))
        for i, match in enumerate(matches):
            end = matches[i + 1].start() if i + 1 < len(matches) else len(piece)
            shown.append((match.group(1), _FLAG.findall(piece[match.end():end])))
    return shown


def test_every_command_shown_exists_with_its_flags() -> None:
    commands = _commands()
    assert set(commands) >= {"serve", "check-config", "client", "demo", "simulate"}
    shown: set[str] = set()
    wrong = []
    for page in PAGES:
        for name, flags in shown_commands(page.read_text()):
            shown.add(name)
            if name not in commands:
                wrong.append(f"{_relative(page)}: slidegate {name} (no such command)")
            else:
                wrong += [f"{_relative(page)}: slidegate {name} {flag} (no such flag)"
                          for flag in flags if flag not in _options(commands[name])]
    assert wrong == []
    assert shown == set(commands), "every command is shown somewhere in the docs"


def test_a_wrong_command_or_flag_is_found() -> None:
    text = "Run `slidegate serv` or\n\n```sh\n.venv/bin/slidegate client --targt x --domain d\n```\n"
    assert shown_commands(text) == [("client", ["--targt", "--domain"]), ("serv", [])]
    assert "--targt" not in _options(_commands()["client"])


def config_examples() -> list[tuple[str, str, bool]]:
    """Every YAML block that is a whole rate-limit config (a top-level ``domain:``): (where, body, valid)."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for language, body, start in fenced_blocks(text):
            if language in ("yaml", "yml") and re.search(r"^domain:", body, re.MULTILINE):
                before = text[:start].rstrip("\n").rsplit("\n", 1)[-1]
                line = text.count("\n", 0, start) + 1
                found.append((f"{_relative(page)}:{line}", body, before.strip() != INVALID))
    return found


EXAMPLES = config_examples()


def test_there_are_config_examples_of_both_kinds() -> None:
    assert sum(valid for _, _, valid in EXAMPLES) >= 3
    assert any(not valid for _, _, valid in EXAMPLES)


@pytest.mark.parametrize(("where", "body", "valid"), EXAMPLES, ids=[where for where, _, _ in EXAMPLES])
def test_every_config_example_loads_unless_marked_invalid(tmp_path: Path, where: str, body: str,
                                                         valid: bool) -> None:
    path = tmp_path / "example.yaml"
    path.write_text(body)
    if valid:
        load_file(path)
    else:  # marked <!-- invalid -->: shown for its errors, so it must have some
        with pytest.raises(ConfigError):
            load_file(path)


def test_the_readmes_example_is_the_demos_config() -> None:
    demo = (ROOT / "envoy" / "ratelimit" / "demo.yaml").read_text()
    shown = [body for where, body, _ in EXAMPLES if where.startswith("README.md:") and "domain: demo\n" in body]
    assert shown, "the README shows the demo's config"
    for body in shown:
        assert body in demo, "the README's example is a literal excerpt of envoy/ratelimit/demo.yaml"


def _layout() -> list[tuple[str, str]]:
    section = README.read_text().split("\n## Layout\n")[1].split("\n## ")[0]
    return re.findall(r"^\| `([^`]+)`[^|]*\| (.*) \|$", section, re.MULTILINE)


def test_the_layout_names_what_is_there() -> None:
    missing = []
    named = set()
    for path, what in _layout():
        base = ROOT / path
        named.add(base.resolve())
        for name in re.findall(r"`([^`<>]+(?:\.py|\.lua|\.yaml|\.yml|/))`", what):
            for candidate in (base.parent if base.is_file() else base, ROOT):
                if (candidate / name).exists():
                    named.add((candidate / name).resolve())
                    break
            else:
                missing.append(f"{path}: {name}")
        if not base.exists():
            missing.append(path)
    assert missing == []
    ignored = {"__init__.py", "__main__.py", "py.typed", "__pycache__"}
    package = ROOT / "server" / "slidegate"
    unnamed = [_relative(p) for d in (package, package / "backends") for p in sorted(d.iterdir())
               if p.name not in ignored and p.resolve() not in named]
    assert unnamed == [], "the README's Layout names every module of the package and its backends"
