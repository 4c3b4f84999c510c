"""The CUDA forward kernels of the mma.sync and CUDA-core families run on the CPU (no GPU): the
generated source compiled as C++ with g++ behind a shim, one std::thread per CUDA thread, a
std::barrier for __syncthreads and one per warp for its collectives, the PTX primitives replaced
by emulations written from the PTX ISA's definitions (mma.sync.m16n8k16's fragments, cp.async as a
plain copy, the f16 arithmetic through _Float16). Each launch of the call's recipe runs its grid
block by block. Slow (an OS thread per CUDA thread): small shapes only.

Used by tests/backends/cuda/test_kvquant_emulated.py (quantized caches, issue 44), which checks the
fragment orders, conversions, scales and appends of templates/cuda/math_mma_kvq.j2 and
kvquant*.j2 wherever the suite runs; tests/equivalence/test_cuda_kv_quant.py runs them on a GPU.
"""

from __future__ import annotations

import ctypes
import re

import numpy as np

from attngen.api import emit_plan, lower
from attngen.backends.cuda import args as cuda_args
from attngen.plan.formulas import evaluate_all
from attngen.runtime.launch import resolve

from backward_helpers import gxx_library

SHIM = r'''
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>
struct dim3_ { unsigned x, y, z; };
thread_local dim3_ threadIdx, blockIdx;
static dim3_ gridDim, blockDim;
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
struct int4 { int x, y, z, w; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
inline float2 make_float2(float a, float b) { return {a, b}; }
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
template <class A, class B> inline auto min(A a, B b) { return a < b ? a : b; }
template <class A, class B> inline auto max(A a, B b) { return a < b ? b : a; }
#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__
static std::barrier<>* g_bar;
static std::barrier<>* g_warp_bar[32];
static unsigned char* g_smem;
static std::atomic<int> g_or;
static std::mutex g_atomic;
inline void __syncthreads() { g_bar->arrive_and_wait(); }
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
inline void __syncwarp(unsigned = 0xffffffffu) { g_warp_bar[threadIdx.x / 32]->arrive_and_wait(); }
static unsigned long long g_lane_val[32][32];
template <class T> inline T __shfl_xor_sync(unsigned, T v, int m) {
    const int w = threadIdx.x / 32, l = threadIdx.x % 32;
    unsigned long long x = 0;
    memcpy(&x, &v, sizeof(T));
    g_lane_val[w][l] = x;
    __syncwarp();
    x = g_lane_val[w][l ^ m];
    __syncwarp();
    T r;
    memcpy(&r, &x, sizeof(T));
    return r;
}
inline unsigned __ballot_sync(unsigned, bool p) {
    const int w = threadIdx.x / 32, l = threadIdx.x % 32;
    g_lane_val[w][l] = p;
    __syncwarp();
    unsigned r = 0;
    for (int i = 0; i < 32; ++i) r |= (g_lane_val[w][i] ? 1u : 0u) << i;
    __syncwarp();
    return r;
}
inline bool __any_sync(unsigned m, bool p) { return __ballot_sync(m, p) != 0; }
inline unsigned atomicInc(unsigned* p, unsigned limit) {
    std::lock_guard<std::mutex> lock(g_atomic);
    const unsigned old = *p;
    *p = old >= limit ? 0 : old + 1;
    return old;
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
template <class T> inline T __ldcg(const T* p) { return *p; }
inline float __int_as_float(unsigned x) { float f; memcpy(&f, &x, 4); return f; }
inline float __uint_as_float(unsigned x) { return __int_as_float(x); }
inline unsigned __float_as_uint(float f) { unsigned x; memcpy(&x, &f, 4); return x; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const unsigned long long b = x | ((unsigned long long)y << 32);
    unsigned r = 0;
    for (int k = 0; k < 4; ++k) r |= (unsigned)((b >> (8 * ((s >> (4 * k)) & 7u))) & 0xffu) << (8 * k);
    return r;
}
// f16 through _Float16 (IEEE binary16, subnormals included), bf16 by rounding f32's bits
inline float h2f(unsigned short x) { _Float16 h; memcpy(&h, &x, 2); return (float)h; }
inline unsigned short f2h(float f) { _Float16 h = (_Float16)f; unsigned short x; memcpy(&x, &h, 2); return x; }
inline float b2f(unsigned short x) { unsigned u = (unsigned)x << 16; float f; memcpy(&f, &u, 4); return f; }
inline unsigned short f2b(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    if (std::isnan(f)) return 0x7fc0;
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float half_to_float(unsigned short x) { return h2f(x); }
inline unsigned hmul2(unsigned a, unsigned b) {
    return f2h(h2f(a & 0xffff) * h2f(b & 0xffff)) | ((unsigned)f2h(h2f(a >> 16) * h2f(b >> 16)) << 16);
}
inline unsigned hsub2(unsigned a, unsigned b) {
    return f2h(h2f(a & 0xffff) - h2f(b & 0xffff)) | ((unsigned)f2h(h2f(a >> 16) - h2f(b >> 16)) << 16);
}
ELEM_CONVERSIONS
inline unsigned smem_addr(const void* p) { return (unsigned)((const unsigned char*)p - g_smem); }
inline unsigned __cvta_generic_to_shared(const void* p) { return smem_addr(p); }
inline void cp_async_16_at(unsigned dst, const void* src, bool valid) {
    if (valid) memcpy(g_smem + dst, src, 16); else memset(g_smem + dst, 0, 16);
}
template <int kBytes> inline void cp_async_bytes(void* dst, const void* src, bool valid) {
    if (valid) memcpy(dst, src, kBytes); else memset(dst, 0, kBytes);
}
inline void cp_async_commit() {}
template <int N> inline void cp_async_wait() {}
// mma.m16n8k16.row.col: lane 4 g + t holds A (rows g, g + 8; columns 2t, 2t + 1, +8) as a0 (g, 2t),
// a1 (g + 8, 2t), a2 (g, 2t + 8), a3 (g + 8, 2t + 8); B (rows 2t, 2t + 1, +8; column g) as b0, b1;
// C rows g (c0, c1) and g + 8 (c2, c3), columns 2t, 2t + 1. The lower column / row in the low half.
static unsigned g_frag[32][32][6];
inline float half_of(unsigned r, int k) { return ELEM_HALF((unsigned short)(k % 2 ? r >> 16 : r & 0xffffu)); }
inline void mma_f32acc(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    const int w = threadIdx.x / 32, l = threadIdx.x % 32, g = l / 4, t = l % 4;
    for (int i = 0; i < 4; ++i) g_frag[w][l][i] = a[i];
    g_frag[w][l][4] = b0;
    g_frag[w][l][5] = b1;
    __syncwarp();
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
    __syncwarp();
}
'''
F16 = r'''
inline float to_float(unsigned short x) { return h2f(x); }
inline unsigned pack2(float lo, float hi) { return f2h(lo) | ((unsigned)f2h(hi) << 16); }
'''
BF16 = r'''
inline float to_float(unsigned short x) { return b2f(x); }
inline unsigned pack2(float lo, float hi) { return f2b(lo) | ((unsigned)f2b(hi) << 16); }
'''
F32 = ""  # (f32 specs: CUDA cores, the source's own conversions)
RUN = r'''
extern "C" void run(int entry, const Args* a, int gx, int gy, int gz, int threads, int smem_bytes) {
    gridDim = {(unsigned)gx, (unsigned)gy, (unsigned)gz};
    blockDim = {(unsigned)threads, 1, 1};
    for (int bz = 0; bz < gz; ++bz) for (int by = 0; by < gy; ++by) for (int bx = 0; bx < gx; ++bx) {
        std::vector<unsigned char> smem(smem_bytes + 16, 0xff);  // all ones: a read before a write shows
        g_smem = smem.data();
        std::barrier<> bar(threads);
        g_bar = &bar;
        for (int w = 0; w < threads / 32; ++w) g_warp_bar[w] = new std::barrier<>(32);
        std::vector<std::thread> pool;
        for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] {
            threadIdx = {(unsigned)t, 0, 0};
            blockIdx = {(unsigned)bx, (unsigned)by, (unsigned)bz};
            switch (entry) {
ENTRY_CASES
            }
        });
        for (auto& th : pool) th.join();
        for (int w = 0; w < threads / 32; ++w) delete g_warp_bar[w];
    }
}
'''
# the source's definitions the shim replaces (PTX, or CUDA's own functions); f16 and bf16 sources
# also their storage conversions (F16, BF16)
EMULATED = ("hmul2", "hsub2", "half_to_float", "smem_addr", "cp_async_16_at", "cp_async_bytes", "cp_async_commit",
            "cp_async_wait", "mma_f32acc")
_C_FIELD = {"i64": ctypes.c_longlong, "i32": ctypes.c_int}


def _without(source: str, name: str) -> str:
    """`source` without the definition of function `name` (and its template line); unchanged when
    the source has none."""
    m = re.search(rf"(template <[^>]*>\n)?__device__ __forceinline__ [\w ]+ {name}(<[^>]*>)?\(", source)
    if m is None:
        return source
    line_end = source.index("\n", m.end())
    end = line_end + 1 if source[line_end - 1] == "}" else source.index("\n}\n", m.start()) + 3
    return source[:m.start()] + source[end:]


def _c_type(p, kv: bool) -> str:
    """The C++ type of an entry point's parameter, as the source declares it (kv: a quantized cache's)."""
    from attngen.backends.cuda.emit import _c_decl
    decl = _c_decl(p, kv=kv).replace("__restrict__", "")
    return decl[: decl.rindex(p.name)].strip()


def library(plan, tmp_dir):
    """The plan's source with the shim, built once per source; (library, entry names in order)."""
    source = emit_plan(plan).source
    for name in EMULATED + (("to_float", "pack2", "from_float") if plan.dtype != "f32" else ()):
        while True:  # (each namespace of the source has its own copy of the parts)
            stripped = _without(source, name)
            if stripped == source:
                break
            source = stripped
    source = source.replace("extern __shared__ __align__(16) unsigned char smem[];", "unsigned char* smem = g_smem;")
    source = re.sub(r'asm volatile\("prefetch[^\n]*', "(void)0;", source)
    entries = cuda_args.entry_points(plan)
    kv = plan.spec.kv_dtype is not None
    fields = "".join(f"    {_c_type(p, kv)} {p.name};\n" for p in plan.params)
    combine = [e for e in plan.entries if e.name == "combine"]
    combine_fields = "".join(f"    {_c_type(p, kv)} {p.name};\n" for p in combine[0].params) if combine else ""
    cases = []
    for i, (name, params, _, _, _) in enumerate(entries):
        who = "c" if combine and name == combine[0].entry else "a"
        args = ", ".join(f"{who}->{p.name}" for p in params)
        cases.append(f"            case {i}: {name}({args}); break;")
    run = RUN.replace("ENTRY_CASES", "\n".join(cases))
    if combine:
        run = run.replace("const Args* a,", "const Args* a, const CombineArgs* c,")
    conv = {"f16": F16, "bf16": BF16, "f32": F32}[plan.dtype]
    shim = SHIM.replace("ELEM_CONVERSIONS", conv).replace("ELEM_HALF", "b2f" if plan.dtype == "bf16" else "h2f")
    structs = f"struct Args {{\n{fields}}};\n" + (f"struct CombineArgs {{\n{combine_fields}}};\n" if combine else "")
    head, _, _ = source.partition("// ---- section: entry points")
    tail = source[len(head):]
    lib = gxx_library(shim + head + tail + structs + run, tmp_dir)
    return lib, [e[0] for e in entries]


def _struct(params):
    fields = []
    for p in params:
        ctype = ctypes.c_void_p if p.kind == "tensor" else _C_FIELD[p.dtype]
        fields.append((p.name, ctype))
    return type("Args", (ctypes.Structure,), {"_fields_": fields})


def _strides(x) -> tuple:
    return tuple(s // x.itemsize for s in x.strides)


def run(plan, tmp_dir, q, k, v, *, k_scale=None, v_scale=None, kv_lens=None, block_table=None, k_new=None,
        v_new=None, cores=4):
    """(out, lse, errors) of the call as the CUDA runtime would launch it, on host arrays (q, out
    and k_new / v_new as 16-bit words for f16 / bf16 specs, float32 for f32); k, v and the i8 scales
    are written in place by an append."""
    lib, names = library(plan, tmp_dir)
    shapes = {"q": q.shape, "k": k.shape, "v": v.shape}
    dtypes = {"q": plan.dtype, "k": k.dtype.name, "v": v.dtype.name}
    if k_new is not None:
        shapes.update(k_new=k_new.shape, v_new=v_new.shape)
        dtypes.update(k_new=plan.dtype, v_new=plan.dtype)
    launch = resolve(plan, shapes, dtypes, kv_lens=kv_lens, block_table=block_table, cores=cores)
    keep = []

    def ptr(x):
        if x is None:
            return None
        keep.append(x)
        return x.ctypes.data
    store = q.dtype
    out = np.zeros(launch.out_shape_for(plan.d_v), store)
    lse = np.full(launch.lse_shape, np.nan, np.float32)
    errors = np.zeros(10, np.int32)
    values = {"q": ptr(q), "k": ptr(k), "v": ptr(v), "out": ptr(out), "lse": ptr(lse), "errors": ptr(errors),
              "k_new": ptr(k_new), "v_new": ptr(v_new)}
    for prefix, x in (("q", q), ("k", k), ("v", v), ("o", out), ("kn", k_new), ("vn", v_new)):
        for axis, st in zip("blh", (0, 0, 0) if x is None else _strides(x)[:3]):
            values[f"{prefix}_s{axis}"] = st
    if plan.spec.kv_dtype is not None:
        for name, prefix, x in (("k_scale", "ks", k_scale), ("v_scale", "vs", v_scale)):
            values[name] = ptr(x)
            st = _strides(x)
            st = (st[0], 0, st[1]) if x.ndim == 2 else st[:3]
            for axis, s in zip("blh", st):
                values[f"{prefix}_s{axis}"] = s
    if kv_lens is not None:
        values["kv_lens"] = ptr(np.asarray(kv_lens, np.int32))
    if block_table is not None:
        table = np.ascontiguousarray(block_table, np.int32)
        values["block_table"], values["bt_stride"] = ptr(table), table.shape[1]
    values.update(len_q=launch.len_q, len_k=launch.len_k, heads_q=launch.heads_q, group=launch.group,
                  batch=launch.batch, batch_size=launch.batch, splits=launch.splits, len_new=launch.len_new,
                  lse_sb=launch.heads_q * launch.len_q, lse_sh=launch.len_q, rows_q=0,
                  rows_k=k.shape[0] if launch.layout == "paged" else 0)
    sizes = cuda_args.workspace_bytes(plan, launch)
    for name, n in sizes.items():
        values[name] = ptr(np.full(max(n, 4) // 4, np.nan, np.float32))
    for name, n in cuda_args.persistent_words(plan, launch).items():
        values[name] = ptr(np.zeros(n, np.uint32))
    if "ws_s" in sizes:
        values["s_stride"] = max(launch.len_k, 1)
    for name, params, grid, threads, smem in cuda_args.launches(plan, launch):
        a = _struct(plan.params)(**{p.name: values.get(p.name) or 0 for p in plan.params})
        extra = ()
        combine = [e for e in plan.entries if e.name == "combine"]
        if combine:
            c = _struct(combine[0].params)(**{p.name: values.get(p.name) or 0 for p in combine[0].params})
            extra = (ctypes.byref(c),)
        lib.run(names.index(name), ctypes.byref(a), *extra, *[int(g) for g in grid], threads, smem)
    return out, lse, errors


__all__ = ["library", "run", "evaluate_all"]
