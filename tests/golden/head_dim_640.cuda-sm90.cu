// =============================================================================================
// attngen 0.1.0: flash-attention forward kernel for target cuda (profile cuda-sm90).
// Generated from the spec below; regenerate with `attngen build SPEC --target cuda --kernel head_dim_640` rather than editing.
//
// Spec (normalised, every default filled in):
//   attention head_dim_640 {
//       head_dim   640
//       heads      any
//       dtype      f16
//       accumulate qk=f32 pv=f32
//       mask       none
//       softcap    none
//       scale      auto
//       tile       q=auto kv=auto d=auto
//       schedule   fused
//       kv_cache   contiguous
//       target     cuda { warps=auto stages=auto key_warps=auto producer=auto persistent=auto tma=auto backward=auto }
//       target     wgsl { workgroup=auto subgroups=auto f16=auto prefetch=auto }
//   }
//
// Plan: tile q=128 kv=64, 8 consumer warps + a producer warpgroup (384 threads), 4 stage(s), Hopper tensor cores (wgmma m64n256k16 and m64n256k16, 2 warpgroups of 64 rows, sm_90a); P through memory: phase A computes S = Q K^T in tiles of 256 keys (Q and K in 64-column chunks by the tensor copy engine) and stores P to the block's workspace slot, phase B reads it back for P V, 256 output columns at a time; persistent: one block per multiprocessor takes the row tiles in turn.
// Scale 0.03952847075210474; mask none: every query row sees every key j < Lk.
// Shared memory: 197696 bytes (each buffer 16-byte aligned):
//   sRing at      0: 4 x 384 x 64 f16 (a stage: phase A a 64-column chunk of Q (128 rows) and of K (256 keys), phase B a V tile (64 keys x 256 columns; 128-byte swizzle))
//   sSync at 196608: 1 x 16 u32 (mbarriers: full and empty per stage)
// Launches with cu_seqlens, kv_lens or an append: entry point _varlen on the mma.sync family, tile q=64 kv=64, tile d=64 (chosen: the whole head dim does not fit): Q, K and V stream through shared memory 64 columns at a time; out split over 3 blocks of 256 columns (grid.y = Hq x 3) (73728 bytes of shared memory).
// Grid: (min(SM, ceil(Lq / 128) * Hq * B), 1, 1), 384 threads each; tensors are (batch, seq, heads, head_dim): q (B, Lq, Hq, Dqk), k (B, Lk, Hkv, Dqk), v (B, Lk, Hkv, Dv), out (B, Lq, Hq, Dv); lse (B, Hq, Lq) f32.
// Entry point: attngen_head_dim_640; the manifest (attngen build --emit manifest) lists the parameters in order.
// =============================================================================================
// A tensor map of the tensor copy engine (CUtensorMap of the driver's cuda.h, which NVRTC has not):
// 128 opaque bytes, built on the host (cuTensorMapEncodeTiled) and passed by value.
struct alignas(64) TensorMap { unsigned long long opaque[16]; };
// ---- section: types -----------------------------------------------------------------
// Storage is IEEE binary16 (f16), held as raw 16-bit words: the kernel does no f16
// arithmetic in C++; conversions are single PTX instructions and the products run on
// tensor cores. No CUDA headers are needed.
typedef unsigned short elem_t;

__device__ __forceinline__ float to_float(elem_t x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
    return f;
}

// Two floats -> one 32-bit register holding {lo, hi} as f16 (round to nearest even).
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// The f16 pair in one register -> two floats.
__device__ __forceinline__ void unpack2(unsigned x, float& lo, float& hi) {
    lo = to_float(static_cast<elem_t>(x & 0xffffu));
    hi = to_float(static_cast<elem_t>(x >> 16));
}

// Store two adjacent output elements (one 32-bit store).
__device__ __forceinline__ void store_pair(elem_t* p, float a, float b) {
    *reinterpret_cast<unsigned*>(p) = pack2(a, b);
}

// The 32-bit word w (two f16) with its inf and NaN elements zeroed; `found` set if any was.
__device__ __forceinline__ unsigned clear_nonfinite(unsigned w, bool& found) {
    const unsigned lo = (w & 0x7c00u) == 0x7c00u ? 0x0000ffffu : 0u;
    const unsigned hi = (w & 0x7c000000u) == 0x7c000000u ? 0xffff0000u : 0u;
    found |= (lo | hi) != 0u;
    return w & ~(lo | hi);
}

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }
__device__ __forceinline__ float quiet_nan() { return __int_as_float(0x7fc00000); }  // an undefined result

// =============================================================================================
// namespace padded: launches without cu_seqlens_q, kv_lens or an append (the main entry point)
// =============================================================================================
namespace padded {

// ---- section: config ----------------------------------------------------------------
// Tile configuration, fixed at compile time. Batch, sequence lengths and head counts are
// run-time parameters; any length >= 1 works (partial tiles are zero-filled and masked).
// P through memory (head dims above 256 without a mask; above 512 neither Q of the block's rows
// nor its whole output fit on chip): each block takes row tiles of kBlockQ rows, and does each in
// two phases.
//   A. S = Q K^T in tiles of kTileA keys, Q and K in 64-column chunks (one stage each), the
//      online softmax's running max m_i and sum l_i as FlashAttention-2 keeps them, and each
//      tile's P = exp2(t - m_i) stored to the block's slot of ws_p with m_i after the tile.
//   B. For each block of kDvBlock output columns: acc += (c_j P_j) V_j over the tiles, P_j read
//      back (every thread reads only what it stored: its fragments in the accumulator layout of
//      S are its A fragments of P V) and c_j = exp2(m_j - m_final) per row, so acc needs no
//      rescaling; then out = acc / l_i.
// Q K^T and P V are each computed once, whatever the head dim.
constexpr int kBlockQ = 128;      // tile q: rows per work item (two consumer warpgroups of 64)
constexpr int kTileA = 256;      // keys per tile of phase A (S of 64 x kTileA per warpgroup)
constexpr int kBlockKV = 64;     // tile kv: keys per V tile of phase B
constexpr int kWarps = 8;        // consumer warps
constexpr int kThreads = 384;    // kWarps * 32 consumer threads + the producer warpgroup
constexpr int kStages = 4;       // stages of the ring the producer fills (phase A and B alike)
constexpr int kProducerRegs = 24, kConsumerRegs = 240;  // after setmaxnreg
constexpr int kHeadDimQK = 640;    // head dim of q and k
constexpr int kHeadDimV = 640;     // head dim of v and out
constexpr int kHeadDimQKPad = 640; // padded to a multiple of 64 (whole 128-byte swizzle blocks); padding is zero
constexpr int kHeadDimVPad = 640;
constexpr int kChunks = kHeadDimQKPad / 64;   // 64-column chunks of Q K^T per tile of phase A
constexpr int kDvBlock = 256;      // output columns per pass of phase B (acc: 64 x kDvBlock per warpgroup)
constexpr int kVBlocks = (kHeadDimVPad + kDvBlock - 1) / kDvBlock;  // passes of phase B (columns past Dv read as zeros)
constexpr int kStepsA = kTileA / 16;          // 16-key steps of a tile of phase A
constexpr int kTilesB = kTileA / kBlockKV;    // tiles of phase B per tile of phase A
// A stage holds a chunk of Q (kBlockQ rows) and of K (kTileA keys), or a V tile (kBlockKV keys x
// kDvBlock columns), in the 128-byte swizzled layout of the wgmma descriptors (section memory).
constexpr unsigned kChunkBytes = (kBlockQ + kTileA) * 128;     // phase A: the bytes of one stage's copies
constexpr unsigned kVTileBytes = kBlockKV * kDvBlock * 2;  // phase B
constexpr int kStageBytes = kChunkBytes;
constexpr int kOffsetRing = 0;  // byte offsets into dynamic shared memory (197696 bytes)
constexpr int kOffsetSync = 196608;  // mbarriers: full[kStages], empty[kStages]
// The workspace slot of a block (ws_p, 32-bit words): per consumer warpgroup, P as 16 bytes per
// thread and 16-key step, then the running max of the thread's two rows after each tile of phase A.
constexpr int kSlotWordsPerTileA = 2 * 128 * (kStepsA * 4 + 2);
static_assert(kSlotWordsPerTileA == 16896, "ws_p's row length (lower.py, STORED_P_SHAPE)");
static_assert(kHeadDimQKPad >= kHeadDimQK && kHeadDimVPad >= kHeadDimV && kHeadDimQKPad % 64 == 0, "padded head dims");
static_assert(kTileA % kBlockKV == 0 && kTileA <= 256 && kDvBlock <= 256, "N of m64nNk16 is at most 256");
static_assert(kVTileBytes <= kChunkBytes && kOffsetSync >= kOffsetRing + kStages * kStageBytes, "a V tile fits a stage");

// Scores are kept in the log2 domain so that exp2 does the softmax: t = s * scale * log2(e).
// scale = 0.03952847075210474 (1 / sqrt(head_dim qk)).
constexpr float kScaleLog2 = 0.05702752872798594f;  // scale * log2(e)
constexpr float kLn2 = 0.6931471805599453f;

// ---- section: memory --------------------------------------------------------------------
// Global -> shared copies go through cp.async (sm_80+), 16 bytes per thread per copy, so a
// warp moves 512 contiguous bytes at a time and the copies overlap the math of the previous
// tile (kStages deep).
__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}


// The shared-memory layout of every tile (Q, K, V): the 128-byte swizzle of the wgmma
// descriptors. A tile of kRows rows is stored as column blocks of 64 elements (128 bytes per
// row, kRows * 128 bytes per block, each block 1024-byte aligned); in a block, the 16-byte chunk
// c of row r sits at chunk c ^ (r % 8), so the 8 rows one 8x8 core matrix spans lie in
// different banks. Element (r, col) of the tile:
template <int kRows>
__device__ __forceinline__ int swizzled(int r, int col) {
    // (r and col are never negative: masks instead of % let the compiler see that rows 8 apart
    // share their swizzle, so a copy loop keeps one address for them, not one per row)
    return (col / 64) * (kRows * 64) + r * 64 + ((((col >> 3) & 7) ^ (r & 7)) << 3) + (col & 7);
}

// Make the ordinary shared-memory writes of this thread (cp.async, zero fills, cleaned values)
// visible to the tensor cores' reads, which go through the async proxy. Before a barrier.
__device__ __forceinline__ void fence_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// ---- mbarriers: the producer warpgroup's tiles (warp specialisation) ----
// An mbarrier completes a phase when its count of arrivals is reached; waiters name the parity
// of the phase they wait for (PTX ISA, "Parallel Synchronization and Communication
// Instructions: mbarrier").
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(smem_addr(bar)), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(smem_addr(bar)) : "memory");
}

// Arrive once every cp.async this thread issued before has landed (.noinc: the arrival is one
// of the count given at init).
__device__ __forceinline__ void mbar_arrive_copies(unsigned long long* bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" :: "r"(smem_addr(bar)) : "memory");
}

// ---- the tensor copy engine (TMA): the tiles of the producer warpgroup (c.tma) ----
// A tile is one copy per 64-column block of a 4-d tensor map over K or V (dims: head-dim columns,
// KV heads, keys, batch; box 64 x 1 x kBlockKV x 1, 128-byte swizzle), or over Q (query heads, rows;
// box 64 x 1 x kBlockQ x 1), built on the host by
// cuTensorMapEncodeTiled (attngen/backends/cuda/tensor_maps.py) and passed by value as a
// __grid_constant__ parameter. The engine writes the block exactly in the layout of swizzled<>
// above and zero-fills keys past Lk and columns past the head dim; each copy completes its bytes
// on an mbarrier, whose phase also waits for the bytes it was told to expect.
__device__ __forceinline__ void mbar_expect_tx(unsigned long long* bar, unsigned bytes) {
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" :: "r"(smem_addr(bar)), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned long long* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(smem_addr(bar)), "r"(bytes) : "memory");
}

// `count` arrivals at once (one thread standing for several).
__device__ __forceinline__ void mbar_arrive_count(unsigned long long* bar, unsigned count) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;\n" :: "r"(smem_addr(bar)), "r"(count) : "memory");
}

// Rows j0 .. j0 + kRows - 1 of head `head` of sequence `batch`, kCols (padded) columns from column
// col0 (output column blocks: the block's columns of V), into the swizzled tile at `dst`,
// completing on `bar`.
template <int kRows, int kCols>
__device__ __forceinline__ void tma_tile(elem_t* dst, const TensorMap& map, int head, int j0, int batch,
                                         unsigned long long* bar, int col0 = 0) {
    static_assert(kCols % 64 == 0, "whole 64-column blocks");
    #pragma unroll
    for (int blk = 0; blk < kCols / 64; ++blk) {
        asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
                     " [%0], [%1, { %2, %3, %4, %5 }], [%6];\n"
                     :: "r"(smem_addr(dst + blk * kRows * 64)), "l"(&map), "r"(col0 + blk * 64), "r"(head), "r"(j0),
                        "r"(batch), "r"(smem_addr(bar)) : "memory");
    }
}

// Wait until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
    asm volatile("{\n.reg .pred done;\nWAIT_PHASE:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra WAIT_PHASE;\n}\n" :: "r"(smem_addr(bar)), "r"(parity) : "memory");
}

// Named barriers (bar.sync / bar.arrive) among `threads` threads of the block; id 0 is __syncthreads.
__device__ __forceinline__ void named_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void named_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}

// 16-byte asynchronous copy; when !valid nothing is read and the destination is zero-filled.
// L2::128B: the L2 fetches whole 128-byte lines from memory (the copies read whole rows anyway);
// measured +1.5-2% on bandwidth-bound decode (benchmarks/NOTES.md, issue 12).
// `dst`: a shared-memory address (smem_addr), so that a copy loop adds byte offsets to one base
// address instead of converting every generic pointer.
__device__ __forceinline__ void cp_async_16_at(unsigned dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
    cp_async_16_at(smem_addr(dst), src, valid);
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}

// Wait until at most N groups of copies are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

// kCopyThreads threads (tid < kCopyThreads) copy kRows rows of kCols elements (row r at
// src + r * row_stride) into shared-memory rows of kStride elements. Rows at or past valid_rows are zero-filled, so keys past Lk and
// queries past Lq read as zeros.
template <int kRows, int kCols, int kStride>
__device__ __forceinline__ void load_tile(elem_t* dst, const elem_t* src, long long row_stride,
                                          int valid_rows, int tid) {
    constexpr int kVec = 16 / static_cast<int>(sizeof(elem_t));  // elements per copy
    constexpr int kChunks = kCols / kVec;                         // copies per row
    constexpr int kCopies = kRows * kChunks;
    static_assert(kCols % kVec == 0, "rows are whole 16-byte chunks");
    const unsigned base = smem_addr(dst);
    if constexpr (kCopyThreads >= kChunks) {
        // Each thread copies the same column of rows r0, r0 + kRowStep, ...: one running source
        // pointer, so that no per-row 64-bit offsets stay live across the main loop. (When the
        // threads are not a multiple of the chunks per row, the last few threads copy nothing.)
        constexpr int kRowStep = kCopyThreads / kChunks;
        if (kCopyThreads % kChunks != 0 && tid >= kRowStep * kChunks) return;
        const int r0 = tid / kChunks, col = (tid % kChunks) * kVec;
        const elem_t* s = src + r0 * row_stride + col;
        const unsigned first = base + swizzled<kRows>(r0, col) * static_cast<int>(sizeof(elem_t));
        const long long step = kRowStep * row_stride;
        #pragma unroll
        for (int i = 0; i < (kRows + kRowStep - 1) / kRowStep; ++i, s += step) {
            const int r = r0 + i * kRowStep;
            if (kRows % kRowStep == 0 || r < kRows) {
                const bool valid = r < valid_rows;
                // rows a multiple of 8 apart share their swizzle: row r is row r0's address plus a
                // constant (one base address for the whole loop, not one register per row)
                constexpr int kRowBytes = 64 * static_cast<int>(sizeof(elem_t));
                const unsigned at = kRowStep % 8 == 0 ? first + i * kRowStep * kRowBytes
                                                      : base + swizzled<kRows>(r, col) * static_cast<int>(sizeof(elem_t));
                cp_async_16_at(at, valid ? s : src, valid);
            }
        }
    } else {
        #pragma unroll
        for (int i = 0; i < (kCopies + kCopyThreads - 1) / kCopyThreads; ++i) {
            const int c = tid + i * kCopyThreads;
            if (kCopies % kCopyThreads == 0 || c < kCopies) {
                const int r = c / kChunks, col = (c % kChunks) * kVec;
                const bool valid = r < valid_rows;
                cp_async_16_at(base + swizzled<kRows>(r, col) * static_cast<int>(sizeof(elem_t)),
                               valid ? src + r * row_stride + col : src, valid);
            }
        }
    }
}

// Zero columns [kCols, kColsPad) of kRows rows: the head-dim padding the products read.
template <int kRows, int kCols, int kColsPad, int kStride>
__device__ __forceinline__ void zero_padding(elem_t* dst, int tid) {
    if constexpr (kColsPad > kCols) {
        for (int i = tid; i < kRows * (kColsPad - kCols); i += kThreads) {
            dst[swizzled<kRows>(i / (kColsPad - kCols), kCols + i % (kColsPad - kCols))] = elem_t(0);
        }
    }
}

// ---- section: matmul primitives ---------------------------------------------------------
// Both products on Hopper's warpgroup tensor cores: wgmma.mma_async m64nNk16 (f16
// inputs, f32 accumulators; sm_90a), one warpgroup per 64 rows, warp w of it rows 16 w .. 16 w + 15,
// lane 4 g + t rows g and g + 8 and columns 8 n + 2 t, 8 n + 2 t + 1 of every 8-column tile n
// (registers [n][0..3]; templates/cuda/math_wgmma.j2 says more).
// A shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): start address,
// leading and stride byte offsets (all >> 4), 128-byte swizzle (mode 1 in bits 62-63).
__device__ __forceinline__ unsigned long long smem_descriptor(const elem_t* p, unsigned lead, unsigned stride) {
    return static_cast<unsigned long long>((smem_addr(p) & 0x3ffffu) >> 4)
         | (static_cast<unsigned long long>(lead >> 4) << 16)
         | (static_cast<unsigned long long>(stride >> 4) << 32)
         | (1ull << 62);
}

// 2^x in one MUFU.EX2 (ex2.approx.ftz: results below 2^-126 are 0, which a probability that small
// is anyway next to the row's largest one, 1); exp2f adds a denormal-range fix-up around it.
__device__ __forceinline__ float exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }

// Keep the compiler from moving reads or writes of accumulators across a wgmma wait.
template <int kTiles>
__device__ __forceinline__ void fence_registers(float (&d)[kTiles][4]) {
    #pragma unroll
    for (int n = 0; n < kTiles; ++n) {
        asm volatile("" : "+f"(d[n][0]), "+f"(d[n][1]), "+f"(d[n][2]), "+f"(d[n][3]) :: "memory");
    }
}

// d (= or +=, by scale_d) A B for one k16 step: m64n256k16, A and B from shared memory, K-major.
__device__ __forceinline__ void wgmma_scores(float (&d)[kTileA / 8][4], unsigned long long a, unsigned long long b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %128, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 "
        "{ %0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127 }, "
        "%129, %130, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), 
"+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), 
"+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), 
"+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), 
"+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), 
"+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), 
"+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), 
"+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]), 
"+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]), 
"+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]), 
"+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]), "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]), 
"+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]), "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]), 
"+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]), "+f"(d[25][0]), "+f"(d[25][1]), "+f"(d[25][2]), "+f"(d[25][3]), 
"+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]), "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]), 
"+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]), "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]), 
"+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]), "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]), "+f"(d[31][3])
        : "r"(scale_d), "l"(a), "l"(b));
}

// d += A B for one k16 step: m64n256k16, A from registers, B from shared memory, MN-major.
__device__ __forceinline__ void wgmma_pv(float (&d)[kDvBlock / 8][4], const unsigned (&a)[4], unsigned long long b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 "
        "{ %0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127 }, "
        "{ %128, %129, %130, %131 }, %132, p, 1, 1, 1;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), 
"+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), 
"+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), 
"+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), 
"+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), 
"+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), 
"+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), 
"+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]), 
"+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]), 
"+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]), 
"+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]), "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]), 
"+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]), "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]), 
"+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]), "+f"(d[25][0]), "+f"(d[25][1]), "+f"(d[25][2]), "+f"(d[25][3]), 
"+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]), "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]), 
"+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]), "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]), 
"+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]), "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]), "+f"(d[31][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

// f16x2 / bf16x2 product of two registers (each a pair): scales a P fragment.
__device__ __forceinline__ unsigned mul2(unsigned a, unsigned b) {
    unsigned r;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

// Keep P fragments in flight where they are until the wait of their P V (the registers of a
// wgmma's A must not be written before the wait_group that covers it).
__device__ __forceinline__ void fence_fragments(unsigned (&p)[4][4]) {
    #pragma unroll
    for (int n = 0; n < 4; ++n) asm volatile("" : "+r"(p[n][0]), "+r"(p[n][1]), "+r"(p[n][2]), "+r"(p[n][3]) :: "memory");
}

// ---- section: kernel ------------------------------------------------------------------------
// Persistent blocks: block x takes work items (row tile, query head, batch; row tile fastest, so
// the items at work at one time share their heads' K and V in L2) x, x + gridDim.x, ... The
// producer warpgroup's first thread issues every copy in the order the consumers use them (phase
// A's chunks, then phase B's V tiles, item after item) into a ring of kStages stages, each
// completing on its full barrier; every consumer warp releases a stage on its empty barrier.
// kPass, kVarlen: as body.j2's (this kernel serves the main entry point only: launches without
// per-sequence lengths).
template <int kPass, bool kVarlen>
__device__ __forceinline__ void attention(const elem_t* __restrict__ q,
                                          const elem_t* __restrict__ k,
                                          const elem_t* __restrict__ v,
                                          elem_t* __restrict__ out,
                                          float* __restrict__ lse,
                                          long long q_sb,
                                          long long q_sl,
                                          long long q_sh,
                                          long long k_sb,
                                          long long k_sl,
                                          long long k_sh,
                                          long long v_sb,
                                          long long v_sl,
                                          long long v_sh,
                                          long long o_sb,
                                          long long o_sl,
                                          long long o_sh,
                                          int len_q,
                                          int len_k,
                                          int heads_q,
                                          int group,
                                          long long lse_sb,
                                          long long lse_sh,
                                          const int* __restrict__ cu_seqlens_q,
                                          const int* __restrict__ cu_seqlens_k,
                                          const int* __restrict__ kv_lens,
                                          const elem_t* __restrict__ k_new,
                                          const elem_t* __restrict__ v_new,
                                          long long kn_sb,
                                          long long kn_sl,
                                          long long kn_sh,
                                          long long vn_sb,
                                          long long vn_sl,
                                          long long vn_sh,
                                          int len_new,
                                          int rows_q,
                                          int rows_k,
                                          int* __restrict__ errors,
                                          int batch_size,
                                          unsigned* __restrict__ ws_p,
                                          const TensorMap& tmap_q,
                                          const TensorMap& tmap_k,
                                          const TensorMap& tmap_v) {
    // The swizzled tiles need 1024-byte alignment: the buffers start at the first such address
    // (the launch asks for 1024 bytes more than the buffers take).
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
    unsigned char* ring = smem + kOffsetRing;
    unsigned long long* bar_full = reinterpret_cast<unsigned long long*>(smem + kOffsetSync);  // [kStages]: landed
    unsigned long long* bar_empty = bar_full + kStages;  // [kStages]: every consumer warp is done with it
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    if (tid == 0) {
        for (int st = 0; st < kStages; ++st) {
            mbar_init(&bar_full[st], 1);  // the producer's arrival with the bytes to expect
            mbar_init(&bar_empty[st], kWarps);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    // ---- section: work items (persistent blocks) ----
    const int row_tiles = (len_q + kBlockQ - 1) / kBlockQ;
    const int items = batch_size * heads_q * row_tiles;
    const int tiles_a = (len_k + kTileA - 1) / kTileA;      // tiles of phase A (mask none: every key)
    const int tiles_b = (len_k + kBlockKV - 1) / kBlockKV;  // tiles of phase B
    unsigned* slot = ws_p + (long long)blockIdx.x * kSlotWordsPerTileA * tiles_a;  // this block's

    if (warp >= kWarps) {
        // ---- section: main loop over K/V tiles (the producer warpgroup: copies only) ----
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(kProducerRegs));
        if (tid == kWarps * 32) {
            int r = 0;  // the ring's stage count
            for (int item = blockIdx.x; item < items; item += gridDim.x) {
                const int q_tile = item % row_tiles, head = (item / row_tiles) % heads_q;
                const int batch = item / (row_tiles * heads_q), kv_head = head / group, row0 = q_tile * kBlockQ;
                for (int a = 0; a < tiles_a; ++a) {
                    for (int ch = 0; ch < kChunks; ++ch, ++r) {
                        const int stage = r % kStages;
                        mbar_wait(&bar_empty[stage], ((r / kStages) & 1) ^ 1);  // the stage kStages back is released
                        elem_t* dst = reinterpret_cast<elem_t*>(ring + stage * kStageBytes);
                        mbar_arrive_expect_tx(&bar_full[stage], kChunkBytes);
                        tma_tile<kBlockQ, 64>(dst, tmap_q, head, row0, batch, &bar_full[stage], ch * 64);
                        #pragma unroll
                        for (int i = 0; i < kTileA / 64; ++i)  // (the map's boxes are tile kv keys)
                            tma_tile<64, 64>(dst + kBlockQ * 64 + i * 64 * 64, tmap_k, kv_head, a * kTileA + i * 64, batch,
                                             &bar_full[stage], ch * 64);
                    }
                }
                for (int cb = 0; cb < kVBlocks; ++cb) {
                    for (int b = 0; b < tiles_b; ++b, ++r) {
                        const int stage = r % kStages;
                        mbar_wait(&bar_empty[stage], ((r / kStages) & 1) ^ 1);
                        elem_t* dst = reinterpret_cast<elem_t*>(ring + stage * kStageBytes);
                        mbar_arrive_expect_tx(&bar_full[stage], kVTileBytes);
                        tma_tile<kBlockKV, kDvBlock>(dst, tmap_v, kv_head, b * kBlockKV, batch, &bar_full[stage],
                                                     cb * kDvBlock);
                    }
                }
            }
            // every copy consumed before the producer leaves
            for (int n = r - kStages; n < r; ++n) {
                if (n >= 0) mbar_wait(&bar_empty[n % kStages], (n / kStages) & 1);
            }
        }
        return;
    }
    // -- consumer warpgroups
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(kConsumerRegs));
    const int wg = warp / 4, wtid = tid % 128, t = lane % 4;
    uint4* p_ws = reinterpret_cast<uint4*>(slot + (long long)wg * tiles_a * kStepsA * 128 * 4);  // P fragments
    float2* m_ws = reinterpret_cast<float2*>(slot + 2LL * tiles_a * kStepsA * 128 * 4) + (long long)wg * tiles_a * 128;
    int r = 0;
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
        const int q_tile = item % row_tiles, head = (item / row_tiles) % heads_q;
        const int batch = item / (row_tiles * heads_q), row0 = q_tile * kBlockQ;
        const int row_a = row0 + wg * 64 + (warp % 4) * 16 + lane / 4;  // this lane's rows: row_a, row_a + 8
        float m_i[2] = {neg_inf(), neg_inf()};  // running max of each row's scores (log2 domain)
        float l_i[2] = {0.f, 0.f};              // running sum; this lane's columns only, summed at the end

        // ---- section: phase A: S = Q K^T, online softmax, P to the workspace ----
        for (int a = 0; a < tiles_a; ++a) {
            float s[kTileA / 8][4];  // (zeroed: left undefined, ptxas spilled it around the chunk loop)
            #pragma unroll
            for (int n = 0; n < kTileA / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
            for (int ch = 0; ch < kChunks; ++ch, ++r) {
                const int stage = r % kStages;
                mbar_wait(&bar_full[stage], (r / kStages) & 1);  // the chunks of Q and K have landed
                const elem_t* base = reinterpret_cast<const elem_t*>(ring + stage * kStageBytes);
                wgmma_fence();
                #pragma unroll
                for (int kk = 0; kk < 4; ++kk) {  // columns 16 kk .. of the chunk (32 bytes per step)
                    wgmma_scores(s, smem_descriptor(base + wg * 64 * 64 + kk * 16, 16, 1024),
                                 smem_descriptor(base + kBlockQ * 64 + kk * 16, 16, 1024), ch > 0 || kk > 0);
                }
                wgmma_commit();
                if (ch > 0) {  // the previous chunk's products are done: release its stage
                    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
                    if (lane == 0) mbar_arrive(&bar_empty[(r - 1) % kStages]);
                }
            }
            wgmma_wait_all();
            fence_registers(s);
            if (lane == 0) mbar_arrive(&bar_empty[(r - 1) % kStages]);
            // -- mask: keys past Lk (zero-filled by the copies) in the last tile
            const int j0 = a * kTileA;
            if (j0 + kTileA > len_k) {
                #pragma unroll
                for (int n = 0; n < kTileA / 8; ++n) {
                    #pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        if (j0 + 8 * n + 2 * t + (e & 1) >= len_k) s[n][e] = neg_inf();
                    }
                }
            }
            // -- online softmax (the scale folded into exp2's argument: the row max on raw products)
            float m_use[2];
            #pragma unroll
            for (int h = 0; h < 2; ++h) {
                float mx = neg_inf();
                #pragma unroll
                for (int n = 0; n < kTileA / 8; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // the 4 lanes of a row
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float m_new = fmaxf(m_i[h], mx * kScaleLog2);
                m_use[h] = m_new == neg_inf() ? 0.f : m_new;  // a row that has seen no key yet: p = 0
                l_i[h] *= exp2_approx(m_i[h] - m_use[h]);     // alpha
                m_i[h] = m_new;
            }
            // -- P = exp2(t - m_i) to the workspace: one 16-byte store per 16 keys (the A fragment)
            #pragma unroll
            for (int ks = 0; ks < kStepsA; ++ks) {
                float p[2][4];
                #pragma unroll
                for (int x = 0; x < 2; ++x) {
                    #pragma unroll
                    for (int e = 0; e < 4; ++e) p[x][e] = exp2_approx(fmaf(s[2 * ks + x][e], kScaleLog2, -m_use[e / 2]));
                }
                l_i[0] += p[0][0] + p[0][1] + p[1][0] + p[1][1];
                l_i[1] += p[0][2] + p[0][3] + p[1][2] + p[1][3];
                p_ws[(long long)(a * kStepsA + ks) * 128 + wtid] =
                    make_uint4(pack2(p[0][0], p[0][1]), pack2(p[0][2], p[0][3]), pack2(p[1][0], p[1][1]),
                               pack2(p[1][2], p[1][3]));
            }
            m_ws[a * 128 + wtid] = make_float2(m_i[0], m_i[1]);  // (read back by this thread in phase B)
        }

        // ---- section: row statistics (lse) ----
        float inv_l[2], m_fin[2];
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            l_i[h] += __shfl_xor_sync(0xffffffffu, l_i[h], 1);
            l_i[h] += __shfl_xor_sync(0xffffffffu, l_i[h], 2);
            // A row that saw no key has l = 0: its output is 0 and its lse is -inf, never NaN.
            // A row that saw a NaN (l is NaN) outputs NaN: its result is undefined.
            const float l = l_i[h];
            inv_l[h] = l > 0.f ? 1.f / l : (l == 0.f ? 0.f : l);
            m_fin[h] = m_i[h] == neg_inf() ? 0.f : m_i[h];
            const int row = row_a + 8 * h;
            if (lse != nullptr && t == 0 && row < len_q) {
                lse[batch * lse_sb + head * lse_sh + row] = l > 0.f ? (m_i[h] + log2f(l)) * kLn2 : (l == 0.f ? neg_inf() : l);
            }
        }

        // c_j = exp2(m_j - m_final) of phase A's tile a for rows row_a, row_a + 8, each as a pair
        auto c_pairs = [&](int a, unsigned (&c2)[2]) {
            const float2 m = m_ws[a * 128 + wtid];
            const float c0 = exp2_approx(m.x - m_fin[0]), c1 = exp2_approx(m.y - m_fin[1]);
            c2[0] = pack2(c0, c0);
            c2[1] = pack2(c1, c1);
        };
        // ---- section: phase B: acc = sum_j (c_j P_j) V_j, kDvBlock output columns at a time ----
        for (int cb = 0; cb < kVBlocks; ++cb) {
            float acc[kDvBlock / 8][4];  // unnormalised output
            #pragma unroll
            for (int n = 0; n < kDvBlock / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
            unsigned pf[2][4][4];  // P fragments of two tiles: the one in flight and the next
            unsigned c2[2];        // c_j of rows row_a, row_a + 8 as a pair
            #pragma unroll
            for (int ks = 0; ks < 4; ++ks) {  // (Lk = 0: no tile, and the slot's first words are read for nothing)
                const uint4 w = p_ws[(long long)ks * 128 + wtid];
                pf[0][ks][0] = w.x; pf[0][ks][1] = w.y; pf[0][ks][2] = w.z; pf[0][ks][3] = w.w;
            }
            // tile b: its P V from `cur` (scaled by c_j), then tile b + 1's fragments into `nxt`
            // (the buffers alternate by tile, named at compile time: no local memory)
            auto step = [&](int b, unsigned (&cur)[4][4], unsigned (&nxt)[4][4]) {
                const int stage = r % kStages;
                if (b % kTilesB == 0) c_pairs(b / kTilesB, c2);
                #pragma unroll
                for (int ks = 0; ks < 4; ++ks) {  // registers 0, 2: row row_a; 1, 3: row row_a + 8
                    cur[ks][0] = mul2(cur[ks][0], c2[0]);
                    cur[ks][1] = mul2(cur[ks][1], c2[1]);
                    cur[ks][2] = mul2(cur[ks][2], c2[0]);
                    cur[ks][3] = mul2(cur[ks][3], c2[1]);
                }
                mbar_wait(&bar_full[stage], (r / kStages) & 1);  // the V tile has landed
                const elem_t* base = reinterpret_cast<const elem_t*>(ring + stage * kStageBytes);
                wgmma_fence();
                #pragma unroll
                for (int ks = 0; ks < 4; ++ks) {  // keys 16 ks ..; MN-major V, 64-column blocks kBlockKV rows apart
                    wgmma_pv(acc, cur[ks], smem_descriptor(base + ks * 16 * 64, kBlockKV * 128, 1024));
                }
                wgmma_commit();
                if (b > 0) {  // the previous tile's P V is done: release its stage and fragments
                    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
                    fence_fragments(nxt);
                    if (lane == 0) mbar_arrive(&bar_empty[(r - 1) % kStages]);
                }
                if (b + 1 < tiles_b) {
                    #pragma unroll
                    for (int ks = 0; ks < 4; ++ks) {
                        const uint4 w = p_ws[(long long)((b + 1) * 4 + ks) * 128 + wtid];
                        nxt[ks][0] = w.x; nxt[ks][1] = w.y; nxt[ks][2] = w.z; nxt[ks][3] = w.w;
                    }
                }
                ++r;
            };
            for (int b = 0; b < tiles_b; b += 2) {
                step(b, pf[0], pf[1]);
                if (b + 1 < tiles_b) step(b + 1, pf[1], pf[0]);
            }
            wgmma_wait_all();
            fence_registers(acc);
            fence_fragments(pf[0]);
            fence_fragments(pf[1]);
            if (tiles_b > 0 && lane == 0) mbar_arrive(&bar_empty[(r - 1) % kStages]);  // the last tile's stage

            // ---- section: non-finite values (a key of weight 0) ----
            // A key whose weight is exactly 0 (an exp2 that underflowed, or a p that did in f16)
            // adds nothing whatever its V, but the tensor cores compute 0 * inf = NaN. A warp whose
            // acc is not finite (only inputs with inf or NaN in V get here) and whose P holds such a
            // key computes its P V again on CUDA cores, V read from global memory and keys of weight
            // 0 selected out: slow, and free on finite inputs (an acc made non-finite by keys of
            // weight above 0 alone is the result: the reference's too). A lane's P fragments hold 4
            // of a 16-key step's keys for its two rows (registers 0, 1: keys 2 t, 2 t + 1; 2, 3: keys
            // 2 t + 8, 2 t + 9); the four lanes of a row quad exchange them.
            bool finite = true;
            #pragma unroll
            for (int n = 0; n < kDvBlock / 8; ++n) {
                #pragma unroll
                for (int e = 0; e < 4; ++e) finite &= (__float_as_uint(acc[n][e]) & 0x7f800000u) != 0x7f800000u;
            }
            // this lane's P fragment of 16-key step s (of all keys), as P V used it: c_j p
            auto scaled_p = [&](int s, const unsigned (&c2)[2], unsigned (&w)[4]) {
                const uint4 x = p_ws[(long long)s * 128 + wtid];
                w[0] = mul2(x.x, c2[0]);
                w[1] = mul2(x.y, c2[1]);
                w[2] = mul2(x.z, c2[0]);
                w[3] = mul2(x.w, c2[1]);
            };
            bool zero_weight = false;  // some key < len_k of this lane's rows has c_j p = 0
            if (__any_sync(0xffffffffu, !finite)) {
                unsigned c2[2] = {0u, 0u};
                for (int b = 0; b < tiles_b && !zero_weight; ++b) {
                    if (b % kTilesB == 0) c_pairs(b / kTilesB, c2);
                    for (int ks = 0; ks < kBlockKV / 16; ++ks) {
                        unsigned word[4];
                        scaled_p(b * (kBlockKV / 16) + ks, c2, word);
                        #pragma unroll
                        for (int r = 0; r < 4; ++r) {
                            #pragma unroll
                            for (int h = 0; h < 2; ++h) {
                                const int j = b * kBlockKV + 16 * ks + 8 * (r / 2) + 2 * t + h;
                                zero_weight |= j < len_k && ((word[r] >> (16 * h)) & 0x7fffu) == 0u;
                            }
                        }
                    }
                }
            }
            if (__any_sync(0xffffffffu, zero_weight)) {
                const elem_t* v_head = v + batch * v_sb + (long long)(head / group) * v_sh;
                #pragma unroll
                for (int n = 0; n < kDvBlock / 8; ++n) {  // one 8-column tile at a time: few registers
                    float sum[2][2] = {0.f, 0.f, 0.f, 0.f};  // [row: row_a, row_a + 8][column 8 n + 2 t + e]
                    unsigned c2[2] = {0u, 0u};
                    #pragma unroll 1
                    for (int b = 0; b < tiles_b; ++b) {
                        if (b % kTilesB == 0) c_pairs(b / kTilesB, c2);
                        #pragma unroll 1
                        for (int ks = 0; ks < kBlockKV / 16; ++ks) {
                            unsigned w[4];
                            scaled_p(b * (kBlockKV / 16) + ks, c2, w);
                            #pragma unroll 1
                            for (int q = 0; q < 8; ++q) {  // q = 2 src + half: the quad's lane src, its keys + 8 half
                                const int src = q >> 1, half = q & 1;
                                const unsigned pa = __shfl_sync(0xffffffffu, half ? w[2] : w[0], (lane & ~3) | src);
                                const unsigned pb = __shfl_sync(0xffffffffu, half ? w[3] : w[1], (lane & ~3) | src);
                                float p[2][2];  // [key of the pair][row]
                                unpack2(pa, p[0][0], p[1][0]);
                                unpack2(pb, p[0][1], p[1][1]);
                                #pragma unroll
                                for (int x = 0; x < 2; ++x) {
                                    const int j = b * kBlockKV + 16 * ks + 8 * half + 2 * src + x;
                                    if (j >= len_k) continue;
                                    const elem_t* v_row = v_head + (long long)j * v_sl;
                                    #pragma unroll
                                    for (int e = 0; e < 2; ++e) {
                                        const int col = cb * kDvBlock + 8 * n + 2 * t + e;
                                        const float val = col < kHeadDimV ? to_float(v_row[col]) : 0.f;
                                        sum[0][e] += p[x][0] == 0.f ? 0.f : p[x][0] * val;
                                        sum[1][e] += p[x][1] == 0.f ? 0.f : p[x][1] * val;
                                    }
                                }
                            }
                        }
                    }
                    acc[n][0] = sum[0][0];
                    acc[n][1] = sum[0][1];
                    acc[n][2] = sum[1][0];
                    acc[n][3] = sum[1][1];
                }
            }

            // ---- section: epilogue: out = acc / l_i ----
            #pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = row_a + 8 * h;
                if (row >= len_q) continue;
                elem_t* o = out + batch * o_sb + (long long)row * o_sl + head * o_sh;
                #pragma unroll
                for (int n = 0; n < kDvBlock / 8; ++n) {
                    const int col = cb * kDvBlock + 8 * n + 2 * t;
                    if (col < kHeadDimV) {
                        *reinterpret_cast<unsigned*>(o + col) = pack2(acc[n][2 * h] * inv_l[h], acc[n][2 * h + 1] * inv_l[h]);
                    }
                }
            }
        }
    }
}
}  // namespace padded

// =============================================================================================
// namespace varlen: launches with cu_seqlens_q, kv_lens or an append (entry point attngen_head_dim_640_varlen)
// =============================================================================================
namespace varlen {

// ---- section: config ----------------------------------------------------------------
// Tile configuration, fixed at compile time. Batch, sequence lengths and head counts are
// run-time parameters; any length >= 1 works (partial tiles are zero-filled and masked).
constexpr int kBlockQ = 64;      // tile q: rows of Q per block
constexpr int kFrags = 1;         // 16-row fragments of Q per warp
constexpr int kRowsPerWarp = 16 * kFrags;
constexpr int kBlockKV = 64;     // tile kv: rows of K and V per iteration of the main loop
constexpr int kWarps = 4;
constexpr int kThreads = 128;    // kWarps * 32
constexpr int kCopyThreads = kThreads;  // threads that copy tiles: all
constexpr int kStages = 4;      // shared-memory steps in flight (cp.async pipeline depth)
constexpr int kHeadDimQK = 640;    // head dim of q and k
constexpr int kHeadDimV = 640;     // head dim of v and out
// tile d = 64 (chosen by the planner: the whole head dim does not fit).
// The head dims stream through shared memory kChunk columns at a time (FFPA-style fine-grained
// tiling), so shared memory is O(tile x kChunk), not O(tile x head_dim). Per K/V tile, kChunksQK
// steps bring a chunk of Q and of K (S accumulates over them), then kChunksV steps a chunk of
// V. Columns past a head dim are zero-filled. A block keeps kDvBlock output columns in
// registers; kVBlocks blocks per (batch, query head) share the output: grid.y = Hq * kVBlocks.
constexpr int kChunk = 64;            // tile d: head-dim columns per shared-memory step
constexpr int kChunksQK = 10;          // steps of Q K^T per K/V tile (640 columns)
constexpr int kDvBlock = 256;        // output columns per block
constexpr int kVBlocks = 3;          // blocks per (batch, query head) along the output columns
constexpr int kChunksV = kDvBlock / kChunk;  // steps of P V per K/V tile
// Shared-memory rows are padded by 16 bytes so that the 8 rows one ldmatrix / float4 read
// touches fall into different banks. K and V chunks take turns in the same sKV slots.
constexpr int kStrideQ = 72;
constexpr int kStrideKV = 72;
constexpr int kStrideK = kStrideKV;
constexpr int kStrideV = kStrideKV;
constexpr int kOffsetQ = 0;     // byte offsets into dynamic shared memory (73728 bytes)
constexpr int kOffsetKV = 36864;
constexpr int kSmemBytes = 73728;
static_assert(kOffsetKV + kStages * kBlockKV * kStrideKV * 2 <= kSmemBytes, "shared-memory layout");
static_assert(kChunk % 16 == 0 && kDvBlock % kChunk == 0, "whole chunks of the padded head dims");
static_assert(kChunksQK * kChunk >= kHeadDimQK && kVBlocks * kDvBlock >= kHeadDimV, "chunks cover the head dims");

// Scores are kept in the log2 domain so that exp2 does the softmax: t = s * scale * log2(e).
// scale = 0.03952847075210474 (1 / sqrt(head_dim qk)).
constexpr float kScaleLog2 = 0.05702752872798594f;  // scale * log2(e)
constexpr float kLn2 = 0.6931471805599453f;
// The online softmax keeps a row's max m_i until a tile's passes it by more than kRescaleSlack
// (log2 domain): P = exp2(t - m_i) <= 2^kRescaleSlack (f16 / bf16 hold it with the same relative
// precision), alpha = 1, and acc and l_i are not rescaled; lse = m_i + log2(l_i) stays exact.
constexpr float kRescaleSlack = 8.0f;

static_assert(kBlockQ == kWarps * kRowsPerWarp, "each warp owns kFrags 16-row fragments of Q");
static_assert(kBlockKV % 16 == 0, "tile kv must be a multiple of 16 (the k of m16n8k16)");
static_assert(kHeadDimQK % 8 == 0 && kHeadDimV % 8 == 0, "head dims are multiples of 8");
static_assert(kThreads <= 1024, "threads per block");

// ---- section: memory --------------------------------------------------------------------
// Global -> shared copies go through cp.async (sm_80+), 16 bytes per thread per copy, so a
// warp moves 512 contiguous bytes at a time and the copies overlap the math of the previous
// tile (kStages deep).
__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16-byte asynchronous copy; when !valid nothing is read and the destination is zero-filled.
// L2::128B: the L2 fetches whole 128-byte lines from memory (the copies read whole rows anyway);
// measured +1.5-2% on bandwidth-bound decode (benchmarks/NOTES.md, issue 12).
// `dst`: a shared-memory address (smem_addr), so that a copy loop adds byte offsets to one base
// address instead of converting every generic pointer.
__device__ __forceinline__ void cp_async_16_at(unsigned dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
    cp_async_16_at(smem_addr(dst), src, valid);
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}

// Wait until at most N groups of copies are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

// kCopyThreads threads (tid < kCopyThreads) copy kRows rows of kCols elements (row r at
// src + r * row_stride) into shared-memory rows of kStride elements. Rows at or past valid_rows are zero-filled, so keys past Lk and
// queries past Lq read as zeros.
// Likewise columns at or past valid_cols (a multiple of 16 bytes; may be <= 0): the zero
// padding of a head dim that is not a whole number of chunks.
template <int kRows, int kCols, int kStride>
__device__ __forceinline__ void load_tile(elem_t* dst, const elem_t* src, long long row_stride,
                                          int valid_rows, int tid, int valid_cols) {
    constexpr int kVec = 16 / static_cast<int>(sizeof(elem_t));  // elements per copy
    constexpr int kChunks = kCols / kVec;                         // copies per row
    constexpr int kCopies = kRows * kChunks;
    static_assert(kCols % kVec == 0, "rows are whole 16-byte chunks");
    if constexpr (kCopyThreads % kChunks == 0) {
        // Each thread copies the same column of rows r0, r0 + kRowStep, ...: one running source
        // pointer, so that no per-row 64-bit offsets stay live across the main loop.
        constexpr int kRowStep = kCopyThreads / kChunks;
        const int r0 = tid / kChunks, col = (tid % kChunks) * kVec;
        const elem_t* s = src + r0 * row_stride + col;
        // rows a multiple of 8 apart share their permutation (kv_at's keys repeat every 8 rows): row r
        // is row r0's place plus a constant, not a key recomputed per copy
        const int first = r0 * kStride + col;
        const long long step = kRowStep * row_stride;
        #pragma unroll
        for (int i = 0; i < (kRows + kRowStep - 1) / kRowStep; ++i, s += step) {
            const int r = r0 + i * kRowStep;
            if (kRows % kRowStep == 0 || r < kRows) {
                const bool valid = r < valid_rows && col < valid_cols;
                const int at = kRowStep % 8 == 0 ? first + i * kRowStep * kStride
                                                 : r * kStride + col;
                cp_async_16(dst + at, valid ? s : src, valid);
            }
        }
    } else {
        #pragma unroll
        for (int i = 0; i < (kCopies + kCopyThreads - 1) / kCopyThreads; ++i) {
            const int c = tid + i * kCopyThreads;
            if (kCopies % kCopyThreads == 0 || c < kCopies) {
                const int r = c / kChunks, col = (c % kChunks) * kVec;
                const bool valid = r < valid_rows && col < valid_cols;
                cp_async_16(dst + r * kStride + col, valid ? src + r * row_stride + col : src, valid);
            }
        }
    }
}

// Zero columns [kCols, kColsPad) of kRows rows: the head-dim padding the products read.
template <int kRows, int kCols, int kColsPad, int kStride>
__device__ __forceinline__ void zero_padding(elem_t* dst, int tid) {
    if constexpr (kColsPad > kCols) {
        for (int i = tid; i < kRows * (kColsPad - kCols); i += kThreads) {
            dst[(i / (kColsPad - kCols)) * kStride + kCols + i % (kColsPad - kCols)] = elem_t(0);
        }
    }
}

// ---- section: matmul primitives ---------------------------------------------------------
// Both products on tensor cores with mma.sync.m16n8k16 (f16 inputs). Fragment
// layout (PTX ISA, "Matrix fragments for mma.m16n8k16"): lane = 4 * g + t; an accumulator
// fragment holds rows g and g + 8, columns 2t and 2t + 1 of a 16 x 8 tile, as c[0], c[1]
// (row g) and c[2], c[3] (row g + 8). S and the output accumulator acc use that layout.
constexpr int kNTilesKV = kBlockKV / 8;        // 8-column tiles of S
constexpr int kNTilesV = kDvBlock / 8;         // 8-column tiles of acc (the block's output columns)
constexpr int kNTilesVChunk = kChunk / 8;      // 8-column tiles of acc one P V step updates
constexpr int kKStepsQK = kChunk / 16;         // k16 steps of Q K^T per chunk

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const elem_t* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 { %0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const elem_t* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 { %0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}

// d += a * b, f32 accumulators.
__device__ __forceinline__ void mma_f32acc(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{ %0, %1, %2, %3}, { %4, %5, %6, %7}, { %8, %9}, { %0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One warp's share of both products: its kRowsPerWarp rows of Q (kFrags fragments of 16)
// against the current K/V tile. Each K or V fragment read from shared memory serves all of
// the warp's fragments.
struct WarpMath {
    int q_offset;                           // the warp's first row in a chunk of Q, in elements
    int lane;

    __device__ __forceinline__ void init(unsigned char* smem, int warp, int lane_) {
        lane = lane_;
        q_offset = warp * kRowsPerWarp * kStrideQ;
    }

    // A fragment of Q for fragment mf and k step kk. ldmatrix.x4: lanes 0-15 address rows
    // 0-15 of the fragment at column 16 kk, lanes 16-31 the same rows at column 16 kk + 8.
    __device__ __forceinline__ void q_fragment(unsigned (&a)[4], const elem_t* sQ_warp, int mf, int kk) const {
        ldmatrix_x4(a, sQ_warp + (mf * 16 + lane % 16) * kStrideQ + kk * 16 + (lane / 16) * 8);
    }

    // Called once the block's Q tile is in shared memory.
    __device__ __forceinline__ void load_q(unsigned char* smem, int warp) {
    }

    // s += Q K^T over one chunk of the head dim (sQ_chunk, sK: kChunk columns each); the caller
    // zeroes s before the first chunk. ldmatrix.x4 on K (row-major [key][dim]) yields B
    // fragments of two 8-key tiles.
    __device__ __forceinline__ void scores(float (&s)[kFrags][kNTilesKV][4], const elem_t* sK,
                                           const elem_t* sQ_chunk) const {
        const elem_t* sQ = sQ_chunk + q_offset;
        #pragma unroll
        for (int kk = 0; kk < kKStepsQK; ++kk) {
            unsigned a[kFrags][4];
            #pragma unroll
            for (int mf = 0; mf < kFrags; ++mf) q_fragment(a[mf], sQ, mf, kk);
            #pragma unroll
            for (int np = 0; np < kNTilesKV / 2; ++np) {
                unsigned b[4];
                ldmatrix_x4(b, sK + (np * 16 + (lane / 16) * 8 + lane % 8) * kStrideK + kk * 16 + ((lane / 8) % 2) * 8);
                #pragma unroll
                for (int mf = 0; mf < kFrags; ++mf) {
                    const unsigned (&a_mf)[4] = a[mf];
                    mma_f32acc(s[mf][2 * np], a_mf, b[0], b[1]);
                    mma_f32acc(s[mf][2 * np + 1], a_mf, b[2], b[3]);
                }
            }
        }
    }

    // P, the probabilities, as the A fragments of P V: the accumulator layout of two 8-key
    // tiles is the A layout of one 16-key step, so P is packed into elem_t pairs in registers
    // right after the softmax (half the registers of the f32 scores it replaces).
    using PTile = unsigned[kFrags][kBlockKV / 16][4];
    __device__ __forceinline__ void pack_p(const float (&s)[kFrags][kNTilesKV][4], PTile& p) const {
        #pragma unroll
        for (int mf = 0; mf < kFrags; ++mf) {
            #pragma unroll
            for (int ks = 0; ks < kBlockKV / 16; ++ks) {
                p[mf][ks][0] = pack2(s[mf][2 * ks][0], s[mf][2 * ks][1]);          // row g,     keys 2t, 2t+1
                p[mf][ks][1] = pack2(s[mf][2 * ks][2], s[mf][2 * ks][3]);          // row g + 8, keys 2t, 2t+1
                p[mf][ks][2] = pack2(s[mf][2 * ks + 1][0], s[mf][2 * ks + 1][1]);  // row g,     keys 2t+8, 2t+9
                p[mf][ks][3] = pack2(s[mf][2 * ks + 1][2], s[mf][2 * ks + 1][3]);  // row g + 8, keys 2t+8, 2t+9
            }
        }
    }

    // acc += P V. ldmatrix.x4.trans on V (row-major [key][dim]) yields B fragments of two 8-dim tiles.
    // One chunk: sV holds kChunk columns of V, those of acc's tiles [n0, n0 + kNTilesVChunk).
    __device__ __forceinline__ void pv(float (&acc)[kFrags][kNTilesV][4], const PTile& p, const elem_t* sV,
                                       int chunk) const {
        const int n0 = chunk * kNTilesVChunk;
        #pragma unroll
        for (int ks = 0; ks < kBlockKV / 16; ++ks) {
            #pragma unroll
            for (int dp = 0; dp < kNTilesVChunk / 2; ++dp) {
                unsigned b[4];
                ldmatrix_x4_trans(b, sV + (ks * 16 + lane % 16) * kStrideV + dp * 16 + (lane / 16) * 8);
                #pragma unroll
                for (int mf = 0; mf < kFrags; ++mf) {
                    mma_f32acc(acc[mf][n0 + 2 * dp], p[mf][ks], b[0], b[1]);
                    mma_f32acc(acc[mf][n0 + 2 * dp + 1], p[mf][ks], b[2], b[3]);
                }
            }
        }
    }
};

// ---- section: mask ------------------------------------------------------------------------
// mask none: every query row sees every key j < Lk.
// key_range: the keys [begin, end) that any row in [r0, r1) may see. The main loop visits only
// the K/V tiles overlapping it, so tiles that are wholly masked are never loaded.
// tile_is_full: every row in [r0, r1) sees every key in [j0, j1), so the tile needs no
// per-element mask. Rows and keys are int. Lengths are at most 2^30 and window sizes are clamped
// to 2^30 by the planner, so the per-element tests stay inside int (windows are compared against
// the distance j - diag(i), never added to a position); key_range, once per block, is 64-bit.
struct Mask {
    int len_q, len_k;

    __device__ __forceinline__ bool visible(int i, int j) const {
        return j < len_k;
    }

    __device__ __forceinline__ void key_range(int r0, int r1, int& begin, int& end) const {
        begin = 0;
        end = len_k;
        if (end < begin) end = begin;
    }

    __device__ __forceinline__ bool tile_is_full(int r0, int r1, int j0, int j1) const {
        return j1 <= len_k;
    }
};

// ---- section: sequences -------------------------------------------------------------------
// One sequence's rows and keys (docs/variants.md). Padded: q rows 0 .. len_q - 1 of its batch
// entry and keys 0 .. len_k - 1, or kv_lens[b] + len_new keys. Packed (cu_seqlens_q given): q
// rows cu_seqlens_q[b] .. of the packed tensor, keys cu_seqlens_k[b] .. (the batch strides are
// then 0). Masks use the sequence's own lengths.
// kVarlen: whether the launch has any of cu_seqlens_q, kv_lens, an append (len_new > 0). The
// entry points instantiate the kernel both ways and pick one per launch: without them every
// sequence is len_q rows by len_k keys, all in the cache, and the paths for them (and the
// registers they hold through the main loop) are not compiled in.
struct Seq {
    int q_start;  // first row of the sequence in q / out (packed), else 0
    int k_start;  // first key of the sequence in k / v (packed), else 0
    int len_q;    // query rows of the sequence
    int len_k;    // keys it attends to (after the append)
    int cached;   // keys already in the cache: keys cached .. len_k - 1 are rows of k_new / v_new
};

template <bool kVarlen>
__device__ __forceinline__ Seq sequence(int b, int len_q, int len_k, const int* cu_seqlens_q,
                                        const int* cu_seqlens_k, const int* kv_lens, int len_new) {
    Seq s{0, 0, len_q, len_k, len_k};
    if constexpr (kVarlen) {
        if (cu_seqlens_q != nullptr) {
            const int* cu_k = cu_seqlens_k != nullptr ? cu_seqlens_k : cu_seqlens_q;
            s.q_start = cu_seqlens_q[b];
            s.len_q = cu_seqlens_q[b + 1] - s.q_start;
            s.k_start = cu_k[b];
            s.len_k = s.cached = cu_k[b + 1] - s.k_start;
        } else if (kv_lens != nullptr) {
            s.cached = kv_lens[b];
            s.len_k = s.cached + len_new;
        }
    }
    return s;
}

// Integer inputs may stay on the device (docs/variants.md, "Integer inputs on the host or on the
// device"): the host checked their shapes only, so the kernel checks what it reads. A sequence
// whose numbers fall outside the tensors or the launch's bounds (len_q, len_k: the grid and the
// workspaces; len_k is also the keys the cache holds) is reported in `errors` (word kind: batch
// index + 1; the runtime raises it as a LaunchError) and its blocks return at once: nothing of it
// is read, written or appended (its rows of out and lse are left as they were). A separate
// test, not folded into sequence(): a Seq that could also take other values costs the custom-mask
// main loop 15% on the H100 (benchmarks/NOTES.md).
enum ErrorWord : int { kErrCuSeqlensQ = 0, kErrCuSeqlensK = 1, kErrKvLens = 2, kErrBlockTable = 3 };

__device__ __forceinline__ void report(int* errors, int kind, int b) {
    if (errors != nullptr && threadIdx.x == 0) *reinterpret_cast<volatile int*>(errors + kind) = b + 1;
}

__device__ __forceinline__ bool sequence_ok(const Seq& s, int b, int len_q, int len_k, const int* cu_seqlens_q,
                                            const int* cu_seqlens_k, const int* kv_lens, int len_new, int rows_q,
                                            int rows_k, int* errors) {
    if (cu_seqlens_q != nullptr) {
        if (s.q_start < 0 || s.len_q < 0 || s.q_start + s.len_q > rows_q || s.len_q > len_q) {
            report(errors, kErrCuSeqlensQ, b);
            return false;
        }
        if (s.k_start < 0 || s.len_k < 0 || s.k_start + s.len_k > rows_k || s.len_k > len_k) {
            report(errors, cu_seqlens_k != nullptr ? kErrCuSeqlensK : kErrCuSeqlensQ, b);
            return false;
        }
    } else if (kv_lens != nullptr && (s.cached < 0 || s.cached > len_k - len_new)) {  // (no overflow: len_k >= len_new)
        report(errors, kErrKvLens, b);
        return false;
    }
    return true;
}

// ---- section: key rows --------------------------------------------------------------------
// Key j (0 <= j < len_k) of the block's (sequence, KV head) in K or V. Keys below `cached` are
// in the cache: rows of k / v;
// keys from `cached` on are rows j - cached of k_new / v_new (appended in this call: every
// block reads them there, so the writes of the appending blocks never race with the reads).
// Without kVarlen (see Seq) nothing is appended: every key is in the cache.
template <bool kVarlen>
struct KeyRows {
    const elem_t* cache;   // key 0's row
    long long row_stride;  // stride between consecutive keys
    const elem_t* fresh;   // k_new / v_new at (batch, row 0, KV head) (kVarlen, len_new > 0)
    long long fresh_stride;
    int cached;

    // Where key j sits in the cache (also for j >= cached: where the append stores it).
    __device__ __forceinline__ const elem_t* stored(int j) const {
        return cache + (long long)j * row_stride;
    }

    // Where key j is read from.
    __device__ __forceinline__ const elem_t* row(int j) const {
        if constexpr (kVarlen) {
            if (j >= cached) return fresh + (long long)(j - cached) * fresh_stride;
        }
        return stored(j);
    }

    // Whether keys j0 .. j0 + n - 1 (n >= 1) lie row_stride apart in the cache: one load_tile.
    __device__ __forceinline__ bool strided(int j0, int n) const {
        return n > 0 && j0 + n <= cached;
    }
};

// Like load_tile, with row r at row_ptr(r) (a gather: paged keys, appended keys, rows of the
// heads of a GQA group). Rows at or past valid_rows are zero-filled.
template <int kRows, int kCols, int kStride, class RowPtr>
__device__ __forceinline__ void load_rows(elem_t* dst, const RowPtr& row_ptr, int valid_rows, int tid, int valid_cols) {
    constexpr int kVec = 16 / static_cast<int>(sizeof(elem_t));
    constexpr int kChunks = kCols / kVec;
    constexpr int kCopies = kRows * kChunks;
    #pragma unroll
    for (int i = 0; i < (kCopies + kCopyThreads - 1) / kCopyThreads; ++i) {
        const int c = tid + i * kCopyThreads;
        if (kCopies % kCopyThreads == 0 || c < kCopies) {
            const int r = c / kChunks, col = (c % kChunks) * kVec;
            const bool valid = r < valid_rows && col < valid_cols;
            cp_async_16(dst + r * kStride + col, valid ? row_ptr(r) + col : nullptr, valid);
        }
    }
}

// kBlockKV keys from j0 (those below j0 + valid exist; the rest read as zeros), columns d0 ...
template <int kCols, int kStride, bool kVarlen>
__device__ __forceinline__ void load_keys(elem_t* dst, const KeyRows<kVarlen>& src, int j0, int valid, int tid, int d0, int valid_cols) {
    if constexpr (!kVarlen) {
        // Contiguous cache, nothing appended: every tile is one strided copy (no per-tile branch).
        load_tile<kBlockKV, kCols, kStride>(dst, src.stored(j0) + d0, src.row_stride, valid, tid, valid_cols);
    } else if (src.strided(j0, min(valid, kBlockKV))) {
        load_tile<kBlockKV, kCols, kStride>(dst, src.row(j0) + d0, src.row_stride, valid, tid, valid_cols);
    } else {
        load_rows<kBlockKV, kCols, kStride>(dst, [&](int r) { return src.row(j0 + r) + d0; }, valid, tid, valid_cols);
    }
}

// The append: copy rows 0 .. n - 1 of k_new (or v_new) to keys cached .. of the cache (n:
// len_new, or 0 for a sequence with bad kv_lens), 16 bytes per copy. Done by the blocks of the
// first q tile of each (sequence, KV head).
template <int kCols>
__device__ __forceinline__ void append_rows(const KeyRows<true>& rows, int n, int tid) {
    constexpr int kVec = 16 / static_cast<int>(sizeof(elem_t));
    constexpr int kChunks = kCols / kVec;
    for (int c = tid; c < n * kChunks; c += kThreads) {
        const int r = c / kChunks, col = (c % kChunks) * kVec;
        elem_t* dst = const_cast<elem_t*>(rows.stored(rows.cached + r)) + col;
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(rows.row(rows.cached + r) + col);
    }
}

// ---- section: non-finite values -----------------------------------------------------------
// A key of weight 0 for a row contributes nothing to that row, whatever its values: a key the row
// does not see (masked scores are selected to -inf, never added to or multiplied), and a key it
// sees whose score is -inf or so far below the row's maximum that exp2 underflows to 0. But in
// P V a 0 times an inf or NaN value of V is NaN. So where V is cleaned, its non-finite values are
// zeroed before P V and every warp learns which keys held them (clean_values); a row that does
// see such a key (p != 0) gets NaN as its result: NaN in, NaN out, for that row only. The plain
// loop (mma.sync, CUDA cores, wgmma without a producer or the overlapped loop) cleans, in its one
// pass, every tile where some row gives a key a weight of 0 (zero_weight). The Hopper families'
// overlapped and producer loops' first pass cleans at most the partial tiles of a mask: with
// persistent blocks, and in the overlapped loop without a producer, a work item or block whose acc
// is then not finite anywhere (every row the cleaning would change has such an acc) runs its tiles
// again, cleaning every tile; producer kernels without persistent blocks have no such pass yet. A
// NaN or +inf score a row sees makes its sum l NaN, and so its output and lse (the epilogue keeps
// NaN).
constexpr int kKeyWords = (kBlockKV + 31) / 32;  // 32-bit masks of the tile's keys, one bit each

// Zero the non-finite values of the 16-byte word at p (written back only where there was one);
// whether there was.
__device__ __forceinline__ bool scrub_word(uint4* p) {
    uint4 x = *p;
    bool here = false;
    x.x = clear_nonfinite(x.x, here);
    x.y = clear_nonfinite(x.y, here);
    x.z = clear_nonfinite(x.z, here);
    x.w = clear_nonfinite(x.w, here);
    if (here) *p = x;
    return here;
}

// Find the keys of the kBlockKV x kCols tile at `tile` (row stride kStride, rows 16-byte aligned)
// whose values hold an inf or NaN (`bad`: one bit per key, the same in every warp), then zero
// those values. First the block reads the tile once, each thread its share, and learns whether
// any value is non-finite (__syncthreads_or): almost never, and then that is all. Otherwise every
// warp scans the tile as the copies left it: the zeros are written only after a barrier, once
// every warp has scanned (a warp that read a row another warp had already zeroed would not
// learn of its key). Every barrier here is uniform (its condition is the same in every warp).
// All threads of the block call it.
template <int kCols, int kStride>
__device__ __forceinline__ void clean_values(elem_t* tile, unsigned (&bad)[kKeyWords], int lane) {
    constexpr int kWordsPerRow = kCols * static_cast<int>(sizeof(elem_t)) / 16;  // uint4 per row
    static_assert(kCols * sizeof(elem_t) % 16 == 0, "rows of whole 16-byte words");
    auto word = [&](int r, int c) { return reinterpret_cast<uint4*>(tile + r * kStride) + c; };
    // -- the block's one pass (each 16-byte word read by one thread): measured on the H100, the
    // scan by every warp below cost causal rows 6-40% when it ran on every partial tile
    bool seen = false;
    for (int i = threadIdx.x; i < kBlockKV * kWordsPerRow; i += blockDim.x) {
        uint4 x = *word(i / kWordsPerRow, i % kWordsPerRow);
        clear_nonfinite(x.x, seen);
        clear_nonfinite(x.y, seen);
        clear_nonfinite(x.z, seen);
        clear_nonfinite(x.w, seen);
    }
    if (!__syncthreads_or(seen)) {  // the common case: no barrier more, nothing to zero
        #pragma unroll
        for (int w = 0; w < kKeyWords; ++w) bad[w] = 0u;
        return;
    }
    unsigned any = 0u;
    #pragma unroll
    for (int w = 0; w < kKeyWords; ++w) {  // read only
        const int r = w * 32 + lane;
        bool found = false;
        if (r < kBlockKV) {
            #pragma unroll 4
            for (int c = 0; c < kWordsPerRow; ++c) {
                uint4 x = *word(r, c);
                clear_nonfinite(x.x, found);
                clear_nonfinite(x.y, found);
                clear_nonfinite(x.z, found);
                clear_nonfinite(x.w, found);
            }
        }
        bad[w] = __ballot_sync(0xffffffffu, found);
        any |= bad[w];
    }
    if (any == 0u) return;  // the common case: nothing to zero, no barrier
    __syncthreads();        // every warp has scanned the tile as it was
    // Each 16-byte word of a bad key is zeroed by one thread of the block (no two threads write
    // the same word, and no thread reads a word another is writing).
    #pragma unroll
    for (int w = 0; w < kKeyWords; ++w) {
        for (int i = threadIdx.x; i < 32 * kWordsPerRow; i += blockDim.x) {
            const int r = w * 32 + i / kWordsPerRow;
            if (r < kBlockKV && ((bad[w] >> (i / kWordsPerRow)) & 1u)) {
                scrub_word(word(r, i % kWordsPerRow));
            }
        }
    }
    __syncthreads();  // every warp's P V reads the tile after all the zeros are written
}

// Mark this lane's rows that see (p != 0) a key of `bad`: bit 2 mf + h of row_bad. The lane's key
// of column n, e is bit 8 (n % 4) + e % 2 of word n / 4 once the words are shifted by 2t: constant
// shifts in the unrolled loop, one flag per row (a run-time shift per score held 30 more registers).
template <int kWords>
__device__ __forceinline__ void mark_bad_rows(unsigned& row_bad, const float (&p)[kFrags][kNTilesKV][4],
                                              const unsigned (&bad)[kWords], int t) {
    unsigned lane_bad[kWords];
    #pragma unroll
    for (int w = 0; w < kWords; ++w) lane_bad[w] = bad[w] >> (2 * t);
    #pragma unroll
    for (int mf = 0; mf < kFrags; ++mf) {
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            bool seen = false;
            #pragma unroll
            for (int n = 0; n < kNTilesKV; ++n) {
                #pragma unroll
                for (int e = 2 * h; e < 2 * h + 2; ++e) {
                    seen |= ((lane_bad[n / 4] >> ((n % 4) * 8 + e % 2)) & 1u) && p[mf][n][e] != 0.f;
                }
            }
            if (seen) row_bad |= 1u << (2 * mf + h);
        }
    }
}

// Whether one of this lane's real rows (bit 2 mf + h of `rows`) gives one of its keys of the tile
// a weight p of exactly 0 (masked, or an exp2 that underflowed). Where no row does, no 0 * inf can
// arise in P V, and V need not be scanned: the plain loop cleans only such tiles (its warps vote).
__device__ __forceinline__ bool zero_weight(const float (&p)[kFrags][kNTilesKV][4], unsigned rows) {
    bool zero = false;
    #pragma unroll
    for (int mf = 0; mf < kFrags; ++mf) {
        #pragma unroll
        for (int n = 0; n < kNTilesKV; ++n) {
            #pragma unroll
            for (int e = 0; e < 4; ++e) zero |= ((rows >> (2 * mf + e / 2)) & 1u) && p[mf][n][e] == 0.f;
        }
    }
    return zero;
}

// ---- section: score transform --------------------------------------------------------------
// Raw dot product -> score in the log2 domain, t = log2(e) * scale * s.
__device__ __forceinline__ float score_transform(float s) {
    return s * kScaleLog2;
}

// ---- section: kernel ------------------------------------------------------------------------
// One block computes kBlockQ rows of the output of one (batch, query head), FlashAttention-2
// style (Dao 2023, Algorithm 1): loop over the visible K/V tiles keeping, per row, the running
// max m_i, the running sum l_i of exp2(t - m_i) and the unnormalised output acc; when the max
// grows, rescale l_i and acc by alpha = exp2(m_old - m_new); divide by l_i at the end.
// The score matrix is never stored: each warp holds its kRowsPerWarp x kBlockKV slice in registers.
// Head dims stream through shared memory in chunks of kChunk columns (see config); each block
// computes kDvBlock of the output columns (blockIdx.y = head * kVBlocks + column block).
// kPass: 0 = the whole algorithm (fused, split_kv).
// kVarlen: the launch has per-sequence lengths or an append (see the sequences section).
// The entry points at the end of the file instantiate it.
template <int kPass, bool kVarlen>
__device__ __forceinline__ void attention(const elem_t* __restrict__ q,
                                          const elem_t* __restrict__ k,
                                          const elem_t* __restrict__ v,
                                          elem_t* __restrict__ out,
                                          float* __restrict__ lse,
                                          long long q_sb,
                                          long long q_sl,
                                          long long q_sh,
                                          long long k_sb,
                                          long long k_sl,
                                          long long k_sh,
                                          long long v_sb,
                                          long long v_sl,
                                          long long v_sh,
                                          long long o_sb,
                                          long long o_sl,
                                          long long o_sh,
                                          int len_q,
                                          int len_k,
                                          int heads_q,
                                          int group,
                                          long long lse_sb,
                                          long long lse_sh,
                                          const int* __restrict__ cu_seqlens_q,
                                          const int* __restrict__ cu_seqlens_k,
                                          const int* __restrict__ kv_lens,
                                          const elem_t* __restrict__ k_new,
                                          const elem_t* __restrict__ v_new,
                                          long long kn_sb,
                                          long long kn_sl,
                                          long long kn_sh,
                                          long long vn_sb,
                                          long long vn_sl,
                                          long long vn_sh,
                                          int len_new,
                                          int rows_q,
                                          int rows_k,
                                          int* __restrict__ errors,
                                          int batch_size,
                                          unsigned* __restrict__ ws_p,
                                          const TensorMap& tmap_q,
                                          const TensorMap& tmap_k,
                                          const TensorMap& tmap_v) {
    extern __shared__ __align__(16) unsigned char smem[];
    elem_t* sQ = reinterpret_cast<elem_t*>(smem + kOffsetQ);
    elem_t* sKV = reinterpret_cast<elem_t*>(smem + kOffsetKV);

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int t = lane % 4;                  // this lane's columns: 2t and 2t + 1 of each 8
    // grid.x: tiles of rows; grid.y: query head x column block; grid.z: batch.
    const int head_y = blockIdx.y / kVBlocks, batch = blockIdx.z;
    const int col0 = (blockIdx.y % kVBlocks) * kDvBlock;  // the block's first output column
    const int q_tile = blockIdx.x;

    // ---- section: sequences ----
    const Seq seq = sequence<kVarlen>(batch, len_q, len_k, cu_seqlens_q, cu_seqlens_k, kv_lens, len_new);
    if constexpr (kVarlen) {
        if (!sequence_ok(seq, batch, len_q, len_k, cu_seqlens_q, cu_seqlens_k, kv_lens, len_new, rows_q, rows_k,
                         errors)) {
            return;  // bad integer inputs on the device: reported, nothing of this sequence is touched
        }
    }
    const int head = head_y, kv_head = head / group;  // grouped-query attention: Hq / Hkv heads share K/V
    const int n_rows = seq.len_q;                      // the block's rows are query rows of one head
    auto query_of = [](int p) { return p; };
    auto head_of = [&](int) { return head; };
    auto q_row = [&](int p) {
        return q + batch * q_sb + (long long)(seq.q_start + query_of(p)) * q_sl + head_of(p) * q_sh;
    };
    const int row0 = q_tile * kBlockQ;       // the block's first row
    const int row_end = min(row0 + kBlockQ, n_rows);
    // This lane's rows: row_a + 16 mf + 8 h for fragment mf < kFrags and half h < 2.
    const int row_a = row0 + warp * kRowsPerWarp + lane / 4;

    // ---- section: key rows ----
    auto key_rows = [&](const elem_t* cache, long long sb, long long sl, long long sh, const elem_t* fresh,
                        long long fb, long long fl, long long fh) {
        KeyRows<kVarlen> r;
        r.cache = cache + batch * sb + (long long)seq.k_start * sl + kv_head * sh;
        r.row_stride = sl;
        r.fresh = kVarlen && fresh != nullptr ? fresh + batch * fb + kv_head * fh : nullptr;
        r.fresh_stride = fl;
        r.cached = seq.cached;
        return r;
    };
    const KeyRows<kVarlen> keys = key_rows(k, k_sb, k_sl, k_sh, k_new, kn_sb, kn_sl, kn_sh);
    const KeyRows<kVarlen> values = key_rows(v, v_sb, v_sl, v_sh, v_new, vn_sb, vn_sl, vn_sh);
    if constexpr (kVarlen) {
        // Append k_new / v_new to the cache: the blocks of the first row tile of each (sequence, KV head).
        if (len_new > 0 && kPass != 2 && blockIdx.x == 0 && head % group == 0 && col0 == 0) {
            append_rows<kHeadDimQK>(keys, seq.len_k - seq.cached, tid);
            append_rows<kHeadDimV>(values, seq.len_k - seq.cached, tid);
        }
    }
    if (row0 >= n_rows) return;  // packed sequences: the grid covers the longest one

    // ---- section: prologue ----
    // Q is not kept: its chunks are re-read (mostly from L2) for every K/V tile.
    const elem_t* q_rows = q_row(row0);
    WarpMath math;
    math.init(smem, warp, lane);

    // ---- section: loop bounds (mask) ----
    const Mask mask{seq.len_q, seq.len_k};  // aligned to this sequence's own lengths
    const int qrow0 = query_of(row0), qrow_end = query_of(row_end - 1) + 1;  // the block's query rows
    int kv_begin, kv_end;
    mask.key_range(qrow0, qrow_end, kv_begin, kv_end);
    int tile_first = kv_begin / kBlockKV;
    int n_tiles = kv_end > kv_begin ? (kv_end + kBlockKV - 1) / kBlockKV - tile_first : 0;
    // The kv tile of iteration it.
    auto kv_tile = [&](int it) { return tile_first + it; };
    // This lane's query rows, and (split schedules) its rows of the workspaces; -1: past the block's rows.
    int qi[kFrags][2];
    unsigned rows_real = 0u;  // bit 2 mf + h: this lane's row (mf, h) is one of the block's rows (not padding)
    #pragma unroll
    for (int mf = 0; mf < kFrags; ++mf) {
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int p = row_a + 16 * mf + 8 * h;
            qi[mf][h] = query_of(p);
            if (p < row_end) rows_real |= 1u << (2 * mf + h);
        }
    }

    float m_i[kFrags][2];           // running max of each row's scores (log2 domain)
    float l_i[kFrags][2];           // running sum; this lane's columns only, summed at the end
    float acc[kFrags][kNTilesV][4];  // unnormalised output
    unsigned row_bad = 0u;          // bit 2 mf + h: the row saw a non-finite value of V (section non-finite values)
    #pragma unroll
    for (int mf = 0; mf < kFrags; ++mf) {
        m_i[mf][0] = m_i[mf][1] = neg_inf();
        l_i[mf][0] = l_i[mf][1] = 0.f;
        #pragma unroll
        for (int n = 0; n < kNTilesV; ++n) acc[mf][n][0] = acc[mf][n][1] = acc[mf][n][2] = acc[mf][n][3] = 0.f;
    }

    // The shared-memory steps: per K/V tile, kStepsQK steps each bring a chunk of Q and of K,
    // then kStepsV steps each a chunk of the block's columns of V. Step i uses slot i % kStages;
    // copies run kStages - 1 steps ahead of the math.
    constexpr int kStepsQK = kChunksQK;
    constexpr int kStepsV = kChunksV;
    constexpr int kStepsPerTile = kStepsQK + kStepsV;
    const int n_steps = n_tiles * kStepsPerTile;
    auto load_step = [&](int i) {
        const int slot = i % kStages, c = i % kStepsPerTile;
        const int j0 = kv_tile(i / kStepsPerTile) * kBlockKV;
        elem_t* dst = sKV + slot * kBlockKV * kStrideKV;
        if (c < kStepsQK) {
            const int d0 = c * kChunk;  // columns [d0, d0 + kChunk) of Q and K
            load_tile<kBlockQ, kChunk, kStrideQ>(sQ + slot * kBlockQ * kStrideQ, q_rows + d0, q_sl,
                                                 row_end - row0, tid, kHeadDimQK - d0);
            load_keys<kChunk, kStrideKV>(dst, keys, j0, seq.len_k - j0, tid, d0, kHeadDimQK - d0);
        } else {
            const int d0 = col0 + (c - kStepsQK) * kChunk;  // columns [d0, d0 + kChunk) of V
            load_keys<kChunk, kStrideKV>(dst, values, j0, seq.len_k - j0, tid, d0, kHeadDimV - d0);
        }
    };
    // Issue the copy kStages - 1 steps ahead, then wait for step `step`; returns its slot.
    int step = 0;
    auto next_step = [&]() {
        const int ahead = step + kStages - 1;
        if (ahead < n_steps) load_step(ahead);
        cp_async_commit();
        cp_async_wait<kStages - 1>();
        __syncthreads();
        return step++ % kStages;
    };

    // ---- section: main loop over K/V tiles ----
    #pragma unroll
    for (int st = 0; st < kStages - 1; ++st) {
        if (st < n_steps) load_step(st);
        cp_async_commit();
    }
    for (int it = 0; it < n_tiles; ++it) {
        const int j0 = kv_tile(it) * kBlockKV;

        // -- S = Q K^T, accumulated over kStepsQK chunks of the head dim
        float s[kFrags][kNTilesKV][4];
        #pragma unroll
        for (int mf = 0; mf < kFrags; ++mf) {
            #pragma unroll
            for (int n = 0; n < kNTilesKV; ++n) s[mf][n][0] = s[mf][n][1] = s[mf][n][2] = s[mf][n][3] = 0.f;
        }
        for (int ch = 0; ch < kStepsQK; ++ch) {
            const int slot = next_step();
            math.scores(s, sKV + slot * kBlockKV * kStrideKV, sQ + slot * kBlockQ * kStrideQ);
            __syncthreads();  // every warp is done with this slot before it is refilled
        }
        const bool partial = !mask.tile_is_full(qrow0, qrow_end, j0, j0 + kBlockKV);

        // -- score transform and mask
        #pragma unroll
        for (int mf = 0; mf < kFrags; ++mf) {
            #pragma unroll
            for (int n = 0; n < kNTilesKV; ++n) {
                #pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int i = qi[mf][e / 2], j = j0 + n * 8 + 2 * t + e % 2;
                    float x = score_transform(s[mf][n][e]);
                    if (partial && !mask.visible(i, j)) x = neg_inf();
                    s[mf][n][e] = x;
                }
            }
        }

        // -- online softmax: m_i, l_i, alpha
        #pragma unroll
        for (int mf = 0; mf < kFrags; ++mf) {
            #pragma unroll
            for (int h = 0; h < 2; ++h) {
                float m_new = m_i[mf][h];
                #pragma unroll
                for (int n = 0; n < kNTilesKV; ++n) {
                    m_new = fmaxf(m_new, fmaxf(s[mf][n][2 * h], s[mf][n][2 * h + 1]));
                }
                m_new = fmaxf(m_new, __shfl_xor_sync(0xffffffffu, m_new, 1));  // the 4 lanes of a row
                m_new = fmaxf(m_new, __shfl_xor_sync(0xffffffffu, m_new, 2));
                // The max kept unless this tile's passes it by more than kRescaleSlack (then
                // p <= 2^kRescaleSlack, alpha = 1 and acc is left alone); a row that has seen no
                // key yet takes the tile's (-inf - -inf is NaN: the comparison keeps -inf).
                const bool grows = m_new - m_i[mf][h] > kRescaleSlack;
                const float m_keep = grows ? m_new : m_i[mf][h];
                // A row that has seen no key yet keeps m = -inf; subtracting 0 instead avoids inf - inf.
                const float m_use = m_keep == neg_inf() ? 0.f : m_keep;
                const float alpha = grows ? exp2f(m_i[mf][h] - m_use) : 1.f;
                m_i[mf][h] = m_keep;
                float row_sum = 0.f;
                #pragma unroll
                for (int n = 0; n < kNTilesKV; ++n) {
                    s[mf][n][2 * h] = exp2f(s[mf][n][2 * h] - m_use);
                    s[mf][n][2 * h + 1] = exp2f(s[mf][n][2 * h + 1] - m_use);
                    row_sum += s[mf][n][2 * h] + s[mf][n][2 * h + 1];
                }
                l_i[mf][h] = l_i[mf][h] * alpha + row_sum;
                if (grows) {
                    #pragma unroll
                    for (int n = 0; n < kNTilesV; ++n) {
                        acc[mf][n][2 * h] *= alpha;
                        acc[mf][n][2 * h + 1] *= alpha;
                    }
                }
            }
        }

        // -- O += P V, kStepsV chunks of the block's output columns
        // V's chunks are cleaned where a row gives a key of the tile weight 0 (section non-finite
        // values; the same in every warp)
        const bool zero_tile = __syncthreads_or(zero_weight(s, rows_real));
        #pragma unroll
        for (int ch = 0; ch < kStepsV; ++ch) {
            const int slot = next_step();
            if (zero_tile) {  // see section non-finite values
                unsigned bad[kKeyWords];
                clean_values<kChunk, kStrideKV>(sKV + slot * kBlockKV * kStrideKV, bad, lane);
                mark_bad_rows(row_bad, s, bad, t);
            }
            WarpMath::PTile p;
            math.pack_p(s, p);
            math.pv(acc, p, sKV + slot * kBlockKV * kStrideKV, ch);
            __syncthreads();  // every warp is done with this slot before it is refilled
        }
    }

    // ---- section: epilogue: normalise and store ----
    #pragma unroll
    for (int mf = 0; mf < kFrags; ++mf) {
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            float l = l_i[mf][h];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            unsigned bad_row = (row_bad >> (2 * mf + h)) & 1u;  // any lane of the row
            bad_row |= __shfl_xor_sync(0xffffffffu, bad_row, 1);
            bad_row |= __shfl_xor_sync(0xffffffffu, bad_row, 2);
            if (bad_row) l = quiet_nan();
            // A row that saw no key has l = 0: its output is 0 and its lse is -inf, never NaN.
            // A row that saw a NaN (l is NaN) outputs NaN: its result is undefined.
            const float inv_l = l > 0.f ? 1.f / l : (l == 0.f ? 0.f : l);
            const int row = row_a + 16 * mf + 8 * h;
            if (row < n_rows) {  // row < row0 + kBlockQ: the same as row < row_end
                const int i = qi[mf][h], hh = head_of(row);
                elem_t* o_row = out + batch * o_sb + hh * o_sh + (long long)(seq.q_start + i) * o_sl;
                #pragma unroll
                for (int n = 0; n < kNTilesV; ++n) {
                    if (col0 + n * 8 < kHeadDimV) {
                        store_pair(o_row + col0 + n * 8 + 2 * t, acc[mf][n][2 * h] * inv_l, acc[mf][n][2 * h + 1] * inv_l);
                    }
                }
                // Every column block computes the same m_i and l_i; the first one writes lse.
                if (lse != nullptr && t == 0 && col0 == 0) {
                    lse[batch * lse_sb + hh * lse_sh + seq.q_start + i] =
                        l > 0.f ? m_i[mf][h] * kLn2 + logf(l) : (l == 0.f ? neg_inf() : l);
                }
            }
        }
    }
}
}  // namespace varlen

// ---- section: entry points ------------------------------------------------------------------
// The main entry point takes launches without per-sequence lengths; the one named with _varlen
// takes those with cu_seqlens_q, kv_lens or an append (the launcher picks; kVarlen: see the
// sequences section), with one 16-row fragment per warp.
extern "C" __global__ void __launch_bounds__(padded::kThreads, 1)
attngen_head_dim_640(const elem_t* __restrict__ q,
                     const elem_t* __restrict__ k,
                     const elem_t* __restrict__ v,
                     elem_t* __restrict__ out,
                     float* __restrict__ lse,
                     long long q_sb,
                     long long q_sl,
                     long long q_sh,
                     long long k_sb,
                     long long k_sl,
                     long long k_sh,
                     long long v_sb,
                     long long v_sl,
                     long long v_sh,
                     long long o_sb,
                     long long o_sl,
                     long long o_sh,
                     int len_q,
                     int len_k,
                     int heads_q,
                     int group,
                     long long lse_sb,
                     long long lse_sh,
                     const int* __restrict__ cu_seqlens_q,
                     const int* __restrict__ cu_seqlens_k,
                     const int* __restrict__ kv_lens,
                     const elem_t* __restrict__ k_new,
                     const elem_t* __restrict__ v_new,
                     long long kn_sb,
                     long long kn_sl,
                     long long kn_sh,
                     long long vn_sb,
                     long long vn_sl,
                     long long vn_sh,
                     int len_new,
                     int rows_q,
                     int rows_k,
                     int* __restrict__ errors,
                     int batch_size,
                     unsigned* __restrict__ ws_p,
                     const __grid_constant__ TensorMap tmap_q,
                     const __grid_constant__ TensorMap tmap_k,
                     const __grid_constant__ TensorMap tmap_v) {
    padded::attention<0, false>(q, k, v, out, lse, q_sb, q_sl, q_sh, k_sb, k_sl, k_sh, v_sb, v_sl, v_sh, o_sb, o_sl, o_sh, len_q, len_k, heads_q, group, lse_sb, lse_sh, cu_seqlens_q, cu_seqlens_k, kv_lens, k_new, v_new, kn_sb, kn_sl, kn_sh, vn_sb, vn_sl, vn_sh, len_new, rows_q, rows_k, errors, batch_size, ws_p, tmap_q, tmap_k, tmap_v);
}

extern "C" __global__ void __launch_bounds__(varlen::kThreads, 1)
attngen_head_dim_640_varlen(const elem_t* __restrict__ q,
                            const elem_t* __restrict__ k,
                            const elem_t* __restrict__ v,
                            elem_t* __restrict__ out,
                            float* __restrict__ lse,
                            long long q_sb,
                            long long q_sl,
                            long long q_sh,
                            long long k_sb,
                            long long k_sl,
                            long long k_sh,
                            long long v_sb,
                            long long v_sl,
                            long long v_sh,
                            long long o_sb,
                            long long o_sl,
                            long long o_sh,
                            int len_q,
                            int len_k,
                            int heads_q,
                            int group,
                            long long lse_sb,
                            long long lse_sh,
                            const int* __restrict__ cu_seqlens_q,
                            const int* __restrict__ cu_seqlens_k,
                            const int* __restrict__ kv_lens,
                            const elem_t* __restrict__ k_new,
                            const elem_t* __restrict__ v_new,
                            long long kn_sb,
                            long long kn_sl,
                            long long kn_sh,
                            long long vn_sb,
                            long long vn_sl,
                            long long vn_sh,
                            int len_new,
                            int rows_q,
                            int rows_k,
                            int* __restrict__ errors,
                            int batch_size,
                            unsigned* __restrict__ ws_p,
                            const __grid_constant__ TensorMap tmap_q,
                            const __grid_constant__ TensorMap tmap_k,
                            const __grid_constant__ TensorMap tmap_v) {
    varlen::attention<0, true>(q, k, v, out, lse, q_sb, q_sl, q_sh, k_sb, k_sl, k_sh, v_sb, v_sl, v_sh, o_sb, o_sl, o_sh, len_q, len_k, heads_q, group, lse_sb, lse_sh, cu_seqlens_q, cu_seqlens_k, kv_lens, k_new, v_new, kn_sb, kn_sl, kn_sh, vn_sb, vn_sl, vn_sh, len_new, rows_q, rows_k, errors, batch_size, ws_p, tmap_q, tmap_k, tmap_v);
}
