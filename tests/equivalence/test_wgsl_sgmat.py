"""The WGSL family on subgroup matrices (issue 43; `target wgsl { matrix=on }`) against the float64
reference, on an adapter that offers f16 subgroup matrices: Dawn on NVIDIA's Vulkan driver
(ATTNGEN_WGPU=wgpudawn on the GPU machine; the runtime sets the f16 toggle itself). Elsewhere
(wgpu-py, SwiftShader, lavapipe) every test skips, naming why. The sources are validated by Tint
on the CPU machine: tests/backends/wgsl/test_sgmat.py."""

from __future__ import annotations

import numpy as np
import pytest

from attngen.reference import reference, relative_error, tolerance

import attngen
from conftest import check_against_reference, kernel_for, random_qkv, require, spec_of, to_device
from test_hidden_keys import _compare, _np, _plant
from test_variants import check

MASKS = ["none", "causal", "causal(bottom_right)", "window(left=37, right=5)", "custom"]
SHAPES = [(1, 1), (7, 7), (113, 113), (1023, 1023), (1, 113), (7, 1023), (257, 300), (1023, 113)]  # (Lq, Lk)


def require_matrices():
    """Skip unless the live adapter's profile offers a config the family plans with."""
    require("wgsl")
    from attngen import backends
    from attngen.backends.wgsl.devices import RUNTIME, adapter_profile
    from attngen.backends.wgsl.matrix import choose
    prof = adapter_profile(backends.get("wgsl"))
    if choose(prof) is None:
        pytest.skip(f"the adapter ({prof.name}, runtime {RUNTIME}) offers no f16 subgroup matrices: "
                    "run with ATTNGEN_WGPU=wgpudawn on the NVIDIA machine")


def sgmat_spec(d, mask, extra=""):
    return spec_of(f"head_dim {d}\n dtype f16\n mask {mask}\n {extra}\n target wgsl {{ matrix=on }}")


@pytest.mark.parametrize("d", [64, 128])
def test_the_kernel_is_the_subgroup_matrix_family(d):
    require_matrices()
    kernel = kernel_for(sgmat_spec(d, "causal"), "wgsl")
    assert kernel.plan.config.matrix is not None


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{a}x{b}" for a, b in SHAPES])
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("d", [64, 128])
def test_matches_the_reference(d, mask, shape):
    require_matrices()
    lq, lk = shape
    spec = sgmat_spec(d, mask)
    q, k, v = random_qkv(spec, 2, lq, lk, heads_q=6, heads_kv=2, seed=lq + lk)  # GQA groups of 3
    check_against_reference(spec, "wgsl", q, k, v)


@pytest.mark.parametrize("mask", ["none", "causal"])
def test_softcap(mask):
    require_matrices()
    spec = sgmat_spec(128, mask, "softcap 30")
    q, k, v = random_qkv(spec, 1, 257, 300, heads_q=3, heads_kv=1, seed=5, scale=3.0)
    check_against_reference(spec, "wgsl", q, k, v)


def test_large_scores_rescale_acc():
    """Scores that grow along the keys: rows' maxima move by far more than the lazy-rescaling
    threshold from tile to tile, so acc is rescaled (the rare path) many times."""
    require_matrices()
    spec = sgmat_spec(64, "none")
    q, k, v = random_qkv(spec, 1, 70, 300, heads_q=2, heads_kv=2, seed=9)
    k = k * np.linspace(0.1, 6.0, 300, dtype=np.float32)[None, :, None, None]
    check_against_reference(spec, "wgsl", q, k, v)


@pytest.mark.parametrize("mask", ["causal", "causal(bottom_right)", "window(left=9, right=3)"])
def test_inf_and_nan_in_hidden_keys(mask):
    """Keys some rows do not see hold inf / NaN in K and V: those rows match the reference, with
    no NaN (V's non-finite values take the scalar path, p > 0 only); the others are not finite."""
    require_matrices()
    rng = np.random.default_rng(11)
    b, lq, lk, hq, hkv, d = 2, 57, 83, 6, 2, 64
    spec = sgmat_spec(d, mask)
    q = rng.standard_normal((b, lq, hq, d)).astype(np.float32)
    k = rng.standard_normal((b, lk, hkv, d)).astype(np.float32)
    v = rng.standard_normal((b, lk, hkv, d)).astype(np.float32)
    k, v = _plant(k, v, [lq // 2, lq // 2 + 1, lk - 1, 2, lk - 20])
    out, lse = kernel_for(spec, "wgsl")(*to_device("wgsl", "f16", q, k, v), return_lse=True)
    with np.errstate(invalid="ignore", over="ignore"):
        ref, ref_lse = reference(spec, q, k, v, return_lse=True)
    _compare(spec, _np(out), _np(lse), ref, ref_lse)


def test_kv_lens_and_rows_that_see_no_key():
    """kv_lens (one sequence with no key: out 0, lse -inf) with poison past each length."""
    require_matrices()
    rng = np.random.default_rng(12)
    b, lq, hq, hkv, d = 3, 40, 6, 2, 128
    lens = np.array([0, 37, 70], np.int32)
    spec = sgmat_spec(d, "causal(bottom_right)")
    q = rng.standard_normal((b, lq, hq, d)).astype(np.float32)
    k = rng.standard_normal((b, 80, hkv, d)).astype(np.float32)
    v = rng.standard_normal((b, 80, hkv, d)).astype(np.float32)
    for bi in range(b):
        k[bi, lens[bi]:] = np.nan
        v[bi, lens[bi]:] = -np.inf
    out, lse = kernel_for(spec, "wgsl")(*to_device("wgsl", "f16", q, k, v), return_lse=True, kv_lens=lens)
    ref, ref_lse = reference(spec, q, k, v, return_lse=True, kv_lens=lens)
    out, lse = _np(out), _np(lse)
    assert np.isfinite(out).all() and not np.isnan(lse).any()
    assert relative_error(out, ref) <= tolerance(spec)
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse))


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mask", ["none", "causal", "window(left=9, right=3)"])
def test_packed_sequences(mask, d):
    """cu_seqlens: sequences of 1, 7, 113, 0 and 300 rows (Lq != Lk), GQA 3."""
    require_matrices()
    rng = np.random.default_rng(13)
    spec = sgmat_spec(d, mask)
    lq, lk = [1, 7, 113, 0, 300], [1, 20, 113, 3, 257]
    cuq = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    cuk = np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)
    q = rng.standard_normal((cuq[-1], 6, d)).astype(np.float32)
    k, v = (rng.standard_normal((cuk[-1], 2, d)).astype(np.float32) for _ in range(2))
    check(spec, "wgsl", q, k, v, cu_seqlens_q=cuq, cu_seqlens_k=cuk, ref_kw={"cu_seqlens_q": cuq, "cu_seqlens_k": cuk})


@pytest.mark.parametrize("d", [64, 128])
def test_custom_mask_skips_dead_tiles(d):
    """A block-diagonal mask (documents of 40 keys) with holes: most K/V tiles are dead (the
    BlockMask's lists skip them), some partial; a row that sees nothing gives 0 and lse -inf."""
    require_matrices()
    rng = np.random.default_rng(14)
    spec = sgmat_spec(d, "custom")
    b, lq, lk = 2, 1023, 1023
    doc_q, doc_k = np.arange(lq)[:, None] // 40, np.arange(lk)[None, :] // 40
    mask = np.broadcast_to((doc_q == doc_k) & (rng.random((lq, lk)) > 0.1), (b, 1, lq, lk)).copy()
    mask[1, 0, 5] = False  # a row that sees no key
    q = rng.standard_normal((b, lq, 6, d)).astype(np.float32)
    k, v = (rng.standard_normal((b, lk, 2, d)).astype(np.float32) for _ in range(2))
    bm = attngen.block_mask(mask, kernel_for(spec, "wgsl"))
    assert 0 < bm.density < 0.3 and bm.partial_tiles > 0  # most tile pairs skipped, some partial
    check(spec, "wgsl", q, k, v, mask=bm, ref_kw={"mask": mask}, expect_empty_rows=True)


@pytest.mark.parametrize("mask", ["causal", "custom"])
def test_softcap_with_gqa_and_odd_lengths(mask):
    require_matrices()
    spec = sgmat_spec(64, mask, "softcap 20")
    q, k, v = random_qkv(spec, 2, 113, 1023, heads_q=6, heads_kv=2, seed=15, scale=3.0)
    check_against_reference(spec, "wgsl", q, k, v)


# ---- matrix=auto (the default): the family wherever the adapter offers a config ---------------------
# The specs below say nothing of `matrix`: on an adapter with f16 subgroup matrices auto plans the
# family (matrix.auto_picks), and these check it there, including the sequence layouts and the
# quantized caches the tests above do not run (paged caches, appends, kv_dtype).

def auto_spec(d, mask, extra=""):
    return spec_of(f"head_dim {d}\n dtype f16\n mask {mask}\n {extra}")


@pytest.mark.parametrize("d", [64, 128])
def test_auto_plans_the_family_on_this_adapter(d):
    require_matrices()
    kernel = kernel_for(auto_spec(d, "causal"), "wgsl")
    assert kernel.plan.config.matrix is not None and "subgroup_matrix" in kernel.manifest


AUTO_SHAPES = [(1, 1), (7, 1023), (113, 113), (1023, 113)]


@pytest.mark.parametrize("shape", AUTO_SHAPES, ids=[f"{a}x{b}" for a, b in AUTO_SHAPES])
@pytest.mark.parametrize("mask", ["none", "causal", "window(left=37, right=5)", "custom"])
@pytest.mark.parametrize("d", [64, 128])
def test_auto_matches_the_reference(d, mask, shape):
    require_matrices()
    lq, lk = shape
    spec = auto_spec(d, mask)
    assert kernel_for(spec, "wgsl").plan.config.matrix is not None
    q, k, v = random_qkv(spec, 2, lq, lk, heads_q=6, heads_kv=2, seed=lq * 3 + lk)  # GQA groups of 3
    check_against_reference(spec, "wgsl", q, k, v)


@pytest.mark.parametrize("body", [
    "head_dim 64\n dtype f32\n mask causal",                      # f32 storage
    "head_dim 96\n dtype f16\n mask causal",                      # another head dim
    "head_dim 128\n dtype f16\n schedule split_kv(auto)",         # a decode schedule
    "head_dim 64\n dtype f16\n mask k % 3 != 1",                  # a mask expression
])
def test_auto_runs_what_the_family_refuses_on_the_scalar_family(body):
    require_matrices()
    spec = spec_of(body)
    assert kernel_for(spec, "wgsl").plan.config.matrix is None
    q, k, v = random_qkv(spec, 2, 113, 300, heads_q=6, heads_kv=2, seed=3)
    check_against_reference(spec, "wgsl", q, k, v)


@pytest.mark.parametrize("lq", [1, 5, 70])
@pytest.mark.parametrize("d", [64, 128])
def test_auto_over_a_paged_cache(d, lq):
    """kv_cache paged: shuffled pages, kv_lens, a block table with junk past each sequence."""
    require_matrices()
    spec = auto_spec(d, "causal(bottom_right)", "kv_cache paged(page=16)")
    assert kernel_for(spec, "wgsl").plan.config.matrix is not None
    q, k, v = random_qkv(spec, 3, lq, 200, heads_q=6, heads_kv=2, seed=lq + d)
    check_against_reference(spec, "wgsl", q, k, v)


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_auto_with_an_append(paged):
    """Rows appended to the cache in the call (chunked prefill): the output, and the cache holds them."""
    require_matrices()
    from test_variants import _append_reference, paged_cache
    cache = "paged(page=16)" if paged else "contiguous"
    spec = auto_spec(64, "causal(bottom_right)", f"kv_cache {cache}")
    kernel = kernel_for(spec, "wgsl")
    assert kernel.plan.config.matrix is not None
    rng = np.random.default_rng(8)
    lens, lnew = np.array([0, 13, 100], np.int32), 37
    if paged:
        k, v, table, _ = paged_cache(rng, lens + lnew, 16, 2, 64, 64)
        table = np.minimum(table, len(k) - 1)
    else:
        k, v = (rng.standard_normal((3, 140, 2, 64)).astype(np.float32) for _ in range(2))
        table = None
    k, v = k.astype(np.float16), v.astype(np.float16)
    k_new, v_new, q = (rng.standard_normal(s).astype(np.float16) for s in ((3, lnew, 2, 64),) * 2 + ((3, lnew, 6, 64),))
    k_after, v_after = _append_reference(k, v, k_new, v_new, lens, table)
    extra = {"block_table": table} if paged else {}
    out, lse = kernel(q, k, v, kv_lens=lens, k_new=k_new, v_new=v_new, return_lse=True, **extra)
    ref_kw = {"kv_lens": lens + lnew, **extra}
    ref = reference(spec, q.astype(np.float32), k_after.astype(np.float32), v_after.astype(np.float32), **ref_kw)
    assert relative_error(_np(out), ref) <= tolerance(spec)
    assert np.array_equal(k, k_after) and np.array_equal(v, v_after)


@pytest.mark.parametrize("kv_dtype", ["i8", "e4m3", "e5m2"])
def test_auto_over_a_quantized_cache(kv_dtype):
    """kv_dtype: K and V one byte per value, decoded into the f16 tiles the matrices read."""
    require_matrices()
    spec = auto_spec(128, "causal(bottom_right)", f"kv_dtype {kv_dtype}")
    kernel = kernel_for(spec, "wgsl")
    assert kernel.plan.config.matrix is not None
    rng = np.random.default_rng(44)
    q = rng.standard_normal((2, 113, 6, 128)).astype(np.float16)
    (k, ks), (v, vs) = (attngen.quantize_kv(rng.standard_normal((2, 300, 2, 128)), kv_dtype) for _ in "kv")
    out, lse = kernel(q, k, v, k_scale=ks, v_scale=vs, return_lse=True)
    ref, ref_lse = reference(spec, q, k, v, k_scale=ks, v_scale=vs, return_lse=True)
    assert relative_error(_np(out), ref) <= tolerance(spec)
    assert np.abs(_np(lse) - ref_lse).max() <= 1e-3 * np.abs(ref_lse).max()
