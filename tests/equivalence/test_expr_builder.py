"""Masks over inputs (issue 42) on target wgsl: the generated block-mask builder
(attngen/backends/wgsl/expr_blockmask.py) and the `mask custom` kernel it feeds, against the float64
reference: document ids and prefix-LM, odd lengths, Lq != Lk, GQA with groups of 3, kv_lens, a row
that sees no key; the BlockMask against the numpy oracle; when the kernel builds it again (the
cache) and when it reuses it."""

from __future__ import annotations

import numpy as np
import pytest

from attngen.errors import LaunchError
from attngen.reference import reference, relative_error, tolerance
from attngen.runtime.blockmask import reference_block_mask

from conftest import kernel_for, random_qkv, require, spec_of

DOCS = "input doc[b, q] i32\nmask k <= q && doc[b, q] == doc[b, k]"
PREFIX = "input prefix[b] i32\nmask k <= q || k < prefix[b]"
SHAPES = [(1, 1, 1), (2, 7, 7), (1, 113, 113), (2, 7, 20), (1, 20, 7)]


def _spec(body, dtype="f32"):
    return spec_of(f"head_dim 16\nheads q=6 kv=2\ndtype {dtype}\n{body}")


def _docs(rng, b, lq):
    return np.sort(rng.integers(0, 4, size=(b, lq)), axis=1).astype(np.int32)


def _inputs(body, rng, b, lq, lk):
    if body == DOCS:
        return {"doc": _docs(rng, b, lq)}
    return {"prefix": rng.integers(0, lk + 2, size=b).astype(np.int32)}


def _check(spec, qkv, inputs, **options):
    np_dtype = np.float16 if spec.dtype == "f16" else np.float32
    out, lse = kernel_for(spec, "wgsl")(*(x.astype(np_dtype) for x in qkv), return_lse=True, **options, **inputs)
    ref, ref_lse = reference(spec, *qkv, return_lse=True, **options, **inputs)
    out, lse = np.asarray(out, np.float64), np.asarray(lse, np.float64)
    assert relative_error(out, ref) <= tolerance(spec)
    empty = np.isneginf(ref_lse)
    assert np.array_equal(np.isneginf(lse), empty)
    assert np.all(out[np.transpose(empty, (0, 2, 1))] == 0)
    np.testing.assert_allclose(lse[~empty], ref_lse[~empty], rtol=1e-4, atol=1e-4)
    return empty


@pytest.mark.parametrize("dtype", ["f32", "f16"])
@pytest.mark.parametrize("body", [DOCS, PREFIX], ids=["documents", "prefix_lm"])
def test_against_the_reference(body, dtype):
    require("wgsl")
    spec = _spec(body, dtype)
    for n, (b, lq, lk) in enumerate(SHAPES):
        rng = np.random.default_rng(n)
        _check(spec, random_qkv(spec, b, lq, lk, seed=n), _inputs(body, rng, b, lq, lk))


def test_kv_lens_and_a_row_that_sees_no_key():
    require("wgsl")
    spec = _spec("input doc[b, q] i32\nmask k < q && doc[b, q] == doc[b, k]")
    doc = np.array([[0] * 9, [0, 0, 0, 1, 1, 1, 1, 2, 2]], np.int32)
    lens = np.array([9, 4], np.int32)
    empty = _check(spec, random_qkv(spec, 2, 9, 9, seed=1), {"doc": doc}, kv_lens=lens)
    assert empty[:, :, 0].all() and empty[1, :, 3].all()  # row 0, and the first row of a document
    assert not empty[0, :, 1:].any()


def _dense(spec_body, inputs, b, lq, lk):
    """The mask the builder must write, from numpy (B, 1, Lq, Lk)."""
    q, k = np.arange(lq)[:, None], np.arange(lk)[None, :]
    if spec_body == DOCS:
        doc = inputs["doc"]
        return ((k <= q)[None] & (doc[:, :, None] == doc[:, None, :lk]))[:, None]
    return ((k <= q)[None] | (k[None] < inputs["prefix"][:, None, None]))[:, None]


@pytest.mark.parametrize("body", [DOCS, PREFIX], ids=["documents", "prefix_lm"])
def test_the_block_mask_equals_the_oracle(body):
    require("wgsl")
    spec = _spec(body)
    kernel = kernel_for(spec, "wgsl")
    # 301 rows: several query tiles on every adapter's profile (128-row tiles on NVIDIA's Vulkan)
    q, k, _ = random_qkv(spec, 2, 301, 301, seed=3)
    inputs = _inputs(body, np.random.default_rng(3), 2, 301, 301)
    bm = kernel.block_mask(q, k, **inputs)
    want = reference_block_mask(_dense(body, inputs, 2, 301, 301), bm.tile_q, bm.tile_kv)
    assert bm.shape == (2, 1, 301, 301)  # b only: the expression names b, not h
    assert np.array_equal(bm.data, want.data)
    assert np.array_equal(bm.counts, want.counts) and np.array_equal(bm.tiles, want.tiles)
    assert bm.live_tiles < 2 * bm.n_qtiles * bm.n_kvtiles  # tiles are skipped


def test_slices_follow_the_expressions_names():
    require("wgsl")
    spec = _spec("input allow[h, k] bool\nmask allow[h, k] || k <= q")
    kernel = kernel_for(spec, "wgsl")
    q, k, v = random_qkv(spec, 3, 7, 7, seed=4)
    allow = np.random.default_rng(4).random((6, 7)) < 0.3
    assert kernel.block_mask(q, k, allow=allow).shape == (1, 6, 7, 7)
    assert kernel.block_mask(q, k, kv_lens=np.array([7, 2, 5], np.int32), allow=allow).shape == (3, 6, 7, 7)
    _check(spec, (q, k, v), {"allow": allow}, kv_lens=np.array([7, 2, 5], np.int32))


def test_the_cache_rebuilds_only_when_the_signature_changes():
    require("wgsl")
    spec = _spec(DOCS)
    kernel = kernel_for(spec, "wgsl")
    q, k, v = random_qkv(spec, 2, 7, 7, seed=5)
    doc = _docs(np.random.default_rng(5), 2, 7)
    kernel(q, k, v, doc=doc)
    built = kernel.mask_builds
    bm = kernel.block_mask(q, k, doc=doc)
    kernel(q * 2, k, v, doc=doc.copy())  # other values, the same lengths and mask inputs
    assert kernel.mask_builds == built and kernel.block_mask(q, k, doc=doc) is bm
    doc[1, 3:] += 1  # changed in place: a rebuild
    kernel(q, k, v, doc=doc)
    assert kernel.mask_builds == built + 1
    kernel(q, k, v, doc=doc, kv_lens=np.array([7, 5], np.int32))  # other keys per sequence
    q1, k1, v1 = random_qkv(spec, 2, 6, 6, seed=6)
    kernel(q1, k1, v1, doc=doc[:, :6].copy())  # other lengths
    assert kernel.mask_builds == built + 3
    # a BlockMask passed as mask= is used as it is: nothing is built
    out = kernel(q, k, v, doc=doc, mask=bm)
    assert kernel.mask_builds == built + 3
    doc0 = doc.copy()
    doc0[1, 3:] -= 1
    ref = reference(spec, q, k, v, doc=doc0)
    assert relative_error(np.asarray(out, np.float64), ref) <= tolerance(spec)


def test_mask_tensors_and_bad_inputs_are_refused():
    require("wgsl")
    spec = _spec(DOCS)
    kernel = kernel_for(spec, "wgsl")
    q, k, v = random_qkv(spec, 2, 7, 7, seed=7)
    doc = _docs(np.random.default_rng(7), 2, 7)
    with pytest.raises(LaunchError, match="mask= takes only the BlockMask of kernel.block_mask"):
        kernel(q, k, v, doc=doc, mask=np.ones((7, 7), bool))
    with pytest.raises(LaunchError, match=r"reads input 'doc'"):
        kernel.block_mask(q, k)
    with pytest.raises(LaunchError, match=r"input 'doc' is int64"):
        kernel.block_mask(q, k, doc=doc.astype(np.int64))


def test_reads_out_of_bounds_are_flagged():
    require("wgsl")
    spec = _spec("input doc[b, q] i32\nmask doc[b, q] == doc[b, k]")  # no k <= q: k reaches past Lq
    q, k, v = random_qkv(spec, 1, 7, 9, seed=8)
    doc = np.zeros((1, 7), np.int32)
    with pytest.raises(LaunchError, match=r"out of"):
        reference(spec, q, k, v, doc=doc)
    with pytest.raises(LaunchError, match=r"the mask expression read input 'doc' out of its bounds in doc\[b, k\]"):
        kernel_for(spec, "wgsl")(q, k, v, doc=doc)


def test_a_profile_without_room_for_the_custom_kernel_tests_per_element():
    """A score and a mask that both read inputs: the `mask custom` kernel would bind 9 storage
    buffers where wgpu-software allows 8, so the kernel tests the expression per element itself."""
    require("wgsl")
    import attngen
    spec = _spec("input slopes[h] f32\n" + PREFIX + "\nscore s - slopes[h] * abs(q - k)")
    kernel = attngen.compile(spec, target="wgsl", profile="wgpu-software")
    q, k, v = random_qkv(spec, 2, 7, 9, seed=9)
    inputs = {"prefix": np.array([0, 8], np.int32), "slopes": np.linspace(0.1, 1, 6).astype(np.float32)}
    out = kernel(q, k, v, **inputs)
    assert relative_error(np.asarray(out, np.float64), reference(spec, q, k, v, **inputs)) <= tolerance(spec)
    assert kernel.mask_builds == 0
    with pytest.raises(LaunchError, match="tested per element"):
        kernel.block_mask(q, k, **inputs)
