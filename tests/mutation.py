"""The mutation check: mutmut (configured in pyproject.toml's [tool.mutmut]) changes the core one small thing at a
time and runs the unit tests that guard that code against each change; a mutant the tests pass "survived". From
the repository's root:

    .venv/bin/python tests/mutation.py                 # a fresh run: the score, then every mutant not killed
    .venv/bin/python tests/mutation.py show NAME       # any other mutmut command, on the state the last run left
    .venv/bin/python tests/mutation.py run 'slidegate.keys.*'   # mutmut run itself (incremental, some mutants)

mutmut 3 takes the code to mutate from ./ or src/ only: it names a mutant's module after its file's path, dropping
nothing but a leading src/. slidegate's package is in server/, so mutmut runs in mutants/ (ignored by git),
where src is a link to server/ and tests, lua, envoy, bench, docs and pyproject.toml links to their own; mutmut
copies them into mutants/mutants/ and mutates the copy there, never the checkout. The pytest run is not affected:
pyproject.toml's testpaths are tests/ only.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "mutants"
LINKS = {"src": "server"} | {name: name for name in ("pyproject.toml", "tests", "lua", "envoy", "bench", "docs")}


def prepare(fresh: bool) -> None:
    """The work directory with its links; ``fresh``: without what an earlier run left."""
    if fresh and WORK.exists():
        shutil.rmtree(WORK)
    WORK.mkdir(exist_ok=True)
    for name, target in LINKS.items():
        link = WORK / name
        if not link.is_symlink():
            link.symlink_to(Path("..") / target)


def mutmut(*args: str) -> int:
    return subprocess.run([str(Path(sys.executable).parent / "mutmut"), *args], cwd=WORK).returncode


def score() -> int:
    """Print the latest run's score and every mutant not killed; 1 if any survived."""
    if mutmut("export-cicd-stats") != 0:
        return 1
    stats = json.loads((WORK / "mutants" / "mutmut-cicd-stats.json").read_text())
    print(f"\nkilled {stats['killed']} of {stats['total']}; survived {stats['survived']}, timeout "
          f"{stats['timeout']}, no tests {stats['no_tests']}, suspicious {stats['suspicious']}, "
          f"segfault {stats['segfault']}, skipped {stats['skipped']}")
    print("not killed (`.venv/bin/python tests/mutation.py show NAME` shows one):")
    mutmut("results")
    return 1 if stats["survived"] else 0


def main(argv: list[str]) -> int:
    if argv:
        prepare(fresh=False)
        return mutmut(*argv)
    prepare(fresh=True)
    code = mutmut("run")
    return code or score()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
