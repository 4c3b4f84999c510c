"""The float64 oracle against a naive dense implementation, for every feature of the language:
structured masks, softcap, scale, GQA, custom masks (boolean and additive), per-sequence KV
lengths, packed variable-length batches and paged KV caches; rows that see nothing."""

from __future__ import annotations

import numpy as np
import pytest

from attngen.reference import reference, relative_error, round_bf16, round_to_dtype, tolerance

from conftest import random_qkv, spec_of


def naive(q, k, v, scale, softcap=None, allowed=None, bias=None):
    """Dense softmax attention, one sequence: q (Lq, Hq, D), k (Lk, Hkv, D) -> (Lq, Hq, Dv), lse."""
    hq, hkv = q.shape[1], k.shape[1]
    k = np.repeat(k, hq // hkv, axis=1)
    v = np.repeat(v, hq // hkv, axis=1)
    s = np.einsum("ihd,jhd->hij", q, k) * scale
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    if bias is not None:
        s = s + bias
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)
    out = np.zeros((q.shape[0], hq, v.shape[2]))
    lse = np.full((hq, q.shape[0]), -np.inf)
    for h in range(hq):
        for i in range(q.shape[0]):
            row = s[h, i]
            if np.isfinite(row).any():
                m = row[np.isfinite(row)].max()
                p = np.exp(row - m)
                out[i, h] = p @ v[:, h] / p.sum()
                lse[h, i] = m + np.log(p.sum())
    return out, lse


def f64(*arrays):
    return [a.astype(np.float64) for a in arrays]


@pytest.mark.parametrize("mask, allowed", [
    ("none", lambda i, j, lq, lk: np.ones((lq, lk), bool)),
    ("causal", lambda i, j, lq, lk: j <= i),
    ("causal(bottom_right)", lambda i, j, lq, lk: j <= i + lk - lq),
    ("window(left=3, right=1)", lambda i, j, lq, lk: (j >= i + lk - lq - 3) & (j <= i + lk - lq + 1)),
])
@pytest.mark.parametrize("lq, lk", [(1, 1), (7, 13), (13, 7), (5, 5)])
def test_structured_masks_softcap_gqa(mask, allowed, lq, lk):
    spec = spec_of(f"head_dim 16\n dtype f32\n mask {mask}\n softcap 3.0\n scale 0.4")
    q, k, v = random_qkv(spec, 2, lq, lk, heads_q=6, heads_kv=2)
    out, lse = reference(spec, q, k, v, return_lse=True)
    i, j = np.arange(lq)[:, None], np.arange(lk)[None, :]
    for b in range(2):
        o, l = naive(*f64(q[b], k[b], v[b]), 0.4, 3.0, allowed(i, j, lq, lk))
        np.testing.assert_allclose(out[b], o, atol=1e-12)
        np.testing.assert_array_equal(np.isneginf(lse[b]), np.isneginf(l))
        np.testing.assert_allclose(lse[b][np.isfinite(l)], l[np.isfinite(l)], atol=1e-12)


def test_rows_that_see_nothing_are_zero_with_lse_minus_inf():
    spec = spec_of("head_dim 8\n dtype f32\n mask causal(bottom_right)")
    q, k, v = random_qkv(spec, 1, 6, 2, heads_q=1, heads_kv=1)
    out, lse = reference(spec, q, k, v, return_lse=True)
    assert np.all(out[0, :4] == 0) and np.all(np.isneginf(lse[0, 0, :4]))
    assert np.all(np.isfinite(lse[0, 0, 4:]))


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_custom_masks_broadcast_over_batch_and_heads(kind):
    spec = spec_of("head_dim 16\n dtype f32\n mask custom")
    q, k, v = random_qkv(spec, 2, 9, 11, heads_q=4, heads_kv=2)
    rng = np.random.default_rng(1)
    allowed = rng.random((9, 11)) > 0.4
    allowed[3] = False  # a row that sees nothing
    mask = allowed if kind == "bool" else np.where(allowed, rng.standard_normal((9, 11)), -np.inf)
    out, lse = reference(spec, q, k, v, mask=mask[None, None], return_lse=True)
    for b in range(2):
        bias = None if kind == "bool" else np.broadcast_to(np.where(allowed, mask, 0.0), (4, 9, 11))
        o, l = naive(*f64(q[b], k[b], v[b]), 0.25, allowed=allowed, bias=bias)
        np.testing.assert_allclose(out[b], o, atol=1e-12)
    assert np.all(out[:, 3] == 0) and np.all(np.isneginf(lse[:, :, 3]))


def test_per_head_custom_mask():
    spec = spec_of("head_dim 8\n dtype f32\n mask custom")
    q, k, v = random_qkv(spec, 1, 5, 5, heads_q=2, heads_kv=1)
    mask = np.stack([np.tril(np.ones((5, 5), bool)), np.triu(np.ones((5, 5), bool))])[None]
    out = reference(spec, q, k, v, mask=mask)
    for h in range(2):
        o, _ = naive(*f64(q[0][:, h:h + 1], k[0], v[0]), 8 ** -0.5, allowed=mask[0, h])
        np.testing.assert_allclose(out[0][:, h:h + 1], o, atol=1e-12)


def test_kv_lens_mask_each_sequence_to_its_length():
    spec = spec_of("head_dim 8\n dtype f32\n mask causal(bottom_right)")
    q, k, v = random_qkv(spec, 3, 4, 10, heads_q=2, heads_kv=1)
    lens = np.array([10, 6, 1])
    out = reference(spec, q, k, v, kv_lens=lens)
    for b, n in enumerate(lens):
        i, j = np.arange(4)[:, None], np.arange(n)[None, :]
        o, _ = naive(*f64(q[b], k[b, :n], v[b, :n]), 8 ** -0.5, allowed=j <= i + n - 4)
        np.testing.assert_allclose(out[b], o, atol=1e-12)


def test_packed_variable_length_batch():
    spec = spec_of("head_dim 8\n dtype f32\n mask causal")
    rng = np.random.default_rng(2)
    cu_q, cu_k = np.array([0, 3, 3, 10]), np.array([0, 5, 6, 13])  # an empty query sequence too
    q = rng.standard_normal((10, 4, 8)).astype(np.float32)
    k = rng.standard_normal((13, 2, 8)).astype(np.float32)
    v = rng.standard_normal((13, 2, 8)).astype(np.float32)
    out, lse = reference(spec, q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, return_lse=True)
    assert out.shape == (10, 4, 8) and lse.shape == (4, 10)
    for b in range(3):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        lq, lk = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
        i, j = np.arange(lq)[:, None], np.arange(lk)[None, :]
        o, _ = naive(*f64(q[qs], k[ks], v[ks]), 8 ** -0.5, allowed=j <= i)
        np.testing.assert_allclose(out[qs], o, atol=1e-12)


def test_paged_kv_cache_with_partly_filled_pages():
    spec = spec_of("head_dim 8\n dtype f32\n kv_cache paged(page=4)")
    rng = np.random.default_rng(3)
    k_pages = rng.standard_normal((7, 4, 2, 8)).astype(np.float32)
    v_pages = rng.standard_normal((7, 4, 2, 8)).astype(np.float32)
    table = np.array([[5, 2, 0], [1, 6, 3]])
    lens = np.array([9, 4])  # the first sequence ends one key into its third page
    q = rng.standard_normal((2, 3, 2, 8)).astype(np.float32)
    out = reference(spec, q, k_pages, v_pages, block_table=table, kv_lens=lens)
    for b in range(2):
        kb = k_pages[table[b]].reshape(-1, 2, 8)[: lens[b]]
        vb = v_pages[table[b]].reshape(-1, 2, 8)[: lens[b]]
        o, _ = naive(*f64(q[b], kb, vb), 8 ** -0.5)
        np.testing.assert_allclose(out[b], o, atol=1e-12)


def test_inputs_are_rounded_to_the_spec_dtype():
    x = np.array([1.0 + 2 ** -9, 1.0 + 2 ** -12, 3.0e-8], dtype=np.float32)
    np.testing.assert_array_equal(round_to_dtype(x, "f16"), x.astype(np.float16).astype(np.float64))
    b = round_bf16(np.array([1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, 1.0 + 2 ** -9], dtype=np.float32))
    np.testing.assert_array_equal(b, [1.0, 1.0 + 2 ** -6, 1.0])  # ties to even; below half rounds down


def test_relative_error_and_tolerances():
    ref = np.ones((4, 4))
    assert relative_error(ref, ref) == 0.0
    assert relative_error(np.full((4, 4), np.nan), ref) == float("inf")
    assert tolerance(spec_of("head_dim 8\n dtype f32")) == 1e-5
    assert tolerance(spec_of("head_dim 8\n dtype f16")) == 2e-3
    assert tolerance(spec_of("head_dim 8\n dtype bf16")) == 1e-2
    assert tolerance(spec_of("head_dim 8\n dtype f16\n accumulate qk=f16")) == 1e-2
