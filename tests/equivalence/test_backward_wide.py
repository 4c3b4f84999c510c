"""The fast CUDA backward at head dim 256 (issue 41; templates/cuda/backward_wgmma_wide.cu.j2:
blocks of 64 keys, steps of 64 rows split between two warpgroups, dQ by atomic f32 reductions)
against attngen.reference_backward, at shapes that cross its blocks and steps: lengths 1, 7, 113,
257, Lq != Lk both ways, GQA groups of 3, every mask kind, softcap and scale, packed sequences,
kv_lens with hidden keys holding inf / NaN, custom masks whose BlockMask tiles straddle the key
blocks, rows that see no key; f16 and bf16. Its results agree with the deterministic family's.
Needs a Hopper GPU (sm_90); the sources compile anywhere
(tests/backends/cuda/test_backward_wide_source.py).
"""

from __future__ import annotations

import numpy as np
import pytest

import attngen
from attngen.backends.cuda import backward as cuda_backward
from attngen.reference import relative_error, tolerance

from conftest import kernel_for, require, spec_of
from test_backward_cuda import _documents, _ints, _mask, _rand, check_backward, check_packed


def _wide(spec):
    require("cuda")
    kernel = kernel_for(spec, "cuda")
    if cuda_backward.family(kernel.plan) != "wgmma" or not cuda_backward.wide(kernel.plan):
        pytest.skip(f"the head-dim-256 wgmma backward runs on sm_90 (this GPU's plan is {kernel.plan.details.arch})")
    return kernel


def _qkv(rng, b, lq, lk, hq, hkv, d=256):
    return _rand(rng, b, lq, hq, d), _rand(rng, b, lk, hkv, d), _rand(rng, b, lk, hkv, d)


# (label, spec body, Hq, Hkv, Lq, Lk, B)
CASES = [
    ("f16 none 257 x 300", "head_dim 256\n dtype f16", 2, 2, 257, 300, 2),
    ("bf16 causal GQA 3 300 x 400", "head_dim 256\n dtype bf16\n mask causal", 6, 2, 300, 400, 1),
    ("f16 causal Lq > Lk", "head_dim 256\n dtype f16\n mask causal", 3, 3, 400, 113, 1),
    ("bf16 bottom-right Lq < Lk GQA 3", "head_dim 256\n dtype bf16\n mask causal(bottom_right)", 3, 1, 7, 257, 2),
    ("f16 bottom-right rows that see no key", "head_dim 256\n dtype f16\n mask causal(bottom_right)", 2, 1, 113, 7, 1),
    ("f16 window softcap scale", "head_dim 256\n dtype f16\n mask window(left=100, right=7)\n softcap 30\n scale 0.3",
     2, 2, 300, 257, 1),
    ("bf16 none one row", "head_dim 256\n dtype bf16", 3, 1, 1, 113, 1),
    ("f16 causal seven", "head_dim 256\n dtype f16\n mask causal", 3, 1, 7, 7, 2),
    # softcap's one-pass recompute over a long walk: 9 steps per head, the heads of a group of 4
    # in turn (each step's last dQ box is added at the next step's top, at its own head and rows)
    ("bf16 none softcap GQA 4 520 x 130", "head_dim 256\n dtype bf16\n softcap 20", 4, 1, 520, 130, 1),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_matches_reference(case):
    name, body, hq, hkv, lq, lk, b = case
    spec = spec_of(body)
    _wide(spec)
    q, k, v = _qkv(np.random.default_rng(len(name)), b, lq, lk, hq, hkv)
    check_backward(spec, q, k, v)


@pytest.mark.parametrize("mask", ["causal(bottom_right)", "window(left=60)"])
def test_kv_lens_and_hidden_keys_holding_inf_and_nan(mask):
    spec = spec_of(f"head_dim 256\n dtype f16\n mask {mask}")
    _wide(spec)
    rng = np.random.default_rng(6)
    lens = np.array([0, 137, 300, 1], np.int32)
    q, k, v = _qkv(rng, 4, 70, 300, 3, 1)
    for bi, n in enumerate(lens):
        k[bi, n:] = np.inf
        v[bi, n:] = np.nan
    (dq, dk, dv), _ = check_backward(spec, q, k, v, call={"kv_lens": _ints(lens)}, ref_kw={"kv_lens": lens})
    for bi, n in enumerate(lens):
        assert not dk[bi, n:].any() and not dv[bi, n:].any()
    assert not dq[0].any()


def test_masked_keys_holding_nan_reach_no_row_that_does_not_see_them():
    """Causal: key 100 holds NaN in k, key 101 inf in v. Rows before 100 do not see them: their dq
    is the reference's; the rows that do see them get NaN (NaN in, NaN out)."""
    spec = spec_of("head_dim 256\n dtype f16\n mask causal")
    kernel = _wide(spec)
    import cupy
    rng = np.random.default_rng(9)
    q, k, v = _qkv(rng, 1, 130, 130, 2, 2)
    k[0, 100] = np.nan
    v[0, 101] = np.inf
    qd, kd, vd = (cupy.asarray(x).astype(cupy.float16) for x in (q, k, v))
    out, lse = kernel(qd, kd, vd, return_lse=True)
    dout = _rand(rng, *out.shape)
    dq = cupy.asnumpy(kernel.backward(qd, kd, vd, out, lse, cupy.asarray(dout).astype(cupy.float16))[0])
    want = attngen.reference_backward(spec, q, k, v, dout)[0]
    assert np.isfinite(dq[0, :100]).all()
    assert relative_error(dq[0, :100].astype(np.float64), want[0, :100]) <= 2 * tolerance(spec)
    assert np.isnan(dq[0, 100:]).any()


@pytest.mark.parametrize("mask", ["causal", "window(left=90, right=3)"])
def test_packed_sequences(mask):
    spec = spec_of(f"head_dim 256\n dtype bf16\n mask {mask}")
    _wide(spec)
    check_packed(spec, [1, 70, 257, 0, 130], [1, 200, 300, 3, 0], np.random.default_rng(5), hq=3, hkv=1)


@pytest.mark.parametrize("kind", ["boolean per head", "additive"])
def test_custom_mask(kind):
    """The BlockMask's kv tiles (the forward's) straddle the key blocks of 64: each step tests the
    mask per element where any overlapped tile is partial or absent."""
    spec = spec_of("head_dim 256\n dtype f16\n mask custom")
    kernel = _wide(spec)
    rng = np.random.default_rng(7)
    b, lq, lk, hq, hkv = 2, 300, 350, 3, 1
    q, k, v = _qkv(rng, b, lq, lk, hq, hkv)
    if kind == "additive":
        m = np.where(_documents(lq, lk, rng)[None, None], rng.standard_normal((b, 1, lq, lk)), -np.inf)
        m = m.astype(np.float32)
        m[:, :, 3] = -np.inf
        m[:, :, :, 320:] = -np.inf
    else:
        m = np.stack([_documents(lq, lk, rng) for _ in range(hq)])[None]
        m[..., :128, :160] = True  # whole BlockMask tiles, full
        m[..., 150:160, :] = False
        m[..., 340:] = False
    bm = attngen.block_mask(_mask(m), kernel)
    (dq, dk, dv), _ = check_backward(spec, q, k, v, call={"mask": bm}, ref_kw={"mask": m})
    rows = slice(3, 4) if kind == "additive" else slice(150, 160)
    assert not dq[:, rows].any()
    keys = slice(320, None) if kind == "additive" else slice(340, None)
    assert not dk[:, keys].any() and not dv[:, keys].any()


def test_agrees_with_the_deterministic_family():
    body = "head_dim 256\n heads q=3 kv=1\n dtype f16\n mask causal"
    fast, slow = spec_of(body), spec_of(body + "\n target cuda { backward=deterministic }")
    _wide(fast)
    assert cuda_backward.family(kernel_for(slow, "cuda").plan) == "fma"
    rng = np.random.default_rng(11)
    q, k, v = _qkv(rng, 1, 200, 200, 3, 1)
    got, _ = check_backward(fast, q, k, v)
    again, _ = check_backward(slow, q, k, v)
    for a, b_ in zip(got, again):
        assert np.linalg.norm(a - b_) <= 2e-3 * np.linalg.norm(b_)
