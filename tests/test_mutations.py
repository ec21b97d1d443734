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


def test_gen_modules_name_real_modules():
    """Each weight type a mutation's name spells compiles modules that exist (a misspelt
    type would make gen-spirv refuse the pattern and the gate report STALE), and a name
    without one compiles every module."""
    from mutations import _GEN_TYPE, gen_modules

    from vkrt.gen import variants
    from vkrt.gen.build import DEFAULT_GLSL_DIR, _select

    sources = variants.discover(DEFAULT_GLSL_DIR)
    patterns = {p for name, file, *_ in ALL for p in gen_modules(name, file)}
    assert len(patterns) >= 10
    for p in sorted(patterns):
        assert len(_select(sources, [p])) >= 8, p
    assert gen_modules("quant: Q5_0/Q5_1 high bits ignored", "vkrt/glsl/weights.glsl") == [
        "*_q5_0", "*_q5_1"]
    assert gen_modules("units: the bytes of a word out of order",
                       "vkrt/glsl/weights.glsl") == ["*_q8_0"]
    assert gen_modules("reduce: one subgroup per workgroup assumed", "vkrt/glsl/reduce.glsl") == []
    names = {m[0] for m in ALL}
    assert all(n in names for n in _GEN_TYPE), set(_GEN_TYPE) - names
    assert gen_modules("matvec: Q4_K rows", "vkrt/glsl/matvec.comp") == []
