"""The float64 oracle's score and mask expressions (issue 42) against hand-written numpy: ALiBi,
prefix-LM, document ids, a Swin-like bias table, a 2D neighbourhood; inputs by keyword and
checked against their declarations."""

from __future__ import annotations

import numpy as np
import pytest

import attngen
from attngen.errors import LaunchError
from attngen.reference import reference, reference_backward, round_to_dtype

from conftest import random_qkv, spec_of


def dense(q, k, v, scale, bias=None, allowed=None):
    """Softmax attention over (B, L, H, D) arrays (H the same for q, k, v): bias and allowed are
    (B, H, Lq, Lk); a row that sees nothing gives 0."""
    s = np.einsum("bihd,bjhd->bhij", q, k) * scale
    if bias is not None:
        s = s + bias
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(m), m, 0))
    p = p / np.maximum(p.sum(-1, keepdims=True), 1e-300)
    return np.einsum("bhij,bjhd->bihd", p, v)


def f64(spec, *arrays):
    return [round_to_dtype(a, spec.dtype) for a in arrays]


POS = np.arange  # positions


def test_alibi():
    spec = spec_of("head_dim 32\nheads q=4 kv=4\ndtype f16\ninput slopes[h] f32\n"
                   "score s - slopes[h] * abs(q - k)\nmask causal")
    q, k, v = random_qkv(spec, 2, 24, 24)
    slopes = 2.0 ** -np.arange(1, 5, dtype=np.float32)
    i, j = POS(24)[:, None], POS(24)[None, :]
    bias = -slopes[None, :, None, None].astype(np.float64) * np.abs(i - j)
    want = dense(*f64(spec, q, k, v), spec.resolved_scale, bias, np.broadcast_to(j <= i, bias.shape))
    np.testing.assert_allclose(reference(spec, q, k, v, slopes=slopes), want, rtol=1e-12, atol=1e-12)


def test_prefix_lm_per_sequence():
    spec = spec_of("head_dim 16\ndtype f32\ninput prefix[b] i32\nmask k <= q || k < prefix[b]")
    q, k, v = random_qkv(spec, 3, 20, 20, heads_q=2, heads_kv=2)
    prefix = np.array([0, 5, 20], np.int32)
    i, j = POS(20)[:, None], POS(20)[None, :]
    allowed = np.stack([np.broadcast_to((j <= i) | (j < p), (2, 20, 20)) for p in prefix])
    want = dense(*f64(spec, q, k, v), spec.resolved_scale, None, allowed)
    np.testing.assert_allclose(reference(spec, q, k, v, prefix=prefix), want, rtol=1e-12, atol=1e-12)


def test_document_ids_with_gqa():
    spec = spec_of("head_dim 16\nheads q=4 kv=2\ndtype f16\ninput doc[b, q] i32\n"
                   "mask k <= q && doc[b, q] == doc[b, k]")
    q, k, v = random_qkv(spec, 2, 18, 18)
    doc = np.array([[0] * 5 + [1] * 9 + [2] * 4, [0] * 18], np.int32)
    i, j = POS(18)[:, None], POS(18)[None, :]
    allowed = np.stack([np.broadcast_to((j <= i) & (d[:, None] == d[None, :]), (4, 18, 18)) for d in doc])
    kr, vr = (np.repeat(x, 2, axis=2) for x in (k, v))
    want = dense(*f64(spec, q, kr, vr), spec.resolved_scale, None, allowed)
    np.testing.assert_allclose(reference(spec, q, k, v, doc=doc), want, rtol=1e-12, atol=1e-12)


def test_swin_like_relative_position_table():
    w = 3  # windows of w x w tokens over an image 2w wide: table[h, (2w - 1)^2]
    spec = spec_of(f"head_dim 16\nheads q=2 kv=2\ndtype f32\ninput table[h, {(2 * w - 1) ** 2}] f32\n"
                   f"score s + table[h, (q // {w} - k // {w} + {w - 1}) * {2 * w - 1} + (q % {w} - k % {w} + {w - 1})]\n"
                   f"mask q // {w * w} == k // {w * w}")
    n = 2 * w * w
    q, k, v = random_qkv(spec, 1, n, n)
    table = np.random.default_rng(1).standard_normal((2, (2 * w - 1) ** 2)).astype(np.float32)
    i, j = POS(n)[:, None], POS(n)[None, :]
    rel = (i // w - j // w + w - 1) * (2 * w - 1) + (i % w - j % w + w - 1)
    allowed = np.broadcast_to(i // (w * w) == j // (w * w), (1, 2, n, n))
    bias = table.astype(np.float64)[:, np.where(allowed[0, 0], rel, 0)][None]  # pairs across windows: hidden
    want = dense(*f64(spec, q, k, v), spec.resolved_scale, bias, allowed)
    np.testing.assert_allclose(reference(spec, q, k, v, table=table), want, rtol=1e-12, atol=1e-12)


def test_2d_neighbourhood_with_kv_lens():
    spec = spec_of("head_dim 16\ndtype f32\nmask abs(q // 5 - k // 5) <= 1 && abs(q % 5 - k % 5) <= 1")
    q, k, v = random_qkv(spec, 2, 25, 25, heads_q=2, heads_kv=2)
    i, j = POS(25)[:, None], POS(25)[None, :]
    near = (np.abs(i // 5 - j // 5) <= 1) & (np.abs(i % 5 - j % 5) <= 1)
    want = dense(*f64(spec, q, k, v), spec.resolved_scale, None, np.broadcast_to(near, (2, 2, 25, 25)))
    np.testing.assert_allclose(reference(spec, q, k, v), want, rtol=1e-12, atol=1e-12)
    lens = np.array([25, 12])
    got = reference(spec, q, k, v, kv_lens=lens)
    short = dense(*f64(spec, q[1:], k[1:, :12], v[1:, :12]), spec.resolved_scale, None,
                  np.broadcast_to(near[:, :12], (1, 2, 25, 12)))
    np.testing.assert_allclose(got[1:], short, rtol=1e-12, atol=1e-12)


def test_a_score_expression_written_as_softcap_matches_softcap():
    capped = spec_of("head_dim 16\ndtype f32\nsoftcap 5.0\nmask causal")
    written = spec_of("head_dim 16\ndtype f32\nscore 5.0 * tanh(s / 5.0)\nmask causal")
    q, k, v = random_qkv(capped, 1, 12, 12, heads_q=2, heads_kv=2, scale=4.0)
    np.testing.assert_allclose(reference(written, q, k, v), reference(capped, q, k, v), rtol=1e-13, atol=1e-13)


def test_short_circuits_guard_reads_and_hidden_pairs_read_nothing():
    spec = spec_of("head_dim 16\ndtype f32\ninput t[4] f32\ninput ok[4] bool\n"
                   "score where(q - k < 4, s + t[q - k], s)\nmask k <= q && (q - k >= 4 || ok[q - k])")
    q, k, v = random_qkv(spec, 1, 10, 10, heads_q=1, heads_kv=1)
    t = np.arange(4, dtype=np.float32)
    okv = np.array([True, False, True, True])
    i, j = POS(10)[:, None], POS(10)[None, :]
    d = i - j
    bias = np.where((d >= 0) & (d < 4), t[np.clip(d, 0, 3)], 0.0)[None, None]
    allowed = ((j <= i) & ((d >= 4) | okv[np.clip(d, 0, 3)]))[None, None]
    want = dense(*f64(spec, q, k, v), spec.resolved_scale, bias, allowed)
    np.testing.assert_allclose(reference(spec, q, k, v, t=t, ok=okv), want, rtol=1e-12, atol=1e-12)


def test_inputs_are_checked_against_their_declarations():
    spec = spec_of("head_dim 16\ndtype f32\ninput t[h, 3] f32\ninput p[b] u8\nscore s + t[h, q - k]\nmask k < p[b]")
    q, k, v = random_qkv(spec, 2, 4, 4, heads_q=2, heads_kv=2)
    t, p = np.zeros((2, 3), np.float32), np.array([1, 4], np.uint8)
    with pytest.raises(LaunchError, match=r"reads input 't' \(f32, axes \[h, 3\]\): pass t=..."):
        reference(spec, q, k, v, p=p)
    with pytest.raises(LaunchError, match=r"input 't' has shape \(3, 2\); its axes \[h=2, 3\] need \(2, 3\)"):
        reference(spec, q, k, v, t=t.T, p=p)
    with pytest.raises(LaunchError, match="unknown input tt"):
        reference(spec, q, k, v, t=t, p=p, tt=t)
    with pytest.raises(LaunchError, match=r"input 'p' \(u8\) holds values outside 0 .. 255"):
        reference(spec, q, k, v, t=t, p=np.array([-1, 2]))
    with pytest.raises(LaunchError, match="input 'p' is u8; it was given float32"):
        reference(spec, q, k, v, t=t, p=p.astype(np.float32))
    # q - k reaches 3 at a visible pair of sequence 1 (p = 4): out of t's 0 .. 2
    with pytest.raises(LaunchError, match=r"index 3 of axis 1 of 't' is out of 0 \.\. 2 in t\[h, q - k\]"):
        reference(spec, q, k, v, t=t, p=p)
    # a mask that keeps q - k in 0 .. 2 wherever the score is used: nothing is read out of bounds
    guarded = spec_of("head_dim 16\ndtype f32\ninput t[h, 3] f32\ninput p[b] u8\nscore s + t[h, q - k]\n"
                      "mask k <= q && q - k < p[b]")
    assert np.isfinite(reference(guarded, q, k, v, t=t, p=np.array([3, 1], np.uint8))).all()


def test_inputs_take_padded_batches_index_only_expressions_every_layout():
    spec = spec_of("head_dim 16\ndtype f32\nmask k <= q && q - k < 3\nscore s - 0.5 * abs(q - k)")
    q, k, v = random_qkv(spec, 2, 6, 6, heads_q=1, heads_kv=1)
    cu = np.array([0, 6, 12], np.int32)
    packed = reference(spec, q.reshape(12, 1, 16), k.reshape(12, 1, 16), v.reshape(12, 1, 16), cu_seqlens_q=cu)
    np.testing.assert_allclose(packed.reshape(q.shape), reference(spec, q, k, v), rtol=1e-12)
    dout = np.ones((12, 1, 16))
    got = reference_backward(spec, q.reshape(12, 1, 16), k.reshape(12, 1, 16), v.reshape(12, 1, 16), dout,
                             cu_seqlens_q=cu)
    want = reference_backward(spec, q, k, v, dout.reshape(q.shape))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.reshape(w.shape), w, rtol=1e-10, atol=1e-12)
    reads = spec_of("head_dim 16\ndtype f32\ninput p[b] i32\nmask k < p[b]")
    with pytest.raises(LaunchError, match="not packed sequences or a paged cache"):
        reference(reads, q.reshape(12, 1, 16), k.reshape(12, 1, 16), v.reshape(12, 1, 16), cu_seqlens_q=cu,
                  p=np.array([1, 2], np.int32))
    with pytest.raises(LaunchError, match="unknown input x"):
        reference(spec_of("head_dim 16\ndtype f32"), q, k, v, x=np.ones(3))
    assert attngen.reference is reference
