// =============================================================================================
// attngen 0.1.0: flash-attention forward kernel for target wgsl (profile webgpu-core).
// Generated from the spec below; regenerate with `attngen build SPEC --target wgsl --kernel decode_f16_window` rather than editing.
//
// Spec (normalised, every default filled in):
//   attention decode_f16_window {
//       head_dim   64
//       heads      q=8 kv=2
//       dtype      f16
//       accumulate qk=f32 pv=f32
//       mask       window(left=100, right=0)
//       softcap    30.0
//       scale      auto
//       tile       q=auto kv=auto d=auto
//       schedule   split_kv(3)
//       kv_cache   contiguous
//       target     cuda { warps=auto stages=auto key_warps=auto producer=auto persistent=auto tma=auto backward=auto }
//       target     wgsl { workgroup=auto subgroups=auto f16=auto prefetch=auto decode=on }
//   }
//
// Plan: decode kernel: 4 (query row, head) pair(s) per workgroup of 128, teams of 4 invocation(s) per key (2 + 2 16-byte item(s) of K and V each, 8 values an item), 4 key(s) per team and step (128 keys a step), f16 packed in u32 words.
// Scale 0.125, softcap 30.0; mask window(left=100, right=0), bottom-right aligned: query i sees key j iff i + (Lk - Lq) - 100 <= j <= i + (Lk - Lq) + 0.
// Workgroup memory (the epilogue's): 9216 bytes (each buffer 16-byte aligned):
//   sM   at      0: 32 x 4 f32 (each team's row max m_i, then its share of the row's sum l_i)
//   sBad at    512: 32 x 4 u32 (each team's row_bad (the row saw a NaN or +inf score))
//   sO   at   1024: 32 x 64 f32 (acc summed over each block's teams, one output row at a time)
// Decode kernel: decode kernel: 4 (query row, head) pair(s) per workgroup of 128, teams of 4 invocation(s) per key (2 + 2 16-byte item(s) of K and V each, 8 values an item), 4 key(s) per team and step (128 keys a step).
// Grid: (ceil(Lq * G / 4) * S, Hkv, B), 128 threads each; tensors are (batch, seq, heads, head_dim): q (B, Lq, Hq, Dqk), k (B, Lk, Hkv, Dqk), v (B, Lk, Hkv, Dv), out (B, Lq, Hq, Dv); lse (B, Hq, Lq) f32.
// Entry point: attngen_decode_f16_window; the manifest (attngen build --emit manifest) lists the parameters in order.
// =============================================================================================
enable subgroups;

// ---- section: config ------------------------------------------------------------------------
// The decode kernel: a workgroup takes ROWS (query row, head in group) pairs of one KV head, one
// KV split and one sequence (dispatch x = ceil(Lq * G / ROWS) * S, y = Hkv, z = B). TEAM
// consecutive invocations of one subgroup take one key at a time: each loads CHUNKS_K and
// CHUNKS_V 16-byte items (vec4<u32>) of the key's rows of K and V, items lane + TEAM * c, and
// keeps q and acc for the same head-dim columns in registers. The TEAMS teams take KEYS keys each
// per step: every load of a step is issued before the first is used, and nothing passes through
// workgroup memory until the epilogue merges the teams.
const ROWS: u32 = 4u;              // (query row, head in group) pairs per workgroup (tile q)
const WORKGROUP_SIZE: u32 = 128u;  // TEAMS * TEAM invocations
const TEAM: u32 = 4u;              // invocations sharing a key (a power of two within SUBGROUP)
const TEAMS: u32 = 32u;            // teams of the workgroup
const KEYS: u32 = 4u;              // keys per team and step
const STEP: u32 = 128u;            // keys per workgroup step: TEAMS * KEYS (tile kv)
const HEAD_DIM_QK: u32 = 64u;      // head dim of q and k
const HEAD_DIM_V: u32 = 64u;       // head dim of v and out
const VALUES: u32 = 8u;           // values per 16-byte item of K and V (8 f16)
const GROUPS: u32 = 2u;            // vec4<f32> per item: VALUES / 4
const ITEMS_K: u32 = 8u;           // items of a row of K: HEAD_DIM_QK / VALUES
const ITEMS_V: u32 = 8u;           // items of a row of V
const CHUNKS_K: u32 = 2u;          // items of each key's row of K per invocation: ITEMS_K / TEAM
const CHUNKS_V: u32 = 2u;          // of V
const Q_GROUPS: u32 = 4u;          // vec4 of q per row and invocation: CHUNKS_K * GROUPS
const ACC_GROUPS: u32 = 4u;        // vec4 of acc per row and invocation: CHUNKS_V * GROUPS
const SUBGROUP: u32 = 4u;         // the subgroup size relied on (the profile's least): shuffles stay within it
const BLOCKS: u32 = 32u;           // WORKGROUP_SIZE / SUBGROUP: the epilogue sums acc over them in sO

// Scores are kept in the log2 domain so that exp2 does the softmax: t = s * scale * log2(e).
// scale = 0.125 (1 / sqrt(head_dim qk)).
// softcap = 30.0: t = log2(e) * softcap * tanh(s * scale / softcap).
const SCALE_OVER_CAP: f32 = 0.004166666666666667;  // scale / softcap
const SOFTCAP_LOG2: f32 = 43.2808512266689;   // softcap * log2(e)
// tanh(x) is +-1 in f32 once |x| > 9.01; clamping the argument keeps implementations that
// compute tanh through exp from overflowing to inf / inf = NaN.
const TANH_CLAMP: f32 = 15.0;
// Below this |x|, tanh_accurate uses its series (next term 17 x^7 / 315: below f32 rounding).
const TANH_SERIES: f32 = 0.0625;
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
// Storage is f16 packed in u32 words (no shader-f16; section memory): elem_t, the
// type of the tiles in workgroup memory, is f32, and so is all arithmetic.
alias elem_t = f32;    // storage of q, k, v and out; the tiles in workgroup memory
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
    splits: u32,        // S, KV splits: key tiles are divided over S workgroups
    _pad19: u32,        // keeps the struct a multiple of 16 bytes
}

// params: sizes and word offsets of this launch (struct Params)
@group(0) @binding(0) var<uniform> params: Params;
// q (B, Lq, Hq, Dqk) f16: queries (packed: (total_q, Hq, Dqk))
// (read as u32 words)
@group(0) @binding(1) var<storage, read> q: array<u32>;
// k (B, Lk, Hkv, Dqk) f16: keys (packed: (total_k, Hkv, Dqk); paged: (num_pages, page, Hkv,
// Dqk)); read_write: appended rows are written in place
// (read and written as 16-byte items, vec4<u32>)
@group(0) @binding(2) var<storage, read_write> k: array<vec4<u32>>;
// v (B, Lk, Hkv, Dv) f16: values, laid out as k; read_write: appended rows are written in
// place
// (read and written as 16-byte items, vec4<u32>)
@group(0) @binding(3) var<storage, read_write> v: array<vec4<u32>>;
// out (B, Lq, Hq, Dv) f16: attention output (packed: (total_q, Hq, Dv))
@group(0) @binding(4) var<storage, read_write> out: array<atomic<u32>>;
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
// (read and written as 16-byte items, vec4<u32>)
@group(0) @binding(7) var<storage, read> kv_new: array<vec4<u32>>;
// o_part (S, B, Lq, Hq, Dv) f32: workspace: each KV split's output, normalised by its own sum
// (two_pass: by the row's)
@group(0) @binding(9) var<storage, read_write> o_part: array<f32>;
// lse_part (S, B, Hq, Lq) f32: workspace: each KV split's lse (MASKED = -3e38 for a split that
// saw no key)
@group(0) @binding(10) var<storage, read_write> lse_part: array<f32>;

// f16 storage without shader-f16: out holds two f16 per u32 word, element 2w in the low half; the
// combine writes it half a word at a time with atomics (the two halves belong to different
// invocations). q, k and v are read as u32 words whatever their dtype.
fn store_out(i: u32, x: f32) {
    let shift = (i & 1u) * 16u;
    var half = pack2x16float(vec2<f32>(x, 0.0)) & 0xffffu;
    if (is_nan(x)) {
        half = 0x7e00u;  // a quiet f16 NaN (pack2x16float leaves non-finite values indeterminate)
    }
    atomicAnd(&out[i >> 1u], ~(0xffffu << shift));
    atomicOr(&out[i >> 1u], half << shift);
}

// Workgroup memory (9216 bytes), used by the epilogue only:
var<workgroup> sM: array<f32, 128>;  // TEAMS x ROWS: each team's m_i, then its l_i
var<workgroup> sBad: array<u32, 128>;  // TEAMS x ROWS: each team's row_bad
var<workgroup> sO: array<vec4<f32>, 512>;  // BLOCKS x HEAD_DIM_V / 4: acc of a row summed over each block's teams

// ---- section: mask --------------------------------------------------------------------------
// mask window(left=100, right=0), bottom-right aligned: query i sees key j iff i + (Lk - Lq) - 100 <= j <= i + (Lk - Lq) + 0.
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
const WINDOW_LEFT: i32 = 100;   // window(left=...)
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

// ---- section: score transform ---------------------------------------------------------------
// Raw dot product -> score in the log2 domain, t = log2(e) * softcap * tanh(scale * s / softcap).
// tanh, accurate for small arguments too: implementations may compute tanh through exp, and
// (e^2x - 1) / (e^2x + 1) loses most digits for |x| below ~1e-3 (a large softcap); there the odd
// series x - x^3 / 3 + 2 x^5 / 15 is exact to f32. A NaN stays NaN (clamp might hide it).
fn tanh_accurate(x: f32) -> f32 {
    if (is_nan(x)) {
        return x;
    }
    if (abs(x) < TANH_SERIES) {
        let x2 = x * x;
        return x * (1.0 - x2 * (1.0 / 3.0 - x2 * (2.0 / 15.0)));
    }
    return tanh(clamp(x, -TANH_CLAMP, TANH_CLAMP));
}

fn score_transform(s: f32) -> f32 {
    return SOFTCAP_LOG2 * tanh_accurate(s * SCALE_OVER_CAP);
}

// ---- section: 16-byte items -------------------------------------------------------------------
// k and v, and kv_new, are bound as vec4<u32>: one load reads 16 bytes of a row, 8 f16.

// Values 4g .. 4g + 3 of an item of K or V (unscaled).
fn item_group(item: vec4<u32>, g: u32) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(item[2u * g]), unpack2x16float(item[2u * g + 1u]));
}

// The item holds inf or NaN (an f16 with exponent 31), tested on its bits: the exponent field plus one
// carries into the bit above it only where the field is all ones.
fn item_nonfinite(item: vec4<u32>) -> bool {
    let carry = ((item & vec4<u32>(0x7c007c00u)) + vec4<u32>(0x04000400u)) & vec4<u32>(0x80008000u);
    return any(carry != vec4<u32>(0u));
}

// Elements e .. e + 3 of q (e a multiple of 4), as f32: q is bound as u32 words.
fn q4(e: u32) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(q[e >> 1u]), unpack2x16float(q[(e >> 1u) + 1u]));
}

// The sum of x over the TEAM invocations of a team: a butterfly of subgroup shuffles, after which
// every invocation of the team holds the same bits (additions commute). Called in uniform control
// flow; the team's invocations are consecutive invocations of one subgroup (TEAM <= SUBGROUP, and
// the runtime checks once per device that subgroups are consecutive runs of local_invocation_index).
fn team_sum(x: f32) -> f32 {
    var r = x;
    r += subgroupShuffleXor(r, 2u);
    r += subgroupShuffleXor(r, 1u);
    return r;
}

// ---- section: append ------------------------------------------------------------------------
// The fused append: the workgroup of the first row block and split of each (sequence, KV head)
// copies the sequence's len_new rows of k_new / v_new into the cache, 16 bytes at a time, bit for
// bit; every workgroup reads those keys from kv_new, so none waits for the copy.
fn append_items(lid: u32, seq: Seq, kv_head: u32) {
    for (var e = lid; e < params.len_new * ITEMS_K; e += WORKGROUP_SIZE) {
        let j = seq.cached + e / ITEMS_K;
        k[(key_row(seq, j) * params.heads_kv + kv_head) * ITEMS_K + e % ITEMS_K] =
            kv_new[new_row(seq, j, kv_head) * ITEMS_K + e % ITEMS_K];
    }
    for (var e = lid; e < params.len_new * ITEMS_V; e += WORKGROUP_SIZE) {
        let j = seq.cached + e / ITEMS_V;
        v[(key_row(seq, j) * params.heads_kv + kv_head) * ITEMS_V + e % ITEMS_V] =
            kv_new[params.new_v / VALUES + new_row(seq, j, kv_head) * ITEMS_V + e % ITEMS_V];
    }
}

// ---- section: kernel ------------------------------------------------------------------------
// FlashAttention-2's online softmax (Dao 2023) per team: each team keeps, per row, the running
// max m_i of its keys' scores (log2 domain), the sum l_i of exp2(t - m_i) and the unnormalised
// acc of its columns; alpha = exp2(m_old - m_new) rescales them when the max grows. The teams'
// shares are merged in the epilogue; this split's output (normalised by its own sum) and lse go
// to o_part / lse_part, which attngen_decode_f16_window_combine merges by lse.
@compute @workgroup_size(128, 1, 1)
fn attngen_decode_f16_window(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let team = lid / TEAM;                        // keys team + TEAMS * u of each step
    let lane = lid % TEAM;                        // items lane + TEAM * c of each key's rows
    let seq = sequence(wg.z);                     // the workgroup's sequence: lengths and offsets
    let kv_head = wg.y;
    let split = wg.x % params.splits;             // which share of the row block's key steps
    let pair0 = (wg.x / params.splits) * ROWS;    // first (query row, head in group) pair, row-major
    let pairs = seq.len_q * params.group;
    let row0 = pair0 / params.group;              // the workgroup's query rows: [row0, row_end)
    let row_end = min((min(pair0 + ROWS, pairs) + params.group - 1u) / params.group, seq.len_q);
    var q_row: array<u32, ROWS>;                  // the query row of each of the workgroup's rows
    var q_head: array<u32, ROWS>;                 // and its query head
    for (var i = 0u; i < ROWS; i++) {
        q_row[i] = (pair0 + i) / params.group;
        q_head[i] = kv_head * params.group + (pair0 + i) % params.group;
    }

    // ---- section: append ----
    if (params.len_new > 0u && wg.x == 0u) {
        append_items(lid, seq, kv_head);
    }

    // ---- section: prologue: q in registers ----
    // Each invocation holds the rows' q for the columns of its items of K.
    var qv: array<array<vec4<f32>, Q_GROUPS>, ROWS>;
    for (var i = 0u; i < ROWS; i++) {
        if (q_row[i] < seq.len_q) {  // rows past the sequence's keep q = 0 (never stored)
            let at = ((seq.q_row0 + q_row[i]) * params.heads_q + q_head[i]) * HEAD_DIM_QK;
            for (var c = 0u; c < CHUNKS_K; c++) {
                for (var g = 0u; g < GROUPS; g++) {
                    qv[i][c * GROUPS + g] = q4(at + (lane + TEAM * c) * VALUES + 4u * g);
                }
            }
        }
    }

    // ---- section: loop bounds (mask) and KV split ----
    // The keys any of the rows may see, in steps of STEP keys aligned to STEP; split s takes the
    // steps [s * per_split, (s + 1) * per_split) of them (trailing splits may get none: their lse is
    // MASKED and they weigh 0 in the combine).
    let has_rows = row0 < row_end;
    let range = key_range(seq, i32(row0), i32(row_end));
    let tiles_begin = range.x / i32(STEP);
    let tiles_all = select(0, (range.y + i32(STEP) - 1) / i32(STEP) - tiles_begin, has_rows && range.y > range.x);
    let per_split = (tiles_all + i32(params.splits) - 1) / i32(params.splits);
    let tile_first = tiles_begin + i32(split) * per_split;
    let n_tiles = clamp(tiles_all - i32(split) * per_split, 0, per_split);

    // Per row i of the workgroup, this team's:
    var m_i: array<f32, ROWS>;          // running max of the row's scores (log2 domain); MASKED = none yet
    var l_i: array<f32, ROWS>;          // running sum of exp2(t - m_i) over the team's keys
    var row_bad: array<bool, ROWS>;     // the row saw a NaN or +inf score: its result is NaN
    var acc: array<array<vec4<f32>, ACC_GROUPS>, ROWS>;  // unnormalised output, this invocation's columns
    for (var i = 0u; i < ROWS; i++) {
        m_i[i] = MASKED;
    }

    // ---- section: main loop over key steps ----
    // The loop ends with one extra, empty pass. A driver that silently cuts long-running loops
    // short (Mesa's llvmpipe ends all loops of a shader after 65535 iterations in total) exits
    // before that pass; the epilogue then stores nothing, which the runtime detects.
    var it = 0;
    for (; it <= n_tiles; it++) {
        if (it == n_tiles) {
            continue;  // the empty pass
        }
        let j0 = u32(tile_first + it) * STEP + team;  // this team's first key of the step; key u is j0 + TEAMS * u

        // -- load this invocation's items of its keys (zeros past the sequence's keys, which are masked),
        // -- every load issued before any is used (explicit initialisers: naga zero-fills a `var`
        // -- without one only once, not on every pass of a loop)
        var kw = array<array<vec4<u32>, CHUNKS_K>, KEYS>();
        var vw = array<array<vec4<u32>, CHUNKS_V>, KEYS>();
        for (var u = 0u; u < KEYS; u++) {
            let j = j0 + TEAMS * u;
            if (j < seq.len_k) {
                if (j >= seq.cached) {  // an appended key: read from kv_new (the append may not have landed)
                    let row = new_row(seq, j, kv_head);
                    for (var c = 0u; c < CHUNKS_K; c++) {
                        kw[u][c] = kv_new[row * ITEMS_K + lane + TEAM * c];
                    }
                    for (var c = 0u; c < CHUNKS_V; c++) {
                        vw[u][c] = kv_new[params.new_v / VALUES + row * ITEMS_V + lane + TEAM * c];
                    }
                } else {
                    let row = key_row(seq, j) * params.heads_kv + kv_head;  // the key's row of k and v, as (rows, Hkv)
                    for (var c = 0u; c < CHUNKS_K; c++) {
                        kw[u][c] = k[row * ITEMS_K + lane + TEAM * c];
                    }
                    for (var c = 0u; c < CHUNKS_V; c++) {
                        vw[u][c] = v[row * ITEMS_V + lane + TEAM * c];
                    }
                }
            }
        }

        // -- S = Q K^T: this invocation's partial dot products, then the team's sum
        var s = array<array<f32, ROWS>, KEYS>();
        for (var u = 0u; u < KEYS; u++) {
            var part = array<f32, ROWS>();
            for (var c = 0u; c < CHUNKS_K; c++) {
                for (var g = 0u; g < GROUPS; g++) {
                    let x = item_group(kw[u][c], g);
                    for (var i = 0u; i < ROWS; i++) {
                        let qg = qv[i][c * GROUPS + g];
                        part[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, part[i]))));
                    }
                }
            }
            for (var i = 0u; i < ROWS; i++) {
                s[u][i] = team_sum(part[i]);
            }
        }

        // -- score transform and mask: a key the row does not see is MASKED; a NaN or +inf score of a
        // -- key it sees makes the row's result NaN (row_bad)
        for (var u = 0u; u < KEYS; u++) {
            let j = i32(j0 + TEAMS * u);
            for (var i = 0u; i < ROWS; i++) {
                var t = score_transform(s[u][i]);
                if (!visible(seq, i32(q_row[i]), j)) {
                    t = MASKED;
                } else if (poisons(t)) {
                    row_bad[i] = true;
                    t = MASKED;
                } else if (bitcast<u32>(t) == NEG_INF_BITS) {
                    t = MASKED;  // a score of -inf: p = 0 (tested on bits)
                }
                s[u][i] = t;
            }
        }

        // -- online softmax: the team's m_i, l_i; acc rescaled by alpha only where a row's max grew
        for (var i = 0u; i < ROWS; i++) {
            var m = m_i[i];
            for (var u = 0u; u < KEYS; u++) {
                m = max(m, s[u][i]);
            }
            if (m > m_i[i]) {  // (the team's invocations hold the same scores: no divergence within a team)
                let alpha = select(exp2(m_i[i] - m), 0.0, m_i[i] <= MASKED);
                l_i[i] *= alpha;
                for (var w = 0u; w < ACC_GROUPS; w++) {
                    acc[i][w] *= alpha;
                }
                m_i[i] = m;
            }
            // a row that has seen no key keeps m = MASKED; subtracting 0 instead keeps exp2 finite,
            // and the select gives p = 0
            let m_use = select(m_i[i], 0.0, m_i[i] <= MASKED);
            for (var u = 0u; u < KEYS; u++) {
                let p = select(exp2(s[u][i] - m_use), 0.0, s[u][i] <= MASKED);
                s[u][i] = p;
                l_i[i] += p;
            }
        }

        // -- O += P V over this invocation's items of V
        for (var u = 0u; u < KEYS; u++) {
            // a key of weight 0 (masked, or its exp2 underflowed) must add nothing whatever its V: where
            // this invocation's items of the key's V hold inf or NaN, such keys are selected out
            var v_bad = false;
            for (var c = 0u; c < CHUNKS_V; c++) {
                v_bad = v_bad || item_nonfinite(vw[u][c]);
            }
            if (v_bad) {
                for (var c = 0u; c < CHUNKS_V; c++) {
                    for (var g = 0u; g < GROUPS; g++) {
                        let x = item_group(vw[u][c], g);
                        for (var i = 0u; i < ROWS; i++) {
                            if (bitcast<u32>(s[u][i]) != 0u) {  // p = 0 adds nothing, whatever V holds
                                acc[i][c * GROUPS + g] += s[u][i] * x;
                            }
                        }
                    }
                }
} else {
                for (var c = 0u; c < CHUNKS_V; c++) {
                    for (var g = 0u; g < GROUPS; g++) {
                        let x = item_group(vw[u][c], g);
                        for (var i = 0u; i < ROWS; i++) {
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i]), x, acc[i][c * GROUPS + g]);
                        }
                    }
                }
}
        }
    }

    // ---- section: epilogue: the teams merged, this split's rows stored ----
    // A row that saw no key has l = 0: its share is 0 and its lse MASKED (the combine gives 0 and
    // -inf where no split saw a key). A row that saw a NaN or +inf score gets NaN.
    let completed = it > n_tiles;  // false only when the driver cut the main loop short
    var nan_bits = NAN_BITS;
    let nan = bitcast<f32>(nan_bits);  // a var's bits: never a const-expression
    if (lane == 0u) {
        for (var i = 0u; i < ROWS; i++) {
            sM[team * ROWS + i] = m_i[i];
            sBad[team * ROWS + i] = select(0u, 1u, row_bad[i]);
        }
    }
    workgroupBarrier();  // every team's m_i and row_bad in workgroup memory
    var m_row: array<f32, ROWS>;     // the row's max over every team
    var bad_row: array<bool, ROWS>;  // and whether any team saw a NaN or +inf score of it
    for (var i = 0u; i < ROWS; i++) {
        var m = MASKED;
        var bad = false;
        for (var t = 0u; t < TEAMS; t++) {
            m = max(m, sM[t * ROWS + i]);
            bad = bad || sBad[t * ROWS + i] != 0u;
        }
        m_row[i] = m;
        bad_row[i] = bad;
        // this team's share rescaled to the row's max (0: the team saw no key of the row)
        let f = select(exp2(m_i[i] - m), 0.0, m_i[i] <= MASKED);
        l_i[i] *= f;
        for (var w = 0u; w < ACC_GROUPS; w++) {
            acc[i][w] *= f;
        }
    }
    workgroupBarrier();  // every invocation has read sM before it takes the sums
    if (lane == 0u) {
        for (var i = 0u; i < ROWS; i++) {
            sM[team * ROWS + i] = l_i[i];
        }
    }
    workgroupBarrier();
    var l_row: array<f32, ROWS>;  // the row's sum
    var inv_l: array<f32, ROWS>;
    for (var i = 0u; i < ROWS; i++) {
        var l = 0.0;
        for (var t = 0u; t < TEAMS; t++) {
            l += sM[t * ROWS + i];
        }
        l_row[i] = l;
        inv_l[i] = select(0.0, 1.0 / l, l > 0.0);
    }
    let block = lid / SUBGROUP;
    let writes = lid % SUBGROUP < TEAM;  // the block's first team writes the block's sums
    for (var i = 0u; i < ROWS; i++) {
        if (writes) {
            for (var c = 0u; c < CHUNKS_V; c++) {
                for (var g = 0u; g < GROUPS; g++) {
                    sO[block * (HEAD_DIM_V / 4u) + (lane + TEAM * c) * GROUPS + g] = acc[i][c * GROUPS + g];
                }
            }
        }
        workgroupBarrier();  // the blocks' sums of row i in sO
        let row = q_row[i];
        if (row < seq.len_q && completed) {
            // This split's output normalised by its own sum (f32), and its lse; MASKED when it saw no key.
            let part = split * params.batch + seq.batch;
            let o_base = ((part * params.len_q + row) * params.heads_q + q_head[i]) * HEAD_DIM_V;
            for (var col = lid; col < HEAD_DIM_V / 4u; col += WORKGROUP_SIZE) {
                var o = vec4<f32>();
                for (var b = 0u; b < BLOCKS; b++) {
                    o += sO[b * (HEAD_DIM_V / 4u) + col];
                }
                o *= inv_l[i];
                for (var e = 0u; e < 4u; e++) {
                    o_part[o_base + 4u * col + e] = select(o[e], nan, bad_row[i]);
                }
            }
            if (lid == 0u) {
                let part_lse = select(MASKED, m_row[i] * LN2 + log(l_row[i]), l_row[i] > 0.0);
                lse_part[(part * params.heads_q + q_head[i]) * params.len_q + row] = select(part_lse, nan, bad_row[i]);
            }
        }
        workgroupBarrier();  // every invocation has read sO before the next row's sums
    }
}

// Bits that the runtime fills the lse_part (and stats) workspaces with before the launch. A
// workgroup that a driver cut short stores nothing, so its bits survive; the combine then
// leaves the row's output unwritten, and the runtime, which checks every output element on
// such drivers, refuses the launch instead of returning a wrong answer.
const UNWRITTEN_BITS: u32 = 0x7fc0deadu;

// ---- section: combine ---------------------------------------------------------------------------
// One invocation per (query row, query head) of a sequence (dispatch x over Lq * Hq, y over the
// sequences). Merges the splits by their lse (natural log): lse = log(sum_s exp(lse_s)), out = sum_s exp(lse_s - lse) * out_s; a split that saw no key (lse_s = MASKED) weighs 0.
// A row that no split saw gets out 0 and lse -inf. No barriers: invocations past the
// sequence's rows return at once.
const MAX_SPLITS: u32 = 3u;  // the most splits a launch uses (the runtime's bound)

@compute @workgroup_size(64, 1, 1)
fn attngen_decode_f16_window_combine(@builtin(global_invocation_id) gid: vec3<u32>) {
    let seq = sequence(gid.y);
    let row = gid.x / params.heads_q;
    let head = gid.x % params.heads_q;
    if (row >= seq.len_q) {
        return;
    }
    let split_stride = params.batch * params.heads_q * params.len_q;  // lse_part elements per split
    let lse_at = (seq.batch * params.heads_q + head) * params.len_q + row;
    // weights of the splits
    var w: array<f32, MAX_SPLITS>;
    var m = MASKED;
    var row_bad = false;  // a split's result is NaN (undefined): so is the row's
    for (var sp = 0u; sp < params.splits; sp++) {
        let x = lse_part[sp * split_stride + lse_at];
        if (bitcast<u32>(x) == UNWRITTEN_BITS) {
            return;  // a split's workgroup was cut short by the driver: leave the row unwritten
        }
        row_bad = row_bad || is_nan(x);
        w[sp] = select(x, MASKED, is_nan(x));
        m = max(m, w[sp]);
    }
    var nan_bits = NAN_BITS;
    let nan = bitcast<f32>(nan_bits);
    var total = 0.0;
    for (var sp = 0u; sp < params.splits; sp++) {
        w[sp] = select(exp(w[sp] - m), 0.0, w[sp] <= MASKED || m <= MASKED);
        total += w[sp];
    }
    for (var sp = 0u; sp < params.splits; sp++) {
        w[sp] = select(0.0, w[sp] / total, total > 0.0);
    }
    let row_lse = m + log(select(1.0, total, total > 0.0));
    let o_row = ((seq.batch * params.len_q + row) * params.heads_q + head) * HEAD_DIM_V;
    let o_split = params.batch * params.len_q * params.heads_q * HEAD_DIM_V;  // o_part elements per split
    let out_base = ((seq.q_row0 + row) * params.heads_q + head) * HEAD_DIM_V;
    for (var d = 0u; d < HEAD_DIM_V; d++) {
        var o = 0.0;
        for (var sp = 0u; sp < params.splits; sp++) {
            if (w[sp] > 0.0) {
                o += w[sp] * o_part[sp * o_split + o_row + d];
            }
        }
        store_out(out_base + d, select(o, nan, row_bad));
    }
    if (params.write_lse != 0u) {
        var neg_inf_bits = NEG_INF_BITS;
        var value = bitcast<f32>(neg_inf_bits);
        if (m > MASKED && total > 0.0) {
            value = row_lse;
        }
        lse[seq.lse0 + head * seq.lse_stride + row] = select(value, nan, row_bad);
    }
}
