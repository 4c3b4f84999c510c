"""`grad` inputs on the WGSL backward (issue 42; docs/backward.md): a learnable full bias read once
per pair (bias[b, h, q, k], added directly by step 2) against the float64 reference_backward on
the live adapter (lavapipe in CI): f32 and f16, odd lengths, Lq != Lk, GQA groups of 3, a causal
mask with a row that sees no key (its entries 0); the same bits on a second run. Reads that sum
many pairs (tables, a read at hkv): tests/equivalence/test_wgsl_grad_tables.py."""

from __future__ import annotations

import numpy as np
import pytest

import attngen
from attngen.backends.wgsl.emit import backward_manifest
from attngen.reference import reference_backward, relative_error, tolerance

from conftest import kernel_for, require, spec_of

NP = {"f16": np.float16, "f32": np.float32}

CASES = [
    # (id, axis of heads, bias dtype, spec dtype, mask, B, Lq, Lk, Hq, Hkv)
    ("f32-113x7-g3", "h", "f32", "f32", "", 2, 113, 7, 6, 2),
    ("f16-7x113-causal", "h", "f16", "f16", "\n mask k < q + Lk - Lq", 1, 7, 113, 3, 1),
    ("f32-1x1", "h", "f32", "f32", "", 1, 1, 1, 3, 3),
    ("h-f32-causal-g3", "h", "f32", "f32", "\n mask k < q", 2, 13, 7, 6, 2),
]


def _run(case, seed=0, twice=False):
    _, heads, bdt, dtype, mask, b, lq, lk, hq, hkv = case
    spec = spec_of(f"head_dim 16\n dtype {dtype}\n input bias[b, {heads}, q, k] {bdt} grad\n"
                   f" score s + bias[b, {heads}, q, k]{mask}")
    rng = np.random.default_rng(seed)
    draw = lambda *shape: rng.standard_normal(shape).astype(NP[dtype])  # noqa: E731
    q, k, v = draw(b, lq, hq, 16), draw(b, lk, hkv, 16), draw(b, lk, hkv, 16)
    bias = rng.standard_normal((b, hq if heads == "h" else hkv, lq, lk)).astype(NP[bdt])
    kernel = kernel_for(spec, "wgsl")
    out, lse = kernel(q, k, v, return_lse=True, bias=bias)
    dout = draw(*out.shape)
    got = kernel.backward(q, k, v, out, lse, dout, bias=bias)
    assert len(got) == 4 and set(got[3]) == {"bias"}
    ref = reference_backward(spec, *(x.astype(np.float64) for x in (q, k, v, dout)), bias=bias)
    tol = 2 * tolerance(spec)
    g = got[3]["bias"]
    assert g.shape == bias.shape and g.dtype == np.float32
    errors = {n: relative_error(x, r) for n, x, r in zip(("dq", "dk", "dv", "bias"), (*got[:3], g),
                                                          (*ref[:3], ref[3]["bias"]))}
    assert all(e <= tol for e in errors.values()), f"{errors} above {tol}"
    if twice:  # deterministic: no atomics, every sum in a fixed order
        again = kernel.backward(q, k, v, out, lse, dout, bias=bias)
        assert np.array_equal(again[3]["bias"], g)
    return g, ref[3]["bias"]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_full_bias_gradient_matches_reference(case):
    require("wgsl")
    g, r = _run(case, seed=case[6] * 3 + case[7], twice=case[0] == "h-f32-causal-g3")
    if "k < q" in case[4]:  # hidden pairs and a row that sees no key: exactly 0
        # (from the mask, not from r == 0: a row that sees one key has d loss / d score = 0 in
        # float64 but a rounding error's worth on a GPU, as NVIDIA's Vulkan gave)
        lq, lk = g.shape[2], g.shape[3]
        qpos, kpos = np.arange(lq)[:, None], np.arange(lk)[None, :]
        hidden = np.broadcast_to(kpos >= qpos + (lk - lq if "Lk - Lq" in case[4] else 0), g.shape)
        assert hidden.any() and not g[hidden].any() and not r[hidden].any()
    if case[4] == "\n mask k < q":
        assert not g[:, :, 0].any()  # row 0 sees no key


def test_two_reads_of_a_fixed_axis_through_a_sigmoid():
    """Two reads of one input, told apart by a constant index, one under a derivative that reads it
    (sigmoid), per query head with a group of 3 and keys past kv_lens (their entries 0). On Dawn
    over SwiftShader too (the Dawn pass): its compile grew past 8 GB while the bounds tests were
    chains of `||` / `&&` (benchmarks/NOTES.md, eleventh session)."""
    require("wgsl")
    spec = spec_of("head_dim 16\n dtype f32\n input w[b, h, q, k, 2] f32 grad\n"
                   " score s + 0.5 * w[b, h, q, k, 1] + sigmoid(w[b, h, q, k, 0])")
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((2, 5, 3, 16), (2, 9, 1, 16), (2, 9, 1, 16)))
    w = rng.standard_normal((2, 3, 5, 9, 2)).astype(np.float32)
    lens = np.array([9, 4], np.int32)
    kernel = kernel_for(spec, "wgsl")
    out, lse = kernel(q, k, v, return_lse=True, kv_lens=lens, w=w)
    dout = rng.standard_normal(out.shape).astype(np.float32)
    got = kernel.backward(q, k, v, out, lse, dout, kv_lens=lens, w=w)[3]["w"]
    ref = reference_backward(spec, *(x.astype(np.float64) for x in (q, k, v, dout)), kv_lens=lens, w=w)[3]["w"]
    assert relative_error(got, ref) <= 2 * tolerance(spec) and not got[1, :, :, 4:].any()


def test_manifest_describes_the_gradients_in_rows():
    spec = spec_of("head_dim 16\n dtype f32\n input bias[b, h, q, k] f32 grad\n score s + bias[b, h, q, k]")
    m = backward_manifest(attngen.lower(spec, target="wgsl"))
    assert m["available"] and m["rows"]["bytes"] == "4 * (2 * Hq * Tq + 1 + B * Hq * Lq * Lk)"
    assert m["grads"][0]["at_word"] == "2 * Hq * Tq + 1" and m["grads"][0]["shape"] == ["B", "Hq", "Lq", "Lk"]


def test_with_a_mask_over_inputs():
    """A mask that reads inputs runs as the builder's BlockMask + the `mask custom` kernel: that
    kernel's backward returns the bias's gradient too."""
    require("wgsl")
    spec = spec_of("head_dim 16\n dtype f32\n input p[b] i32\n input bias[b, h, q, k] f32 grad\n"
                   " score s + bias[b, h, q, k]\n mask k <= q || k < p[b]")
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((2, 9, 3, 16), (2, 11, 1, 16), (2, 11, 1, 16)))
    named = {"p": np.array([3, 0], np.int32), "bias": rng.standard_normal((2, 3, 9, 11)).astype(np.float32)}
    kernel = kernel_for(spec, "wgsl")
    out, lse = kernel(q, k, v, return_lse=True, **named)
    dout = rng.standard_normal(out.shape).astype(np.float32)
    got = kernel.backward(q, k, v, out, lse, dout, **named)
    ref = reference_backward(spec, *(x.astype(np.float64) for x in (q, k, v, dout)), **named)
    assert relative_error(got[3]["bias"], ref[3]["bias"]) <= 2 * tolerance(spec)
