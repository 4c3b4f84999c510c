"""The WGSL backward of score and mask expressions over indices (issue 42): Kernel.backward
against the float64 reference_backward on the live adapter (lavapipe in CI), with the tolerance
of tests/equivalence/test_backward_wgsl.py (twice the forward's, per gradient): ALiBi with a
constant slope, tanh soft-capping written as an expression, a 2D neighbourhood, a causal band,
f32 and f16, odd lengths, Lq != Lk, GQA groups of 3, rows that see no key, kv_lens; and the
refusals (inputs, cuda)."""

from __future__ import annotations

import numpy as np
import pytest

from attngen.backends.wgsl.emit import backward_plan
from attngen.errors import LaunchError
from attngen.plan.backward import problems
from attngen.reference import reference_backward, relative_error, tolerance

from conftest import kernel_for, require, spec_of

NP = {"f16": np.float16, "f32": np.float32}

CASES = [
    # (id, spec body, dtype, B, Lq, Lk, Hq, Hkv)
    ("alibi-causal-7x113-g3", "score s - 0.25 * abs(q - k)\n mask k <= q + Lk - Lq", "f32", 2, 7, 113, 6, 2),
    ("tanh-cap-113", "score 5 * tanh(s / 4.5)\n scale 1.5", "f32", 1, 113, 37, 3, 1),
    ("band-Lq>Lk-f16", "mask k <= q && q - k < 64", "f16", 2, 113, 20, 3, 1),
    ("2d-neighbourhood", "mask abs(q // 8 - k // 8) <= 1 && abs(q % 8 - k % 8) <= 1", "f32", 1, 64, 64, 3, 3),
    ("gated-f16", "score s * sigmoid(s) + 0.5 * h - 0.0625 * abs(q - k)\n mask k < q", "f16", 2, 9, 7, 3, 1),
    ("integer-slope", "score s * (1 + abs(q - k) % 3)\n mask k <= q", "f32", 1, 7, 20, 3, 1),  # d/ds an integer
    ("alibi-cap-f16", "score 5 * tanh(s / 5) - 0.125 * abs(q - k)\n mask k <= q", "f16", 1, 7, 7, 6, 2),
]


def _run(spec, b, lq, lk, hq, hkv, seed=0, **kw):
    rng = np.random.default_rng(seed)
    draw = lambda *shape: rng.standard_normal(shape).astype(NP[spec.dtype])  # noqa: E731
    q, k, v = draw(b, lq, hq, spec.head_dim_qk), draw(b, lk, hkv, spec.head_dim_qk), draw(b, lk, hkv, spec.head_dim_v)
    lens = kw.get("kv_lens")
    for i, n in enumerate(lens if lens is not None else ()):
        k[i, n:], v[i, n:] = np.nan, np.inf  # past kv_lens: never read into a gradient
    kernel = kernel_for(spec, "wgsl")
    out, lse = kernel(q, k, v, return_lse=True, **kw)
    dout = draw(*out.shape)
    got = kernel.backward(q, k, v, out, lse, dout, **kw)
    ref = reference_backward(spec, *(x.astype(np.float64) for x in (q, k, v, dout)), **kw)
    tol = 2 * tolerance(spec)
    errors = {name: relative_error(g, r) for name, g, r in zip(("dq", "dk", "dv"), got, ref)}
    for g, r in zip(got, ref):
        assert g.shape == r.shape and g.dtype == NP[spec.dtype]
    assert all(e <= tol for e in errors.values()), f"{errors} above {tol}"
    return got


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_reference(case):
    require("wgsl")
    _, body, dtype, b, lq, lk, hq, hkv = case
    spec = spec_of(f"head_dim 16\n dtype {dtype}\n {body}")
    got = _run(spec, b, lq, lk, hq, hkv, seed=lq * 7 + lk)
    if "k < q" in body:  # row 0 sees no key: no gradient flows through it
        assert not got[0][:, 0].any()


def test_kv_lens_and_a_row_that_sees_nothing():
    require("wgsl")
    spec = spec_of("head_dim qk=16 v=8\n dtype f32\n score s - 0.5 * abs(q - k)\n mask k < q && q - k <= 9")
    got = _run(spec, 3, 13, 40, 6, 2, seed=4, kv_lens=np.array([40, 1, 17], np.int32))
    assert not got[1][1, 1:].any() and not got[2][2, 17:].any() and not got[0][:, 0].any()


def test_refusals_stay_clear():
    reads = spec_of("head_dim 16\n dtype f32\n input t[h] f32 grad\n score s + t[h]")
    msgs = [p.message for p in problems(reads, expressions=True)]
    assert msgs == ["the score expression reads inputs (t): the backward kernels do not take inputs yet (issue 42)"]
    index_only = spec_of("head_dim 16\n dtype f32\n score s - 0.5 * abs(q - k)\n mask k <= q")
    assert problems(index_only, expressions=True) == []
    assert [p.message for p in problems(index_only)] == [
        "the score and mask expressions are not compiled by this target's backward kernels yet (issue 42)"]
    import attngen
    assert backward_plan(attngen.lower(index_only, target="wgsl")) is not None
    with pytest.raises(LaunchError, match="reads input 't'"):
        reference_backward(reads, *(np.ones((1, 3, 1, 16)),) * 4)


def test_backward_keywords_beyond_the_options_are_refused():
    """kernel.backward takes no expression inputs yet: a declared one is refused with the reason, an
    unknown keyword as unknown (LaunchError, never a TypeError)."""
    require("wgsl")
    plain = spec_of("head_dim 16\n dtype f32\n score s - 0.5 * abs(q - k)")
    q = np.ones((1, 3, 1, 16), np.float32)
    kernel = kernel_for(plain, "wgsl")
    out, lse = kernel(q, q, q, return_lse=True)
    with pytest.raises(LaunchError, match="unknown keyword slopes"):
        kernel.backward(q, q, q, out, lse, out, slopes=np.ones(1, np.float32))
    reads = spec_of("head_dim 16\n dtype f32\n input t[h] f32\n score s + t[h]")
    kernel = kernel_for(reads, "wgsl")
    t = np.ones(1, np.float32)
    out, lse = kernel(q, q, q, return_lse=True, t=t)
    with pytest.raises(LaunchError, match="do not take expression inputs yet"):
        kernel.backward(q, q, q, out, lse, out, t=t)
