"""The sm_80 tensor-core backward's dK/dV step (templates/cuda/backward_mma.cu.j2) run on the CPU
against attngen.reference_backward (no GPU needed): the generated f16 / bf16 source compiled as C++
with g++ behind tests/cuda_emulation.py's shim (backward_library), one std::thread per CUDA thread,
its PTX primitives replaced by emulations written from the PTX ISA's definitions (ldmatrix .x4 and
.x4.trans, mma.sync.m16n8k16's fragments, exchanged through a barrier per warp; cp.async as a plain
copy; red.global.add as an atomic add). So the fragment and index arithmetic, the masks' loop
bounds, GQA, kv_lens and packed sequences are checked wherever the suite runs. D_i (preprocess) is
computed here in numpy and dQ is read from its f32 accumulator (the dq step only converts it);
tests/equivalence/test_backward_mma.py runs all three entry points on a GPU. Slow (256 OS threads
meet at every warp collective): the shapes are small."""

from __future__ import annotations

import ctypes
import shutil

import numpy as np
import pytest

from attngen.api import lower
from attngen.backends.cuda import backward as bw
from attngen.backends.cuda import backward_mma
from attngen.reference import reference, reference_backward, relative_error, tolerance

from conftest import spec_of
from cuda_emulation import backward_library, delta_rows, emulated_args

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to compile the emulation")


def _round(x, dtype):
    """float32 -> (the dtype's 16-bit words, their float32 values)."""
    if dtype == "f16":
        h = x.astype(np.float16)
        return h.view(np.uint16), h.astype(np.float32)
    u = x.astype(np.float32).view(np.uint32)
    bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return bits, (bits.astype(np.uint32) << 16).view(np.float32)


def _check(body, shapes, tmp_path, seed=0, kv_lens=None, cu=None, cuk=None, poison=False, plant=None):
    """The emulated gradients against the reference's (relative L2 within twice the forward's
    tolerance, each finite); `plant` = j: key j of batch entry 0 holds NaN in k and key j + 1 inf in
    v, and (got, want) are returned unchecked."""
    spec = spec_of(body)
    plan = lower(spec, "cuda", "cuda-sm80")
    assert bw.family(plan) == "mma"
    rng = np.random.default_rng(seed)
    (q16, q), (k16, k), (v16, v) = (_round(rng.standard_normal(s).astype(np.float32), plan.dtype) for s in shapes)
    if poison:  # keys past kv_lens hold inf / NaN
        for bi, n in enumerate(kv_lens):
            k16[bi, n:], v16[bi, n:] = _round(np.float32(np.inf), plan.dtype)[0], _round(np.float32(np.nan),
                                                                                            plan.dtype)[0]
    if plant is not None:
        k16[0, plant], k[0, plant] = _round(np.float32(np.nan), plan.dtype)[0], np.nan
        v16[0, plant + 1], v[0, plant + 1] = _round(np.float32(np.inf), plan.dtype)[0], np.inf
    ref_kw = {n: x for n, x in (("kv_lens", kv_lens), ("cu_seqlens_q", cu), ("cu_seqlens_k", cuk)) if x is not None}
    out, lse = reference(spec, q, k, v, return_lse=True, **ref_kw)
    out16, out = _round(out.astype(np.float32), plan.dtype)
    lse = np.ascontiguousarray(lse, np.float32)
    dout16, dout = _round(rng.standard_normal(out.shape).astype(np.float32), plan.dtype)
    packed = cu is not None
    dq = np.zeros(q.shape, np.float32)
    dk16, dv16 = (np.full(x.shape, 0xFFFF, np.uint16) for x in (k, v))  # NaN: a key not written shows
    a, _, (b, _, lk, _, hkv) = emulated_args((q16, k16, v16, out16, dout16, dq, dk16, dv16), lse,
                                             delta_rows(dout, out, packed), packed=packed, kv_lens=kv_lens,
                                             cu=cu, cuk=cuk, dq_name="dq_accum")
    lib = backward_library(plan, str(tmp_path))
    lib.run_dkdv(ctypes.byref(a), -(-(lk if packed else k.shape[1]) // backward_mma.KEYS), hkv, b)
    want = reference_backward(spec, q, k, v, dout, **ref_kw)
    got = [dq] + [(x.view(np.float16).astype(np.float32) if plan.dtype == "f16"
                   else (x.astype(np.uint32) << 16).view(np.float32)) for x in (dk16, dv16)]
    if plant is not None:
        return got, want
    bound = 2 * tolerance(spec)
    for g, w, name in zip(got, want, ("dq", "dk", "dv")):
        assert np.isfinite(g).all(), f"{name}: not finite (or not written)"
        assert relative_error(g.astype(np.float64), w) <= bound, f"{name}: {relative_error(g, w):.3g}"
    return got


def test_head_dims_masks_gqa_and_lengths(tmp_path):
    # (lengths past one block of 64 keys and one step of 64 rows, odd, Lq != Lk; small: each of the
    # 256 emulated threads is an OS thread meeting the others at every warp collective)
    _check("head_dim 64\n dtype f16\n mask causal", [(1, 67, 3, 64), (1, 70, 1, 64), (1, 70, 1, 64)], tmp_path)
    _check("head_dim qk=128 v=64\n dtype bf16\n mask window(left=20, right=3)\n softcap 30\n scale 0.3",
           [(1, 7, 2, 128), (1, 70, 2, 128), (1, 70, 2, 64)], tmp_path)
    _check("head_dim qk=96 v=128\n dtype f16", [(1, 66, 3, 96), (1, 65, 1, 96), (1, 65, 1, 128)], tmp_path)
    _check("head_dim 32\n dtype bf16\n mask causal(bottom_right)", [(1, 20, 2, 32), (1, 69, 2, 32), (1, 69, 2, 32)],
           tmp_path)


def test_kv_lens_packed_and_rows_that_see_no_key(tmp_path):
    dq, dk, dv = _check("head_dim 128\n dtype f16\n mask causal(bottom_right)",
                        [(2, 37, 2, 128), (2, 66, 1, 128), (2, 66, 1, 128)], tmp_path, kv_lens=[0, 37], poison=True)
    assert not dq[0].any() and not dk[0].any() and not dk[1, 37:].any() and not dv[1, 37:].any()
    cuq = np.concatenate([[0], np.cumsum([1, 0, 66])]).astype(np.int32)
    cuk = np.concatenate([[0], np.cumsum([3, 2, 65])]).astype(np.int32)
    _check("head_dim 64\n dtype bf16\n mask causal", [(cuq[-1], 2, 64), (cuk[-1], 2, 64), (cuk[-1], 2, 64)],
           tmp_path, cu=cuq, cuk=cuk)


def test_visible_keys_holding_nan_reach_only_the_rows_that_see_them(tmp_path):
    """Causal: key 70 holds NaN in k, key 71 inf in v (zeroed in shared memory and flagged). Rows
    before 70 do not see them: their dq is the reference's; the rows that do see them get NaN."""
    spec = spec_of("head_dim 64\n dtype f16\n mask causal")
    (dq, _, _), (want, _, _) = _check("head_dim 64\n dtype f16\n mask causal", [(1, 100, 2, 64), (1, 100, 2, 64),
                                                                               (1, 100, 2, 64)], tmp_path, plant=70)
    assert np.isfinite(dq[0, :70]).all()
    assert relative_error(dq[0, :70].astype(np.float64), want[0, :70]) <= 2 * tolerance(spec)
    assert np.isnan(dq[0, 70:]).all(axis=-1).all()
