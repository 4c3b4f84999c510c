"""Score and mask expressions over indices (issue 42) on target cuda, against the float64
reference (GPU machine): masks (a causal band, a 2D neighbourhood, block-diagonal) and scores (a
distance bias; a tanh cap, planned as softcap 30; a score of functions and heads) in f16, bf16 and
f32, odd lengths (1, 7, 113, 1023), Lq != Lk, GQA groups of 3, on each kernel family (cuda-sm80's
mma.sync, split_kv, two_pass, head dims in chunks, a paged cache; cuda-sm90's producer, plain and
overlapped wgmma loops), the holes of the key range (the plain loop's and the producer family's
lists of live tiles, and their fallback to the key range), kv_lens, packed sequences, rows that see no
key, expressions equal to a named mask against the named mask's kernel, and the index-only
examples. Without a GPU every test skips (tests/backends/cuda/test_expr_source.py compiles the same
families' source and checks the rendered functions on the host)."""

from __future__ import annotations

import numpy as np
import pytest

import attngen
from attngen.reference import reference, relative_error, tolerance

from conftest import random_qkv, require, runtime_inputs, spec_of, to_device
from test_variants import _device_ints, _np, _rand, check

MASKS = {
    "band": "k <= q && q - k < 64",
    "2d neighbourhood": "abs(q // 8 - k // 8) <= 1 && abs(q % 8 - k % 8) <= 1",
    "block diagonal": "q // 64 == k // 64",
}
SCORES = {
    "distance bias": "s - 0.125 * abs(q - k)",
    "tanh cap": "30 * tanh(s / 30)",
}
SHAPES = [(1, 1, 1), (2, 7, 7), (1, 113, 113), (2, 7, 20), (1, 20, 7), (1, 113, 37)]

_KERNELS: dict = {}


def _spec(dtype="f16", mask=None, score=None, head_dim=64, heads="q=6 kv=2", extra=""):
    body = f"head_dim {head_dim}\nheads {heads}\ndtype {dtype}\n"
    body += f"mask {mask}\n" if mask else ""
    body += f"score {score}\n" if score else ""
    return spec_of(body + extra)


def _kernel(spec, profile=None):
    """The compiled kernel (cached); profile None: this GPU's (cuda-sm90 on the H100)."""
    key = (spec, profile)
    if key not in _KERNELS:
        _KERNELS[key] = attngen.compile(spec, target="cuda", profile=profile)
    return _KERNELS[key]


def _check(spec, q, k, v, profile=None, **call):
    """out and lse of the kernel against the reference (options `call` to both); rows that see
    no key give 0 and lse -inf. Paged specs get their block table and kv_lens from runtime_inputs."""
    kernel = _kernel(spec, profile)
    ref_kw = {n: a for n, a in call.items()}
    if spec.kv_cache.is_paged:
        k, v, extra, ref_extra = runtime_inputs(spec, "cuda", q, k, v)
        call, ref_kw = {**call, **extra}, {**ref_kw, **ref_extra}
    dev = {n: _device_ints("cuda", a) if n in ("kv_lens", "cu_seqlens_q", "cu_seqlens_k", "block_table") else a
           for n, a in call.items()}
    dq, dk, dv = to_device("cuda", spec.dtype, q, k, v)
    out, lse = kernel(dq, dk, dv, return_lse=True, **dev)
    out, lse = _np(out), _np(lse)
    ref, ref_lse = reference(spec, q, k, v, return_lse=True, **ref_kw)
    assert not np.isnan(out).any() and not np.isnan(lse).any(), "NaN"
    err = relative_error(out, ref)
    assert err <= tolerance(spec), f"relative error {err:.3g} > {tolerance(spec):g}"
    empty = np.isneginf(ref_lse)
    assert np.array_equal(np.isneginf(lse), empty), "lse is -inf exactly for rows that see no key"
    rows = np.transpose(empty, (0, 2, 1)) if out.ndim == 4 else np.transpose(empty, (1, 0))
    assert np.all(out[rows] == 0), "rows that see no key output exactly 0"
    if (~empty).any():
        assert np.abs(lse[~empty] - ref_lse[~empty]).max() <= 1e-2 * max(1.0, np.abs(ref_lse[~empty]).max())
    return out, lse


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
@pytest.mark.parametrize("name", sorted(MASKS))
def test_mask_expressions(name, dtype):
    require("cuda")
    spec = _spec(dtype, mask=MASKS[name])
    for b, lq, lk in SHAPES:
        q, k, v = random_qkv(spec, b, lq, lk, seed=lq * 131 + lk)
        _check(spec, q, k, v)


@pytest.mark.parametrize("name", sorted(MASKS))
def test_long_sequences_skip_tiles_and_test_the_rest(name):
    """1023 rows and keys: tiles the expression hides are skipped (before the first, after the last
    visible one) or masked per element (the neighbourhood's holes), full tiles taken whole."""
    require("cuda")
    spec = _spec("f16", mask=MASKS[name], score="s - 0.125 * abs(q - k)")
    for b, lq, lk in [(1, 1023, 1023), (1, 1023, 700)]:
        q, k, v = random_qkv(spec, b, lq, lk, seed=lq + lk)
        _check(spec, q, k, v)


@pytest.mark.parametrize("mask, dtype", [(None, "f16"), (None, "bf16"), (None, "f32"), ("k <= q + 3", "f16"),
                                         ("causal", "f16"), ("causal", "bf16")])
@pytest.mark.parametrize("name", sorted(SCORES))
def test_score_expressions(name, mask, dtype):
    require("cuda")
    spec = _spec(dtype, mask=mask, score=SCORES[name])
    for b, lq, lk in SHAPES:
        q, k, v = random_qkv(spec, b, lq, lk, seed=lq * 7 + lk, scale=2.0)
        _check(spec, q, k, v)


@pytest.mark.parametrize("profile", ["cuda-sm80", None])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_a_score_of_functions_and_heads(dtype, profile):
    """tanh (not of the softcap's form, which is planned as `softcap C`), sigmoid, where, h."""
    require("cuda")
    spec = _spec(dtype, mask="k <= q + Lk - Lq", score="where(k % 2 == 0, s, 0.5 * s) + 3 * tanh(s / 7) - "
                                                      "0.1 * h + sigmoid(s)")
    for b, lq, lk in SHAPES:
        q, k, v = random_qkv(spec, b, lq, lk, seed=lq + 5 * lk, scale=2.0)
        _check(spec, q, k, v, profile)


# (profile, spec lines): each kernel family the chooser picks for expressions
FAMILIES = [
    ("cuda-sm80", ""),
    ("cuda-sm80", "schedule split_kv(3)"),
    ("cuda-sm80", "schedule two_pass"),
    ("cuda-sm80", "tile d=32"),
    ("cuda-sm80", "kv_cache paged(page=16)"),
    (None, ""),
    (None, "target cuda { producer=off stages=2 }"),
    (None, "target cuda { producer=off stages=3 }"),
    (None, "kv_cache paged(page=16)"),
]


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f"{f[0] or 'gpu'}-{f[1] or 'default'}")
def test_every_family(family):
    require("cuda")
    profile, extra = family
    spec = _spec("f16", mask=MASKS["2d neighbourhood"], score=SCORES["distance bias"], extra=extra)
    for b, lq, lk in [(2, 7, 7), (1, 113, 113), (1, 9, 70), (1, 200, 37)]:
        q, k, v = random_qkv(spec, b, lq, lk, seed=lq + lk)
        _check(spec, q, k, v, profile)


@pytest.mark.parametrize("extra", ["tile q=16 kv=16", "tile q=16 kv=16\nschedule split_kv(3)",
                                   "tile q=16 kv=16\nschedule two_pass", "tile q=64 kv=16\ntarget cuda { warps=4 }",
                                   "schedule split_kv(2)\ntarget cuda { key_warps=2 }",
                                   "kv_cache paged(page=16)\ntile q=16 kv=16"])
def test_holes_of_the_key_range_are_skipped(extra):
    """Small tiles in a wide neighbourhood: between the visible tiles of a block lie tiles no row
    of it sees (rows 0..15 and keys 32..47 of `abs(q % 64 - k % 64) <= 1`), which the plain loop
    neither copies nor computes (tests/backends/cuda/test_expr_source.py: which families)."""
    require("cuda")
    spec = _spec("f16", mask="abs(q // 64 - k // 64) <= 1 && abs(q % 64 - k % 64) <= 1",
                 score="s - 0.125 * abs(q - k)", extra=extra)
    for b, lq, lk in [(1, 113, 113), (2, 200, 300), (1, 300, 37)]:
        q, k, v = random_qkv(spec, b, lq, lk, seed=lq + 3 * lk)
        _check(spec, q, k, v, "cuda-sm80")


# masks whose key ranges have holes at the producer family's tiles (q=128 kv=80 on the H100): each
# work item's list of live K/V tiles (family.tile_list; tests/backends/cuda/test_expr_source.py)
HOLES = {
    "sink and window": "k < 16 || k <= q && q - k < 200",
    "dilated": "(q - k) % 512 < 40 && k <= q",
    "2d neighbourhood w300": "abs(q // 300 - k // 300) <= 2 && abs(q % 300 - k % 300) <= 2",
    "strided blocks": "(q // 100) % 3 == (k // 100) % 3 && k <= q + 50",
}


@pytest.mark.parametrize("name", sorted(HOLES))
def test_the_producer_family_skips_the_holes_of_its_lists(name):
    """The GPU's default family (the producer kernels on the H100) with masks whose key ranges have
    holes: the producer lists each item's live tiles, holes are neither copied nor computed; odd
    lengths, Lq != Lk, GQA groups of 3, a score expression, f16 and bf16."""
    require("cuda")
    for dtype, shapes in (("f16", [(2, 1023, 1501), (1, 1501, 700), (1, 7, 1100), (1, 113, 113)]),
                          ("bf16", [(1, 1000, 1000)])):
        spec = _spec(dtype, mask=HOLES[name], score="s - 0.125 * abs(q - k)" if dtype == "f16" else None)
        for b, lq, lk in shapes:
            q, k, v = random_qkv(spec, b, lq, lk, seed=lq * 5 + lk)
            _check(spec, q, k, v)


@pytest.mark.parametrize("name", ["dilated", "2d neighbourhood w300"])
def test_the_overlapped_loop_skips_the_holes_of_its_list(name):
    """cuda-sm90's overlapped loop without a producer (three stages): the block's first warp lists
    its live tiles before the main loop."""
    require("cuda")
    spec = _spec("f16", mask=HOLES[name], score="s - 0.125 * abs(q - k)",
                 extra="target cuda { producer=off stages=3 }")
    for b, lq, lk in [(2, 1023, 1501), (1, 1501, 700), (1, 7, 1100)]:
        q, k, v = random_qkv(spec, b, lq, lk, seed=lq * 5 + lk)
        _check(spec, q, k, v)


@pytest.mark.parametrize("name", ["sink and window", "2d neighbourhood w300"])
def test_holes_with_kv_lens_and_packed_sequences(name):
    """The lists of the _varlen entry point: each sequence's own Lk (kv_lens) and packed sequences."""
    require("cuda")
    spec = _spec("f16", mask=HOLES[name])
    rng = np.random.default_rng(9)
    lens = np.array([0, 700, 1337, 1], np.int32)
    q, k, v = _rand(rng, 4, 701, 6, 64), _rand(rng, 4, 1337, 2, 64), _rand(rng, 4, 1337, 2, 64)
    _check(spec, q, k, v, kv_lens=lens)
    lq, lk = [1, 700, 113, 0, 1001], [1, 900, 113, 3, 1201]
    cuq = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    cuk = np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)
    q, k, v = _rand(rng, cuq[-1], 6, 64), _rand(rng, cuk[-1], 2, 64), _rand(rng, cuk[-1], 2, 64)
    _check(spec, q, k, v, cu_seqlens_q=cuq, cu_seqlens_k=cuk)


def test_the_list_of_an_expression_without_holes():
    """CudaTiles.expr_tile_list = "always" (the probe's A / B): a band and `!(k > q)` through the list
    on the producer family, where the default takes the contiguous key range."""
    require("cuda")
    from attngen.backends import get
    from attngen.backends.cuda.devices import device_profile
    profile = device_profile(get("cuda")).with_overrides(expr_tile_list="always")
    for mask in ("!(k > q)", "k <= q + Lk - Lq && q - k < 300"):
        spec = _spec("f16", mask=mask)
        for b, lq, lk in [(1, 1000, 1000), (2, 113, 700), (1, 701, 37)]:
            q, k, v = random_qkv(spec, b, lq, lk, seed=lq + lk)
            _check(spec, q, k, v, profile)


def test_an_item_with_more_live_tiles_than_its_list_holds_takes_the_key_range():
    """Above kTileListEntries (1024) live tiles an item takes the first..last key range instead:
    a mask with holes at short lengths (so the kernel lists tiles) that is bottom-right causal
    beyond 50000 keys, at 86000 keys (about 1075 live tiles of 80 keys per row tile: the range)
    and at 60000 (about 750: the list)."""
    require("cuda")
    spec = _spec("f16", mask="where(Lk > 50000, k <= q + Lk - Lq, (q - k) % 512 < 40 && k <= q)", heads="q=2 kv=1")
    for lk in (86000, 60000):
        q, k, v = random_qkv(spec, 1, 130, lk, seed=lk)
        _check(spec, q, k, v)


@pytest.mark.parametrize("profile", ["cuda-sm80", None])
@pytest.mark.parametrize("extra", ["", "schedule split_kv(2)"])
def test_kv_lens(extra, profile):
    """Lk (and k's range) are each sequence's own with kv_lens; a sequence of no keys gives 0."""
    require("cuda")
    spec = _spec("f16", mask="(k <= q + Lk - Lq && k >= Lk - 9) || q // 64 == k // 64", score="s - 0.1 * (Lk - k)",
                 extra=extra)
    rng = np.random.default_rng(6)
    lens = np.array([0, 37, 100, 1], np.int32)
    q, k, v = _rand(rng, 4, 7, 6, 64), _rand(rng, 4, 100, 2, 64), _rand(rng, 4, 100, 2, 64)
    _check(spec, q, k, v, profile, kv_lens=lens)


@pytest.mark.parametrize("profile", ["cuda-sm80", None])
def test_packed_sequences(profile):
    require("cuda")
    spec = _spec("f16", mask="k <= q + Lk - Lq && q - k < 40 + b", score="s - 0.125 * abs(q - k)")
    rng = np.random.default_rng(5)
    lq, lk = [1, 7, 113, 0, 30], [1, 20, 113, 3, 0]
    cuq = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    cuk = np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)
    q, k, v = _rand(rng, cuq[-1], 6, 64), _rand(rng, cuk[-1], 2, 64), _rand(rng, cuk[-1], 2, 64)
    _check(spec, q, k, v, profile, cu_seqlens_q=cuq, cu_seqlens_k=cuk)


@pytest.mark.parametrize("profile", ["cuda-sm80", None])
def test_rows_that_see_no_key_give_zero_and_minus_inf_with_nan_in_hidden_keys(profile):
    require("cuda")
    # rows q < 3 see no key; every other row sees keys k <= q - 3 only
    spec = _spec("f16", mask="k <= q - 3", score="s - 0.25 * abs(q - k)", heads="q=3 kv=1")
    q, k, v = random_qkv(spec, 2, 11, 200, seed=5)
    ref, ref_lse = reference(spec, q, k, v, return_lse=True)
    assert np.isneginf(ref_lse[:, :, :3]).all() and np.isfinite(ref_lse[:, :, 3:]).all()
    k[:, 10:] = np.nan  # keys 10.. are hidden from every row (at most q - 3 = 7)
    v[:, 10:] = np.inf
    v[:, 5] = np.inf  # key 5: seen by rows 8.. only
    ref, ref_lse = reference(spec, q, k, v, return_lse=True)
    dq, dk, dv = to_device("cuda", spec.dtype, q, k, v)
    out, lse = _kernel(spec, profile)(dq, dk, dv, return_lse=True)
    out, lse = _np(out), _np(lse)
    assert np.all(out[:, :3] == 0) and np.isneginf(lse[:, :, :3]).all()
    assert not np.isnan(out[:, :8]).any() and not np.isnan(lse[:, :, :8]).any()  # rows 3..7 do not see key 5
    ok = np.isfinite(ref)
    np.testing.assert_allclose(out[ok], ref[ok], rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(lse[:, :, 3:8], ref_lse[:, :, 3:8], rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", ["f16", "f32"])
@pytest.mark.parametrize("pair", [("k <= q", "causal"),
                                  ("k <= q + Lk - Lq", "causal(bottom_right)"),
                                  ("k - (q + Lk - Lq) >= -20 && k - (q + Lk - Lq) <= 3", "window(left=20, right=3)")],
                         ids=lambda p: p[1])
def test_an_expression_equal_to_a_named_mask_gives_the_named_kernels_output(pair, dtype):
    require("cuda")
    expr, named = pair
    a, b = _spec(dtype, mask=expr), _spec(dtype, mask=named)
    for bs, lq, lk in [(2, 7, 7), (1, 113, 37), (1, 37, 300)]:
        q, k, v = random_qkv(a, bs, lq, lk, seed=lq * 3 + lk)
        out_a, lse_a = _check(a, q, k, v)
        out_b, lse_b = _check(b, q, k, v)
        # (the two kernels may take different tiles, so their sums differ in order: the dtype's tolerance)
        assert relative_error(out_a, out_b) <= tolerance(a)
        assert np.array_equal(np.isneginf(lse_a), np.isneginf(lse_b))
        ok = ~np.isneginf(lse_a)
        np.testing.assert_allclose(lse_a[ok], lse_b[ok], rtol=0, atol=1e-2 if dtype == "f16" else 1e-4)


@pytest.mark.parametrize("profile", ["cuda-sm80", None])
@pytest.mark.parametrize("name", ["neighbourhood_2d_w64_r7", "gemma2_9b_global_tanh_expr"])
def test_the_index_only_examples(name, profile):
    """examples/expressions' kernels that read no input (the others: refused on cuda)."""
    require("cuda")
    import glob
    import os
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    specs = {s.name: s for path in glob.glob(os.path.join(root, "examples", "expressions", "*.attn"))
             for s in attngen.parse(open(path, encoding="utf-8").read(), path)}
    spec = specs[name]
    for b, lq, lk in [(1, 576, 576), (1, 461, 461), (1, 113, 200)]:
        q, k, v = random_qkv(spec, b, lq, lk, seed=lq)
        _check(spec, q, k, v, profile)
