"""Masks over inputs (issue 42) on target cuda (GPU machine): the generated block-mask builder
(attngen/backends/cuda/expr_blockmask.py) and the `mask custom` kernel it feeds, against the
float64 reference: document ids and prefix-LM in f16, bf16 and f32, odd lengths (1, 7, 113, 1023),
Lq != Lk, GQA groups of 3, kv_lens, a row that sees no key, on cuda-sm80 and this GPU's profile;
the BlockMask against the numpy oracle; the cache (rebuilt only when the signature changes); a
read out of bounds. Without a GPU every test skips (tests/backends/cuda/test_expr_builder_source.py
compiles the builder and runs its mask_element on the host)."""

from __future__ import annotations

import numpy as np
import pytest

import attngen
from attngen.errors import LaunchError
from attngen.reference import reference, relative_error, tolerance
from attngen.runtime.blockmask import reference_block_mask

from conftest import random_qkv, require, spec_of, to_device
from test_variants import _np

DOCS = "input doc[b, q] i32\nmask k <= q && doc[b, q] == doc[b, k]"
PREFIX = "input prefix[b] i32\nmask k <= q || k < prefix[b]"
SHAPES = [(1, 1, 1), (2, 7, 7), (1, 113, 113), (2, 7, 20), (1, 20, 7), (1, 1023, 1023)]

_KERNELS: dict = {}


def _spec(body, dtype="f16", head_dim=64):
    return spec_of(f"head_dim {head_dim}\nheads q=6 kv=2\ndtype {dtype}\n{body}")


def _kernel(spec, profile=None):
    key = (spec, profile)
    if key not in _KERNELS:
        _KERNELS[key] = attngen.compile(spec, target="cuda", profile=profile)
    return _KERNELS[key]


def _inputs(body, rng, b, lq, lk):
    if body == DOCS:
        return {"doc": np.sort(rng.integers(0, 8, size=(b, lq)), axis=1).astype(np.int32)}
    return {"prefix": rng.integers(0, lk + 2, size=b).astype(np.int32)}


def _check(spec, qkv, inputs, profile=None, **options):
    return check_output(_kernel(spec, profile), spec, qkv, inputs, inputs, **options)


def check_output(kernel, spec, qkv, call_inputs, inputs, **options):
    """kernel's out and lse (called with `call_inputs`) against the reference (with `inputs`):
    no NaN, out within the dtype's tolerance, rows that see no key give out 0 and lse -inf, lse
    close elsewhere. Returns the reference's rows that see no key."""
    out, lse = kernel(*to_device("cuda", spec.dtype, *qkv), return_lse=True, **options, **call_inputs)
    out, lse = _np(out), _np(lse)
    ref, ref_lse = reference(spec, *qkv, return_lse=True, **options, **inputs)
    assert not np.isnan(out).any() and not np.isnan(lse).any(), "NaN"
    assert relative_error(out, ref) <= tolerance(spec)
    empty = np.isneginf(ref_lse)
    assert np.array_equal(np.isneginf(lse), empty)
    assert np.all(out[np.transpose(empty, (0, 2, 1))] == 0)
    if (~empty).any():
        assert np.abs(lse[~empty] - ref_lse[~empty]).max() <= 1e-2 * max(1.0, np.abs(ref_lse[~empty]).max())
    return empty


@pytest.mark.parametrize("profile", ["cuda-sm80", None])
@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
@pytest.mark.parametrize("body", [DOCS, PREFIX], ids=["documents", "prefix_lm"])
def test_against_the_reference(body, dtype, profile):
    require("cuda")
    spec = _spec(body, dtype)
    for n, (b, lq, lk) in enumerate(SHAPES):
        _check(spec, random_qkv(spec, b, lq, lk, seed=n), _inputs(body, np.random.default_rng(n), b, lq, lk),
               profile)


def test_kv_lens_and_a_row_that_sees_no_key():
    require("cuda")
    spec = _spec("input doc[b, q] i32\nmask k < q && doc[b, q] == doc[b, k]")
    doc = np.array([[0] * 9, [0, 0, 0, 1, 1, 1, 1, 2, 2]], np.int32)
    empty = _check(spec, random_qkv(spec, 2, 9, 9, seed=1), {"doc": doc}, kv_lens=np.array([9, 4], np.int32))
    assert empty[:, :, 0].all() and empty[1, :, 3].all()


def test_the_block_mask_equals_the_oracle():
    require("cuda")
    spec = _spec(DOCS)
    kernel = _kernel(spec)
    q, k, _ = random_qkv(spec, 2, 1023, 1023, seed=3)
    doc = _inputs(DOCS, np.random.default_rng(3), 2, 1023, 1023)["doc"]
    dq, dk = to_device("cuda", spec.dtype, q, k)
    bm = kernel.block_mask(dq, dk, doc=doc)
    i = np.arange(1023)
    dense = ((i[None, :] <= i[:, None])[None] & (doc[:, :, None] == doc[:, None, :]))[:, None]
    want = reference_block_mask(dense, bm.tile_q, bm.tile_kv)
    assert bm.shape == (2, 1, 1023, 1023)
    assert np.array_equal(_np(bm.counts), want.counts) and np.array_equal(_np(bm.tiles), want.tiles)
    assert bm.live_tiles < want.n_qtiles * want.n_kvtiles  # 8 documents: most causal tiles are skipped


def test_the_cache_rebuilds_only_when_the_signature_changes():
    require("cuda")
    spec = _spec(DOCS)
    kernel = _kernel(spec)
    q, k, v = to_device("cuda", spec.dtype, *random_qkv(spec, 2, 113, 113, seed=5))
    doc = _inputs(DOCS, np.random.default_rng(5), 2, 113, 113)["doc"]
    kernel(q, k, v, doc=doc)
    built = kernel.mask_builds
    bm = kernel.block_mask(q, k, doc=doc)
    kernel(q, k, v, doc=doc.copy())
    assert kernel.mask_builds == built and kernel.block_mask(q, k, doc=doc) is bm
    doc[1, 50:] += 1
    kernel(q, k, v, doc=doc)
    kernel(q, k, v, doc=doc, kv_lens=np.array([113, 60], np.int32))
    assert kernel.mask_builds == built + 2
    kernel(q, k, v, doc=doc, mask=bm)
    assert kernel.mask_builds == built + 2


def test_refusals():
    require("cuda")
    spec = _spec(DOCS)
    kernel = _kernel(spec)
    q, k, v = to_device("cuda", spec.dtype, *random_qkv(spec, 2, 7, 7, seed=7))
    doc = np.zeros((2, 7), np.int32)
    with pytest.raises(LaunchError, match="mask= takes only the BlockMask"):
        kernel(q, k, v, doc=doc, mask=np.ones((7, 7), bool))
    with pytest.raises(LaunchError, match=r"reads input 'doc'"):
        kernel(q, k, v)
    oob = _spec("input doc[b, q] i32\nmask doc[b, q] == doc[b, k]")
    q, k, v = to_device("cuda", oob.dtype, *random_qkv(oob, 1, 7, 9, seed=8))
    with pytest.raises(LaunchError, match=r"the mask expression read input 'doc' out of its bounds in doc\[b, k\]"):
        _kernel(oob)(q, k, v, doc=np.zeros((1, 7), np.int32))


def test_device_inputs_as_the_forward_takes_them():
    """The inputs as CuPy arrays and CUDA PyTorch tensors (what the CUDA forward's other inputs
    are): checked as the forward's, cached by identity (test below)."""
    require("cuda")
    import cupy
    spec = _spec(DOCS)
    rng = np.random.default_rng(5)
    doc = _inputs(DOCS, rng, 2, 57, 57)["doc"]
    qkv = random_qkv(spec, 2, 57, 57, seed=5)
    _check(spec, qkv, {"doc": cupy.asarray(doc)})
    kernel = _kernel(spec)
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        _check(spec, qkv, {"doc": torch.from_numpy(doc).cuda()})
    with pytest.raises(LaunchError, match="doc"):
        kernel(*to_device("cuda", spec.dtype, *qkv), doc=cupy.asarray(doc.astype(np.int64)))


def test_device_inputs_are_cached_by_identity_and_version():
    """torch inputs: the same tensor reuses the BlockMask (no copy), an in-place change rebuilds it
    (its version counter), a new tensor with other values rebuilds it."""
    require("cuda")
    torch = pytest.importorskip("torch")
    spec = _spec(DOCS, head_dim=128)
    kernel = attngen.compile(spec, target="cuda")
    rng = np.random.default_rng(9)
    doc = _inputs(DOCS, rng, 2, 300, 300)["doc"]
    qkv = random_qkv(spec, 2, 300, 300, seed=9)
    t = torch.from_numpy(doc).cuda()
    dq = to_device("cuda", spec.dtype, *qkv)
    kernel(*dq, doc=t)
    kernel(*dq, doc=t)
    assert kernel.mask_builds == 1
    t[:, 150:] += 1  # in place: a new version
    out = _np(kernel(*dq, doc=t))
    assert kernel.mask_builds == 2
    doc2 = t.cpu().numpy()
    assert relative_error(out, reference(spec, *qkv, doc=doc2)) <= tolerance(spec)
    other = torch.from_numpy(np.zeros_like(doc)).cuda()
    out = _np(kernel(*dq, doc=other))
    assert kernel.mask_builds == 3
    assert relative_error(out, reference(spec, *qkv, doc=np.zeros_like(doc))) <= tolerance(spec)
