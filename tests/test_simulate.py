"""`slidegate simulate`: the picture of the algorithms in the README (and docs/algorithms.md), and the numbers
behind it."""

from __future__ import annotations

import asyncio
import struct
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from slidegate.algorithms import Algorithm
from slidegate.cli import main
from slidegate.simulate import Workload, most_in_window, replay, simulate

ROOT = Path(__file__).resolve().parent.parent
WINDOW = 1_000_000


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_the_command_draws_the_readmes_picture(tmp_path: Path) -> None:
    out = tmp_path / "algorithms.png"
    result = CliRunner().invoke(main, ["simulate", "--out", str(out)])
    assert result.exit_code == 0, result.output
    # the image the README and docs/algorithms.md show is this command's, at the same size
    assert png_size(out) == png_size(ROOT / "docs" / "algorithms.png")
    assert "docs/algorithms.png" in (ROOT / "README.md").read_text()
    assert "](algorithms.png)" in (ROOT / "docs" / "algorithms.md").read_text()
    burst = [line for line in result.output.splitlines() if line.startswith("burst across a window boundary")]
    assert [line.split()[6:9] for line in burst if "fixed_window" in line] == [["20", "20", "20"]]


def test_a_fixed_window_admits_twice_its_limit_at_a_boundary_and_a_log_never_more_than_it() -> None:
    outcomes = {(o.workload.name, o.algorithm): o for o in simulate(10, WINDOW)}
    assert outcomes[("burst across a window boundary", Algorithm.FIXED_WINDOW)].most_in_window == 20
    assert outcomes[("burst across a window boundary", Algorithm.SLIDING_WINDOW_LOG)].most_in_window == 10
    assert all(o.most_in_window <= 10 for (_, a), o in outcomes.items() if a is Algorithm.SLIDING_WINDOW_LOG)


def test_without_matplotlib_the_table_still_prints(tmp_path: Path) -> None:
    blocked = ("import sys; sys.modules['matplotlib'] = None; from slidegate.cli import main; "
               "main(['simulate', '--out', sys.argv[1]])")
    done = subprocess.run([sys.executable, "-c", blocked, str(tmp_path / "x.png")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1 and "matplotlib is not installed" in done.stderr
    assert "fixed_window" in done.stdout and not (tmp_path / "x.png").exists()


def test_the_most_in_a_window_is_counted_over_every_interval() -> None:
    assert most_in_window([], WINDOW) == 0
    assert most_in_window([0, WINDOW - 1, WINDOW, 2 * WINDOW], WINDOW) == 2  # [0, W) holds 0 and W-1
    assert most_in_window([5, 5, 5], WINDOW) == 3


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 3 * WINDOW), max_size=60), st.integers(1, 8))
def test_every_workload_is_kept_to_its_bound(times: list[int], limit: int) -> None:
    workload = Workload("random", tuple(sorted(times)), 3)
    log = asyncio.run(replay(workload, Algorithm.SLIDING_WINDOW_LOG, limit, WINDOW))
    fixed = asyncio.run(replay(workload, Algorithm.FIXED_WINDOW, limit, WINDOW))
    assert log.most_in_window <= limit  # exact: no rolling window ever holds more than the limit
    assert fixed.most_in_window <= 2 * limit  # a fixed window: at most twice, across one boundary
