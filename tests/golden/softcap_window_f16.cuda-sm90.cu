// =============================================================================================
// attngen 0.1.0: flash-attention forward kernel for target cuda (profile cuda-sm90).
// Generated from the spec below; regenerate with `attngen build SPEC --target cuda --kernel softcap_window_f16` rather than editing.
//
// Spec (normalised, every default filled in):
//   attention softcap_window_f16 {
//       head_dim   256
//       heads      q=16 kv=8
//       dtype      f16
//       accumulate qk=f32 pv=f32
//       mask       window(left=1024, right=16)
//       softcap    50.0
//       scale      auto
//       tile       q=auto kv=auto d=auto
//       schedule   fused
//       kv_cache   contiguous
//       target     cuda { warps=auto stages=auto key_warps=auto producer=auto persistent=auto tma=auto backward=auto }
//       target     wgsl { workgroup=auto subgroups=auto f16=auto prefetch=auto }
//   }
//
// Plan: tile q=128 kv=64, 8 consumer warps + a producer warpgroup (384 threads), 2 K/V stage(s), Hopper tensor cores (wgmma m64n64k16 and m64n256k16, 2 warpgroups of 64 rows, sm_90a; softmax overlapped with P V; a producer warpgroup copies the tiles (Q, K and V by the tensor copy engine, mbarriers, setmaxnreg, ping-pong)); persistent: one block per multiprocessor takes the row tiles in turn.
// Scale 0.0625, softcap 50.0; mask window(left=1024, right=16), bottom-right aligned: query i sees key j iff i + (Lk - Lq) - 1024 <= j <= i + (Lk - Lq) + 16.
// Shared memory: 197824 bytes (each buffer 16-byte aligned):
//   sQ    at      0: 128 x 256 f16 (the block's rows of Q (128-byte swizzle))
//   sK    at  65536: 2 x 64 x 256 f16 (K tiles, one per pipeline stage (128-byte swizzle))
//   sV    at 131072: 2 x 64 x 256 f16 (V tiles, one per pipeline stage (128-byte swizzle))
//   sSync at 196608: 1 x 45 u32 (mbarriers of the copies, the work items and each stage's keys with non-finite values)
// Launches with cu_seqlens, kv_lens or an append: entry point _varlen, tile q=64 kv=32 (99328 bytes of shared memory).
// Grid: (min(SM, ceil(Lq / 128) * Hq * B), 1, 1), 384 threads each; tensors are (batch, seq, heads, head_dim): q (B, Lq, Hq, Dqk), k (B, Lk, Hkv, Dqk), v (B, Lk, Hkv, Dv), out (B, Lq, Hq, Dv); lse (B, Hq, Lq) f32.
// Entry point: attngen_softcap_window_f16; the manifest (attngen build --emit manifest) lists the parameters in order.
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
constexpr int kBlockQ = 128;      // tile q: rows of Q per block
constexpr int kFrags = 1;         // 16-row fragments of Q per warp
constexpr int kRowsPerWarp = 16 * kFrags;
constexpr int kBlockKV = 64;     // tile kv: rows of K and V per iteration of the main loop
constexpr int kWarps = 8;
// Warp specialisation (FlashAttention-3, section 3.1): warpgroups 0 .. kConsumerGroups - 1 compute
// (64 rows each); the last warpgroup, the producer, only copies Q and the ring of K/V tiles and
// signals each tile's arrival on an mbarrier. setmaxnreg then moves registers from the producer
// (kProducerRegs per thread) to the consumers (kConsumerRegs).
constexpr int kThreads = 384;    // kWarps * 32 consumer threads + kCopyThreads
constexpr int kCopyThreads = 128;  // the producer warpgroup: the threads that copy tiles
constexpr int kConsumerGroups = kWarps / 4;
constexpr bool kPingPong = kConsumerGroups >= 2;  // the consumer warpgroups take turns issuing their products
constexpr int kProducerRegs = 40, kConsumerRegs = 232;
// setmaxnreg moves registers within what the launch gave the block (65536 / kThreads per thread,
// a multiple of 8): asking for more would wait forever. One consumer warpgroup moves none.
static_assert(kConsumerGroups == 1 || kProducerRegs * kCopyThreads + kConsumerRegs * kWarps * 32 <=
              (65536 / kThreads) / 8 * 8 * kThreads, "setmaxnreg within the launch's registers");
constexpr int kStages = 2;      // K/V tiles in flight (cp.async pipeline depth)
constexpr int kHeadDimQK = 256;    // head dim of q and k
constexpr int kHeadDimV = 256;     // head dim of v and out
constexpr int kHeadDimQKPad = 256; // padded to a multiple of 64 (whole 128-byte swizzle blocks); padding is zero
constexpr int kHeadDimVPad = 256;
constexpr int kVTileCols = kHeadDimVPad;  // columns of the V tiles
// Shared-memory tiles are in the 128-byte swizzled layout of the wgmma descriptors (section
// memory: swizzled); the strides are the padded row widths, in elements.
constexpr int kStrideQ = 256;
constexpr int kStrideK = 256;
constexpr int kStrideV = 256;
constexpr int kOffsetQ = 0;     // byte offsets into dynamic shared memory (197824 bytes)
constexpr int kOffsetK = 65536;
constexpr int kOffsetV = 131072;
constexpr int kOffsetSync = 196608;  // mbarriers (Q, full[kStages], empty[kStages]), then bad-key bits and land[kStages]
// K and V tiles come by the tensor copy engine (TMA): the bytes one tile's copies write, zero-filled
// keys past Lk and columns past the head dims included.
constexpr unsigned kTileBytes = kBlockKV * (kHeadDimQKPad + kVTileCols) * 2;
constexpr unsigned kQBytes = kBlockQ * kHeadDimQKPad * 2;  // Q's copies (rows past Lq zero-filled)
constexpr int kSmemBytes = 197824;
static_assert(kOffsetV + kStages * kBlockKV * kStrideV * 2 <= kSmemBytes, "shared-memory layout");

// Scores are kept in the log2 domain so that exp2 does the softmax: t = s * scale * log2(e).
// scale = 0.0625 (1 / sqrt(head_dim qk)).
// softcap = 50.0: t = log2(e) * softcap * tanh(s * scale / softcap).
constexpr float kScaleOverCap = 0.00125f;  // scale / softcap
constexpr float kSoftcapLog2 = 72.13475204444816f;   // softcap * log2(e)
constexpr float kLn2 = 0.6931471805599453f;
// The online softmax keeps a row's max m_i until a tile's passes it by more than kRescaleSlack
// (log2 domain): P = exp2(t - m_i) <= 2^kRescaleSlack (f16 / bf16 hold it with the same relative
// precision), alpha = 1, and acc and l_i are not rescaled; lse = m_i + log2(l_i) stays exact.
constexpr float kRescaleSlack = 8.0f;

static_assert(kBlockQ == kWarps * kRowsPerWarp, "each warp owns kFrags 16-row fragments of Q");
static_assert(kBlockKV % 16 == 0, "tile kv must be a multiple of 16 (the k of m16n8k16)");
static_assert(kHeadDimQK % 8 == 0 && kHeadDimV % 8 == 0, "head dims are multiples of 8");
static_assert(kHeadDimQKPad % 64 == 0 && kHeadDimVPad % 64 == 0, "padded head dims");
static_assert(kThreads <= 1024, "threads per block");

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
// inputs, f32 accumulators; sm_90a). A warpgroup is 4 consecutive warps (128 threads) and owns
// 64 rows of Q; warp w of it owns rows 16 w .. 16 w + 15. The accumulators of m64nN have, per
// warp, the layout of mma.sync m16n8 (PTX ISA, "Register Fragments and Shared Memory Matrix
// Layouts" of wgmma): lane = 4 g + t holds, for every 8-column tile n, rows g and g + 8 and
// columns 8 n + 2 t, 8 n + 2 t + 1 as registers 4 n .. 4 n + 3 — the s[0][n][e] and acc[0][n][e]
// of the algorithm below, which is the same for both kernel families.
//   S = Q K^T: A (Q) and B (K) from shared memory, both K-major (the head dim is contiguous).
//   acc += P V: A (P) from registers (the accumulator layout of S is the A layout of one
//   16-key step, as with mma.sync), B (V) from shared memory, MN-major (the head dim of V is
//   contiguous: the transposed-B mode of wgmma).
// Each product is issued by the whole warpgroup, committed and waited for before its result is
// used (wgmma.fence before, wgmma.wait_group 0 after); the two warpgroups of a block overlap one
// another's softmax with their products.
constexpr int kNTilesKV = kBlockKV / 8;        // 8-column tiles of S
constexpr int kNTilesV = kHeadDimVPad / 8;     // 8-column tiles of acc
constexpr int kKStepsQK = kHeadDimQKPad / 16;  // k16 steps of Q K^T
static_assert(kFrags == 1 && kBlockQ % 64 == 0, "a warpgroup owns 64 rows, a warp 16");
static_assert(kHeadDimQKPad % 64 == 0 && kHeadDimVPad % 64 == 0, "head dims in whole 128-byte swizzle blocks");
static_assert(kBlockKV % 16 == 0 && kBlockKV <= 256 && kHeadDimVPad <= 256, "N of m64nNk16 is at most 256");

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

// d (= or +=, by scale_d) A B for one k16 step: m64n64k16, A and B from shared memory, K-major.
__device__ __forceinline__ void wgmma_scores(float (&d)[kNTilesKV][4], unsigned long long a, unsigned long long b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %32, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{ %0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31 }, "
        "%33, %34, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), 
"+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), 
"+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), 
"+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "r"(scale_d), "l"(a), "l"(b));
}

// d += A B for one k16 step: m64n256k16, A from registers, B from shared memory, MN-major.
__device__ __forceinline__ void wgmma_pv(float (&d)[kNTilesV][4], const unsigned (&a)[4], unsigned long long b) {
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

using PTileArg = unsigned[kFrags][kBlockKV / 16][4];

// Keep the A fragments of a P V in flight where they are until its wait (PTX ISA: the registers
// of a wgmma's A must not be written before the wait_group that covers it).
__device__ __forceinline__ void fence_fragments(PTileArg& p) {
    #pragma unroll
    for (int ks = 0; ks < kBlockKV / 16; ++ks) {
        asm volatile("" : "+r"(p[0][ks][0]), "+r"(p[0][ks][1]), "+r"(p[0][ks][2]), "+r"(p[0][ks][3]) :: "memory");
    }
}

// One warpgroup's share of both products: its 64 rows of Q against the current K/V tile.
struct WarpMath {
    // k16 steps of the head dim itself: the padding columns (head dims not of whole 64-column
    // blocks, e.g. 96: 6 steps, not 8) are zero in Q and K, so their steps would add nothing
    static constexpr int kKSteps = kKStepsQK - (kHeadDimQKPad - kHeadDimQK) / 16;  // = ceil(kHeadDimQK / 16)
    static_assert(kKSteps >= 1 && kKSteps <= kKStepsQK, "Q and K hold the whole head dim, padded");
    static constexpr int k_at = 0, v_at = 0;
    const elem_t* sQ;  // the warpgroup's first row of Q (in column block 0)

    __device__ __forceinline__ void init(unsigned char* smem, int warp, int) {
        sQ = reinterpret_cast<const elem_t*>(smem + kOffsetQ) + (warp / 4) * 64 * 64;
    }

    __device__ __forceinline__ void load_q(unsigned char*, int) {}  // Q stays in shared memory

    // s = Q K^T: raw dot products of the warpgroup's rows with the tile's kBlockKV keys. Step kk
    // reads columns 16 kk .. 16 kk + 15: column block kk / 4, 32 bytes further per step inside it
    // (the swizzle is applied by the hardware to the whole address). Stride: 8 rows = 1024 bytes.
    // Issued as one commit group; the overlapped main loop waits for it apart from the P V that
    // follows it (wait_scores<1>), the plain one at once (scores).
    __device__ __forceinline__ void issue_scores(float (&s)[kFrags][kNTilesKV][4], const elem_t* sK) const {
        wgmma_fence();
        #pragma unroll
        for (int kk = 0; kk < kKSteps; ++kk) {
            const int at = (kk / 4) * 64, step = (kk % 4) * 16;
            wgmma_scores(s[0], smem_descriptor(sQ + at * kBlockQ + step, 16, 1024),
                         smem_descriptor(sK + k_at + at * kBlockKV + step, 16, 1024), kk > 0);
        }
        wgmma_commit();
    }

    // Wait until at most kPending groups (a P V in flight) remain: S is then complete.
    template <int kPending>
    __device__ __forceinline__ void wait_scores(float (&s)[kFrags][kNTilesKV][4]) const {
        asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(kPending) : "memory");
        fence_registers(s[0]);
    }

    __device__ __forceinline__ void scores(float (&s)[kFrags][kNTilesKV][4], const elem_t* sK) const {
        issue_scores(s, sK);
        wait_scores<0>(s);
    }

    // P, the probabilities, as the A fragments of P V (as with mma.sync: the accumulator layout
    // of two 8-key tiles is the A layout of one 16-key step).
    using PTile = PTileArg;
    __device__ __forceinline__ void pack_p(const float (&s)[kFrags][kNTilesKV][4], PTile& p) const {
        #pragma unroll
        for (int ks = 0; ks < kBlockKV / 16; ++ks) {
            p[0][ks][0] = pack2(s[0][2 * ks][0], s[0][2 * ks][1]);          // row g,     keys 2t, 2t+1
            p[0][ks][1] = pack2(s[0][2 * ks][2], s[0][2 * ks][3]);          // row g + 8, keys 2t, 2t+1
            p[0][ks][2] = pack2(s[0][2 * ks + 1][0], s[0][2 * ks + 1][1]);  // row g,     keys 2t+8, 2t+9
            p[0][ks][3] = pack2(s[0][2 * ks + 1][2], s[0][2 * ks + 1][3]);  // row g + 8, keys 2t+8, 2t+9
        }
    }

    // acc += P V. Step ks reads keys 16 ks .. 16 ks + 15 of V (rows of 128 bytes: 2048 bytes per
    // step). MN-major descriptor: leading offset = from one 64-column block of V to the next
    // (kBlockKV rows of 128 bytes), stride offset = from 8 keys to the next 8 (1024 bytes).
    __device__ __forceinline__ void issue_pv(float (&acc)[kFrags][kNTilesV][4], const PTile& p, const elem_t* sV) const {
        wgmma_fence();
        #pragma unroll
        for (int ks = 0; ks < kBlockKV / 16; ++ks) {
            wgmma_pv(acc[0], p[0][ks], smem_descriptor(sV + v_at + ks * 16 * 64, kBlockKV * 128, 1024));
        }
        wgmma_commit();
    }

    __device__ __forceinline__ void wait_pv(float (&acc)[kFrags][kNTilesV][4]) const {
        wgmma_wait_all();
        fence_registers(acc[0]);
    }

    __device__ __forceinline__ void pv(float (&acc)[kFrags][kNTilesV][4], const PTile& p, const elem_t* sV) const {
        issue_pv(acc, p, sV);
        wait_pv(acc);
    }
};

// ---- section: mask ------------------------------------------------------------------------
// mask window(left=1024, right=16), bottom-right aligned: query i sees key j iff i + (Lk - Lq) - 1024 <= j <= i + (Lk - Lq) + 16.
// key_range: the keys [begin, end) that any row in [r0, r1) may see. The main loop visits only
// the K/V tiles overlapping it, so tiles that are wholly masked are never loaded.
// tile_is_full: every row in [r0, r1) sees every key in [j0, j1), so the tile needs no
// per-element mask. Rows and keys are int. Lengths are at most 2^30 and window sizes are clamped
// to 2^30 by the planner, so the per-element tests stay inside int (windows are compared against
// the distance j - diag(i), never added to a position); key_range, once per block, is 64-bit.
struct Mask {
    int len_q, len_k;
    static constexpr int kLeft = 1024;   // window(left=...)
    static constexpr int kRight = 16;  // window(right=...)

    // Bottom-right alignment: the last query row lines up with the last key. diag(i) = i + (Lk - Lq),
    // the key on row i's diagonal, is in [-2^30, 2^30) for every row i < Lq.
    __device__ __forceinline__ int offset() const { return len_k - len_q; }
    __device__ __forceinline__ int diag(int i) const { return i + offset(); }

    __device__ __forceinline__ bool visible(int i, int j) const {
        const int d = j - diag(i);  // with j < Lk: in (-2^30, 2^31)
        return j < len_k && d >= -kLeft && d <= kRight;
    }

    __device__ __forceinline__ void key_range(int r0, int r1, int& begin, int& end) const {
        begin = (int)min((long long)len_k, max(0LL, (long long)r0 + offset() - kLeft));
        end = (int)max(0LL, min((long long)len_k, (long long)r1 + offset() + kRight));
        if (end < begin) end = begin;
    }

    // The keys j0 + 32 w + b (b < 32) that row i sees, as bit b of out[w]: a partial tile's mask
    // in a few operations per row, so that the score loop tests each score with a constant shift
    // and no branch (section: score transform and mask). The bounds are relative to j0.
    template <int kWords>
    __device__ __forceinline__ void row_bits(int i, int j0, unsigned (&out)[kWords]) const {
        const int d = diag(i) - j0;  // in (-2^31, 2^30)
        // each bound clamped on the side where it cannot reach the tile, so that adding the
        // window (<= 2^30) stays inside int
        const int lo = max(d, -4096) - kLeft, hi = min(len_k - j0, min(d, 4096) + kRight + 1);
        #pragma unroll
        for (int w = 0; w < kWords; ++w) {
            const int a = min(32, max(0, lo - 32 * w)), b = min(32, max(0, hi - 32 * w));
            const unsigned below_b = b >= 32 ? ~0u : (1u << b) - 1u, below_a = a >= 32 ? ~0u : (1u << a) - 1u;
            out[w] = below_b & ~below_a;  // bits [a, b)
        }
    }

    __device__ __forceinline__ bool tile_is_full(int r0, int r1, int j0, int j1) const {
        return j1 <= len_k && j0 - diag(r1 - 1) >= -kLeft && (j1 - 1) - diag(r0) <= kRight;
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
__device__ __forceinline__ void load_rows(elem_t* dst, const RowPtr& row_ptr, int valid_rows, int tid) {
    constexpr int kVec = 16 / static_cast<int>(sizeof(elem_t));
    constexpr int kChunks = kCols / kVec;
    constexpr int kCopies = kRows * kChunks;
    #pragma unroll
    for (int i = 0; i < (kCopies + kCopyThreads - 1) / kCopyThreads; ++i) {
        const int c = tid + i * kCopyThreads;
        if (kCopies % kCopyThreads == 0 || c < kCopies) {
            const int r = c / kChunks, col = (c % kChunks) * kVec;
            const bool valid = r < valid_rows;
            cp_async_16(dst + swizzled<kRows>(r, col), valid ? row_ptr(r) + col : nullptr, valid);
        }
    }
}

// kBlockKV keys from j0 (those below j0 + valid exist; the rest read as zeros).
template <int kCols, int kStride, bool kVarlen>
__device__ __forceinline__ void load_keys(elem_t* dst, const KeyRows<kVarlen>& src, int j0, int valid, int tid) {
    if constexpr (!kVarlen) {
        // Contiguous cache, nothing appended: every tile is one strided copy (no per-tile branch).
        load_tile<kBlockKV, kCols, kStride>(dst, src.stored(j0), src.row_stride, valid, tid);
    } else if (src.strided(j0, min(valid, kBlockKV))) {
        load_tile<kBlockKV, kCols, kStride>(dst, src.row(j0), src.row_stride, valid, tid);
    } else {
        load_rows<kBlockKV, kCols, kStride>(dst, [&](int r) { return src.row(j0 + r); }, valid, tid);
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
    auto word = [&](int r, int c) {
        return reinterpret_cast<uint4*>(tile + swizzled<kBlockKV>(r, c * (16 / static_cast<int>(sizeof(elem_t)))));
    };
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
    fence_async_shared();  // the zeros are read by the tensor cores (async proxy)
    __syncthreads();  // every warp's P V reads the tile after all the zeros are written
}

// The producer warpgroup's cleaning (warp specialisation): its warp w scans keys 32 w + lane,
// 32 (w + 4) + lane, ... of the landed tile and zeroes those keys' non-finite values itself. A
// warp reads and writes only its own keys' rows, so scanning and zeroing need no barrier between
// them; the bits go to `bad` in shared memory (one word per 32 keys) for the consumers.
template <int kCols>
__device__ __forceinline__ void clean_values_copier(elem_t* tile, unsigned* bad, int ptid) {
    constexpr int kWordsPerRow = kCols * static_cast<int>(sizeof(elem_t)) / 16;  // uint4 per row
    const int lane = ptid % 32;
    for (int w = ptid / 32; w < kKeyWords; w += kCopyThreads / 32) {
        const int r = w * 32 + lane;
        bool found = false;
        if (r < kBlockKV) {
            #pragma unroll 4
            for (int c = 0; c < kWordsPerRow; ++c) {
                if (scrub_word(reinterpret_cast<uint4*>(tile + swizzled<kBlockKV>(r, c * (16 / static_cast<int>(sizeof(elem_t))))))) {
                    found = true;
                }
            }
        }
        const unsigned bits = __ballot_sync(0xffffffffu, found);
        if (lane == 0) bad[w] = bits;
    }
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

// ---- section: score transform --------------------------------------------------------------
// Raw dot product -> score in the log2 domain, t = log2(e) * softcap * tanh(scale * s / softcap).
__device__ __forceinline__ float score_transform(float s) {
    return kSoftcapLog2 * tanhf(s * kScaleOverCap);
}

// ---- section: work items (persistent blocks) ----
// The work items of a launch: one per (batch, query head, row tile), what one block of a
// plain launch would do. They are numbered batch-major, then head, then row tile, so that the
// items at work at one time share their heads' K and V in L2.
__device__ __forceinline__ int row_tiles(int len_q, int group) {
    return (len_q + kBlockQ - 1) / kBlockQ;
}

__device__ __forceinline__ int work_items(int len_q, int heads_q, int group, int batch_size) {
    return batch_size * heads_q * row_tiles(len_q, group);
}

// Item `item` as (row tile, head, batch, 0); x = -1: past the last item. A block keeps its items
// in kItemSlots slots of shared memory: the producer fills slot n + 1 after it has issued item n's
// copies, and it starts item n only once the consumers are done with item n - 1's main loop, so
// it writes slot n + kItemSlots only after the consumers have finished item n's epilogue (which
// reads its slot again).
constexpr int kItemSlots = 4;
static_assert(kItemSlots % 2 == 0, "an item's slot also gives its parity (bar_q, bar_done)");
__device__ __forceinline__ int4 work_item(int item, int len_q, int len_k, int heads_q, int group, int batch_size) {
    if (item >= work_items(len_q, heads_q, group, batch_size)) return make_int4(-1, 0, 0, 0);
    // (heads: with output column blocks, (head, block) pairs: y = head * kVBlocks + block)
    const int tiles = row_tiles(len_q, group), heads = heads_q;
    const int tile = item % tiles, head_batch = item / tiles;
    return make_int4(tile, head_batch % heads, head_batch / heads, 0);
}

// ---- section: kernel ------------------------------------------------------------------------
// One block computes kBlockQ rows of the output of one (batch, query head), FlashAttention-2
// style (Dao 2023, Algorithm 1): loop over the visible K/V tiles keeping, per row, the running
// max m_i, the running sum l_i of exp2(t - m_i) and the unnormalised output acc; when the max
// grows, rescale l_i and acc by alpha = exp2(m_old - m_new); divide by l_i at the end.
// The score matrix is never stored: each warp holds its kRowsPerWarp x kBlockKV slice in registers.
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
                                          unsigned* __restrict__ work_counter,
                                          const TensorMap& tmap_q,
                                          const TensorMap& tmap_k,
                                          const TensorMap& tmap_v) {
    // The swizzled tiles need 1024-byte alignment: the buffers start at the first such address
    // (the launch asks for 1024 bytes more than the buffers take).
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
    elem_t* sQ = reinterpret_cast<elem_t*>(smem + kOffsetQ);
    elem_t* sK = reinterpret_cast<elem_t*>(smem + kOffsetK);
    elem_t* sV = reinterpret_cast<elem_t*>(smem + kOffsetV);

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int t = lane % 4;                  // this lane's columns: 2t and 2t + 1 of each 8


    // ---- section: work items (persistent blocks) ----
    // The grid is one block per multiprocessor.
    // A work item is what one block of a plain launch
    // does: row tile q_tile of one (batch, head). Items are numbered batch-major, then head, then
    // row tile (work_item), so that the items at work at one time share their heads' K and V in
    // L2. Block b does item b first; then its producer takes the next one from work_counter
    // (atomicInc, which wraps the counter back to zero at the launch's last fetch: a block fetches
    // until it gets past the last item, so there are exactly work_items fetches) and hands it to
    // the consumers in item_slot with that item's Q (bar_q).
    // The K/V ring runs on across items (ring: the tiles of the block's earlier items), so the
    // producer copies the next item's Q and first tiles while the consumers finish the current one.
    // ---- section: prologue: load Q ----
    zero_padding<kBlockQ, kHeadDimQK, kHeadDimQKPad, kStrideQ>(sQ, tid);
    #pragma unroll
    for (int st = 0; st < kStages; ++st) {
        zero_padding<kBlockKV, kHeadDimQK, kHeadDimQKPad, kStrideK>(sK + st * kBlockKV * kStrideK, tid);
        zero_padding<kBlockKV, kHeadDimV, kHeadDimVPad, kStrideV>(sV + st * kBlockKV * kStrideV, tid);
    }
    // The producer warpgroup copies Q (section: main loop); here its mbarriers are set up.
    unsigned long long* bar_q = reinterpret_cast<unsigned long long*>(smem + kOffsetSync);  // Q has landed
    unsigned long long* bar_full = bar_q + 1;            // [kStages]: the stage's K and V have landed
    unsigned long long* bar_empty = bar_full + kStages;  // [kStages]: every consumer warp is done with it
    unsigned long long* bar_qfree = bar_empty + kStages;  // every consumer warp is done with Q (the next item's may come)
    int4* item_slot = reinterpret_cast<int4*>(bar_qfree + 1);  // [kItemSlots]: the block's work items in turn (section: work items)
    int* redo = reinterpret_cast<int*>(item_slot + kItemSlots);  // [kItemSlots]: the item's result was not finite
    unsigned long long* bar_done = reinterpret_cast<unsigned long long*>(redo + kItemSlots);  // [2]: item n's check, n % 2
    unsigned* bad_keys = reinterpret_cast<unsigned*>(bar_empty + kStages + 1 + 2 * kItemSlots + kItemSlots / 2 + 2);  // [kStages][kKeyWords]
    // [kStages]: K and V of a tile the producer cleans have landed (the tensor copy engine)
    unsigned long long* bar_land = reinterpret_cast<unsigned long long*>(bad_keys + (kStages * kKeyWords + 1) / 2 * 2);
    if (tid == 0) {
        mbar_init(bar_q, kCopyThreads + 1);  // the copies of Q, and the producer's first thread with item_slot
        mbar_init(bar_qfree, kWarps);
        mbar_init(&bar_done[0], kWarps);
        mbar_init(&bar_done[1], kWarps);
        for (int i = 0; i < kItemSlots; ++i) redo[i] = 0;
        item_slot[0] = work_item(blockIdx.x, len_q, len_k, heads_q, group, batch_size);  // the block's first
        #pragma unroll
        for (int st = 0; st < kStages; ++st) {
            mbar_init(&bar_full[st], kCopyThreads);  // one arrival per producer thread (and the copies' bytes)
            mbar_init(&bar_land[st], 1);
            mbar_init(&bar_empty[st], kWarps);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    fence_async_shared();  // the zero padding above is read by the tensor cores (async proxy)
    __syncthreads();
    WarpMath math;
    math.init(smem, warp, lane);
    math.load_q(smem, warp);

    // ---- section: main loop over K/V tiles ----
    // Warp specialisation (FlashAttention-3, Shah et al. 2024, sections 3.1-3.2). The producer
    // warpgroup (warps kWarps ..) copies each item's Q, then its K/V tile it into stage
    // (ring + it) % kStages once every consumer warp has released that stage (bar_empty), and
    // signals each on bar_full; it keeps kProducerRegs registers per thread and gives the rest to
    // the consumers (setmaxnreg). Each consumer warpgroup runs the overlapped loop on its 64 rows:
    // S = Q K^T of tile it and acc += P V of tile it - 1 issued together, the softmax of tile it
    // while P V runs, and the stage of tile it - 1 released once P V is done. No barrier spans the
    // block, so the warpgroups drift apart; with two of them, named barriers make them take turns
    // issuing their products (ping-pong), so one's softmax runs while the other's products do.
    if (warp >= kWarps) {
        // -- producer warpgroup: copies only
        if constexpr (kConsumerGroups >= 2) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(kProducerRegs));
        const int ptid = tid - kWarps * 32;
        int ring = 0;  // K/V tiles of the block's earlier items
        unsigned land = 0u;  // bit s: the parity of bar_land[s]'s next phase
        bool drained = false;  // this block's fetch found no item left (it fetches no more)
        // The producer's first thread picks the block's next item: the next one from work_counter
        // (x = -1: none left), or item `prev` of the block again, cleaned, if its consumers found a result
        // that is not finite (they check each item at its end: bar_done).
        auto next_item = [&](int prev) {
            if (prev >= 0) {
                mbar_wait(&bar_done[prev & 1], (prev >> 1) & 1);  // its consumers have checked it
                const int s = prev % kItemSlots;
                int4 again = item_slot[s];
                if (redo[s]) {
                    redo[s] = 0;
                    if (again.w == 0) {  // (a cleaned pass is final)
                        again.w = 1;  // cleaned this time
                        return again;
                    }
                }
            }
            if (drained) return make_int4(-1, 0, 0, 0);
            const int items = work_items(len_q, heads_q, group, batch_size);
            const int4 w = work_item(gridDim.x + static_cast<int>(atomicInc(work_counter, items - 1)), len_q, len_k, heads_q,
                                     group, batch_size);
            drained = w.x < 0;
            return w;
        };
        for (int n_item = 0; ; ++n_item) {
            // the consumers are done with the previous item's Q (and bar_q's phase of it is complete)
            if (n_item > 0) mbar_wait(bar_qfree, (n_item - 1) & 1);
            if (n_item > 0 && item_slot[n_item % kItemSlots].x < 0) {
                // none left, but the last item may have to be done again (section: non-finite values)
                named_sync(1, kCopyThreads);  // every thread has read the slot before it changes
                if (ptid == 0) item_slot[n_item % kItemSlots] = next_item(n_item - 1);
                named_sync(1, kCopyThreads);
            }
            const int4 w = item_slot[n_item % kItemSlots];
            if (w.x < 0) {  // none left: the consumers find it in item_slot
                if (ptid == 0) mbar_arrive(bar_q);
                mbar_arrive(bar_q);
                break;
            }
            const bool clean = w.w != 0;  // this pass cleans V of every tile (see next_item)
            const int q_tile = w.x, head_y = w.y, batch = w.z;  // this work item's row tile, query head, batch

            // ---- section: sequences ----
            // (bad integer inputs on the device: reported, and the item is of an empty sequence: it reads
            // and writes nothing, and the block goes on to its next item)
            const Seq seq = [&] {
                const Seq s = sequence<kVarlen>(batch, len_q, len_k, cu_seqlens_q, cu_seqlens_k, kv_lens, len_new);
                if constexpr (kVarlen) {
                    if (!sequence_ok(s, batch, len_q, len_k, cu_seqlens_q, cu_seqlens_k, kv_lens, len_new, rows_q, rows_k,
                                     errors)) {
                        return Seq{0, 0, 0, 0, 0};
                    }
                }
                return s;
            }();
            const int head = head_y, kv_head = head / group;  // grouped-query attention: Hq / Hkv heads share K/V
            const int n_rows = seq.len_q;                      // the block's rows are query rows of one head
            auto query_of = [](int p) { return p; };
            auto head_of = [&](int) { return head; };
            auto q_row = [&](int p) {
                return q + batch * q_sb + (long long)(seq.q_start + query_of(p)) * q_sl + head_of(p) * q_sh;
            };
            const int row0 = q_tile * kBlockQ;       // the block's first row
            const int row_end = min(row0 + kBlockQ, n_rows);

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
                if (len_new > 0 && kPass != 2 && q_tile == 0 && head % group == 0) {
                    append_rows<kHeadDimQK>(keys, seq.len_k - seq.cached, tid);
                    append_rows<kHeadDimV>(values, seq.len_k - seq.cached, tid);
                }
            }

            // ---- section: loop bounds (mask) ----
            const Mask mask{seq.len_q, seq.len_k};  // aligned to this sequence's own lengths
            const int qrow0 = query_of(row0), qrow_end = query_of(row_end - 1) + 1;  // the block's query rows
            int kv_begin, kv_end;
            mask.key_range(qrow0, qrow_end, kv_begin, kv_end);
            int tile_first = kv_begin / kBlockKV;
            int n_tiles = kv_end > kv_begin ? (kv_end + kBlockKV - 1) / kBlockKV - tile_first : 0;
            if (kVarlen && row0 >= n_rows) n_tiles = 0;  // an item past its sequence's rows: the grid covers the longest one
            // The kv tile of iteration it.
            auto kv_tile = [&](int it) { return tile_first + it; };

            if (ptid == 0) mbar_arrive(bar_q);  // (item_slot holds this item: written a fetch ago)
            if (ptid == 0) {
                mbar_expect_tx(bar_q, kQBytes);
                tma_tile<kBlockQ, kHeadDimQKPad>(sQ, tmap_q, head, row0, batch, bar_q);
            }
            mbar_arrive(bar_q);
            for (int it = 0; it < n_tiles; ++it) {
                const int stage = (ring + it) % kStages;
                mbar_wait(&bar_empty[stage], (((ring + it) / kStages) & 1) ^ 1);  // the tile kStages back is released
                const int j0 = kv_tile(it) * kBlockKV;
                const bool partial = !mask.tile_is_full(qrow0, qrow_end, j0, j0 + kBlockKV);
                const bool cleans = clean;  // V is cleaned before the consumers see it (a cleaning pass: every tile)
                // -- K and V by the tensor copy engine: the first thread tells the barrier the bytes to
                // expect and issues one copy per 64-column block. bar_full counts one arrival per
                // producer thread: for a plain tile the first thread makes them all; on a tile the
                // producer still works on (its V cleaned, its mask words staged) each thread arrives
                // once its own writes are done, so that each arrival releases what that thread wrote
                // (the order compute-sanitizer's racecheck follows), and V lands on bar_land first when
                // it is cleaned.
                if (ptid == 0) {
                    unsigned long long* bar = cleans ? &bar_land[stage] : &bar_full[stage];
                    if (cleans) {
                        mbar_arrive_expect_tx(bar, kTileBytes);
                    } else {
                        mbar_expect_tx(bar, kTileBytes);
                    }
                    tma_tile<kBlockKV, kHeadDimQKPad>(sK + stage * kBlockKV * kStrideK, tmap_k, kv_head, j0, batch, bar);
                    tma_tile<kBlockKV, kVTileCols>(sV + stage * kBlockKV * kStrideV, tmap_v, kv_head, j0, batch, bar);
                    if (!(cleans)) mbar_arrive_count(&bar_full[stage], kCopyThreads);
                }
                if (cleans) {
                    // -- clean V of a partial tile (section non-finite values) once it has landed
                    mbar_wait(&bar_land[stage], (land >> stage) & 1u);
                    land ^= 1u << stage;
                    clean_values_copier<kVTileCols>(sV + stage * kBlockKV * kStrideV, bad_keys + stage * kKeyWords, ptid);
                    fence_async_shared();  // the zeros are read by the tensor cores (async proxy)
                }
                if (cleans) mbar_arrive(&bar_full[stage]);  // this thread's zeros, bad-key bits and words are written
            }
            ring += n_tiles;
            // -- the next item: one thread takes it, the others read it
            // (item n_item - 1's check: by now its consumers are busy with this item's tiles)
            if (ptid == 0) item_slot[(n_item + 1) % kItemSlots] = next_item(n_item - 1);
            named_sync(1, kCopyThreads);  // (the others read it at the top of the loop)
        }
        // its copies complete before it exits (the PTX ISA does not promise that they and their
        // mbarrier arrivals complete for a thread that has exited)
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        return;
    }
    // -- consumer warpgroups
    if constexpr (kConsumerGroups >= 2) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(kConsumerRegs));
    const int wg = warp / 4;  // this warpgroup: rows 64 wg .. of the block
    if constexpr (kPingPong) {
        // warpgroup 0 issues its products first; the turns run on across items
        if (wg == kConsumerGroups - 1) named_arrive(2, 2 * 128);
    }
    // The block's position in one register, which stays live across the main loop: the K/V tiles
    // of its earlier items (ring) and this item's slot (its item count mod kItemSlots, even: bar_q's
    // and bar_done's parity), as ring * kItemSlots + slot.
    for (int at = 0; ; ) {
        const int ring = at / kItemSlots, slot = at % kItemSlots;
        mbar_wait(bar_q, slot & 1);  // this item's Q has landed, or the producer found none left
        const int4 w = item_slot[slot];
        if (w.x < 0) break;
        fence_async_shared();  // Q was written by cp.async (generic proxy); the tensor cores read it
        const bool clean = w.w != 0;  // this pass cleans V of every tile (section: non-finite values)
        const int q_tile = w.x, head_y = w.y, batch = w.z;  // this work item's row tile, query head, batch

        // ---- section: sequences ----
        // (bad integer inputs on the device: reported, and the item is of an empty sequence: it reads
        // and writes nothing, and the block goes on to its next item)
        const Seq seq = [&] {
            const Seq s = sequence<kVarlen>(batch, len_q, len_k, cu_seqlens_q, cu_seqlens_k, kv_lens, len_new);
            if constexpr (kVarlen) {
                if (!sequence_ok(s, batch, len_q, len_k, cu_seqlens_q, cu_seqlens_k, kv_lens, len_new, rows_q, rows_k,
                                 errors)) {
                    return Seq{0, 0, 0, 0, 0};
                }
            }
            return s;
        }();
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
            if (len_new > 0 && kPass != 2 && q_tile == 0 && head % group == 0) {
                append_rows<kHeadDimQK>(keys, seq.len_k - seq.cached, tid);
                append_rows<kHeadDimV>(values, seq.len_k - seq.cached, tid);
            }
        }

        // ---- section: loop bounds (mask) ----
        const Mask mask{seq.len_q, seq.len_k};  // aligned to this sequence's own lengths
        const int qrow0 = query_of(row0), qrow_end = query_of(row_end - 1) + 1;  // the block's query rows
        int kv_begin, kv_end;
        mask.key_range(qrow0, qrow_end, kv_begin, kv_end);
        int tile_first = kv_begin / kBlockKV;
        int n_tiles = kv_end > kv_begin ? (kv_end + kBlockKV - 1) / kBlockKV - tile_first : 0;
        if (kVarlen && row0 >= n_rows) n_tiles = 0;  // an item past its sequence's rows: the grid covers the longest one
        // The kv tile of iteration it.
        auto kv_tile = [&](int it) { return tile_first + it; };
        // This lane's query rows, and (split schedules) its rows of the workspaces; -1: past the block's rows.
        int qi[kFrags][2];
        #pragma unroll
        for (int mf = 0; mf < kFrags; ++mf) {
            #pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int p = row_a + 16 * mf + 8 * h;
                qi[mf][h] = query_of(p);
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

        WarpMath::PTile p;         // P of the previous tile: the A operand of its P V, in flight
        float alpha_i[kFrags][2];  // this tile's rescaling of acc, applied once that P V is done
        for (int it = 0; it < n_tiles; ++it) {
            const int stage = (ring + it) % kStages, prev = (ring + it + kStages - 1) % kStages;  // tiles it, it - 1
            mbar_wait(&bar_full[stage], ((ring + it) / kStages) & 1);  // K and V of tile it have landed
            fence_async_shared();
            const int j0 = kv_tile(it) * kBlockKV;
            const bool partial = !mask.tile_is_full(qrow0, qrow_end, j0, j0 + kBlockKV);
            unsigned bad[kKeyWords];  // keys of this tile whose V held a non-finite value (the producer cleaned them)
            #pragma unroll
            for (int w = 0; w < kKeyWords; ++w) {
                // read by lane 0 and broadcast: the warp's one read of the stage's bits is then ordered
                // before lane 0's release of the stage by program order (compute-sanitizer's racecheck
                // saw the other lanes' reads race the producer's next write of the bits, causal with
                // d_v > 128, with the barriers below; three consumer warpgroups (160 registers, d <= 64)
                // keep the plain read: the broadcast spilled there)
                const unsigned word = lane == 0 && clean ? bad_keys[stage * kKeyWords + w] : 0u;
                bad[w] = __shfl_sync(0xffffffffu, word, 0);
            }

            // -- S = Q K^T (this tile), issued together with O += P V of the previous tile
            if constexpr (kPingPong) named_sync(2 + wg, 2 * 128);  // this warpgroup's turn
            float s[kFrags][kNTilesKV][4];
            math.issue_scores(s, sK + stage * kBlockKV * kStrideK);
            if (it > 0) math.issue_pv(acc, p, sV + prev * kBlockKV * kStrideV);
            if (it > 0) {
                math.wait_scores<1>(s);  // S is done; P V may still run
            } else {
                math.wait_scores<0>(s);
            }
            // the other warpgroup's turn (a bar.arrive between the issue and the wait above would make
            // ptxas serialise the products: warning C7514)
            if constexpr (kPingPong) named_arrive(2 + (wg + 1) % kConsumerGroups, 2 * 128);

            // -- score transform and mask
            // Per row of this lane: in a partial tile, the keys it sees as bits, bit b of word b / 32 for
            // key j0 + 2t + b (the lane's columns 2t, 2t + 1 of each 8 at constant shifts; keys past Lk
            // are 0 bits); in a full tile all ones. The bit is the whole test: no branch in the loop.
            // From the row's key range (Mask::row_bits).
            constexpr int kMaskTileWords = (kBlockKV + 31) / 32;
            #pragma unroll
            for (int mf = 0; mf < kFrags; ++mf) {
                #pragma unroll
                for (int h = 0; h < 2; ++h) {
                    unsigned bits[kMaskTileWords];
                    if (partial) {
                        mask.row_bits(qi[mf][h], j0 + 2 * t, bits);
                    } else {
                        #pragma unroll
                        for (int w = 0; w < kMaskTileWords; ++w) bits[w] = ~0u;
                    }
                    #pragma unroll
                    for (int n = 0; n < kNTilesKV; ++n) {
                        #pragma unroll
                        for (int e = 2 * h; e < 2 * h + 2; ++e) {
                            float x = score_transform(s[mf][n][e]);
                            if (!((bits[n / 4] >> ((n % 4) * 8 + e % 2)) & 1u)) x = neg_inf();
                            s[mf][n][e] = x;
                        }
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
                    const float alpha = grows ? exp2_approx(m_i[mf][h] - m_use) : 1.f;
                    m_i[mf][h] = m_keep;
                    float row_sum = 0.f;
                    #pragma unroll
                    for (int n = 0; n < kNTilesKV; ++n) {
                        s[mf][n][2 * h] = exp2_approx(s[mf][n][2 * h] - m_use);
                        s[mf][n][2 * h + 1] = exp2_approx(s[mf][n][2 * h + 1] - m_use);
                        row_sum += s[mf][n][2 * h] + s[mf][n][2 * h + 1];
                    }
                    l_i[mf][h] = l_i[mf][h] * alpha + row_sum;
                    alpha_i[mf][h] = alpha;  // acc is rescaled once the product in flight is done
                }
            }

            // -- the previous P V is done: release its stage, rescale acc, then P of this tile
            math.wait_pv(acc);
            fence_fragments(p);  // P stayed untouched while its P V ran
            // every lane's reads of the stage's bad_keys are ordered before lane 0 releases it: with
            // two consumer warpgroups by the named barrier (bar.sync) of this iteration's turn, with
            // one by this __syncwarp
            if constexpr (kConsumerGroups == 1) __syncwarp();
            if (it > 0 && lane == 0) mbar_arrive(&bar_empty[prev]);
            bool rescale = false;  // (kRescaleSlack: most tiles keep every row's max, alpha = 1)
            #pragma unroll
            for (int mf = 0; mf < kFrags; ++mf) rescale |= alpha_i[mf][0] != 1.f || alpha_i[mf][1] != 1.f;
            if (rescale) {
                #pragma unroll
                for (int mf = 0; mf < kFrags; ++mf) {
                    #pragma unroll
                    for (int n = 0; n < kNTilesV; ++n) {
                        acc[mf][n][0] *= alpha_i[mf][0];
                        acc[mf][n][1] *= alpha_i[mf][0];
                        acc[mf][n][2] *= alpha_i[mf][1];
                        acc[mf][n][3] *= alpha_i[mf][1];
                    }
                }
            }
            // rows that see (p != 0) a key whose V held a non-finite value (cleaned by the producer)
            if (clean) mark_bad_rows(row_bad, s, bad, t);
            math.pack_p(s, p);
        }
        // every Q K^T of this item is done: the producer may copy the next item's Q
        if (lane == 0) mbar_arrive(bar_qfree);
        // -- O += P V of the last tile; then its stage is released
        if (n_tiles > 0) {
            const int last = (ring + n_tiles - 1) % kStages;
            math.issue_pv(acc, p, sV + last * kBlockKV * kStrideV);
            math.wait_pv(acc);
            __syncwarp();  // every lane's reads of the stage (and of its bad_keys) before lane 0 releases it
            if (lane == 0) mbar_arrive(&bar_empty[last]);
        }
        // Optimistic pass (not clean): V was not cleaned, so a non-finite value at a key with p = 0
        // (hidden, a score of -inf, or an exp2 that underflowed) makes some row's acc NaN (0 * inf);
        // every such row, and only such a row, has an acc that is not finite. The item is then done
        // again, every tile cleaned (the producer's next_item, which ignores the flag of a cleaned
        // pass), and that pass's stores replace this one's.
        {
        bool finite = true;
        #pragma unroll
        for (int mf = 0; mf < kFrags; ++mf) {
            #pragma unroll
            for (int n = 0; n < kNTilesV; ++n) {
                #pragma unroll
                for (int e = 0; e < 4; ++e) finite = finite && isfinite(acc[mf][n][e]);
            }
        }
        finite = __all_sync(0xffffffffu, finite);
            if (!finite && lane == 0) redo[slot] = 1;
        }
        if (lane == 0) mbar_arrive(&bar_done[slot & 1]);  // (after the flag: the producer reads it then)
        {
            // batch and head again from item_slot (the producer writes this slot again only after
            // this item's epilogue): cheaper than holding them in registers across the main loop
            const int4 again = item_slot[slot];
            const int batch = again.z;
            const int head = again.y;
            auto head_of = [&](int) { return head; };
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
                            if (n * 8 < kHeadDimV) {
                                store_pair(o_row + n * 8 + 2 * t, acc[mf][n][2 * h] * inv_l, acc[mf][n][2 * h + 1] * inv_l);
                            }
                        }
                        if (lse != nullptr && t == 0) {
                            lse[batch * lse_sb + hh * lse_sh + seq.q_start + i] =
                                l > 0.f ? m_i[mf][h] * kLn2 + logf(l) : (l == 0.f ? neg_inf() : l);
                        }
                    }
                }
            }
        }
        at = (ring + n_tiles) * kItemSlots + (slot + 1) % kItemSlots;
    }
    if constexpr (kPingPong) {
        if (wg == 0) named_sync(2, 2 * 128);  // the last warpgroup's last turn signal
    }
}
}  // namespace padded

// =============================================================================================
// namespace varlen: launches with cu_seqlens_q, kv_lens or an append (entry point attngen_softcap_window_f16_varlen)
// =============================================================================================
namespace varlen {

// ---- section: config ----------------------------------------------------------------
// Tile configuration, fixed at compile time. Batch, sequence lengths and head counts are
// run-time parameters; any length >= 1 works (partial tiles are zero-filled and masked).
constexpr int kBlockQ = 64;      // tile q: rows of Q per block
constexpr int kFrags = 1;         // 16-row fragments of Q per warp
constexpr int kRowsPerWarp = 16 * kFrags;
constexpr int kBlockKV = 32;     // tile kv: rows of K and V per iteration of the main loop
constexpr int kWarps = 4;
constexpr int kThreads = 128;    // kWarps * 32
constexpr int kCopyThreads = kThreads;  // threads that copy tiles: all
constexpr int kStages = 2;      // K/V tiles in flight (cp.async pipeline depth)
constexpr int kHeadDimQK = 256;    // head dim of q and k
constexpr int kHeadDimV = 256;     // head dim of v and out
constexpr int kHeadDimQKPad = 256; // padded to a multiple of 64 (whole 128-byte swizzle blocks); padding is zero
constexpr int kHeadDimVPad = 256;
// Shared-memory tiles are in the 128-byte swizzled layout of the wgmma descriptors (section
// memory: swizzled); the strides are the padded row widths, in elements.
constexpr int kStrideQ = 256;
constexpr int kStrideK = 256;
constexpr int kStrideV = 256;
constexpr int kOffsetQ = 0;     // byte offsets into dynamic shared memory (99328 bytes)
constexpr int kOffsetK = 32768;
constexpr int kOffsetV = 65536;
constexpr int kSmemBytes = 99328;
static_assert(kOffsetV + kStages * kBlockKV * kStrideV * 2 <= kSmemBytes, "shared-memory layout");

// Scores are kept in the log2 domain so that exp2 does the softmax: t = s * scale * log2(e).
// scale = 0.0625 (1 / sqrt(head_dim qk)).
// softcap = 50.0: t = log2(e) * softcap * tanh(s * scale / softcap).
constexpr float kScaleOverCap = 0.00125f;  // scale / softcap
constexpr float kSoftcapLog2 = 72.13475204444816f;   // softcap * log2(e)
constexpr float kLn2 = 0.6931471805599453f;
// The online softmax keeps a row's max m_i until a tile's passes it by more than kRescaleSlack
// (log2 domain): P = exp2(t - m_i) <= 2^kRescaleSlack (f16 / bf16 hold it with the same relative
// precision), alpha = 1, and acc and l_i are not rescaled; lse = m_i + log2(l_i) stays exact.
constexpr float kRescaleSlack = 8.0f;

static_assert(kBlockQ == kWarps * kRowsPerWarp, "each warp owns kFrags 16-row fragments of Q");
static_assert(kBlockKV % 16 == 0, "tile kv must be a multiple of 16 (the k of m16n8k16)");
static_assert(kHeadDimQK % 8 == 0 && kHeadDimV % 8 == 0, "head dims are multiples of 8");
static_assert(kHeadDimQKPad % 64 == 0 && kHeadDimVPad % 64 == 0, "padded head dims");
static_assert(kThreads <= 1024, "threads per block");

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
// inputs, f32 accumulators; sm_90a). A warpgroup is 4 consecutive warps (128 threads) and owns
// 64 rows of Q; warp w of it owns rows 16 w .. 16 w + 15. The accumulators of m64nN have, per
// warp, the layout of mma.sync m16n8 (PTX ISA, "Register Fragments and Shared Memory Matrix
// Layouts" of wgmma): lane = 4 g + t holds, for every 8-column tile n, rows g and g + 8 and
// columns 8 n + 2 t, 8 n + 2 t + 1 as registers 4 n .. 4 n + 3 — the s[0][n][e] and acc[0][n][e]
// of the algorithm below, which is the same for both kernel families.
//   S = Q K^T: A (Q) and B (K) from shared memory, both K-major (the head dim is contiguous).
//   acc += P V: A (P) from registers (the accumulator layout of S is the A layout of one
//   16-key step, as with mma.sync), B (V) from shared memory, MN-major (the head dim of V is
//   contiguous: the transposed-B mode of wgmma).
// Each product is issued by the whole warpgroup, committed and waited for before its result is
// used (wgmma.fence before, wgmma.wait_group 0 after); the two warpgroups of a block overlap one
// another's softmax with their products.
constexpr int kNTilesKV = kBlockKV / 8;        // 8-column tiles of S
constexpr int kNTilesV = kHeadDimVPad / 8;     // 8-column tiles of acc
constexpr int kKStepsQK = kHeadDimQKPad / 16;  // k16 steps of Q K^T
static_assert(kFrags == 1 && kBlockQ % 64 == 0, "a warpgroup owns 64 rows, a warp 16");
static_assert(kHeadDimQKPad % 64 == 0 && kHeadDimVPad % 64 == 0, "head dims in whole 128-byte swizzle blocks");
static_assert(kBlockKV % 16 == 0 && kBlockKV <= 256 && kHeadDimVPad <= 256, "N of m64nNk16 is at most 256");

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

// d (= or +=, by scale_d) A B for one k16 step: m64n32k16, A and B from shared memory, K-major.
__device__ __forceinline__ void wgmma_scores(float (&d)[kNTilesKV][4], unsigned long long a, unsigned long long b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %16, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
        "{ %0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15 }, "
        "%17, %18, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), 
"+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
        : "r"(scale_d), "l"(a), "l"(b));
}

// d += A B for one k16 step: m64n256k16, A from registers, B from shared memory, MN-major.
__device__ __forceinline__ void wgmma_pv(float (&d)[kNTilesV][4], const unsigned (&a)[4], unsigned long long b) {
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

using PTileArg = unsigned[kFrags][kBlockKV / 16][4];

// One warpgroup's share of both products: its 64 rows of Q against the current K/V tile.
struct WarpMath {
    // k16 steps of the head dim itself: the padding columns (head dims not of whole 64-column
    // blocks, e.g. 96: 6 steps, not 8) are zero in Q and K, so their steps would add nothing
    static constexpr int kKSteps = kKStepsQK - (kHeadDimQKPad - kHeadDimQK) / 16;  // = ceil(kHeadDimQK / 16)
    static_assert(kKSteps >= 1 && kKSteps <= kKStepsQK, "Q and K hold the whole head dim, padded");
    static constexpr int k_at = 0, v_at = 0;
    const elem_t* sQ;  // the warpgroup's first row of Q (in column block 0)

    __device__ __forceinline__ void init(unsigned char* smem, int warp, int) {
        sQ = reinterpret_cast<const elem_t*>(smem + kOffsetQ) + (warp / 4) * 64 * 64;
    }

    __device__ __forceinline__ void load_q(unsigned char*, int) {}  // Q stays in shared memory

    // s = Q K^T: raw dot products of the warpgroup's rows with the tile's kBlockKV keys. Step kk
    // reads columns 16 kk .. 16 kk + 15: column block kk / 4, 32 bytes further per step inside it
    // (the swizzle is applied by the hardware to the whole address). Stride: 8 rows = 1024 bytes.
    // Issued as one commit group; the overlapped main loop waits for it apart from the P V that
    // follows it (wait_scores<1>), the plain one at once (scores).
    __device__ __forceinline__ void issue_scores(float (&s)[kFrags][kNTilesKV][4], const elem_t* sK) const {
        wgmma_fence();
        #pragma unroll
        for (int kk = 0; kk < kKSteps; ++kk) {
            const int at = (kk / 4) * 64, step = (kk % 4) * 16;
            wgmma_scores(s[0], smem_descriptor(sQ + at * kBlockQ + step, 16, 1024),
                         smem_descriptor(sK + k_at + at * kBlockKV + step, 16, 1024), kk > 0);
        }
        wgmma_commit();
    }

    // Wait until at most kPending groups (a P V in flight) remain: S is then complete.
    template <int kPending>
    __device__ __forceinline__ void wait_scores(float (&s)[kFrags][kNTilesKV][4]) const {
        asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(kPending) : "memory");
        fence_registers(s[0]);
    }

    __device__ __forceinline__ void scores(float (&s)[kFrags][kNTilesKV][4], const elem_t* sK) const {
        issue_scores(s, sK);
        wait_scores<0>(s);
    }

    // P, the probabilities, as the A fragments of P V (as with mma.sync: the accumulator layout
    // of two 8-key tiles is the A layout of one 16-key step).
    using PTile = PTileArg;
    __device__ __forceinline__ void pack_p(const float (&s)[kFrags][kNTilesKV][4], PTile& p) const {
        #pragma unroll
        for (int ks = 0; ks < kBlockKV / 16; ++ks) {
            p[0][ks][0] = pack2(s[0][2 * ks][0], s[0][2 * ks][1]);          // row g,     keys 2t, 2t+1
            p[0][ks][1] = pack2(s[0][2 * ks][2], s[0][2 * ks][3]);          // row g + 8, keys 2t, 2t+1
            p[0][ks][2] = pack2(s[0][2 * ks + 1][0], s[0][2 * ks + 1][1]);  // row g,     keys 2t+8, 2t+9
            p[0][ks][3] = pack2(s[0][2 * ks + 1][2], s[0][2 * ks + 1][3]);  // row g + 8, keys 2t+8, 2t+9
        }
    }

    // acc += P V. Step ks reads keys 16 ks .. 16 ks + 15 of V (rows of 128 bytes: 2048 bytes per
    // step). MN-major descriptor: leading offset = from one 64-column block of V to the next
    // (kBlockKV rows of 128 bytes), stride offset = from 8 keys to the next 8 (1024 bytes).
    __device__ __forceinline__ void issue_pv(float (&acc)[kFrags][kNTilesV][4], const PTile& p, const elem_t* sV) const {
        wgmma_fence();
        #pragma unroll
        for (int ks = 0; ks < kBlockKV / 16; ++ks) {
            wgmma_pv(acc[0], p[0][ks], smem_descriptor(sV + v_at + ks * 16 * 64, kBlockKV * 128, 1024));
        }
        wgmma_commit();
    }

    __device__ __forceinline__ void wait_pv(float (&acc)[kFrags][kNTilesV][4]) const {
        wgmma_wait_all();
        fence_registers(acc[0]);
    }

    __device__ __forceinline__ void pv(float (&acc)[kFrags][kNTilesV][4], const PTile& p, const elem_t* sV) const {
        issue_pv(acc, p, sV);
        wait_pv(acc);
    }
};

// ---- section: mask ------------------------------------------------------------------------
// mask window(left=1024, right=16), bottom-right aligned: query i sees key j iff i + (Lk - Lq) - 1024 <= j <= i + (Lk - Lq) + 16.
// key_range: the keys [begin, end) that any row in [r0, r1) may see. The main loop visits only
// the K/V tiles overlapping it, so tiles that are wholly masked are never loaded.
// tile_is_full: every row in [r0, r1) sees every key in [j0, j1), so the tile needs no
// per-element mask. Rows and keys are int. Lengths are at most 2^30 and window sizes are clamped
// to 2^30 by the planner, so the per-element tests stay inside int (windows are compared against
// the distance j - diag(i), never added to a position); key_range, once per block, is 64-bit.
struct Mask {
    int len_q, len_k;
    static constexpr int kLeft = 1024;   // window(left=...)
    static constexpr int kRight = 16;  // window(right=...)

    // Bottom-right alignment: the last query row lines up with the last key. diag(i) = i + (Lk - Lq),
    // the key on row i's diagonal, is in [-2^30, 2^30) for every row i < Lq.
    __device__ __forceinline__ int offset() const { return len_k - len_q; }
    __device__ __forceinline__ int diag(int i) const { return i + offset(); }

    __device__ __forceinline__ bool visible(int i, int j) const {
        const int d = j - diag(i);  // with j < Lk: in (-2^30, 2^31)
        return j < len_k && d >= -kLeft && d <= kRight;
    }

    __device__ __forceinline__ void key_range(int r0, int r1, int& begin, int& end) const {
        begin = (int)min((long long)len_k, max(0LL, (long long)r0 + offset() - kLeft));
        end = (int)max(0LL, min((long long)len_k, (long long)r1 + offset() + kRight));
        if (end < begin) end = begin;
    }

    // The keys j0 + 32 w + b (b < 32) that row i sees, as bit b of out[w]: a partial tile's mask
    // in a few operations per row, so that the score loop tests each score with a constant shift
    // and no branch (section: score transform and mask). The bounds are relative to j0.
    template <int kWords>
    __device__ __forceinline__ void row_bits(int i, int j0, unsigned (&out)[kWords]) const {
        const int d = diag(i) - j0;  // in (-2^31, 2^30)
        // each bound clamped on the side where it cannot reach the tile, so that adding the
        // window (<= 2^30) stays inside int
        const int lo = max(d, -4096) - kLeft, hi = min(len_k - j0, min(d, 4096) + kRight + 1);
        #pragma unroll
        for (int w = 0; w < kWords; ++w) {
            const int a = min(32, max(0, lo - 32 * w)), b = min(32, max(0, hi - 32 * w));
            const unsigned below_b = b >= 32 ? ~0u : (1u << b) - 1u, below_a = a >= 32 ? ~0u : (1u << a) - 1u;
            out[w] = below_b & ~below_a;  // bits [a, b)
        }
    }

    __device__ __forceinline__ bool tile_is_full(int r0, int r1, int j0, int j1) const {
        return j1 <= len_k && j0 - diag(r1 - 1) >= -kLeft && (j1 - 1) - diag(r0) <= kRight;
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
__device__ __forceinline__ void load_rows(elem_t* dst, const RowPtr& row_ptr, int valid_rows, int tid) {
    constexpr int kVec = 16 / static_cast<int>(sizeof(elem_t));
    constexpr int kChunks = kCols / kVec;
    constexpr int kCopies = kRows * kChunks;
    #pragma unroll
    for (int i = 0; i < (kCopies + kCopyThreads - 1) / kCopyThreads; ++i) {
        const int c = tid + i * kCopyThreads;
        if (kCopies % kCopyThreads == 0 || c < kCopies) {
            const int r = c / kChunks, col = (c % kChunks) * kVec;
            const bool valid = r < valid_rows;
            cp_async_16(dst + swizzled<kRows>(r, col), valid ? row_ptr(r) + col : nullptr, valid);
        }
    }
}

// kBlockKV keys from j0 (those below j0 + valid exist; the rest read as zeros).
template <int kCols, int kStride, bool kVarlen>
__device__ __forceinline__ void load_keys(elem_t* dst, const KeyRows<kVarlen>& src, int j0, int valid, int tid) {
    if constexpr (!kVarlen) {
        // Contiguous cache, nothing appended: every tile is one strided copy (no per-tile branch).
        load_tile<kBlockKV, kCols, kStride>(dst, src.stored(j0), src.row_stride, valid, tid);
    } else if (src.strided(j0, min(valid, kBlockKV))) {
        load_tile<kBlockKV, kCols, kStride>(dst, src.row(j0), src.row_stride, valid, tid);
    } else {
        load_rows<kBlockKV, kCols, kStride>(dst, [&](int r) { return src.row(j0 + r); }, valid, tid);
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
    auto word = [&](int r, int c) {
        return reinterpret_cast<uint4*>(tile + swizzled<kBlockKV>(r, c * (16 / static_cast<int>(sizeof(elem_t)))));
    };
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
    fence_async_shared();  // the zeros are read by the tensor cores (async proxy)
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
// Raw dot product -> score in the log2 domain, t = log2(e) * softcap * tanh(scale * s / softcap).
__device__ __forceinline__ float score_transform(float s) {
    return kSoftcapLog2 * tanhf(s * kScaleOverCap);
}

// ---- section: kernel ------------------------------------------------------------------------
// One block computes kBlockQ rows of the output of one (batch, query head), FlashAttention-2
// style (Dao 2023, Algorithm 1): loop over the visible K/V tiles keeping, per row, the running
// max m_i, the running sum l_i of exp2(t - m_i) and the unnormalised output acc; when the max
// grows, rescale l_i and acc by alpha = exp2(m_old - m_new); divide by l_i at the end.
// The score matrix is never stored: each warp holds its kRowsPerWarp x kBlockKV slice in registers.
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
                                          unsigned* __restrict__ work_counter,
                                          const TensorMap& tmap_q,
                                          const TensorMap& tmap_k,
                                          const TensorMap& tmap_v) {
    // The swizzled tiles need 1024-byte alignment: the buffers start at the first such address
    // (the launch asks for 1024 bytes more than the buffers take).
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
    elem_t* sQ = reinterpret_cast<elem_t*>(smem + kOffsetQ);
    elem_t* sK = reinterpret_cast<elem_t*>(smem + kOffsetK);
    elem_t* sV = reinterpret_cast<elem_t*>(smem + kOffsetV);

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int t = lane % 4;                  // this lane's columns: 2t and 2t + 1 of each 8
    const int head_y = blockIdx.y, batch = blockIdx.z;  // query head, batch
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
        if (len_new > 0 && kPass != 2 && blockIdx.x == 0 && head % group == 0) {
            append_rows<kHeadDimQK>(keys, seq.len_k - seq.cached, tid);
            append_rows<kHeadDimV>(values, seq.len_k - seq.cached, tid);
        }
    }
    if (row0 >= n_rows) return;  // packed sequences: the grid covers the longest one

    // ---- section: prologue: load Q ----
    zero_padding<kBlockQ, kHeadDimQK, kHeadDimQKPad, kStrideQ>(sQ, tid);
    #pragma unroll
    for (int st = 0; st < kStages; ++st) {
        zero_padding<kBlockKV, kHeadDimQK, kHeadDimQKPad, kStrideK>(sK + st * kBlockKV * kStrideK, tid);
        zero_padding<kBlockKV, kHeadDimV, kHeadDimVPad, kStrideV>(sV + st * kBlockKV * kStrideV, tid);
    }
    load_tile<kBlockQ, kHeadDimQK, kStrideQ>(sQ, q_row(row0), q_sl, row_end - row0, tid);
    cp_async_commit();
    cp_async_wait<0>();
    fence_async_shared();
    __syncthreads();
    WarpMath math;
    math.init(smem, warp, lane);
    math.load_q(smem, warp);

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

    auto load_kv = [&](int stage, int tile) {
        const int j0 = kv_tile(tile) * kBlockKV;
        load_keys<kHeadDimQK, kStrideK>(sK + stage * kBlockKV * kStrideK, keys, j0, seq.len_k - j0, tid);
        load_keys<kHeadDimV, kStrideV>(sV + stage * kBlockKV * kStrideV, values, j0, seq.len_k - j0, tid);
    };

    // ---- section: main loop over K/V tiles ----
    #pragma unroll
    for (int st = 0; st < kStages - 1; ++st) {
        if (st < n_tiles) load_kv(st, st);
        cp_async_commit();
    }
    for (int it = 0; it < n_tiles; ++it) {
        // -- load K/V tile: issue the copy kStages - 1 tiles ahead, then wait for this one
        const int ahead = it + kStages - 1;
        if (ahead < n_tiles) load_kv(ahead % kStages, ahead);
        cp_async_commit();
        cp_async_wait<kStages - 1>();
        fence_async_shared();  // the tile is read by the tensor cores (async proxy)
        __syncthreads();
        const int stage = it % kStages;
        const int j0 = kv_tile(it) * kBlockKV;

        const bool partial = !mask.tile_is_full(qrow0, qrow_end, j0, j0 + kBlockKV);

        // -- S = Q K^T
        float s[kFrags][kNTilesKV][4];
        math.scores(s, sK + stage * kBlockKV * kStrideK);

        // -- score transform and mask
        // Per row of this lane: in a partial tile, the keys it sees as bits, bit b of word b / 32 for
        // key j0 + 2t + b (the lane's columns 2t, 2t + 1 of each 8 at constant shifts; keys past Lk
        // are 0 bits); in a full tile all ones. The bit is the whole test: no branch in the loop.
        // From the row's key range (Mask::row_bits).
        constexpr int kMaskTileWords = (kBlockKV + 31) / 32;
        #pragma unroll
        for (int mf = 0; mf < kFrags; ++mf) {
            #pragma unroll
            for (int h = 0; h < 2; ++h) {
                unsigned bits[kMaskTileWords];
                if (partial) {
                    mask.row_bits(qi[mf][h], j0 + 2 * t, bits);
                } else {
                    #pragma unroll
                    for (int w = 0; w < kMaskTileWords; ++w) bits[w] = ~0u;
                }
                #pragma unroll
                for (int n = 0; n < kNTilesKV; ++n) {
                    #pragma unroll
                    for (int e = 2 * h; e < 2 * h + 2; ++e) {
                        float x = score_transform(s[mf][n][e]);
                        if (!((bits[n / 4] >> ((n % 4) * 8 + e % 2)) & 1u)) x = neg_inf();
                        s[mf][n][e] = x;
                    }
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
                const float alpha = grows ? exp2_approx(m_i[mf][h] - m_use) : 1.f;
                m_i[mf][h] = m_keep;
                float row_sum = 0.f;
                #pragma unroll
                for (int n = 0; n < kNTilesKV; ++n) {
                    s[mf][n][2 * h] = exp2_approx(s[mf][n][2 * h] - m_use);
                    s[mf][n][2 * h + 1] = exp2_approx(s[mf][n][2 * h + 1] - m_use);
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

        // -- O += P V
        // The block cleans V where a row gives a key of the tile weight 0 (only there can 0 * inf
        // arise in P V; the condition is the same in every warp), and marks the rows that see
        // (p != 0) a key whose V held a non-finite value (section non-finite values).
        {
            unsigned bad[kKeyWords];
            if (__syncthreads_or(zero_weight(s, rows_real))) {
                clean_values<kHeadDimVPad, kStrideV>(sV + stage * kBlockKV * kStrideV, bad, lane);
                mark_bad_rows(row_bad, s, bad, t);
            }
        }
        WarpMath::PTile p;
        math.pack_p(s, p);
        math.pv(acc, p, sV + stage * kBlockKV * kStrideV);
        __syncthreads();  // every warp is done with this stage before it is refilled
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
                    if (n * 8 < kHeadDimV) {
                        store_pair(o_row + n * 8 + 2 * t, acc[mf][n][2 * h] * inv_l, acc[mf][n][2 * h + 1] * inv_l);
                    }
                }
                if (lse != nullptr && t == 0) {
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
attngen_softcap_window_f16(const elem_t* __restrict__ q,
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
                           unsigned* __restrict__ work_counter,
                           const __grid_constant__ TensorMap tmap_q,
                           const __grid_constant__ TensorMap tmap_k,
                           const __grid_constant__ TensorMap tmap_v) {
    padded::attention<0, false>(q, k, v, out, lse, q_sb, q_sl, q_sh, k_sb, k_sl, k_sh, v_sb, v_sl, v_sh, o_sb, o_sl, o_sh, len_q, len_k, heads_q, group, lse_sb, lse_sh, cu_seqlens_q, cu_seqlens_k, kv_lens, k_new, v_new, kn_sb, kn_sl, kn_sh, vn_sb, vn_sl, vn_sh, len_new, rows_q, rows_k, errors, batch_size, work_counter, tmap_q, tmap_k, tmap_v);
}

extern "C" __global__ void __launch_bounds__(varlen::kThreads, 1)
attngen_softcap_window_f16_varlen(const elem_t* __restrict__ q,
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
                                  unsigned* __restrict__ work_counter,
                                  const __grid_constant__ TensorMap tmap_q,
                                  const __grid_constant__ TensorMap tmap_k,
                                  const __grid_constant__ TensorMap tmap_v) {
    varlen::attention<0, true>(q, k, v, out, lse, q_sb, q_sl, q_sh, k_sb, k_sl, k_sh, v_sb, v_sl, v_sh, o_sb, o_sl, o_sh, len_q, len_k, heads_q, group, lse_sb, lse_sh, cu_seqlens_q, cu_seqlens_k, kv_lens, k_new, v_new, kn_sb, kn_sl, kn_sh, vn_sb, vn_sl, vn_sh, len_new, rows_q, rows_k, errors, batch_size, work_counter, tmap_q, tmap_k, tmap_v);
}
