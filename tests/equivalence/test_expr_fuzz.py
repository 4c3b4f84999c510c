"""Random well-typed index-only score and mask expressions (tests/expr_strategies.py), written as
spec text, parsed and checked, compiled for target wgsl and run on the live adapter (lavapipe in
CI) against the float64 reference (issue 42): the output within the dtype's tolerance, rows that
see no key exactly 0 with lse -inf, no NaN; the printed spec reads back to the same IR.

The strategies generate around what differs from the reference by design (docs/language.md):
divisors are nonzero constants or `1 + abs(..)`, integers stay far from i32's range, and every
discontinuity (comparison, `where` condition, `floor`) is decided by values exact in f32.

CI runs a handful of examples (derandomized: the same ones every run); ATTNGEN_FUZZ=full runs
FUZZ_SCALE times as many (docs/fuzzing.md)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, note, settings, strategies as st

import attngen
from attngen.lang.spec import format_spec

from conftest import FUZZ_SCALE, check_against_reference, count, random_qkv, require, spec_of
from expr_strategies import masks, scores

FUZZ = settings(max_examples=8 * FUZZ_SCALE, deadline=None, derandomize=FUZZ_SCALE == 1, database=None,
                suppress_health_check=list(HealthCheck))


@FUZZ
@given(mask=st.one_of(st.none(), masks()), score=st.one_of(st.none(), scores()),
       heads=st.sampled_from(["q=3 kv=1", "q=6 kv=2", "q=2 kv=2"]),
       extra=st.sampled_from(["", "", "tile q=16 kv=16", "schedule split_kv(3)"]),
       batch=st.integers(1, 2), lq=st.integers(1, 40), lk=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_random_expressions_match_the_reference_on_wgsl(mask, score, heads, extra, batch, lq, lk, seed):
    require("wgsl")
    count("expressions")
    body = f"head_dim 16\nheads {heads}\ndtype f32\n{extra}\n"
    body += f"mask {mask.text}\n" if mask else ""
    body += f"score {score.text}\n" if score else ""
    note(body)
    spec = spec_of(body)
    assert attngen.parse(format_spec(spec))[0] == spec
    q, k, v = random_qkv(spec, batch, lq, lk, seed=seed)
    check_against_reference(spec, "wgsl", q, k, v)
