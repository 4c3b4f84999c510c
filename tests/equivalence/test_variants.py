"""Issue 3's variants on both targets, against the float64 reference (docs/variants.md).

Custom masks with block lists, packed variable-length batches, per-sequence KV lengths, paged
caches, appending to a cache in the same call, split_kv / two_pass, lse + merge. Shapes are
small and odd (1, 7, 113 ...), Lq != Lk, GQA groups 1, 4 and 7; CUDA runs where a GPU is
present, WGSL on whatever adapter is present (lavapipe in CI).
"""

from __future__ import annotations

import numpy as np
import pytest

import attngen
from attngen.runtime.blockmask import reference_block_mask
from attngen.reference import reference, relative_error, to_numpy, tolerance

from conftest import kernel_for, require, spec_of, to_device

TARGETS = ["cuda", "wgsl"]


def _np(x):
    from attngen.reference import to_numpy
    return np.asarray(to_numpy(x), dtype=np.float64)


def _rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _device_ints(target, a):
    """Integer inputs as the target's users pass them: CuPy on cuda, numpy on wgsl."""
    a = np.asarray(a, dtype=np.int32)
    if target == "cuda":
        import cupy
        return cupy.asarray(a)
    return a


def _device_mask(target, m):
    if target == "cuda":
        import cupy
        return cupy.asarray(m)
    return m


def check(spec, target, q, k, v, *, ref_kw=None, expect_empty_rows=None, **kw):
    """Run the kernel with options kw; compare out and lse with the reference."""
    kernel = kernel_for(spec, target)
    dq, dk, dv = to_device(target, spec.dtype, q, k, v)
    out, lse = kernel(dq, dk, dv, return_lse=True, **kw)
    out, lse = _np(out), _np(lse)
    ref, ref_lse = reference(spec, q, k, v, return_lse=True, **(ref_kw or {}))
    assert out.shape == ref.shape and lse.shape == ref_lse.shape
    assert not np.isnan(out).any() and not np.isnan(lse).any(), "NaN"
    err = relative_error(out, ref)
    assert err <= tolerance(spec), f"{target}: relative error {err:.3g} > {tolerance(spec):g}"
    empty = np.isneginf(ref_lse)
    assert np.array_equal(np.isneginf(lse), empty), "lse is -inf exactly for rows that see no key"
    if expect_empty_rows:
        assert empty.any(), "the case was meant to have rows that see no key"
    ok = ~empty
    if ok.any():
        assert np.abs(lse[ok] - ref_lse[ok]).max() <= 1e-2 * max(1.0, np.abs(ref_lse[ok]).max())
    # rows that see no key output exactly 0
    if out.ndim == 4:
        rows = np.transpose(empty, (0, 2, 1))
    else:
        rows = np.transpose(empty, (1, 0))
    assert np.all(out[rows] == 0)
    return out, lse


# ---- custom masks ------------------------------------------------------------------------------

def document_mask(lq, lk, bounds_q, bounds_k, causal=True):
    """Block-diagonal (documents) mask, causal within each document."""
    m = np.zeros((lq, lk), bool)
    for (q0, q1), (k0, k1) in zip(zip(bounds_q, bounds_q[1:]), zip(bounds_k, bounds_k[1:])):
        blk = np.ones((q1 - q0, k1 - k0), bool)
        if causal:
            blk = np.tril(blk, k=(k1 - k0) - (q1 - q0))
        m[q0:q1, k0:k1] = blk
    return m


MASK_CASES = [
    # (name, spec body, B, Lq, Lk, Hq, Hkv, mask shape kind)
    ("bool 2d docs gqa7", "head_dim 64\n dtype f16\n mask custom", 2, 113, 113, 7, 1, "docs"),
    ("bool 4d random", "head_dim 32\n dtype f32\n mask custom", 2, 37, 70, 4, 2, "random4"),
    ("bool per-head", "head_dim 40\n dtype f16\n mask custom\n softcap 20", 1, 70, 129, 4, 1, "heads"),
    ("additive", "head_dim 64\n dtype f16\n mask custom", 2, 65, 200, 4, 4, "additive"),
    ("empty rows and tiles", "head_dim 64\n dtype f16\n mask custom\n tile q=16 kv=16", 1, 90, 90, 4, 4, "holes"),
]


def make_mask(kind, rng, b, lq, lk, hq):
    if kind == "docs":
        return document_mask(lq, lk, [0, 1, 8, 60, lq], [0, 1, 8, 60, lk])
    if kind == "random4":
        return rng.random((b, hq, lq, lk)) < 0.3
    if kind == "heads":
        return np.stack([np.tril(np.ones((lq, lk), bool), k=lk - lq - 16 * h) for h in range(hq)])
    if kind == "additive":
        m = rng.standard_normal((b, 1, lq, lk)).astype(np.float32)
        m[:, :, :, 100:] = -np.inf  # whole kv tiles masked
        m[:, :, 3] = -np.inf  # a fully masked row
        return m
    if kind == "holes":
        m = document_mask(lq, lk, [0, 30, 31, lq], [0, 40, 41, lk], causal=False)
        m[50:70] = False  # rows that see no key
        return m
    raise ValueError(kind)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", MASK_CASES, ids=lambda c: c[0])
def test_custom_mask(case, target):
    require(target)
    name, body, b, lq, lk, hq, hkv, kind = case
    spec = spec_of(body)
    rng = np.random.default_rng(len(name))
    q, k, v = _rand(rng, b, lq, hq, spec.head_dim_qk), _rand(rng, b, lk, hkv, spec.head_dim_qk), \
        _rand(rng, b, lk, hkv, spec.head_dim_v)
    mask = make_mask(kind, rng, b, lq, lk, hq)
    kernel = kernel_for(spec, target)
    bm = attngen.block_mask(_device_mask(target, mask), kernel)
    oracle = reference_block_mask(mask, kernel.plan.tile_q, kernel.plan.tile_kv)
    assert np.array_equal(_np(bm.counts).astype(np.int64), oracle.counts), "device block lists = numpy oracle"
    assert np.array_equal(_np(bm.tiles).astype(np.int64), oracle.tiles)
    assert (bm.live_tiles, bm.partial_tiles) == (oracle.live_tiles, oracle.partial_tiles)
    check(spec, target, q, k, v, mask=bm, ref_kw={"mask": mask},
          expect_empty_rows=kind in ("additive", "holes"))  # docs: every row sees its diagonal
    # a raw mask works too (the BlockMask is built for the call), and the BlockMask is reusable
    check(spec, target, q, k, v, mask=_device_mask(target, mask), ref_kw={"mask": mask})
    check(spec, target, q, k, v, mask=bm, ref_kw={"mask": mask})


@pytest.mark.parametrize("target", TARGETS)
def test_custom_mask_with_packed_sequences(target):
    require(target)
    spec = spec_of("head_dim 32\n dtype f32\n mask custom")
    rng = np.random.default_rng(3)
    lens = [5, 0, 40, 17]
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    total = int(cu[-1])
    q, k, v = _rand(rng, total, 4, 32), _rand(rng, total, 2, 32), _rand(rng, total, 2, 32)
    mask = rng.random((len(lens), 1, max(lens), max(lens))) < 0.5
    bm = attngen.block_mask(_device_mask(target, mask), kernel_for(spec, target))
    check(spec, target, q, k, v, mask=bm, cu_seqlens_q=_device_ints(target, cu),
          ref_kw={"mask": mask, "cu_seqlens_q": cu})


# ---- packed sequences and kv_lens --------------------------------------------------------------

@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("mask", ["none", "causal", "causal(bottom_right)", "window(left=9, right=3)"])
def test_packed_documents(mask, target):
    require(target)
    spec = spec_of(f"head_dim 64\n dtype f16\n mask {mask}")
    rng = np.random.default_rng(5)
    lq, lk = [1, 7, 113, 0, 30], [1, 20, 113, 3, 0]
    cuq = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    cuk = np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)
    q, k, v = _rand(rng, cuq[-1], 7, 64), _rand(rng, cuk[-1], 1, 64), _rand(rng, cuk[-1], 1, 64)
    check(spec, target, q, k, v, cu_seqlens_q=_device_ints(target, cuq), cu_seqlens_k=_device_ints(target, cuk),
          ref_kw={"cu_seqlens_q": cuq, "cu_seqlens_k": cuk})


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("mask", ["none", "causal(bottom_right)", "window(left=20)"])
def test_kv_lens(mask, target):
    require(target)
    spec = spec_of(f"head_dim 96\n dtype f16\n mask {mask}")
    rng = np.random.default_rng(6)
    lens = np.array([0, 37, 100, 1], np.int32)
    q, k, v = _rand(rng, 4, 7, 8, 96), _rand(rng, 4, 100, 2, 96), _rand(rng, 4, 100, 2, 96)
    check(spec, target, q, k, v, kv_lens=_device_ints(target, lens), ref_kw={"kv_lens": lens},
          expect_empty_rows=True)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("ints, width", [("host", "cache"), ("host", "longest"), ("device", "cache")])
def test_a_custom_mask_as_wide_as_the_cache_with_kv_lens(width, ints, target):
    """With kv_lens a mask's keys are cache positions: a mask as wide as the cache (one BlockMask
    for every decode step) or as wide as the longest sequence gives the reference's answer.
    (Before, host kv_lens took only the longest sequence's width, device kv_lens only the cache's.)"""
    require(target)  # (with kv_lens on the device the mask covers the cache: docs/variants.md)
    spec = spec_of("head_dim 64\n dtype f16\n heads q=6 kv=2\n mask custom")
    rng = np.random.default_rng(17)
    lens = np.array([37, 0, 113, 1], np.int32)
    q, k, v = _rand(rng, 4, 7, 6, 64), _rand(rng, 4, 150, 2, 64), _rand(rng, 4, 150, 2, 64)
    mask = rng.random((4, 1, 7, 150 if width == "cache" else 113)) > 0.3
    mask[0, 0, 2] = False  # a row that sees nothing
    lens_in = _device_ints(target, lens) if ints == "device" else lens
    bm = attngen.block_mask(_device_mask(target, mask), kernel_for(spec, target))
    check(spec, target, q, k, v, mask=bm, kv_lens=lens_in, ref_kw={"kv_lens": lens, "mask": mask},
          expect_empty_rows=True)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("schedule", ["fused", "split_kv(auto)", "two_pass"])
def test_a_cache_wide_mask_over_a_paged_cache_with_junk_past_the_pages(schedule, target):
    """A mask as wide as the block table's columns x page, over sequences whose block-table rows
    hold junk past their pages: the kernels read no page past a sequence's kv_len, whatever the
    mask's lists (which reach to the mask's width), on every schedule."""
    require(target)
    spec = spec_of(f"head_dim 64\n dtype f16\n heads q=4 kv=2\n mask custom\n kv_cache paged(page=16)\n"
                   f" schedule {schedule}")
    rng = np.random.default_rng(23)
    lens = np.array([37, 0, 70, 1], np.int32)
    kp, vp, table, _ = paged_cache(rng, lens, 16, 2, 64, 64)
    width = table.shape[1] * 16
    q = _rand(rng, 4, 3, 4, 64)
    mask = rng.random((4, 1, 3, width)) > 0.2
    bm = attngen.block_mask(_device_mask(target, mask), kernel_for(spec, target))
    check(spec, target, q, kp, vp, mask=bm, kv_lens=lens, block_table=table,
          ref_kw={"kv_lens": lens, "block_table": table, "mask": mask}, expect_empty_rows=True)


# ---- paged caches and appending -----------------------------------------------------------------

def paged_cache(rng, lens, page, hkv, d, dv, spare=3):
    """K/V pages for sequences of `lens` keys, shuffled, plus the block table (junk past the end)."""
    pages_per = [-(-int(n) // page) for n in lens]
    n_pages = sum(pages_per) + spare
    order = rng.permutation(n_pages)
    width = max(pages_per) + 1
    table = np.full((len(lens), width), 10**6, np.int32)  # never read: past each sequence's pages
    at = 0
    for b, n in enumerate(pages_per):
        table[b, :n] = order[at:at + n]
        at += n
    k = _rand(rng, n_pages, page, hkv, d)
    v = _rand(rng, n_pages, page, hkv, dv)
    return k, v, table, order[at:]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("lq", [1, 5])
def test_paged(lq, target):
    require(target)
    spec = spec_of("head_dim 64\n dtype f16\n mask causal(bottom_right)\n kv_cache paged(page=16)")
    rng = np.random.default_rng(7)
    lens = np.array([1, 33, 64, 5], np.int32)
    k, v, table, _ = paged_cache(rng, lens, 16, 2, 64, 64)
    q = _rand(rng, 4, lq, 8, 64)
    check(spec, target, q, k, v, kv_lens=_device_ints(target, lens), block_table=_device_ints(target, table),
          ref_kw={"kv_lens": lens, "block_table": np.minimum(table, len(k) - 1)})


def _append_reference(k, v, k_new, v_new, lens, table=None):
    """The cache after appending (host), for the reference and for checking the kernel's writes."""
    k, v = k.copy(), v.copy()
    page = k.shape[1]
    for b in range(k_new.shape[0]):
        for i in range(k_new.shape[1]):
            j = int(lens[b]) + i
            if table is None:
                k[b, j], v[b, j] = k_new[b, i], v_new[b, i]
            else:
                p = table[b, j // page]
                k[p, j % page], v[p, j % page] = k_new[b, i], v_new[b, i]
    return k, v


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_append(paged, target):
    require(target)
    cache = "paged(page=8)" if paged else "contiguous"
    spec = spec_of(f"head_dim 32\n dtype f32\n mask causal(bottom_right)\n kv_cache {cache}")
    rng = np.random.default_rng(8)
    lens = np.array([0, 13, 30], np.int32)
    lnew = 3
    if paged:
        k, v, table, _ = paged_cache(rng, lens + lnew, 8, 4, 32, 32)
        table = np.minimum(table, len(k) - 1)
    else:
        k, v, table = _rand(rng, 3, 40, 4, 32), _rand(rng, 3, 40, 4, 32), None
    k_new, v_new = _rand(rng, 3, lnew, 4, 32), _rand(rng, 3, lnew, 4, 32)
    q = _rand(rng, 3, lnew, 4, 32)
    k_after, v_after = _append_reference(k, v, k_new, v_new, lens, table)
    kernel = kernel_for(spec, target)
    dk, dv = to_device(target, "f32", k, v)
    dq, dkn, dvn = to_device(target, "f32", q, k_new, v_new)
    extra = {"block_table": _device_ints(target, table)} if paged else {}
    out, lse = kernel(dq, dk, dv, kv_lens=_device_ints(target, lens), k_new=dkn, v_new=dvn,
                      return_lse=True, **extra)
    ref_kw = {"kv_lens": lens + lnew, **({"block_table": table} if paged else {})}
    ref = reference(spec, q, k_after, v_after, **ref_kw)
    assert relative_error(out, ref) <= tolerance(spec)
    # the cache now holds the new rows, and nothing else changed
    assert np.array_equal(_np(dk), k_after.astype(np.float64))
    assert np.array_equal(_np(dv), v_after.astype(np.float64))


# ---- decode schedules ----------------------------------------------------------------------------

SCHEDULES = ["split_kv(3)", "split_kv(auto)", "two_pass"]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("schedule", SCHEDULES + ["split_kv(3) decode"])  # decode: target wgsl { decode=on }
@pytest.mark.parametrize("lq, hq, hkv, mask", [
    (1, 8, 2, "none"),                         # decode, GQA 4
    (1, 7, 1, "none"),                         # decode, GQA 7
    (1, 4, 4, "window(left=50)"),              # decode, no GQA
    (13, 8, 2, "causal(bottom_right)"),        # chunked prefill
])
def test_schedules(schedule, lq, hq, hkv, mask, target):
    require(target)
    schedule, _, decode = schedule.partition(" ")
    kernel = f"\n target wgsl {{ decode={'on' if decode else 'off'} }}" if schedule.startswith("split_kv") else ""
    spec = spec_of(f"head_dim 64\n dtype f16\n mask {mask}\n schedule {schedule}{kernel}")
    rng = np.random.default_rng(9)
    q, k, v = _rand(rng, 2, lq, hq, 64), _rand(rng, 2, 301, hkv, 64), _rand(rng, 2, 301, hkv, 64)
    check(spec, target, q, k, v)
    lens = np.array([0, 200], np.int32)  # a sequence with no keys: its splits all see nothing
    check(spec, target, q, k, v, kv_lens=_device_ints(target, lens), ref_kw={"kv_lens": lens},
          expect_empty_rows=True)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("schedule", ["split_kv(4)", "two_pass"])
def test_schedules_over_paged_cache(schedule, target):
    require(target)
    spec = spec_of(f"head_dim 128\n dtype f16\n kv_cache paged(page=32)\n schedule {schedule}")
    rng = np.random.default_rng(10)
    lens = np.array([300, 1, 64], np.int32)
    k, v, table, _ = paged_cache(rng, lens, 32, 2, 128, 128)
    table = np.minimum(table, len(k) - 1)
    q = _rand(rng, 3, 1, 8, 128)
    check(spec, target, q, k, v, kv_lens=_device_ints(target, lens), block_table=_device_ints(target, table),
          ref_kw={"kv_lens": lens, "block_table": table})


def split_mask(rng, b, lq, lk, hq):
    """A (B, Hq, Lq, Lk) mask for tiles q=16 kv=16 whose block lists differ per query head:
    random partial tiles, kv tiles that are empty for every head and others empty for one head,
    fully masked rows, and (Lq > 16) a q tile with no live kv tile at all."""
    m = rng.random((b, hq, lq, lk)) < 0.6
    m[..., 112:144] = False                      # kv tiles 7 and 8: empty everywhere
    for h in range(hq):
        t = (3 * h) % 7                          # one more empty kv tile per head, not the same
        m[:, h, :, 16 * t:16 * t + 16] = False
    m[:, 2, 0] = False                           # a row of head 2 sees no key
    if lq > 20:
        m[:, :, 20] = False                      # row 20 sees no key in any head
        m[1, 5, 16:32] = False                   # q tile 1 of (batch 1, head 5): an empty list
    return m


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("lq", [1, 37])
def test_custom_mask_with_split_schedules(lq, schedule, target):
    """mask custom with split_kv / two_pass: a block's rows are one query head's (the block lists
    are per head, so GQA groups are not packed), and the splits share each q tile's list; every
    live tile is visited once, splits with no tile weigh 0, rows that see no key get 0 / -inf."""
    require(target)
    spec = spec_of(f"head_dim 32\n dtype f32\n mask custom\n tile q=16 kv=16\n schedule {schedule}")
    rng = np.random.default_rng(11 + lq)
    b, lk, hq, hkv = 2, 200, 8, 2                # GQA group 4
    q, k, v = _rand(rng, b, lq, hq, 32), _rand(rng, b, lk, hkv, 32), _rand(rng, b, lk, hkv, 32)
    mask = split_mask(rng, b, lq, lk, hq)
    bm = attngen.block_mask(_device_mask(target, mask), kernel_for(spec, target))
    counts = _np(bm.counts)
    assert counts.min() < counts.max() and counts.max() > 3, "lists of different lengths, some over 3 splits"
    if lq > 16:
        assert counts.min() == 0, "a q tile with an empty list"
    check(spec, target, q, k, v, mask=bm, ref_kw={"mask": mask}, expect_empty_rows=True)
    # a mask shared by all heads (Hm = 1) and an additive one take the same paths
    shared = mask[:, :1]
    check(spec, target, q, k, v, mask=_device_mask(target, shared), ref_kw={"mask": shared},
          expect_empty_rows=lq > 20)
    additive = np.where(mask, rng.standard_normal(mask.shape), -np.inf).astype(np.float32)
    check(spec, target, q, k, v, mask=_device_mask(target, additive), ref_kw={"mask": additive},
          expect_empty_rows=True)


# ---- lse and merge -------------------------------------------------------------------------------

@pytest.mark.parametrize("target", TARGETS)
def test_merge_halves_equals_one_call(target):
    require(target)
    spec = spec_of("head_dim 64\n dtype f32")
    rng = np.random.default_rng(11)
    q, k, v = _rand(rng, 2, 9, 4, 64), _rand(rng, 2, 150, 2, 64), _rand(rng, 2, 150, 2, 64)
    kernel = kernel_for(spec, target)
    parts = []
    for sl in (slice(0, 61), slice(61, 150), slice(150, 150)):  # the last part has no keys
        dq, dk, dv = to_device(target, "f32", q, np.ascontiguousarray(k[:, sl]), np.ascontiguousarray(v[:, sl]))
        parts.append(kernel(dq, dk, dv, return_lse=True))
    out, lse = attngen.merge([p[0] for p in parts], [p[1] for p in parts])
    ref, ref_lse = reference(spec, q, k, v, return_lse=True)
    assert relative_error(out, ref) <= 1e-5
    assert np.abs(_np(lse) - ref_lse).max() < 1e-4


def test_merge_numpy_rows_no_part_saw():
    out = np.ones((1, 3, 2, 4), np.float32)
    lse = np.array([[[0.0, -np.inf, 1.0]] * 2], np.float32)
    none = np.full_like(lse, -np.inf)
    o, l = attngen.merge([out, np.zeros_like(out)], [lse, none])
    assert np.array_equal(o[:, 1], np.zeros((1, 2, 4))) and np.isneginf(l[:, :, 1]).all()
    assert np.allclose(o[:, 0], 1) and np.allclose(l[:, :, 0], 0)


# ---- bad input --------------------------------------------------------------------------------

def _bad_call(target, body, q_shape=(2, 5, 4, 32), k_shape=(2, 40, 2, 32), **kw):
    spec = spec_of(body)
    kernel = kernel_for(spec, target)
    rng = np.random.default_rng(0)
    q, k, v = (_rand(rng, *s) for s in (q_shape, k_shape, k_shape))
    dq, dk, dv = to_device(target, spec.dtype, q, k, v)
    # integer inputs as host arrays: every target checks their contents before the launch (on the
    # GPU the CUDA kernels check them: tests/backends/cuda/test_calls.py)
    conv = {n: np.asarray(a) if n in ("kv_lens", "cu_seqlens_q", "cu_seqlens_k", "block_table") and a is not None
            else a for n, a in kw.items()}
    return lambda: kernel(dq, dk, dv, **conv)


BAD = [
    ("mask without custom", "head_dim 32\n dtype f32", {"mask": np.ones((5, 40), bool)}, "mask custom"),
    ("custom without mask", "head_dim 32\n dtype f32\n mask custom", {}, "pass mask="),
    ("mask shape", "head_dim 32\n dtype f32\n mask custom", {"mask": np.ones((5, 41), bool)}, "Lk=40"),
    ("mask heads", "head_dim 32\n dtype f32\n mask custom", {"mask": np.ones((3, 5, 40), bool)}, "head dimension 3"),
    ("mask dtype", "head_dim 32\n dtype f32\n mask custom", {"mask": np.ones((5, 40), np.int32)}, "boolean"),
    ("kv_lens too long", "head_dim 32\n dtype f32", {"kv_lens": [3, 41]}, "kv_lens[1] = 41"),
    ("kv_lens negative", "head_dim 32\n dtype f32", {"kv_lens": [3, -1]}, ">= 0"),
    ("kv_lens count", "head_dim 32\n dtype f32", {"kv_lens": [3]}, "1 entries"),
    ("kv_lens float", "head_dim 32\n dtype f32", {"kv_lens": np.array([1.0, 2.0])}, "integers"),
    ("block_table without paged", "head_dim 32\n dtype f32", {"block_table": [[0], [1]], "kv_lens": [1, 1]},
     "kv_cache paged"),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", BAD, ids=lambda c: c[0])
def test_bad_input(case, target):
    require(target)
    _, body, kw, message = case
    call = _bad_call(target, body, **kw)
    with pytest.raises(attngen.LaunchError, match=message.replace("[", r"\[").replace("]", r"\]")
                       .replace("(", r"\(").replace(")", r"\)")):
        call()


PAGED = "head_dim 32\n dtype f32\n kv_cache paged(page=8)"
PAGED_BAD = [
    ("table outside", {"block_table": [[0, 7], [1, 2]], "kv_lens": [9, 9]}, "block_table[0, 1] = 7 points outside"),
    ("table negative", {"block_table": [[0, -1], [1, 2]], "kv_lens": [9, 3]}, "block_table[0, 1] = -1"),
    ("too few pages", {"block_table": [[0], [1]], "kv_lens": [9, 3]}, "need 2 pages"),
    ("no kv_lens", {"block_table": [[0], [1]]}, "kv_lens"),
    ("no table", {"kv_lens": [1, 1]}, "block_table="),
    ("page size", {"block_table": [[0], [1]], "kv_lens": [1, 1], "k_shape": (5, 4, 2, 32)}, "page=8"),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", PAGED_BAD, ids=lambda c: c[0])
def test_bad_paged_input(case, target):
    require(target)
    _, kw, message = case
    kw = dict(kw)
    k_shape = kw.pop("k_shape", (5, 8, 2, 32))
    call = _bad_call(target, PAGED, q_shape=(2, 1, 4, 32), k_shape=k_shape, **kw)
    with pytest.raises(attngen.LaunchError, match=message.replace("[", r"\[").replace("]", r"\]")):
        call()


CU_BAD = [
    ("decreasing", [0, 6, 4, 10], "non-decreasing"),
    ("not from 0", [1, 4, 10], "start at 0"),
    ("wrong total", [0, 4, 9], "total length"),
    ("2d", [[0, 10]], "1 dimension"),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", CU_BAD, ids=lambda c: c[0])
def test_bad_cu_seqlens(case, target):
    require(target)
    _, cu, message = case
    call = _bad_call(target, "head_dim 32\n dtype f32", q_shape=(10, 4, 32), k_shape=(10, 2, 32),
                     cu_seqlens_q=np.array(cu))
    with pytest.raises(attngen.LaunchError, match=message):
        call()


@pytest.mark.parametrize("target", TARGETS)
def test_append_needs_room(target):
    require(target)
    spec = spec_of("head_dim 32\n dtype f32")
    kernel = kernel_for(spec, target)
    rng = np.random.default_rng(0)
    q, k, v = _rand(rng, 2, 3, 4, 32), _rand(rng, 2, 10, 2, 32), _rand(rng, 2, 10, 2, 32)
    kn = _rand(rng, 2, 3, 2, 32)
    dq, dk, dv, dkn = to_device(target, "f32", q, k, v, kn)
    with pytest.raises(attngen.LaunchError, match=r"kv_lens\[1\] = 8 \+ 3 new keys exceed"):
        kernel(dq, dk, dv, kv_lens=np.array([2, 8]), k_new=dkn, v_new=dkn)  # a host array: checked at once
    if target == "cuda":  # on the GPU the kernel checks it: check=True raises at once (docs/cuda-calls.md)
        before = to_numpy(dk).copy()
        with pytest.raises(attngen.LaunchError, match=r"kv_lens\[1\]"):
            kernel(dq, dk, dv, kv_lens=_device_ints(target, [2, 8]), k_new=dkn, v_new=dkn, check=True)
        after = to_numpy(dk)
        assert (after[1] == before[1]).all()  # the bad sequence appended nothing
        assert (after[0, 2:5] == to_numpy(dkn)[0]).all()  # the good one did
    with pytest.raises(attngen.LaunchError, match="pass kv_lens"):
        kernel(dq, dk, dv, k_new=dkn, v_new=dkn)
