"""The code style gates run with the tests: ruff and mypy (strict) must be clean."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_is_clean() -> None:
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_is_clean() -> None:
    # no cache: every run checks the tree as it is
    done = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", "/dev/null"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


def _imports(path: Path) -> set[str]:
    """The slidegate modules a file imports (ruff's PLC0415 keeps every import at the top)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return {name for name in found if name.startswith("slidegate.") and not name.startswith("slidegate._proto")}


def test_the_package_imports_one_way() -> None:
    package = ROOT / "server" / "slidegate"
    modules = {}
    for path in package.rglob("*.py"):
        if "_proto" not in path.parts:
            parts = ("slidegate", *path.relative_to(package).with_suffix("").parts)
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {name: {m for m in _imports(path) if m in modules and m != name} for name, path in modules.items()}
    order: list[str] = []
    state: dict[str, str] = {}

    def visit(name: str, path: tuple[str, ...]) -> None:
        state[name] = "open"
        for other in sorted(graph[name]):
            assert state.get(other) != "open", "import cycle: " + " -> ".join((*path, name, other))
            if other not in state:
                visit(other, (*path, name))
        state[name] = "done"
        order.append(name)

    for name in sorted(graph):
        if name not in state:
            visit(name, ())
    assert "slidegate.server" in order and "slidegate.headers" in order
    assert not graph["slidegate.headers"], "headers.py depends on nothing of slidegate's"
