"""The mutation gate itself stays runnable: every mutation in tests/mutations.py still applies
(its snippet occurs exactly once in its file) and names test files that exist, so a refactor
cannot silently turn a mutation into a no-op reported as STALE only when someone runs it."""
from __future__ import annotations

import pytest

from mutations import COOP_MUTATIONS, MUTATIONS, ROOT

ALL = MUTATIONS + COOP_MUTATIONS


@pytest.mark.parametrize("name,file,old,new,tests", ALL, ids=[m[0] for m in ALL])
def test_mutation_applies(name, file, old, new, tests):
    assert (ROOT / file).read_text().count(old) == 1, f"{name}: snippet not found once in {file}"
    assert old != new
    # The test ids, not the pytest options among them (`-k EXPR`, as QKV_PAIRS has).
    ids = [t for i, t in enumerate(tests)
           if not t.startswith("-") and (i == 0 or tests[i - 1] != "-k")]
    assert ids, name
    for t in ids:
        assert (ROOT / t.split("::")[0]).is_file(), t
