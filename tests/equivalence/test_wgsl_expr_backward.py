"""The WGSL backward of score and mask expressions over indices (issue 42): Kernel.backward
against the float64 reference_backward on the live adapter (lavapipe in CI), with the tolerance
of tests/equivalence/test_backward_wgsl.py (twice the forward's, per gradient): ALiBi with a
constant slope, tanh soft-capping written as an expression, a 2D neighbourhood, a causal band,
f32 and f16, odd lengths, Lq != Lk, GQA groups of 3, rows that see no key, kv_lens; expressions
that read inputs (ALiBi with slopes[h], a relative-bias table, a derivative that reads inputs, masks
over inputs by the builder's BlockMask: document ids, prefix-LM, both at once), a read out of
bounds; and the refusals (`grad` inputs)."""

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
    grads = spec_of("head_dim 16\n dtype f32\n input t[h] f32 grad\n score s + t[h]")
    msgs = [p.message for p in problems(grads, expressions="inputs")]
    assert msgs == ["the gradient of `grad` input t is not computed by this target's backward kernels yet (issue 42)"]
    reads = spec_of("head_dim 16\n dtype f32\n input t[h] f32\n score s + t[h]")
    assert problems(reads, expressions="inputs") == []
    assert [p.message for p in problems(reads, expressions="indices")] == [
        "the score expression reads inputs (t): this target's backward kernels do not take inputs yet (issue 42)"]
    masks = spec_of("head_dim 16\n dtype f32\n input p[b] i32\n mask k <= q || k < p[b]")
    assert problems(masks, expressions="indices") == []  # the builder's BlockMask + mask custom
    index_only = spec_of("head_dim 16\n dtype f32\n score s - 0.5 * abs(q - k)\n mask k <= q")
    assert problems(index_only, expressions=True) == []
    assert [p.message for p in problems(index_only)] == [
        "the score and mask expressions are not compiled by this target's backward kernels yet (issue 42)"]
    import attngen
    assert backward_plan(attngen.lower(index_only, target="wgsl")) is not None
    assert backward_plan(attngen.lower(grads, target="wgsl")) is not None  # partial sums: test_wgsl_grad_tables.py
    with pytest.raises(LaunchError, match="reads input 't'"):
        reference_backward(reads, *(np.ones((1, 3, 1, 16)),) * 4)


def test_backward_keywords_beyond_the_options_are_refused():
    """kernel.backward takes the call's options and its expression inputs: an unknown keyword is a
    LaunchError naming it (never a TypeError), a missing input one naming the input."""
    require("wgsl")
    plain = spec_of("head_dim 16\n dtype f32\n score s - 0.5 * abs(q - k)")
    q = np.ones((1, 3, 1, 16), np.float32)
    kernel = kernel_for(plain, "wgsl")
    out, lse = kernel(q, q, q, return_lse=True)
    with pytest.raises(LaunchError, match="unknown input slopes"):
        kernel.backward(q, q, q, out, lse, out, slopes=np.ones(1, np.float32))
    reads = spec_of("head_dim 16\n dtype f32\n input t[h] f32\n score s + t[h]")
    kernel = kernel_for(reads, "wgsl")
    t = np.ones(1, np.float32)
    out, lse = kernel(q, q, q, return_lse=True, t=t)
    with pytest.raises(LaunchError, match="reads input 't'"):
        kernel.backward(q, q, q, out, lse, out)
    with pytest.raises(LaunchError, match="input 't' is float64"):
        kernel.backward(q, q, q, out, lse, out, t=t.astype(np.float64))


# ---- expressions that read inputs: the score's by the inputs binding, the mask's by the builder --------

def _slopes(rng, b, lq, lk, hq):
    return {"slopes": rng.random(hq).astype(np.float32)}


def _table(rng, b, lq, lk, hq):
    return {"table": rng.standard_normal((hq, 41)).astype(np.float16)}


def _bias(rng, b, lq, lk, hq):
    return {"slopes": (rng.random(hq) + 0.5).astype(np.float32),
            "bias": rng.standard_normal((b, hq, lq, lk)).astype(np.float16)}


def _docs(rng, b, lq, lk, hq):
    return {"doc": np.sort(rng.integers(0, 4, (b, lq)), axis=1).astype(np.int32)}


def _prefix(rng, b, lq, lk, hq):
    return {"prefix": np.array([3, 0, 12][:b], np.int32)}


def _docs_slopes(rng, b, lq, lk, hq):
    return {**_docs(rng, b, lq, lk, hq), **_slopes(rng, b, lq, lk, hq)}


INPUT_CASES = [
    # (id, spec body, dtype, B, Lq, Lk, Hq, Hkv, inputs)
    ("alibi-causal-7x113-g3", "input slopes[h] f32\n score s - slopes[h] * abs(q - k)\n mask causal", "f32",
     2, 7, 113, 6, 2, _slopes),
    ("table-f16-113x37-g3", "input table[h, 41] f16\n score s + table[h, clamp(k - q, -20, 20) + 20]", "f16",
     1, 113, 37, 3, 1, _table),
    ("ds-reads-inputs-row0-sees-none", "input slopes[h] f32\n input bias[b, h, q, k] f16\n"
     " score s * slopes[h] + bias[b, h, q, k]\n mask k < q", "f32", 2, 9, 7, 3, 1, _bias),
    ("documents-113-g3", "input doc[b, q] i32\n mask k <= q && doc[b, q] == doc[b, k]", "f32", 2, 113, 113, 3, 1,
     _docs),
    ("prefix-lm-f16-7x20", "input prefix[b] i32\n mask k <= q || k < prefix[b]", "f16", 3, 7, 20, 3, 1, _prefix),
    ("documents-and-alibi", "input doc[b, q] i32\n input slopes[h] f32\n score s - slopes[h] * abs(q - k)\n"
     " mask k <= q && doc[b, q] == doc[b, k]", "f32", 2, 13, 13, 3, 1, _docs_slopes),
]


@pytest.mark.parametrize("case", INPUT_CASES, ids=[c[0] for c in INPUT_CASES])
def test_inputs_match_reference(case):
    require("wgsl")
    _, body, dtype, b, lq, lk, hq, hkv, make = case
    spec = spec_of(f"head_dim 16\n dtype {dtype}\n {body}")
    inputs = make(np.random.default_rng(lq + lk), b, lq, lk, hq)
    got = _run(spec, b, lq, lk, hq, hkv, seed=lq * 7 + lk, **inputs)
    if "k < q" in body:  # row 0 sees no key: no gradient flows through it
        assert not got[0][:, 0].any()


def test_a_mask_over_inputs_reuses_the_forwards_block_mask_with_kv_lens():
    """The backward of a mask over inputs runs the `mask custom` backward on the BlockMask the
    forward built (no second build while the signature is the same; a new one where it changed),
    with kv_lens: keys past them get zero gradients."""
    require("wgsl")
    spec = spec_of("head_dim 16\n dtype f32\n input prefix[b] i32\n mask k <= q || k < prefix[b]")
    lens = np.array([20, 1, 9], np.int32)
    prefix = {"prefix": np.array([3, 0, 12], np.int32)}
    got = _run(spec, 3, 7, 20, 3, 1, seed=2, kv_lens=lens, **prefix)
    assert not got[1][1, 1:].any() and not got[2][2, 9:].any()
    kernel = kernel_for(spec, "wgsl")
    built = kernel.mask_builds
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((3, n, h, 16)).astype(np.float32) for n, h in ((7, 3), (20, 1), (20, 1)))
    out, lse = kernel(q, k, v, return_lse=True, kv_lens=lens, **prefix)  # _run's signature: no build
    kernel.backward(q, k, v, out, lse, out, kv_lens=lens, **prefix)
    assert kernel.mask_builds == built
    kernel.backward(q, k, v, out, lse, out, kv_lens=lens, prefix=np.array([3, 0, 11], np.int32))
    assert kernel.mask_builds == built + 1


def test_a_read_out_of_bounds_in_the_backward_is_raised():
    """The backward evaluates the score at the visible pairs, as the forward: a read out of an
    input's bounds there is a LaunchError naming the read (here t[q - k] with q < k)."""
    require("wgsl")
    spec = spec_of("head_dim 16\n dtype f32\n input t[q] f32\n score s + t[q - k]")
    kernel = kernel_for(spec, "wgsl")
    q = np.ones((1, 3, 1, 16), np.float32)
    out, lse = np.zeros((1, 3, 1, 16), np.float32), np.zeros((1, 1, 3), np.float32)
    with pytest.raises(LaunchError, match=r"the score expression read input 't' out of its bounds in t\[q - k\]"):
        kernel.backward(q, q, q, out, lse, out, t=np.ones(3, np.float32))


def test_the_backward_module_binds_the_inputs_in_steps_2_and_3():
    """The manifest's backward lists the `inputs` binding (13, read_write: the flag) for the dK/dV and
    dQ entry points, not the preprocess; the source declares it and the loaders."""
    import attngen
    from attngen.backends.wgsl.emit import backward_manifest, backward_source
    plan = attngen.lower(spec_of("head_dim 16\n dtype f32\n input slopes[h] f32\n score s - slopes[h] * abs(q - k)\n"
                                 " mask causal"), target="wgsl")
    entries = {e["role"]: e["bindings"] for e in backward_manifest(plan)["entry_points"]}
    assert 13 not in entries["preprocess"] and 13 in entries["dkdv"] and 13 in entries["dq"]
    source = backward_source(plan)
    assert "@group(0) @binding(13) var<storage, read_write> inputs: array<u32>;" in source
    assert "fn in_slopes(site: u32, i0: i32) -> f32 {" in source
