"""How fast can a block stream K/V tiles on this GPU? (issue 12: decode sits ~3% below SDPA
flash and cuDNN at B8; is that the 128 blocks on 132 SMs, a per-SM cap, or the copy method?)

    python3 benchmarks/probes/probe_stream.py

No attention: each block copies K/V tiles of decode's layout (B8, Lk 32768, 8 KV heads, d128,
f16: 128 keys x 256 bytes at a stride of 2 KB, K and V) into shared memory and throws them away,
with either cp.async (16 bytes per thread per copy, L2::128B, as the decode kernel) or the bulk
copy engine (cp.async.bulk, one 256-byte row per copy, completing on an mbarrier), through a
ring of `stages` tiles. The grid takes the (pair, tile) space flat: block g copies tiles
[g T / G, (g + 1) T / G), so G = 128 is decode's split_kv(2) and G = 132 the same work spread
over every SM. Prints TB/s (K + V bytes / median kernel time of 20 runs of 10 launches back to back,
CUDA events).
"""

from __future__ import annotations

import statistics

import cupy as cp

B, L, H, D = 8, 32768, 8, 128
CONFIGS = ((128, 1), (128, 2), (128, 3), (64, 2), (64, 3), (64, 4), (32, 4))  # (keys per tile, stages)

SRC = r'''
constexpr int kTile = %(tile)d, kStages = %(stages)d, kRowBytes = 256, kThreads = 128, kOrder = %(order)d, kPitch = %(pitch)d;  // kPitch: shared-memory row pitch (bytes)
#define CP_ASYNC "%(copy)s"
constexpr long long kRowStride = %(row_stride)d;  // bytes between keys
__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// tile t of the flat (pair, tile) space: its first K row
__device__ __forceinline__ const char* tile_src(const char* base, long long t, int tiles_per_pair, int heads, long long len) {
    const long long pair = t / tiles_per_pair, j = t %% tiles_per_pair;
    const long long b = pair / heads, h = pair %% heads;
    return base + ((b * len + j * kTile) * heads + h) * kRowBytes;
}

extern "C" __global__ void __launch_bounds__(kThreads) cpasync(const char* k, const char* v, long long tiles,
                                                               int tiles_per_pair, int heads, long long len, int* sink) {
    extern __shared__ __align__(128) unsigned char sm[];
    const long long t0 = tiles * blockIdx.x / gridDim.x, t1 = tiles * (blockIdx.x + 1) / gridDim.x;
    const int tid = threadIdx.x;
    const int sixteen = 16 + (int)(tiles < 0);  // a source size the compiler cannot fold
    auto issue = [&](long long t, int stage) {
        if (t < t1) {
            const char* ks = tile_src(k, t, tiles_per_pair, heads, len);
            const char* vs = tile_src(v, t, tiles_per_pair, heads, len);
            unsigned char* dst = sm + stage * 2 * kTile * kPitch;
            if (kOrder == 0) {  // K and V chunks interleaved, whole rows per 16 threads
                #pragma unroll
                for (int i = 0; i < kTile * 16 / kThreads; ++i) {
                    const int c = tid + i * kThreads, r = c / 16, col = (c %% 16) * 16;
                    asm volatile(CP_ASYNC :: "r"(smem_addr(dst + r * kPitch + col)), "l"(ks + r * kRowStride + col), "r"(sixteen));
                    asm volatile(CP_ASYNC :: "r"(smem_addr(dst + (kTile + r) * kPitch + col)), "l"(vs + r * kRowStride + col), "r"(sixteen));
                }
            } else if (kOrder == 1) {  // the whole K tile, then the whole V tile
                #pragma unroll
                for (int kv = 0; kv < 2; ++kv) {
                    #pragma unroll
                    for (int i = 0; i < kTile * 16 / kThreads; ++i) {
                        const int c = tid + i * kThreads, r = c / 16, col = (c %% 16) * 16;
                        asm volatile(CP_ASYNC :: "r"(smem_addr(dst + (kv * kTile + r) * kPitch + col)),
                                     "l"((kv ? vs : ks) + r * kRowStride + col), "r"(sixteen));
                    }
                }
            } else {  // FlashAttention-2's order: 128-byte halves of the rows, K then V
                #pragma unroll
                for (int kv = 0; kv < 2; ++kv) {
                    #pragma unroll
                    for (int half = 0; half < 2; ++half) {
                        #pragma unroll
                        for (int i = 0; i < kTile * 8 / kThreads; ++i) {
                            const int c = tid + i * kThreads, r = c / 8, col = half * 128 + (c %% 8) * 16;
                            asm volatile(CP_ASYNC :: "r"(smem_addr(dst + (kv * kTile + r) * kPitch + col)),
                                         "l"((kv ? vs : ks) + r * kRowStride + col), "r"(sixteen));
                        }
                    }
                }
            }
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };
    for (int s = 0; s < kStages - 1; ++s) issue(t0 + s, s);
    int acc = 0;
    for (long long t = t0; t < t1; ++t) {
        issue(t + kStages - 1, (t - t0 + kStages - 1) %% kStages);
        asm volatile("cp.async.wait_group %%0;\n" :: "n"(kStages - 1) : "memory");
        __syncthreads();
        acc += sm[((t - t0) %% kStages) * 2 * kTile * kPitch + tid];
        __syncthreads();
    }
    if (acc == 0x7fffffff) *sink = acc;
}

extern "C" __global__ void __launch_bounds__(kThreads) bulk(const char* k, const char* v, long long tiles,
                                                            int tiles_per_pair, int heads, long long len, int* sink) {
    extern __shared__ __align__(128) unsigned char sm[];
    unsigned long long* bar = reinterpret_cast<unsigned long long*>(sm + kStages * 2 * kTile * kRowBytes);
    const long long t0 = tiles * blockIdx.x / gridDim.x, t1 = tiles * (blockIdx.x + 1) / gridDim.x;
    const int tid = threadIdx.x;
    if (tid == 0) {
        for (int s = 0; s < kStages; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%%0], 1;\n" :: "r"(smem_addr(bar + s)));
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    auto issue = [&](long long t, int stage) {  // warp 0: 32 lanes x (4 K rows + 4 V rows)
        if (t >= t1 || tid >= 32) return;
        const char* ks = tile_src(k, t, tiles_per_pair, heads, len);
        const char* vs = tile_src(v, t, tiles_per_pair, heads, len);
        unsigned char* dst = sm + stage * 2 * kTile * kRowBytes;
        if (tid == 0) asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%%0], %%1;\n"
                                   :: "r"(smem_addr(bar + stage)), "r"(2 * kTile * kRowBytes) : "memory");
        __syncwarp();
        #pragma unroll
        for (int i = 0; i < kTile / 32; ++i) {
            const int r = tid + 32 * i;
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%%0], [%%1], %%2, [%%3];\n"
                         :: "r"(smem_addr(dst + r * kRowBytes)), "l"(ks + r * kRowStride), "r"(kRowBytes),
                            "r"(smem_addr(bar + stage)) : "memory");
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%%0], [%%1], %%2, [%%3];\n"
                         :: "r"(smem_addr(dst + (kTile + r) * kRowBytes)), "l"(vs + r * kRowStride), "r"(kRowBytes),
                            "r"(smem_addr(bar + stage)) : "memory");
        }
    };
    for (int s = 0; s < kStages - 1; ++s) issue(t0 + s, s);
    int acc = 0;
    for (long long t = t0; t < t1; ++t) {
        const int n = (int)(t - t0), stage = n %% kStages;
        issue(t + kStages - 1, (n + kStages - 1) %% kStages);
        unsigned done = 0;
        const unsigned parity = (n / kStages) & 1;
        while (!done) {
            asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%%1], %%2;\nselp.u32 %%0, 1, 0, p;\n}\n"
                         : "=r"(done) : "r"(smem_addr(bar + stage)), "r"(parity) : "memory");
        }
        acc += sm[stage * 2 * kTile * kRowBytes + tid];
        __syncthreads();  // every thread has read the stage before it is refilled
    }
    if (acc == 0x7fffffff) *sink = acc;
}
'''


COPIES = {  # the cp.async variants
    "128B": "cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\\n",
    "nohint": "cp.async.cg.shared.global [%0], [%1], 16;\\n",
    "256B": "cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\\n",
    "zfill": "cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\\n",  # with a source size (16)
    "evict_first": "cp.async.cg.shared.global.L2::cache_hint.L2::128B [%0], [%1], 16, %2;\\n",
}


def kernels(tile: int, stages: int, copy: str = "128B", order: int = 0, pitch: int = 256):
    src = SRC % {"tile": tile, "stages": stages, "row_stride": H * D * 2, "copy": COPIES[copy], "order": order,
                 "pitch": pitch}
    mod = cp.RawModule(code=src, options=("-std=c++17", "-arch=sm_90a"))
    return mod.get_function("cpasync"), mod.get_function("bulk")


def time_ms(fn, runs: int = 20) -> float:
    fn()
    times = []
    for _ in range(runs):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        for _ in range(10):  # back to back: no launch gaps in the figure
            fn()
        b.record()
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b) / 10)
    return statistics.median(times)


def main():
    k = cp.random.standard_normal((B, L, H, D), dtype=cp.float32).astype(cp.float16)
    v = cp.random.standard_normal((B, L, H, D), dtype=cp.float32).astype(cp.float16)
    sink = cp.zeros(1, dtype=cp.int32)
    nbytes = 2 * k.nbytes
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    # the decode kernel's shape: 272-byte rows (136 f16) and 143.6 KB of shared memory, K then V
    for copy, order, pitch, extra in [("128B", 0, 256, 0), ("zfill", 1, 272, 4352), ("zfill", 1, 256, 0),
                                      ("128B", 0, 272, 4352), ("128B", 0, 256, 16384), ("128B", 0, 256, 0)]:
        for tile, stages, grid in ((128, 2, 128),):
            tiles = B * H * (L // tile)
            f = kernels(tile, stages, copy, order, pitch)[0]
            smem = stages * 2 * tile * pitch + 64 + extra
            f.max_dynamic_shared_size_bytes = smem
            ms = time_ms(lambda: f((grid,), (128,), (k, v, cp.int64(tiles), cp.int32(L // tile), cp.int32(H), cp.int64(L),
                                                     sink), shared_mem=smem))
            print(f"cp.async {copy:8s} order {order} pitch {pitch} smem {smem} tile {tile} x {stages} stages grid {grid}: {nbytes / ms / 1e9:.3f} TB/s", flush=True)
    for tile, stages in CONFIGS:
        tiles_per_pair = L // tile
        tiles = B * H * tiles_per_pair
        f_cp, f_bulk = kernels(tile, stages)
        smem = stages * 2 * tile * 256 + 64
        for f in (f_cp, f_bulk):
            f.max_dynamic_shared_size_bytes = smem
        for grid in (128, sms, 2 * 128, 2 * sms):
            cells = []
            for name, f in (("cp.async", f_cp), ("bulk", f_bulk)):
                try:
                    ms = time_ms(lambda: f((grid,), (128,), (k, v, cp.int64(tiles), cp.int32(tiles_per_pair),
                                                            cp.int32(H), cp.int64(L), sink), shared_mem=smem))
                    cells.append(f"{name} {nbytes / ms / 1e9:.3f} TB/s")
                except Exception as e:  # noqa: BLE001 - a grid that does not fit: say so
                    cells.append(f"{name} n/a ({type(e).__name__})")
            print(f"tile {tile} x {stages} stages ({smem // 1024} KB) grid {grid:4d}: " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
