"""bench/faults.py, the fault suite, still runs: two short phases (its full run takes minutes: see
docs/reliability.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_fault_suite_runs_and_admits_nothing_beyond_a_limit() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "faults.py"), "--only", "healthy", "hostile-input",
                           "--seconds", "3"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "requests with a 60 KB value admitted" not in done.stderr  # the hostile client's long key was limited
    rows = [line.split("|")[1:-1] for line in done.stdout.splitlines() if line.startswith("| healthy")
            or line.startswith("| hostile-input")]
    assert len(rows) == 4  # each phase's row as it ends, and again in the table
    for row in rows:
        name, calls, over_admitted, lost = (cell.strip() for cell in row[:4])
        assert int(calls.replace(",", "")) > 1000, name
        assert (over_admitted, lost) == ("0", "0"), name
