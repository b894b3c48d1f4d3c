"""Files that ship with slidegate: the Lua scripts and the Envoy configs.

In a wheel they live inside the package (``slidegate/lua``, ``slidegate/envoy``); in a source checkout they
are the repository's top-level ``lua/`` and ``envoy/`` directories.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def resource_dir(name: str) -> Path:
    """The directory ``name`` (``lua`` or ``envoy``). Raises FileNotFoundError when neither place has it."""
    for candidate in (_PACKAGE / name, _PACKAGE.parent.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"slidegate resource directory '{name}' not found (broken installation?)")


def lua_script(algorithms: list[str]) -> str:
    """The decision script: ``lua/decide.lua`` with ``lua/<algorithm>.lua`` of each of ``algorithms`` in
    place of its marker line."""
    directory = resource_dir("lua")
    parts = [(directory / f"{name}.lua").read_text(encoding="utf-8") for name in algorithms]
    driver = (directory / "decide.lua").read_text(encoding="utf-8")
    return driver.replace("--@@ALGORITHMS@@\n", "\n".join(parts), 1)
