"""The sm_80 tensor-core backward's dK/dV step (templates/cuda/backward_mma.cu.j2) run on the CPU
against attngen.reference_backward (no GPU needed): the generated f16 / bf16 source compiled as C++
with g++, one std::thread per CUDA thread, its PTX primitives replaced by emulations written from
the PTX ISA's definitions (ldmatrix .x4 and .x4.trans, mma.sync.m16n8k16's fragments, exchanged
through a barrier per warp; cp.async as a plain copy; red.global.add as an atomic add). So the
fragment and index arithmetic, the masks' loop bounds, GQA, kv_lens and packed sequences are
checked wherever the suite runs. D_i (preprocess) is computed here in numpy and dQ is read from
its f32 accumulator (the dq step only converts it); tests/equivalence/test_backward_mma.py runs
all three entry points on a GPU. Slow (256 OS threads meet at every warp collective): the shapes
are small."""

from __future__ import annotations

import ctypes
import re
import shutil

import numpy as np
import pytest

from attngen.api import lower
from attngen.backends.cuda import backward as bw
from attngen.backends.cuda import backward_mma
from attngen.reference import reference, reference_backward, relative_error, tolerance

from conftest import spec_of
from backward_helpers import delta_rows, emulated_args, gxx_library

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to compile the emulation")

SHIM = r'''
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>
#include <algorithm>
using std::min; using std::max;
struct dim3_ { unsigned x, y, z; };
thread_local dim3_ threadIdx, blockIdx;
struct uint4 { unsigned x, y, z, w; };
static std::barrier<>* g_bar;
static std::barrier<>* g_warp_bar[8];
static unsigned char* g_smem;
static std::atomic<int> g_or;
#define __device__
#define __forceinline__ inline
#define __syncthreads() g_bar->arrive_and_wait()
inline float __int_as_float(unsigned x) { float f; memcpy(&f, &x, 4); return f; }
inline float __uint_as_float(unsigned x) { return __int_as_float(x); }
inline float __shfl_xor_sync(unsigned, float v, int) { return v; }  // (preprocess: not run here)
struct float4 { float x, y, z, w; };  // (preprocess's 16-byte accesses: not run here either)
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
template <class T> inline T __ldg(const T* p) { return *p; }
inline bool __syncthreads_or(bool x) {
    __syncthreads();
    if (x) g_or = 1;
    __syncthreads();
    const bool r = g_or != 0;
    __syncthreads();
    if (threadIdx.x == 0) g_or = 0;
    __syncthreads();
    return r;
}
inline void warp_sync() { g_warp_bar[threadIdx.x / 32]->arrive_and_wait(); }
FLOAT_CONVERSIONS
inline unsigned smem_addr(const void* p) { return (unsigned)((const unsigned char*)p - g_smem); }
inline float exp2_approx(float x) { return exp2f(x); }
inline void cp_async_16(unsigned dst, const void* src, bool valid) {
    if (valid) memcpy(g_smem + dst, src, 16); else memset(g_smem + dst, 0, 16);
}
inline void cp_async_commit() {}
template <int kPending> inline void cp_async_wait() {}
inline void red_add(float* p, float x) { std::atomic_ref<float>(*p).fetch_add(x); }
// ldmatrix.x4: lane l receives, of 8 x 8 matrix m (its rows at the addresses of lanes 8 m .. 8 m + 7),
// row l / 4, columns 2 (l % 4), +1; with .trans, column l / 4 of rows 2 (l % 4), +1.
static const unsigned short* g_rows[8][32];
inline void ldmatrix_any(unsigned (&r)[4], const unsigned short* p, bool trans) {
    const int w = threadIdx.x / 32, l = threadIdx.x % 32;
    g_rows[w][l] = p;
    warp_sync();
    for (int m = 0; m < 4; ++m) {
        unsigned lo, hi;
        if (!trans) {
            lo = g_rows[w][8 * m + l / 4][2 * (l % 4)];
            hi = g_rows[w][8 * m + l / 4][2 * (l % 4) + 1];
        } else {
            lo = g_rows[w][8 * m + 2 * (l % 4)][l / 4];
            hi = g_rows[w][8 * m + 2 * (l % 4) + 1][l / 4];
        }
        r[m] = lo | (hi << 16);
    }
    warp_sync();
}
inline void ldmatrix_x4(unsigned (&r)[4], const unsigned short* p) { ldmatrix_any(r, p, false); }
inline void ldmatrix_x4_trans(unsigned (&r)[4], const unsigned short* p) { ldmatrix_any(r, p, true); }
// mma.m16n8k16.row.col: lane 4 g + t holds A (rows g, g + 8; columns 2t, 2t + 1, +8) as a0 (g, 2t),
// a1 (g + 8, 2t), a2 (g, 2t + 8), a3 (g + 8, 2t + 8); B (rows 2t, 2t + 1, +8; column g) as b0, b1;
// C rows g (c0, c1) and g + 8 (c2, c3), columns 2t, 2t + 1. The lower column / row in the low half.
static unsigned g_frag[8][32][6];
inline float half_of(unsigned r, int k) { return to_float((unsigned short)(k % 2 ? r >> 16 : r & 0xffffu)); }
inline void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    const int w = threadIdx.x / 32, l = threadIdx.x % 32, g = l / 4, t = l % 4;
    for (int i = 0; i < 4; ++i) g_frag[w][l][i] = a[i];
    g_frag[w][l][4] = b0;
    g_frag[w][l][5] = b1;
    warp_sync();
    for (int e = 0; e < 4; ++e) {
        const int row = g + (e >= 2 ? 8 : 0), col = 2 * t + (e & 1);
        float sum = 0.0f;
        for (int k = 0; k < 16; ++k) {
            const float x = half_of(g_frag[w][4 * (row % 8) + (k % 8) / 2][(row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k);
            const float y = half_of(g_frag[w][4 * col + (k % 8) / 2][4 + (k >= 8 ? 1 : 0)], k);
            sum += x * y;
        }
        d[e] += sum;
    }
    warp_sync();
}
'''
F16 = r'''
inline float to_float(unsigned short x) { _Float16 h; memcpy(&h, &x, 2); return (float)h; }
inline unsigned short bits16(float f) { _Float16 h = (_Float16)f; unsigned short x; memcpy(&x, &h, 2); return x; }
inline unsigned pack2(float lo, float hi) { return bits16(lo) | ((unsigned)bits16(hi) << 16); }
'''
BF16 = r'''
inline float to_float(unsigned short x) { unsigned u = (unsigned)x << 16; float f; memcpy(&f, &u, 4); return f; }
inline unsigned short bits16(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    if (std::isnan(f)) return 0x7fc0;
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline unsigned pack2(float lo, float hi) { return bits16(lo) | ((unsigned)bits16(hi) << 16); }
'''
RUN = r'''
extern "C" void run_dkdv(const Args* a, int gx, int gy, int gz) {
    for (int bz = 0; bz < gz; ++bz) for (int by = 0; by < gy; ++by) for (int bx = 0; bx < gx; ++bx) {
        // all ones: NaN in f16, bf16 and f32, so that a read before a write shows
        std::vector<unsigned char> smem(kSmemBytes, 0xff);
        g_smem = smem.data();
        std::barrier<> bar(kThreads);
        g_bar = &bar;
        for (int w = 0; w < kThreads / 32; ++w) g_warp_bar[w] = new std::barrier<>(32);
        std::vector<std::thread> threads;
        for (int t = 0; t < kThreads; ++t) threads.emplace_back([&, t] {
            threadIdx = {(unsigned)t, 0, 0};
            blockIdx = {(unsigned)bx, (unsigned)by, (unsigned)bz};
            dkdv(*a, smem.data());
        });
        for (auto& th : threads) th.join();
        for (int w = 0; w < kThreads / 32; ++w) delete g_warp_bar[w];
    }
}
'''
# the source's definitions that the shim replaces (PTX, or CUDA's own functions)
EMULATED = ("to_float", "pack2", "to_elem", "smem_addr", "exp2_approx", "cp_async_16", "cp_async_commit",
            "cp_async_wait", "red_add", "ldmatrix_x4", "ldmatrix_x4_trans", "mma")


def _without(source: str, name: str) -> str:
    """`source` without the definition of function `name` (and its template line)."""
    m = re.search(rf"(template <[^>]*>\n)?__device__ __forceinline__ [\w ]+ {name}(<[^>]*>)?\(", source)
    assert m, name
    line_end = source.index("\n", m.end())
    end = line_end + 1 if source[line_end - 1] == "}" else source.index("\n}\n", m.start()) + 3
    return source[:m.start()] + source[end:]


def _library(plan, tmp_dir):
    source = bw.render_backward(plan)
    for name in EMULATED:
        source = _without(source, name)
    source = source.replace("typedef unsigned short elem_t;", "typedef unsigned short elem_t;  // (emulated)")
    shim = SHIM.replace("FLOAT_CONVERSIONS", F16 if plan.dtype == "f16" else BF16)
    return gxx_library(shim + source[: source.index("// The entry points")] + RUN, tmp_dir)


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
    lib = _library(plan, str(tmp_path))
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
