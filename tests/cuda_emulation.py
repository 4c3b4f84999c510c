"""Generated CUDA kernels run on the CPU (no GPU): the source compiled as C++ with g++ behind one
shim (SHIM): one std::thread per CUDA thread, the block's std::barrier for __syncthreads and one per
warp for its collectives (shuffles, ballots, ldmatrix, mma), the PTX primitives replaced by
emulations written from the PTX ISA's definitions (mma.sync.m16n8k16's fragments, ldmatrix .x4 and
.x4.trans, cp.async as a plain copy that zero-fills, red.global.add as an atomic add, the f16
arithmetic through _Float16). A launch runs its grid block by block. Slow (an OS thread per CUDA
thread, meeting the others at every collective): small shapes only. run_forward(defer_copies=True)
lands each cp.async only at the cp.async.wait_group that lets it (EMU_DEFER_COPIES): a stage read
before its wait reads stale bytes, and a copy never waited for is an error (what racecheck would
say of the waits on a GPU; test_kvquant_emulated.py's test_copies_land_at_their_wait). SANITIZE
(ATTNGEN_EMU_SANITIZE=1, a tool: below) builds them with AddressSanitizer too. Both from branch review44.

The source's own definitions of what the shim replaces are cut out of it (strip). Each family adds
the names its source gives the primitives:
- the forward kernels of the mma.sync and CUDA-core families (FORWARD; forward_library, run_forward):
  tests/backends/cuda/test_kvquant_emulated.py (quantized caches, issue 44) checks the fragment
  orders, conversions, scales and appends of templates/cuda/math_mma_kvq.j2 and kvquant*.j2;
  tests/equivalence/test_cuda_kv_quant.py runs them on a GPU;
- the sm_80 tensor-core backward's dK/dV step (BACKWARD; backward_library, emulated_args):
  tests/backends/cuda/test_backward_mma_emulated.py; tests/equivalence/test_backward_mma.py runs it
  on a GPU;
- the f32 backward's dK/dV and dQ steps (CUDA cores: shim("f32") and run_blocks alone, emulated_args):
  tests/backends/cuda/test_backward_emulated.py.
gxx_library (g++, each source built once per run, in the suite's cache directory) also builds
tests/backends/cuda/test_fp8_layout.py's pieces (their own small shims).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import subprocess

import numpy as np

from attngen.api import emit_plan
from attngen.backends.cuda import args as cuda_args
from attngen.runtime.launch import resolve

# the shim's C++ headers: half of a build's time is their parsing, so gxx_library precompiles them once
STD_HEADERS = '''
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>
'''
SHIM = STD_HEADERS + r'''#ifndef EMU_SMEM_SLACK
#define EMU_SMEM_SLACK 16  // bytes of shared memory past the launch's (0 under SANITIZE: an access there is reported)
#endif
// ---- CUDA's qualifiers, built-in variables and vector types
#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__
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
// ---- one block at a time (run_blocks): its barrier, one barrier per warp, its shared memory
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
// ---- warp shuffles and votes: each lane posts its value, the warp meets, each reads its source lane's
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
// ---- atomics, fences, loads, bit casts
inline unsigned atomicInc(unsigned* p, unsigned limit) {
    std::lock_guard<std::mutex> lock(g_atomic);
    const unsigned old = *p;
    *p = old >= limit ? 0 : old + 1;
    return old;
}
inline float atomicAdd(float* p, float x) { return std::atomic_ref<float>(*p).fetch_add(x); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
template <class T> inline T __ldcg(const T* p) { return *p; }
template <class T> inline T __ldg(const T* p) { return *p; }
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
// ---- 16-bit floats: f16 through _Float16 (IEEE binary16, subnormals included), bf16 by rounding
// f32's bits to nearest even (NaN stays NaN)
inline float h2f(unsigned short x) { _Float16 h; memcpy(&h, &x, 2); return (float)h; }
inline unsigned short f2h(float f) { _Float16 h = (_Float16)f; unsigned short x; memcpy(&x, &h, 2); return x; }
inline float b2f(unsigned short x) { unsigned u = (unsigned)x << 16; float f; memcpy(&f, &u, 4); return f; }
inline unsigned short f2b(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    if (std::isnan(f)) return 0x7fc0;
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
// ---- shared memory: a shared-state-space address is the byte offset into the block's g_smem
inline unsigned __cvta_generic_to_shared(const void* p) { return (unsigned)((const unsigned char*)p - g_smem); }
// cp.async (cp-size bytes, src-size = valid ? cp-size : 0): the bytes past src-size are zero-filled.
#ifdef EMU_DEFER_COPIES
// Deferred (defer_copies): a copy lands as late as the PTX ISA lets it, when a cp.async.wait_group
// leaves fewer of the thread's committed groups in flight than its group's place, never before; a
// read of a stage before its wait sees the stage's old bytes (all ones at first: NaN), and copies
// still in flight when the thread ends are counted (emu_left_in_flight: an error of the caller's).
struct PendingCopy { void* dst; const void* src; int bytes; bool valid; };
thread_local std::vector<PendingCopy> g_pending;
thread_local std::vector<size_t> g_group_ends;  // g_pending's length at each commit
static std::atomic<int> g_left_in_flight{0};
inline void cp_async_copy(void* dst, const void* src, int bytes, bool valid) {
    g_pending.push_back({dst, src, bytes, valid});
}
inline void copies_commit() { g_group_ends.push_back(g_pending.size()); }
inline void copies_wait(int pending) {
    if ((int)g_group_ends.size() <= pending) return;
    const size_t groups = g_group_ends.size() - pending, upto = g_group_ends[groups - 1];
    for (size_t i = 0; i < upto; ++i) {
        const PendingCopy& c = g_pending[i];
        if (c.valid) memcpy(c.dst, c.src, c.bytes); else memset(c.dst, 0, c.bytes);
    }
    g_pending.erase(g_pending.begin(), g_pending.begin() + upto);
    g_group_ends.erase(g_group_ends.begin(), g_group_ends.begin() + groups);
    for (auto& end : g_group_ends) end -= upto;
}
inline void copies_exit() {
    g_left_in_flight += (int)g_pending.size();
    g_pending.clear();
    g_group_ends.clear();
}
#else
// a plain copy (the group commits and waits are no-ops: every copy is done when it returns)
inline void cp_async_copy(void* dst, const void* src, int bytes, bool valid) {
    if (valid) memcpy(dst, src, bytes); else memset(dst, 0, bytes);
}
inline void copies_commit() {}
inline void copies_wait(int) {}
inline void copies_exit() {}
static std::atomic<int> g_left_in_flight{0};
#endif
extern "C" int emu_left_in_flight() { return g_left_in_flight.exchange(0); }
// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lane l receives, of 8 x 8 matrix m (its rows at
// the addresses of lanes 8 m .. 8 m + 7), row l / 4, columns 2 (l % 4), +1; with .trans, column l / 4
// of rows 2 (l % 4), +1. The lower column / row in the low half.
static const unsigned short* g_rows[32][32];
inline void ldmatrix_m8n8_x4(unsigned (&r)[4], const unsigned short* p, bool trans) {
    const int w = threadIdx.x / 32, l = threadIdx.x % 32;
    g_rows[w][l] = p;
    __syncwarp();
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
    __syncwarp();
}
// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}: lane 4 g + t holds A (rows g, g + 8; columns 2t,
// 2t + 1, +8) as a0 (g, 2t), a1 (g + 8, 2t), a2 (g, 2t + 8), a3 (g + 8, 2t + 8); B (rows 2t, 2t + 1,
// +8; column g) as b0, b1; C rows g (c0, c1) and g + 8 (c2, c3), columns 2t, 2t + 1. The lower
// column / row in the low half. The warp posts its fragments, each lane sums its 4 elements of D.
static unsigned g_frag[32][32][6];
inline float mma_operand(unsigned r, int k) {  // element k % 2 of a register: the lower one in the low half
    return ELEM16_TO_FLOAT((unsigned short)(k % 2 ? r >> 16 : r & 0xffffu));
}
inline void mma_m16n8k16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    const int w = threadIdx.x / 32, l = threadIdx.x % 32, g = l / 4, t = l % 4;
    for (int i = 0; i < 4; ++i) g_frag[w][l][i] = a[i];
    g_frag[w][l][4] = b0;
    g_frag[w][l][5] = b1;
    __syncwarp();
    for (int e = 0; e < 4; ++e) {
        const int row = g + (e >= 2 ? 8 : 0), col = 2 * t + (e & 1);
        float sum = 0.0f;
        for (int k = 0; k < 16; ++k) {
            // A (row, k): lane 4 (row % 8) + (k % 8) / 2, a0 .. a3 by row >= 8 and k >= 8
            const int la = 4 * (row % 8) + (k % 8) / 2, ra = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
            // B (k, col): lane 4 col + (k % 8) / 2, b0 / b1 by k >= 8
            const int lb = 4 * col + (k % 8) / 2, rb = 4 + (k >= 8 ? 1 : 0);
            const float x = mma_operand(g_frag[w][la][ra], k), y = mma_operand(g_frag[w][lb][rb], k);
            sum += x * y;
        }
        d[e] += sum;
    }
    __syncwarp();
}
// ---- the helpers both families' sources define (cut out of them: STRIPPED)
inline unsigned smem_addr(const void* p) { return __cvta_generic_to_shared(p); }
inline void cp_async_commit() { copies_commit(); }
template <int N> inline void cp_async_wait() { copies_wait(N); }
ELEM16_HELPERS
// ---- a launch: the grid's blocks one after another, each a thread per CUDA thread running body()
template <class Body> void run_blocks(int gx, int gy, int gz, int threads, int smem_bytes, const Body& body) {
    gridDim = {(unsigned)gx, (unsigned)gy, (unsigned)gz};
    blockDim = {(unsigned)threads, 1, 1};
    for (int bz = 0; bz < gz; ++bz) for (int by = 0; by < gy; ++by) for (int bx = 0; bx < gx; ++bx) {
        // all ones: NaN in f16, bf16 and f32, so that a read before a write shows
        std::vector<unsigned char> smem(smem_bytes + EMU_SMEM_SLACK, 0xff);
        g_smem = smem.data();
        std::barrier<> bar(threads);
        g_bar = &bar;
        for (int w = 0; w < threads / 32; ++w) g_warp_bar[w] = new std::barrier<>(32);
        std::vector<std::thread> pool;
        for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] {
            threadIdx = {(unsigned)t, 0, 0};
            blockIdx = {(unsigned)bx, (unsigned)by, (unsigned)bz};
            body();
            copies_exit();
        });
        for (auto& th : pool) th.join();
        for (int w = 0; w < threads / 32; ++w) delete g_warp_bar[w];
    }
}
'''
# the 16-bit storage dtypes' conversions (both families' to_float and pack2); f32 forward sources keep
# their own
ELEM16_HELPERS = {
    "f16": r'''inline float to_float(unsigned short x) { return h2f(x); }
inline unsigned pack2(float lo, float hi) { return f2h(lo) | ((unsigned)f2h(hi) << 16); }''',
    "bf16": r'''inline float to_float(unsigned short x) { return b2f(x); }
inline unsigned pack2(float lo, float hi) { return f2b(lo) | ((unsigned)f2b(hi) << 16); }''',
}
STRIPPED = ("smem_addr", "cp_async_commit", "cp_async_wait")
ELEM16_STRIPPED = ("to_float", "pack2")


def shim(dtype: str) -> str:
    """SHIM for sources of `dtype`: mma's operands and to_float / pack2 in f16 or bf16 (f32: no mma,
    and the source's own conversions)."""
    return (SHIM.replace("ELEM16_TO_FLOAT", "b2f" if dtype == "bf16" else "h2f")
            .replace("ELEM16_HELPERS", ELEM16_HELPERS.get(dtype, "")))


def strip(source: str, names, *, required: bool = False) -> str:
    """`source` without the definitions of the functions `names` (each one's template line too, and
    every copy: each namespace of a forward source has its own); `required`: each has one."""
    for name in names:
        found = False
        while True:
            m = re.search(rf"(template <[^>]*>\n)?__device__ __forceinline__ [\w ]+ {name}(<[^>]*>)?\(", source)
            if m is None:
                break
            line_end = source.index("\n", m.end())
            end = line_end + 1 if source[line_end - 1] == "}" else source.index("\n}\n", m.start()) + 3
            source, found = source[:m.start()] + source[end:], True
        assert found or not required, f"the source defines no {name}"
    return source


_LIBRARIES: dict = {}
_PCH: list = []
# ATTNGEN_EMU_SANITIZE=1, a tool (no test sets it; the GPU's compute-sanitizer is the check), run as
#   ATTNGEN_EMU_SANITIZE=1 LD_PRELOAD=$(g++ -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0 \
#     .venv/bin/python -m pytest -n 0 tests/backends/cuda/test_kvquant_emulated.py
# builds every emulated kernel with AddressSanitizer, its shared memory exactly the launch's bytes, and
# the forward's copies deferred (run_forward's defer_copies): a read or write past any host buffer
# (caches, scales, block table, workspaces, out) or past the block's shared memory is reported.
SANITIZE = os.environ.get("ATTNGEN_EMU_SANITIZE") == "1"
GXX = ["g++", "-std=c++20", "-O1", "-w", "-fPIC"]
if SANITIZE:
    GXX += ["-fsanitize=address", "-fno-omit-frame-pointer"]


def _build_dir(tmp_dir) -> str:
    """Where g++'s outputs go: the suite's cache directory (ATTNGEN_CACHE_DIR, which tests/conftest.py
    makes for the run and the pytest-xdist workers share), so that each source is built once per run
    and not once per worker; `tmp_dir` where there is none (the module used on its own)."""
    cache = os.environ.get("ATTNGEN_CACHE_DIR")
    if not cache:
        return str(tmp_dir)
    folder = os.path.join(cache, "tests-gxx")
    os.makedirs(folder, exist_ok=True)
    return folder


def _build_once(path: str, build) -> None:
    """build(out) writes `path` unless it exists; under a lock, so that two processes sharing the
    folder never build the same file, and through a temporary name (a file that exists is whole)."""
    import fcntl
    if os.path.exists(path):
        return
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(path):
            build(path + ".tmp")
            os.replace(path + ".tmp", path)


def _std_headers(tmp_dir) -> list:
    """g++'s flags to include STD_HEADERS precompiled (built once per run, or once per process where
    the suite's cache directory is not set, with GXX's flags: where g++ finds the .gch unusable it
    reads the header itself)."""
    if not _PCH:
        header = os.path.join(_build_dir(tmp_dir), "emulation_std_" + hashlib.sha256(
            (STD_HEADERS + " ".join(GXX)).encode()).hexdigest()[:16] + ".h")

        def build(out):
            with open(header, "w") as f:
                f.write(STD_HEADERS)
            subprocess.run([*GXX, "-x", "c++-header", "-o", out, header], check=True)
        _build_once(header + ".gch", build)
        _PCH.append(header)
    return ["-include", _PCH[0]]


def gxx_library(source: str, tmp_dir) -> ctypes.CDLL:
    """`source` built with g++ (GXX: C++20, -O1; STD_HEADERS precompiled and included first) as a
    shared library named by the digest of the source and GXX's flags, loaded: built once per run in
    the suite's cache directory, which the pytest-xdist workers share (once per process in `tmp_dir`
    without it), and loaded once per process (the tests that emulate the same generated source share
    it)."""
    if SANITIZE:
        source = "#define EMU_SMEM_SLACK 0\n" + source
    name = hashlib.sha256((" ".join(GXX) + "\n" + source).encode()).hexdigest()[:16]
    if name not in _LIBRARIES:
        path = os.path.join(_build_dir(tmp_dir), name + ".so")

        def build(out):
            with open(path[:-3] + ".cpp", "w") as f:
                f.write(source)
            subprocess.run([*GXX, *_std_headers(tmp_dir), "-shared", "-o", out, path[:-3] + ".cpp", "-lpthread"],
                           check=True)
        _build_once(path, build)
        _LIBRARIES[name] = ctypes.CDLL(path)
    return _LIBRARIES[name]


# ---- the forward kernels (attngen.api.emit_plan's source; every entry point of the plan's recipe)

FORWARD = r'''
// ---- the forward kernels' names (cut out of the source: FORWARD_STRIPPED)
inline float half_to_float(unsigned short x) { return h2f(x); }
inline unsigned hmul2(unsigned a, unsigned b) {
    return f2h(h2f(a & 0xffff) * h2f(b & 0xffff)) | ((unsigned)f2h(h2f(a >> 16) * h2f(b >> 16)) << 16);
}
inline unsigned hsub2(unsigned a, unsigned b) {
    return f2h(h2f(a & 0xffff) - h2f(b & 0xffff)) | ((unsigned)f2h(h2f(a >> 16) - h2f(b >> 16)) << 16);
}
inline void cp_async_16_at(unsigned dst, const void* src, bool valid) { cp_async_copy(g_smem + dst, src, 16, valid); }
template <int kBytes> inline void cp_async_bytes(void* dst, const void* src, bool valid) {
    cp_async_copy(dst, src, kBytes, valid);
}
inline void mma_f32acc(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) { mma_m16n8k16(d, a, b0, b1); }
inline float exp2_approx(float x) { const float y = exp2f(x); return y < 1.17549435e-38f ? 0.f : y; }  // (.ftz)
'''
FORWARD_RUN = r'''
extern "C" void run(int entry, const Args* a, int gx, int gy, int gz, int threads, int smem_bytes) {
    run_blocks(gx, gy, gz, threads, smem_bytes, [&] {
        switch (entry) {
ENTRY_CASES
        }
    });
}
'''
FORWARD_STRIPPED = ("hmul2", "hsub2", "half_to_float", "cp_async_16_at", "cp_async_bytes", "mma_f32acc", "exp2_approx")
_C_FIELD = {"i64": ctypes.c_longlong, "i32": ctypes.c_int}


def _c_type(p, kv: bool) -> str:
    """The C++ type of an entry point's parameter, as the source declares it (kv: a quantized cache's)."""
    from attngen.backends.cuda.emit import _c_decl
    decl = _c_decl(p, kv=kv).replace("__restrict__", "")
    return decl[: decl.rindex(p.name)].strip()


def forward_library(plan, tmp_dir, defer_copies: bool = False):
    """The plan's source with the shim, built once per source; (library, entry names in order).
    defer_copies: each cp.async lands at the wait_group that lets it, not when issued (the shim's
    EMU_DEFER_COPIES), so that a stage read before its wait reads stale bytes."""
    sixteen = plan.dtype != "f32"
    source = strip(emit_plan(plan).source,
                   STRIPPED + FORWARD_STRIPPED + ((*ELEM16_STRIPPED, "from_float") if sixteen else ()))
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
    run = FORWARD_RUN.replace("ENTRY_CASES", "\n".join(cases))
    if combine:
        run = run.replace("const Args* a,", "const Args* a, const CombineArgs* c,")
    structs = f"struct Args {{\n{fields}}};\n" + (f"struct CombineArgs {{\n{combine_fields}}};\n" if combine else "")
    defer = "#define EMU_DEFER_COPIES\n" if defer_copies or SANITIZE else ""
    lib = gxx_library(defer + shim(plan.dtype) + FORWARD + source + structs + run, tmp_dir)
    return lib, [e[0] for e in entries]


def _struct(params):
    fields = []
    for p in params:
        ctype = ctypes.c_void_p if p.kind == "tensor" else _C_FIELD[p.dtype]
        fields.append((p.name, ctype))
    return type("Args", (ctypes.Structure,), {"_fields_": fields})


def _strides(x) -> tuple:
    return tuple(s // x.itemsize for s in x.strides)


def run_forward(plan, tmp_dir, q, k, v, *, k_scale=None, v_scale=None, kv_lens=None, block_table=None, k_new=None,
                v_new=None, cores=4, defer_copies=False):
    """(out, lse, errors) of the call as the CUDA runtime would launch it, on host arrays (q, out
    and k_new / v_new as 16-bit words for f16 / bf16 specs, float32 for f32); k, v and the i8 scales
    are written in place by an append."""
    lib, names = forward_library(plan, tmp_dir, defer_copies)
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
        left = lib.emu_left_in_flight()
        assert left == 0, f"{name}: {left} cp.async copies were never waited for"
    return out, lse, errors


# ---- the sm_80 tensor-core backward's dK/dV step (templates/cuda/backward_mma.cu.j2)

BACKWARD = r'''
// ---- the backward's names (cut out of the source: BACKWARD_STRIPPED)
inline float exp2_approx(float x) { return exp2f(x); }
inline void cp_async_16(unsigned dst, const void* src, bool valid) { cp_async_copy(g_smem + dst, src, 16, valid); }
inline void red_add(float* p, float x) { atomicAdd(p, x); }  // red.global.add.f32
inline void ldmatrix_x4(unsigned (&r)[4], const unsigned short* p) { ldmatrix_m8n8_x4(r, p, false); }
inline void ldmatrix_x4_trans(unsigned (&r)[4], const unsigned short* p) { ldmatrix_m8n8_x4(r, p, true); }
inline void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) { mma_m16n8k16(d, a, b0, b1); }
'''
BACKWARD_RUN = r'''
extern "C" void run_dkdv(const Args* a, int gx, int gy, int gz) {
    run_blocks(gx, gy, gz, kThreads, kSmemBytes, [&] { dkdv(*a, g_smem); });
}
'''
# (to_elem: the dq step's conversion, not run here)
BACKWARD_STRIPPED = ("to_elem", "exp2_approx", "cp_async_16", "red_add", "ldmatrix_x4", "ldmatrix_x4_trans", "mma")


def backward_library(plan, tmp_dir):
    """The plan's backward source (its parts before the entry points) with the shim, built once per
    source: run_dkdv(Args*, grid x, y, z) runs the dK/dV step."""
    from attngen.backends.cuda import backward as bw
    source = strip(bw.render_backward(plan), STRIPPED + ELEM16_STRIPPED + BACKWARD_STRIPPED, required=True)
    source = source.replace("typedef unsigned short elem_t;", "typedef unsigned short elem_t;  // (emulated)")
    return gxx_library(shim(plan.dtype) + BACKWARD + source[: source.index("// The entry points")] + BACKWARD_RUN,
                       tmp_dir)


def delta_rows(dout, out, packed):
    """D_i = rowsum(dout * out) (the preprocess step's) in float32, laid out (B, H, L), or (H, total)
    for packed sequences."""
    delta = np.einsum("...hd,...hd->...h", dout.astype(np.float64), out.astype(np.float64)).astype(np.float32)
    return np.ascontiguousarray(np.moveaxis(delta, -1, 0 if packed else 1))


def emulated_args(arrays, lse, delta, *, packed, kv_lens=None, cu=None, cuk=None, dq_name="dq"):
    """The backward's Args (attngen.backends.cuda.backward_launch._Args) with host addresses:
    `arrays` are q, k, v, out, dout, dq (named `dq_name` in Args), dk, dv (numpy, strides in
    elements of each). Returns (args, ptr, (b, lq, lk, hq, hkv)): ptr(x) gives x's address and
    keeps x alive with the args."""
    from attngen.backends.cuda import backward_launch
    a, keep = backward_launch._Args(), []

    def ptr(x):
        keep.append(x)
        return x.ctypes.data
    a._keep = keep
    q, k, v, out, dout, dq, dk, dv = arrays
    for name, x in zip(("q", "k", "v", "out", "dout", "lse", "delta", dq_name, "dk", "dv"),
                       (q, k, v, out, dout, lse, delta, dq, dk, dv)):
        setattr(a, name, ptr(x))
    for prefix, x in zip(("q", "k", "v", "o", "do", "dq", "dk", "dv"), arrays):
        s = tuple(st // x.itemsize for st in x.strides)
        for axis, st in zip("blh", (0, s[0], s[1]) if packed else s[:3]):
            setattr(a, f"{prefix}_s{axis}", st)
    s = tuple(st // 4 for st in lse.strides)
    a.lse_sb, a.lse_sh, a.lse_sl = (0, *s) if packed else s
    s = tuple(st // 4 for st in delta.strides)
    a.delta_sb, a.delta_sh = (0, s[0]) if packed else s[:2]
    hq, hkv = q.shape[-2], k.shape[-2]
    if packed:
        a.cu_seqlens_q, a.cu_seqlens_k = ptr(np.asarray(cu, np.int32)), ptr(np.asarray(cuk, np.int32))
        b, lq, lk = len(cu) - 1, int(np.diff(cu).max()), int(np.diff(cuk).max())
    else:
        b, lq, lk = q.shape[0], q.shape[1], k.shape[1]
    if kv_lens is not None:
        a.kv_lens = ptr(np.asarray(kv_lens, np.int32))
    a.len_q, a.len_k, a.group, a.rows_k = lq, lk, hq // hkv, 0 if packed else k.shape[1]
    return a, ptr, (b, lq, lk, hq, hkv)


__all__ = ["SHIM", "shim", "strip", "gxx_library", "forward_library", "run_forward", "backward_library",
           "delta_rows", "emulated_args"]
