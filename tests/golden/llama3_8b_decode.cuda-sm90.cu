// =============================================================================================
// attngen 0.1.0: flash-attention forward kernel for target cuda (profile cuda-sm90).
// Generated from the spec below; regenerate with `attngen build SPEC --target cuda --kernel llama3_8b_decode` rather than editing.
//
// Spec (normalised, every default filled in):
//   attention llama3_8b_decode {
//       head_dim   128
//       heads      q=32 kv=8
//       dtype      f16
//       accumulate qk=f32 pv=f32
//       mask       causal(bottom_right)
//       softcap    none
//       scale      auto
//       tile       q=auto kv=auto d=auto
//       schedule   split_kv(auto)
//       kv_cache   paged(page=16)
//       target     cuda { warps=auto stages=auto key_warps=auto producer=auto persistent=auto tma=auto backward=auto }
//       target     wgsl { workgroup=auto subgroups=auto f16=auto prefetch=auto }
//   }
//
// Plan: tile q=16 kv=128, 4 warps (128 threads; 4 warps over the keys of each tile, 32 keys each, merged at the end), 2 K/V stage(s), tensor cores (mma.sync m16n8k16).
// Scale 0.08838834764831843; mask causal(bottom_right): query i sees key j iff j <= i + (Lk - Lq).
// Shared memory: 135424 bytes (each buffer 16-byte aligned):
//   sQ at      0: 16 x 136 f16 (the block's rows of Q)
//   sK at   4352: 2 x 128 x 128 f16 (K tiles, one per pipeline stage; 128-byte rows, chunks permuted)
//   sV at  69888: 2 x 128 x 128 f16 (V tiles, one per pipeline stage; 128-byte rows, chunks permuted)
// Grid: (ceil(Lq * G / 16) * S, Hkv, B), 128 threads each; tensors are (batch, seq, heads, head_dim): q (B, Lq, Hq, Dqk), k (B, Lk, Hkv, Dqk), v (B, Lk, Hkv, Dv), out (B, Lq, Hq, Dv); lse (B, Hq, Lq) f32.
// Entry point: attngen_llama3_8b_decode; the manifest (attngen build --emit manifest) lists the parameters in order.
// =============================================================================================
// ---- section: config ----------------------------------------------------------------
// Tile configuration, fixed at compile time. Batch, sequence lengths and head counts are
// run-time parameters; any length >= 1 works (partial tiles are zero-filled and masked).
constexpr int kBlockQ = 16;      // tile q: rows of Q per block
constexpr int kFrags = 1;         // 16-row fragments of Q per warp
constexpr int kRowsPerWarp = 16 * kFrags;
constexpr int kBlockKV = 128;     // tile kv: rows of K and V per iteration of the main loop
constexpr int kWarps = 4;
constexpr int kThreads = 128;    // kWarps * 32
constexpr int kCopyThreads = kThreads;  // threads that copy tiles: all
// Warps over keys (split_kv): the block's kKeyWarps warps own the same rows; each K/V tile is
// loaded by all of them and warp w computes keys [w kWarpKV, (w + 1) kWarpKV) of it with its own
// m_i, l_i and acc, so the block reads kKeyWarps times more keys per barrier than one warp would.
// The warps' partial results are merged at the end of the block (section: merge the key warps).
constexpr int kKeyWarps = 4;
constexpr int kWarpKV = kBlockKV / kKeyWarps;  // keys of each tile per warp
constexpr int kStages = 2;      // K/V tiles in flight (cp.async pipeline depth)
constexpr int kHeadDimQK = 128;    // head dim of q and k
constexpr int kHeadDimV = 128;     // head dim of v and out
constexpr int kHeadDimQKPad = 128; // padded to a multiple of 16 (the k of m16n8k16); padding is zero
constexpr int kHeadDimVPad = 128;
// Shared-memory rows are padded by 16 bytes so that the 8 rows one ldmatrix / float4 read
// touches fall into different banks.
constexpr int kStrideQ = 136;
constexpr int kStrideK = 128;
constexpr int kStrideV = 128;
// K and V are the exception: unpadded rows of whole 128-byte lines, whose 16-byte chunks are
// permuted (section memory: kv_at), so that the copies fill whole lines.
constexpr bool kSwizzleKV = true;
constexpr int kOffsetQ = 0;     // byte offsets into dynamic shared memory (135424 bytes)
constexpr int kOffsetK = 4352;
constexpr int kOffsetV = 69888;
constexpr int kSmemBytes = 135424;
static_assert(kOffsetV + kStages * kBlockKV * kStrideV * 2 <= kSmemBytes, "shared-memory layout");

// Scores are kept in the log2 domain so that exp2 does the softmax: t = s * scale * log2(e).
// scale = 0.08838834764831843 (1 / sqrt(head_dim qk)).
constexpr float kScaleLog2 = 0.12751743082459868f;  // scale * log2(e)
constexpr float kLn2 = 0.6931471805599453f;
// The online softmax keeps a row's max m_i until a tile's passes it by more than kRescaleSlack
// (log2 domain): P = exp2(t - m_i) <= 2^kRescaleSlack (f16 / bf16 hold it with the same relative
// precision), alpha = 1, and acc and l_i are not rescaled; lse = m_i + log2(l_i) stays exact.
constexpr float kRescaleSlack = 8.0f;

static_assert(kBlockQ * kKeyWarps == kWarps * kRowsPerWarp, "each row warp owns kFrags 16-row fragments of Q");
static_assert(kWarpKV % 16 == 0, "each warp's keys are a multiple of 16 (the k of P V)");
static_assert(kBlockKV % 16 == 0, "tile kv must be a multiple of 16 (the k of m16n8k16)");
static_assert(kHeadDimQK % 8 == 0 && kHeadDimV % 8 == 0, "head dims are multiples of 8");
static_assert(kHeadDimQKPad % 16 == 0 && kHeadDimVPad % 16 == 0, "padded head dims");
static_assert(kThreads <= 1024, "threads per block");

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

// ---- section: combine -----------------------------------------------------------------------
// split_kv: with lse_s each split's log-sum-exp (log2 domain) and M their max, w_s = exp2(lse_s - M):
// out = sum_s w_s out_s / sum_s w_s, lse = (M + log2 sum_s w_s) ln 2. A split that saw no key has
// lse_s = -inf and weighs 0; a row no split saw gets out 0 and lse -inf.
// Row r of the workspaces (of `rows` per split) into o_row[0 .. kDv) and *lse_at (null: no lse),
// by one warp: each lane owns 4 output columns of every 128. The workspaces are read with
// ld.global.cg (L2, not L1): with a fused combine, other blocks wrote them during this launch.
template <int kDv>
__device__ __forceinline__ void combine_row(const float* ws_o, const float* ws_lse,
                                            long long rows, long long r, int splits, elem_t* o_row, float* lse_at,
                                            int lane) {
    constexpr int kUnroll = kDv > 256 ? 2 : 4;  // splits merged per step of the output loop
    constexpr int kFewSplits = 4;
    if constexpr (kDv == 128) {  // (wider rows took more registers than the kernels spare: d256 spilled)
        if (splits <= kFewSplits) {
            // Few splits (decode's usual S = 2-4): every split's lse and its float4 of the row
            // loaded at once, so that the last block of a tile waits one L2 round trip for them
            // instead of two (the lse, then the rows); the same formulas as below, summed in split
            // order.
            float ls[kFewSplits];
            float4 x[kFewSplits];
            #pragma unroll
            for (int s = 0; s < kFewSplits; ++s) {
                if (s < splits) {
                    ls[s] = __ldcg(ws_lse + s * rows + r);
                    x[s] = __ldcg(reinterpret_cast<const float4*>(ws_o + (s * rows + r) * kDv + 4 * lane));
                }
            }
            float m = neg_inf();
            #pragma unroll
            for (int s = 0; s < kFewSplits; ++s) if (s < splits) m = fmaxf(m, ls[s]);
            const float m_use = m == neg_inf() ? 0.f : m;  // no inf - inf
            float w[kFewSplits], sum = 0.f;
            #pragma unroll
            for (int s = 0; s < kFewSplits; ++s) {
                w[s] = s < splits ? exp2f(ls[s] - m_use) : 0.f;
                sum += w[s];
            }
            const float inv_sum = sum > 0.f ? 1.f / sum : (sum == 0.f ? 0.f : sum);  // NaN stays NaN
            float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
            #pragma unroll
            for (int s = 0; s < kFewSplits; ++s) {
                if (s < splits) {
                    const float ws = w[s] * inv_sum;
                    a.x += ws * x[s].x;
                    a.y += ws * x[s].y;
                    a.z += ws * x[s].z;
                    a.w += ws * x[s].w;
                }
            }
            store_pair(o_row + 4 * lane, a.x, a.y);
            store_pair(o_row + 4 * lane + 2, a.z, a.w);
            if (lse_at != nullptr && lane == 0) {
                *lse_at = sum > 0.f ? (m + log2f(sum)) * kLn2 : (sum == 0.f ? neg_inf() : sum);
            }
            return;
        }
    }
    float m = neg_inf();
    for (int s = lane; s < splits; s += 32) m = fmaxf(m, __ldcg(ws_lse + s * rows + r));
    #pragma unroll
    for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    const float m_use = m == neg_inf() ? 0.f : m;  // no inf - inf
    float sum = 0.f;
    for (int s = lane; s < splits; s += 32) sum += exp2f(__ldcg(ws_lse + s * rows + r) - m_use);
    #pragma unroll
    for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float inv_sum = sum > 0.f ? 1.f / sum : (sum == 0.f ? 0.f : sum);  // NaN stays NaN
    for (int c = 4 * lane; c < kDv; c += 128) {
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
        // several splits' loads in flight at once (one at a time cost B1 decode 9 us per combine:
        // a latency per split; wholly unrolled, or 4 at a time above 256 columns, ptxas spilled
        // registers: benchmarks/NOTES.md)
        #pragma unroll kUnroll
        for (int s = 0; s < splits; ++s) {
            const float w = exp2f(__ldcg(ws_lse + s * rows + r) - m_use) * inv_sum;
            const float4 x = __ldcg(reinterpret_cast<const float4*>(ws_o + (s * rows + r) * kDv + c));
            a.x += w * x.x;
            a.y += w * x.y;
            a.z += w * x.z;
            a.w += w * x.w;
        }
        store_pair(o_row + c, a.x, a.y);
        store_pair(o_row + c + 2, a.z, a.w);
    }
    if (lse_at != nullptr && lane == 0) {
        *lse_at = sum > 0.f ? (m + log2f(sum)) * kLn2 : (sum == 0.f ? neg_inf() : sum);
    }
}

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

// Element (r, col) of a K or V tile in shared memory (col: a multiple of 16 bytes' worth of
// elements when kSwz): row r at r * kStride; with kSwz (kSwizzleKV: rows of whole 128-byte lines,
// no padding) the 16-byte chunk c of the row sits at c ^ (r % 8), so that the 8 rows one ldmatrix
// reads still fall into 8 different bank groups. Tiles start on rows that are multiples of 8
// (stages, key warps, pages of a multiple of 8 keys), so the pattern is the same from any tile's base.
template <bool kSwz, int kStride>
__device__ __forceinline__ int kv_at(int r, int col) {
    constexpr int kVec = 16 / static_cast<int>(sizeof(elem_t));
    if constexpr (kSwz) return r * kStride + (col ^ ((r & 7) * kVec));
    return r * kStride + col;
}

// The XOR key (r % 8) * kVec of the rows a lane gives ldmatrix (r % 8 == lane % 8 in every
// product's reads), read from %laneid by a volatile instruction: the math recomputes the permuted
// offsets at each use (a LOP3 each) instead of keeping one register per column block across the
// main loop, which spilled registers in the decode kernels.
__device__ __forceinline__ int kv_key() {
    int lane;
    asm volatile("mov.u32 %0, %%laneid;\n" : "=r"(lane));
    return (lane & 7) * (16 / static_cast<int>(sizeof(elem_t)));
}

// kCopyThreads threads (tid < kCopyThreads) copy kRows rows of kCols elements (row r at
// src + r * row_stride) into shared-memory rows of kStride elements. Rows at or past valid_rows are zero-filled, so keys past Lk and
// queries past Lq read as zeros.
template <int kRows, int kCols, int kStride, bool kSwz = false>
__device__ __forceinline__ void load_tile(elem_t* dst, const elem_t* src, long long row_stride,
                                          int valid_rows, int tid) {
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
        const int first = kv_at<kSwz, kStride>(r0, col);
        const long long step = kRowStep * row_stride;
        #pragma unroll
        for (int i = 0; i < (kRows + kRowStep - 1) / kRowStep; ++i, s += step) {
            const int r = r0 + i * kRowStep;
            if (kRows % kRowStep == 0 || r < kRows) {
                const bool valid = r < valid_rows;
                const int at = kRowStep % 8 == 0 ? first + i * kRowStep * kStride
                                                 : kv_at<kSwz, kStride>(r, col);
                cp_async_16(dst + at, valid ? s : src, valid);
            }
        }
    } else {
        #pragma unroll
        for (int i = 0; i < (kCopies + kCopyThreads - 1) / kCopyThreads; ++i) {
            const int c = tid + i * kCopyThreads;
            if (kCopies % kCopyThreads == 0 || c < kCopies) {
                const int r = c / kChunks, col = (c % kChunks) * kVec;
                const bool valid = r < valid_rows;
                cp_async_16(dst + kv_at<kSwz, kStride>(r, col), valid ? src + r * row_stride + col : src, valid);
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
constexpr int kNTilesKV = kWarpKV / 8;        // 8-column tiles of S (this warp's keys of the tile)
constexpr int kNTilesV = kHeadDimVPad / 8;     // 8-column tiles of acc
constexpr int kKStepsQK = kHeadDimQKPad / 16;  // k16 steps of Q K^T

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
    unsigned q_frag[kFrags][kKStepsQK][4];  // the warp's rows of Q as A fragments, loaded once
    int lane;

    __device__ __forceinline__ void init(unsigned char* smem, int warp, int lane_) {
        lane = lane_;
    }

    // A fragment of Q for fragment mf and k step kk. ldmatrix.x4: lanes 0-15 address rows
    // 0-15 of the fragment at column 16 kk, lanes 16-31 the same rows at column 16 kk + 8.
    __device__ __forceinline__ void q_fragment(unsigned (&a)[4], const elem_t* sQ_warp, int mf, int kk) const {
        ldmatrix_x4(a, sQ_warp + (mf * 16 + lane % 16) * kStrideQ + kk * 16 + (lane / 16) * 8);
    }

    // Called once the block's Q tile is in shared memory.
    __device__ __forceinline__ void load_q(unsigned char* smem, int warp) {
        const elem_t* sQ_warp = reinterpret_cast<const elem_t*>(smem + kOffsetQ) + warp * kRowsPerWarp * kStrideQ;
        #pragma unroll
        for (int mf = 0; mf < kFrags; ++mf) {
            #pragma unroll
            for (int kk = 0; kk < kKStepsQK; ++kk) q_fragment(q_frag[mf][kk], sQ_warp, mf, kk);
        }
    }

    // s = Q K^T: raw dot products of the warp's rows with the tile's kBlockKV keys.
    // ldmatrix.x4 on K (row-major [key][dim]) yields B fragments of two 8-key tiles.
    __device__ __forceinline__ void scores(float (&s)[kFrags][kNTilesKV][4], const elem_t* sK) const {
        const int key = kv_key();  // the permuted chunks of K (section memory: kv_at)
        #pragma unroll
        for (int mf = 0; mf < kFrags; ++mf) {
            #pragma unroll
            for (int n = 0; n < kNTilesKV; ++n) s[mf][n][0] = s[mf][n][1] = s[mf][n][2] = s[mf][n][3] = 0.f;
        }
        #pragma unroll
        for (int kk = 0; kk < kKStepsQK; ++kk) {
            #pragma unroll
            for (int np = 0; np < kNTilesKV / 2; ++np) {
                unsigned b[4];
                ldmatrix_x4(b, sK + (np * 16 + (lane / 16) * 8 + lane % 8) * kStrideK + ((kk * 16 + ((lane / 8) % 2) * 8) ^ key));
                #pragma unroll
                for (int mf = 0; mf < kFrags; ++mf) {
                    const unsigned (&a_mf)[4] = q_frag[mf][kk];
                    mma_f32acc(s[mf][2 * np], a_mf, b[0], b[1]);
                    mma_f32acc(s[mf][2 * np + 1], a_mf, b[2], b[3]);
                }
            }
        }
    }

    // P, the probabilities, as the A fragments of P V: the accumulator layout of two 8-key
    // tiles is the A layout of one 16-key step, so P is packed into elem_t pairs in registers
    // right after the softmax (half the registers of the f32 scores it replaces).
    using PTile = unsigned[kFrags][kWarpKV / 16][4];
    __device__ __forceinline__ void pack_p(const float (&s)[kFrags][kNTilesKV][4], PTile& p) const {
        #pragma unroll
        for (int mf = 0; mf < kFrags; ++mf) {
            #pragma unroll
            for (int ks = 0; ks < kWarpKV / 16; ++ks) {
                p[mf][ks][0] = pack2(s[mf][2 * ks][0], s[mf][2 * ks][1]);          // row g,     keys 2t, 2t+1
                p[mf][ks][1] = pack2(s[mf][2 * ks][2], s[mf][2 * ks][3]);          // row g + 8, keys 2t, 2t+1
                p[mf][ks][2] = pack2(s[mf][2 * ks + 1][0], s[mf][2 * ks + 1][1]);  // row g,     keys 2t+8, 2t+9
                p[mf][ks][3] = pack2(s[mf][2 * ks + 1][2], s[mf][2 * ks + 1][3]);  // row g + 8, keys 2t+8, 2t+9
            }
        }
    }

    // acc += P V. ldmatrix.x4.trans on V (row-major [key][dim]) yields B fragments of two 8-dim tiles.
    __device__ __forceinline__ void pv(float (&acc)[kFrags][kNTilesV][4], const PTile& p, const elem_t* sV) const {
        const int key = kv_key();  // the permuted chunks of V (section memory: kv_at)
        #pragma unroll
        for (int ks = 0; ks < kWarpKV / 16; ++ks) {
            #pragma unroll
            for (int dp = 0; dp < kNTilesV / 2; ++dp) {
                unsigned b[4];
                ldmatrix_x4_trans(b, sV + (ks * 16 + lane % 16) * kStrideV + ((dp * 16 + (lane / 16) * 8) ^ key));
                #pragma unroll
                for (int mf = 0; mf < kFrags; ++mf) {
                    mma_f32acc(acc[mf][2 * dp], p[mf][ks], b[0], b[1]);
                    mma_f32acc(acc[mf][2 * dp + 1], p[mf][ks], b[2], b[3]);
                }
            }
        }
    }
};

// 2^x in one MUFU.EX2 (ex2.approx.ftz: results below 2^-126 are 0, which a probability that small
// is anyway next to the row's largest one, 1); exp2f adds a denormal-range fix-up around it.
__device__ __forceinline__ float exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// ---- section: mask ------------------------------------------------------------------------
// mask causal(bottom_right): query i sees key j iff j <= i + (Lk - Lq).
// key_range: the keys [begin, end) that any row in [r0, r1) may see. The main loop visits only
// the K/V tiles overlapping it, so tiles that are wholly masked are never loaded.
// tile_is_full: every row in [r0, r1) sees every key in [j0, j1), so the tile needs no
// per-element mask. Rows and keys are int. Lengths are at most 2^30 and window sizes are clamped
// to 2^30 by the planner, so the per-element tests stay inside int (windows are compared against
// the distance j - diag(i), never added to a position); key_range, once per block, is 64-bit.
struct Mask {
    int len_q, len_k;

    // Bottom-right alignment: the last query row lines up with the last key. diag(i) = i + (Lk - Lq),
    // the key on row i's diagonal, is in [-2^30, 2^30) for every row i < Lq.
    __device__ __forceinline__ int offset() const { return len_k - len_q; }
    __device__ __forceinline__ int diag(int i) const { return i + offset(); }

    __device__ __forceinline__ bool visible(int i, int j) const {
        return j < len_k && j <= diag(i);
    }

    __device__ __forceinline__ void key_range(int r0, int r1, int& begin, int& end) const {
        begin = 0;
        end = (int)max(0LL, min((long long)len_k, (long long)r1 + offset()));
        if (end < begin) end = begin;
    }

    __device__ __forceinline__ bool tile_is_full(int r0, int r1, int j0, int j1) const {
        return j1 <= len_k && j1 - 1 <= diag(r0);
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
// in the cache: page block_table[b][j / kPage], slot j % kPage;
// keys from `cached` on are rows j - cached of k_new / v_new (appended in this call: every
// block reads them there, so the writes of the appending blocks never race with the reads).
// Without kVarlen (see Seq) nothing is appended: every key is in the cache.
constexpr int kPage = 16;  // kv_cache paged(page=...): keys per page
template <bool kVarlen>
struct KeyRows {
    const elem_t* cache;   // key 0's row in page 0 (add the page's offset)
    long long row_stride;  // stride between consecutive keys of a page
    long long page_stride; // stride between pages
    const int* pages;      // the sequence's row of block_table
    const elem_t* fresh;   // k_new / v_new at (batch, row 0, KV head) (kVarlen, len_new > 0)
    long long fresh_stride;
    int cached;

    // Where key j sits in the cache (also for j >= cached: where the append stores it).
    __device__ __forceinline__ const elem_t* stored(int j) const {
        return cache + pages[j / kPage] * page_stride + (long long)(j % kPage) * row_stride;
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
        return n > 0 && (!kVarlen || j0 + n <= cached) && j0 / kPage == (j0 + n - 1) / kPage;
    }
};

// A device block table is checked where it is used: the pages of keys [j0, j1) must lie in
// k / v (num_pages of them), and, when this call appends (len_k > cached), the append's pages
// must appear nowhere else in that range (the append would overwrite keys still read). The
// blocks that append check the sequence's whole row first (nothing is written if it is bad);
// the others check the keys they read. Every thread of the block calls it; false: the block
// reports kErrBlockTable and returns.
template <bool kVarlen>
__device__ __forceinline__ bool pages_ok(const KeyRows<kVarlen>& rows, int j0, int j1, int len_k, int num_pages,
                                         int tid) {
    bool bad = false;
    const int a0 = rows.cached / kPage, a1 = len_k > rows.cached ? (len_k + kPage - 1) / kPage : a0;
    for (int p = j0 / kPage + tid; p < (j1 + kPage - 1) / kPage; p += kThreads) {
        const int page = rows.pages[p];
        bad |= page < 0 || page >= num_pages;
        for (int a = a0; a < a1; ++a) bad |= a != p && rows.pages[a] == page;
    }
    return !__syncthreads_or(bad);
}

// Like load_tile, with row r at row_ptr(r) (a gather: paged keys, appended keys, rows of the
// heads of a GQA group). Rows at or past valid_rows are zero-filled.
template <int kRows, int kCols, int kStride, bool kSwz = false, class RowPtr>
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
            cp_async_16(dst + kv_at<kSwz, kStride>(r, col), valid ? row_ptr(r) + col : nullptr, valid);
        }
    }
}

// The block-table entries of a tile's pages, read one tile before its copies are issued (the
// main loop), so that the lookups are not on the critical path of each iteration. Entries of
// pages past the sequence's keys are not read (they may lie past the table's row).
constexpr int kTilePages = kBlockKV / kPage;
struct TilePages {
    int page[kTilePages];
};
template <bool kVarlen>
__device__ __forceinline__ TilePages tile_pages(const KeyRows<kVarlen>& src, int j0, int valid) {
    TilePages tp;
    #pragma unroll
    for (int pg = 0; pg < kTilePages; ++pg) tp.page[pg] = valid > pg * kPage ? src.pages[j0 / kPage + pg] : 0;
    return tp;
}

// kBlockKV keys from j0 (those below j0 + valid exist; the rest read as zeros).
// tp: the tile's pages (tile_pages).
template <int kCols, int kStride, bool kVarlen>
__device__ __forceinline__ void load_keys(elem_t* dst, const KeyRows<kVarlen>& src, int j0, int valid, int tid, const TilePages& tp) {
    if (src.strided(j0, min(valid, kBlockKV))) {
        load_tile<kBlockKV, kCols, kStride, kSwizzleKV>(dst, src.row(j0), src.row_stride, valid, tid);
    } else if (!kVarlen || j0 + min(valid, kBlockKV) <= src.cached) {
        // The tile is whole pages of the cache (j0 is a multiple of kPage): one strided copy per
        // page, not a gather per row. A page past the sequence's keys is zero-filled without
        // reading its block-table entry (which may lie past the row).
        #pragma unroll
        for (int pg = 0; pg < kBlockKV / kPage; ++pg) {
            const int rows = valid - pg * kPage;
            load_tile<kPage, kCols, kStride, kSwizzleKV>(dst + pg * kPage * kStride, src.cache + tp.page[pg] * src.page_stride,
                                             src.row_stride, rows, tid);
        }
    } else {
        load_rows<kBlockKV, kCols, kStride, kSwizzleKV>(dst, [&](int r) { return src.row(j0 + r); }, valid, tid);
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

// Warps over keys: warp w's P V reads only the rows of its own kWarpKV keys of a tile (`rows`: the
// first), so it cleans them itself, with no block barrier: lane l scans rows l, l + 32, .. and
// zeroes their non-finite values (a lane writes only rows it alone reads), and the warp learns
// which of its keys held them (`bad`: bit j of word w = its key 32 w + j). A lane reads its row's
// 16-byte words from word `lane` on, so that the lanes of one read hit different banks (the rows
// may be 256 bytes apart). The common case, nothing to zero, writes nothing.
constexpr int kWarpKeyWords = (kWarpKV + 31) / 32;
template <int kCols, int kStride>
__device__ __forceinline__ void clean_values_warp(elem_t* rows, unsigned (&bad)[kWarpKeyWords], int lane) {
    constexpr int kWordsPerRow = kCols * static_cast<int>(sizeof(elem_t)) / 16;  // uint4 per row
    static_assert(kCols * sizeof(elem_t) % 16 == 0, "rows of whole 16-byte words");
    #pragma unroll
    for (int w = 0; w < kWarpKeyWords; ++w) {
        const int r = w * 32 + lane;
        bool found = false;
        if (r < kWarpKV) {
            #pragma unroll 4
            for (int i = 0; i < kWordsPerRow; ++i) {
                if (scrub_word(reinterpret_cast<uint4*>(rows + r * kStride) + (i + lane) % kWordsPerRow)) found = true;
            }
        }
        bad[w] = __ballot_sync(0xffffffffu, found);
    }
    __syncwarp();  // the zeros are written before any lane's P V reads the rows
}

// ---- section: score transform --------------------------------------------------------------
// Raw dot product -> score in the log2 domain, t = log2(e) * scale * s.
// The softmax applies it itself, p = exp2(fmaf(s, kScaleLog2, -m_i)), with the row max taken on
// the raw products (the scale is positive): one FFMA per score (section online softmax).

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
                                          const int* __restrict__ block_table,
                                          int bt_stride,
                                          float* __restrict__ ws_o,
                                          float* __restrict__ ws_lse,
                                          int splits,
                                          unsigned* __restrict__ tile_counters) {
    extern __shared__ __align__(16) unsigned char smem[];
    elem_t* sQ = reinterpret_cast<elem_t*>(smem + kOffsetQ);
    elem_t* sK = reinterpret_cast<elem_t*>(smem + kOffsetK);
    elem_t* sV = reinterpret_cast<elem_t*>(smem + kOffsetV);

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int t = lane % 4;                  // this lane's columns: 2t and 2t + 1 of each 8
    const int key_warp = warp % kKeyWarps, row_warp = warp / kKeyWarps;  // warps over keys (section config)
    const int head_y = blockIdx.y, batch = blockIdx.z;  // KV head, batch
    // split schedules: grid.x = row tiles x splits; this block does split `split` of its tile's keys
    const int q_tile = blockIdx.x / splits, split = blockIdx.x % splits;

    // ---- section: sequences ----
    const Seq seq = sequence<kVarlen>(batch, len_q, len_k, cu_seqlens_q, cu_seqlens_k, kv_lens, len_new);
    if constexpr (kVarlen) {
        if (!sequence_ok(seq, batch, len_q, len_k, cu_seqlens_q, cu_seqlens_k, kv_lens, len_new, rows_q, rows_k,
                         errors)) {
            return;  // bad integer inputs on the device: reported, nothing of this sequence is touched
        }
    }
    // The block's rows are (query row i, head in group g) pairs p = i * group + g of one KV head:
    // the query heads of a GQA group share every K/V tile the block loads.
    const int kv_head = head_y, n_rows = seq.len_q * group;
    auto query_of = [&](int p) { return p / group; };
    auto head_of = [&](int p) { return kv_head * group + p % group; };
    auto q_row = [&](int p) {
        return q + batch * q_sb + (long long)(seq.q_start + query_of(p)) * q_sl + head_of(p) * q_sh;
    };
    const int row0 = q_tile * kBlockQ;       // the block's first row
    const int row_end = min(row0 + kBlockQ, n_rows);
    // This lane's rows: row_a + 16 mf + 8 h for fragment mf < kFrags and half h < 2.
    const int row_a = row0 + row_warp * kRowsPerWarp + lane / 4;

    // ---- section: key rows ----
    auto key_rows = [&](const elem_t* cache, long long sb, long long sl, long long sh, const elem_t* fresh,
                        long long fb, long long fl, long long fh) {
        KeyRows<kVarlen> r;
        r.cache = cache + kv_head * sh;
        r.row_stride = sl;
        r.page_stride = sb;
        r.pages = block_table + (long long)batch * bt_stride;
        r.fresh = kVarlen && fresh != nullptr ? fresh + batch * fb + kv_head * fh : nullptr;
        r.fresh_stride = fl;
        r.cached = seq.cached;
        return r;
    };
    const KeyRows<kVarlen> keys = key_rows(k, k_sb, k_sl, k_sh, k_new, kn_sb, kn_sl, kn_sh);
    const KeyRows<kVarlen> values = key_rows(v, v_sb, v_sl, v_sh, v_new, vn_sb, vn_sl, vn_sh);
    // The first block-table entries of this split's share when the sequence fills its pages
    // (len_k: the table's pages x kPage), prefetched into L1 now, while kv_lens and so the real
    // share are on their way: the check of the pages and the first tiles' lookups find them there
    // when the sequence is about that long. (Entries below len_k / kPage lie in the row.)
    if (tid < 2) {
        const int tiles = (len_k + kBlockKV - 1) / kBlockKV, per = (tiles + splits - 1) / splits;
        const int entry = min(split * per, tiles) * (kBlockKV / kPage) + tid * 32;
        if (entry < len_k / kPage) asm volatile("prefetch.global.L1 [%0];\n" :: "l"(keys.pages + entry));
    }
    if constexpr (kVarlen) {
        // Append k_new / v_new to the cache: the blocks of the first row tile of each (sequence, KV head).
        if (len_new > 0 && kPass != 2 && blockIdx.x == 0) {
            if (!pages_ok(keys, 0, seq.len_k, seq.len_k, rows_k, tid)) {  // the whole row: before any write
                report(errors, kErrBlockTable, batch);
                // no return: every split block of a row tile must count itself (section combine);
                // this block skips the append, and its own keys are checked below
            } else {
                append_rows<kHeadDimQK>(keys, seq.len_k - seq.cached, tid);
                append_rows<kHeadDimV>(values, seq.len_k - seq.cached, tid);
            }
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
    load_rows<kBlockQ, kHeadDimQK, kStrideQ>(sQ, [&](int r) { return q_row(row0 + r); }, row_end - row0, tid);
    cp_async_commit();
    // Q is waited for after the first K/V tiles' copies are issued (section main loop), so
    // that they do not wait a memory latency behind it.
    WarpMath math;
    math.init(smem, row_warp, lane);

    // ---- section: loop bounds (mask) ----
    const Mask mask{seq.len_q, seq.len_k};  // aligned to this sequence's own lengths
    const int qrow0 = query_of(row0), qrow_end = query_of(row_end - 1) + 1;  // the block's query rows
    int kv_begin, kv_end;
    mask.key_range(qrow0, qrow_end, kv_begin, kv_end);
    int tile_first = kv_begin / kBlockKV;
    int n_tiles = kv_end > kv_begin ? (kv_end + kBlockKV - 1) / kBlockKV - tile_first : 0;
    {
        // This split's share of the tiles: the next `per` after split * per.
        const int per = (n_tiles + splits - 1) / splits;
        const int skip = min(n_tiles, split * per);
        tile_first += skip;
        n_tiles = min(n_tiles - skip, per);
    }
    // The kv tile of iteration it.
    auto kv_tile = [&](int it) { return tile_first + it; };
    if constexpr (kVarlen) {
        // The block table is on the device: check the pages of the keys this block reads.
        if (n_tiles > 0 && !pages_ok(keys, kv_tile(0) * kBlockKV,
                                     min((kv_tile(n_tiles - 1) + 1) * kBlockKV, seq.cached), seq.len_k, rows_k, tid)) {
            report(errors, kErrBlockTable, batch);
            n_tiles = 0;  // reads no key; still counts itself for the combine (section combine)
        }
    }
    // This lane's query rows, and (split schedules) its rows of the workspaces; -1: past the block's rows.
    int qi[kFrags][2];
    long long ws_row[kFrags][2];
    unsigned rows_real = 0u;  // bit 2 mf + h: this lane's row (mf, h) is one of the block's rows (not padding)
    #pragma unroll
    for (int mf = 0; mf < kFrags; ++mf) {
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int p = row_a + 16 * mf + 8 * h;
            qi[mf][h] = query_of(p);
            ws_row[mf][h] = p < row_end ? ((long long)batch * heads_q + head_of(p)) * len_q + qi[mf][h] : -1;
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

    auto load_kv = [&](int stage, int tile, const TilePages& tp) {
        const int j0 = kv_tile(tile) * kBlockKV;
        load_keys<kHeadDimQK, kStrideK>(sK + stage * kBlockKV * kStrideK, keys, j0, seq.len_k - j0, tid, tp);
        load_keys<kHeadDimV, kStrideV>(sV + stage * kBlockKV * kStrideV, values, j0, seq.len_k - j0, tid, tp);
    };
    // The block-table entries of tile `tile` (K and V share the table), for load_kv.
    auto pages_of = [&](int tile) {
        const int j0 = kv_tile(tile) * kBlockKV;
        return tile_pages(keys, j0, seq.len_k - j0);
    };

    // ---- section: main loop over K/V tiles ----
    #pragma unroll
    for (int st = 0; st < kStages - 1; ++st) {
        if (st < n_tiles) load_kv(st, st, pages_of(st));
        cp_async_commit();
    }
    // Q has landed once at most the kStages - 1 K/V groups just issued are still in flight
    // (its copies are the oldest group).
    cp_async_wait<kStages - 1>();
    __syncthreads();
    math.load_q(smem, row_warp);
    // the pages of the next tile to copy, read one iteration before its copies are issued
    TilePages next_pages = kStages - 1 < n_tiles ? pages_of(kStages - 1) : TilePages{};
    for (int it = 0; it < n_tiles; ++it) {
        // -- load K/V tile: issue the copy kStages - 1 tiles ahead, then wait for this one
        const int ahead = it + kStages - 1;
        if (ahead < n_tiles) {
            load_kv(ahead % kStages, ahead, next_pages);
            if (ahead + 1 < n_tiles) next_pages = pages_of(ahead + 1);
        }
        cp_async_commit();
        cp_async_wait<kStages - 1>();
        __syncthreads();
        const int stage = it % kStages;
        const int tile_j0 = kv_tile(it) * kBlockKV;
        const int j0 = tile_j0 + key_warp * kWarpKV;  // this warp's keys of the tile

        const bool partial = !mask.tile_is_full(qrow0, qrow_end, j0, j0 + kWarpKV);  // this warp's keys need the mask

        // -- S = Q K^T
        float s[kFrags][kNTilesKV][4];
        math.scores(s, sK + (stage * kBlockKV + key_warp * kWarpKV) * kStrideK);

        // -- mask: keys a row does not see get -inf in partial tiles; full tiles keep their raw
        // products (the scale is applied in the softmax's exp2 argument: section score transform)
        if (partial) {
        #pragma unroll
        for (int mf = 0; mf < kFrags; ++mf) {
            #pragma unroll
            for (int n = 0; n < kNTilesKV; ++n) {
                #pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int i = qi[mf][e / 2], j = j0 + n * 8 + 2 * t + e % 2;
                    float x = s[mf][n][e];
                    if (!mask.visible(i, j)) x = neg_inf();
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
                // the raw products' max, then in the log2 domain (kScaleLog2 > 0 keeps the order)
                float m_raw = neg_inf();
                #pragma unroll
                for (int n = 0; n < kNTilesKV; ++n) {
                    m_raw = fmaxf(m_raw, fmaxf(s[mf][n][2 * h], s[mf][n][2 * h + 1]));
                }
                m_raw = fmaxf(m_raw, __shfl_xor_sync(0xffffffffu, m_raw, 1));  // the 4 lanes of a row
                m_raw = fmaxf(m_raw, __shfl_xor_sync(0xffffffffu, m_raw, 2));
                const float m_new = fmaxf(m_i[mf][h], m_raw * kScaleLog2);
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
                    // t - m_i with t = kScaleLog2 * s: one FFMA (section score transform)
                    s[mf][n][2 * h] = exp2_approx(fmaf(s[mf][n][2 * h], kScaleLog2, -m_use));
                    s[mf][n][2 * h + 1] = exp2_approx(fmaf(s[mf][n][2 * h + 1], kScaleLog2, -m_use));
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
        // Each key warp cleans the V rows of its own keys, the only ones its P V reads (no block
        // barrier), where a row of the block gives one of them weight 0: only there can 0 * inf arise,
        // and marks the rows that see (p != 0) a key whose V held a non-finite value.
        {
            unsigned bad[kWarpKeyWords];  // bit j: the warp's key j
            if (__any_sync(0xffffffffu, zero_weight(s, rows_real))) {
                clean_values_warp<kHeadDimVPad, kStrideV>(sV + (stage * kBlockKV + key_warp * kWarpKV) * kStrideV, bad, lane);
                mark_bad_rows(row_bad, s, bad, t);
            }
        }
        WarpMath::PTile p;
        math.pack_p(s, p);
        math.pv(acc, p, sV + (stage * kBlockKV + key_warp * kWarpKV) * kStrideV);
        __syncthreads();  // every warp is done with this stage before it is refilled
    }

    // ---- section: merge the key warps ----
    // Warp w saw its kWarpKV keys of every tile: its (m_i, l_i, acc) are a softmax over those keys
    // alone. With M = max_w m_w and f_w = exp2(m_w - M), the block's row has l = sum_w f_w l_w and
    // acc = sum_w f_w acc_w (the split combine's rule, inside the block). The K/V stages, free
    // now, take every warp's values (value x of a lane at x * 32 + lane: the same positions in
    // every warp); warp 0 merges them and runs the epilogue.
    constexpr int kMergeVals = kFrags * (4 + 4 * kNTilesV) + 1;  // floats per lane
    static_assert(kOffsetK + kKeyWarps * kMergeVals * 32 * 4 <= kSmemBytes, "the merge fits in the K/V stages");
    float* merge = reinterpret_cast<float*>(smem + kOffsetK);
    __syncthreads();  // every warp is done with the last tile's K and V
    {
        float* mine = merge + key_warp * kMergeVals * 32 + lane;
        #pragma unroll
        for (int mf = 0; mf < kFrags; ++mf) {
            #pragma unroll
            for (int h = 0; h < 2; ++h) {
                mine[((mf * 2 + h) * 2) * 32] = m_i[mf][h];
                mine[((mf * 2 + h) * 2 + 1) * 32] = l_i[mf][h];
            }
            #pragma unroll
            for (int n = 0; n < kNTilesV; ++n) {
                #pragma unroll
                for (int e = 0; e < 4; ++e) mine[(kFrags * 4 + (mf * kNTilesV + n) * 4 + e) * 32] = acc[mf][n][e];
            }
        }
        mine[(kMergeVals - 1) * 32] = __uint_as_float(row_bad);
    }
    __syncthreads();
    // every key warp merges (and stores, section epilogue) kNTilesVPerKeyWarp of the 8-column
    // tiles of acc: a quarter of the work each, in parallel
    constexpr int kNTilesVPerKeyWarp = kNTilesV / kKeyWarps;
    {
        const float* all = merge + lane;  // warp w's value x at all[(w * kMergeVals + x) * 32]
        float f[kKeyWarps][kFrags][2];    // each warp's weight f_w per row
        #pragma unroll
        for (int mf = 0; mf < kFrags; ++mf) {
            #pragma unroll
            for (int h = 0; h < 2; ++h) {
                float m = neg_inf();
                #pragma unroll
                for (int w = 0; w < kKeyWarps; ++w) m = fmaxf(m, all[(w * kMergeVals + (mf * 2 + h) * 2) * 32]);
                const float m_use = m == neg_inf() ? 0.f : m;  // no inf - inf
                float l = 0.f;
                #pragma unroll
                for (int w = 0; w < kKeyWarps; ++w) {
                    f[w][mf][h] = exp2f(all[(w * kMergeVals + (mf * 2 + h) * 2) * 32] - m_use);
                    l += f[w][mf][h] * all[(w * kMergeVals + (mf * 2 + h) * 2 + 1) * 32];
                }
                m_i[mf][h] = m;
                l_i[mf][h] = l;
            }
            #pragma unroll
            for (int n = 0; n < kNTilesV; ++n) {
                if (n / kNTilesVPerKeyWarp != key_warp) continue;
                #pragma unroll
                for (int e = 0; e < 4; ++e) {
                    float a = 0.f;
                    #pragma unroll
                    for (int w = 0; w < kKeyWarps; ++w) a += f[w][mf][e / 2] * all[(w * kMergeVals + kFrags * 4 + (mf * kNTilesV + n) * 4 + e) * 32];
                    acc[mf][n][e] = a;
                }
            }
        }
        #pragma unroll
        for (int w = 0; w < kKeyWarps; ++w) row_bad |= __float_as_uint(all[(w * kMergeVals + kMergeVals - 1) * 32]);
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
                // This split's partial result (f32) in the workspaces; the last split block of the tile (section combine) merges them.
                const long long at = split * ((long long)gridDim.z * heads_q * len_q) + ws_row[mf][h];
                {
                    float* o_ws = ws_o + at * kHeadDimV;
                    #pragma unroll
                    for (int n = 0; n < kNTilesV; ++n) {
                        if (n / kNTilesVPerKeyWarp == key_warp && n * 8 < kHeadDimV) {
                            *reinterpret_cast<float2*>(o_ws + n * 8 + 2 * t) =
                                make_float2(acc[mf][n][2 * h] * inv_l, acc[mf][n][2 * h + 1] * inv_l);
                        }
                    }
                }
                if (t == 0 && key_warp == 0) ws_lse[at] = l > 0.f ? m_i[mf][h] + log2f(l) : (l == 0.f ? neg_inf() : l);
            }
        }
    }

    // ---- section: combine (fused: the last split block of each row tile) ----
    // The tile's S split blocks each count themselves in tile_counters[tile] once their partial
    // results are stored; the last one merges them (combine_row) into out and lse, so there is no
    // second launch. atomicInc with the limit S - 1 wraps the count back to 0 at the last split:
    // the buffer is left as it was found (the runtime hands each stream a zeroed one). Every
    // block of the tile gets here (bad integer inputs that stop a block stop all of its tile's).
    {
        // Every warp of the block gets here (the key warps too: the rows are merged one per warp).
        const long long tile = ((long long)blockIdx.z * gridDim.y + blockIdx.y) * (gridDim.x / splits) + q_tile;
        __threadfence();  // this block's partial results, visible before its count
        unsigned* ticket = reinterpret_cast<unsigned*>(smem);  // free: the main loop is over
        __syncthreads();  // every warp stored its rows (and is done with shared memory)
        if (tid == 0) *ticket = atomicInc(tile_counters + tile, splits - 1);
        __syncthreads();
        if (*ticket != (unsigned)(splits - 1)) return;
        __threadfence();  // the other splits' results, read below (through L2: combine_row)
        const long long rows = (long long)gridDim.z * heads_q * len_q;
        for (int p = row0 + warp; p < row_end; p += kWarps) {
            const int i = query_of(p), hh = head_of(p);
            combine_row<kHeadDimV>(ws_o, ws_lse, rows, ((long long)batch * heads_q + hh) * len_q + i, splits,
                                   out + batch * o_sb + hh * o_sh + (long long)(seq.q_start + i) * o_sl,
                                   lse != nullptr ? lse + batch * lse_sb + hh * lse_sh + seq.q_start + i : nullptr,
                                   lane);
        }
    }
}

// ---- section: entry points ------------------------------------------------------------------
// One instantiation serves every launch of this kind (padded, packed, kv_lens, appends).
extern "C" __global__ void __launch_bounds__(kThreads, 1)
attngen_llama3_8b_decode(const elem_t* __restrict__ q,
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
                         const int* __restrict__ block_table,
                         int bt_stride,
                         float* __restrict__ ws_o,
                         float* __restrict__ ws_lse,
                         int splits,
                         unsigned* __restrict__ tile_counters) {
    attention<0, true>(q, k, v, out, lse, q_sb, q_sl, q_sh, k_sb, k_sl, k_sh, v_sb, v_sl, v_sh, o_sb, o_sl, o_sh, len_q, len_k, heads_q, group, lse_sb, lse_sh, cu_seqlens_q, cu_seqlens_k, kv_lens, k_new, v_new, kn_sb, kn_sl, kn_sh, vn_sb, vn_sl, vn_sh, len_new, rows_q, rows_k, errors, block_table, bt_stride, ws_o, ws_lse, splits, tile_counters);
}
