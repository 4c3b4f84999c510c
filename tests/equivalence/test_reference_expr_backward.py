"""attngen.reference_backward of score and mask expressions (issue 42) against finite
differences of attngen.reference in float64: dq, dk, dv and the gradients of `grad` inputs.

Every tensor holds multiples of 2^-10 (|x| < 8: exact in f32, so the oracle's rounding to the
spec's dtype changes nothing), and each is moved by +-2^-10 along a random direction of -1, 0
and 1, so the perturbed tensors are exact too: the central difference (L(x + e d) - L(x - e d))
/ 2e of the loss L = sum(out * dout) is compared with <gradient, d> (error O(e^2))."""

from __future__ import annotations

import numpy as np
import pytest

from attngen.reference import reference, reference_backward

from conftest import spec_of

EPS = 2.0 ** -10


def _exact(rng, shape, scale=1.0):
    return np.clip(np.round(rng.standard_normal(shape) * scale / EPS) * EPS, -7.0, 7.0)


def _check(spec, b, lq, lk, hq, hkv, inputs=None, kv_lens=None, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    d = spec.head_dim_qk
    q, k = _exact(rng, (b, lq, hq, d), scale), _exact(rng, (b, lk, hkv, d), scale)
    v = _exact(rng, (b, lk, hkv, spec.head_dim_v))
    inputs = dict(inputs or {})
    out = reference(spec, q, k, v, kv_lens=kv_lens, **inputs)
    dout = _exact(rng, out.shape)
    got = reference_backward(spec, q, k, v, dout, kv_lens=kv_lens, **inputs)
    grads = {"q": got[0], "k": got[1], "v": got[2]}
    declared = [i.name for i in spec.inputs if i.grad]
    if declared:
        assert len(got) == 4 and sorted(got[3]) == sorted(declared)
        grads.update(got[3])
    else:
        assert len(got) == 3
    tensors = {"q": q, "k": k, "v": v, **inputs}

    def loss(name, x):
        t = dict(tensors, **{name: x})
        rest = {n: a for n, a in t.items() if n not in ("q", "k", "v")}
        return float((reference(spec, t["q"], t["k"], t["v"], kv_lens=kv_lens, **rest) * dout).sum())

    for name, g in grads.items():
        assert g.shape == tensors[name].shape and np.isfinite(g).all(), name
        direction = rng.integers(-1, 2, size=g.shape).astype(np.float64)
        x = tensors[name]
        fd = (loss(name, x + EPS * direction) - loss(name, x - EPS * direction)) / (2 * EPS)
        want = float((g * direction).sum())
        size = np.linalg.norm(g) * np.linalg.norm(direction)
        assert abs(fd - want) <= 1e-4 * abs(want) + 1e-6 * size + 1e-9, (name, fd, want)
    return got


def test_alibi_with_a_learnable_slope_per_head():
    spec = spec_of("head_dim 16\ndtype f32\ninput slopes[h] f32 grad\nscore s - slopes[h] * abs(q - k)\nmask causal")
    slopes = np.array([0.5, 0.25, 0.125, 0.0625, 2.0 ** -5, 2.0 ** -6])
    got = _check(spec, 2, 13, 17, 6, 2, {"slopes": slopes})
    assert got[3]["slopes"].shape == (6,)


def test_t5_bucketed_relative_bias_with_log():
    bucket = "where(abs(q - k) < 4, abs(q - k), min(7, 4 + floor(log(abs(q - k) / 4) * 2)))"
    spec = spec_of(f"head_dim 16\ndtype f32\ninput rel[h, 8] f32 grad\nscore s + rel[h, {bucket}]")
    rng = np.random.default_rng(5)
    _check(spec, 1, 7, 40, 3, 1, {"rel": _exact(rng, (3, 8))})


@pytest.mark.parametrize("scale", [0.5, 4.0])
def test_tanh_soft_capping_as_an_expression_matches_softcap(scale):
    written = spec_of("head_dim 16\ndtype f32\nscore 5 * tanh(s / 5)\nmask k <= q && q - k < 6")
    capped = spec_of("head_dim 16\ndtype f32\nsoftcap 5.0\nmask window(left=5, right=0)")
    got = _check(written, 2, 11, 11, 3, 3, scale=scale)
    rng = np.random.default_rng(0)  # the same draws as _check's
    q, k = _exact(rng, (2, 11, 3, 16), scale), _exact(rng, (2, 11, 3, 16), scale)
    v = _exact(rng, (2, 11, 3, 16))
    dout = _exact(rng, (2, 11, 3, 16))
    for a, b in zip(got, reference_backward(capped, q, k, v, dout)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_learnable_full_bias_with_gqa_kv_lens_and_rows_that_see_nothing():
    spec = spec_of("head_dim qk=16 v=8\ndtype f32\ninput bias[b, h, q, k] f32 grad\nscore s + bias[b, h, q, k]\n"
                   "mask k < q")
    rng = np.random.default_rng(3)
    bias = _exact(rng, (2, 6, 7, 9))
    got = _check(spec, 2, 7, 9, 6, 2, {"bias": bias}, kv_lens=[9, 4])
    g = got[3]["bias"]
    assert not g[:, :, 0].any()  # row 0 sees no key
    assert not g[1, :, :, 4:].any()  # keys past kv_lens
    assert not np.triu(g[0, 0]).any()  # hidden pairs
    assert not got[0][:, 0].any()  # no gradient through a row that sees nothing


def test_table_bias_gated_by_a_sigmoid_of_the_score():
    spec = spec_of("head_dim 16\ndtype f32\ninput table[h, 9] f32 grad\ninput gate[h] f32 grad\n"
                   "score s * sigmoid(gate[h]) + table[h, clamp(q - k, -4, 4) + 4] + 0.5 * table[h, 4]")
    rng = np.random.default_rng(7)
    _check(spec, 1, 1, 7, 3, 1, {"table": _exact(rng, (3, 9)), "gate": _exact(rng, (3,))})
    _check(spec, 1, 113, 30, 3, 3, {"table": _exact(rng, (3, 9)), "gate": _exact(rng, (3,))}, seed=1)


def test_inputs_without_grad_get_none_and_mask_expressions_only_choose():
    spec = spec_of("head_dim 16\ndtype f32\ninput prefix[b] i32\ninput w[h] f32\nscore s + w[h] * q\n"
                   "mask k <= q || k < prefix[b]")
    _check(spec, 2, 9, 9, 2, 1, {"prefix": np.array([3, 0], np.int32), "w": np.array([0.25, -0.5])})
