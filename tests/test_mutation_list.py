"""tests/mutants.py, the mutation check, still finds every piece of code it changes (it is run on demand)."""

from __future__ import annotations

import pytest

from tests.mutants import MUTANTS, ROOT, Mutant


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_each_mutant_changes_code_that_is_there(mutant: Mutant) -> None:
    assert (ROOT / mutant.path).read_text().count(mutant.original) == 1
    assert all((ROOT / test.split("::")[0]).is_file() for test in mutant.tests)
