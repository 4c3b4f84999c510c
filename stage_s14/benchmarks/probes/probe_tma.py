"""Probe of the tensor copy engine for the Hopper family (issue 11; run on an sm_90 GPU).

    python3 benchmarks/probes/probe_tma.py

Settles, before the kernels use it, what the PTX text and the driver's header leave to be
checked: a tensor map built on the host with cuTensorMapEncodeTiled (the driver through ctypes:
no new dependency), passed by value as a `__grid_constant__` parameter, and one
`cp.async.bulk.tensor.2d` per 64-column block completing on an mbarrier
(`mbarrier.arrive.expect_tx` + `mbarrier.try_wait.parity`) lands a tile of K (rows x 128 f16
columns, 128-byte swizzle) in shared memory exactly in the layout of `swizzled<kRows>(r, c)`
(templates/cuda/copy.j2), the layout the wgmma descriptors read; rows past the tensor's end
are zero-filled by the engine. Prints one line per case and exits 1 on a mismatch.
"""

from __future__ import annotations

import ctypes
import sys
import tempfile

import numpy as np
import cupy as cp

from attngen.backends.cuda.nvrtc import compile_cubin

ROWS, COLS = 64, 128  # one K tile of a d128 kernel: two 64-column (128-byte) blocks

SRC = r'''
typedef unsigned short elem_t;
struct alignas(64) TensorMap { unsigned long long opaque[16]; };  // CUtensorMap (driver header)
constexpr int kRows = %(rows)d, kCols = %(cols)d;
__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
template <int R> __device__ __forceinline__ int swizzled(int r, int col) {
    return (col / 64) * (R * 64) + r * 64 + ((((col / 8) %% 8) ^ (r %% 8)) * 8) + col %% 8; }

extern "C" __global__ void __launch_bounds__(128) probe(const __grid_constant__ TensorMap tmap, elem_t* out,
                                                        int row0) {
    extern __shared__ __align__(1024) unsigned char raw[];
    unsigned char* sm = raw + ((1024u - (smem_addr(raw) & 1023u)) & 1023u);
    elem_t* tile = reinterpret_cast<elem_t*>(sm);
    unsigned long long* bar = reinterpret_cast<unsigned long long*>(sm + kRows * kCols * 2);
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%%0], 1;\n" :: "r"(smem_addr(bar)));
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%%0], %%1;\n"
                     :: "r"(smem_addr(bar)), "r"(kRows * kCols * 2) : "memory");
        for (int blk = 0; blk < kCols / 64; ++blk) {  // one copy per 64-column block
            asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                         " [%%0], [%%1, {%%2, %%3}], [%%4];\n"
                         :: "r"(smem_addr(tile + blk * kRows * 64)), "l"(&tmap), "r"(blk * 64), "r"(row0),
                            "r"(smem_addr(bar)) : "memory");
        }
    }
    unsigned done = 0;
    while (!done) {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%%1], 0;\nselp.u32 %%0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(smem_addr(bar)) : "memory");
    }
    for (int i = threadIdx.x; i < kRows * kCols; i += blockDim.x) {  // un-swizzle with the kernels' formula
        const int r = i / kCols, c = i %% kCols;
        out[i] = tile[swizzled<kRows>(r, c)];
    }
}
'''

# CUtensorMap enums (cuda.h)
F16, NO_INTERLEAVE, SWIZZLE_128B, L2_128B, OOB_ZERO = 6, 0, 3, 2, 0


def encode(lib, base: int, rows: int, cols: int, row_stride_bytes: int, box_rows: int) -> np.ndarray:
    """A 2-d tensor map over a (rows, cols) f16 matrix, boxes of box_rows x 64 (128 bytes)."""
    tmap = np.zeros(16 + 8, np.uint64)  # 128 bytes, 64-byte aligned below
    off = (-tmap.ctypes.data % 64) // 8
    view = tmap[off:off + 16]
    dims = (ctypes.c_uint64 * 2)(cols, rows)  # innermost first
    strides = (ctypes.c_uint64 * 1)(row_stride_bytes)
    box = (ctypes.c_uint32 * 2)(64, box_rows)
    elem = (ctypes.c_uint32 * 2)(1, 1)
    rc = lib.cuTensorMapEncodeTiled(ctypes.c_void_p(view.ctypes.data), F16, 2, ctypes.c_void_p(base), dims, strides,
                                    box, elem, NO_INTERLEAVE, SWIZZLE_128B, L2_128B, OOB_ZERO)
    if rc != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled: CUresult {rc}")
    return view


def main() -> int:
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuTensorMapEncodeTiled.restype = ctypes.c_int
    cp.cuda.Device(0).use()
    cc = cp.cuda.Device(0).compute_capability
    cubin, _ = compile_cubin(SRC % {"rows": ROWS, "cols": COLS}, "sm_90a" if cc == "90" else f"sm_{cc}", "probe_tma.cu")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:  # RawModule loads a cubin from a path
        f.write(cubin)
        f.flush()
        mod = cp.RawModule(path=f.name)
        fn = mod.get_function("probe").kernel  # (RawModule loads the file lazily: here, while it exists)
    smem = ROWS * COLS * 2 + 8 + 1024
    rng = np.random.default_rng(0)
    ok = True
    # K of one head in a (B, L, H, D) tensor: rows L apart by H * D elements
    for L, H, row0 in ((200, 4, 0), (200, 4, 128), (200, 4, 160), (70, 1, 64)):
        host = rng.standard_normal((L, H, COLS)).astype(np.float16)
        dev = cp.asarray(host)
        out = cp.zeros((ROWS, COLS), cp.float16)
        tmap = encode(lib, dev.data.ptr, L, COLS, H * COLS * 2, ROWS)  # head 0
        outp = np.array([out.data.ptr], np.uint64)
        r0 = np.array([row0], np.int32)
        params = np.array([tmap.ctypes.data, outp.ctypes.data, r0.ctypes.data], np.uint64)
        cp.cuda.driver.launchKernel(fn.ptr, 1, 1, 1, 128, 1, 1, smem, 0, params.ctypes.data, 0)
        cp.cuda.runtime.deviceSynchronize()
        want = np.zeros((ROWS, COLS), np.float16)
        n = max(0, min(ROWS, L - row0))
        want[:n] = host[row0:row0 + n, 0]
        same = np.array_equal(cp.asnumpy(out), want)
        ok &= same
        print(f"L={L} H={H} rows {row0}..{row0 + ROWS - 1}: {'same as numpy' if same else 'DIFFERENT'}"
              f" ({n} rows in the tensor, {ROWS - n} zero-filled)", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
