"""FP8 prefill's layouts, emulated in numpy (no GPU): the key slots of V^T make the f32 accumulator
of S, quantized in its own register order, the A fragment of wgmma m64nNk32 (attngen/backends/cuda/
fp8.py, templates/cuda/math_wgmma_fp8.j2), and the _prepare_v entry's byte tricks.

The register layouts are CUTLASS's for wgmma (cute/atom/mma_traits_sm90_gmma.hpp), taken as data:
a CuTe layout (thread, value) -> column-major index into the M x N (accumulator) or M x K (A)
matrix. They are the PTX ISA's "Register Fragments" of wgmma.mma_async (m64nNk16 accumulators,
m64nNk32 8-bit A)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from attngen.backends.cuda.fp8 import KEY_BLOCK, KEY_SLOTS, TILE_KV, padded_keys
from attngen.runtime.kvquant import decode_fp8

# CLayout_64xN: Shape<Shape<_4,_8,_4>, Shape<_2,_2,N/8>>, Stride<Stride<_128,_1,_16>, Stride<_64,_8,_512>>
# ALayout_64x32: Shape<Shape<_4,_8,_4>, Shape<_4,_2,_2>>, Stride<Stride<_256,_1,_16>, Stride<_64,_8,_1024>>
THREAD_SHAPE, M = (4, 8, 4), 64


def _coords(index: int, shape: tuple) -> tuple:
    """A flat index as coordinates of `shape`, the first mode fastest (CuTe's colexicographic order)."""
    out = []
    for n in shape:
        out.append(index % n)
        index //= n
    return tuple(out)


def _layout(thread: int, value: int, value_shape: tuple, thread_stride: tuple, value_stride: tuple) -> tuple:
    """(row, column) of (thread, value) in a 64-row column-major matrix."""
    idx = sum(c * s for c, s in zip(_coords(thread, THREAD_SHAPE), thread_stride))
    idx += sum(c * s for c, s in zip(_coords(value, value_shape), value_stride))
    return idx % M, idx // M


def accumulator(thread: int, register: int, n: int = TILE_KV) -> tuple:
    """(row, column) of accumulator register `register` (s[0][register / 4][register % 4]) of a thread of
    the warpgroup, for m64nN."""
    return _layout(thread, register, (2, 2, n // 8), (128, 1, 16), (64, 8, 512))


def a_fragment(thread: int, value: int) -> tuple:
    """(row, k) of 8-bit value `value` (register value / 4, byte value % 4) of the A fragment of m64nNk32."""
    return _layout(thread, value, (4, 2, 2), (256, 1, 16), (64, 8, 1024))


def pack_p(ks: int) -> list:
    """templates/cuda/math_wgmma_fp8.j2's pack_p for k32 step ks: the accumulator register (4 n + e)
    packed into each byte of registers 0..3 of the A fragment, byte 0 the lowest."""
    n = 4 * ks
    regs = [[(n, 0), (n, 1), (n + 1, 0), (n + 1, 1)], [(n, 2), (n, 3), (n + 1, 2), (n + 1, 3)],
            [(n + 2, 0), (n + 2, 1), (n + 3, 0), (n + 3, 1)], [(n + 2, 2), (n + 2, 3), (n + 3, 2), (n + 3, 3)]]
    return [4 * tile + e for reg in regs for tile, e in reg]  # by A value index: register * 4 + byte


def test_the_layouts_are_the_documented_ones():
    """Lane 4 G + T of warp w: accumulator columns 8 j + 2 T (+1) of rows 16 w + G (+8); A values
    k = 4 T .. 4 T + 3 and 4 T + 16 .. of the same rows (fp8.py's docstring)."""
    for thread, j, e in itertools.product(range(128), range(TILE_KV // 8), range(4)):
        w, lane = divmod(thread, 32)
        g, t = divmod(lane, 4)
        assert accumulator(thread, 4 * j + e) == (16 * w + g + 8 * (e // 2), 8 * j + 2 * t + e % 2)
    for thread, v in itertools.product(range(128), range(16)):
        w, lane = divmod(thread, 32)
        g, t = divmod(lane, 4)
        reg, byte = divmod(v, 4)
        assert a_fragment(thread, v) == (16 * w + g + 8 * (reg % 2), 4 * t + byte + 16 * (reg // 2))


def test_key_slots_are_a_permutation_of_each_32_key_block():
    assert sorted(KEY_SLOTS) == list(range(KEY_BLOCK))
    assert KEY_SLOTS[:8] == (0, 1, 8, 9, 2, 3, 10, 11) and KEY_SLOTS[16:20] == (16, 17, 24, 25)


def test_the_accumulator_in_its_order_is_the_a_fragment_of_the_slots():
    """Every byte pack_p puts in A value v of a thread is the score of the row and the key that the A
    fragment's (row, k) means once slot k holds key KEY_SLOTS[k]: no shuffle is needed."""
    for ks in range(TILE_KV // KEY_BLOCK):
        packed = pack_p(ks)
        for thread, v in itertools.product(range(128), range(16)):
            row, col = accumulator(thread, packed[v])
            a_row, slot = a_fragment(thread, v)
            assert (a_row, KEY_BLOCK * ks + KEY_SLOTS[slot]) == (row, col)


def _prepare_v(v: np.ndarray) -> np.ndarray:
    """templates/cuda/fp8_prepare.j2's V^T of one (sequence, KV head): v (Lk, D) -> (D, padded slots),
    slot k of each 32-key block holding key KEY_SLOTS[k] of that block, zeros past Lk."""
    lk, d = v.shape
    slots = padded_keys(lk)
    rows = np.zeros((slots, d), v.dtype)
    rows[:lk] = v
    vt = np.zeros((d, slots), v.dtype)
    for s in range(0, slots, 4):
        key, k = s & ~31, s & 31
        for u in range(4):
            vt[:, s + u] = rows[key + KEY_SLOTS[k + u]]
    return vt


@pytest.mark.parametrize("lk", [1, 7, 113, 128, 300])
def test_p_v_through_the_fragments_and_v_transposed(lk):
    """One warpgroup's acc += P V, emulated value by value from the registers of P and V^T's slots,
    equals P @ V (here on floats: the layout alone is under test)."""
    rng = np.random.default_rng(lk)
    d = 64
    s = rng.standard_normal((M, padded_keys(lk)))
    s[:, lk:] = 0.0  # keys past Lk have weight 0
    v = rng.standard_normal((lk, d))
    vt = _prepare_v(v)
    acc = np.zeros((M, d))
    for tile in range(padded_keys(lk) // TILE_KV):
        for ks in range(TILE_KV // KEY_BLOCK):
            packed = pack_p(ks)
            for thread, val in itertools.product(range(128), range(16)):
                row, col = accumulator(thread, packed[val])
                p = s[row, tile * TILE_KV + col]  # the register's value
                a_row, k = a_fragment(thread, val)
                acc[a_row] += p * vt[:, tile * TILE_KV + KEY_BLOCK * ks + k]  # B[k][:] = V^T's slot
    np.testing.assert_allclose(acc, s[:, :lk] @ v, rtol=1e-12, atol=1e-12)


def _clear_nonfinite(word: int, bits: int, step: int) -> tuple:
    """fp8_prepare.j2's clear_nonfinite_fp8 on one 32-bit word: (cleaned word, found)."""
    high = (((word & bits) + step) & 0xFFFFFFFF) & 0x80808080
    return word & ~((high >> 7) * 0xFF) & 0xFFFFFFFF, high != 0


@pytest.mark.parametrize("dtype, bits, step", [("e4m3", 0x7F7F7F7F, 0x01010101), ("e5m2", 0x7C7C7C7C, 0x04040404)])
def test_the_non_finite_bytes_are_found_and_zeroed(dtype, bits, step):
    finite = np.isfinite(decode_fp8(np.arange(256), dtype))
    rng = np.random.default_rng(0)
    words = np.concatenate([rng.integers(0, 256, (4096, 4)), np.arange(256).repeat(4).reshape(-1, 4)])
    for b in words:
        word = int(b[0] | b[1] << 8 | b[2] << 16 | b[3] << 24)
        cleaned, found = _clear_nonfinite(word, bits, step)
        bad = [not finite[x] for x in b]
        assert found == any(bad)
        assert [(cleaned >> (8 * i)) & 0xFF for i in range(4)] == [0 if bad[i] else int(b[i]) for i in range(4)]


# -- the _prepare_v entry itself, compiled with g++ and run on the CPU (one std::thread per CUDA thread) --

_SHIM = r'''
#include <cstring>
#include <thread>
#include <barrier>
#include <vector>
struct dim3_ { unsigned x, y, z; };
thread_local dim3_ threadIdx, blockIdx, gridDim;
static std::barrier<>* g_bar;
#define __device__
#define __forceinline__ inline
#define __global__
#define __constant__
#define __launch_bounds__(x)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static  // (one block at a time: a function's statics are its shared memory)
#define __syncthreads() g_bar->arrive_and_wait()
struct uint4 { unsigned x, y, z, w; };
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
inline unsigned atomicOr(unsigned* p, unsigned v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
// byte n of the result: byte (nibble n of s, low 3 bits) of the 8 bytes y:x (CUDA's __byte_perm)
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const unsigned long long both = (unsigned long long)y << 32 | x;
    unsigned r = 0;
    for (int n = 0; n < 4; ++n) r |= (unsigned)(both >> (8 * ((s >> (4 * n)) & 7)) & 0xff) << (8 * n);
    return r;
}
template <class T> inline T __ldcs(const T* p) { return *p; }  // (a streaming load: the cache hint alone)
typedef unsigned short elem_t;
'''
_RUN = r'''
extern "C" void run(const unsigned char* v, long long sb, long long sl, long long sh, unsigned char* vt,
                    unsigned* vt_bad, const float* qd, const float* kd, const float* vd, int len_k, int* errors,
                    int gx, int gy, int gz) {
    for (int bz = 0; bz < gz; ++bz) for (int by = 0; by < gy; ++by) for (int bx = 0; bx < gx; ++bx) {
        std::barrier<> bar(kPrepareThreads);
        g_bar = &bar;
        std::vector<std::thread> threads;
        for (int t = 0; t < kPrepareThreads; ++t) threads.emplace_back([&, t] {
            threadIdx = {(unsigned)t, 0, 0};
            blockIdx = {(unsigned)bx, (unsigned)by, (unsigned)bz};
            gridDim = {(unsigned)gx, (unsigned)gy, (unsigned)gz};
            ENTRY(reinterpret_cast<const elem_t*>(v), sb, sl, sh, vt, vt_bad, qd, kd, vd, len_k, errors);
        });
        for (auto& th : threads) th.join();
    }
}
'''


def _constants(source: str, *names: str) -> str:
    """The generated source's own `constexpr int` lines of `names` (section config), for the emulation."""
    import re
    lines = []
    for name in names:
        m = re.search(rf"^constexpr int {name} = \d+;", source, re.M)
        assert m, name
        lines.append(m.group(0))
    return "\n".join(lines) + "\n"


def _prepare_on_the_cpu(plan, dtype: str, lk: int, b: int, h: int, tmp_path, bad_descale: bool = True) -> None:
    """Run the plan's generated _prepare_v entry (templates/cuda/fp8_prepare.j2) on the CPU on strided FP8
    bytes, launched as a runtime launches it: its grid and the vt / vt_bad workspaces' shapes from the plan's
    own formulas (fp8.prepare_entry, fp8.workspaces), the constants from the source's section config, and a
    guard as large as each workspace after it. Checks V^T with the key slots permuted, zeros past Lk and
    where v held an inf or NaN, those keys' bits, nothing written past the workspaces, the tensor map's key
    slots (fp8.padded_keys) those of the workspace, and a bad descale reported at its flat index + 1."""
    import ctypes

    from attngen.api import emit_plan
    from attngen.plan.formulas import evaluate_all
    from cuda_emulation import gxx_library
    d = plan.d_v
    source = emit_plan(plan).source
    prepare = source[source.index("// ---- section: prepare V (FP8)"):]
    lib = gxx_library(_SHIM + _constants(source, "kHeadDimV", "kPrepKeys") + prepare
                      + _RUN.replace("ENTRY", f"{plan.entry}_prepare_v"), str(tmp_path))
    sizes = dict(B=b, Lq=lk, Lk=lk, Hq=h, Hkv=h, Dqk=plan.d_qk, Dv=d)
    entry = next(e for e in plan.entries if e.name == "prepare_v")
    grid = evaluate_all(entry.grid, **sizes)
    shapes = {w.name: evaluate_all(w.shape, **sizes) for w in plan.workspaces if w.name in ("vt", "vt_bad")}
    slots = padded_keys(lk)  # (the key slots of fp8_call's tensor map over vt)
    assert shapes == {"vt": (b, h, d, slots), "vt_bad": (b, h, slots // 32)}, shapes
    rng = np.random.default_rng(lk)
    base = rng.integers(0, 256, (b, lk, h + 1, d), dtype=np.uint8)  # a strided view: every other head skipped
    v = base[:, :, 1:]
    nonfinite = ~np.isfinite(decode_fp8(v, dtype))
    vt_mem = np.full(2 * b * h * d * slots, 0xAB, np.uint8)  # (not yet written: 0xAB; the second half a guard)
    bad_mem = np.full(2 * b * h * (slots // 32), 0xDEADBEEF, np.uint32)
    qd, kd, vd = (np.ones((b, h), np.float32) for _ in range(3))
    if bad_descale:
        kd[1, 2] = np.nan
    errors = np.zeros(8, np.int32)
    ptr = lambda a: ctypes.c_void_p(a.ctypes.data)  # noqa: E731
    lib.run(ptr(base[:, :, 1:]), ctypes.c_longlong(lk * (h + 1) * d), ctypes.c_longlong((h + 1) * d),
            ctypes.c_longlong(d), ptr(vt_mem), ptr(bad_mem), ptr(qd), ptr(kd), ptr(vd), ctypes.c_int(lk), ptr(errors),
            *grid)
    vt, bad = vt_mem[:vt_mem.size // 2].reshape(b, h, d, slots), bad_mem[:bad_mem.size // 2].reshape(b, h, -1)
    assert (vt_mem[vt_mem.size // 2:] == 0xAB).all(), "vt written past the workspace"
    assert (bad_mem[bad_mem.size // 2:] == 0xDEADBEEF).all(), "vt_bad written past the workspace"
    want = np.zeros((b, h, d, slots), np.uint8)
    for bi, hi in itertools.product(range(b), range(h)):
        want[bi, hi] = _prepare_v(np.where(nonfinite[bi, :, hi], 0, v[bi, :, hi]))
    np.testing.assert_array_equal(vt, want)
    keys = np.zeros((b, h, slots), bool)
    keys[:, :, :lk] = nonfinite.any(axis=-1).transpose(0, 2, 1)
    want_bits = np.packbits(keys.reshape(b, h, -1, 32), axis=-1, bitorder="little").view("<u4")[..., 0]
    np.testing.assert_array_equal(bad, want_bits)
    assert errors.tolist() == [0, 0, 0, 0, 0, 0, 1 * h + 2 + 1 if bad_descale else 0, 0]  # k_descale[1, 2]: 5, + 1


@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="no g++ to compile the emulation")
@pytest.mark.parametrize("dtype, lk, d", [("e4m3", 300, 64), ("e5m2", 128, 32), ("e4m3", 1, 128), ("e5m2", 257, 48),
                                          ("e4m3", 129, 256), ("e4m3", 113, 16)])
def test_the_prepare_v_kernel_on_the_cpu(dtype, lk, d, tmp_path):
    """The generated _prepare_v entry of the default tiles (tile kv 128) on the CPU (_prepare_on_the_cpu)."""
    import attngen
    spec = attngen.parse(f"attention p {{\n head_dim {d}\n dtype {dtype}\n}}\n")[0]
    _prepare_on_the_cpu(attngen.lower(spec, "cuda", "cuda-sm90"), dtype, lk, 2, 3, tmp_path)


@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="no g++ to compile the emulation")
@pytest.mark.parametrize("tile_kv, d, lk", [(192, 128, 384), (192, 128, 200), (256, 64, 256), (256, 64, 600),
                                            (64, 64, 256), (96, 32, 300), (160, 48, 160), (224, 64, 129)])
def test_the_prepare_v_kernel_of_other_tiles_kv_on_the_cpu(tile_kv, d, lk, tmp_path):
    """Tile kv other than 128: _prepare_v's blocks stay TILE_KV keys (its
    grid, vt's key slots and vt_bad's words are counted in them), not the attention's tile kv. Its blocks of
    kBlockKV keys (until the fifteenth session) wrote vt and vt_bad with rows of ceil(Lk / 128) * kBlockKV
    slots: past both workspaces at every tile kv above 128 (the GPU's illegal address at d128 kv192 and d64
    kv256), only part of the keys below it. Lk a multiple of the tile and not."""
    import attngen
    from attngen import backends
    spec = attngen.parse(f"attention p {{\n head_dim {d}\n dtype e4m3\n tile q=128 kv={tile_kv}\n}}\n")[0]
    profile = backends.get("cuda").profile("cuda-sm90")
    plan = attngen.lower(spec, "cuda", profile)
    assert plan.tile_kv == tile_kv
    _prepare_on_the_cpu(plan, "e4m3", lk, 2, 3, tmp_path)


# -- Q K^T through the shared-memory layouts: the tensor copy engine's swizzled writes, the generated
# issue_scores' descriptors (compiled with g++), and wgmma's reading of them, per the PTX ISA ----------
#
# The model (PTX ISA, "Shared Memory Matrix Layout" and "Matrix Descriptor Format" of wgmma; the CUDA
# programming guide's tensor map swizzles): a swizzle of W bytes (128, 64, 32) moves the 16-byte chunk
# of an address by the address's bits [7, 7 + log2(W / 16)): address bits [4, ..) ^= bits [7, ..) (CuTe's
# Swizzle<3, 4, 3>, <2, 4, 3>, <1, 4, 3>), on the absolute shared-memory address (tiles start on the
# pattern's boundary, W * 8 bytes: base offset 0). The tensor copy engine writes a box of rows of W bytes
# row after row from its destination, then swizzled; a K-major descriptor of mode 1 (128 B), 2 (64 B) or
# 3 (32 B) reads row i of 8-row group g, byte c of the k32 step, at start + g * SBO + i * W + c, swizzled
# the same way (the canonical layout Swizzle<b, 4, 3> o ((8, m), (T, 2k)) : ((W / 16 T, SBO), (1, T))).

_SWIZZLE_BYTES = {1: 128, 2: 64, 3: 32}


def _swizzled(addr: np.ndarray, width: int) -> np.ndarray:
    mask = width // 16 - 1
    return addr ^ (((addr >> 7) & mask) << 4)


def _tma_write(smem: np.ndarray, dst: int, box: np.ndarray, width: int):
    """One tensor copy of `box` (rows x width bytes) to byte `dst` of shared memory, swizzled."""
    assert dst % (8 * width) == 0, "the tile starts on the swizzle pattern's boundary"
    rows = box.shape[0]
    addr = dst + np.arange(rows)[:, None] * width + np.arange(width)[None, :]
    smem[_swizzled(addr, width)] = box


def _wgmma_read(smem: np.ndarray, desc: int, rows: int) -> np.ndarray:
    """The rows x 32 bytes a K-major k32 step of 8-bit values reads through descriptor `desc`."""
    start, sbo, base, mode = (desc & 0x3FFF) << 4, ((desc >> 32) & 0x3FFF) << 4, (desc >> 49) & 7, desc >> 62
    assert base == 0 and mode in _SWIZZLE_BYTES, (base, mode)
    width = _SWIZZLE_BYTES[mode]
    r = np.arange(rows)[:, None]
    addr = start + (r // 8) * sbo + (r % 8) * width + np.arange(32)[None, :]
    return smem[_swizzled(addr, width)]


def _scores_library(source: str, tmp_path):
    """WarpMath's init and issue_scores, the descriptor functions and the constants of a generated FP8
    kernel, compiled with g++: run(warp, stage, descs) writes the (A, B) descriptors of each k32 step of
    warp `warp`'s Q K^T against stage `stage`'s K tile, returns their count."""
    import re

    from cuda_emulation import gxx_library
    consts = "\n".join(m.group(0) for m in re.finditer(r"^constexpr (?:int|unsigned|bool) k\w+ = [^;]+;", source, re.M))
    descs = "\n".join(m.group(0) for m in re.finditer(
        r"^__device__ __forceinline__ unsigned long long smem_descriptor\w*\(.*?\n}\n", source, re.M | re.S))
    methods = "\n".join(re.search(rf"^    __device__ __forceinline__ void {name}\(.*?\n    }}\n", source,
                                  re.M | re.S).group(0) for name in ("init", "issue_scores"))
    steps = re.search(r"^    static constexpr int kKSteps = [^;]+;", source, re.M).group(0)
    assert "math.issue_scores(s, sK + stage * kBlockKV * kStrideK)" in source  # (the stage's tile, as run() gives it)
    shim = r'''
#include <cstring>
typedef unsigned short elem_t;
#define __device__
#define __forceinline__ inline
static unsigned char g_smem[1 << 18];
inline unsigned smem_addr(const void* p) { return (unsigned)((const unsigned char*)p - g_smem); }
'''
    run = r'''
static unsigned long long g_desc[64][2];
static int g_n;
inline void wgmma_fence() {}
inline void wgmma_commit() {}
inline void wgmma_scores(float (&)[kNTilesKV][4], unsigned long long a, unsigned long long b, int) {
    g_desc[g_n][0] = a; g_desc[g_n][1] = b; ++g_n;
}
struct WarpMath {
STEPS
    const elem_t* sQ;
METHODS
};
extern "C" int run(int warp, int stage, unsigned long long* out) {
    WarpMath math;
    math.init(g_smem, warp, 0);
    elem_t* sK = reinterpret_cast<elem_t*>(g_smem + kOffsetK);
    float s[kFrags][kNTilesKV][4];
    g_n = 0;
    math.issue_scores(s, sK + stage * kBlockKV * kStrideK);
    std::memcpy(out, g_desc, sizeof(unsigned long long) * 2 * g_n);
    return g_n;
}
'''.replace("STEPS", steps).replace("METHODS", methods)
    return gxx_library(shim + consts + "\n" + descs + run, str(tmp_path))


def _scores_source(head_dim: int, swizzle64: bool, tile_q: int = 128, tile_kv: int = TILE_KV):
    import attngen
    from attngen import backends
    from attngen.api import emit_plan
    spec = attngen.parse(f"attention p {{\n head_dim {head_dim}\n dtype e4m3\n tile q={tile_q} kv={tile_kv}\n}}\n")[0]
    plan = attngen.lower(spec, "cuda", backends.get("cuda").profile("cuda-sm90").with_overrides(fp8_swizzle64=swizzle64))
    return plan, emit_plan(plan).source


@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="no g++ to compile the emulation")
@pytest.mark.parametrize("head_dim, swizzle64, tile_q, tile_kv", [
    (64, True, 128, 128), (48, True, 128, 128), (16, True, 64, 128), (32, True, 128, 128), (64, False, 128, 128),
    (128, False, 128, 128), (256, False, 64, 128), (96, False, 128, 128),
    (64, True, 192, 160), (64, True, 128, 256), (64, False, 192, 128), (128, False, 128, 192)])  # (fp8tile's tiles)
def test_q_k_transposed_through_the_swizzled_tiles(head_dim, swizzle64, tile_q, tile_kv, tmp_path):
    """Q and K written as the tensor copy engine writes them (one copy per W-byte block of each row: the
    template's tma_tile / tma_tile_sw64), then read back through the generated issue_scores' descriptors
    as wgmma reads them: every warpgroup's S = Q K^T over the head dim, in both modes (the 128-byte one
    runs on the GPU already: it checks the model), at every stage of the ring."""
    plan, source = _scores_source(head_dim, swizzle64, tile_q, tile_kv)
    c = plan.config
    width = c.qk_swizzle
    assert width == (64 if swizzle64 else 128) and c.d_qk_pad % width == 0
    lib = _scores_library(source, tmp_path)
    offset = {b.name: b.offset for b in c.buffers}
    rng = np.random.default_rng(head_dim)
    q = np.zeros((tile_q, c.d_qk_pad), np.int64)
    q[:, :head_dim] = rng.integers(-8, 8, (tile_q, head_dim))
    smem = np.zeros(1 << 18, np.int64)
    for blk in range(c.d_qk_pad // width):  # (the engine zero-fills columns past the head dim)
        _tma_write(smem, offset["sQ"] + blk * tile_q * width, q[:, blk * width:(blk + 1) * width], width)
    for stage in range(c.stages):
        k = np.zeros((tile_kv, c.d_qk_pad), np.int64)
        k[:, :head_dim] = rng.integers(-8, 8, (tile_kv, head_dim))
        tile = offset["sK"] + stage * tile_kv * c.d_qk_pad
        for blk in range(c.d_qk_pad // width):
            _tma_write(smem, tile + blk * tile_kv * width, k[:, blk * width:(blk + 1) * width], width)
        for warp in range(0, tile_q // 16, 4):  # (the first warp of each warpgroup: init's rows are per warpgroup)
            out = np.zeros((64, 2), np.uint64)
            n = lib.run(warp, stage, out.ctypes.data_as(__import__("ctypes").c_void_p))
            assert n == -(-head_dim // 32)  # k32 steps over the head dim only, none over the padding
            s = sum(_wgmma_read(smem, int(a), 64) @ _wgmma_read(smem, int(b), tile_kv).T for a, b in out[:n])
            rows = slice(16 * warp, 16 * warp + 64)
            np.testing.assert_array_equal(s, q[rows] @ k.T)


def test_the_model_tells_the_swizzles_apart():
    """The same tile read with the other swizzle's descriptor (or the 128-byte stride) is not Q: the
    emulation would catch a wrong mode or stride."""
    rng = np.random.default_rng(1)
    q = rng.integers(-8, 8, (64, 64))
    smem = np.zeros(1 << 16, np.int64)
    _tma_write(smem, 0, q, 64)
    desc = lambda mode, sbo, start=0: (start >> 4) | (1 << 16) | ((sbo >> 4) << 32) | (mode << 62)  # noqa: E731
    for kk in range(2):
        np.testing.assert_array_equal(_wgmma_read(smem, desc(2, 512, 32 * kk), 64), q[:, 32 * kk:32 * kk + 32])
        assert not np.array_equal(_wgmma_read(smem, desc(1, 512, 32 * kk), 64), q[:, 32 * kk:32 * kk + 32])
        assert not np.array_equal(_wgmma_read(smem, desc(2, 1024, 32 * kk), 64), q[:, 32 * kk:32 * kk + 32])
