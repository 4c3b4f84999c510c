// =============================================================================================
// attngen 0.1.0: flash-attention forward kernel for target wgsl (profile wgpu-vulkan-nvidia).
// Generated from the spec below; regenerate with `attngen build SPEC --target wgsl --kernel mistral_7b_prefill` rather than editing.
//
// Spec (normalised, every default filled in):
//   attention mistral_7b_prefill {
//       head_dim   128
//       heads      q=32 kv=8
//       dtype      f16
//       accumulate qk=f32 pv=f32
//       mask       window(left=4096, right=0)
//       softcap    none
//       scale      auto
//       tile       q=auto kv=auto d=auto
//       schedule   fused
//       kv_cache   contiguous
//       target     cuda { warps=auto stages=auto key_warps=auto producer=auto persistent=auto tma=auto backward=auto }
//       target     wgsl { workgroup=auto subgroups=auto f16=auto prefetch=auto }
//   }
//
// Plan: tile q=128 kv=64, workgroup 256 (32 row groups x 8 invocations per row), sub-block 4 row(s) x 8 key(s) of S and 4 x 16 columns of acc per invocation, row max and sum over subgroup shuffles, the next tiles prefetched into registers.
// Scale 0.08838834764831843; mask window(left=4096, right=0), bottom-right aligned: query i sees key j iff i + (Lk - Lq) - 4096 <= j <= i + (Lk - Lq) + 0.
// Workgroup memory: 48672 bytes (each buffer 16-byte aligned):
//   sQ               at      0: 128 x 36 f16 (one d-chunk of the Q tile)
//   sKV              at   9216: 64 x 36 f16 (one d-chunk of the current K tile, then of the V tile)
//   sP               at  13824: 128 x 68 f32 (probabilities P of the tile, for P V)
//   p_zero_tile      at  48640: 1 x 1 u32 (the last tile in which some p was 0 (it + 1))
//   v_nonfinite_tile at  48656: 1 x 1 u32 (the last tile whose V holds inf or NaN (it + 1))
// Register tiling: sub-block 4 row(s) x 8 key(s) of S and 4 x 16 columns of acc per invocation; its loops unrolled (the profile's dialect).
// Head dim: tile d=32 (chosen: the whole head dim does not fit): Q and K in 4 chunk(s) of 32, V in 4 of 32.
// Grid: (ceil(Lq / 128), Hq, B), 256 threads each; tensors are (batch, seq, heads, head_dim): q (B, Lq, Hq, Dqk), k (B, Lk, Hkv, Dqk), v (B, Lk, Hkv, Dv), out (B, Lq, Hq, Dv); lse (B, Hq, Lq) f32.
// Entry point: attngen_mistral_7b_prefill; the manifest (attngen build --emit manifest) lists the parameters in order.
// =============================================================================================
enable f16;

// ---- section: config ------------------------------------------------------------------------
// Tile configuration, fixed at compile time. Batch, sequence lengths and head counts are
// run-time values in `params`; any length >= 1 works (partial tiles are zero-filled and masked).
const TILE_Q: u32 = 128u;           // tile q: rows of Q per workgroup
const TILE_KV: u32 = 64u;          // tile kv: rows of K and V per iteration of the main loop
const HEAD_DIM_QK: u32 = 128u;      // head dim of q and k
const HEAD_DIM_V: u32 = 128u;       // head dim of v and out
// Register tiling: the workgroup is ROW_GROUPS x THREADS_PER_ROW invocations; invocation
// (tr, tc) = (lid / THREADS_PER_ROW, lid % THREADS_PER_ROW) owns the ROWS rows tr + ROW_GROUPS * i
// of the tile, the KEYS keys tc + THREADS_PER_ROW * u of each K/V tile (its block of S), and the
// column groups tc + THREADS_PER_ROW * w (4 columns each, vec4) of acc: sub-block 4 row(s) x 8 key(s) of S and 4 x 16 columns of acc per invocation.
const WORKGROUP_SIZE: u32 = 256u;  // ROW_GROUPS * THREADS_PER_ROW
const THREADS_PER_ROW: u32 = 8u;   // invocations sharing one row of the tile (a power of two)
const ROW_GROUPS: u32 = 32u;       // TILE_Q / ROWS
const ROWS: u32 = 4u;              // rows of the tile per invocation
const KEYS: u32 = 8u;              // keys of each K/V tile per invocation: TILE_KV / THREADS_PER_ROW
// Output columns: V_BLOCKS workgroups share a tile of rows, each computing V_COLS columns of out
// (grid.y = Hq * V_BLOCKS, head-major), so that an invocation keeps at most 64
// accumulators. Each recomputes the rows' scores; only the first writes lse.
const V_BLOCKS: u32 = 1u;          // workgroups per (row tile, query head)
const V_COLS: u32 = 128u;          // HEAD_DIM_V / V_BLOCKS
// tile d=32 (chosen by the planner: the whole head dim does not fit):
// Q, K and V pass through workgroup memory in chunks of columns, so it holds TILE_Q x chunk and
// TILE_KV x chunk elements whatever the head dim. A head dim narrower than tile d is one chunk.
const TILE_D: u32 = 32u;           // tile d: head-dim columns per chunk
const TILE_DQK: u32 = 32u;         // columns of Q and K per chunk: min(TILE_D, HEAD_DIM_QK)
const TILE_DV: u32 = 32u;          // columns of V per chunk: min(TILE_D, V_COLS)
const D_TILES_QK: u32 = 4u;       // HEAD_DIM_QK / TILE_DQK chunks of Q and K per K/V tile
const D_TILES_V: u32 = 4u;        // V_COLS / TILE_DV chunks of V per K/V tile
const COL_GROUPS: u32 = 1u;       // vec4 column groups per invocation in a chunk of V
const ACC_GROUPS: u32 = 4u;       // vec4 column groups of acc per invocation in all
// Workgroup memory is read as vec4 (4 dims of a row of Q or K, 4 columns of a row of V).
// Rows of sQ and sK are 4 elements longer than the data so that invocations reading different rows at the same column hit different banks.
const Q_STRIDE: u32 = 9u;        // vec4 per row of sQ
const K_STRIDE: u32 = 9u;        // vec4 per row of sK
const V_STRIDE: u32 = 8u;        // vec4 per row of sV
// Registers (vec4) per invocation holding the next step's tiles (section prefetch): each of the
// WORKGROUP_SIZE invocations copies item lid + n * WORKGROUP_SIZE of a tile, n < *_ITEMS.
const K_ITEMS: u32 = 2u;
const V_ITEMS: u32 = 2u;
const Q_ITEMS: u32 = 4u;
const P_STRIDE: u32 = 17u;        // vec4 (4 consecutive keys) per row of sP
// Loops over the dims run in chunks of at most 8 vec4 iterations. Mesa's software
// Vulkan (llvmpipe, what CI runs WGSL on) unrolls loops that short and stops all loops of a
// shader after 65535 iterations in total; unrolled loops do not count, so chunking keeps long
// sequences within that budget. Other drivers unroll or not as they like.
const DIM_CHUNK_QK: u32 = 8u;     // divides TILE_DQK / 4
const KEY_CHUNK: u32 = 4u;       // divides TILE_KV / 4 (P V takes keys 4 at a time)

// Scores are kept in the log2 domain so that exp2 does the softmax: t = s * scale * log2(e).
// scale = 0.08838834764831843 (1 / sqrt(head_dim qk)).
const SCALE_LOG2: f32 = 0.12751743082459868;  // scale * log2(e)
const LN2: f32 = 0.6931471805599453;       // ln(2): lse = m_i * ln(2) + ln(l_i)
// WGSL implementations may assume that no value is infinite (and a const-expression cannot
// even be -inf), so the kernel marks masked scores and "no maximum yet" with this finite
// sentinel and selects p = 0 for it explicitly. Real scores are far above it.
const MASKED: f32 = -3.0e38;
// The bits of -inf, written to lse for rows that see no key (built at run time, see epilogue).
const NEG_INF_BITS: u32 = 0xff800000u;
// The bits of a quiet NaN, written to out and lse of a row whose result is undefined: it saw a
// NaN (or a +inf score) among the keys it sees. Tested on bits, not with float compares, which
// implementations that assume finite math may fold away.
const NAN_BITS: u32 = 0x7fc00000u;

fn is_nan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

// A score that makes its row's result undefined: NaN or +inf (a -inf score only gives p = 0).
fn poisons(t: f32) -> bool {
    let b = bitcast<u32>(t);
    return (b & 0x7fffffffu) > 0x7f800000u || b == 0x7f800000u;
}

// ---- section: types -------------------------------------------------------------------------
// Storage is f16 (`enable f16;`, the shader-f16 feature): tiles stay f16 in workgroup
// memory and are widened to f32 where the arithmetic is f32.
alias elem_t = f16;    // storage of q, k, v and out; the tiles in workgroup memory
alias qk_acc_t = f32;  // accumulate qk=f32: the dot products of S = Q K^T
alias pv_acc_t = f32;  // accumulate pv=f32: one K/V tile's contribution to O += P V

// ---- section: memory ------------------------------------------------------------------------
// Bindings (group 0). Tensors are contiguous, row-major (batch, seq, heads, head_dim):
// q (B, Lq, Hq, Dqk), k (B, Lk, Hkv, Dqk), v (B, Lk, Hkv, Dv), out (B, Lq, Hq, Dv); lse is
// (B, Hq, Lq) f32. Packed sequences drop the batch axis (q (total_q, Hq, Dqk), lse (Hq, total_q));
// a paged cache is (num_pages, page, Hkv, D); section "sequences" finds a sequence's rows. Each
// entry point uses only some of the bindings (the manifest lists them per entry point).
// Element indices fit in u32 (a binding holds at most 2^32 bytes).
struct Params {
    batch: u32,         // B, sequences
    len_q: u32,         // Lq: query rows per sequence (packed: of the longest sequence)
    len_k: u32,         // Lk: keys per sequence (with kv_lens or packed: of the longest, after the append)
    heads_q: u32,       // Hq, query heads
    heads_kv: u32,      // Hkv, KV heads
    group: u32,         // Hq / Hkv, query heads per KV head
    write_lse: u32,     // 1 to write lse, 0 to skip it
    kv_layout: u32,     // 0 padded (B, L, H, D), 1 packed (cu_seqlens), 2 paged (block_table)
    has_kv_lens: u32,   // 1: sequence b has seq_meta[meta_kv_lens + b] keys (+ len_new); 0: len_k
    cap: u32,           // padded: rows per sequence of k and v; paged: rows per page
    total_q: u32,       // rows of q: packed total_q, else B * Lq
    len_new: u32,       // Lnew, rows appended per sequence (0: no append)
    meta_cu_q: u32,     // word offset of cu_seqlens_q in seq_meta
    meta_cu_k: u32,     // word offset of cu_seqlens_k in seq_meta
    meta_kv_lens: u32,  // word offset of kv_lens in seq_meta
    meta_table: u32,    // word offset of block_table in seq_meta
    table_width: u32,   // max_pages, entries per row of block_table
    new_v: u32,         // element offset of v_new in kv_new: B * Lnew * Hkv * Dqk
    _pad18: u32,        // keeps the struct a multiple of 16 bytes
    _pad19: u32,        // keeps the struct a multiple of 16 bytes
}

// params: sizes and word offsets of this launch (struct Params)
@group(0) @binding(0) var<uniform> params: Params;
// q (B, Lq, Hq, Dqk) f16: queries (packed: (total_q, Hq, Dqk))
@group(0) @binding(1) var<storage, read> q: array<vec4<elem_t>>;
// k (B, Lk, Hkv, Dqk) f16: keys (packed: (total_k, Hkv, Dqk); paged: (num_pages, page, Hkv,
// Dqk)); read_write: appended rows are written in place
@group(0) @binding(2) var<storage, read_write> k: array<vec4<elem_t>>;
// v (B, Lk, Hkv, Dv) f16: values, laid out as k; read_write: appended rows are written in
// place
@group(0) @binding(3) var<storage, read_write> v: array<vec4<elem_t>>;
// out (B, Lq, Hq, Dv) f16: attention output (packed: (total_q, Hq, Dv))
@group(0) @binding(4) var<storage, read_write> out: array<elem_t>;
// lse (B, Hq, Lq) f32: log-sum-exp of each row's scores (natural log; -inf where a row sees no
// key; packed: (Hq, total_q)); written only when requested
@group(0) @binding(5) var<storage, read_write> lse: array<f32>;
// seq_meta (meta_words) u32: the integer inputs as u32 words at the offsets in params:
// cu_seqlens_q (B + 1) at meta_cu_q, cu_seqlens_k (B + 1) at meta_cu_k, kv_lens (B) at
// meta_kv_lens, block_table (B, table_width) row-major at meta_table; only those the layout
// uses are read
@group(0) @binding(6) var<storage, read> seq_meta: array<u32>;
// kv_new (2, B, Lnew, Hkv, D) f16: rows to append: k_new (B, Lnew, Hkv, Dqk) at element 0,
// then v_new (B, Lnew, Hkv, Dv) at element params.new_v; read only when params.len_new > 0
@group(0) @binding(7) var<storage, read> kv_new: array<elem_t>;

// q, k and v are bound as vec4<elem_t>, four consecutive elements of a row per item, so that the
// tile copies read 16 bytes (f32) or 8 (f16) in one load.

// Workgroup memory (48672 bytes as the planner counts it, each buffer rounded up
// to 16 bytes). Tiles are stored row-major as vec4 of consecutive columns:
// sQ[r * Q_STRIDE + g] holds columns d0 + 4g .. d0 + 4g + 3 of tile row r while the chunk
// [d0, d0 + TILE_DQK) is loaded; sKV holds a chunk of K (rows of K_STRIDE) while S is formed,
// then a chunk of V (rows of V_STRIDE) while P V is.
var<workgroup> sQ: array<vec4<elem_t>, 1152>;  // TILE_Q x (TILE_DQK + pad): one d-chunk of the Q tile
var<workgroup> sKV: array<vec4<elem_t>, 576>;  // TILE_KV x chunk: one d-chunk of the K tile, then of the V tile
// P of the tile, row-major (rows of P_STRIDE): each invocation writes its block of S as
// probabilities, then reads its rows' whole P for O += P V, 4 keys per load (vec4).
var<workgroup> sP: array<vec4<f32>, 2176>;  // TILE_Q x (TILE_KV + pad) / 4
// The last K/V tile (as it + 1: it grows through the loop, so it needs no reset) in which an
// invocation met a masked key of its rows (p = 0: a score of -inf in a tile the mask keeps whole). O += P V then
// selects keys with p = 0 out instead of multiplying: 0 * inf is NaN, and such a key must add
// nothing whatever its V.
var<workgroup> p_zero_tile: atomic<u32>;
// The last K/V tile (as it + 1, like p_zero_tile) whose V, as copied, holds inf or NaN. O += P V
// selects keys with p = 0 out (a select per FMA) only in tiles that have such keys *and* such a
// V: 0 * a finite v adds exactly 0 anyway, and the plain loop is the fast one (measured on the
// H100: the select loop on every diagonal tile cost causal rows 5-30%, benchmarks/NOTES.md).
// (With one invocation per row the guard is per invocation and this tag is not kept: those plans
// fill small adapters' workgroup memory to the byte.)
var<workgroup> v_nonfinite_tile: atomic<u32>;

// x holds inf or NaN (exponent bits all ones; tested on the bits: a compiler's fast math may
// assume neither exists)
fn nonfinite4(x: vec4<f32>) -> bool {
    return any((bitcast<vec4<u32>>(x) & vec4<u32>(0x7f800000u)) == vec4<u32>(0x7f800000u));
}

// Element e of the global tensors read 4 at a time (columns d .. d + 3 of a row; d is a
// multiple of 4 and head dims are multiples of 8, so the 4 never straddle a row).
fn q_vec(i: u32) -> vec4<elem_t> {
    return q[i >> 2u];
}

fn k_vec(i: u32) -> vec4<elem_t> {
    return k[i >> 2u];
}

fn v_vec(i: u32) -> vec4<elem_t> {
    return v[i >> 2u];
}

fn kv_new_vec(i: u32) -> vec4<elem_t> {
    return vec4<elem_t>(kv_new[i], kv_new[i + 1u], kv_new[i + 2u], kv_new[i + 3u]);
}


// Copy columns [d0, d0 + TILE_DQK) of keys [j0, j0 + TILE_KV) of one (sequence, KV head) into
// sKV (load_k_chunk), or columns [d0, d0 + TILE_DV) of V (load_v_chunk), all invocations of the
// workgroup together (consecutive invocations copy consecutive vec4). Keys at or past Lk are
// zero-filled, so a partial last tile reads zeros (and is masked).
fn load_k_chunk(lid: u32, seq: Seq, kv_head: u32, j0: u32, d0: u32) {
    for (var e = lid; e < TILE_KV * (TILE_DQK / 4u); e += WORKGROUP_SIZE) {
        let key = j0 + e / (TILE_DQK / 4u);
        var x = vec4<elem_t>();
        if (key < seq.len_k) {
            x = k_at4(seq, key, kv_head, d0 + 4u * (e % (TILE_DQK / 4u)));  // cache or appended row
        }
        sKV[(e / (TILE_DQK / 4u)) * K_STRIDE + e % (TILE_DQK / 4u)] = x;
    }
}

// tag: the tile's it + 1, stored in v_nonfinite_tile (if kept) when the chunk holds inf or NaN.
fn load_v_chunk(lid: u32, seq: Seq, kv_head: u32, j0: u32, d0: u32, tag: u32) {
    var nonfinite = false;
    for (var e = lid; e < TILE_KV * (TILE_DV / 4u); e += WORKGROUP_SIZE) {
        let key = j0 + e / (TILE_DV / 4u);
        var x = vec4<elem_t>();
        if (key < seq.len_k) {
            x = v_at4(seq, key, kv_head, d0 + 4u * (e % (TILE_DV / 4u)));  // cache or appended row
        }
        nonfinite = nonfinite || nonfinite4(vec4<f32>(x));
        sKV[(e / (TILE_DV / 4u)) * V_STRIDE + e % (TILE_DV / 4u)] = x;
    }
    if (nonfinite) {
        atomicMax(&v_nonfinite_tile, tag);  // seen by every invocation after the next barrier
    }
}

// ---- section: matmul primitives -------------------------------------------------------------
// Both products on the invocations' own registers (WGSL has no portable matrix units), each
// invocation on its sub-block (section config): S = Q K^T as ROWS x KEYS 4-term dot products per
// vec4 of the head dim (one vec4 of K read from workgroup memory serves ROWS rows, one of Q
// serves KEYS keys), O += P V as ROWS x 4-column updates per key (one vec4 of V serves ROWS rows).
// The loops are written out in the kernel (templates/wgsl/tiles.j2); here are the reductions
// over the THREADS_PER_ROW invocations that share a row of the tile.

// The max and the sum of x over the THREADS_PER_ROW invocations of a row: a butterfly of
// subgroup shuffles, after which every invocation of the row holds the same (bitwise) value.
// The invocations of a row are consecutive invocations of one subgroup: the plan guarantees
// THREADS_PER_ROW <= the smallest subgroup size, and the runtime checks once per device that
// subgroups are consecutive runs of local_invocation_index. Must be called in uniform control flow.
fn max_over_row(x: f32) -> f32 {
    var r = x;
    r = max(r, subgroupShuffleXor(r, 4u));
    r = max(r, subgroupShuffleXor(r, 2u));
    r = max(r, subgroupShuffleXor(r, 1u));
    return r;
}

fn sum_over_row(x: f32) -> f32 {
    var r = x;
    r += subgroupShuffleXor(r, 4u);
    r += subgroupShuffleXor(r, 2u);
    r += subgroupShuffleXor(r, 1u);
    return r;
}

// ---- section: mask --------------------------------------------------------------------------
// mask window(left=4096, right=0), bottom-right aligned: query i sees key j iff i + (Lk - Lq) - 4096 <= j <= i + (Lk - Lq) + 0.
// visible(seq, i, j): query row i of sequence seq sees key j.
// key_range: the keys [begin, end) that any row in [r0, r1) may see. The main loop visits only
// the K/V tiles overlapping it, so tiles that are wholly masked are never loaded.
// tile_is_full: every row in [r0, r1) sees every key in [j0, j1), so the tile needs no
// per-element mask.
// Rows and keys are i32. Lengths are at most 2^30 and window sizes are clamped to 2^30 by the
// planner, so every expression below stays inside i32: windows are compared against the
// distance j - diag(i), never added to a position, except where noted.
// Lengths are the sequence's own (seq.len_q, seq.len_k): with packed sequences or kv_lens, a
// mask aligns per sequence exactly as if the sequence were attended to alone.
const WINDOW_LEFT: i32 = 4096;   // window(left=...)
const WINDOW_RIGHT: i32 = 0;  // window(right=...)

// Bottom-right alignment: the key on query row i's diagonal, i + (Lk - Lq); the last query row
// lines up with the last key. In [-2^30, 2^30) for every row i < Lq.
fn diag(seq: Seq, i: i32) -> i32 {
    return i + (i32(seq.len_k) - i32(seq.len_q));
}

fn visible(seq: Seq, i: i32, j: i32) -> bool {
    // With j < Lk, the distance j - diag(seq, i) lies in (-2^30, 2^31).
    return j < i32(seq.len_k) && j - diag(seq, i) >= -WINDOW_LEFT && j - diag(seq, i) <= WINDOW_RIGHT;
}

fn key_range(seq: Seq, r0: i32, r1: i32) -> vec2<i32> {
    let len_k = i32(seq.len_k);
    let begin = clamp(diag(seq, r0) - WINDOW_LEFT, 0, len_k);  // >= -2^31: fits
    // end = min(Lk, top + WINDOW_RIGHT) with top = diag(seq, r1 - 1) + 1 <= Lk, computed without
    // forming top + WINDOW_RIGHT (up to 2^31): Lk - top = Lq - r1 is in [0, 2^30].
    let top = diag(seq, r1 - 1) + 1;
    let end = max(0, top + min(WINDOW_RIGHT, len_k - top));
    return vec2<i32>(begin, max(begin, end));
}

fn tile_is_full(seq: Seq, r0: i32, r1: i32, j0: i32, j1: i32) -> bool {
    let len_k = i32(seq.len_k);
    return j1 <= len_k && j0 - diag(seq, r1 - 1) >= -WINDOW_LEFT && (j1 - 1) - diag(seq, r0) <= WINDOW_RIGHT;
}

// ---- section: sequences ---------------------------------------------------------------------
// Sequence `batch` (dispatch z) by params.kv_layout:
//   0 padded: query row i is row batch * Lq + i of q and out (viewed as (rows, Hq, D)); key j is
//             row batch * cap + j of k and v (viewed as (rows, Hkv, D)); lse (B, Hq, Lq).
//   1 packed: query row i is row cu_seqlens_q[batch] + i, key j row cu_seqlens_k[batch] + j;
//             lse (Hq, total_q).
// With kv_lens (has_kv_lens = 1) the sequence has kv_lens[batch] keys in the cache and, when a
// call appends (len_new > 0), the len_new keys of k_new / v_new after them: every workgroup reads
// those from kv_new, never from the cache, so nobody waits for the append to land.

struct Seq {
    batch: u32,
    len_q: u32,       // query rows of the sequence
    len_k: u32,       // keys it attends to (after the append)
    cached: u32,      // keys in the cache; keys cached .. len_k - 1 come from kv_new
    q_row0: u32,      // row of q and out of its first query
    k_row0: u32,      // padded / packed: row of k and v of its first key
    lse0: u32,        // lse index of (head 0, its first query)
    lse_stride: u32,  // lse elements from one head to the next
}

// The sequence's lengths and offsets, read from params and seq_meta. Every invocation of a
// workgroup computes the same values from uniform inputs, so loop bounds derived from them
// keep the barriers in uniform control flow.
fn sequence(batch: u32) -> Seq {
    var s: Seq;
    s.batch = batch;
    if (params.kv_layout == 1u) {
        s.q_row0 = seq_meta[params.meta_cu_q + batch];
        s.k_row0 = seq_meta[params.meta_cu_k + batch];
        s.len_q = seq_meta[params.meta_cu_q + batch + 1u] - s.q_row0;
        s.len_k = seq_meta[params.meta_cu_k + batch + 1u] - s.k_row0;
        s.cached = s.len_k;
        s.lse0 = s.q_row0;
        s.lse_stride = params.total_q;
        return s;
    }
    s.len_q = params.len_q;
    s.cached = params.len_k;
    if (params.has_kv_lens != 0u) {
        s.cached = seq_meta[params.meta_kv_lens + batch];
    }
    s.len_k = s.cached + params.len_new;
    s.q_row0 = batch * params.len_q;
    s.k_row0 = batch * params.cap;
    s.lse0 = batch * params.heads_q * params.len_q;
    s.lse_stride = params.len_q;
    return s;
}

// Row of k and v (viewed as (rows, Hkv, D)) holding key j of the sequence in the cache.
fn key_row(seq: Seq, j: u32) -> u32 {
    return seq.k_row0 + j;
}

// Row of kv_new (viewed as (B, Lnew, Hkv)) holding appended key j >= seq.cached.
fn new_row(seq: Seq, j: u32, kv_head: u32) -> u32 {
    return (seq.batch * params.len_new + j - seq.cached) * params.heads_kv + kv_head;
}

// Columns d .. d + 3 of key j (d a multiple of 4), read as one vec4: k_at4, v_at4.
fn k_at4(seq: Seq, j: u32, kv_head: u32, d: u32) -> vec4<elem_t> {
    if (j >= seq.cached) {
        return kv_new_vec(new_row(seq, j, kv_head) * HEAD_DIM_QK + d);
    }
    return k_vec((key_row(seq, j) * params.heads_kv + kv_head) * HEAD_DIM_QK + d);
}

fn v_at4(seq: Seq, j: u32, kv_head: u32, d: u32) -> vec4<elem_t> {
    if (j >= seq.cached) {
        return kv_new_vec(params.new_v + new_row(seq, j, kv_head) * HEAD_DIM_V + d);
    }
    return v_vec((key_row(seq, j) * params.heads_kv + kv_head) * HEAD_DIM_V + d);
}

// ---- section: append ------------------------------------------------------------------------
// The fused append: the workgroups of the first q tile of each (sequence, KV head) copy the
// sequence's len_new rows of k_new / v_new into the cache, at keys cached .. cached + len_new - 1
// (padded: rows of the sequence; paged: the slots the block table gives). Other workgroups
// read those keys from kv_new, so there is no race and no separate copy launch.
fn append_rows(lid: u32, seq: Seq, kv_head: u32) {
    // Four elements (one vec4 item of k or v) at a time: head dims are multiples of 8.
    for (var e = lid; e < params.len_new * HEAD_DIM_QK / 4u; e += WORKGROUP_SIZE) {
        let j = seq.cached + 4u * e / HEAD_DIM_QK;
        let d = 4u * e % HEAD_DIM_QK;
        k[((key_row(seq, j) * params.heads_kv + kv_head) * HEAD_DIM_QK + d) / 4u] = k_at4(seq, j, kv_head, d);
    }
    for (var e = lid; e < params.len_new * HEAD_DIM_V / 4u; e += WORKGROUP_SIZE) {
        let j = seq.cached + 4u * e / HEAD_DIM_V;
        let d = 4u * e % HEAD_DIM_V;
        v[((key_row(seq, j) * params.heads_kv + kv_head) * HEAD_DIM_V + d) / 4u] = v_at4(seq, j, kv_head, d);
    }
}

// ---- section: score transform ---------------------------------------------------------------
// Raw dot product -> score in the log2 domain, t = log2(e) * scale * s.
fn score_transform(s: f32) -> f32 {
    return s * SCALE_LOG2;
}

// ---- section: kernel ------------------------------------------------------------------------
// One workgroup computes TILE_Q rows of the output of one (batch, query head), FlashAttention-2
// style (Dao 2023, Algorithm 1): loop over the visible K/V tiles keeping, per row, the running
// max m_i, the running sum l_i of exp2(t - m_i) and the unnormalised output acc; when the max
// grows, rescale l_i and acc by alpha = exp2(m_old - m_new); divide by l_i at the end.
// Register tiling (section config): each invocation computes its ROWS x KEYS block of S from Q
// and K in workgroup memory (vec4 loads), reduces its rows' max over the THREADS_PER_ROW
// invocations of each row, and adds P V for its ROWS rows x its column groups of acc, with P exchanged through sP. Each invocation keeps l_i over its own
// keys (alpha is the row's, so the shares stay consistent) and the shares are summed once, in
// the epilogue.
// The head dims are streamed through workgroup memory in chunks of TILE_D columns: per K/V tile,
// the chunks of Q and K pass through sQ and sKV into the dot products, then the chunks of V
// through sKV into acc. With V_BLOCKS > 1 the workgroup computes only V_COLS columns of out,
// recomputing the rows' scores (as every V block of the row tile does).
// All barriers are in uniform control flow: the loop bounds depend only on the workgroup (its
// sequence's lengths come from params and seq_meta, both uniform), and invocations whose rows
// are past the sequence's Lq run the loop too and just do not store.

// Tile row r of a workgroup whose first row is `first`: its query row and query head.
fn tile_row(r: u32, first: u32, head: u32) -> vec2<u32> {
    return vec2<u32>(first + r, head);
}

// Copy columns [d0, d0 + TILE_DQK) of the tile's rows of Q into sQ, all invocations together;
// rows past the sequence's Lq read as zeros.
fn load_q(lid: u32, seq: Seq, first: u32, head: u32, d0: u32) {
    for (var e = lid; e < TILE_Q * (TILE_DQK / 4u); e += WORKGROUP_SIZE) {
        let r = e / (TILE_DQK / 4u);
        let g = e % (TILE_DQK / 4u);
        let rh = tile_row(r, first, head);
        var x = vec4<elem_t>();
        if (rh.x < seq.len_q) {
            let at = ((seq.q_row0 + rh.x) * params.heads_q + rh.y) * HEAD_DIM_QK + d0 + 4u * g;
            x = q_vec(at);
        }
        sQ[r * Q_STRIDE + g] = x;
    }
}

@compute @workgroup_size(256, 1, 1)
fn attngen_mistral_7b_prefill(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let tr = lid / THREADS_PER_ROW;               // row group: tile rows tr + ROW_GROUPS * i, i < ROWS
    let tc = lid % THREADS_PER_ROW;               // keys tc + THREADS_PER_ROW * u and column groups tc + THREADS_PER_ROW * w
    let seq = sequence(wg.z);                     // the workgroup's sequence: lengths and offsets
    let head = wg.y / V_BLOCKS;                   // grid.y = Hq * V_BLOCKS, head-major
    let v0 = (wg.y % V_BLOCKS) * V_COLS;          // the workgroup's first column of v and out
    let kv_head = head / params.group;            // grouped-query attention: Hq / Hkv heads share K/V
    let row0 = wg.x * TILE_Q;                     // the workgroup's first query row
    let row_end = min(row0 + TILE_Q, seq.len_q);  // at or below row0: a tile past the sequence's rows
    let first = row0;                             // tile row r is query row first + r of `head`
    let tile_head = head;
    var q_row: array<u32, ROWS>;                  // the query row of each of this invocation's rows
    var q_head: array<u32, ROWS>;                 // and its query head
    // for i < ROWS (4), unrolled: one block per i
    {
        const i = 0u;
        let rh = tile_row(tr + ROW_GROUPS * i, first, tile_head);
        q_row[i] = rh.x;
        q_head[i] = rh.y;
    }
    {
        const i = 1u;
        let rh = tile_row(tr + ROW_GROUPS * i, first, tile_head);
        q_row[i] = rh.x;
        q_head[i] = rh.y;
    }
    {
        const i = 2u;
        let rh = tile_row(tr + ROW_GROUPS * i, first, tile_head);
        q_row[i] = rh.x;
        q_head[i] = rh.y;
    }
    {
        const i = 3u;
        let rh = tile_row(tr + ROW_GROUPS * i, first, tile_head);
        q_row[i] = rh.x;
        q_head[i] = rh.y;
    }

    // ---- section: append ----
    // A call with k_new / v_new: this row tile's workgroups of the first query head of each KV
    // head (and the first V block) store the new rows in the cache (see append_rows).
    if (params.len_new > 0u && wg.x == 0u && head % params.group == 0u && v0 == 0u) {
        append_rows(lid, seq, kv_head);
    }


    // ---- section: prologue: load Q ----
    // With chunked head dims, sQ holds one d-chunk of Q: the main loop loads it with each chunk
    // of K (load_q), so nothing is loaded here.

    if (lid == 0u) {
        // not left to the implementation's zero-fill (not every one does it); the loop's first
        // barrier orders these stores before any use
        atomicStore(&p_zero_tile, 0u);
        atomicStore(&v_nonfinite_tile, 0u);
    }
    // ---- section: loop bounds (mask) ----
    let has_rows = row0 < row_end;                // the tile has rows of the sequence
    let range = key_range(seq, i32(row0), i32(row_end));
    let tiles_begin = range.x / i32(TILE_KV);
    let tiles_all = select(0, (range.y + i32(TILE_KV) - 1) / i32(TILE_KV) - tiles_begin,
                           has_rows && range.y > range.x);
    let tile_first = tiles_begin;
    let n_tiles = tiles_all;

    // Per row i of this invocation (tile row tr + ROW_GROUPS * i):
    var m_i: array<f32, ROWS>;          // running max of the row's scores (log2 domain); MASKED = none yet
    var l_i: array<f32, ROWS>;          // running sum of exp2(t - m_i) over this invocation's keys
    var row_bad: array<bool, ROWS>;     // the row saw a NaN or +inf score: its result is NaN
    var acc: array<array<vec4<f32>, ACC_GROUPS>, ROWS>;  // unnormalised output, this invocation's column groups
    var s: array<array<f32, KEYS>, ROWS>;  // this invocation's block of the tile's scores, then of P
    // for i < ROWS (4), unrolled: one block per i
    {
        const i = 0u;
        m_i[i] = MASKED;
    }
    {
        const i = 1u;
        m_i[i] = MASKED;
    }
    {
        const i = 2u;
        m_i[i] = MASKED;
    }
    {
        const i = 3u;
        m_i[i] = MASKED;
    }

    // ---- section: prefetch ----
    // The next step's tiles are loaded from global memory into registers (next_*) while the
    // current step's math runs, and stored into workgroup memory at the top of their own step:
    // the loads' latency hides behind the products instead of stalling every invocation after
    // each copy. Steps per K/V tile: Q and K chunks, then V chunks.
    var next_q: array<vec4<elem_t>, Q_ITEMS>;
    var next_k: array<vec4<elem_t>, K_ITEMS>;
    var next_v: array<vec4<elem_t>, V_ITEMS>;
    if (n_tiles > 0) {
        let jf = u32((tile_first + 0) * i32(TILE_KV));
        // for n < Q_ITEMS (4), unrolled: one block per n
        {
            const n = 0u;
            let e = lid + n * WORKGROUP_SIZE;
            let rh = tile_row(e / (TILE_DQK / 4u), first, tile_head);
            var x = vec4<elem_t>();
            if (e < TILE_Q * (TILE_DQK / 4u) && rh.x < seq.len_q) {
                let at = ((seq.q_row0 + rh.x) * params.heads_q + rh.y) * HEAD_DIM_QK + 0u + 4u * (e % (TILE_DQK / 4u));
                x = q_vec(at);
            }
            next_q[n] = x;
        }
        {
            const n = 1u;
            let e = lid + n * WORKGROUP_SIZE;
            let rh = tile_row(e / (TILE_DQK / 4u), first, tile_head);
            var x = vec4<elem_t>();
            if (e < TILE_Q * (TILE_DQK / 4u) && rh.x < seq.len_q) {
                let at = ((seq.q_row0 + rh.x) * params.heads_q + rh.y) * HEAD_DIM_QK + 0u + 4u * (e % (TILE_DQK / 4u));
                x = q_vec(at);
            }
            next_q[n] = x;
        }
        {
            const n = 2u;
            let e = lid + n * WORKGROUP_SIZE;
            let rh = tile_row(e / (TILE_DQK / 4u), first, tile_head);
            var x = vec4<elem_t>();
            if (e < TILE_Q * (TILE_DQK / 4u) && rh.x < seq.len_q) {
                let at = ((seq.q_row0 + rh.x) * params.heads_q + rh.y) * HEAD_DIM_QK + 0u + 4u * (e % (TILE_DQK / 4u));
                x = q_vec(at);
            }
            next_q[n] = x;
        }
        {
            const n = 3u;
            let e = lid + n * WORKGROUP_SIZE;
            let rh = tile_row(e / (TILE_DQK / 4u), first, tile_head);
            var x = vec4<elem_t>();
            if (e < TILE_Q * (TILE_DQK / 4u) && rh.x < seq.len_q) {
                let at = ((seq.q_row0 + rh.x) * params.heads_q + rh.y) * HEAD_DIM_QK + 0u + 4u * (e % (TILE_DQK / 4u));
                x = q_vec(at);
            }
            next_q[n] = x;
        }
        // for n < K_ITEMS (2), unrolled: one block per n
        {
            const n = 0u;
            let e = lid + n * WORKGROUP_SIZE;
            let key = jf + e / (TILE_DQK / 4u);
            var x = vec4<elem_t>();
            if (e < TILE_KV * (TILE_DQK / 4u) && key < seq.len_k) {
                x = k_at4(seq, key, kv_head, 4u * (e % (TILE_DQK / 4u)));  // cache or appended row
            }
            next_k[n] = x;
        }
        {
            const n = 1u;
            let e = lid + n * WORKGROUP_SIZE;
            let key = jf + e / (TILE_DQK / 4u);
            var x = vec4<elem_t>();
            if (e < TILE_KV * (TILE_DQK / 4u) && key < seq.len_k) {
                x = k_at4(seq, key, kv_head, 4u * (e % (TILE_DQK / 4u)));  // cache or appended row
            }
            next_k[n] = x;
        }
}

    // ---- section: main loop over K/V tiles ----
    // The loop ends with one extra, empty pass. A driver that silently cuts long-running loops
    // short (Mesa's llvmpipe ends all loops of a shader after 65535 iterations in total) exits
    // before that pass; the epilogue then stores nothing, which the runtime detects.
    var it = 0;
    for (; it <= n_tiles; it++) {
        if (it == n_tiles) {
            continue;  // the empty pass
        }
        let j0 = (tile_first + it) * i32(TILE_KV);

        // this invocation's ROWS x KEYS dot products of S (zeroed by an explicit initialiser:
        // naga zero-fills a `var` without one only once, not on every pass of a loop)
        var part = array<array<qk_acc_t, KEYS>, ROWS>();
        // -- load K/V tile (Q and K here, d-chunk by d-chunk, each followed by its share of
        // -- S = Q K^T; V below, for P V)
        {  // chunk 0: the prefetched Q and K chunks into workgroup memory, then fetch the next step's
        // for n < Q_ITEMS (4), unrolled: one block per n
        {
            const n = 0u;
            let e = lid + n * WORKGROUP_SIZE;
            if (e < TILE_Q * (TILE_DQK / 4u)) {
                sQ[(e / (TILE_DQK / 4u)) * Q_STRIDE + e % (TILE_DQK / 4u)] = next_q[n];
            }
        }
        {
            const n = 1u;
            let e = lid + n * WORKGROUP_SIZE;
            if (e < TILE_Q * (TILE_DQK / 4u)) {
                sQ[(e / (TILE_DQK / 4u)) * Q_STRIDE + e % (TILE_DQK / 4u)] = next_q[n];
            }
        }
        {
            const n = 2u;
            let e = lid + n * WORKGROUP_SIZE;
            if (e < TILE_Q * (TILE_DQK / 4u)) {
                sQ[(e / (TILE_DQK / 4u)) * Q_STRIDE + e % (TILE_DQK / 4u)] = next_q[n];
            }
        }
        {
            const n = 3u;
            let e = lid + n * WORKGROUP_SIZE;
            if (e < TILE_Q * (TILE_DQK / 4u)) {
                sQ[(e / (TILE_DQK / 4u)) * Q_STRIDE + e % (TILE_DQK / 4u)] = next_q[n];
            }
        }
        // for n < K_ITEMS (2), unrolled: one block per n
        {
            const n = 0u;
            let e = lid + n * WORKGROUP_SIZE;
            if (e < TILE_KV * (TILE_DQK / 4u)) {
                sKV[(e / (TILE_DQK / 4u)) * K_STRIDE + e % (TILE_DQK / 4u)] = next_k[n];
            }
        }
        {
            const n = 1u;
            let e = lid + n * WORKGROUP_SIZE;
            if (e < TILE_KV * (TILE_DQK / 4u)) {
                sKV[(e / (TILE_DQK / 4u)) * K_STRIDE + e % (TILE_DQK / 4u)] = next_k[n];
            }
        }
workgroupBarrier();
        // for n < Q_ITEMS (4), unrolled: one block per n
        {
            const n = 0u;
            let e = lid + n * WORKGROUP_SIZE;
            let rh = tile_row(e / (TILE_DQK / 4u), first, tile_head);
            var x = vec4<elem_t>();
            if (e < TILE_Q * (TILE_DQK / 4u) && rh.x < seq.len_q) {
                let at = ((seq.q_row0 + rh.x) * params.heads_q + rh.y) * HEAD_DIM_QK + 1u * TILE_DQK + 4u * (e % (TILE_DQK / 4u));
                x = q_vec(at);
            }
            next_q[n] = x;
        }
        {
            const n = 1u;
            let e = lid + n * WORKGROUP_SIZE;
            let rh = tile_row(e / (TILE_DQK / 4u), first, tile_head);
            var x = vec4<elem_t>();
            if (e < TILE_Q * (TILE_DQK / 4u) && rh.x < seq.len_q) {
                let at = ((seq.q_row0 + rh.x) * params.heads_q + rh.y) * HEAD_DIM_QK + 1u * TILE_DQK + 4u * (e % (TILE_DQK / 4u));
                x = q_vec(at);
            }
            next_q[n] = x;
        }
        {
            const n = 2u;
            let e = lid + n * WORKGROUP_SIZE;
            let rh = tile_row(e / (TILE_DQK / 4u), first, tile_head);
            var x = vec4<elem_t>();
            if (e < TILE_Q * (TILE_DQK / 4u) && rh.x < seq.len_q) {
                let at = ((seq.q_row0 + rh.x) * params.heads_q + rh.y) * HEAD_DIM_QK + 1u * TILE_DQK + 4u * (e % (TILE_DQK / 4u));
                x = q_vec(at);
            }
            next_q[n] = x;
        }
        {
            const n = 3u;
            let e = lid + n * WORKGROUP_SIZE;
            let rh = tile_row(e / (TILE_DQK / 4u), first, tile_head);
            var x = vec4<elem_t>();
            if (e < TILE_Q * (TILE_DQK / 4u) && rh.x < seq.len_q) {
                let at = ((seq.q_row0 + rh.x) * params.heads_q + rh.y) * HEAD_DIM_QK + 1u * TILE_DQK + 4u * (e % (TILE_DQK / 4u));
                x = q_vec(at);
            }
            next_q[n] = x;
        }
        // for n < K_ITEMS (2), unrolled: one block per n
        {
            const n = 0u;
            let e = lid + n * WORKGROUP_SIZE;
            let key = u32(j0) + e / (TILE_DQK / 4u);
            var x = vec4<elem_t>();
            if (e < TILE_KV * (TILE_DQK / 4u) && key < seq.len_k) {
                x = k_at4(seq, key, kv_head, 1u * TILE_DQK + 4u * (e % (TILE_DQK / 4u)));  // cache or appended row
            }
            next_k[n] = x;
        }
        {
            const n = 1u;
            let e = lid + n * WORKGROUP_SIZE;
            let key = u32(j0) + e / (TILE_DQK / 4u);
            var x = vec4<elem_t>();
            if (e < TILE_KV * (TILE_DQK / 4u) && key < seq.len_k) {
                x = k_at4(seq, key, kv_head, 1u * TILE_DQK + 4u * (e % (TILE_DQK / 4u)));  // cache or appended row
            }
            next_k[n] = x;
        }
        for (var c = 0u; c < TILE_DQK / 4u; c += DIM_CHUNK_QK) {  // in chunks: see DIM_CHUNK_QK
            for (var x = 0u; x < DIM_CHUNK_QK; x++) {
                let g = c + x;  // vec4 column group of the chunk
                var qv: array<vec4<qk_acc_t>, ROWS>;
                // for i < ROWS (4), unrolled: one block per i
                {
                    const i = 0u;
                    qv[i] = vec4<qk_acc_t>(sQ[(tr + ROW_GROUPS * i) * Q_STRIDE + g]);
                }
                {
                    const i = 1u;
                    qv[i] = vec4<qk_acc_t>(sQ[(tr + ROW_GROUPS * i) * Q_STRIDE + g]);
                }
                {
                    const i = 2u;
                    qv[i] = vec4<qk_acc_t>(sQ[(tr + ROW_GROUPS * i) * Q_STRIDE + g]);
                }
                {
                    const i = 3u;
                    qv[i] = vec4<qk_acc_t>(sQ[(tr + ROW_GROUPS * i) * Q_STRIDE + g]);
                }
                // for u < KEYS (8), unrolled: one block per u
                {
                    const u = 0u;
                    let kv = vec4<qk_acc_t>(sKV[(tc + THREADS_PER_ROW * u) * K_STRIDE + g]);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 1u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 2u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 3u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                }
                {
                    const u = 1u;
                    let kv = vec4<qk_acc_t>(sKV[(tc + THREADS_PER_ROW * u) * K_STRIDE + g]);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 1u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 2u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 3u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                }
                {
                    const u = 2u;
                    let kv = vec4<qk_acc_t>(sKV[(tc + THREADS_PER_ROW * u) * K_STRIDE + g]);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 1u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 2u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 3u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                }
                {
                    const u = 3u;
                    let kv = vec4<qk_acc_t>(sKV[(tc + THREADS_PER_ROW * u) * K_STRIDE + g]);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 1u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 2u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 3u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                }
                {
                    const u = 4u;
                    let kv = vec4<qk_acc_t>(sKV[(tc + THREADS_PER_ROW * u) * K_STRIDE + g]);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 1u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 2u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 3u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                }
                {
                    const u = 5u;
                    let kv = vec4<qk_acc_t>(sKV[(tc + THREADS_PER_ROW * u) * K_STRIDE + g]);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 1u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 2u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 3u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                }
                {
                    const u = 6u;
                    let kv = vec4<qk_acc_t>(sKV[(tc + THREADS_PER_ROW * u) * K_STRIDE + g]);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 1u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 2u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 3u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                }
                {
                    const u = 7u;
                    let kv = vec4<qk_acc_t>(sKV[(tc + THREADS_PER_ROW * u) * K_STRIDE + g]);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 1u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 2u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 3u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                }
            }
        }
workgroupBarrier();  // every invocation is done with sQ and sKV before the next chunk overwrites them
        }
        {  // chunk 1: the prefetched Q and K chunks into workgroup memory, then fetch the next step's
        // for n < Q_ITEMS (4), unrolled: one block per n
        {
            const n = 0u;
            let e = lid + n * WORKGROUP_SIZE;
            if (e < TILE_Q * (TILE_DQK / 4u)) {
                sQ[(e / (TILE_DQK / 4u)) * Q_STRIDE + e % (TILE_DQK / 4u)] = next_q[n];
            }
        }
        {
            const n = 1u;
            let e = lid + n * WORKGROUP_SIZE;
            if (e < TILE_Q * (TILE_DQK / 4u)) {
                sQ[(e / (TILE_DQK / 4u)) * Q_STRIDE + e % (TILE_DQK / 4u)] = next_q[n];
            }
        }
        {
            const n = 2u;
            let e = lid + n * WORKGROUP_SIZE;
            if (e < TILE_Q * (TILE_DQK / 4u)) {
                sQ[(e / (TILE_DQK / 4u)) * Q_STRIDE + e % (TILE_DQK / 4u)] = next_q[n];
            }
        }
        {
            const n = 3u;
            let e = lid + n * WORKGROUP_SIZE;
            if (e < TILE_Q * (TILE_DQK / 4u)) {
                sQ[(e / (TILE_DQK / 4u)) * Q_STRIDE + e % (TILE_DQK / 4u)] = next_q[n];
            }
        }
        // for n < K_ITEMS (2), unrolled: one block per n
        {
            const n = 0u;
            let e = lid + n * WORKGROUP_SIZE;
            if (e < TILE_KV * (TILE_DQK / 4u)) {
                sKV[(e / (TILE_DQK / 4u)) * K_STRIDE + e % (TILE_DQK / 4u)] = next_k[n];
            }
        }
        {
            const n = 1u;
            let e = lid + n * WORKGROUP_SIZE;
            if (e < TILE_KV * (TILE_DQK / 4u)) {
                sKV[(e / (TILE_DQK / 4u)) * K_STRIDE + e % (TILE_DQK / 4u)] = next_k[n];
            }
        }
workgroupBarrier();
        // for n < Q_ITEMS (4), unrolled: one block per n
        {
            const n = 0u;
            let e = lid + n * WORKGROUP_SIZE;
            let rh = tile_row(e / (TILE_DQK / 4u), first, tile_head);
            var x = vec4<elem_t>();
            if (e < TILE_Q * (TILE_DQK / 4u) && rh.x < seq.len_q) {
                let at = ((seq.q_row0 + rh.x) * params.heads_q + rh.y) * HEAD_DIM_QK + 2u * TILE_DQK + 4u * (e % (TILE_DQK / 4u));
                x = q_vec(at);
            }
            next_q[n] = x;
        }
        {
            const n = 1u;
            let e = lid + n * WORKGROUP_SIZE;
            let rh = tile_row(e / (TILE_DQK / 4u), first, tile_head);
            var x = vec4<elem_t>();
            if (e < TILE_Q * (TILE_DQK / 4u) && rh.x < seq.len_q) {
                let at = ((seq.q_row0 + rh.x) * params.heads_q + rh.y) * HEAD_DIM_QK + 2u * TILE_DQK + 4u * (e % (TILE_DQK / 4u));
                x = q_vec(at);
            }
            next_q[n] = x;
        }
        {
            const n = 2u;
            let e = lid + n * WORKGROUP_SIZE;
            let rh = tile_row(e / (TILE_DQK / 4u), first, tile_head);
            var x = vec4<elem_t>();
            if (e < TILE_Q * (TILE_DQK / 4u) && rh.x < seq.len_q) {
                let at = ((seq.q_row0 + rh.x) * params.heads_q + rh.y) * HEAD_DIM_QK + 2u * TILE_DQK + 4u * (e % (TILE_DQK / 4u));
                x = q_vec(at);
            }
            next_q[n] = x;
        }
        {
            const n = 3u;
            let e = lid + n * WORKGROUP_SIZE;
            let rh = tile_row(e / (TILE_DQK / 4u), first, tile_head);
            var x = vec4<elem_t>();
            if (e < TILE_Q * (TILE_DQK / 4u) && rh.x < seq.len_q) {
                let at = ((seq.q_row0 + rh.x) * params.heads_q + rh.y) * HEAD_DIM_QK + 2u * TILE_DQK + 4u * (e % (TILE_DQK / 4u));
                x = q_vec(at);
            }
            next_q[n] = x;
        }
        // for n < K_ITEMS (2), unrolled: one block per n
        {
            const n = 0u;
            let e = lid + n * WORKGROUP_SIZE;
            let key = u32(j0) + e / (TILE_DQK / 4u);
            var x = vec4<elem_t>();
            if (e < TILE_KV * (TILE_DQK / 4u) && key < seq.len_k) {
                x = k_at4(seq, key, kv_head, 2u * TILE_DQK + 4u * (e % (TILE_DQK / 4u)));  // cache or appended row
            }
            next_k[n] = x;
        }
        {
            const n = 1u;
            let e = lid + n * WORKGROUP_SIZE;
            let key = u32(j0) + e / (TILE_DQK / 4u);
            var x = vec4<elem_t>();
            if (e < TILE_KV * (TILE_DQK / 4u) && key < seq.len_k) {
                x = k_at4(seq, key, kv_head, 2u * TILE_DQK + 4u * (e % (TILE_DQK / 4u)));  // cache or appended row
            }
            next_k[n] = x;
        }
        for (var c = 0u; c < TILE_DQK / 4u; c += DIM_CHUNK_QK) {  // in chunks: see DIM_CHUNK_QK
            for (var x = 0u; x < DIM_CHUNK_QK; x++) {
                let g = c + x;  // vec4 column group of the chunk
                var qv: array<vec4<qk_acc_t>, ROWS>;
                // for i < ROWS (4), unrolled: one block per i
                {
                    const i = 0u;
                    qv[i] = vec4<qk_acc_t>(sQ[(tr + ROW_GROUPS * i) * Q_STRIDE + g]);
                }
                {
                    const i = 1u;
                    qv[i] = vec4<qk_acc_t>(sQ[(tr + ROW_GROUPS * i) * Q_STRIDE + g]);
                }
                {
                    const i = 2u;
                    qv[i] = vec4<qk_acc_t>(sQ[(tr + ROW_GROUPS * i) * Q_STRIDE + g]);
                }
                {
                    const i = 3u;
                    qv[i] = vec4<qk_acc_t>(sQ[(tr + ROW_GROUPS * i) * Q_STRIDE + g]);
                }
                // for u < KEYS (8), unrolled: one block per u
                {
                    const u = 0u;
                    let kv = vec4<qk_acc_t>(sKV[(tc + THREADS_PER_ROW * u) * K_STRIDE + g]);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 1u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 2u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 3u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                }
                {
                    const u = 1u;
                    let kv = vec4<qk_acc_t>(sKV[(tc + THREADS_PER_ROW * u) * K_STRIDE + g]);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 1u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 2u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 3u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                }
                {
                    const u = 2u;
                    let kv = vec4<qk_acc_t>(sKV[(tc + THREADS_PER_ROW * u) * K_STRIDE + g]);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 1u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 2u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 3u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                }
                {
                    const u = 3u;
                    let kv = vec4<qk_acc_t>(sKV[(tc + THREADS_PER_ROW * u) * K_STRIDE + g]);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 1u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 2u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 3u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                }
                {
                    const u = 4u;
                    let kv = vec4<qk_acc_t>(sKV[(tc + THREADS_PER_ROW * u) * K_STRIDE + g]);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 1u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 2u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 3u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                }
                {
                    const u = 5u;
                    let kv = vec4<qk_acc_t>(sKV[(tc + THREADS_PER_ROW * u) * K_STRIDE + g]);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 1u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 2u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 3u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                }
                {
                    const u = 6u;
                    let kv = vec4<qk_acc_t>(sKV[(tc + THREADS_PER_ROW * u) * K_STRIDE + g]);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 1u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 2u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 3u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                }
                {
                    const u = 7u;
                    let kv = vec4<qk_acc_t>(sKV[(tc + THREADS_PER_ROW * u) * K_STRIDE + g]);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 1u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 2u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 3u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                }
            }
        }
workgroupBarrier();  // every invocation is done with sQ and sKV before the next chunk overwrites them
        }
        {  // chunk 2: the prefetched Q and K chunks into workgroup memory, then fetch the next step's
        // for n < Q_ITEMS (4), unrolled: one block per n
        {
            const n = 0u;
            let e = lid + n * WORKGROUP_SIZE;
            if (e < TILE_Q * (TILE_DQK / 4u)) {
                sQ[(e / (TILE_DQK / 4u)) * Q_STRIDE + e % (TILE_DQK / 4u)] = next_q[n];
            }
        }
        {
            const n = 1u;
            let e = lid + n * WORKGROUP_SIZE;
            if (e < TILE_Q * (TILE_DQK / 4u)) {
                sQ[(e / (TILE_DQK / 4u)) * Q_STRIDE + e % (TILE_DQK / 4u)] = next_q[n];
            }
        }
        {
            const n = 2u;
            let e = lid + n * WORKGROUP_SIZE;
            if (e < TILE_Q * (TILE_DQK / 4u)) {
                sQ[(e / (TILE_DQK / 4u)) * Q_STRIDE + e % (TILE_DQK / 4u)] = next_q[n];
            }
        }
        {
            const n = 3u;
            let e = lid + n * WORKGROUP_SIZE;
            if (e < TILE_Q * (TILE_DQK / 4u)) {
                sQ[(e / (TILE_DQK / 4u)) * Q_STRIDE + e % (TILE_DQK / 4u)] = next_q[n];
            }
        }
        // for n < K_ITEMS (2), unrolled: one block per n
        {
            const n = 0u;
            let e = lid + n * WORKGROUP_SIZE;
            if (e < TILE_KV * (TILE_DQK / 4u)) {
                sKV[(e / (TILE_DQK / 4u)) * K_STRIDE + e % (TILE_DQK / 4u)] = next_k[n];
            }
        }
        {
            const n = 1u;
            let e = lid + n * WORKGROUP_SIZE;
            if (e < TILE_KV * (TILE_DQK / 4u)) {
                sKV[(e / (TILE_DQK / 4u)) * K_STRIDE + e % (TILE_DQK / 4u)] = next_k[n];
            }
        }
workgroupBarrier();
        // for n < Q_ITEMS (4), unrolled: one block per n
        {
            const n = 0u;
            let e = lid + n * WORKGROUP_SIZE;
            let rh = tile_row(e / (TILE_DQK / 4u), first, tile_head);
            var x = vec4<elem_t>();
            if (e < TILE_Q * (TILE_DQK / 4u) && rh.x < seq.len_q) {
                let at = ((seq.q_row0 + rh.x) * params.heads_q + rh.y) * HEAD_DIM_QK + 3u * TILE_DQK + 4u * (e % (TILE_DQK / 4u));
                x = q_vec(at);
            }
            next_q[n] = x;
        }
        {
            const n = 1u;
            let e = lid + n * WORKGROUP_SIZE;
            let rh = tile_row(e / (TILE_DQK / 4u), first, tile_head);
            var x = vec4<elem_t>();
            if (e < TILE_Q * (TILE_DQK / 4u) && rh.x < seq.len_q) {
                let at = ((seq.q_row0 + rh.x) * params.heads_q + rh.y) * HEAD_DIM_QK + 3u * TILE_DQK + 4u * (e % (TILE_DQK / 4u));
                x = q_vec(at);
            }
            next_q[n] = x;
        }
        {
            const n = 2u;
            let e = lid + n * WORKGROUP_SIZE;
            let rh = tile_row(e / (TILE_DQK / 4u), first, tile_head);
            var x = vec4<elem_t>();
            if (e < TILE_Q * (TILE_DQK / 4u) && rh.x < seq.len_q) {
                let at = ((seq.q_row0 + rh.x) * params.heads_q + rh.y) * HEAD_DIM_QK + 3u * TILE_DQK + 4u * (e % (TILE_DQK / 4u));
                x = q_vec(at);
            }
            next_q[n] = x;
        }
        {
            const n = 3u;
            let e = lid + n * WORKGROUP_SIZE;
            let rh = tile_row(e / (TILE_DQK / 4u), first, tile_head);
            var x = vec4<elem_t>();
            if (e < TILE_Q * (TILE_DQK / 4u) && rh.x < seq.len_q) {
                let at = ((seq.q_row0 + rh.x) * params.heads_q + rh.y) * HEAD_DIM_QK + 3u * TILE_DQK + 4u * (e % (TILE_DQK / 4u));
                x = q_vec(at);
            }
            next_q[n] = x;
        }
        // for n < K_ITEMS (2), unrolled: one block per n
        {
            const n = 0u;
            let e = lid + n * WORKGROUP_SIZE;
            let key = u32(j0) + e / (TILE_DQK / 4u);
            var x = vec4<elem_t>();
            if (e < TILE_KV * (TILE_DQK / 4u) && key < seq.len_k) {
                x = k_at4(seq, key, kv_head, 3u * TILE_DQK + 4u * (e % (TILE_DQK / 4u)));  // cache or appended row
            }
            next_k[n] = x;
        }
        {
            const n = 1u;
            let e = lid + n * WORKGROUP_SIZE;
            let key = u32(j0) + e / (TILE_DQK / 4u);
            var x = vec4<elem_t>();
            if (e < TILE_KV * (TILE_DQK / 4u) && key < seq.len_k) {
                x = k_at4(seq, key, kv_head, 3u * TILE_DQK + 4u * (e % (TILE_DQK / 4u)));  // cache or appended row
            }
            next_k[n] = x;
        }
        for (var c = 0u; c < TILE_DQK / 4u; c += DIM_CHUNK_QK) {  // in chunks: see DIM_CHUNK_QK
            for (var x = 0u; x < DIM_CHUNK_QK; x++) {
                let g = c + x;  // vec4 column group of the chunk
                var qv: array<vec4<qk_acc_t>, ROWS>;
                // for i < ROWS (4), unrolled: one block per i
                {
                    const i = 0u;
                    qv[i] = vec4<qk_acc_t>(sQ[(tr + ROW_GROUPS * i) * Q_STRIDE + g]);
                }
                {
                    const i = 1u;
                    qv[i] = vec4<qk_acc_t>(sQ[(tr + ROW_GROUPS * i) * Q_STRIDE + g]);
                }
                {
                    const i = 2u;
                    qv[i] = vec4<qk_acc_t>(sQ[(tr + ROW_GROUPS * i) * Q_STRIDE + g]);
                }
                {
                    const i = 3u;
                    qv[i] = vec4<qk_acc_t>(sQ[(tr + ROW_GROUPS * i) * Q_STRIDE + g]);
                }
                // for u < KEYS (8), unrolled: one block per u
                {
                    const u = 0u;
                    let kv = vec4<qk_acc_t>(sKV[(tc + THREADS_PER_ROW * u) * K_STRIDE + g]);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 1u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 2u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 3u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                }
                {
                    const u = 1u;
                    let kv = vec4<qk_acc_t>(sKV[(tc + THREADS_PER_ROW * u) * K_STRIDE + g]);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 1u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 2u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 3u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                }
                {
                    const u = 2u;
                    let kv = vec4<qk_acc_t>(sKV[(tc + THREADS_PER_ROW * u) * K_STRIDE + g]);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 1u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 2u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 3u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                }
                {
                    const u = 3u;
                    let kv = vec4<qk_acc_t>(sKV[(tc + THREADS_PER_ROW * u) * K_STRIDE + g]);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 1u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 2u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 3u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                }
                {
                    const u = 4u;
                    let kv = vec4<qk_acc_t>(sKV[(tc + THREADS_PER_ROW * u) * K_STRIDE + g]);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 1u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 2u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 3u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                }
                {
                    const u = 5u;
                    let kv = vec4<qk_acc_t>(sKV[(tc + THREADS_PER_ROW * u) * K_STRIDE + g]);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 1u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 2u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 3u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                }
                {
                    const u = 6u;
                    let kv = vec4<qk_acc_t>(sKV[(tc + THREADS_PER_ROW * u) * K_STRIDE + g]);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 1u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 2u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 3u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                }
                {
                    const u = 7u;
                    let kv = vec4<qk_acc_t>(sKV[(tc + THREADS_PER_ROW * u) * K_STRIDE + g]);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 1u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 2u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 3u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                }
            }
        }
workgroupBarrier();  // every invocation is done with sQ and sKV before the next chunk overwrites them
        }
        {  // chunk 3: the prefetched Q and K chunks into workgroup memory, then fetch the next step's
        // for n < Q_ITEMS (4), unrolled: one block per n
        {
            const n = 0u;
            let e = lid + n * WORKGROUP_SIZE;
            if (e < TILE_Q * (TILE_DQK / 4u)) {
                sQ[(e / (TILE_DQK / 4u)) * Q_STRIDE + e % (TILE_DQK / 4u)] = next_q[n];
            }
        }
        {
            const n = 1u;
            let e = lid + n * WORKGROUP_SIZE;
            if (e < TILE_Q * (TILE_DQK / 4u)) {
                sQ[(e / (TILE_DQK / 4u)) * Q_STRIDE + e % (TILE_DQK / 4u)] = next_q[n];
            }
        }
        {
            const n = 2u;
            let e = lid + n * WORKGROUP_SIZE;
            if (e < TILE_Q * (TILE_DQK / 4u)) {
                sQ[(e / (TILE_DQK / 4u)) * Q_STRIDE + e % (TILE_DQK / 4u)] = next_q[n];
            }
        }
        {
            const n = 3u;
            let e = lid + n * WORKGROUP_SIZE;
            if (e < TILE_Q * (TILE_DQK / 4u)) {
                sQ[(e / (TILE_DQK / 4u)) * Q_STRIDE + e % (TILE_DQK / 4u)] = next_q[n];
            }
        }
        // for n < K_ITEMS (2), unrolled: one block per n
        {
            const n = 0u;
            let e = lid + n * WORKGROUP_SIZE;
            if (e < TILE_KV * (TILE_DQK / 4u)) {
                sKV[(e / (TILE_DQK / 4u)) * K_STRIDE + e % (TILE_DQK / 4u)] = next_k[n];
            }
        }
        {
            const n = 1u;
            let e = lid + n * WORKGROUP_SIZE;
            if (e < TILE_KV * (TILE_DQK / 4u)) {
                sKV[(e / (TILE_DQK / 4u)) * K_STRIDE + e % (TILE_DQK / 4u)] = next_k[n];
            }
        }
workgroupBarrier();
        // for n < V_ITEMS (2), unrolled: one block per n
        {
            const n = 0u;
            let e = lid + n * WORKGROUP_SIZE;
            let key = u32(j0) + e / (TILE_DV / 4u);
            var x = vec4<elem_t>();
            if (e < TILE_KV * (TILE_DV / 4u) && key < seq.len_k) {
                x = v_at4(seq, key, kv_head, v0 + 4u * (e % (TILE_DV / 4u)));  // cache or appended row
            }
            next_v[n] = x;
        }
        {
            const n = 1u;
            let e = lid + n * WORKGROUP_SIZE;
            let key = u32(j0) + e / (TILE_DV / 4u);
            var x = vec4<elem_t>();
            if (e < TILE_KV * (TILE_DV / 4u) && key < seq.len_k) {
                x = v_at4(seq, key, kv_head, v0 + 4u * (e % (TILE_DV / 4u)));  // cache or appended row
            }
            next_v[n] = x;
        }
        for (var c = 0u; c < TILE_DQK / 4u; c += DIM_CHUNK_QK) {  // in chunks: see DIM_CHUNK_QK
            for (var x = 0u; x < DIM_CHUNK_QK; x++) {
                let g = c + x;  // vec4 column group of the chunk
                var qv: array<vec4<qk_acc_t>, ROWS>;
                // for i < ROWS (4), unrolled: one block per i
                {
                    const i = 0u;
                    qv[i] = vec4<qk_acc_t>(sQ[(tr + ROW_GROUPS * i) * Q_STRIDE + g]);
                }
                {
                    const i = 1u;
                    qv[i] = vec4<qk_acc_t>(sQ[(tr + ROW_GROUPS * i) * Q_STRIDE + g]);
                }
                {
                    const i = 2u;
                    qv[i] = vec4<qk_acc_t>(sQ[(tr + ROW_GROUPS * i) * Q_STRIDE + g]);
                }
                {
                    const i = 3u;
                    qv[i] = vec4<qk_acc_t>(sQ[(tr + ROW_GROUPS * i) * Q_STRIDE + g]);
                }
                // for u < KEYS (8), unrolled: one block per u
                {
                    const u = 0u;
                    let kv = vec4<qk_acc_t>(sKV[(tc + THREADS_PER_ROW * u) * K_STRIDE + g]);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 1u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 2u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 3u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                }
                {
                    const u = 1u;
                    let kv = vec4<qk_acc_t>(sKV[(tc + THREADS_PER_ROW * u) * K_STRIDE + g]);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 1u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 2u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 3u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                }
                {
                    const u = 2u;
                    let kv = vec4<qk_acc_t>(sKV[(tc + THREADS_PER_ROW * u) * K_STRIDE + g]);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 1u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 2u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 3u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                }
                {
                    const u = 3u;
                    let kv = vec4<qk_acc_t>(sKV[(tc + THREADS_PER_ROW * u) * K_STRIDE + g]);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 1u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 2u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 3u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                }
                {
                    const u = 4u;
                    let kv = vec4<qk_acc_t>(sKV[(tc + THREADS_PER_ROW * u) * K_STRIDE + g]);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 1u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 2u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 3u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                }
                {
                    const u = 5u;
                    let kv = vec4<qk_acc_t>(sKV[(tc + THREADS_PER_ROW * u) * K_STRIDE + g]);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 1u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 2u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 3u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                }
                {
                    const u = 6u;
                    let kv = vec4<qk_acc_t>(sKV[(tc + THREADS_PER_ROW * u) * K_STRIDE + g]);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 1u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 2u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 3u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                }
                {
                    const u = 7u;
                    let kv = vec4<qk_acc_t>(sKV[(tc + THREADS_PER_ROW * u) * K_STRIDE + g]);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 1u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 2u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                    {
                        const i = 3u;
                        // four fused multiply-adds (dot() and += are a multiply, three FMAs and an add)
                        part[i][u] = fma(qv[i].w, kv.w, fma(qv[i].z, kv.z, fma(qv[i].y, kv.y, fma(qv[i].x, kv.x, part[i][u]))));
                    }
                }
            }
        }
workgroupBarrier();  // every invocation is done with sQ and sKV before the next chunk overwrites them
        }

        // -- score transform and mask
        let partial = !tile_is_full(seq, i32(row0), i32(row_end), j0, j0 + i32(TILE_KV));
        // for i < ROWS (4), unrolled: one block per i
        {
            const i = 0u;
            let row = q_row[i];
            // for u < KEYS (8), unrolled: one block per u
            {
                const u = 0u;
                let j = tc + THREADS_PER_ROW * u;  // the key's place in the tile
                var t = score_transform(f32(part[i][u]));
                if (partial && !visible(seq, i32(row), j0 + i32(j))) {
                    t = MASKED;
                }
                if (poisons(t)) {  // a key the row sees (masked ones are MASKED by now)
                    row_bad[i] = true;
                    t = MASKED;
                } else if (bitcast<u32>(t) == NEG_INF_BITS) {
                    t = MASKED;  // a score of -inf: p = 0, by the explicit selects below (tested on bits)
                }
                s[i][u] = t;
            }
            {
                const u = 1u;
                let j = tc + THREADS_PER_ROW * u;  // the key's place in the tile
                var t = score_transform(f32(part[i][u]));
                if (partial && !visible(seq, i32(row), j0 + i32(j))) {
                    t = MASKED;
                }
                if (poisons(t)) {  // a key the row sees (masked ones are MASKED by now)
                    row_bad[i] = true;
                    t = MASKED;
                } else if (bitcast<u32>(t) == NEG_INF_BITS) {
                    t = MASKED;  // a score of -inf: p = 0, by the explicit selects below (tested on bits)
                }
                s[i][u] = t;
            }
            {
                const u = 2u;
                let j = tc + THREADS_PER_ROW * u;  // the key's place in the tile
                var t = score_transform(f32(part[i][u]));
                if (partial && !visible(seq, i32(row), j0 + i32(j))) {
                    t = MASKED;
                }
                if (poisons(t)) {  // a key the row sees (masked ones are MASKED by now)
                    row_bad[i] = true;
                    t = MASKED;
                } else if (bitcast<u32>(t) == NEG_INF_BITS) {
                    t = MASKED;  // a score of -inf: p = 0, by the explicit selects below (tested on bits)
                }
                s[i][u] = t;
            }
            {
                const u = 3u;
                let j = tc + THREADS_PER_ROW * u;  // the key's place in the tile
                var t = score_transform(f32(part[i][u]));
                if (partial && !visible(seq, i32(row), j0 + i32(j))) {
                    t = MASKED;
                }
                if (poisons(t)) {  // a key the row sees (masked ones are MASKED by now)
                    row_bad[i] = true;
                    t = MASKED;
                } else if (bitcast<u32>(t) == NEG_INF_BITS) {
                    t = MASKED;  // a score of -inf: p = 0, by the explicit selects below (tested on bits)
                }
                s[i][u] = t;
            }
            {
                const u = 4u;
                let j = tc + THREADS_PER_ROW * u;  // the key's place in the tile
                var t = score_transform(f32(part[i][u]));
                if (partial && !visible(seq, i32(row), j0 + i32(j))) {
                    t = MASKED;
                }
                if (poisons(t)) {  // a key the row sees (masked ones are MASKED by now)
                    row_bad[i] = true;
                    t = MASKED;
                } else if (bitcast<u32>(t) == NEG_INF_BITS) {
                    t = MASKED;  // a score of -inf: p = 0, by the explicit selects below (tested on bits)
                }
                s[i][u] = t;
            }
            {
                const u = 5u;
                let j = tc + THREADS_PER_ROW * u;  // the key's place in the tile
                var t = score_transform(f32(part[i][u]));
                if (partial && !visible(seq, i32(row), j0 + i32(j))) {
                    t = MASKED;
                }
                if (poisons(t)) {  // a key the row sees (masked ones are MASKED by now)
                    row_bad[i] = true;
                    t = MASKED;
                } else if (bitcast<u32>(t) == NEG_INF_BITS) {
                    t = MASKED;  // a score of -inf: p = 0, by the explicit selects below (tested on bits)
                }
                s[i][u] = t;
            }
            {
                const u = 6u;
                let j = tc + THREADS_PER_ROW * u;  // the key's place in the tile
                var t = score_transform(f32(part[i][u]));
                if (partial && !visible(seq, i32(row), j0 + i32(j))) {
                    t = MASKED;
                }
                if (poisons(t)) {  // a key the row sees (masked ones are MASKED by now)
                    row_bad[i] = true;
                    t = MASKED;
                } else if (bitcast<u32>(t) == NEG_INF_BITS) {
                    t = MASKED;  // a score of -inf: p = 0, by the explicit selects below (tested on bits)
                }
                s[i][u] = t;
            }
            {
                const u = 7u;
                let j = tc + THREADS_PER_ROW * u;  // the key's place in the tile
                var t = score_transform(f32(part[i][u]));
                if (partial && !visible(seq, i32(row), j0 + i32(j))) {
                    t = MASKED;
                }
                if (poisons(t)) {  // a key the row sees (masked ones are MASKED by now)
                    row_bad[i] = true;
                    t = MASKED;
                } else if (bitcast<u32>(t) == NEG_INF_BITS) {
                    t = MASKED;  // a score of -inf: p = 0, by the explicit selects below (tested on bits)
                }
                s[i][u] = t;
            }
        }
        {
            const i = 1u;
            let row = q_row[i];
            // for u < KEYS (8), unrolled: one block per u
            {
                const u = 0u;
                let j = tc + THREADS_PER_ROW * u;  // the key's place in the tile
                var t = score_transform(f32(part[i][u]));
                if (partial && !visible(seq, i32(row), j0 + i32(j))) {
                    t = MASKED;
                }
                if (poisons(t)) {  // a key the row sees (masked ones are MASKED by now)
                    row_bad[i] = true;
                    t = MASKED;
                } else if (bitcast<u32>(t) == NEG_INF_BITS) {
                    t = MASKED;  // a score of -inf: p = 0, by the explicit selects below (tested on bits)
                }
                s[i][u] = t;
            }
            {
                const u = 1u;
                let j = tc + THREADS_PER_ROW * u;  // the key's place in the tile
                var t = score_transform(f32(part[i][u]));
                if (partial && !visible(seq, i32(row), j0 + i32(j))) {
                    t = MASKED;
                }
                if (poisons(t)) {  // a key the row sees (masked ones are MASKED by now)
                    row_bad[i] = true;
                    t = MASKED;
                } else if (bitcast<u32>(t) == NEG_INF_BITS) {
                    t = MASKED;  // a score of -inf: p = 0, by the explicit selects below (tested on bits)
                }
                s[i][u] = t;
            }
            {
                const u = 2u;
                let j = tc + THREADS_PER_ROW * u;  // the key's place in the tile
                var t = score_transform(f32(part[i][u]));
                if (partial && !visible(seq, i32(row), j0 + i32(j))) {
                    t = MASKED;
                }
                if (poisons(t)) {  // a key the row sees (masked ones are MASKED by now)
                    row_bad[i] = true;
                    t = MASKED;
                } else if (bitcast<u32>(t) == NEG_INF_BITS) {
                    t = MASKED;  // a score of -inf: p = 0, by the explicit selects below (tested on bits)
                }
                s[i][u] = t;
            }
            {
                const u = 3u;
                let j = tc + THREADS_PER_ROW * u;  // the key's place in the tile
                var t = score_transform(f32(part[i][u]));
                if (partial && !visible(seq, i32(row), j0 + i32(j))) {
                    t = MASKED;
                }
                if (poisons(t)) {  // a key the row sees (masked ones are MASKED by now)
                    row_bad[i] = true;
                    t = MASKED;
                } else if (bitcast<u32>(t) == NEG_INF_BITS) {
                    t = MASKED;  // a score of -inf: p = 0, by the explicit selects below (tested on bits)
                }
                s[i][u] = t;
            }
            {
                const u = 4u;
                let j = tc + THREADS_PER_ROW * u;  // the key's place in the tile
                var t = score_transform(f32(part[i][u]));
                if (partial && !visible(seq, i32(row), j0 + i32(j))) {
                    t = MASKED;
                }
                if (poisons(t)) {  // a key the row sees (masked ones are MASKED by now)
                    row_bad[i] = true;
                    t = MASKED;
                } else if (bitcast<u32>(t) == NEG_INF_BITS) {
                    t = MASKED;  // a score of -inf: p = 0, by the explicit selects below (tested on bits)
                }
                s[i][u] = t;
            }
            {
                const u = 5u;
                let j = tc + THREADS_PER_ROW * u;  // the key's place in the tile
                var t = score_transform(f32(part[i][u]));
                if (partial && !visible(seq, i32(row), j0 + i32(j))) {
                    t = MASKED;
                }
                if (poisons(t)) {  // a key the row sees (masked ones are MASKED by now)
                    row_bad[i] = true;
                    t = MASKED;
                } else if (bitcast<u32>(t) == NEG_INF_BITS) {
                    t = MASKED;  // a score of -inf: p = 0, by the explicit selects below (tested on bits)
                }
                s[i][u] = t;
            }
            {
                const u = 6u;
                let j = tc + THREADS_PER_ROW * u;  // the key's place in the tile
                var t = score_transform(f32(part[i][u]));
                if (partial && !visible(seq, i32(row), j0 + i32(j))) {
                    t = MASKED;
                }
                if (poisons(t)) {  // a key the row sees (masked ones are MASKED by now)
                    row_bad[i] = true;
                    t = MASKED;
                } else if (bitcast<u32>(t) == NEG_INF_BITS) {
                    t = MASKED;  // a score of -inf: p = 0, by the explicit selects below (tested on bits)
                }
                s[i][u] = t;
            }
            {
                const u = 7u;
                let j = tc + THREADS_PER_ROW * u;  // the key's place in the tile
                var t = score_transform(f32(part[i][u]));
                if (partial && !visible(seq, i32(row), j0 + i32(j))) {
                    t = MASKED;
                }
                if (poisons(t)) {  // a key the row sees (masked ones are MASKED by now)
                    row_bad[i] = true;
                    t = MASKED;
                } else if (bitcast<u32>(t) == NEG_INF_BITS) {
                    t = MASKED;  // a score of -inf: p = 0, by the explicit selects below (tested on bits)
                }
                s[i][u] = t;
            }
        }
        {
            const i = 2u;
            let row = q_row[i];
            // for u < KEYS (8), unrolled: one block per u
            {
                const u = 0u;
                let j = tc + THREADS_PER_ROW * u;  // the key's place in the tile
                var t = score_transform(f32(part[i][u]));
                if (partial && !visible(seq, i32(row), j0 + i32(j))) {
                    t = MASKED;
                }
                if (poisons(t)) {  // a key the row sees (masked ones are MASKED by now)
                    row_bad[i] = true;
                    t = MASKED;
                } else if (bitcast<u32>(t) == NEG_INF_BITS) {
                    t = MASKED;  // a score of -inf: p = 0, by the explicit selects below (tested on bits)
                }
                s[i][u] = t;
            }
            {
                const u = 1u;
                let j = tc + THREADS_PER_ROW * u;  // the key's place in the tile
                var t = score_transform(f32(part[i][u]));
                if (partial && !visible(seq, i32(row), j0 + i32(j))) {
                    t = MASKED;
                }
                if (poisons(t)) {  // a key the row sees (masked ones are MASKED by now)
                    row_bad[i] = true;
                    t = MASKED;
                } else if (bitcast<u32>(t) == NEG_INF_BITS) {
                    t = MASKED;  // a score of -inf: p = 0, by the explicit selects below (tested on bits)
                }
                s[i][u] = t;
            }
            {
                const u = 2u;
                let j = tc + THREADS_PER_ROW * u;  // the key's place in the tile
                var t = score_transform(f32(part[i][u]));
                if (partial && !visible(seq, i32(row), j0 + i32(j))) {
                    t = MASKED;
                }
                if (poisons(t)) {  // a key the row sees (masked ones are MASKED by now)
                    row_bad[i] = true;
                    t = MASKED;
                } else if (bitcast<u32>(t) == NEG_INF_BITS) {
                    t = MASKED;  // a score of -inf: p = 0, by the explicit selects below (tested on bits)
                }
                s[i][u] = t;
            }
            {
                const u = 3u;
                let j = tc + THREADS_PER_ROW * u;  // the key's place in the tile
                var t = score_transform(f32(part[i][u]));
                if (partial && !visible(seq, i32(row), j0 + i32(j))) {
                    t = MASKED;
                }
                if (poisons(t)) {  // a key the row sees (masked ones are MASKED by now)
                    row_bad[i] = true;
                    t = MASKED;
                } else if (bitcast<u32>(t) == NEG_INF_BITS) {
                    t = MASKED;  // a score of -inf: p = 0, by the explicit selects below (tested on bits)
                }
                s[i][u] = t;
            }
            {
                const u = 4u;
                let j = tc + THREADS_PER_ROW * u;  // the key's place in the tile
                var t = score_transform(f32(part[i][u]));
                if (partial && !visible(seq, i32(row), j0 + i32(j))) {
                    t = MASKED;
                }
                if (poisons(t)) {  // a key the row sees (masked ones are MASKED by now)
                    row_bad[i] = true;
                    t = MASKED;
                } else if (bitcast<u32>(t) == NEG_INF_BITS) {
                    t = MASKED;  // a score of -inf: p = 0, by the explicit selects below (tested on bits)
                }
                s[i][u] = t;
            }
            {
                const u = 5u;
                let j = tc + THREADS_PER_ROW * u;  // the key's place in the tile
                var t = score_transform(f32(part[i][u]));
                if (partial && !visible(seq, i32(row), j0 + i32(j))) {
                    t = MASKED;
                }
                if (poisons(t)) {  // a key the row sees (masked ones are MASKED by now)
                    row_bad[i] = true;
                    t = MASKED;
                } else if (bitcast<u32>(t) == NEG_INF_BITS) {
                    t = MASKED;  // a score of -inf: p = 0, by the explicit selects below (tested on bits)
                }
                s[i][u] = t;
            }
            {
                const u = 6u;
                let j = tc + THREADS_PER_ROW * u;  // the key's place in the tile
                var t = score_transform(f32(part[i][u]));
                if (partial && !visible(seq, i32(row), j0 + i32(j))) {
                    t = MASKED;
                }
                if (poisons(t)) {  // a key the row sees (masked ones are MASKED by now)
                    row_bad[i] = true;
                    t = MASKED;
                } else if (bitcast<u32>(t) == NEG_INF_BITS) {
                    t = MASKED;  // a score of -inf: p = 0, by the explicit selects below (tested on bits)
                }
                s[i][u] = t;
            }
            {
                const u = 7u;
                let j = tc + THREADS_PER_ROW * u;  // the key's place in the tile
                var t = score_transform(f32(part[i][u]));
                if (partial && !visible(seq, i32(row), j0 + i32(j))) {
                    t = MASKED;
                }
                if (poisons(t)) {  // a key the row sees (masked ones are MASKED by now)
                    row_bad[i] = true;
                    t = MASKED;
                } else if (bitcast<u32>(t) == NEG_INF_BITS) {
                    t = MASKED;  // a score of -inf: p = 0, by the explicit selects below (tested on bits)
                }
                s[i][u] = t;
            }
        }
        {
            const i = 3u;
            let row = q_row[i];
            // for u < KEYS (8), unrolled: one block per u
            {
                const u = 0u;
                let j = tc + THREADS_PER_ROW * u;  // the key's place in the tile
                var t = score_transform(f32(part[i][u]));
                if (partial && !visible(seq, i32(row), j0 + i32(j))) {
                    t = MASKED;
                }
                if (poisons(t)) {  // a key the row sees (masked ones are MASKED by now)
                    row_bad[i] = true;
                    t = MASKED;
                } else if (bitcast<u32>(t) == NEG_INF_BITS) {
                    t = MASKED;  // a score of -inf: p = 0, by the explicit selects below (tested on bits)
                }
                s[i][u] = t;
            }
            {
                const u = 1u;
                let j = tc + THREADS_PER_ROW * u;  // the key's place in the tile
                var t = score_transform(f32(part[i][u]));
                if (partial && !visible(seq, i32(row), j0 + i32(j))) {
                    t = MASKED;
                }
                if (poisons(t)) {  // a key the row sees (masked ones are MASKED by now)
                    row_bad[i] = true;
                    t = MASKED;
                } else if (bitcast<u32>(t) == NEG_INF_BITS) {
                    t = MASKED;  // a score of -inf: p = 0, by the explicit selects below (tested on bits)
                }
                s[i][u] = t;
            }
            {
                const u = 2u;
                let j = tc + THREADS_PER_ROW * u;  // the key's place in the tile
                var t = score_transform(f32(part[i][u]));
                if (partial && !visible(seq, i32(row), j0 + i32(j))) {
                    t = MASKED;
                }
                if (poisons(t)) {  // a key the row sees (masked ones are MASKED by now)
                    row_bad[i] = true;
                    t = MASKED;
                } else if (bitcast<u32>(t) == NEG_INF_BITS) {
                    t = MASKED;  // a score of -inf: p = 0, by the explicit selects below (tested on bits)
                }
                s[i][u] = t;
            }
            {
                const u = 3u;
                let j = tc + THREADS_PER_ROW * u;  // the key's place in the tile
                var t = score_transform(f32(part[i][u]));
                if (partial && !visible(seq, i32(row), j0 + i32(j))) {
                    t = MASKED;
                }
                if (poisons(t)) {  // a key the row sees (masked ones are MASKED by now)
                    row_bad[i] = true;
                    t = MASKED;
                } else if (bitcast<u32>(t) == NEG_INF_BITS) {
                    t = MASKED;  // a score of -inf: p = 0, by the explicit selects below (tested on bits)
                }
                s[i][u] = t;
            }
            {
                const u = 4u;
                let j = tc + THREADS_PER_ROW * u;  // the key's place in the tile
                var t = score_transform(f32(part[i][u]));
                if (partial && !visible(seq, i32(row), j0 + i32(j))) {
                    t = MASKED;
                }
                if (poisons(t)) {  // a key the row sees (masked ones are MASKED by now)
                    row_bad[i] = true;
                    t = MASKED;
                } else if (bitcast<u32>(t) == NEG_INF_BITS) {
                    t = MASKED;  // a score of -inf: p = 0, by the explicit selects below (tested on bits)
                }
                s[i][u] = t;
            }
            {
                const u = 5u;
                let j = tc + THREADS_PER_ROW * u;  // the key's place in the tile
                var t = score_transform(f32(part[i][u]));
                if (partial && !visible(seq, i32(row), j0 + i32(j))) {
                    t = MASKED;
                }
                if (poisons(t)) {  // a key the row sees (masked ones are MASKED by now)
                    row_bad[i] = true;
                    t = MASKED;
                } else if (bitcast<u32>(t) == NEG_INF_BITS) {
                    t = MASKED;  // a score of -inf: p = 0, by the explicit selects below (tested on bits)
                }
                s[i][u] = t;
            }
            {
                const u = 6u;
                let j = tc + THREADS_PER_ROW * u;  // the key's place in the tile
                var t = score_transform(f32(part[i][u]));
                if (partial && !visible(seq, i32(row), j0 + i32(j))) {
                    t = MASKED;
                }
                if (poisons(t)) {  // a key the row sees (masked ones are MASKED by now)
                    row_bad[i] = true;
                    t = MASKED;
                } else if (bitcast<u32>(t) == NEG_INF_BITS) {
                    t = MASKED;  // a score of -inf: p = 0, by the explicit selects below (tested on bits)
                }
                s[i][u] = t;
            }
            {
                const u = 7u;
                let j = tc + THREADS_PER_ROW * u;  // the key's place in the tile
                var t = score_transform(f32(part[i][u]));
                if (partial && !visible(seq, i32(row), j0 + i32(j))) {
                    t = MASKED;
                }
                if (poisons(t)) {  // a key the row sees (masked ones are MASKED by now)
                    row_bad[i] = true;
                    t = MASKED;
                } else if (bitcast<u32>(t) == NEG_INF_BITS) {
                    t = MASKED;  // a score of -inf: p = 0, by the explicit selects below (tested on bits)
                }
                s[i][u] = t;
            }
        }

        // -- online softmax: m_i, l_i, alpha
        var m_new: array<f32, ROWS>;
        // for i < ROWS (4), unrolled: one block per i
        {
            const i = 0u;
            var m = m_i[i];
            // for u < KEYS (8), unrolled: one block per u
            {
                const u = 0u;
                m = max(m, s[i][u]);
            }
            {
                const u = 1u;
                m = max(m, s[i][u]);
            }
            {
                const u = 2u;
                m = max(m, s[i][u]);
            }
            {
                const u = 3u;
                m = max(m, s[i][u]);
            }
            {
                const u = 4u;
                m = max(m, s[i][u]);
            }
            {
                const u = 5u;
                m = max(m, s[i][u]);
            }
            {
                const u = 6u;
                m = max(m, s[i][u]);
            }
            {
                const u = 7u;
                m = max(m, s[i][u]);
            }
            m_new[i] = m;
        }
        {
            const i = 1u;
            var m = m_i[i];
            // for u < KEYS (8), unrolled: one block per u
            {
                const u = 0u;
                m = max(m, s[i][u]);
            }
            {
                const u = 1u;
                m = max(m, s[i][u]);
            }
            {
                const u = 2u;
                m = max(m, s[i][u]);
            }
            {
                const u = 3u;
                m = max(m, s[i][u]);
            }
            {
                const u = 4u;
                m = max(m, s[i][u]);
            }
            {
                const u = 5u;
                m = max(m, s[i][u]);
            }
            {
                const u = 6u;
                m = max(m, s[i][u]);
            }
            {
                const u = 7u;
                m = max(m, s[i][u]);
            }
            m_new[i] = m;
        }
        {
            const i = 2u;
            var m = m_i[i];
            // for u < KEYS (8), unrolled: one block per u
            {
                const u = 0u;
                m = max(m, s[i][u]);
            }
            {
                const u = 1u;
                m = max(m, s[i][u]);
            }
            {
                const u = 2u;
                m = max(m, s[i][u]);
            }
            {
                const u = 3u;
                m = max(m, s[i][u]);
            }
            {
                const u = 4u;
                m = max(m, s[i][u]);
            }
            {
                const u = 5u;
                m = max(m, s[i][u]);
            }
            {
                const u = 6u;
                m = max(m, s[i][u]);
            }
            {
                const u = 7u;
                m = max(m, s[i][u]);
            }
            m_new[i] = m;
        }
        {
            const i = 3u;
            var m = m_i[i];
            // for u < KEYS (8), unrolled: one block per u
            {
                const u = 0u;
                m = max(m, s[i][u]);
            }
            {
                const u = 1u;
                m = max(m, s[i][u]);
            }
            {
                const u = 2u;
                m = max(m, s[i][u]);
            }
            {
                const u = 3u;
                m = max(m, s[i][u]);
            }
            {
                const u = 4u;
                m = max(m, s[i][u]);
            }
            {
                const u = 5u;
                m = max(m, s[i][u]);
            }
            {
                const u = 6u;
                m = max(m, s[i][u]);
            }
            {
                const u = 7u;
                m = max(m, s[i][u]);
            }
            m_new[i] = m;
        }
        // the rows' max over all their keys: over the row's THREADS_PER_ROW invocations
        // for i < ROWS (4), unrolled: one block per i
        {
            const i = 0u;
            m_new[i] = max_over_row(m_new[i]);
        }
        {
            const i = 1u;
            m_new[i] = max_over_row(m_new[i]);
        }
        {
            const i = 2u;
            m_new[i] = max_over_row(m_new[i]);
        }
        {
            const i = 3u;
            m_new[i] = max_over_row(m_new[i]);
        }
        // A row that has seen no key yet keeps m = MASKED; subtracting 0 instead keeps the
        // exponents finite, and the selects give p = 0 and alpha = 0 without relying on exp2
        // of a huge negative number.
        var alpha: array<f32, ROWS>;
        // a key of this invocation's rows has p = 0 (see O += P V): masked, or its exp2 underflowed
        // (a finite score far below the row's max); tested on the bits, which no fast math folds
        var p_zero = false;
        // for i < ROWS (4), unrolled: one block per i
        {
            const i = 0u;
            let m_use = select(m_new[i], 0.0, m_new[i] <= MASKED);
            alpha[i] = select(exp2(m_i[i] - m_use), 0.0, m_i[i] <= MASKED);
            m_i[i] = m_new[i];
            var row_sum = 0.0;
            // for u < KEYS (8), unrolled: one block per u
            {
                const u = 0u;
                let masked = s[i][u] <= MASKED;
                let p = select(exp2(s[i][u] - m_use), 0.0, masked);
                s[i][u] = p;
                row_sum += p;
                p_zero = p_zero || bitcast<u32>(p) == 0u;
            }
            {
                const u = 1u;
                let masked = s[i][u] <= MASKED;
                let p = select(exp2(s[i][u] - m_use), 0.0, masked);
                s[i][u] = p;
                row_sum += p;
                p_zero = p_zero || bitcast<u32>(p) == 0u;
            }
            {
                const u = 2u;
                let masked = s[i][u] <= MASKED;
                let p = select(exp2(s[i][u] - m_use), 0.0, masked);
                s[i][u] = p;
                row_sum += p;
                p_zero = p_zero || bitcast<u32>(p) == 0u;
            }
            {
                const u = 3u;
                let masked = s[i][u] <= MASKED;
                let p = select(exp2(s[i][u] - m_use), 0.0, masked);
                s[i][u] = p;
                row_sum += p;
                p_zero = p_zero || bitcast<u32>(p) == 0u;
            }
            {
                const u = 4u;
                let masked = s[i][u] <= MASKED;
                let p = select(exp2(s[i][u] - m_use), 0.0, masked);
                s[i][u] = p;
                row_sum += p;
                p_zero = p_zero || bitcast<u32>(p) == 0u;
            }
            {
                const u = 5u;
                let masked = s[i][u] <= MASKED;
                let p = select(exp2(s[i][u] - m_use), 0.0, masked);
                s[i][u] = p;
                row_sum += p;
                p_zero = p_zero || bitcast<u32>(p) == 0u;
            }
            {
                const u = 6u;
                let masked = s[i][u] <= MASKED;
                let p = select(exp2(s[i][u] - m_use), 0.0, masked);
                s[i][u] = p;
                row_sum += p;
                p_zero = p_zero || bitcast<u32>(p) == 0u;
            }
            {
                const u = 7u;
                let masked = s[i][u] <= MASKED;
                let p = select(exp2(s[i][u] - m_use), 0.0, masked);
                s[i][u] = p;
                row_sum += p;
                p_zero = p_zero || bitcast<u32>(p) == 0u;
            }
            l_i[i] = l_i[i] * alpha[i] + row_sum;
        }
        {
            const i = 1u;
            let m_use = select(m_new[i], 0.0, m_new[i] <= MASKED);
            alpha[i] = select(exp2(m_i[i] - m_use), 0.0, m_i[i] <= MASKED);
            m_i[i] = m_new[i];
            var row_sum = 0.0;
            // for u < KEYS (8), unrolled: one block per u
            {
                const u = 0u;
                let masked = s[i][u] <= MASKED;
                let p = select(exp2(s[i][u] - m_use), 0.0, masked);
                s[i][u] = p;
                row_sum += p;
                p_zero = p_zero || bitcast<u32>(p) == 0u;
            }
            {
                const u = 1u;
                let masked = s[i][u] <= MASKED;
                let p = select(exp2(s[i][u] - m_use), 0.0, masked);
                s[i][u] = p;
                row_sum += p;
                p_zero = p_zero || bitcast<u32>(p) == 0u;
            }
            {
                const u = 2u;
                let masked = s[i][u] <= MASKED;
                let p = select(exp2(s[i][u] - m_use), 0.0, masked);
                s[i][u] = p;
                row_sum += p;
                p_zero = p_zero || bitcast<u32>(p) == 0u;
            }
            {
                const u = 3u;
                let masked = s[i][u] <= MASKED;
                let p = select(exp2(s[i][u] - m_use), 0.0, masked);
                s[i][u] = p;
                row_sum += p;
                p_zero = p_zero || bitcast<u32>(p) == 0u;
            }
            {
                const u = 4u;
                let masked = s[i][u] <= MASKED;
                let p = select(exp2(s[i][u] - m_use), 0.0, masked);
                s[i][u] = p;
                row_sum += p;
                p_zero = p_zero || bitcast<u32>(p) == 0u;
            }
            {
                const u = 5u;
                let masked = s[i][u] <= MASKED;
                let p = select(exp2(s[i][u] - m_use), 0.0, masked);
                s[i][u] = p;
                row_sum += p;
                p_zero = p_zero || bitcast<u32>(p) == 0u;
            }
            {
                const u = 6u;
                let masked = s[i][u] <= MASKED;
                let p = select(exp2(s[i][u] - m_use), 0.0, masked);
                s[i][u] = p;
                row_sum += p;
                p_zero = p_zero || bitcast<u32>(p) == 0u;
            }
            {
                const u = 7u;
                let masked = s[i][u] <= MASKED;
                let p = select(exp2(s[i][u] - m_use), 0.0, masked);
                s[i][u] = p;
                row_sum += p;
                p_zero = p_zero || bitcast<u32>(p) == 0u;
            }
            l_i[i] = l_i[i] * alpha[i] + row_sum;
        }
        {
            const i = 2u;
            let m_use = select(m_new[i], 0.0, m_new[i] <= MASKED);
            alpha[i] = select(exp2(m_i[i] - m_use), 0.0, m_i[i] <= MASKED);
            m_i[i] = m_new[i];
            var row_sum = 0.0;
            // for u < KEYS (8), unrolled: one block per u
            {
                const u = 0u;
                let masked = s[i][u] <= MASKED;
                let p = select(exp2(s[i][u] - m_use), 0.0, masked);
                s[i][u] = p;
                row_sum += p;
                p_zero = p_zero || bitcast<u32>(p) == 0u;
            }
            {
                const u = 1u;
                let masked = s[i][u] <= MASKED;
                let p = select(exp2(s[i][u] - m_use), 0.0, masked);
                s[i][u] = p;
                row_sum += p;
                p_zero = p_zero || bitcast<u32>(p) == 0u;
            }
            {
                const u = 2u;
                let masked = s[i][u] <= MASKED;
                let p = select(exp2(s[i][u] - m_use), 0.0, masked);
                s[i][u] = p;
                row_sum += p;
                p_zero = p_zero || bitcast<u32>(p) == 0u;
            }
            {
                const u = 3u;
                let masked = s[i][u] <= MASKED;
                let p = select(exp2(s[i][u] - m_use), 0.0, masked);
                s[i][u] = p;
                row_sum += p;
                p_zero = p_zero || bitcast<u32>(p) == 0u;
            }
            {
                const u = 4u;
                let masked = s[i][u] <= MASKED;
                let p = select(exp2(s[i][u] - m_use), 0.0, masked);
                s[i][u] = p;
                row_sum += p;
                p_zero = p_zero || bitcast<u32>(p) == 0u;
            }
            {
                const u = 5u;
                let masked = s[i][u] <= MASKED;
                let p = select(exp2(s[i][u] - m_use), 0.0, masked);
                s[i][u] = p;
                row_sum += p;
                p_zero = p_zero || bitcast<u32>(p) == 0u;
            }
            {
                const u = 6u;
                let masked = s[i][u] <= MASKED;
                let p = select(exp2(s[i][u] - m_use), 0.0, masked);
                s[i][u] = p;
                row_sum += p;
                p_zero = p_zero || bitcast<u32>(p) == 0u;
            }
            {
                const u = 7u;
                let masked = s[i][u] <= MASKED;
                let p = select(exp2(s[i][u] - m_use), 0.0, masked);
                s[i][u] = p;
                row_sum += p;
                p_zero = p_zero || bitcast<u32>(p) == 0u;
            }
            l_i[i] = l_i[i] * alpha[i] + row_sum;
        }
        {
            const i = 3u;
            let m_use = select(m_new[i], 0.0, m_new[i] <= MASKED);
            alpha[i] = select(exp2(m_i[i] - m_use), 0.0, m_i[i] <= MASKED);
            m_i[i] = m_new[i];
            var row_sum = 0.0;
            // for u < KEYS (8), unrolled: one block per u
            {
                const u = 0u;
                let masked = s[i][u] <= MASKED;
                let p = select(exp2(s[i][u] - m_use), 0.0, masked);
                s[i][u] = p;
                row_sum += p;
                p_zero = p_zero || bitcast<u32>(p) == 0u;
            }
            {
                const u = 1u;
                let masked = s[i][u] <= MASKED;
                let p = select(exp2(s[i][u] - m_use), 0.0, masked);
                s[i][u] = p;
                row_sum += p;
                p_zero = p_zero || bitcast<u32>(p) == 0u;
            }
            {
                const u = 2u;
                let masked = s[i][u] <= MASKED;
                let p = select(exp2(s[i][u] - m_use), 0.0, masked);
                s[i][u] = p;
                row_sum += p;
                p_zero = p_zero || bitcast<u32>(p) == 0u;
            }
            {
                const u = 3u;
                let masked = s[i][u] <= MASKED;
                let p = select(exp2(s[i][u] - m_use), 0.0, masked);
                s[i][u] = p;
                row_sum += p;
                p_zero = p_zero || bitcast<u32>(p) == 0u;
            }
            {
                const u = 4u;
                let masked = s[i][u] <= MASKED;
                let p = select(exp2(s[i][u] - m_use), 0.0, masked);
                s[i][u] = p;
                row_sum += p;
                p_zero = p_zero || bitcast<u32>(p) == 0u;
            }
            {
                const u = 5u;
                let masked = s[i][u] <= MASKED;
                let p = select(exp2(s[i][u] - m_use), 0.0, masked);
                s[i][u] = p;
                row_sum += p;
                p_zero = p_zero || bitcast<u32>(p) == 0u;
            }
            {
                const u = 6u;
                let masked = s[i][u] <= MASKED;
                let p = select(exp2(s[i][u] - m_use), 0.0, masked);
                s[i][u] = p;
                row_sum += p;
                p_zero = p_zero || bitcast<u32>(p) == 0u;
            }
            {
                const u = 7u;
                let masked = s[i][u] <= MASKED;
                let p = select(exp2(s[i][u] - m_use), 0.0, masked);
                s[i][u] = p;
                row_sum += p;
                p_zero = p_zero || bitcast<u32>(p) == 0u;
            }
            l_i[i] = l_i[i] * alpha[i] + row_sum;
        }

        // -- P of the tile to sP: each row's invocations need all of its keys for P V
        // for i < ROWS (4), unrolled: one block per i
        {
            const i = 0u;
            // for u < KEYS (8), unrolled: one block per u
            {
                const u = 0u;
                let key = tc + THREADS_PER_ROW * u;
                sP[(tr + ROW_GROUPS * i) * P_STRIDE + key / 4u][key % 4u] = s[i][u];
            }
            {
                const u = 1u;
                let key = tc + THREADS_PER_ROW * u;
                sP[(tr + ROW_GROUPS * i) * P_STRIDE + key / 4u][key % 4u] = s[i][u];
            }
            {
                const u = 2u;
                let key = tc + THREADS_PER_ROW * u;
                sP[(tr + ROW_GROUPS * i) * P_STRIDE + key / 4u][key % 4u] = s[i][u];
            }
            {
                const u = 3u;
                let key = tc + THREADS_PER_ROW * u;
                sP[(tr + ROW_GROUPS * i) * P_STRIDE + key / 4u][key % 4u] = s[i][u];
            }
            {
                const u = 4u;
                let key = tc + THREADS_PER_ROW * u;
                sP[(tr + ROW_GROUPS * i) * P_STRIDE + key / 4u][key % 4u] = s[i][u];
            }
            {
                const u = 5u;
                let key = tc + THREADS_PER_ROW * u;
                sP[(tr + ROW_GROUPS * i) * P_STRIDE + key / 4u][key % 4u] = s[i][u];
            }
            {
                const u = 6u;
                let key = tc + THREADS_PER_ROW * u;
                sP[(tr + ROW_GROUPS * i) * P_STRIDE + key / 4u][key % 4u] = s[i][u];
            }
            {
                const u = 7u;
                let key = tc + THREADS_PER_ROW * u;
                sP[(tr + ROW_GROUPS * i) * P_STRIDE + key / 4u][key % 4u] = s[i][u];
            }
        }
        {
            const i = 1u;
            // for u < KEYS (8), unrolled: one block per u
            {
                const u = 0u;
                let key = tc + THREADS_PER_ROW * u;
                sP[(tr + ROW_GROUPS * i) * P_STRIDE + key / 4u][key % 4u] = s[i][u];
            }
            {
                const u = 1u;
                let key = tc + THREADS_PER_ROW * u;
                sP[(tr + ROW_GROUPS * i) * P_STRIDE + key / 4u][key % 4u] = s[i][u];
            }
            {
                const u = 2u;
                let key = tc + THREADS_PER_ROW * u;
                sP[(tr + ROW_GROUPS * i) * P_STRIDE + key / 4u][key % 4u] = s[i][u];
            }
            {
                const u = 3u;
                let key = tc + THREADS_PER_ROW * u;
                sP[(tr + ROW_GROUPS * i) * P_STRIDE + key / 4u][key % 4u] = s[i][u];
            }
            {
                const u = 4u;
                let key = tc + THREADS_PER_ROW * u;
                sP[(tr + ROW_GROUPS * i) * P_STRIDE + key / 4u][key % 4u] = s[i][u];
            }
            {
                const u = 5u;
                let key = tc + THREADS_PER_ROW * u;
                sP[(tr + ROW_GROUPS * i) * P_STRIDE + key / 4u][key % 4u] = s[i][u];
            }
            {
                const u = 6u;
                let key = tc + THREADS_PER_ROW * u;
                sP[(tr + ROW_GROUPS * i) * P_STRIDE + key / 4u][key % 4u] = s[i][u];
            }
            {
                const u = 7u;
                let key = tc + THREADS_PER_ROW * u;
                sP[(tr + ROW_GROUPS * i) * P_STRIDE + key / 4u][key % 4u] = s[i][u];
            }
        }
        {
            const i = 2u;
            // for u < KEYS (8), unrolled: one block per u
            {
                const u = 0u;
                let key = tc + THREADS_PER_ROW * u;
                sP[(tr + ROW_GROUPS * i) * P_STRIDE + key / 4u][key % 4u] = s[i][u];
            }
            {
                const u = 1u;
                let key = tc + THREADS_PER_ROW * u;
                sP[(tr + ROW_GROUPS * i) * P_STRIDE + key / 4u][key % 4u] = s[i][u];
            }
            {
                const u = 2u;
                let key = tc + THREADS_PER_ROW * u;
                sP[(tr + ROW_GROUPS * i) * P_STRIDE + key / 4u][key % 4u] = s[i][u];
            }
            {
                const u = 3u;
                let key = tc + THREADS_PER_ROW * u;
                sP[(tr + ROW_GROUPS * i) * P_STRIDE + key / 4u][key % 4u] = s[i][u];
            }
            {
                const u = 4u;
                let key = tc + THREADS_PER_ROW * u;
                sP[(tr + ROW_GROUPS * i) * P_STRIDE + key / 4u][key % 4u] = s[i][u];
            }
            {
                const u = 5u;
                let key = tc + THREADS_PER_ROW * u;
                sP[(tr + ROW_GROUPS * i) * P_STRIDE + key / 4u][key % 4u] = s[i][u];
            }
            {
                const u = 6u;
                let key = tc + THREADS_PER_ROW * u;
                sP[(tr + ROW_GROUPS * i) * P_STRIDE + key / 4u][key % 4u] = s[i][u];
            }
            {
                const u = 7u;
                let key = tc + THREADS_PER_ROW * u;
                sP[(tr + ROW_GROUPS * i) * P_STRIDE + key / 4u][key % 4u] = s[i][u];
            }
        }
        {
            const i = 3u;
            // for u < KEYS (8), unrolled: one block per u
            {
                const u = 0u;
                let key = tc + THREADS_PER_ROW * u;
                sP[(tr + ROW_GROUPS * i) * P_STRIDE + key / 4u][key % 4u] = s[i][u];
            }
            {
                const u = 1u;
                let key = tc + THREADS_PER_ROW * u;
                sP[(tr + ROW_GROUPS * i) * P_STRIDE + key / 4u][key % 4u] = s[i][u];
            }
            {
                const u = 2u;
                let key = tc + THREADS_PER_ROW * u;
                sP[(tr + ROW_GROUPS * i) * P_STRIDE + key / 4u][key % 4u] = s[i][u];
            }
            {
                const u = 3u;
                let key = tc + THREADS_PER_ROW * u;
                sP[(tr + ROW_GROUPS * i) * P_STRIDE + key / 4u][key % 4u] = s[i][u];
            }
            {
                const u = 4u;
                let key = tc + THREADS_PER_ROW * u;
                sP[(tr + ROW_GROUPS * i) * P_STRIDE + key / 4u][key % 4u] = s[i][u];
            }
            {
                const u = 5u;
                let key = tc + THREADS_PER_ROW * u;
                sP[(tr + ROW_GROUPS * i) * P_STRIDE + key / 4u][key % 4u] = s[i][u];
            }
            {
                const u = 6u;
                let key = tc + THREADS_PER_ROW * u;
                sP[(tr + ROW_GROUPS * i) * P_STRIDE + key / 4u][key % 4u] = s[i][u];
            }
            {
                const u = 7u;
                let key = tc + THREADS_PER_ROW * u;
                sP[(tr + ROW_GROUPS * i) * P_STRIDE + key / 4u][key % 4u] = s[i][u];
            }
        }
if (p_zero) {
            atomicMax(&p_zero_tile, u32(it) + 1u);  // seen by every invocation after the next barrier
        }
        // -- O += P V (and acc *= alpha, in the same pass), V d-chunk by d-chunk through sKV
        {  // chunk 0: the prefetched V chunk into workgroup memory, then fetch the next step's
        var nonfinite = false;
        // for n < V_ITEMS (2), unrolled: one block per n
        {
            const n = 0u;
            let e = lid + n * WORKGROUP_SIZE;
            if (e < TILE_KV * (TILE_DV / 4u)) {
                sKV[(e / (TILE_DV / 4u)) * V_STRIDE + e % (TILE_DV / 4u)] = next_v[n];
                nonfinite = nonfinite || nonfinite4(vec4<f32>(next_v[n]));
            }
        }
        {
            const n = 1u;
            let e = lid + n * WORKGROUP_SIZE;
            if (e < TILE_KV * (TILE_DV / 4u)) {
                sKV[(e / (TILE_DV / 4u)) * V_STRIDE + e % (TILE_DV / 4u)] = next_v[n];
                nonfinite = nonfinite || nonfinite4(vec4<f32>(next_v[n]));
            }
        }
        if (nonfinite) {
            atomicMax(&v_nonfinite_tile, u32(it) + 1u);  // seen by every invocation after the next barrier
        }
workgroupBarrier();  // the V chunk and P in workgroup memory
        // for n < V_ITEMS (2), unrolled: one block per n
        {
            const n = 0u;
            let e = lid + n * WORKGROUP_SIZE;
            let key = u32(j0) + e / (TILE_DV / 4u);
            var x = vec4<elem_t>();
            if (e < TILE_KV * (TILE_DV / 4u) && key < seq.len_k) {
                x = v_at4(seq, key, kv_head, v0 + 1u * TILE_DV + 4u * (e % (TILE_DV / 4u)));  // cache or appended row
            }
            next_v[n] = x;
        }
        {
            const n = 1u;
            let e = lid + n * WORKGROUP_SIZE;
            let key = u32(j0) + e / (TILE_DV / 4u);
            var x = vec4<elem_t>();
            if (e < TILE_KV * (TILE_DV / 4u) && key < seq.len_k) {
                x = v_at4(seq, key, kv_head, v0 + 1u * TILE_DV + 4u * (e % (TILE_DV / 4u)));  // cache or appended row
            }
            next_v[n] = x;
        }
        // for i < ROWS (4), unrolled: one block per i
        {
            const i = 0u;
            // for w < COL_GROUPS (1), unrolled: one block per w
            {
                const w = 0u;
                acc[i][0u * COL_GROUPS + w] *= alpha[i];
            }
        }
        {
            const i = 1u;
            // for w < COL_GROUPS (1), unrolled: one block per w
            {
                const w = 0u;
                acc[i][0u * COL_GROUPS + w] *= alpha[i];
            }
        }
        {
            const i = 2u;
            // for w < COL_GROUPS (1), unrolled: one block per w
            {
                const w = 0u;
                acc[i][0u * COL_GROUPS + w] *= alpha[i];
            }
        }
        {
            const i = 3u;
            // for w < COL_GROUPS (1), unrolled: one block per w
            {
                const w = 0u;
                acc[i][0u * COL_GROUPS + w] *= alpha[i];
            }
        }
        // keys with p = 0 (masked, a score of -inf, or an exp2 that underflowed) are selected out in tiles that have any
        // and whose V holds inf or NaN: 0 * inf is NaN, and such a key must add nothing whatever
        // its V (0 * a finite v adds exactly 0: there the plain loop is the same and faster)
        if ((partial || atomicLoad(&p_zero_tile) == u32(it) + 1u) && atomicLoad(&v_nonfinite_tile) == u32(it) + 1u) {
            // keys 4 j4 .. 4 j4 + 3: one vec4 of P per row serves 4 keys
            for (var c = 0u; c < TILE_KV / 4u; c += KEY_CHUNK) {  // in chunks: see DIM_CHUNK_QK
                for (var x = 0u; x < KEY_CHUNK; x++) {
                    let j4 = c + x;
                    var p4: array<vec4<f32>, ROWS>;
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        p4[i] = sP[(tr + ROW_GROUPS * i) * P_STRIDE + j4];
                    }
                    {
                        const i = 1u;
                        p4[i] = sP[(tr + ROW_GROUPS * i) * P_STRIDE + j4];
                    }
                    {
                        const i = 2u;
                        p4[i] = sP[(tr + ROW_GROUPS * i) * P_STRIDE + j4];
                    }
                    {
                        const i = 3u;
                        p4[i] = sP[(tr + ROW_GROUPS * i) * P_STRIDE + j4];
                    }
                    // for e < 4u, unrolled: one block per e
                    {
                        const e = 0u;
                        let j = 4u * j4 + e;
                        // for w < COL_GROUPS (1), unrolled: one block per w
                        {
                            const w = 0u;
                            let v = vec4<pv_acc_t>(sKV[j * V_STRIDE + tc + THREADS_PER_ROW * w]);
                            // for i < ROWS (4), unrolled: one block per i
                            {
                                const i = 0u;
                                acc[i][0u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 1u;
                                acc[i][0u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 2u;
                                acc[i][0u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 3u;
                                acc[i][0u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                        }
                    }
                    {
                        const e = 1u;
                        let j = 4u * j4 + e;
                        // for w < COL_GROUPS (1), unrolled: one block per w
                        {
                            const w = 0u;
                            let v = vec4<pv_acc_t>(sKV[j * V_STRIDE + tc + THREADS_PER_ROW * w]);
                            // for i < ROWS (4), unrolled: one block per i
                            {
                                const i = 0u;
                                acc[i][0u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 1u;
                                acc[i][0u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 2u;
                                acc[i][0u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 3u;
                                acc[i][0u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                        }
                    }
                    {
                        const e = 2u;
                        let j = 4u * j4 + e;
                        // for w < COL_GROUPS (1), unrolled: one block per w
                        {
                            const w = 0u;
                            let v = vec4<pv_acc_t>(sKV[j * V_STRIDE + tc + THREADS_PER_ROW * w]);
                            // for i < ROWS (4), unrolled: one block per i
                            {
                                const i = 0u;
                                acc[i][0u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 1u;
                                acc[i][0u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 2u;
                                acc[i][0u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 3u;
                                acc[i][0u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                        }
                    }
                    {
                        const e = 3u;
                        let j = 4u * j4 + e;
                        // for w < COL_GROUPS (1), unrolled: one block per w
                        {
                            const w = 0u;
                            let v = vec4<pv_acc_t>(sKV[j * V_STRIDE + tc + THREADS_PER_ROW * w]);
                            // for i < ROWS (4), unrolled: one block per i
                            {
                                const i = 0u;
                                acc[i][0u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 1u;
                                acc[i][0u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 2u;
                                acc[i][0u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 3u;
                                acc[i][0u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                        }
                    }
                }
            }
} else {
            // keys 4 j4 .. 4 j4 + 3: one vec4 of P per row serves 4 keys
            for (var c = 0u; c < TILE_KV / 4u; c += KEY_CHUNK) {  // in chunks: see DIM_CHUNK_QK
                for (var x = 0u; x < KEY_CHUNK; x++) {
                    let j4 = c + x;
                    var p4: array<vec4<f32>, ROWS>;
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        p4[i] = sP[(tr + ROW_GROUPS * i) * P_STRIDE + j4];
                    }
                    {
                        const i = 1u;
                        p4[i] = sP[(tr + ROW_GROUPS * i) * P_STRIDE + j4];
                    }
                    {
                        const i = 2u;
                        p4[i] = sP[(tr + ROW_GROUPS * i) * P_STRIDE + j4];
                    }
                    {
                        const i = 3u;
                        p4[i] = sP[(tr + ROW_GROUPS * i) * P_STRIDE + j4];
                    }
                    // for e < 4u, unrolled: one block per e
                    {
                        const e = 0u;
                        let j = 4u * j4 + e;
                        // for w < COL_GROUPS (1), unrolled: one block per w
                        {
                            const w = 0u;
                            let v = vec4<pv_acc_t>(sKV[j * V_STRIDE + tc + THREADS_PER_ROW * w]);
                            // for i < ROWS (4), unrolled: one block per i
                            {
                                const i = 0u;
                                acc[i][0u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 1u;
                                acc[i][0u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 2u;
                                acc[i][0u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 3u;
                                acc[i][0u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                        }
                    }
                    {
                        const e = 1u;
                        let j = 4u * j4 + e;
                        // for w < COL_GROUPS (1), unrolled: one block per w
                        {
                            const w = 0u;
                            let v = vec4<pv_acc_t>(sKV[j * V_STRIDE + tc + THREADS_PER_ROW * w]);
                            // for i < ROWS (4), unrolled: one block per i
                            {
                                const i = 0u;
                                acc[i][0u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 1u;
                                acc[i][0u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 2u;
                                acc[i][0u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 3u;
                                acc[i][0u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                        }
                    }
                    {
                        const e = 2u;
                        let j = 4u * j4 + e;
                        // for w < COL_GROUPS (1), unrolled: one block per w
                        {
                            const w = 0u;
                            let v = vec4<pv_acc_t>(sKV[j * V_STRIDE + tc + THREADS_PER_ROW * w]);
                            // for i < ROWS (4), unrolled: one block per i
                            {
                                const i = 0u;
                                acc[i][0u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 1u;
                                acc[i][0u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 2u;
                                acc[i][0u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 3u;
                                acc[i][0u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                        }
                    }
                    {
                        const e = 3u;
                        let j = 4u * j4 + e;
                        // for w < COL_GROUPS (1), unrolled: one block per w
                        {
                            const w = 0u;
                            let v = vec4<pv_acc_t>(sKV[j * V_STRIDE + tc + THREADS_PER_ROW * w]);
                            // for i < ROWS (4), unrolled: one block per i
                            {
                                const i = 0u;
                                acc[i][0u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 1u;
                                acc[i][0u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 2u;
                                acc[i][0u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 3u;
                                acc[i][0u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                        }
                    }
                }
            }
}
workgroupBarrier();  // every invocation is done with sKV and sP before they are overwritten
        }
        {  // chunk 1: the prefetched V chunk into workgroup memory, then fetch the next step's
        var nonfinite = false;
        // for n < V_ITEMS (2), unrolled: one block per n
        {
            const n = 0u;
            let e = lid + n * WORKGROUP_SIZE;
            if (e < TILE_KV * (TILE_DV / 4u)) {
                sKV[(e / (TILE_DV / 4u)) * V_STRIDE + e % (TILE_DV / 4u)] = next_v[n];
                nonfinite = nonfinite || nonfinite4(vec4<f32>(next_v[n]));
            }
        }
        {
            const n = 1u;
            let e = lid + n * WORKGROUP_SIZE;
            if (e < TILE_KV * (TILE_DV / 4u)) {
                sKV[(e / (TILE_DV / 4u)) * V_STRIDE + e % (TILE_DV / 4u)] = next_v[n];
                nonfinite = nonfinite || nonfinite4(vec4<f32>(next_v[n]));
            }
        }
        if (nonfinite) {
            atomicMax(&v_nonfinite_tile, u32(it) + 1u);  // seen by every invocation after the next barrier
        }
workgroupBarrier();  // the V chunk and P in workgroup memory
        // for n < V_ITEMS (2), unrolled: one block per n
        {
            const n = 0u;
            let e = lid + n * WORKGROUP_SIZE;
            let key = u32(j0) + e / (TILE_DV / 4u);
            var x = vec4<elem_t>();
            if (e < TILE_KV * (TILE_DV / 4u) && key < seq.len_k) {
                x = v_at4(seq, key, kv_head, v0 + 2u * TILE_DV + 4u * (e % (TILE_DV / 4u)));  // cache or appended row
            }
            next_v[n] = x;
        }
        {
            const n = 1u;
            let e = lid + n * WORKGROUP_SIZE;
            let key = u32(j0) + e / (TILE_DV / 4u);
            var x = vec4<elem_t>();
            if (e < TILE_KV * (TILE_DV / 4u) && key < seq.len_k) {
                x = v_at4(seq, key, kv_head, v0 + 2u * TILE_DV + 4u * (e % (TILE_DV / 4u)));  // cache or appended row
            }
            next_v[n] = x;
        }
        // for i < ROWS (4), unrolled: one block per i
        {
            const i = 0u;
            // for w < COL_GROUPS (1), unrolled: one block per w
            {
                const w = 0u;
                acc[i][1u * COL_GROUPS + w] *= alpha[i];
            }
        }
        {
            const i = 1u;
            // for w < COL_GROUPS (1), unrolled: one block per w
            {
                const w = 0u;
                acc[i][1u * COL_GROUPS + w] *= alpha[i];
            }
        }
        {
            const i = 2u;
            // for w < COL_GROUPS (1), unrolled: one block per w
            {
                const w = 0u;
                acc[i][1u * COL_GROUPS + w] *= alpha[i];
            }
        }
        {
            const i = 3u;
            // for w < COL_GROUPS (1), unrolled: one block per w
            {
                const w = 0u;
                acc[i][1u * COL_GROUPS + w] *= alpha[i];
            }
        }
        // keys with p = 0 (masked, a score of -inf, or an exp2 that underflowed) are selected out in tiles that have any
        // and whose V holds inf or NaN: 0 * inf is NaN, and such a key must add nothing whatever
        // its V (0 * a finite v adds exactly 0: there the plain loop is the same and faster)
        if ((partial || atomicLoad(&p_zero_tile) == u32(it) + 1u) && atomicLoad(&v_nonfinite_tile) == u32(it) + 1u) {
            // keys 4 j4 .. 4 j4 + 3: one vec4 of P per row serves 4 keys
            for (var c = 0u; c < TILE_KV / 4u; c += KEY_CHUNK) {  // in chunks: see DIM_CHUNK_QK
                for (var x = 0u; x < KEY_CHUNK; x++) {
                    let j4 = c + x;
                    var p4: array<vec4<f32>, ROWS>;
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        p4[i] = sP[(tr + ROW_GROUPS * i) * P_STRIDE + j4];
                    }
                    {
                        const i = 1u;
                        p4[i] = sP[(tr + ROW_GROUPS * i) * P_STRIDE + j4];
                    }
                    {
                        const i = 2u;
                        p4[i] = sP[(tr + ROW_GROUPS * i) * P_STRIDE + j4];
                    }
                    {
                        const i = 3u;
                        p4[i] = sP[(tr + ROW_GROUPS * i) * P_STRIDE + j4];
                    }
                    // for e < 4u, unrolled: one block per e
                    {
                        const e = 0u;
                        let j = 4u * j4 + e;
                        // for w < COL_GROUPS (1), unrolled: one block per w
                        {
                            const w = 0u;
                            let v = vec4<pv_acc_t>(sKV[j * V_STRIDE + tc + THREADS_PER_ROW * w]);
                            // for i < ROWS (4), unrolled: one block per i
                            {
                                const i = 0u;
                                acc[i][1u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 1u;
                                acc[i][1u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 2u;
                                acc[i][1u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 3u;
                                acc[i][1u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                        }
                    }
                    {
                        const e = 1u;
                        let j = 4u * j4 + e;
                        // for w < COL_GROUPS (1), unrolled: one block per w
                        {
                            const w = 0u;
                            let v = vec4<pv_acc_t>(sKV[j * V_STRIDE + tc + THREADS_PER_ROW * w]);
                            // for i < ROWS (4), unrolled: one block per i
                            {
                                const i = 0u;
                                acc[i][1u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 1u;
                                acc[i][1u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 2u;
                                acc[i][1u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 3u;
                                acc[i][1u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                        }
                    }
                    {
                        const e = 2u;
                        let j = 4u * j4 + e;
                        // for w < COL_GROUPS (1), unrolled: one block per w
                        {
                            const w = 0u;
                            let v = vec4<pv_acc_t>(sKV[j * V_STRIDE + tc + THREADS_PER_ROW * w]);
                            // for i < ROWS (4), unrolled: one block per i
                            {
                                const i = 0u;
                                acc[i][1u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 1u;
                                acc[i][1u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 2u;
                                acc[i][1u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 3u;
                                acc[i][1u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                        }
                    }
                    {
                        const e = 3u;
                        let j = 4u * j4 + e;
                        // for w < COL_GROUPS (1), unrolled: one block per w
                        {
                            const w = 0u;
                            let v = vec4<pv_acc_t>(sKV[j * V_STRIDE + tc + THREADS_PER_ROW * w]);
                            // for i < ROWS (4), unrolled: one block per i
                            {
                                const i = 0u;
                                acc[i][1u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 1u;
                                acc[i][1u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 2u;
                                acc[i][1u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 3u;
                                acc[i][1u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                        }
                    }
                }
            }
} else {
            // keys 4 j4 .. 4 j4 + 3: one vec4 of P per row serves 4 keys
            for (var c = 0u; c < TILE_KV / 4u; c += KEY_CHUNK) {  // in chunks: see DIM_CHUNK_QK
                for (var x = 0u; x < KEY_CHUNK; x++) {
                    let j4 = c + x;
                    var p4: array<vec4<f32>, ROWS>;
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        p4[i] = sP[(tr + ROW_GROUPS * i) * P_STRIDE + j4];
                    }
                    {
                        const i = 1u;
                        p4[i] = sP[(tr + ROW_GROUPS * i) * P_STRIDE + j4];
                    }
                    {
                        const i = 2u;
                        p4[i] = sP[(tr + ROW_GROUPS * i) * P_STRIDE + j4];
                    }
                    {
                        const i = 3u;
                        p4[i] = sP[(tr + ROW_GROUPS * i) * P_STRIDE + j4];
                    }
                    // for e < 4u, unrolled: one block per e
                    {
                        const e = 0u;
                        let j = 4u * j4 + e;
                        // for w < COL_GROUPS (1), unrolled: one block per w
                        {
                            const w = 0u;
                            let v = vec4<pv_acc_t>(sKV[j * V_STRIDE + tc + THREADS_PER_ROW * w]);
                            // for i < ROWS (4), unrolled: one block per i
                            {
                                const i = 0u;
                                acc[i][1u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 1u;
                                acc[i][1u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 2u;
                                acc[i][1u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 3u;
                                acc[i][1u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                        }
                    }
                    {
                        const e = 1u;
                        let j = 4u * j4 + e;
                        // for w < COL_GROUPS (1), unrolled: one block per w
                        {
                            const w = 0u;
                            let v = vec4<pv_acc_t>(sKV[j * V_STRIDE + tc + THREADS_PER_ROW * w]);
                            // for i < ROWS (4), unrolled: one block per i
                            {
                                const i = 0u;
                                acc[i][1u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 1u;
                                acc[i][1u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 2u;
                                acc[i][1u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 3u;
                                acc[i][1u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                        }
                    }
                    {
                        const e = 2u;
                        let j = 4u * j4 + e;
                        // for w < COL_GROUPS (1), unrolled: one block per w
                        {
                            const w = 0u;
                            let v = vec4<pv_acc_t>(sKV[j * V_STRIDE + tc + THREADS_PER_ROW * w]);
                            // for i < ROWS (4), unrolled: one block per i
                            {
                                const i = 0u;
                                acc[i][1u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 1u;
                                acc[i][1u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 2u;
                                acc[i][1u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 3u;
                                acc[i][1u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                        }
                    }
                    {
                        const e = 3u;
                        let j = 4u * j4 + e;
                        // for w < COL_GROUPS (1), unrolled: one block per w
                        {
                            const w = 0u;
                            let v = vec4<pv_acc_t>(sKV[j * V_STRIDE + tc + THREADS_PER_ROW * w]);
                            // for i < ROWS (4), unrolled: one block per i
                            {
                                const i = 0u;
                                acc[i][1u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 1u;
                                acc[i][1u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 2u;
                                acc[i][1u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 3u;
                                acc[i][1u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                        }
                    }
                }
            }
}
workgroupBarrier();  // every invocation is done with sKV and sP before they are overwritten
        }
        {  // chunk 2: the prefetched V chunk into workgroup memory, then fetch the next step's
        var nonfinite = false;
        // for n < V_ITEMS (2), unrolled: one block per n
        {
            const n = 0u;
            let e = lid + n * WORKGROUP_SIZE;
            if (e < TILE_KV * (TILE_DV / 4u)) {
                sKV[(e / (TILE_DV / 4u)) * V_STRIDE + e % (TILE_DV / 4u)] = next_v[n];
                nonfinite = nonfinite || nonfinite4(vec4<f32>(next_v[n]));
            }
        }
        {
            const n = 1u;
            let e = lid + n * WORKGROUP_SIZE;
            if (e < TILE_KV * (TILE_DV / 4u)) {
                sKV[(e / (TILE_DV / 4u)) * V_STRIDE + e % (TILE_DV / 4u)] = next_v[n];
                nonfinite = nonfinite || nonfinite4(vec4<f32>(next_v[n]));
            }
        }
        if (nonfinite) {
            atomicMax(&v_nonfinite_tile, u32(it) + 1u);  // seen by every invocation after the next barrier
        }
workgroupBarrier();  // the V chunk and P in workgroup memory
        // for n < V_ITEMS (2), unrolled: one block per n
        {
            const n = 0u;
            let e = lid + n * WORKGROUP_SIZE;
            let key = u32(j0) + e / (TILE_DV / 4u);
            var x = vec4<elem_t>();
            if (e < TILE_KV * (TILE_DV / 4u) && key < seq.len_k) {
                x = v_at4(seq, key, kv_head, v0 + 3u * TILE_DV + 4u * (e % (TILE_DV / 4u)));  // cache or appended row
            }
            next_v[n] = x;
        }
        {
            const n = 1u;
            let e = lid + n * WORKGROUP_SIZE;
            let key = u32(j0) + e / (TILE_DV / 4u);
            var x = vec4<elem_t>();
            if (e < TILE_KV * (TILE_DV / 4u) && key < seq.len_k) {
                x = v_at4(seq, key, kv_head, v0 + 3u * TILE_DV + 4u * (e % (TILE_DV / 4u)));  // cache or appended row
            }
            next_v[n] = x;
        }
        // for i < ROWS (4), unrolled: one block per i
        {
            const i = 0u;
            // for w < COL_GROUPS (1), unrolled: one block per w
            {
                const w = 0u;
                acc[i][2u * COL_GROUPS + w] *= alpha[i];
            }
        }
        {
            const i = 1u;
            // for w < COL_GROUPS (1), unrolled: one block per w
            {
                const w = 0u;
                acc[i][2u * COL_GROUPS + w] *= alpha[i];
            }
        }
        {
            const i = 2u;
            // for w < COL_GROUPS (1), unrolled: one block per w
            {
                const w = 0u;
                acc[i][2u * COL_GROUPS + w] *= alpha[i];
            }
        }
        {
            const i = 3u;
            // for w < COL_GROUPS (1), unrolled: one block per w
            {
                const w = 0u;
                acc[i][2u * COL_GROUPS + w] *= alpha[i];
            }
        }
        // keys with p = 0 (masked, a score of -inf, or an exp2 that underflowed) are selected out in tiles that have any
        // and whose V holds inf or NaN: 0 * inf is NaN, and such a key must add nothing whatever
        // its V (0 * a finite v adds exactly 0: there the plain loop is the same and faster)
        if ((partial || atomicLoad(&p_zero_tile) == u32(it) + 1u) && atomicLoad(&v_nonfinite_tile) == u32(it) + 1u) {
            // keys 4 j4 .. 4 j4 + 3: one vec4 of P per row serves 4 keys
            for (var c = 0u; c < TILE_KV / 4u; c += KEY_CHUNK) {  // in chunks: see DIM_CHUNK_QK
                for (var x = 0u; x < KEY_CHUNK; x++) {
                    let j4 = c + x;
                    var p4: array<vec4<f32>, ROWS>;
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        p4[i] = sP[(tr + ROW_GROUPS * i) * P_STRIDE + j4];
                    }
                    {
                        const i = 1u;
                        p4[i] = sP[(tr + ROW_GROUPS * i) * P_STRIDE + j4];
                    }
                    {
                        const i = 2u;
                        p4[i] = sP[(tr + ROW_GROUPS * i) * P_STRIDE + j4];
                    }
                    {
                        const i = 3u;
                        p4[i] = sP[(tr + ROW_GROUPS * i) * P_STRIDE + j4];
                    }
                    // for e < 4u, unrolled: one block per e
                    {
                        const e = 0u;
                        let j = 4u * j4 + e;
                        // for w < COL_GROUPS (1), unrolled: one block per w
                        {
                            const w = 0u;
                            let v = vec4<pv_acc_t>(sKV[j * V_STRIDE + tc + THREADS_PER_ROW * w]);
                            // for i < ROWS (4), unrolled: one block per i
                            {
                                const i = 0u;
                                acc[i][2u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 1u;
                                acc[i][2u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 2u;
                                acc[i][2u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 3u;
                                acc[i][2u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                        }
                    }
                    {
                        const e = 1u;
                        let j = 4u * j4 + e;
                        // for w < COL_GROUPS (1), unrolled: one block per w
                        {
                            const w = 0u;
                            let v = vec4<pv_acc_t>(sKV[j * V_STRIDE + tc + THREADS_PER_ROW * w]);
                            // for i < ROWS (4), unrolled: one block per i
                            {
                                const i = 0u;
                                acc[i][2u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 1u;
                                acc[i][2u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 2u;
                                acc[i][2u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 3u;
                                acc[i][2u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                        }
                    }
                    {
                        const e = 2u;
                        let j = 4u * j4 + e;
                        // for w < COL_GROUPS (1), unrolled: one block per w
                        {
                            const w = 0u;
                            let v = vec4<pv_acc_t>(sKV[j * V_STRIDE + tc + THREADS_PER_ROW * w]);
                            // for i < ROWS (4), unrolled: one block per i
                            {
                                const i = 0u;
                                acc[i][2u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 1u;
                                acc[i][2u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 2u;
                                acc[i][2u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 3u;
                                acc[i][2u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                        }
                    }
                    {
                        const e = 3u;
                        let j = 4u * j4 + e;
                        // for w < COL_GROUPS (1), unrolled: one block per w
                        {
                            const w = 0u;
                            let v = vec4<pv_acc_t>(sKV[j * V_STRIDE + tc + THREADS_PER_ROW * w]);
                            // for i < ROWS (4), unrolled: one block per i
                            {
                                const i = 0u;
                                acc[i][2u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 1u;
                                acc[i][2u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 2u;
                                acc[i][2u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 3u;
                                acc[i][2u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                        }
                    }
                }
            }
} else {
            // keys 4 j4 .. 4 j4 + 3: one vec4 of P per row serves 4 keys
            for (var c = 0u; c < TILE_KV / 4u; c += KEY_CHUNK) {  // in chunks: see DIM_CHUNK_QK
                for (var x = 0u; x < KEY_CHUNK; x++) {
                    let j4 = c + x;
                    var p4: array<vec4<f32>, ROWS>;
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        p4[i] = sP[(tr + ROW_GROUPS * i) * P_STRIDE + j4];
                    }
                    {
                        const i = 1u;
                        p4[i] = sP[(tr + ROW_GROUPS * i) * P_STRIDE + j4];
                    }
                    {
                        const i = 2u;
                        p4[i] = sP[(tr + ROW_GROUPS * i) * P_STRIDE + j4];
                    }
                    {
                        const i = 3u;
                        p4[i] = sP[(tr + ROW_GROUPS * i) * P_STRIDE + j4];
                    }
                    // for e < 4u, unrolled: one block per e
                    {
                        const e = 0u;
                        let j = 4u * j4 + e;
                        // for w < COL_GROUPS (1), unrolled: one block per w
                        {
                            const w = 0u;
                            let v = vec4<pv_acc_t>(sKV[j * V_STRIDE + tc + THREADS_PER_ROW * w]);
                            // for i < ROWS (4), unrolled: one block per i
                            {
                                const i = 0u;
                                acc[i][2u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 1u;
                                acc[i][2u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 2u;
                                acc[i][2u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 3u;
                                acc[i][2u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                        }
                    }
                    {
                        const e = 1u;
                        let j = 4u * j4 + e;
                        // for w < COL_GROUPS (1), unrolled: one block per w
                        {
                            const w = 0u;
                            let v = vec4<pv_acc_t>(sKV[j * V_STRIDE + tc + THREADS_PER_ROW * w]);
                            // for i < ROWS (4), unrolled: one block per i
                            {
                                const i = 0u;
                                acc[i][2u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 1u;
                                acc[i][2u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 2u;
                                acc[i][2u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 3u;
                                acc[i][2u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                        }
                    }
                    {
                        const e = 2u;
                        let j = 4u * j4 + e;
                        // for w < COL_GROUPS (1), unrolled: one block per w
                        {
                            const w = 0u;
                            let v = vec4<pv_acc_t>(sKV[j * V_STRIDE + tc + THREADS_PER_ROW * w]);
                            // for i < ROWS (4), unrolled: one block per i
                            {
                                const i = 0u;
                                acc[i][2u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 1u;
                                acc[i][2u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 2u;
                                acc[i][2u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 3u;
                                acc[i][2u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                        }
                    }
                    {
                        const e = 3u;
                        let j = 4u * j4 + e;
                        // for w < COL_GROUPS (1), unrolled: one block per w
                        {
                            const w = 0u;
                            let v = vec4<pv_acc_t>(sKV[j * V_STRIDE + tc + THREADS_PER_ROW * w]);
                            // for i < ROWS (4), unrolled: one block per i
                            {
                                const i = 0u;
                                acc[i][2u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 1u;
                                acc[i][2u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 2u;
                                acc[i][2u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 3u;
                                acc[i][2u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                        }
                    }
                }
            }
}
workgroupBarrier();  // every invocation is done with sKV and sP before they are overwritten
        }
        {  // chunk 3: the prefetched V chunk into workgroup memory, then fetch the next step's
        var nonfinite = false;
        // for n < V_ITEMS (2), unrolled: one block per n
        {
            const n = 0u;
            let e = lid + n * WORKGROUP_SIZE;
            if (e < TILE_KV * (TILE_DV / 4u)) {
                sKV[(e / (TILE_DV / 4u)) * V_STRIDE + e % (TILE_DV / 4u)] = next_v[n];
                nonfinite = nonfinite || nonfinite4(vec4<f32>(next_v[n]));
            }
        }
        {
            const n = 1u;
            let e = lid + n * WORKGROUP_SIZE;
            if (e < TILE_KV * (TILE_DV / 4u)) {
                sKV[(e / (TILE_DV / 4u)) * V_STRIDE + e % (TILE_DV / 4u)] = next_v[n];
                nonfinite = nonfinite || nonfinite4(vec4<f32>(next_v[n]));
            }
        }
        if (nonfinite) {
            atomicMax(&v_nonfinite_tile, u32(it) + 1u);  // seen by every invocation after the next barrier
        }
workgroupBarrier();  // the V chunk and P in workgroup memory
        if (it + 1 < n_tiles) {  // uniform: n_tiles is the workgroup's
            let jn = u32((tile_first + it + 1) * i32(TILE_KV));
        // for n < Q_ITEMS (4), unrolled: one block per n
        {
            const n = 0u;
            let e = lid + n * WORKGROUP_SIZE;
            let rh = tile_row(e / (TILE_DQK / 4u), first, tile_head);
            var x = vec4<elem_t>();
            if (e < TILE_Q * (TILE_DQK / 4u) && rh.x < seq.len_q) {
                let at = ((seq.q_row0 + rh.x) * params.heads_q + rh.y) * HEAD_DIM_QK + 0u + 4u * (e % (TILE_DQK / 4u));
                x = q_vec(at);
            }
            next_q[n] = x;
        }
        {
            const n = 1u;
            let e = lid + n * WORKGROUP_SIZE;
            let rh = tile_row(e / (TILE_DQK / 4u), first, tile_head);
            var x = vec4<elem_t>();
            if (e < TILE_Q * (TILE_DQK / 4u) && rh.x < seq.len_q) {
                let at = ((seq.q_row0 + rh.x) * params.heads_q + rh.y) * HEAD_DIM_QK + 0u + 4u * (e % (TILE_DQK / 4u));
                x = q_vec(at);
            }
            next_q[n] = x;
        }
        {
            const n = 2u;
            let e = lid + n * WORKGROUP_SIZE;
            let rh = tile_row(e / (TILE_DQK / 4u), first, tile_head);
            var x = vec4<elem_t>();
            if (e < TILE_Q * (TILE_DQK / 4u) && rh.x < seq.len_q) {
                let at = ((seq.q_row0 + rh.x) * params.heads_q + rh.y) * HEAD_DIM_QK + 0u + 4u * (e % (TILE_DQK / 4u));
                x = q_vec(at);
            }
            next_q[n] = x;
        }
        {
            const n = 3u;
            let e = lid + n * WORKGROUP_SIZE;
            let rh = tile_row(e / (TILE_DQK / 4u), first, tile_head);
            var x = vec4<elem_t>();
            if (e < TILE_Q * (TILE_DQK / 4u) && rh.x < seq.len_q) {
                let at = ((seq.q_row0 + rh.x) * params.heads_q + rh.y) * HEAD_DIM_QK + 0u + 4u * (e % (TILE_DQK / 4u));
                x = q_vec(at);
            }
            next_q[n] = x;
        }
        // for n < K_ITEMS (2), unrolled: one block per n
        {
            const n = 0u;
            let e = lid + n * WORKGROUP_SIZE;
            let key = jn + e / (TILE_DQK / 4u);
            var x = vec4<elem_t>();
            if (e < TILE_KV * (TILE_DQK / 4u) && key < seq.len_k) {
                x = k_at4(seq, key, kv_head, 4u * (e % (TILE_DQK / 4u)));  // cache or appended row
            }
            next_k[n] = x;
        }
        {
            const n = 1u;
            let e = lid + n * WORKGROUP_SIZE;
            let key = jn + e / (TILE_DQK / 4u);
            var x = vec4<elem_t>();
            if (e < TILE_KV * (TILE_DQK / 4u) && key < seq.len_k) {
                x = k_at4(seq, key, kv_head, 4u * (e % (TILE_DQK / 4u)));  // cache or appended row
            }
            next_k[n] = x;
        }
}
        // for i < ROWS (4), unrolled: one block per i
        {
            const i = 0u;
            // for w < COL_GROUPS (1), unrolled: one block per w
            {
                const w = 0u;
                acc[i][3u * COL_GROUPS + w] *= alpha[i];
            }
        }
        {
            const i = 1u;
            // for w < COL_GROUPS (1), unrolled: one block per w
            {
                const w = 0u;
                acc[i][3u * COL_GROUPS + w] *= alpha[i];
            }
        }
        {
            const i = 2u;
            // for w < COL_GROUPS (1), unrolled: one block per w
            {
                const w = 0u;
                acc[i][3u * COL_GROUPS + w] *= alpha[i];
            }
        }
        {
            const i = 3u;
            // for w < COL_GROUPS (1), unrolled: one block per w
            {
                const w = 0u;
                acc[i][3u * COL_GROUPS + w] *= alpha[i];
            }
        }
        // keys with p = 0 (masked, a score of -inf, or an exp2 that underflowed) are selected out in tiles that have any
        // and whose V holds inf or NaN: 0 * inf is NaN, and such a key must add nothing whatever
        // its V (0 * a finite v adds exactly 0: there the plain loop is the same and faster)
        if ((partial || atomicLoad(&p_zero_tile) == u32(it) + 1u) && atomicLoad(&v_nonfinite_tile) == u32(it) + 1u) {
            // keys 4 j4 .. 4 j4 + 3: one vec4 of P per row serves 4 keys
            for (var c = 0u; c < TILE_KV / 4u; c += KEY_CHUNK) {  // in chunks: see DIM_CHUNK_QK
                for (var x = 0u; x < KEY_CHUNK; x++) {
                    let j4 = c + x;
                    var p4: array<vec4<f32>, ROWS>;
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        p4[i] = sP[(tr + ROW_GROUPS * i) * P_STRIDE + j4];
                    }
                    {
                        const i = 1u;
                        p4[i] = sP[(tr + ROW_GROUPS * i) * P_STRIDE + j4];
                    }
                    {
                        const i = 2u;
                        p4[i] = sP[(tr + ROW_GROUPS * i) * P_STRIDE + j4];
                    }
                    {
                        const i = 3u;
                        p4[i] = sP[(tr + ROW_GROUPS * i) * P_STRIDE + j4];
                    }
                    // for e < 4u, unrolled: one block per e
                    {
                        const e = 0u;
                        let j = 4u * j4 + e;
                        // for w < COL_GROUPS (1), unrolled: one block per w
                        {
                            const w = 0u;
                            let v = vec4<pv_acc_t>(sKV[j * V_STRIDE + tc + THREADS_PER_ROW * w]);
                            // for i < ROWS (4), unrolled: one block per i
                            {
                                const i = 0u;
                                acc[i][3u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 1u;
                                acc[i][3u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 2u;
                                acc[i][3u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 3u;
                                acc[i][3u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                        }
                    }
                    {
                        const e = 1u;
                        let j = 4u * j4 + e;
                        // for w < COL_GROUPS (1), unrolled: one block per w
                        {
                            const w = 0u;
                            let v = vec4<pv_acc_t>(sKV[j * V_STRIDE + tc + THREADS_PER_ROW * w]);
                            // for i < ROWS (4), unrolled: one block per i
                            {
                                const i = 0u;
                                acc[i][3u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 1u;
                                acc[i][3u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 2u;
                                acc[i][3u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 3u;
                                acc[i][3u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                        }
                    }
                    {
                        const e = 2u;
                        let j = 4u * j4 + e;
                        // for w < COL_GROUPS (1), unrolled: one block per w
                        {
                            const w = 0u;
                            let v = vec4<pv_acc_t>(sKV[j * V_STRIDE + tc + THREADS_PER_ROW * w]);
                            // for i < ROWS (4), unrolled: one block per i
                            {
                                const i = 0u;
                                acc[i][3u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 1u;
                                acc[i][3u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 2u;
                                acc[i][3u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 3u;
                                acc[i][3u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                        }
                    }
                    {
                        const e = 3u;
                        let j = 4u * j4 + e;
                        // for w < COL_GROUPS (1), unrolled: one block per w
                        {
                            const w = 0u;
                            let v = vec4<pv_acc_t>(sKV[j * V_STRIDE + tc + THREADS_PER_ROW * w]);
                            // for i < ROWS (4), unrolled: one block per i
                            {
                                const i = 0u;
                                acc[i][3u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 1u;
                                acc[i][3u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 2u;
                                acc[i][3u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                            {
                                const i = 3u;
                                acc[i][3u * COL_GROUPS + w] += select(vec4<pv_acc_t>(), pv_acc_t(p4[i][e]) * v, p4[i][e] != 0.0);
                            }
                        }
                    }
                }
            }
} else {
            // keys 4 j4 .. 4 j4 + 3: one vec4 of P per row serves 4 keys
            for (var c = 0u; c < TILE_KV / 4u; c += KEY_CHUNK) {  // in chunks: see DIM_CHUNK_QK
                for (var x = 0u; x < KEY_CHUNK; x++) {
                    let j4 = c + x;
                    var p4: array<vec4<f32>, ROWS>;
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        p4[i] = sP[(tr + ROW_GROUPS * i) * P_STRIDE + j4];
                    }
                    {
                        const i = 1u;
                        p4[i] = sP[(tr + ROW_GROUPS * i) * P_STRIDE + j4];
                    }
                    {
                        const i = 2u;
                        p4[i] = sP[(tr + ROW_GROUPS * i) * P_STRIDE + j4];
                    }
                    {
                        const i = 3u;
                        p4[i] = sP[(tr + ROW_GROUPS * i) * P_STRIDE + j4];
                    }
                    // for e < 4u, unrolled: one block per e
                    {
                        const e = 0u;
                        let j = 4u * j4 + e;
                        // for w < COL_GROUPS (1), unrolled: one block per w
                        {
                            const w = 0u;
                            let v = vec4<pv_acc_t>(sKV[j * V_STRIDE + tc + THREADS_PER_ROW * w]);
                            // for i < ROWS (4), unrolled: one block per i
                            {
                                const i = 0u;
                                acc[i][3u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 1u;
                                acc[i][3u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 2u;
                                acc[i][3u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 3u;
                                acc[i][3u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                        }
                    }
                    {
                        const e = 1u;
                        let j = 4u * j4 + e;
                        // for w < COL_GROUPS (1), unrolled: one block per w
                        {
                            const w = 0u;
                            let v = vec4<pv_acc_t>(sKV[j * V_STRIDE + tc + THREADS_PER_ROW * w]);
                            // for i < ROWS (4), unrolled: one block per i
                            {
                                const i = 0u;
                                acc[i][3u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 1u;
                                acc[i][3u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 2u;
                                acc[i][3u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 3u;
                                acc[i][3u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                        }
                    }
                    {
                        const e = 2u;
                        let j = 4u * j4 + e;
                        // for w < COL_GROUPS (1), unrolled: one block per w
                        {
                            const w = 0u;
                            let v = vec4<pv_acc_t>(sKV[j * V_STRIDE + tc + THREADS_PER_ROW * w]);
                            // for i < ROWS (4), unrolled: one block per i
                            {
                                const i = 0u;
                                acc[i][3u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 1u;
                                acc[i][3u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 2u;
                                acc[i][3u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 3u;
                                acc[i][3u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                        }
                    }
                    {
                        const e = 3u;
                        let j = 4u * j4 + e;
                        // for w < COL_GROUPS (1), unrolled: one block per w
                        {
                            const w = 0u;
                            let v = vec4<pv_acc_t>(sKV[j * V_STRIDE + tc + THREADS_PER_ROW * w]);
                            // for i < ROWS (4), unrolled: one block per i
                            {
                                const i = 0u;
                                acc[i][3u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 1u;
                                acc[i][3u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 2u;
                                acc[i][3u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                            {
                                const i = 3u;
                                acc[i][3u * COL_GROUPS + w] += pv_acc_t(p4[i][e]) * v;
                            }
                        }
                    }
                }
            }
}
workgroupBarrier();  // every invocation is done with sKV and sP before they are overwritten
        }
    }

    // ---- section: epilogue: normalise and store ----
    // A row that saw no key has l_i = 0: its output is 0 and its lse is -inf, never NaN. A row
    // that saw a NaN or +inf score (row_bad) gets NaN: its result is undefined.
    let completed = it > n_tiles;  // false only when the driver cut the main loop short
    var nan_bits = NAN_BITS;
    let nan = bitcast<f32>(nan_bits);  // a var's bits: never a const-expression
    // the rows' sums and NaN flags over the row's invocations (each kept those of its keys)
    var bad: array<f32, ROWS>;
    // for i < ROWS (4), unrolled: one block per i
    {
        const i = 0u;
        bad[i] = select(0.0, 1.0, row_bad[i]);
    }
    {
        const i = 1u;
        bad[i] = select(0.0, 1.0, row_bad[i]);
    }
    {
        const i = 2u;
        bad[i] = select(0.0, 1.0, row_bad[i]);
    }
    {
        const i = 3u;
        bad[i] = select(0.0, 1.0, row_bad[i]);
    }
        // for i < ROWS (4), unrolled: one block per i
        {
            const i = 0u;
            l_i[i] = sum_over_row(l_i[i]);
        }
        {
            const i = 1u;
            l_i[i] = sum_over_row(l_i[i]);
        }
        {
            const i = 2u;
            l_i[i] = sum_over_row(l_i[i]);
        }
        {
            const i = 3u;
            l_i[i] = sum_over_row(l_i[i]);
        }
        // for i < ROWS (4), unrolled: one block per i
        {
            const i = 0u;
            bad[i] = sum_over_row(bad[i]);
        }
        {
            const i = 1u;
            bad[i] = sum_over_row(bad[i]);
        }
        {
            const i = 2u;
            bad[i] = sum_over_row(bad[i]);
        }
        {
            const i = 3u;
            bad[i] = sum_over_row(bad[i]);
        }
// for i < ROWS (4), unrolled: one block per i
{
    const i = 0u;
        row_bad[i] = bad[i] > 0.0;
}
{
    const i = 1u;
        row_bad[i] = bad[i] > 0.0;
}
{
    const i = 2u;
        row_bad[i] = bad[i] > 0.0;
}
{
    const i = 3u;
        row_bad[i] = bad[i] > 0.0;
}
    // for i < ROWS (4), unrolled: one block per i
    {
        const i = 0u;
        let row = q_row[i];
        let head_i = q_head[i];
        if (row < seq.len_q && completed) {  // (an if, not continue: the loop is unrolled, see unroll.py)
        var inv_l = 0.0;
        if (l_i[i] > 0.0) {
            inv_l = 1.0 / l_i[i];
        }
        let o_base = ((seq.q_row0 + row) * params.heads_q + head_i) * HEAD_DIM_V + v0;
        // for w < ACC_GROUPS (4), unrolled: one block per w
        {
            const w = 0u;
            let col = (w / COL_GROUPS) * TILE_DV + 4u * (tc + THREADS_PER_ROW * (w % COL_GROUPS));
            let o = acc[i][w] * inv_l;
            // for e < 4u, unrolled: one block per e
            {
                const e = 0u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 1u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 2u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 3u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
        }
        {
            const w = 1u;
            let col = (w / COL_GROUPS) * TILE_DV + 4u * (tc + THREADS_PER_ROW * (w % COL_GROUPS));
            let o = acc[i][w] * inv_l;
            // for e < 4u, unrolled: one block per e
            {
                const e = 0u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 1u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 2u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 3u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
        }
        {
            const w = 2u;
            let col = (w / COL_GROUPS) * TILE_DV + 4u * (tc + THREADS_PER_ROW * (w % COL_GROUPS));
            let o = acc[i][w] * inv_l;
            // for e < 4u, unrolled: one block per e
            {
                const e = 0u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 1u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 2u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 3u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
        }
        {
            const w = 3u;
            let col = (w / COL_GROUPS) * TILE_DV + 4u * (tc + THREADS_PER_ROW * (w % COL_GROUPS));
            let o = acc[i][w] * inv_l;
            // for e < 4u, unrolled: one block per e
            {
                const e = 0u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 1u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 2u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 3u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
        }
        if (tc == 0u && v0 == 0u && params.write_lse != 0u) {  // one writer per row: the first V block
            // -inf cannot be a WGSL constant: build it at run time from its bits (a var is
            // never a const-expression, so no front end folds it).
            var neg_inf_bits = NEG_INF_BITS;
            var row_lse = bitcast<f32>(neg_inf_bits);
            if (l_i[i] > 0.0) {
                row_lse = m_i[i] * LN2 + log(l_i[i]);
            }
            lse[seq.lse0 + head_i * seq.lse_stride + row] = select(row_lse, nan, row_bad[i]);
        }
        }
    }
    {
        const i = 1u;
        let row = q_row[i];
        let head_i = q_head[i];
        if (row < seq.len_q && completed) {  // (an if, not continue: the loop is unrolled, see unroll.py)
        var inv_l = 0.0;
        if (l_i[i] > 0.0) {
            inv_l = 1.0 / l_i[i];
        }
        let o_base = ((seq.q_row0 + row) * params.heads_q + head_i) * HEAD_DIM_V + v0;
        // for w < ACC_GROUPS (4), unrolled: one block per w
        {
            const w = 0u;
            let col = (w / COL_GROUPS) * TILE_DV + 4u * (tc + THREADS_PER_ROW * (w % COL_GROUPS));
            let o = acc[i][w] * inv_l;
            // for e < 4u, unrolled: one block per e
            {
                const e = 0u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 1u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 2u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 3u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
        }
        {
            const w = 1u;
            let col = (w / COL_GROUPS) * TILE_DV + 4u * (tc + THREADS_PER_ROW * (w % COL_GROUPS));
            let o = acc[i][w] * inv_l;
            // for e < 4u, unrolled: one block per e
            {
                const e = 0u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 1u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 2u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 3u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
        }
        {
            const w = 2u;
            let col = (w / COL_GROUPS) * TILE_DV + 4u * (tc + THREADS_PER_ROW * (w % COL_GROUPS));
            let o = acc[i][w] * inv_l;
            // for e < 4u, unrolled: one block per e
            {
                const e = 0u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 1u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 2u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 3u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
        }
        {
            const w = 3u;
            let col = (w / COL_GROUPS) * TILE_DV + 4u * (tc + THREADS_PER_ROW * (w % COL_GROUPS));
            let o = acc[i][w] * inv_l;
            // for e < 4u, unrolled: one block per e
            {
                const e = 0u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 1u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 2u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 3u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
        }
        if (tc == 0u && v0 == 0u && params.write_lse != 0u) {  // one writer per row: the first V block
            // -inf cannot be a WGSL constant: build it at run time from its bits (a var is
            // never a const-expression, so no front end folds it).
            var neg_inf_bits = NEG_INF_BITS;
            var row_lse = bitcast<f32>(neg_inf_bits);
            if (l_i[i] > 0.0) {
                row_lse = m_i[i] * LN2 + log(l_i[i]);
            }
            lse[seq.lse0 + head_i * seq.lse_stride + row] = select(row_lse, nan, row_bad[i]);
        }
        }
    }
    {
        const i = 2u;
        let row = q_row[i];
        let head_i = q_head[i];
        if (row < seq.len_q && completed) {  // (an if, not continue: the loop is unrolled, see unroll.py)
        var inv_l = 0.0;
        if (l_i[i] > 0.0) {
            inv_l = 1.0 / l_i[i];
        }
        let o_base = ((seq.q_row0 + row) * params.heads_q + head_i) * HEAD_DIM_V + v0;
        // for w < ACC_GROUPS (4), unrolled: one block per w
        {
            const w = 0u;
            let col = (w / COL_GROUPS) * TILE_DV + 4u * (tc + THREADS_PER_ROW * (w % COL_GROUPS));
            let o = acc[i][w] * inv_l;
            // for e < 4u, unrolled: one block per e
            {
                const e = 0u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 1u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 2u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 3u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
        }
        {
            const w = 1u;
            let col = (w / COL_GROUPS) * TILE_DV + 4u * (tc + THREADS_PER_ROW * (w % COL_GROUPS));
            let o = acc[i][w] * inv_l;
            // for e < 4u, unrolled: one block per e
            {
                const e = 0u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 1u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 2u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 3u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
        }
        {
            const w = 2u;
            let col = (w / COL_GROUPS) * TILE_DV + 4u * (tc + THREADS_PER_ROW * (w % COL_GROUPS));
            let o = acc[i][w] * inv_l;
            // for e < 4u, unrolled: one block per e
            {
                const e = 0u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 1u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 2u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 3u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
        }
        {
            const w = 3u;
            let col = (w / COL_GROUPS) * TILE_DV + 4u * (tc + THREADS_PER_ROW * (w % COL_GROUPS));
            let o = acc[i][w] * inv_l;
            // for e < 4u, unrolled: one block per e
            {
                const e = 0u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 1u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 2u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 3u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
        }
        if (tc == 0u && v0 == 0u && params.write_lse != 0u) {  // one writer per row: the first V block
            // -inf cannot be a WGSL constant: build it at run time from its bits (a var is
            // never a const-expression, so no front end folds it).
            var neg_inf_bits = NEG_INF_BITS;
            var row_lse = bitcast<f32>(neg_inf_bits);
            if (l_i[i] > 0.0) {
                row_lse = m_i[i] * LN2 + log(l_i[i]);
            }
            lse[seq.lse0 + head_i * seq.lse_stride + row] = select(row_lse, nan, row_bad[i]);
        }
        }
    }
    {
        const i = 3u;
        let row = q_row[i];
        let head_i = q_head[i];
        if (row < seq.len_q && completed) {  // (an if, not continue: the loop is unrolled, see unroll.py)
        var inv_l = 0.0;
        if (l_i[i] > 0.0) {
            inv_l = 1.0 / l_i[i];
        }
        let o_base = ((seq.q_row0 + row) * params.heads_q + head_i) * HEAD_DIM_V + v0;
        // for w < ACC_GROUPS (4), unrolled: one block per w
        {
            const w = 0u;
            let col = (w / COL_GROUPS) * TILE_DV + 4u * (tc + THREADS_PER_ROW * (w % COL_GROUPS));
            let o = acc[i][w] * inv_l;
            // for e < 4u, unrolled: one block per e
            {
                const e = 0u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 1u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 2u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 3u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
        }
        {
            const w = 1u;
            let col = (w / COL_GROUPS) * TILE_DV + 4u * (tc + THREADS_PER_ROW * (w % COL_GROUPS));
            let o = acc[i][w] * inv_l;
            // for e < 4u, unrolled: one block per e
            {
                const e = 0u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 1u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 2u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 3u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
        }
        {
            const w = 2u;
            let col = (w / COL_GROUPS) * TILE_DV + 4u * (tc + THREADS_PER_ROW * (w % COL_GROUPS));
            let o = acc[i][w] * inv_l;
            // for e < 4u, unrolled: one block per e
            {
                const e = 0u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 1u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 2u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 3u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
        }
        {
            const w = 3u;
            let col = (w / COL_GROUPS) * TILE_DV + 4u * (tc + THREADS_PER_ROW * (w % COL_GROUPS));
            let o = acc[i][w] * inv_l;
            // for e < 4u, unrolled: one block per e
            {
                const e = 0u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 1u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 2u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
            {
                const e = 3u;
                out[o_base + col + e] = elem_t(select(o[e], nan, row_bad[i]));
            }
        }
        if (tc == 0u && v0 == 0u && params.write_lse != 0u) {  // one writer per row: the first V block
            // -inf cannot be a WGSL constant: build it at run time from its bits (a var is
            // never a const-expression, so no front end folds it).
            var neg_inf_bits = NEG_INF_BITS;
            var row_lse = bitcast<f32>(neg_inf_bits);
            if (l_i[i] > 0.0) {
                row_lse = m_i[i] * LN2 + log(l_i[i]);
            }
            lse[seq.lse0 + head_i * seq.lse_stride + row] = select(row_lse, nan, row_bad[i]);
        }
        }
    }
}
