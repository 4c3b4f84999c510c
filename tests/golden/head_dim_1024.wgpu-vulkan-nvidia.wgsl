// =============================================================================================
// attngen 0.1.0: flash-attention forward kernel for target wgsl (profile wgpu-vulkan-nvidia).
// Generated from the spec below; regenerate with `attngen build SPEC --target wgsl --kernel head_dim_1024` rather than editing.
//
// Spec (normalised, every default filled in):
//   attention head_dim_1024 {
//       head_dim   1024
//       heads      any
//       dtype      f16
//       accumulate qk=f32 pv=f32
//       mask       causal
//       softcap    none
//       scale      auto
//       tile       q=auto kv=auto d=auto
//       schedule   fused
//       kv_cache   contiguous
//       target     cuda { warps=auto stages=auto key_warps=auto }
//       target     wgsl { workgroup=auto subgroups=auto f16=auto }
//   }
//
// Plan: tile q=16 kv=8, workgroup 256 (16 rows x 16 invocations), subgroup reductions.
// Scale 0.03125; mask causal (top-left aligned, torch's is_causal): query i sees key j iff j <= i.
// Workgroup memory: 32768 bytes (each buffer 16-byte aligned):
//   sK at      0: 8 x 1024 f16 (the current K tile)
//   sV at  16384: 8 x 1024 f16 (the current V tile)
// Grid: (ceil(Lq / 16), Hq, B), 256 threads each; tensors are (batch, seq, heads, head_dim): q (B, Lq, Hq, Dqk), k (B, Lk, Hkv, Dqk), v (B, Lk, Hkv, Dv), out (B, Lq, Hq, Dv); lse (B, Hq, Lq) f32.
// Entry point: attngen_head_dim_1024; the manifest (attngen build --emit manifest) lists the parameters in order.
// =============================================================================================
enable f16;

// ---- section: config ------------------------------------------------------------------------
// Tile configuration, fixed at compile time. Batch, sequence lengths and head counts are
// run-time values in `params`; any length >= 1 works (partial tiles are zero-filled and masked).
const TILE_Q: u32 = 16u;           // tile q: rows of Q per workgroup
const TILE_KV: u32 = 8u;          // tile kv: rows of K and V per iteration of the main loop
const THREADS_PER_ROW: u32 = 16u;   // invocations sharing one row of Q (a power of two)
const WORKGROUP_SIZE: u32 = 256u;  // TILE_Q * THREADS_PER_ROW
const HEAD_DIM_QK: u32 = 1024u;      // head dim of q and k
const HEAD_DIM_V: u32 = 1024u;       // head dim of v and out
// Each invocation owns the head dims d = lane + THREADS_PER_ROW * i of its row (strided, so the
// invocations of a row read consecutive words of workgroup memory).
const DIMS_QK: u32 = 64u;         // HEAD_DIM_QK / THREADS_PER_ROW
const DIMS_V: u32 = 64u;          // HEAD_DIM_V / THREADS_PER_ROW
// The dot products run over an invocation's dims in chunks of at most 32 iterations.
// Mesa's software Vulkan (llvmpipe, what CI runs WGSL on) unrolls loops that short and stops
// all loops of a shader after 65535 iterations in total; unrolled loops do not count, so
// chunking keeps long sequences within that budget. Other drivers unroll or not as they like.
const DIM_CHUNK_QK: u32 = 32u;     // divides DIMS_QK

// Scores are kept in the log2 domain so that exp2 does the softmax: t = s * scale * log2(e).
// scale = 0.03125 (1 / sqrt(head_dim qk)).
const SCALE_LOG2: f32 = 0.045084220027780106;  // scale * log2(e)
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
alias elem_t = f16;    // storage of q, k, v and out
alias qk_acc_t = f32;  // accumulate qk=f32: q registers and partial dot products of S = Q K^T
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
@group(0) @binding(1) var<storage, read> q: array<elem_t>;
// k (B, Lk, Hkv, Dqk) f16: keys (packed: (total_k, Hkv, Dqk); paged: (num_pages, page, Hkv,
// Dqk)); read_write: appended rows are written in place
@group(0) @binding(2) var<storage, read_write> k: array<elem_t>;
// v (B, Lk, Hkv, Dv) f16: values, laid out as k; read_write: appended rows are written in
// place
@group(0) @binding(3) var<storage, read_write> v: array<elem_t>;
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

// Workgroup memory (32768 bytes as the planner counts it, each buffer rounded up
// to 16 bytes). Tiles are stored densely, row-major: sK[j * HEAD_DIM_QK + d].
var<workgroup> sK: array<elem_t, 8192>;  // TILE_KV x HEAD_DIM_QK: the current K tile
var<workgroup> sV: array<elem_t, 8192>;  // TILE_KV x HEAD_DIM_V: the current V tile

// Copy keys [j0, j0 + TILE_KV) of one (sequence, KV head) into sK (load_k_tile) and sV
// (load_v_tile), all invocations of the workgroup together (consecutive invocations copy
// consecutive elements). Keys at or past the sequence's Lk are zero-filled, so a partial last
// tile reads zeros (and is masked).
fn load_k_tile(lid: u32, seq: Seq, kv_head: u32, j0: u32) {
    for (var e = lid; e < TILE_KV * HEAD_DIM_QK; e += WORKGROUP_SIZE) {
        let key = j0 + e / HEAD_DIM_QK;
        var x = elem_t(0.0);
        if (key < seq.len_k) {
            x = k_at(seq, key, kv_head, e % HEAD_DIM_QK);  // cache or appended row
        }
        sK[e] = x;
    }
}

fn load_v_tile(lid: u32, seq: Seq, kv_head: u32, j0: u32) {
    for (var e = lid; e < TILE_KV * HEAD_DIM_V; e += WORKGROUP_SIZE) {
        let key = j0 + e / HEAD_DIM_V;
        var x = elem_t(0.0);
        if (key < seq.len_k) {
            x = v_at(seq, key, kv_head, e % HEAD_DIM_V);  // cache or appended row
        }
        sV[e] = x;
    }
}

// ---- section: matmul primitives -------------------------------------------------------------
// Both products on the invocations' own registers (WGSL has no portable matrix units). Row r
// of the tile belongs to invocations r * THREADS_PER_ROW + lane, lane < THREADS_PER_ROW; each
// holds its dims d = lane + THREADS_PER_ROW * i (i < DIMS_QK) of the row's q in q_reg.

// The sum of x over the THREADS_PER_ROW invocations of a row: a butterfly of subgroup
// shuffles, after which every invocation of the row holds the same (bitwise) sum. The lanes of
// a row are consecutive invocations of one subgroup: the plan guarantees THREADS_PER_ROW <= the
// smallest subgroup size, and the runtime checks once per device that subgroups are
// consecutive runs of local_invocation_index. Must be called in uniform control flow.
fn sum_over_row(x: f32) -> f32 {
    var r = x;
    r += subgroupShuffleXor(r, 8u);
    r += subgroupShuffleXor(r, 4u);
    r += subgroupShuffleXor(r, 2u);
    r += subgroupShuffleXor(r, 1u);
    return r;
}

// S = Q K^T for the invocation's row and the TILE_KV keys in sK: raw dot products into s.
// Each invocation forms the partial dot product over its dims (in qk_acc_t); the row's
// THREADS_PER_ROW partials are then summed with a butterfly of subgroup shuffles (sum_over_row),
// so every invocation of the row ends with all TILE_KV scores. Called by all invocations
// (uniform control flow).
fn scores(s: ptr<function, array<f32, TILE_KV>>, q_reg: ptr<function, array<qk_acc_t, DIMS_QK>>, lid: u32) {
    let lane = lid % THREADS_PER_ROW;
    for (var j = 0u; j < TILE_KV; j++) {
        var part = qk_acc_t(0.0);
        for (var c = 0u; c < DIMS_QK; c += DIM_CHUNK_QK) {  // in chunks: see DIM_CHUNK_QK
            for (var u = 0u; u < DIM_CHUNK_QK; u++) {
                let i = c + u;
                part += (*q_reg)[i] * qk_acc_t(sK[j * HEAD_DIM_QK + lane + THREADS_PER_ROW * i]);
            }
        }
        (*s)[j] = sum_over_row(f32(part));
    }
}

// O += P V for the invocation's row, with the online-softmax rescale folded in:
// acc[i] = alpha * acc[i] + sum_j p_j V[j][d] for its dims d = lane + THREADS_PER_ROW * i.
// Each dim's sum over the tile is formed in pv_acc_t and then added to the f32 acc (so f16
// accumulation cannot overflow across tiles). A key with p = 0 (masked, or outside the row's
// keys) is selected out, never multiplied: its V may hold anything, inf and NaN included.
fn pv(acc: ptr<function, array<f32, DIMS_V>>, p: ptr<function, array<f32, TILE_KV>>, alpha: f32, lane: u32) {
    for (var i = 0u; i < DIMS_V; i++) {
        var o = pv_acc_t(0.0);
        for (var j = 0u; j < TILE_KV; j++) {
            let pj = (*p)[j];
            o += select(pv_acc_t(0.0), pv_acc_t(pj) * pv_acc_t(sV[j * HEAD_DIM_V + lane + THREADS_PER_ROW * i]), pj != 0.0);
        }
        (*acc)[i] = alpha * (*acc)[i] + f32(o);
    }
}

// ---- section: mask --------------------------------------------------------------------------
// mask causal (top-left aligned, torch's is_causal): query i sees key j iff j <= i.
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

fn visible(seq: Seq, i: i32, j: i32) -> bool {
    return j < i32(seq.len_k) && j <= i;
}

fn key_range(seq: Seq, r0: i32, r1: i32) -> vec2<i32> {
    let len_k = i32(seq.len_k);
    return vec2<i32>(0, min(len_k, r1));  // row r1 - 1 sees keys up to r1 - 1
}

fn tile_is_full(seq: Seq, r0: i32, r1: i32, j0: i32, j1: i32) -> bool {
    let len_k = i32(seq.len_k);
    return j1 <= len_k && j1 - 1 <= r0;
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

// Column d of key j of the sequence, KV head kv_head: k_at from the keys, v_at from the values.
fn k_at(seq: Seq, j: u32, kv_head: u32, d: u32) -> elem_t {
    if (j >= seq.cached) {
        return kv_new[new_row(seq, j, kv_head) * HEAD_DIM_QK + d];
    }
    return k[(key_row(seq, j) * params.heads_kv + kv_head) * HEAD_DIM_QK + d];
}

fn v_at(seq: Seq, j: u32, kv_head: u32, d: u32) -> elem_t {
    if (j >= seq.cached) {
        return kv_new[params.new_v + new_row(seq, j, kv_head) * HEAD_DIM_V + d];
    }
    return v[(key_row(seq, j) * params.heads_kv + kv_head) * HEAD_DIM_V + d];
}

// ---- section: append ------------------------------------------------------------------------
// The fused append: the workgroups of the first q tile of each (sequence, KV head) copy the
// sequence's len_new rows of k_new / v_new into the cache, at keys cached .. cached + len_new - 1
// (padded: rows of the sequence; paged: the slots the block table gives). Other workgroups
// read those keys from kv_new, so there is no race and no separate copy launch.
fn append_rows(lid: u32, seq: Seq, kv_head: u32) {
    for (var e = lid; e < params.len_new * HEAD_DIM_QK; e += WORKGROUP_SIZE) {
        let j = seq.cached + e / HEAD_DIM_QK;
        let d = e % HEAD_DIM_QK;
        k[(key_row(seq, j) * params.heads_kv + kv_head) * HEAD_DIM_QK + d] = k_at(seq, j, kv_head, d);
    }
    for (var e = lid; e < params.len_new * HEAD_DIM_V; e += WORKGROUP_SIZE) {
        let j = seq.cached + e / HEAD_DIM_V;
        let d = e % HEAD_DIM_V;
        v[(key_row(seq, j) * params.heads_kv + kv_head) * HEAD_DIM_V + d] = v_at(seq, j, kv_head, d);
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
// Every invocation of a row holds all of the row's scores after the reduction in scores(), so
// m_i and l_i are computed redundantly (identically) by each of them; acc is split by dims.
// All barriers are in uniform control flow: the loop bounds depend only on the workgroup (its
// sequence's lengths come from params and seq_meta, both uniform), and invocations whose row is
// past the sequence's Lq run the loop too and just do not store.
@compute @workgroup_size(256, 1, 1)
fn attngen_head_dim_1024(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let lane = lid % THREADS_PER_ROW;             // which dims of the row: lane + THREADS_PER_ROW * i
    let seq = sequence(wg.z);                     // the workgroup's sequence: lengths and offsets
    let head = wg.y;
    let kv_head = head / params.group;            // grouped-query attention: Hq / Hkv heads share K/V
    let row0 = wg.x * TILE_Q;                     // the workgroup's first query row
    let row_end = min(row0 + TILE_Q, seq.len_q);  // at or below row0: a tile past the sequence's rows
    let row = row0 + lid / THREADS_PER_ROW;       // this invocation's query row

    // ---- section: append ----
    // A call with k_new / v_new: this row tile's workgroups of the first query head of each KV
    // head (and the first V block) store the new rows in the cache (see append_rows).
    if (params.len_new > 0u && wg.x == 0u && head % params.group == 0u) {
        append_rows(lid, seq, kv_head);
    }

    // ---- section: prologue: load Q ----
    // The row's q slice stays in registers for the whole loop; rows past Lq read as zeros.
    var q_reg: array<qk_acc_t, DIMS_QK>;
    if (row < seq.len_q) {
        let q_base = ((seq.q_row0 + row) * params.heads_q + head) * HEAD_DIM_QK + lane;
        for (var i = 0u; i < DIMS_QK; i++) {
            q_reg[i] = qk_acc_t(q[q_base + THREADS_PER_ROW * i]);
        }
    }

    // ---- section: loop bounds (mask) ----
    let has_rows = row0 < row_end;                // the tile has rows of the sequence
    let range = key_range(seq, i32(row0), i32(row_end));
    let tiles_begin = range.x / i32(TILE_KV);
    let tiles_all = select(0, (range.y + i32(TILE_KV) - 1) / i32(TILE_KV) - tiles_begin,
                           has_rows && range.y > range.x);
    let tile_first = tiles_begin;
    let n_tiles = tiles_all;

    var m_i = MASKED;                   // running max of the row's scores (log2 domain); MASKED = none yet
    var l_i = 0.0;                      // running sum of exp2(t - m_i)
    var row_bad = false;                // the row saw a NaN or +inf score: its result is NaN
    var acc: array<f32, DIMS_V>;        // unnormalised output, this invocation's dims
    var s: array<f32, TILE_KV>;         // the row's scores of the current tile, then its probabilities P

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

        // -- load K/V tile
        load_k_tile(lid, seq, kv_head, u32(j0));
        load_v_tile(lid, seq, kv_head, u32(j0));
        workgroupBarrier();

        // -- S = Q K^T
        scores(&s, &q_reg, lid);

        // -- score transform and mask
        let partial = !tile_is_full(seq, i32(row0), i32(row_end), j0, j0 + i32(TILE_KV));
        for (var j = 0u; j < TILE_KV; j++) {
            var t = score_transform(s[j]);
            if (partial && !visible(seq, i32(row), j0 + i32(j))) {
                t = MASKED;
            }
            if (poisons(t)) {  // a key the row sees (masked ones are MASKED by now)
                row_bad = true;
                t = MASKED;
            }
            s[j] = t;
        }

        // -- online softmax: m_i, l_i, alpha
        var m_new = m_i;
        for (var j = 0u; j < TILE_KV; j++) {
            m_new = max(m_new, s[j]);
        }
        // A row that has seen no key yet keeps m = MASKED; subtracting 0 instead keeps the
        // exponents finite, and the selects give p = 0 and alpha = 0 without relying on exp2
        // of a huge negative number.
        let m_use = select(m_new, 0.0, m_new <= MASKED);
        let alpha = select(exp2(m_i - m_use), 0.0, m_i <= MASKED);
        m_i = m_new;
        var row_sum = 0.0;
        for (var j = 0u; j < TILE_KV; j++) {
            let p = select(exp2(s[j] - m_use), 0.0, s[j] <= MASKED);
            s[j] = p;
            row_sum += p;
        }
        l_i = l_i * alpha + row_sum;

        // -- O += P V (and acc *= alpha, in the same pass)
        pv(&acc, &s, alpha, lane);
        workgroupBarrier();  // every invocation is done with sK, sV before the next tile overwrites them
    }

    // ---- section: epilogue: normalise and store ----
    // A row that saw no key has l_i = 0: its output is 0 and its lse is -inf, never NaN. A row
    // that saw a NaN or +inf score (row_bad) gets NaN: its result is undefined.
    let completed = it > n_tiles;  // false only when the driver cut the main loop short
    var nan_bits = NAN_BITS;
    let nan = bitcast<f32>(nan_bits);  // a var's bits: never a const-expression
    if (row < seq.len_q && completed) {
        var inv_l = 0.0;
        if (l_i > 0.0) {
            inv_l = 1.0 / l_i;
        }
        let o_base = ((seq.q_row0 + row) * params.heads_q + head) * HEAD_DIM_V + lane;
        for (var i = 0u; i < DIMS_V; i++) {
            out[o_base + THREADS_PER_ROW * i] = elem_t(select(acc[i] * inv_l, nan, row_bad));
        }
        if (lane == 0u && params.write_lse != 0u) {
            // -inf cannot be a WGSL constant: build it at run time from its bits (a var is
            // never a const-expression, so no front end folds it).
            var neg_inf_bits = NEG_INF_BITS;
            var row_lse = bitcast<f32>(neg_inf_bits);
            if (l_i > 0.0) {
                row_lse = m_i * LN2 + log(l_i);
            }
            lse[seq.lse0 + head * seq.lse_stride + row] = select(row_lse, nan, row_bad);
        }
    }
}
