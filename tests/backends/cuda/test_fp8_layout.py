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


@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="no g++ to compile the emulation")
@pytest.mark.parametrize("dtype, lk, d", [("e4m3", 300, 64), ("e5m2", 128, 32), ("e4m3", 1, 128), ("e5m2", 257, 48),
                                          ("e4m3", 129, 256), ("e4m3", 113, 16)])
def test_the_prepare_v_kernel_on_the_cpu(dtype, lk, d, tmp_path):
    """The generated _prepare_v entry (templates/cuda/fp8_prepare.j2) on strided FP8 bytes: V^T with
    the key slots permuted, zeros past Lk and where v held an inf or NaN, those keys' bits, and a bad
    descale reported at its flat index + 1."""
    import ctypes

    import attngen
    from attngen.api import emit_plan
    from backward_helpers import gxx_library
    spec = attngen.parse(f"attention p {{\n head_dim {d}\n dtype {dtype}\n}}\n")[0]
    plan = attngen.lower(spec, "cuda", "cuda-sm90")
    source = emit_plan(plan).source
    prepare = source[source.index("// ---- section: prepare V (FP8)"):]
    lib = gxx_library(_SHIM + f"constexpr int kBlockKV = {TILE_KV}; constexpr int kHeadDimV = {d};\n" + prepare
                      + _RUN.replace("ENTRY", f"{plan.entry}_prepare_v"), str(tmp_path))
    b, h = 2, 3
    rng = np.random.default_rng(lk)
    base = rng.integers(0, 256, (b, lk, h + 1, d), dtype=np.uint8)  # a strided view: every other head skipped
    v = base[:, :, 1:]
    nonfinite = ~np.isfinite(decode_fp8(v, dtype))
    slots = padded_keys(lk)
    vt = np.full((b, h, d, slots), 0xAB, np.uint8)  # (not yet written: 0xAB)
    bad = np.full((b, h, slots // 32), 0xDEADBEEF, np.uint32)
    qd, kd, vd = (np.ones((b, h), np.float32) for _ in range(3))
    kd[1, 2] = np.nan
    errors = np.zeros(8, np.int32)
    ptr = lambda a: ctypes.c_void_p(a.ctypes.data)  # noqa: E731
    lib.run(ptr(base[:, :, 1:]), ctypes.c_longlong(lk * (h + 1) * d), ctypes.c_longlong((h + 1) * d),
            ctypes.c_longlong(d), ptr(vt), ptr(bad), ptr(qd), ptr(kd), ptr(vd), ctypes.c_int(lk), ptr(errors),
            slots // TILE_KV, h, b)
    want = np.zeros((b, h, d, slots), np.uint8)
    for bi, hi in itertools.product(range(b), range(h)):
        want[bi, hi] = _prepare_v(np.where(nonfinite[bi, :, hi], 0, v[bi, :, hi]))
    np.testing.assert_array_equal(vt, want)
    keys = np.zeros((b, h, slots), bool)
    keys[:, :, :lk] = nonfinite.any(axis=-1).transpose(0, 2, 1)
    want_bits = np.packbits(keys.reshape(b, h, -1, 32), axis=-1, bitorder="little").view("<u4")[..., 0]
    np.testing.assert_array_equal(bad, want_bits)
    assert errors.tolist() == [0, 0, 0, 0, 0, 0, 1 * h + 2 + 1, 0]  # k_descale[1, 2]: flat index 5, + 1
