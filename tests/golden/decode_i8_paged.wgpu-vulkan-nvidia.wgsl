// =============================================================================================
// attngen 0.1.0: flash-attention forward kernel for target wgsl (profile wgpu-vulkan-nvidia).
// Generated from the spec below; regenerate with `attngen build SPEC --target wgsl --kernel decode_i8_paged` rather than editing.
//
// Spec (normalised, every default filled in):
//   attention decode_i8_paged {
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
//       kv_dtype   i8
//       target     cuda { warps=auto stages=auto key_warps=auto producer=auto persistent=auto tma=auto backward=auto }
//       target     wgsl { workgroup=auto subgroups=auto f16=auto prefetch=auto decode=on }
//   }
//
// Plan: decode kernel: 4 (query row, head) pair(s) per workgroup of 128, teams of 8 invocation(s) per key (1 + 1 16-byte item(s) of K and V each, 16 values an item), 4 key(s) per team and step (64 keys a step).
// Scale 0.08838834764831843; mask causal(bottom_right): query i sees key j iff j <= i + (Lk - Lq).
// Workgroup memory (the epilogue's): 2560 bytes (each buffer 16-byte aligned):
//   sM   at      0: 16 x 4 f32 (each team's row max m_i, then its share of the row's sum l_i)
//   sBad at    256: 16 x 4 u32 (each team's row_bad (the row saw a NaN or +inf score))
//   sO   at    512: 4 x 128 f32 (acc summed over each block's teams, one output row at a time)
// Decode kernel: decode kernel: 4 (query row, head) pair(s) per workgroup of 128, teams of 8 invocation(s) per key (1 + 1 16-byte item(s) of K and V each, 16 values an item), 4 key(s) per team and step (64 keys a step).
// Grid: (ceil(Lq * G / 4) * S, Hkv, B), 128 threads each; tensors are (batch, seq, heads, head_dim): q (B, Lq, Hq, Dqk), k (B, Lk, Hkv, Dqk), v (B, Lk, Hkv, Dv), out (B, Lq, Hq, Dv); lse (B, Hq, Lq) f32.
// Entry point: attngen_decode_i8_paged; the manifest (attngen build --emit manifest) lists the parameters in order.
// =============================================================================================
enable f16;

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
const TEAM: u32 = 8u;              // invocations sharing a key (a power of two within SUBGROUP)
const TEAMS: u32 = 16u;            // teams of the workgroup
const KEYS: u32 = 4u;              // keys per team and step
const STEP: u32 = 64u;            // keys per workgroup step: TEAMS * KEYS (tile kv)
const HEAD_DIM_QK: u32 = 128u;      // head dim of q and k
const HEAD_DIM_V: u32 = 128u;       // head dim of v and out
const VALUES: u32 = 16u;           // values per 16-byte item of K and V (16 int8)
const GROUPS: u32 = 4u;            // vec4<f32> per item: VALUES / 4
const ITEMS_K: u32 = 8u;           // items of a row of K: HEAD_DIM_QK / VALUES
const ITEMS_V: u32 = 8u;           // items of a row of V
const CHUNKS_K: u32 = 1u;          // items of each key's row of K per invocation: ITEMS_K / TEAM
const CHUNKS_V: u32 = 1u;          // of V
const Q_GROUPS: u32 = 4u;          // vec4 of q per row and invocation: CHUNKS_K * GROUPS
const ACC_GROUPS: u32 = 4u;        // vec4 of acc per row and invocation: CHUNKS_V * GROUPS
const SUBGROUP: u32 = 32u;         // the subgroup size relied on (the profile's least): shuffles stay within it
const BLOCKS: u32 = 4u;           // WORKGROUP_SIZE / SUBGROUP: the epilogue sums acc over them in sO

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
    splits: u32,        // S, KV splits: key tiles are divided over S workgroups
    scale_v: u32,       // word offset of v_scale in kv_scale (k_scale's size)
    meta_new: u32,      // the decode kernel: word offset of k_new, then v_new, in seq_meta
    _pad21: u32,        // keeps the struct a multiple of 16 bytes
    _pad22: u32,        // keeps the struct a multiple of 16 bytes
    _pad23: u32,        // keeps the struct a multiple of 16 bytes
}

// params: sizes and word offsets of this launch (struct Params)
@group(0) @binding(0) var<uniform> params: Params;
// q (B, Lq, Hq, Dqk) f16: queries (packed: (total_q, Hq, Dqk))
// (read as u32 words)
@group(0) @binding(1) var<storage, read> q: array<u32>;
// k (B, Lk, Hkv, Dqk) i8: keys (packed: (total_k, Hkv, Dqk); paged: (num_pages, page, Hkv,
// Dqk)); read_write: appended rows are written in place
// (read and written as 16-byte items, vec4<u32>)
@group(0) @binding(2) var<storage, read_write> k: array<vec4<u32>>;
// v (B, Lk, Hkv, Dv) i8: values, laid out as k; read_write: appended rows are written in place
// (read and written as 16-byte items, vec4<u32>)
@group(0) @binding(3) var<storage, read_write> v: array<vec4<u32>>;
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
// o_part (S, B, Lq, Hq, Dv) f32: workspace: each KV split's output, normalised by its own sum
// (two_pass: by the row's)
@group(0) @binding(9) var<storage, read_write> o_part: array<f32>;
// lse_part (S, B, Hq, Lq) f32: workspace: each KV split's lse (MASKED = -3e38 for a split that
// saw no key)
@group(0) @binding(10) var<storage, read_write> lse_part: array<f32>;
// k_scale (k_scale_words) f32: kv_dtype, the decode kernel: k's scales, f32: e4m3 / e5m2: (B,
// Hkv), one per sequence and KV head; i8: k's shape with the head dim replaced by Dqk / 32,
// one per block of 32 values of a row
@group(0) @binding(15) var<storage, read> k_scale: array<f32>;
// v_scale (v_scale_words) f32: kv_dtype, the decode kernel: v's scales, laid out as k_scale's
// (Dv / 32 for i8)
@group(0) @binding(16) var<storage, read> v_scale: array<f32>;
// k_scale_w (k_scale_words) f32: kv_dtype i8, the decode kernel's appending twin only:
// k_scale, bound read_write (the append writes its new rows' scales)
@group(0) @binding(17) var<storage, read_write> k_scale_w: array<f32>;
// v_scale_w (v_scale_words) f32: kv_dtype i8, the decode kernel's appending twin only:
// v_scale, bound read_write
@group(0) @binding(18) var<storage, read_write> v_scale_w: array<f32>;

// Workgroup memory (2560 bytes), used by the epilogue only:
var<workgroup> sM: array<f32, 64>;  // TEAMS x ROWS: each team's m_i, then its l_i
var<workgroup> sBad: array<u32, 64>;  // TEAMS x ROWS: each team's row_bad
var<workgroup> sO: array<vec4<f32>, 128>;  // BLOCKS x HEAD_DIM_V / 4: acc of a row summed over each block's teams

// ---- section: mask --------------------------------------------------------------------------
// mask causal(bottom_right): query i sees key j iff j <= i + (Lk - Lq).
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

// Bottom-right alignment: the key on query row i's diagonal, i + (Lk - Lq); the last query row
// lines up with the last key. In [-2^30, 2^30) for every row i < Lq.
fn diag(seq: Seq, i: i32) -> i32 {
    return i + (i32(seq.len_k) - i32(seq.len_q));
}

fn visible(seq: Seq, i: i32, j: i32) -> bool {
    return j < i32(seq.len_k) && j <= diag(seq, i);
}

fn key_range(seq: Seq, r0: i32, r1: i32) -> vec2<i32> {
    let len_k = i32(seq.len_k);
    return vec2<i32>(0, clamp(diag(seq, r1 - 1) + 1, 0, len_k));
}

fn tile_is_full(seq: Seq, r0: i32, r1: i32, j0: i32, j1: i32) -> bool {
    let len_k = i32(seq.len_k);
    return j1 <= len_k && j1 - 1 <= diag(seq, r0);
}

// ---- section: sequences ---------------------------------------------------------------------
// Sequence `batch` (dispatch z) by params.kv_layout:
//   0 padded: query row i is row batch * Lq + i of q and out (viewed as (rows, Hq, D)); key j is
//             row batch * cap + j of k and v (viewed as (rows, Hkv, D)); lse (B, Hq, Lq).
//   1 packed: query row i is row cu_seqlens_q[batch] + i, key j row cu_seqlens_k[batch] + j;
//             lse (Hq, total_q).
//   2 paged:  queries as padded; key j is slot j % PAGE of page block_table[batch, j / PAGE].
// With kv_lens (has_kv_lens = 1) the sequence has kv_lens[batch] keys in the cache and, when a
// call appends (len_new > 0), the len_new keys of k_new / v_new after them: every workgroup reads
// those from kv_new, never from the cache, so nobody waits for the append to land.
const PAGE: u32 = 16u;  // kv_cache paged(page=16): keys per page

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
    let page = seq_meta[params.meta_table + seq.batch * params.table_width + j / PAGE];
    return page * PAGE + j % PAGE;
}

// Row of kv_new (viewed as (B, Lnew, Hkv)) holding appended key j >= seq.cached.
fn new_row(seq: Seq, j: u32, kv_head: u32) -> u32 {
    return (seq.batch * params.len_new + j - seq.cached) * params.heads_kv + kv_head;
}

// ---- section: score transform ---------------------------------------------------------------
// Raw dot product -> score in the log2 domain, t = log2(e) * scale * s.
fn score_transform(s: f32) -> f32 {
    return s * SCALE_LOG2;
}

// ---- section: 16-byte items -------------------------------------------------------------------
// k and v are bound as vec4<u32>: one load reads 16 bytes of a row, 16 int8.
// kv_dtype i8: four signed bytes of a word as f32, exactly, with integer operations and one
// subtraction: each byte plus 128 (its sign bit flipped) sits in the low mantissa bits of the f32
// 2^23, and 2^23 + 128 is taken away. The scale (one per block of 32 values: an item lies in
// one block) multiplies the item's dot products and the item's weights in P V.
fn decode4(w: u32) -> vec4<f32> {
    let b = (vec4<u32>(w ^ 0x80808080u) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xffu);
    return bitcast<vec4<f32>>(b | vec4<u32>(0x4b000000u)) - vec4<f32>(8388736.0);
}

// Values 4g .. 4g + 3 of an item of K or V (unscaled).
fn item_group(item: vec4<u32>, g: u32) -> vec4<f32> {
    return decode4(item[g]);
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
    r += subgroupShuffleXor(r, 4u);
    r += subgroupShuffleXor(r, 2u);
    r += subgroupShuffleXor(r, 1u);
    return r;
}

// ---- section: append ------------------------------------------------------------------------
// The fused append into the quantized cache: the workgroup of the first row block and split of
// each (sequence, KV head) writes the sequence's len_new rows of k_new / v_new into the cache,
// quantized (kv_encode, with each block of 32 values' scale from kv_block_scale, written to k_scale / v_scale),
// one 16-byte item (16 values) at a time; every workgroup reads those keys from k_new / v_new and
// quantizes them the same way (new_item), so none waits for the append. k_new and v_new are in
// seq_meta from word params.meta_new (the spec's dtype in u32 words: the decode kernel's
// bindings are all of the profile's storage buffers).
// ---- the append's quantizer (runtime/kvquant.py: quantize_rows, the same f32 arithmetic) ----
// WGSL lets a division be 2.5 ulp off (SwiftShader's is), and the bytes an append writes must be
// the host's: div_rn corrects the adapter's quotient to the IEEE one (the nearest f32, ties to
// even) by exact integer comparisons with the midpoints between neighbouring f32 values.

// 2 |a| / |b| against v(u) + v(u + 1), u the bits of a positive normal f32 and v its value: -1, 0, 1.
// a = A 2^(ea - 150), b = B 2^(eb - 150), v(u) + v(u + 1) = (2 U + 1) 2^(eu - 150) (within a binade
// and across one), so it compares A 2^k with (2 U + 1) B, k = ea - eu - eb + 151, as base-2^24 pairs.
fn kv_mid_cmp(ua: u32, ub: u32, u: u32) -> i32 {
    let a = (ua & 0x7fffffu) | 0x800000u;
    let b = (ub & 0x7fffffu) | 0x800000u;
    let x = 2u * ((u & 0x7fffffu) | 0x800000u) + 1u;
    let k = i32(ua >> 23u) - i32(u >> 23u) - i32(ub >> 23u) + 151;
    if (k < 0 || k > 30 || (u >> 23u) == 0u) {
        return 0;  // (not a normal quotient near the adapter's: left as the adapter made it)
    }
    var l = vec2<u32>(a >> u32(24 - min(k, 24)), (a << u32(min(k, 24))) & 0xffffffu);
    if (k > 24) {
        l = vec2<u32>(a << u32(k - 24), 0u);
    }
    let x1 = x >> 12u;
    let x0 = x & 0xfffu;
    let mid = x1 * (b & 0xfffu) + x0 * (b >> 12u);
    let lo = x0 * (b & 0xfffu) + ((mid & 0xfffu) << 12u);
    let r = vec2<u32>(x1 * (b >> 12u) + (mid >> 12u) + (lo >> 24u), lo & 0xffffffu);
    if (l.x != r.x) {
        return select(-1, 1, l.x > r.x);
    }
    if (l.y != r.y) {
        return select(-1, 1, l.y > r.y);
    }
    return 0;
}

// a / b rounded to the nearest f32, ties to even (IEEE), where a, b and the quotient are normal
// (else the adapter's a / b).
fn div_rn(a: f32, b: f32) -> f32 {
    let q = a / b;
    let ua = bitcast<u32>(a) & 0x7fffffffu;
    let ub = bitcast<u32>(b) & 0x7fffffffu;
    var u = bitcast<u32>(q) & 0x7fffffffu;
    let normal = ((ua >> 23u) - 1u) < 254u && ((ub >> 23u) - 1u) < 254u && ((u >> 23u) - 1u) < 253u;
    if (!normal) {
        return q;
    }
    for (var i = 0; i < 4; i++) {  // past the midpoint above u: the next f32 (ties: the even one)
        let c = kv_mid_cmp(ua, ub, u);
        if (c > 0 || (c == 0 && (u & 1u) == 1u)) {
            u += 1u;
        } else {
            break;
        }
    }
    for (var i = 0; i < 4; i++) {  // below the midpoint under u: the f32 before
        let c = kv_mid_cmp(ua, ub, u - 1u);
        if (c < 0 || (c == 0 && (u & 1u) == 1u)) {
            u -= 1u;
        } else {
            break;
        }
    }
    return bitcast<f32>(((bitcast<u32>(a) ^ bitcast<u32>(b)) & 0x80000000u) | u);
}
// A block of 32 appended values x: scale = max|x| / 127, byte = round(x / scale) (ties to even) in
// -127 .. 127; a block of zeros: scale 0, bytes 0. (The runtime refuses inf and NaN in k_new / v_new
// for an i8 cache before the dispatch.)
fn kv_block_scale(amax: f32) -> f32 {
    return div_rn(amax, 127.0);
}

fn kv_encode(x: f32, scale: f32) -> u32 {
    if (!(scale > 0.0)) {
        return 0u;
    }
    return u32(i32(clamp(round(div_rn(x, scale)), -127.0, 127.0))) & 0xffu;
}

// Elements n .. n + 3 (n a multiple of 4) of k_new, then v_new (from element params.new_v), as f32.
fn new4(n: u32) -> vec4<f32> {
    let w = params.meta_new + (n >> 1u);
    return vec4<f32>(unpack2x16float(seq_meta[w]), unpack2x16float(seq_meta[w + 1u]));
}

// The 16 values of k_new / v_new from element n, quantized with `scale`: one item of the cache.
fn new_item(n: u32, scale: f32) -> vec4<u32> {
    var item = vec4<u32>();
    // for g < 4u, unrolled: one block per g
    {
        const g = 0u;
        let x = new4(n + 4u * g);
        item[g] = kv_encode(x.x, scale) | (kv_encode(x.y, scale) << 8u) | (kv_encode(x.z, scale) << 16u) |
                  (kv_encode(x.w, scale) << 24u);
    }
    {
        const g = 1u;
        let x = new4(n + 4u * g);
        item[g] = kv_encode(x.x, scale) | (kv_encode(x.y, scale) << 8u) | (kv_encode(x.z, scale) << 16u) |
                  (kv_encode(x.w, scale) << 24u);
    }
    {
        const g = 2u;
        let x = new4(n + 4u * g);
        item[g] = kv_encode(x.x, scale) | (kv_encode(x.y, scale) << 8u) | (kv_encode(x.z, scale) << 16u) |
                  (kv_encode(x.w, scale) << 24u);
    }
    {
        const g = 3u;
        let x = new4(n + 4u * g);
        item[g] = kv_encode(x.x, scale) | (kv_encode(x.y, scale) << 8u) | (kv_encode(x.z, scale) << 16u) |
                  (kv_encode(x.w, scale) << 24u);
    }
    return item;
}

// The scale of the block of 32 values of k_new / v_new from element n0 (a multiple of 32).
fn new_scale(n0: u32) -> f32 {
    var amax = 0.0;
    for (var c = 0u; c < 32u; c += 4u) {
        let x = abs(new4(n0 + c));
        amax = max(amax, max(max(x.x, x.y), max(x.z, x.w)));
    }
    return kv_block_scale(amax);
}

fn append_items(lid: u32, seq: Seq, kv_head: u32) {
    for (var e = lid; e < params.len_new * ITEMS_K; e += WORKGROUP_SIZE) {
        let j = seq.cached + e / ITEMS_K;
        let col = e % ITEMS_K * VALUES;
        let n = new_row(seq, j, kv_head) * HEAD_DIM_QK + col;
        let row = key_row(seq, j) * params.heads_kv + kv_head;
        let s = new_scale(n - col % 32u);
        if (col % 32u == 0u) {
            k_scale_w[row * (HEAD_DIM_QK / 32u) + col / 32u] = s;
        }
        k[row * ITEMS_K + e % ITEMS_K] = new_item(n, s);
    }
    for (var e = lid; e < params.len_new * ITEMS_V; e += WORKGROUP_SIZE) {
        let j = seq.cached + e / ITEMS_V;
        let col = e % ITEMS_V * VALUES;
        let n = params.new_v + new_row(seq, j, kv_head) * HEAD_DIM_V + col;
        let row = key_row(seq, j) * params.heads_kv + kv_head;
        let s = new_scale(n - col % 32u);
        if (col % 32u == 0u) {
            v_scale_w[row * (HEAD_DIM_V / 32u) + col / 32u] = s;
        }
        v[row * ITEMS_V + e % ITEMS_V] = new_item(n, s);
    }
}

// ---- section: kernel ------------------------------------------------------------------------
// FlashAttention-2's online softmax (Dao 2023) per team: each team keeps, per row, the running
// max m_i of its keys' scores (log2 domain), the sum l_i of exp2(t - m_i) and the unnormalised
// acc of its columns; alpha = exp2(m_old - m_new) rescales them when the max grows. The teams'
// shares are merged in the epilogue; this split's output (normalised by its own sum) and lse go
// to o_part / lse_part, which attngen_decode_i8_paged_combine merges by lse.
// Two entry points: attngen_decode_i8_paged for calls that append nothing, attngen_decode_i8_paged_append (the fused append,
// its loop quantizing appended keys as it reads them) for calls that do: no quantizer in decode's loop.
@compute @workgroup_size(128, 1, 1)
fn attngen_decode_i8_paged(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
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
    // for i < ROWS (4), unrolled: one block per i
    {
        const i = 0u;
        q_row[i] = (pair0 + i) / params.group;
        q_head[i] = kv_head * params.group + (pair0 + i) % params.group;
    }
    {
        const i = 1u;
        q_row[i] = (pair0 + i) / params.group;
        q_head[i] = kv_head * params.group + (pair0 + i) % params.group;
    }
    {
        const i = 2u;
        q_row[i] = (pair0 + i) / params.group;
        q_head[i] = kv_head * params.group + (pair0 + i) % params.group;
    }
    {
        const i = 3u;
        q_row[i] = (pair0 + i) / params.group;
        q_head[i] = kv_head * params.group + (pair0 + i) % params.group;
    }

    // ---- section: prologue: q in registers ----
    // Each invocation holds the rows' q for the columns of its items of K.
    var qv: array<array<vec4<f32>, Q_GROUPS>, ROWS>;
    // for i < ROWS (4), unrolled: one block per i
    {
        const i = 0u;
        if (q_row[i] < seq.len_q) {  // rows past the sequence's keep q = 0 (never stored)
            let at = ((seq.q_row0 + q_row[i]) * params.heads_q + q_head[i]) * HEAD_DIM_QK;
            // for c < CHUNKS_K (1), unrolled: one block per c
            {
                const c = 0u;
                // for g < GROUPS (4), unrolled: one block per g
                {
                    const g = 0u;
                    qv[i][c * GROUPS + g] = q4(at + (lane + TEAM * c) * VALUES + 4u * g);
                }
                {
                    const g = 1u;
                    qv[i][c * GROUPS + g] = q4(at + (lane + TEAM * c) * VALUES + 4u * g);
                }
                {
                    const g = 2u;
                    qv[i][c * GROUPS + g] = q4(at + (lane + TEAM * c) * VALUES + 4u * g);
                }
                {
                    const g = 3u;
                    qv[i][c * GROUPS + g] = q4(at + (lane + TEAM * c) * VALUES + 4u * g);
                }
            }
        }
    }
    {
        const i = 1u;
        if (q_row[i] < seq.len_q) {  // rows past the sequence's keep q = 0 (never stored)
            let at = ((seq.q_row0 + q_row[i]) * params.heads_q + q_head[i]) * HEAD_DIM_QK;
            // for c < CHUNKS_K (1), unrolled: one block per c
            {
                const c = 0u;
                // for g < GROUPS (4), unrolled: one block per g
                {
                    const g = 0u;
                    qv[i][c * GROUPS + g] = q4(at + (lane + TEAM * c) * VALUES + 4u * g);
                }
                {
                    const g = 1u;
                    qv[i][c * GROUPS + g] = q4(at + (lane + TEAM * c) * VALUES + 4u * g);
                }
                {
                    const g = 2u;
                    qv[i][c * GROUPS + g] = q4(at + (lane + TEAM * c) * VALUES + 4u * g);
                }
                {
                    const g = 3u;
                    qv[i][c * GROUPS + g] = q4(at + (lane + TEAM * c) * VALUES + 4u * g);
                }
            }
        }
    }
    {
        const i = 2u;
        if (q_row[i] < seq.len_q) {  // rows past the sequence's keep q = 0 (never stored)
            let at = ((seq.q_row0 + q_row[i]) * params.heads_q + q_head[i]) * HEAD_DIM_QK;
            // for c < CHUNKS_K (1), unrolled: one block per c
            {
                const c = 0u;
                // for g < GROUPS (4), unrolled: one block per g
                {
                    const g = 0u;
                    qv[i][c * GROUPS + g] = q4(at + (lane + TEAM * c) * VALUES + 4u * g);
                }
                {
                    const g = 1u;
                    qv[i][c * GROUPS + g] = q4(at + (lane + TEAM * c) * VALUES + 4u * g);
                }
                {
                    const g = 2u;
                    qv[i][c * GROUPS + g] = q4(at + (lane + TEAM * c) * VALUES + 4u * g);
                }
                {
                    const g = 3u;
                    qv[i][c * GROUPS + g] = q4(at + (lane + TEAM * c) * VALUES + 4u * g);
                }
            }
        }
    }
    {
        const i = 3u;
        if (q_row[i] < seq.len_q) {  // rows past the sequence's keep q = 0 (never stored)
            let at = ((seq.q_row0 + q_row[i]) * params.heads_q + q_head[i]) * HEAD_DIM_QK;
            // for c < CHUNKS_K (1), unrolled: one block per c
            {
                const c = 0u;
                // for g < GROUPS (4), unrolled: one block per g
                {
                    const g = 0u;
                    qv[i][c * GROUPS + g] = q4(at + (lane + TEAM * c) * VALUES + 4u * g);
                }
                {
                    const g = 1u;
                    qv[i][c * GROUPS + g] = q4(at + (lane + TEAM * c) * VALUES + 4u * g);
                }
                {
                    const g = 2u;
                    qv[i][c * GROUPS + g] = q4(at + (lane + TEAM * c) * VALUES + 4u * g);
                }
                {
                    const g = 3u;
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
        var k_sc = array<array<f32, CHUNKS_K>, KEYS>();  // each item's scale (its block of 32 values)
        var v_sc = array<array<f32, CHUNKS_V>, KEYS>();
        // for u < KEYS (4), unrolled: one block per u
        {
            const u = 0u;
            let j = j0 + TEAMS * u;
            if (j < seq.len_k) {
                let row = key_row(seq, j) * params.heads_kv + kv_head;  // the key's row of k and v, as (rows, Hkv)
                // for c < CHUNKS_K (1), unrolled: one block per c
                {
                    const c = 0u;
                    kw[u][c] = k[row * ITEMS_K + lane + TEAM * c];
                    k_sc[u][c] = k_scale[row * (HEAD_DIM_QK / 32u) + (lane + TEAM * c) * VALUES / 32u];
                }
                // for c < CHUNKS_V (1), unrolled: one block per c
                {
                    const c = 0u;
                    vw[u][c] = v[row * ITEMS_V + lane + TEAM * c];
                    v_sc[u][c] = v_scale[row * (HEAD_DIM_V / 32u) + (lane + TEAM * c) * VALUES / 32u];
                }
            }
        }
        {
            const u = 1u;
            let j = j0 + TEAMS * u;
            if (j < seq.len_k) {
                let row = key_row(seq, j) * params.heads_kv + kv_head;  // the key's row of k and v, as (rows, Hkv)
                // for c < CHUNKS_K (1), unrolled: one block per c
                {
                    const c = 0u;
                    kw[u][c] = k[row * ITEMS_K + lane + TEAM * c];
                    k_sc[u][c] = k_scale[row * (HEAD_DIM_QK / 32u) + (lane + TEAM * c) * VALUES / 32u];
                }
                // for c < CHUNKS_V (1), unrolled: one block per c
                {
                    const c = 0u;
                    vw[u][c] = v[row * ITEMS_V + lane + TEAM * c];
                    v_sc[u][c] = v_scale[row * (HEAD_DIM_V / 32u) + (lane + TEAM * c) * VALUES / 32u];
                }
            }
        }
        {
            const u = 2u;
            let j = j0 + TEAMS * u;
            if (j < seq.len_k) {
                let row = key_row(seq, j) * params.heads_kv + kv_head;  // the key's row of k and v, as (rows, Hkv)
                // for c < CHUNKS_K (1), unrolled: one block per c
                {
                    const c = 0u;
                    kw[u][c] = k[row * ITEMS_K + lane + TEAM * c];
                    k_sc[u][c] = k_scale[row * (HEAD_DIM_QK / 32u) + (lane + TEAM * c) * VALUES / 32u];
                }
                // for c < CHUNKS_V (1), unrolled: one block per c
                {
                    const c = 0u;
                    vw[u][c] = v[row * ITEMS_V + lane + TEAM * c];
                    v_sc[u][c] = v_scale[row * (HEAD_DIM_V / 32u) + (lane + TEAM * c) * VALUES / 32u];
                }
            }
        }
        {
            const u = 3u;
            let j = j0 + TEAMS * u;
            if (j < seq.len_k) {
                let row = key_row(seq, j) * params.heads_kv + kv_head;  // the key's row of k and v, as (rows, Hkv)
                // for c < CHUNKS_K (1), unrolled: one block per c
                {
                    const c = 0u;
                    kw[u][c] = k[row * ITEMS_K + lane + TEAM * c];
                    k_sc[u][c] = k_scale[row * (HEAD_DIM_QK / 32u) + (lane + TEAM * c) * VALUES / 32u];
                }
                // for c < CHUNKS_V (1), unrolled: one block per c
                {
                    const c = 0u;
                    vw[u][c] = v[row * ITEMS_V + lane + TEAM * c];
                    v_sc[u][c] = v_scale[row * (HEAD_DIM_V / 32u) + (lane + TEAM * c) * VALUES / 32u];
                }
            }
        }

        // -- S = Q K^T: this invocation's partial dot products, then the team's sum
        var s = array<array<f32, ROWS>, KEYS>();
        // for u < KEYS (4), unrolled: one block per u
        {
            const u = 0u;
            var part = array<f32, ROWS>();
            // for c < CHUNKS_K (1), unrolled: one block per c
            {
                const c = 0u;
                var dot = array<f32, ROWS>();  // the item's share, before its scale
                // for g < GROUPS (4), unrolled: one block per g
                {
                    const g = 0u;
                    let x = item_group(kw[u][c], g);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 1u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 2u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 3u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                }
                {
                    const g = 1u;
                    let x = item_group(kw[u][c], g);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 1u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 2u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 3u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                }
                {
                    const g = 2u;
                    let x = item_group(kw[u][c], g);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 1u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 2u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 3u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                }
                {
                    const g = 3u;
                    let x = item_group(kw[u][c], g);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 1u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 2u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 3u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                }
                // for i < ROWS (4), unrolled: one block per i
                {
                    const i = 0u;
                    part[i] = fma(dot[i], k_sc[u][c], part[i]);
                }
                {
                    const i = 1u;
                    part[i] = fma(dot[i], k_sc[u][c], part[i]);
                }
                {
                    const i = 2u;
                    part[i] = fma(dot[i], k_sc[u][c], part[i]);
                }
                {
                    const i = 3u;
                    part[i] = fma(dot[i], k_sc[u][c], part[i]);
                }
            }
            // for i < ROWS (4), unrolled: one block per i
            {
                const i = 0u;
                s[u][i] = team_sum(part[i]);
            }
            {
                const i = 1u;
                s[u][i] = team_sum(part[i]);
            }
            {
                const i = 2u;
                s[u][i] = team_sum(part[i]);
            }
            {
                const i = 3u;
                s[u][i] = team_sum(part[i]);
            }
        }
        {
            const u = 1u;
            var part = array<f32, ROWS>();
            // for c < CHUNKS_K (1), unrolled: one block per c
            {
                const c = 0u;
                var dot = array<f32, ROWS>();  // the item's share, before its scale
                // for g < GROUPS (4), unrolled: one block per g
                {
                    const g = 0u;
                    let x = item_group(kw[u][c], g);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 1u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 2u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 3u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                }
                {
                    const g = 1u;
                    let x = item_group(kw[u][c], g);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 1u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 2u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 3u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                }
                {
                    const g = 2u;
                    let x = item_group(kw[u][c], g);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 1u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 2u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 3u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                }
                {
                    const g = 3u;
                    let x = item_group(kw[u][c], g);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 1u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 2u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 3u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                }
                // for i < ROWS (4), unrolled: one block per i
                {
                    const i = 0u;
                    part[i] = fma(dot[i], k_sc[u][c], part[i]);
                }
                {
                    const i = 1u;
                    part[i] = fma(dot[i], k_sc[u][c], part[i]);
                }
                {
                    const i = 2u;
                    part[i] = fma(dot[i], k_sc[u][c], part[i]);
                }
                {
                    const i = 3u;
                    part[i] = fma(dot[i], k_sc[u][c], part[i]);
                }
            }
            // for i < ROWS (4), unrolled: one block per i
            {
                const i = 0u;
                s[u][i] = team_sum(part[i]);
            }
            {
                const i = 1u;
                s[u][i] = team_sum(part[i]);
            }
            {
                const i = 2u;
                s[u][i] = team_sum(part[i]);
            }
            {
                const i = 3u;
                s[u][i] = team_sum(part[i]);
            }
        }
        {
            const u = 2u;
            var part = array<f32, ROWS>();
            // for c < CHUNKS_K (1), unrolled: one block per c
            {
                const c = 0u;
                var dot = array<f32, ROWS>();  // the item's share, before its scale
                // for g < GROUPS (4), unrolled: one block per g
                {
                    const g = 0u;
                    let x = item_group(kw[u][c], g);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 1u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 2u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 3u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                }
                {
                    const g = 1u;
                    let x = item_group(kw[u][c], g);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 1u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 2u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 3u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                }
                {
                    const g = 2u;
                    let x = item_group(kw[u][c], g);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 1u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 2u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 3u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                }
                {
                    const g = 3u;
                    let x = item_group(kw[u][c], g);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 1u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 2u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 3u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                }
                // for i < ROWS (4), unrolled: one block per i
                {
                    const i = 0u;
                    part[i] = fma(dot[i], k_sc[u][c], part[i]);
                }
                {
                    const i = 1u;
                    part[i] = fma(dot[i], k_sc[u][c], part[i]);
                }
                {
                    const i = 2u;
                    part[i] = fma(dot[i], k_sc[u][c], part[i]);
                }
                {
                    const i = 3u;
                    part[i] = fma(dot[i], k_sc[u][c], part[i]);
                }
            }
            // for i < ROWS (4), unrolled: one block per i
            {
                const i = 0u;
                s[u][i] = team_sum(part[i]);
            }
            {
                const i = 1u;
                s[u][i] = team_sum(part[i]);
            }
            {
                const i = 2u;
                s[u][i] = team_sum(part[i]);
            }
            {
                const i = 3u;
                s[u][i] = team_sum(part[i]);
            }
        }
        {
            const u = 3u;
            var part = array<f32, ROWS>();
            // for c < CHUNKS_K (1), unrolled: one block per c
            {
                const c = 0u;
                var dot = array<f32, ROWS>();  // the item's share, before its scale
                // for g < GROUPS (4), unrolled: one block per g
                {
                    const g = 0u;
                    let x = item_group(kw[u][c], g);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 1u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 2u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 3u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                }
                {
                    const g = 1u;
                    let x = item_group(kw[u][c], g);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 1u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 2u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 3u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                }
                {
                    const g = 2u;
                    let x = item_group(kw[u][c], g);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 1u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 2u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 3u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                }
                {
                    const g = 3u;
                    let x = item_group(kw[u][c], g);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 1u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 2u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 3u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                }
                // for i < ROWS (4), unrolled: one block per i
                {
                    const i = 0u;
                    part[i] = fma(dot[i], k_sc[u][c], part[i]);
                }
                {
                    const i = 1u;
                    part[i] = fma(dot[i], k_sc[u][c], part[i]);
                }
                {
                    const i = 2u;
                    part[i] = fma(dot[i], k_sc[u][c], part[i]);
                }
                {
                    const i = 3u;
                    part[i] = fma(dot[i], k_sc[u][c], part[i]);
                }
            }
            // for i < ROWS (4), unrolled: one block per i
            {
                const i = 0u;
                s[u][i] = team_sum(part[i]);
            }
            {
                const i = 1u;
                s[u][i] = team_sum(part[i]);
            }
            {
                const i = 2u;
                s[u][i] = team_sum(part[i]);
            }
            {
                const i = 3u;
                s[u][i] = team_sum(part[i]);
            }
        }

        // -- score transform and mask: a key the row does not see is MASKED; a NaN or +inf score of a
        // -- key it sees makes the row's result NaN (row_bad)
        // for u < KEYS (4), unrolled: one block per u
        {
            const u = 0u;
            let j = i32(j0 + TEAMS * u);
            // for i < ROWS (4), unrolled: one block per i
            {
                const i = 0u;
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
            {
                const i = 1u;
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
            {
                const i = 2u;
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
            {
                const i = 3u;
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
        {
            const u = 1u;
            let j = i32(j0 + TEAMS * u);
            // for i < ROWS (4), unrolled: one block per i
            {
                const i = 0u;
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
            {
                const i = 1u;
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
            {
                const i = 2u;
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
            {
                const i = 3u;
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
        {
            const u = 2u;
            let j = i32(j0 + TEAMS * u);
            // for i < ROWS (4), unrolled: one block per i
            {
                const i = 0u;
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
            {
                const i = 1u;
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
            {
                const i = 2u;
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
            {
                const i = 3u;
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
        {
            const u = 3u;
            let j = i32(j0 + TEAMS * u);
            // for i < ROWS (4), unrolled: one block per i
            {
                const i = 0u;
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
            {
                const i = 1u;
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
            {
                const i = 2u;
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
            {
                const i = 3u;
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
        // for i < ROWS (4), unrolled: one block per i
        {
            const i = 0u;
            var m = m_i[i];
            // for u < KEYS (4), unrolled: one block per u
            {
                const u = 0u;
                m = max(m, s[u][i]);
            }
            {
                const u = 1u;
                m = max(m, s[u][i]);
            }
            {
                const u = 2u;
                m = max(m, s[u][i]);
            }
            {
                const u = 3u;
                m = max(m, s[u][i]);
            }
            if (m > m_i[i]) {  // (the team's invocations hold the same scores: no divergence within a team)
                let alpha = select(exp2(m_i[i] - m), 0.0, m_i[i] <= MASKED);
                l_i[i] *= alpha;
                // for w < ACC_GROUPS (4), unrolled: one block per w
                {
                    const w = 0u;
                    acc[i][w] *= alpha;
                }
                {
                    const w = 1u;
                    acc[i][w] *= alpha;
                }
                {
                    const w = 2u;
                    acc[i][w] *= alpha;
                }
                {
                    const w = 3u;
                    acc[i][w] *= alpha;
                }
                m_i[i] = m;
            }
            // a row that has seen no key keeps m = MASKED; subtracting 0 instead keeps exp2 finite,
            // and the select gives p = 0
            let m_use = select(m_i[i], 0.0, m_i[i] <= MASKED);
            // for u < KEYS (4), unrolled: one block per u
            {
                const u = 0u;
                let p = select(exp2(s[u][i] - m_use), 0.0, s[u][i] <= MASKED);
                s[u][i] = p;
                l_i[i] += p;
            }
            {
                const u = 1u;
                let p = select(exp2(s[u][i] - m_use), 0.0, s[u][i] <= MASKED);
                s[u][i] = p;
                l_i[i] += p;
            }
            {
                const u = 2u;
                let p = select(exp2(s[u][i] - m_use), 0.0, s[u][i] <= MASKED);
                s[u][i] = p;
                l_i[i] += p;
            }
            {
                const u = 3u;
                let p = select(exp2(s[u][i] - m_use), 0.0, s[u][i] <= MASKED);
                s[u][i] = p;
                l_i[i] += p;
            }
        }
        {
            const i = 1u;
            var m = m_i[i];
            // for u < KEYS (4), unrolled: one block per u
            {
                const u = 0u;
                m = max(m, s[u][i]);
            }
            {
                const u = 1u;
                m = max(m, s[u][i]);
            }
            {
                const u = 2u;
                m = max(m, s[u][i]);
            }
            {
                const u = 3u;
                m = max(m, s[u][i]);
            }
            if (m > m_i[i]) {  // (the team's invocations hold the same scores: no divergence within a team)
                let alpha = select(exp2(m_i[i] - m), 0.0, m_i[i] <= MASKED);
                l_i[i] *= alpha;
                // for w < ACC_GROUPS (4), unrolled: one block per w
                {
                    const w = 0u;
                    acc[i][w] *= alpha;
                }
                {
                    const w = 1u;
                    acc[i][w] *= alpha;
                }
                {
                    const w = 2u;
                    acc[i][w] *= alpha;
                }
                {
                    const w = 3u;
                    acc[i][w] *= alpha;
                }
                m_i[i] = m;
            }
            // a row that has seen no key keeps m = MASKED; subtracting 0 instead keeps exp2 finite,
            // and the select gives p = 0
            let m_use = select(m_i[i], 0.0, m_i[i] <= MASKED);
            // for u < KEYS (4), unrolled: one block per u
            {
                const u = 0u;
                let p = select(exp2(s[u][i] - m_use), 0.0, s[u][i] <= MASKED);
                s[u][i] = p;
                l_i[i] += p;
            }
            {
                const u = 1u;
                let p = select(exp2(s[u][i] - m_use), 0.0, s[u][i] <= MASKED);
                s[u][i] = p;
                l_i[i] += p;
            }
            {
                const u = 2u;
                let p = select(exp2(s[u][i] - m_use), 0.0, s[u][i] <= MASKED);
                s[u][i] = p;
                l_i[i] += p;
            }
            {
                const u = 3u;
                let p = select(exp2(s[u][i] - m_use), 0.0, s[u][i] <= MASKED);
                s[u][i] = p;
                l_i[i] += p;
            }
        }
        {
            const i = 2u;
            var m = m_i[i];
            // for u < KEYS (4), unrolled: one block per u
            {
                const u = 0u;
                m = max(m, s[u][i]);
            }
            {
                const u = 1u;
                m = max(m, s[u][i]);
            }
            {
                const u = 2u;
                m = max(m, s[u][i]);
            }
            {
                const u = 3u;
                m = max(m, s[u][i]);
            }
            if (m > m_i[i]) {  // (the team's invocations hold the same scores: no divergence within a team)
                let alpha = select(exp2(m_i[i] - m), 0.0, m_i[i] <= MASKED);
                l_i[i] *= alpha;
                // for w < ACC_GROUPS (4), unrolled: one block per w
                {
                    const w = 0u;
                    acc[i][w] *= alpha;
                }
                {
                    const w = 1u;
                    acc[i][w] *= alpha;
                }
                {
                    const w = 2u;
                    acc[i][w] *= alpha;
                }
                {
                    const w = 3u;
                    acc[i][w] *= alpha;
                }
                m_i[i] = m;
            }
            // a row that has seen no key keeps m = MASKED; subtracting 0 instead keeps exp2 finite,
            // and the select gives p = 0
            let m_use = select(m_i[i], 0.0, m_i[i] <= MASKED);
            // for u < KEYS (4), unrolled: one block per u
            {
                const u = 0u;
                let p = select(exp2(s[u][i] - m_use), 0.0, s[u][i] <= MASKED);
                s[u][i] = p;
                l_i[i] += p;
            }
            {
                const u = 1u;
                let p = select(exp2(s[u][i] - m_use), 0.0, s[u][i] <= MASKED);
                s[u][i] = p;
                l_i[i] += p;
            }
            {
                const u = 2u;
                let p = select(exp2(s[u][i] - m_use), 0.0, s[u][i] <= MASKED);
                s[u][i] = p;
                l_i[i] += p;
            }
            {
                const u = 3u;
                let p = select(exp2(s[u][i] - m_use), 0.0, s[u][i] <= MASKED);
                s[u][i] = p;
                l_i[i] += p;
            }
        }
        {
            const i = 3u;
            var m = m_i[i];
            // for u < KEYS (4), unrolled: one block per u
            {
                const u = 0u;
                m = max(m, s[u][i]);
            }
            {
                const u = 1u;
                m = max(m, s[u][i]);
            }
            {
                const u = 2u;
                m = max(m, s[u][i]);
            }
            {
                const u = 3u;
                m = max(m, s[u][i]);
            }
            if (m > m_i[i]) {  // (the team's invocations hold the same scores: no divergence within a team)
                let alpha = select(exp2(m_i[i] - m), 0.0, m_i[i] <= MASKED);
                l_i[i] *= alpha;
                // for w < ACC_GROUPS (4), unrolled: one block per w
                {
                    const w = 0u;
                    acc[i][w] *= alpha;
                }
                {
                    const w = 1u;
                    acc[i][w] *= alpha;
                }
                {
                    const w = 2u;
                    acc[i][w] *= alpha;
                }
                {
                    const w = 3u;
                    acc[i][w] *= alpha;
                }
                m_i[i] = m;
            }
            // a row that has seen no key keeps m = MASKED; subtracting 0 instead keeps exp2 finite,
            // and the select gives p = 0
            let m_use = select(m_i[i], 0.0, m_i[i] <= MASKED);
            // for u < KEYS (4), unrolled: one block per u
            {
                const u = 0u;
                let p = select(exp2(s[u][i] - m_use), 0.0, s[u][i] <= MASKED);
                s[u][i] = p;
                l_i[i] += p;
            }
            {
                const u = 1u;
                let p = select(exp2(s[u][i] - m_use), 0.0, s[u][i] <= MASKED);
                s[u][i] = p;
                l_i[i] += p;
            }
            {
                const u = 2u;
                let p = select(exp2(s[u][i] - m_use), 0.0, s[u][i] <= MASKED);
                s[u][i] = p;
                l_i[i] += p;
            }
            {
                const u = 3u;
                let p = select(exp2(s[u][i] - m_use), 0.0, s[u][i] <= MASKED);
                s[u][i] = p;
                l_i[i] += p;
            }
        }

        // -- O += P V over this invocation's items of V
        // for u < KEYS (4), unrolled: one block per u
        {
            const u = 0u;
            {  // (i8 values are finite)
                // for c < CHUNKS_V (1), unrolled: one block per c
                {
                    const c = 0u;
                    // for g < GROUPS (4), unrolled: one block per g
                    {
                        const g = 0u;
                        let x = item_group(vw[u][c], g);
                        // for i < ROWS (4), unrolled: one block per i
                        {
                            const i = 0u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 1u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 2u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 3u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                    }
                    {
                        const g = 1u;
                        let x = item_group(vw[u][c], g);
                        // for i < ROWS (4), unrolled: one block per i
                        {
                            const i = 0u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 1u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 2u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 3u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                    }
                    {
                        const g = 2u;
                        let x = item_group(vw[u][c], g);
                        // for i < ROWS (4), unrolled: one block per i
                        {
                            const i = 0u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 1u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 2u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 3u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                    }
                    {
                        const g = 3u;
                        let x = item_group(vw[u][c], g);
                        // for i < ROWS (4), unrolled: one block per i
                        {
                            const i = 0u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 1u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 2u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 3u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                    }
                }
}
        }
        {
            const u = 1u;
            {  // (i8 values are finite)
                // for c < CHUNKS_V (1), unrolled: one block per c
                {
                    const c = 0u;
                    // for g < GROUPS (4), unrolled: one block per g
                    {
                        const g = 0u;
                        let x = item_group(vw[u][c], g);
                        // for i < ROWS (4), unrolled: one block per i
                        {
                            const i = 0u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 1u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 2u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 3u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                    }
                    {
                        const g = 1u;
                        let x = item_group(vw[u][c], g);
                        // for i < ROWS (4), unrolled: one block per i
                        {
                            const i = 0u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 1u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 2u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 3u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                    }
                    {
                        const g = 2u;
                        let x = item_group(vw[u][c], g);
                        // for i < ROWS (4), unrolled: one block per i
                        {
                            const i = 0u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 1u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 2u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 3u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                    }
                    {
                        const g = 3u;
                        let x = item_group(vw[u][c], g);
                        // for i < ROWS (4), unrolled: one block per i
                        {
                            const i = 0u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 1u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 2u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 3u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                    }
                }
}
        }
        {
            const u = 2u;
            {  // (i8 values are finite)
                // for c < CHUNKS_V (1), unrolled: one block per c
                {
                    const c = 0u;
                    // for g < GROUPS (4), unrolled: one block per g
                    {
                        const g = 0u;
                        let x = item_group(vw[u][c], g);
                        // for i < ROWS (4), unrolled: one block per i
                        {
                            const i = 0u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 1u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 2u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 3u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                    }
                    {
                        const g = 1u;
                        let x = item_group(vw[u][c], g);
                        // for i < ROWS (4), unrolled: one block per i
                        {
                            const i = 0u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 1u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 2u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 3u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                    }
                    {
                        const g = 2u;
                        let x = item_group(vw[u][c], g);
                        // for i < ROWS (4), unrolled: one block per i
                        {
                            const i = 0u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 1u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 2u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 3u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                    }
                    {
                        const g = 3u;
                        let x = item_group(vw[u][c], g);
                        // for i < ROWS (4), unrolled: one block per i
                        {
                            const i = 0u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 1u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 2u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 3u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                    }
                }
}
        }
        {
            const u = 3u;
            {  // (i8 values are finite)
                // for c < CHUNKS_V (1), unrolled: one block per c
                {
                    const c = 0u;
                    // for g < GROUPS (4), unrolled: one block per g
                    {
                        const g = 0u;
                        let x = item_group(vw[u][c], g);
                        // for i < ROWS (4), unrolled: one block per i
                        {
                            const i = 0u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 1u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 2u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 3u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                    }
                    {
                        const g = 1u;
                        let x = item_group(vw[u][c], g);
                        // for i < ROWS (4), unrolled: one block per i
                        {
                            const i = 0u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 1u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 2u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 3u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                    }
                    {
                        const g = 2u;
                        let x = item_group(vw[u][c], g);
                        // for i < ROWS (4), unrolled: one block per i
                        {
                            const i = 0u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 1u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 2u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 3u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                    }
                    {
                        const g = 3u;
                        let x = item_group(vw[u][c], g);
                        // for i < ROWS (4), unrolled: one block per i
                        {
                            const i = 0u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 1u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 2u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 3u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
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
        // for i < ROWS (4), unrolled: one block per i
        {
            const i = 0u;
            sM[team * ROWS + i] = m_i[i];
            sBad[team * ROWS + i] = select(0u, 1u, row_bad[i]);
        }
        {
            const i = 1u;
            sM[team * ROWS + i] = m_i[i];
            sBad[team * ROWS + i] = select(0u, 1u, row_bad[i]);
        }
        {
            const i = 2u;
            sM[team * ROWS + i] = m_i[i];
            sBad[team * ROWS + i] = select(0u, 1u, row_bad[i]);
        }
        {
            const i = 3u;
            sM[team * ROWS + i] = m_i[i];
            sBad[team * ROWS + i] = select(0u, 1u, row_bad[i]);
        }
    }
    workgroupBarrier();  // every team's m_i and row_bad in workgroup memory
    var m_row: array<f32, ROWS>;     // the row's max over every team
    var bad_row: array<bool, ROWS>;  // and whether any team saw a NaN or +inf score of it
    // for i < ROWS (4), unrolled: one block per i
    {
        const i = 0u;
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
        // for w < ACC_GROUPS (4), unrolled: one block per w
        {
            const w = 0u;
            acc[i][w] *= f;
        }
        {
            const w = 1u;
            acc[i][w] *= f;
        }
        {
            const w = 2u;
            acc[i][w] *= f;
        }
        {
            const w = 3u;
            acc[i][w] *= f;
        }
    }
    {
        const i = 1u;
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
        // for w < ACC_GROUPS (4), unrolled: one block per w
        {
            const w = 0u;
            acc[i][w] *= f;
        }
        {
            const w = 1u;
            acc[i][w] *= f;
        }
        {
            const w = 2u;
            acc[i][w] *= f;
        }
        {
            const w = 3u;
            acc[i][w] *= f;
        }
    }
    {
        const i = 2u;
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
        // for w < ACC_GROUPS (4), unrolled: one block per w
        {
            const w = 0u;
            acc[i][w] *= f;
        }
        {
            const w = 1u;
            acc[i][w] *= f;
        }
        {
            const w = 2u;
            acc[i][w] *= f;
        }
        {
            const w = 3u;
            acc[i][w] *= f;
        }
    }
    {
        const i = 3u;
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
        // for w < ACC_GROUPS (4), unrolled: one block per w
        {
            const w = 0u;
            acc[i][w] *= f;
        }
        {
            const w = 1u;
            acc[i][w] *= f;
        }
        {
            const w = 2u;
            acc[i][w] *= f;
        }
        {
            const w = 3u;
            acc[i][w] *= f;
        }
    }
    workgroupBarrier();  // every invocation has read sM before it takes the sums
    if (lane == 0u) {
        // for i < ROWS (4), unrolled: one block per i
        {
            const i = 0u;
            sM[team * ROWS + i] = l_i[i];
        }
        {
            const i = 1u;
            sM[team * ROWS + i] = l_i[i];
        }
        {
            const i = 2u;
            sM[team * ROWS + i] = l_i[i];
        }
        {
            const i = 3u;
            sM[team * ROWS + i] = l_i[i];
        }
    }
    workgroupBarrier();
    var l_row: array<f32, ROWS>;  // the row's sum
    var inv_l: array<f32, ROWS>;
    // for i < ROWS (4), unrolled: one block per i
    {
        const i = 0u;
        var l = 0.0;
        for (var t = 0u; t < TEAMS; t++) {
            l += sM[t * ROWS + i];
        }
        l_row[i] = l;
        inv_l[i] = select(0.0, 1.0 / l, l > 0.0);
    }
    {
        const i = 1u;
        var l = 0.0;
        for (var t = 0u; t < TEAMS; t++) {
            l += sM[t * ROWS + i];
        }
        l_row[i] = l;
        inv_l[i] = select(0.0, 1.0 / l, l > 0.0);
    }
    {
        const i = 2u;
        var l = 0.0;
        for (var t = 0u; t < TEAMS; t++) {
            l += sM[t * ROWS + i];
        }
        l_row[i] = l;
        inv_l[i] = select(0.0, 1.0 / l, l > 0.0);
    }
    {
        const i = 3u;
        var l = 0.0;
        for (var t = 0u; t < TEAMS; t++) {
            l += sM[t * ROWS + i];
        }
        l_row[i] = l;
        inv_l[i] = select(0.0, 1.0 / l, l > 0.0);
    }
    // acc over the teams of each block of SUBGROUP invocations (a butterfly of shuffles over the
    // lanes that hold the same columns: TEAM apart)
    // for i < ROWS (4), unrolled: one block per i
    {
        const i = 0u;
        // for w < ACC_GROUPS (4), unrolled: one block per w
        {
            const w = 0u;
            acc[i][w] += subgroupShuffleXor(acc[i][w], 16u);
            acc[i][w] += subgroupShuffleXor(acc[i][w], 8u);
        }
        {
            const w = 1u;
            acc[i][w] += subgroupShuffleXor(acc[i][w], 16u);
            acc[i][w] += subgroupShuffleXor(acc[i][w], 8u);
        }
        {
            const w = 2u;
            acc[i][w] += subgroupShuffleXor(acc[i][w], 16u);
            acc[i][w] += subgroupShuffleXor(acc[i][w], 8u);
        }
        {
            const w = 3u;
            acc[i][w] += subgroupShuffleXor(acc[i][w], 16u);
            acc[i][w] += subgroupShuffleXor(acc[i][w], 8u);
        }
    }
    {
        const i = 1u;
        // for w < ACC_GROUPS (4), unrolled: one block per w
        {
            const w = 0u;
            acc[i][w] += subgroupShuffleXor(acc[i][w], 16u);
            acc[i][w] += subgroupShuffleXor(acc[i][w], 8u);
        }
        {
            const w = 1u;
            acc[i][w] += subgroupShuffleXor(acc[i][w], 16u);
            acc[i][w] += subgroupShuffleXor(acc[i][w], 8u);
        }
        {
            const w = 2u;
            acc[i][w] += subgroupShuffleXor(acc[i][w], 16u);
            acc[i][w] += subgroupShuffleXor(acc[i][w], 8u);
        }
        {
            const w = 3u;
            acc[i][w] += subgroupShuffleXor(acc[i][w], 16u);
            acc[i][w] += subgroupShuffleXor(acc[i][w], 8u);
        }
    }
    {
        const i = 2u;
        // for w < ACC_GROUPS (4), unrolled: one block per w
        {
            const w = 0u;
            acc[i][w] += subgroupShuffleXor(acc[i][w], 16u);
            acc[i][w] += subgroupShuffleXor(acc[i][w], 8u);
        }
        {
            const w = 1u;
            acc[i][w] += subgroupShuffleXor(acc[i][w], 16u);
            acc[i][w] += subgroupShuffleXor(acc[i][w], 8u);
        }
        {
            const w = 2u;
            acc[i][w] += subgroupShuffleXor(acc[i][w], 16u);
            acc[i][w] += subgroupShuffleXor(acc[i][w], 8u);
        }
        {
            const w = 3u;
            acc[i][w] += subgroupShuffleXor(acc[i][w], 16u);
            acc[i][w] += subgroupShuffleXor(acc[i][w], 8u);
        }
    }
    {
        const i = 3u;
        // for w < ACC_GROUPS (4), unrolled: one block per w
        {
            const w = 0u;
            acc[i][w] += subgroupShuffleXor(acc[i][w], 16u);
            acc[i][w] += subgroupShuffleXor(acc[i][w], 8u);
        }
        {
            const w = 1u;
            acc[i][w] += subgroupShuffleXor(acc[i][w], 16u);
            acc[i][w] += subgroupShuffleXor(acc[i][w], 8u);
        }
        {
            const w = 2u;
            acc[i][w] += subgroupShuffleXor(acc[i][w], 16u);
            acc[i][w] += subgroupShuffleXor(acc[i][w], 8u);
        }
        {
            const w = 3u;
            acc[i][w] += subgroupShuffleXor(acc[i][w], 16u);
            acc[i][w] += subgroupShuffleXor(acc[i][w], 8u);
        }
    }
    let block = lid / SUBGROUP;
    let writes = lid % SUBGROUP < TEAM;  // the block's first team writes the block's sums
    // for i < ROWS (4), unrolled: one block per i
    {
        const i = 0u;
        if (writes) {
            // for c < CHUNKS_V (1), unrolled: one block per c
            {
                const c = 0u;
                // for g < GROUPS (4), unrolled: one block per g
                {
                    const g = 0u;
                    sO[block * (HEAD_DIM_V / 4u) + (lane + TEAM * c) * GROUPS + g] = acc[i][c * GROUPS + g];
                }
                {
                    const g = 1u;
                    sO[block * (HEAD_DIM_V / 4u) + (lane + TEAM * c) * GROUPS + g] = acc[i][c * GROUPS + g];
                }
                {
                    const g = 2u;
                    sO[block * (HEAD_DIM_V / 4u) + (lane + TEAM * c) * GROUPS + g] = acc[i][c * GROUPS + g];
                }
                {
                    const g = 3u;
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
                // for e < 4u, unrolled: one block per e
                {
                    const e = 0u;
                    o_part[o_base + 4u * col + e] = select(o[e], nan, bad_row[i]);
                }
                {
                    const e = 1u;
                    o_part[o_base + 4u * col + e] = select(o[e], nan, bad_row[i]);
                }
                {
                    const e = 2u;
                    o_part[o_base + 4u * col + e] = select(o[e], nan, bad_row[i]);
                }
                {
                    const e = 3u;
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
    {
        const i = 1u;
        if (writes) {
            // for c < CHUNKS_V (1), unrolled: one block per c
            {
                const c = 0u;
                // for g < GROUPS (4), unrolled: one block per g
                {
                    const g = 0u;
                    sO[block * (HEAD_DIM_V / 4u) + (lane + TEAM * c) * GROUPS + g] = acc[i][c * GROUPS + g];
                }
                {
                    const g = 1u;
                    sO[block * (HEAD_DIM_V / 4u) + (lane + TEAM * c) * GROUPS + g] = acc[i][c * GROUPS + g];
                }
                {
                    const g = 2u;
                    sO[block * (HEAD_DIM_V / 4u) + (lane + TEAM * c) * GROUPS + g] = acc[i][c * GROUPS + g];
                }
                {
                    const g = 3u;
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
                // for e < 4u, unrolled: one block per e
                {
                    const e = 0u;
                    o_part[o_base + 4u * col + e] = select(o[e], nan, bad_row[i]);
                }
                {
                    const e = 1u;
                    o_part[o_base + 4u * col + e] = select(o[e], nan, bad_row[i]);
                }
                {
                    const e = 2u;
                    o_part[o_base + 4u * col + e] = select(o[e], nan, bad_row[i]);
                }
                {
                    const e = 3u;
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
    {
        const i = 2u;
        if (writes) {
            // for c < CHUNKS_V (1), unrolled: one block per c
            {
                const c = 0u;
                // for g < GROUPS (4), unrolled: one block per g
                {
                    const g = 0u;
                    sO[block * (HEAD_DIM_V / 4u) + (lane + TEAM * c) * GROUPS + g] = acc[i][c * GROUPS + g];
                }
                {
                    const g = 1u;
                    sO[block * (HEAD_DIM_V / 4u) + (lane + TEAM * c) * GROUPS + g] = acc[i][c * GROUPS + g];
                }
                {
                    const g = 2u;
                    sO[block * (HEAD_DIM_V / 4u) + (lane + TEAM * c) * GROUPS + g] = acc[i][c * GROUPS + g];
                }
                {
                    const g = 3u;
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
                // for e < 4u, unrolled: one block per e
                {
                    const e = 0u;
                    o_part[o_base + 4u * col + e] = select(o[e], nan, bad_row[i]);
                }
                {
                    const e = 1u;
                    o_part[o_base + 4u * col + e] = select(o[e], nan, bad_row[i]);
                }
                {
                    const e = 2u;
                    o_part[o_base + 4u * col + e] = select(o[e], nan, bad_row[i]);
                }
                {
                    const e = 3u;
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
    {
        const i = 3u;
        if (writes) {
            // for c < CHUNKS_V (1), unrolled: one block per c
            {
                const c = 0u;
                // for g < GROUPS (4), unrolled: one block per g
                {
                    const g = 0u;
                    sO[block * (HEAD_DIM_V / 4u) + (lane + TEAM * c) * GROUPS + g] = acc[i][c * GROUPS + g];
                }
                {
                    const g = 1u;
                    sO[block * (HEAD_DIM_V / 4u) + (lane + TEAM * c) * GROUPS + g] = acc[i][c * GROUPS + g];
                }
                {
                    const g = 2u;
                    sO[block * (HEAD_DIM_V / 4u) + (lane + TEAM * c) * GROUPS + g] = acc[i][c * GROUPS + g];
                }
                {
                    const g = 3u;
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
                // for e < 4u, unrolled: one block per e
                {
                    const e = 0u;
                    o_part[o_base + 4u * col + e] = select(o[e], nan, bad_row[i]);
                }
                {
                    const e = 1u;
                    o_part[o_base + 4u * col + e] = select(o[e], nan, bad_row[i]);
                }
                {
                    const e = 2u;
                    o_part[o_base + 4u * col + e] = select(o[e], nan, bad_row[i]);
                }
                {
                    const e = 3u;
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

@compute @workgroup_size(128, 1, 1)
fn attngen_decode_i8_paged_append(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
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
    // for i < ROWS (4), unrolled: one block per i
    {
        const i = 0u;
        q_row[i] = (pair0 + i) / params.group;
        q_head[i] = kv_head * params.group + (pair0 + i) % params.group;
    }
    {
        const i = 1u;
        q_row[i] = (pair0 + i) / params.group;
        q_head[i] = kv_head * params.group + (pair0 + i) % params.group;
    }
    {
        const i = 2u;
        q_row[i] = (pair0 + i) / params.group;
        q_head[i] = kv_head * params.group + (pair0 + i) % params.group;
    }
    {
        const i = 3u;
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
    // for i < ROWS (4), unrolled: one block per i
    {
        const i = 0u;
        if (q_row[i] < seq.len_q) {  // rows past the sequence's keep q = 0 (never stored)
            let at = ((seq.q_row0 + q_row[i]) * params.heads_q + q_head[i]) * HEAD_DIM_QK;
            // for c < CHUNKS_K (1), unrolled: one block per c
            {
                const c = 0u;
                // for g < GROUPS (4), unrolled: one block per g
                {
                    const g = 0u;
                    qv[i][c * GROUPS + g] = q4(at + (lane + TEAM * c) * VALUES + 4u * g);
                }
                {
                    const g = 1u;
                    qv[i][c * GROUPS + g] = q4(at + (lane + TEAM * c) * VALUES + 4u * g);
                }
                {
                    const g = 2u;
                    qv[i][c * GROUPS + g] = q4(at + (lane + TEAM * c) * VALUES + 4u * g);
                }
                {
                    const g = 3u;
                    qv[i][c * GROUPS + g] = q4(at + (lane + TEAM * c) * VALUES + 4u * g);
                }
            }
        }
    }
    {
        const i = 1u;
        if (q_row[i] < seq.len_q) {  // rows past the sequence's keep q = 0 (never stored)
            let at = ((seq.q_row0 + q_row[i]) * params.heads_q + q_head[i]) * HEAD_DIM_QK;
            // for c < CHUNKS_K (1), unrolled: one block per c
            {
                const c = 0u;
                // for g < GROUPS (4), unrolled: one block per g
                {
                    const g = 0u;
                    qv[i][c * GROUPS + g] = q4(at + (lane + TEAM * c) * VALUES + 4u * g);
                }
                {
                    const g = 1u;
                    qv[i][c * GROUPS + g] = q4(at + (lane + TEAM * c) * VALUES + 4u * g);
                }
                {
                    const g = 2u;
                    qv[i][c * GROUPS + g] = q4(at + (lane + TEAM * c) * VALUES + 4u * g);
                }
                {
                    const g = 3u;
                    qv[i][c * GROUPS + g] = q4(at + (lane + TEAM * c) * VALUES + 4u * g);
                }
            }
        }
    }
    {
        const i = 2u;
        if (q_row[i] < seq.len_q) {  // rows past the sequence's keep q = 0 (never stored)
            let at = ((seq.q_row0 + q_row[i]) * params.heads_q + q_head[i]) * HEAD_DIM_QK;
            // for c < CHUNKS_K (1), unrolled: one block per c
            {
                const c = 0u;
                // for g < GROUPS (4), unrolled: one block per g
                {
                    const g = 0u;
                    qv[i][c * GROUPS + g] = q4(at + (lane + TEAM * c) * VALUES + 4u * g);
                }
                {
                    const g = 1u;
                    qv[i][c * GROUPS + g] = q4(at + (lane + TEAM * c) * VALUES + 4u * g);
                }
                {
                    const g = 2u;
                    qv[i][c * GROUPS + g] = q4(at + (lane + TEAM * c) * VALUES + 4u * g);
                }
                {
                    const g = 3u;
                    qv[i][c * GROUPS + g] = q4(at + (lane + TEAM * c) * VALUES + 4u * g);
                }
            }
        }
    }
    {
        const i = 3u;
        if (q_row[i] < seq.len_q) {  // rows past the sequence's keep q = 0 (never stored)
            let at = ((seq.q_row0 + q_row[i]) * params.heads_q + q_head[i]) * HEAD_DIM_QK;
            // for c < CHUNKS_K (1), unrolled: one block per c
            {
                const c = 0u;
                // for g < GROUPS (4), unrolled: one block per g
                {
                    const g = 0u;
                    qv[i][c * GROUPS + g] = q4(at + (lane + TEAM * c) * VALUES + 4u * g);
                }
                {
                    const g = 1u;
                    qv[i][c * GROUPS + g] = q4(at + (lane + TEAM * c) * VALUES + 4u * g);
                }
                {
                    const g = 2u;
                    qv[i][c * GROUPS + g] = q4(at + (lane + TEAM * c) * VALUES + 4u * g);
                }
                {
                    const g = 3u;
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
        var k_sc = array<array<f32, CHUNKS_K>, KEYS>();  // each item's scale (its block of 32 values)
        var v_sc = array<array<f32, CHUNKS_V>, KEYS>();
        // for u < KEYS (4), unrolled: one block per u
        {
            const u = 0u;
            let j = j0 + TEAMS * u;
            if (j < seq.len_k) {
                if (j >= seq.cached) {  // an appended key: read from k_new / v_new (the append may not have landed)
                    let row = new_row(seq, j, kv_head);
                    // quantized as the append writes them
                    // for c < CHUNKS_K (1), unrolled: one block per c
                    {
                        const c = 0u;
                        let col = (lane + TEAM * c) * VALUES;
                        k_sc[u][c] = new_scale(row * HEAD_DIM_QK + col - col % 32u);
                        kw[u][c] = new_item(row * HEAD_DIM_QK + col, k_sc[u][c]);
                    }
                    // for c < CHUNKS_V (1), unrolled: one block per c
                    {
                        const c = 0u;
                        let col = (lane + TEAM * c) * VALUES;
                        v_sc[u][c] = new_scale(params.new_v + row * HEAD_DIM_V + col - col % 32u);
                        vw[u][c] = new_item(params.new_v + row * HEAD_DIM_V + col, v_sc[u][c]);
                    }
                } else {
                    let row = key_row(seq, j) * params.heads_kv + kv_head;  // the key's row of k and v, as (rows, Hkv)
                    // for c < CHUNKS_K (1), unrolled: one block per c
                    {
                        const c = 0u;
                        kw[u][c] = k[row * ITEMS_K + lane + TEAM * c];
                        k_sc[u][c] = k_scale_w[row * (HEAD_DIM_QK / 32u) + (lane + TEAM * c) * VALUES / 32u];
                    }
                    // for c < CHUNKS_V (1), unrolled: one block per c
                    {
                        const c = 0u;
                        vw[u][c] = v[row * ITEMS_V + lane + TEAM * c];
                        v_sc[u][c] = v_scale_w[row * (HEAD_DIM_V / 32u) + (lane + TEAM * c) * VALUES / 32u];
                    }
                }
            }
        }
        {
            const u = 1u;
            let j = j0 + TEAMS * u;
            if (j < seq.len_k) {
                if (j >= seq.cached) {  // an appended key: read from k_new / v_new (the append may not have landed)
                    let row = new_row(seq, j, kv_head);
                    // quantized as the append writes them
                    // for c < CHUNKS_K (1), unrolled: one block per c
                    {
                        const c = 0u;
                        let col = (lane + TEAM * c) * VALUES;
                        k_sc[u][c] = new_scale(row * HEAD_DIM_QK + col - col % 32u);
                        kw[u][c] = new_item(row * HEAD_DIM_QK + col, k_sc[u][c]);
                    }
                    // for c < CHUNKS_V (1), unrolled: one block per c
                    {
                        const c = 0u;
                        let col = (lane + TEAM * c) * VALUES;
                        v_sc[u][c] = new_scale(params.new_v + row * HEAD_DIM_V + col - col % 32u);
                        vw[u][c] = new_item(params.new_v + row * HEAD_DIM_V + col, v_sc[u][c]);
                    }
                } else {
                    let row = key_row(seq, j) * params.heads_kv + kv_head;  // the key's row of k and v, as (rows, Hkv)
                    // for c < CHUNKS_K (1), unrolled: one block per c
                    {
                        const c = 0u;
                        kw[u][c] = k[row * ITEMS_K + lane + TEAM * c];
                        k_sc[u][c] = k_scale_w[row * (HEAD_DIM_QK / 32u) + (lane + TEAM * c) * VALUES / 32u];
                    }
                    // for c < CHUNKS_V (1), unrolled: one block per c
                    {
                        const c = 0u;
                        vw[u][c] = v[row * ITEMS_V + lane + TEAM * c];
                        v_sc[u][c] = v_scale_w[row * (HEAD_DIM_V / 32u) + (lane + TEAM * c) * VALUES / 32u];
                    }
                }
            }
        }
        {
            const u = 2u;
            let j = j0 + TEAMS * u;
            if (j < seq.len_k) {
                if (j >= seq.cached) {  // an appended key: read from k_new / v_new (the append may not have landed)
                    let row = new_row(seq, j, kv_head);
                    // quantized as the append writes them
                    // for c < CHUNKS_K (1), unrolled: one block per c
                    {
                        const c = 0u;
                        let col = (lane + TEAM * c) * VALUES;
                        k_sc[u][c] = new_scale(row * HEAD_DIM_QK + col - col % 32u);
                        kw[u][c] = new_item(row * HEAD_DIM_QK + col, k_sc[u][c]);
                    }
                    // for c < CHUNKS_V (1), unrolled: one block per c
                    {
                        const c = 0u;
                        let col = (lane + TEAM * c) * VALUES;
                        v_sc[u][c] = new_scale(params.new_v + row * HEAD_DIM_V + col - col % 32u);
                        vw[u][c] = new_item(params.new_v + row * HEAD_DIM_V + col, v_sc[u][c]);
                    }
                } else {
                    let row = key_row(seq, j) * params.heads_kv + kv_head;  // the key's row of k and v, as (rows, Hkv)
                    // for c < CHUNKS_K (1), unrolled: one block per c
                    {
                        const c = 0u;
                        kw[u][c] = k[row * ITEMS_K + lane + TEAM * c];
                        k_sc[u][c] = k_scale_w[row * (HEAD_DIM_QK / 32u) + (lane + TEAM * c) * VALUES / 32u];
                    }
                    // for c < CHUNKS_V (1), unrolled: one block per c
                    {
                        const c = 0u;
                        vw[u][c] = v[row * ITEMS_V + lane + TEAM * c];
                        v_sc[u][c] = v_scale_w[row * (HEAD_DIM_V / 32u) + (lane + TEAM * c) * VALUES / 32u];
                    }
                }
            }
        }
        {
            const u = 3u;
            let j = j0 + TEAMS * u;
            if (j < seq.len_k) {
                if (j >= seq.cached) {  // an appended key: read from k_new / v_new (the append may not have landed)
                    let row = new_row(seq, j, kv_head);
                    // quantized as the append writes them
                    // for c < CHUNKS_K (1), unrolled: one block per c
                    {
                        const c = 0u;
                        let col = (lane + TEAM * c) * VALUES;
                        k_sc[u][c] = new_scale(row * HEAD_DIM_QK + col - col % 32u);
                        kw[u][c] = new_item(row * HEAD_DIM_QK + col, k_sc[u][c]);
                    }
                    // for c < CHUNKS_V (1), unrolled: one block per c
                    {
                        const c = 0u;
                        let col = (lane + TEAM * c) * VALUES;
                        v_sc[u][c] = new_scale(params.new_v + row * HEAD_DIM_V + col - col % 32u);
                        vw[u][c] = new_item(params.new_v + row * HEAD_DIM_V + col, v_sc[u][c]);
                    }
                } else {
                    let row = key_row(seq, j) * params.heads_kv + kv_head;  // the key's row of k and v, as (rows, Hkv)
                    // for c < CHUNKS_K (1), unrolled: one block per c
                    {
                        const c = 0u;
                        kw[u][c] = k[row * ITEMS_K + lane + TEAM * c];
                        k_sc[u][c] = k_scale_w[row * (HEAD_DIM_QK / 32u) + (lane + TEAM * c) * VALUES / 32u];
                    }
                    // for c < CHUNKS_V (1), unrolled: one block per c
                    {
                        const c = 0u;
                        vw[u][c] = v[row * ITEMS_V + lane + TEAM * c];
                        v_sc[u][c] = v_scale_w[row * (HEAD_DIM_V / 32u) + (lane + TEAM * c) * VALUES / 32u];
                    }
                }
            }
        }

        // -- S = Q K^T: this invocation's partial dot products, then the team's sum
        var s = array<array<f32, ROWS>, KEYS>();
        // for u < KEYS (4), unrolled: one block per u
        {
            const u = 0u;
            var part = array<f32, ROWS>();
            // for c < CHUNKS_K (1), unrolled: one block per c
            {
                const c = 0u;
                var dot = array<f32, ROWS>();  // the item's share, before its scale
                // for g < GROUPS (4), unrolled: one block per g
                {
                    const g = 0u;
                    let x = item_group(kw[u][c], g);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 1u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 2u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 3u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                }
                {
                    const g = 1u;
                    let x = item_group(kw[u][c], g);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 1u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 2u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 3u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                }
                {
                    const g = 2u;
                    let x = item_group(kw[u][c], g);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 1u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 2u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 3u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                }
                {
                    const g = 3u;
                    let x = item_group(kw[u][c], g);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 1u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 2u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 3u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                }
                // for i < ROWS (4), unrolled: one block per i
                {
                    const i = 0u;
                    part[i] = fma(dot[i], k_sc[u][c], part[i]);
                }
                {
                    const i = 1u;
                    part[i] = fma(dot[i], k_sc[u][c], part[i]);
                }
                {
                    const i = 2u;
                    part[i] = fma(dot[i], k_sc[u][c], part[i]);
                }
                {
                    const i = 3u;
                    part[i] = fma(dot[i], k_sc[u][c], part[i]);
                }
            }
            // for i < ROWS (4), unrolled: one block per i
            {
                const i = 0u;
                s[u][i] = team_sum(part[i]);
            }
            {
                const i = 1u;
                s[u][i] = team_sum(part[i]);
            }
            {
                const i = 2u;
                s[u][i] = team_sum(part[i]);
            }
            {
                const i = 3u;
                s[u][i] = team_sum(part[i]);
            }
        }
        {
            const u = 1u;
            var part = array<f32, ROWS>();
            // for c < CHUNKS_K (1), unrolled: one block per c
            {
                const c = 0u;
                var dot = array<f32, ROWS>();  // the item's share, before its scale
                // for g < GROUPS (4), unrolled: one block per g
                {
                    const g = 0u;
                    let x = item_group(kw[u][c], g);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 1u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 2u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 3u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                }
                {
                    const g = 1u;
                    let x = item_group(kw[u][c], g);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 1u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 2u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 3u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                }
                {
                    const g = 2u;
                    let x = item_group(kw[u][c], g);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 1u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 2u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 3u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                }
                {
                    const g = 3u;
                    let x = item_group(kw[u][c], g);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 1u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 2u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 3u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                }
                // for i < ROWS (4), unrolled: one block per i
                {
                    const i = 0u;
                    part[i] = fma(dot[i], k_sc[u][c], part[i]);
                }
                {
                    const i = 1u;
                    part[i] = fma(dot[i], k_sc[u][c], part[i]);
                }
                {
                    const i = 2u;
                    part[i] = fma(dot[i], k_sc[u][c], part[i]);
                }
                {
                    const i = 3u;
                    part[i] = fma(dot[i], k_sc[u][c], part[i]);
                }
            }
            // for i < ROWS (4), unrolled: one block per i
            {
                const i = 0u;
                s[u][i] = team_sum(part[i]);
            }
            {
                const i = 1u;
                s[u][i] = team_sum(part[i]);
            }
            {
                const i = 2u;
                s[u][i] = team_sum(part[i]);
            }
            {
                const i = 3u;
                s[u][i] = team_sum(part[i]);
            }
        }
        {
            const u = 2u;
            var part = array<f32, ROWS>();
            // for c < CHUNKS_K (1), unrolled: one block per c
            {
                const c = 0u;
                var dot = array<f32, ROWS>();  // the item's share, before its scale
                // for g < GROUPS (4), unrolled: one block per g
                {
                    const g = 0u;
                    let x = item_group(kw[u][c], g);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 1u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 2u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 3u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                }
                {
                    const g = 1u;
                    let x = item_group(kw[u][c], g);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 1u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 2u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 3u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                }
                {
                    const g = 2u;
                    let x = item_group(kw[u][c], g);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 1u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 2u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 3u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                }
                {
                    const g = 3u;
                    let x = item_group(kw[u][c], g);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 1u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 2u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 3u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                }
                // for i < ROWS (4), unrolled: one block per i
                {
                    const i = 0u;
                    part[i] = fma(dot[i], k_sc[u][c], part[i]);
                }
                {
                    const i = 1u;
                    part[i] = fma(dot[i], k_sc[u][c], part[i]);
                }
                {
                    const i = 2u;
                    part[i] = fma(dot[i], k_sc[u][c], part[i]);
                }
                {
                    const i = 3u;
                    part[i] = fma(dot[i], k_sc[u][c], part[i]);
                }
            }
            // for i < ROWS (4), unrolled: one block per i
            {
                const i = 0u;
                s[u][i] = team_sum(part[i]);
            }
            {
                const i = 1u;
                s[u][i] = team_sum(part[i]);
            }
            {
                const i = 2u;
                s[u][i] = team_sum(part[i]);
            }
            {
                const i = 3u;
                s[u][i] = team_sum(part[i]);
            }
        }
        {
            const u = 3u;
            var part = array<f32, ROWS>();
            // for c < CHUNKS_K (1), unrolled: one block per c
            {
                const c = 0u;
                var dot = array<f32, ROWS>();  // the item's share, before its scale
                // for g < GROUPS (4), unrolled: one block per g
                {
                    const g = 0u;
                    let x = item_group(kw[u][c], g);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 1u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 2u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 3u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                }
                {
                    const g = 1u;
                    let x = item_group(kw[u][c], g);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 1u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 2u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 3u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                }
                {
                    const g = 2u;
                    let x = item_group(kw[u][c], g);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 1u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 2u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 3u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                }
                {
                    const g = 3u;
                    let x = item_group(kw[u][c], g);
                    // for i < ROWS (4), unrolled: one block per i
                    {
                        const i = 0u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 1u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 2u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                    {
                        const i = 3u;
                        let qg = qv[i][c * GROUPS + g];
                        dot[i] = fma(qg.w, x.w, fma(qg.z, x.z, fma(qg.y, x.y, fma(qg.x, x.x, dot[i]))));
                    }
                }
                // for i < ROWS (4), unrolled: one block per i
                {
                    const i = 0u;
                    part[i] = fma(dot[i], k_sc[u][c], part[i]);
                }
                {
                    const i = 1u;
                    part[i] = fma(dot[i], k_sc[u][c], part[i]);
                }
                {
                    const i = 2u;
                    part[i] = fma(dot[i], k_sc[u][c], part[i]);
                }
                {
                    const i = 3u;
                    part[i] = fma(dot[i], k_sc[u][c], part[i]);
                }
            }
            // for i < ROWS (4), unrolled: one block per i
            {
                const i = 0u;
                s[u][i] = team_sum(part[i]);
            }
            {
                const i = 1u;
                s[u][i] = team_sum(part[i]);
            }
            {
                const i = 2u;
                s[u][i] = team_sum(part[i]);
            }
            {
                const i = 3u;
                s[u][i] = team_sum(part[i]);
            }
        }

        // -- score transform and mask: a key the row does not see is MASKED; a NaN or +inf score of a
        // -- key it sees makes the row's result NaN (row_bad)
        // for u < KEYS (4), unrolled: one block per u
        {
            const u = 0u;
            let j = i32(j0 + TEAMS * u);
            // for i < ROWS (4), unrolled: one block per i
            {
                const i = 0u;
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
            {
                const i = 1u;
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
            {
                const i = 2u;
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
            {
                const i = 3u;
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
        {
            const u = 1u;
            let j = i32(j0 + TEAMS * u);
            // for i < ROWS (4), unrolled: one block per i
            {
                const i = 0u;
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
            {
                const i = 1u;
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
            {
                const i = 2u;
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
            {
                const i = 3u;
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
        {
            const u = 2u;
            let j = i32(j0 + TEAMS * u);
            // for i < ROWS (4), unrolled: one block per i
            {
                const i = 0u;
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
            {
                const i = 1u;
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
            {
                const i = 2u;
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
            {
                const i = 3u;
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
        {
            const u = 3u;
            let j = i32(j0 + TEAMS * u);
            // for i < ROWS (4), unrolled: one block per i
            {
                const i = 0u;
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
            {
                const i = 1u;
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
            {
                const i = 2u;
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
            {
                const i = 3u;
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
        // for i < ROWS (4), unrolled: one block per i
        {
            const i = 0u;
            var m = m_i[i];
            // for u < KEYS (4), unrolled: one block per u
            {
                const u = 0u;
                m = max(m, s[u][i]);
            }
            {
                const u = 1u;
                m = max(m, s[u][i]);
            }
            {
                const u = 2u;
                m = max(m, s[u][i]);
            }
            {
                const u = 3u;
                m = max(m, s[u][i]);
            }
            if (m > m_i[i]) {  // (the team's invocations hold the same scores: no divergence within a team)
                let alpha = select(exp2(m_i[i] - m), 0.0, m_i[i] <= MASKED);
                l_i[i] *= alpha;
                // for w < ACC_GROUPS (4), unrolled: one block per w
                {
                    const w = 0u;
                    acc[i][w] *= alpha;
                }
                {
                    const w = 1u;
                    acc[i][w] *= alpha;
                }
                {
                    const w = 2u;
                    acc[i][w] *= alpha;
                }
                {
                    const w = 3u;
                    acc[i][w] *= alpha;
                }
                m_i[i] = m;
            }
            // a row that has seen no key keeps m = MASKED; subtracting 0 instead keeps exp2 finite,
            // and the select gives p = 0
            let m_use = select(m_i[i], 0.0, m_i[i] <= MASKED);
            // for u < KEYS (4), unrolled: one block per u
            {
                const u = 0u;
                let p = select(exp2(s[u][i] - m_use), 0.0, s[u][i] <= MASKED);
                s[u][i] = p;
                l_i[i] += p;
            }
            {
                const u = 1u;
                let p = select(exp2(s[u][i] - m_use), 0.0, s[u][i] <= MASKED);
                s[u][i] = p;
                l_i[i] += p;
            }
            {
                const u = 2u;
                let p = select(exp2(s[u][i] - m_use), 0.0, s[u][i] <= MASKED);
                s[u][i] = p;
                l_i[i] += p;
            }
            {
                const u = 3u;
                let p = select(exp2(s[u][i] - m_use), 0.0, s[u][i] <= MASKED);
                s[u][i] = p;
                l_i[i] += p;
            }
        }
        {
            const i = 1u;
            var m = m_i[i];
            // for u < KEYS (4), unrolled: one block per u
            {
                const u = 0u;
                m = max(m, s[u][i]);
            }
            {
                const u = 1u;
                m = max(m, s[u][i]);
            }
            {
                const u = 2u;
                m = max(m, s[u][i]);
            }
            {
                const u = 3u;
                m = max(m, s[u][i]);
            }
            if (m > m_i[i]) {  // (the team's invocations hold the same scores: no divergence within a team)
                let alpha = select(exp2(m_i[i] - m), 0.0, m_i[i] <= MASKED);
                l_i[i] *= alpha;
                // for w < ACC_GROUPS (4), unrolled: one block per w
                {
                    const w = 0u;
                    acc[i][w] *= alpha;
                }
                {
                    const w = 1u;
                    acc[i][w] *= alpha;
                }
                {
                    const w = 2u;
                    acc[i][w] *= alpha;
                }
                {
                    const w = 3u;
                    acc[i][w] *= alpha;
                }
                m_i[i] = m;
            }
            // a row that has seen no key keeps m = MASKED; subtracting 0 instead keeps exp2 finite,
            // and the select gives p = 0
            let m_use = select(m_i[i], 0.0, m_i[i] <= MASKED);
            // for u < KEYS (4), unrolled: one block per u
            {
                const u = 0u;
                let p = select(exp2(s[u][i] - m_use), 0.0, s[u][i] <= MASKED);
                s[u][i] = p;
                l_i[i] += p;
            }
            {
                const u = 1u;
                let p = select(exp2(s[u][i] - m_use), 0.0, s[u][i] <= MASKED);
                s[u][i] = p;
                l_i[i] += p;
            }
            {
                const u = 2u;
                let p = select(exp2(s[u][i] - m_use), 0.0, s[u][i] <= MASKED);
                s[u][i] = p;
                l_i[i] += p;
            }
            {
                const u = 3u;
                let p = select(exp2(s[u][i] - m_use), 0.0, s[u][i] <= MASKED);
                s[u][i] = p;
                l_i[i] += p;
            }
        }
        {
            const i = 2u;
            var m = m_i[i];
            // for u < KEYS (4), unrolled: one block per u
            {
                const u = 0u;
                m = max(m, s[u][i]);
            }
            {
                const u = 1u;
                m = max(m, s[u][i]);
            }
            {
                const u = 2u;
                m = max(m, s[u][i]);
            }
            {
                const u = 3u;
                m = max(m, s[u][i]);
            }
            if (m > m_i[i]) {  // (the team's invocations hold the same scores: no divergence within a team)
                let alpha = select(exp2(m_i[i] - m), 0.0, m_i[i] <= MASKED);
                l_i[i] *= alpha;
                // for w < ACC_GROUPS (4), unrolled: one block per w
                {
                    const w = 0u;
                    acc[i][w] *= alpha;
                }
                {
                    const w = 1u;
                    acc[i][w] *= alpha;
                }
                {
                    const w = 2u;
                    acc[i][w] *= alpha;
                }
                {
                    const w = 3u;
                    acc[i][w] *= alpha;
                }
                m_i[i] = m;
            }
            // a row that has seen no key keeps m = MASKED; subtracting 0 instead keeps exp2 finite,
            // and the select gives p = 0
            let m_use = select(m_i[i], 0.0, m_i[i] <= MASKED);
            // for u < KEYS (4), unrolled: one block per u
            {
                const u = 0u;
                let p = select(exp2(s[u][i] - m_use), 0.0, s[u][i] <= MASKED);
                s[u][i] = p;
                l_i[i] += p;
            }
            {
                const u = 1u;
                let p = select(exp2(s[u][i] - m_use), 0.0, s[u][i] <= MASKED);
                s[u][i] = p;
                l_i[i] += p;
            }
            {
                const u = 2u;
                let p = select(exp2(s[u][i] - m_use), 0.0, s[u][i] <= MASKED);
                s[u][i] = p;
                l_i[i] += p;
            }
            {
                const u = 3u;
                let p = select(exp2(s[u][i] - m_use), 0.0, s[u][i] <= MASKED);
                s[u][i] = p;
                l_i[i] += p;
            }
        }
        {
            const i = 3u;
            var m = m_i[i];
            // for u < KEYS (4), unrolled: one block per u
            {
                const u = 0u;
                m = max(m, s[u][i]);
            }
            {
                const u = 1u;
                m = max(m, s[u][i]);
            }
            {
                const u = 2u;
                m = max(m, s[u][i]);
            }
            {
                const u = 3u;
                m = max(m, s[u][i]);
            }
            if (m > m_i[i]) {  // (the team's invocations hold the same scores: no divergence within a team)
                let alpha = select(exp2(m_i[i] - m), 0.0, m_i[i] <= MASKED);
                l_i[i] *= alpha;
                // for w < ACC_GROUPS (4), unrolled: one block per w
                {
                    const w = 0u;
                    acc[i][w] *= alpha;
                }
                {
                    const w = 1u;
                    acc[i][w] *= alpha;
                }
                {
                    const w = 2u;
                    acc[i][w] *= alpha;
                }
                {
                    const w = 3u;
                    acc[i][w] *= alpha;
                }
                m_i[i] = m;
            }
            // a row that has seen no key keeps m = MASKED; subtracting 0 instead keeps exp2 finite,
            // and the select gives p = 0
            let m_use = select(m_i[i], 0.0, m_i[i] <= MASKED);
            // for u < KEYS (4), unrolled: one block per u
            {
                const u = 0u;
                let p = select(exp2(s[u][i] - m_use), 0.0, s[u][i] <= MASKED);
                s[u][i] = p;
                l_i[i] += p;
            }
            {
                const u = 1u;
                let p = select(exp2(s[u][i] - m_use), 0.0, s[u][i] <= MASKED);
                s[u][i] = p;
                l_i[i] += p;
            }
            {
                const u = 2u;
                let p = select(exp2(s[u][i] - m_use), 0.0, s[u][i] <= MASKED);
                s[u][i] = p;
                l_i[i] += p;
            }
            {
                const u = 3u;
                let p = select(exp2(s[u][i] - m_use), 0.0, s[u][i] <= MASKED);
                s[u][i] = p;
                l_i[i] += p;
            }
        }

        // -- O += P V over this invocation's items of V
        // for u < KEYS (4), unrolled: one block per u
        {
            const u = 0u;
            {  // (i8 values are finite)
                // for c < CHUNKS_V (1), unrolled: one block per c
                {
                    const c = 0u;
                    // for g < GROUPS (4), unrolled: one block per g
                    {
                        const g = 0u;
                        let x = item_group(vw[u][c], g);
                        // for i < ROWS (4), unrolled: one block per i
                        {
                            const i = 0u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 1u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 2u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 3u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                    }
                    {
                        const g = 1u;
                        let x = item_group(vw[u][c], g);
                        // for i < ROWS (4), unrolled: one block per i
                        {
                            const i = 0u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 1u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 2u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 3u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                    }
                    {
                        const g = 2u;
                        let x = item_group(vw[u][c], g);
                        // for i < ROWS (4), unrolled: one block per i
                        {
                            const i = 0u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 1u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 2u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 3u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                    }
                    {
                        const g = 3u;
                        let x = item_group(vw[u][c], g);
                        // for i < ROWS (4), unrolled: one block per i
                        {
                            const i = 0u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 1u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 2u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 3u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                    }
                }
}
        }
        {
            const u = 1u;
            {  // (i8 values are finite)
                // for c < CHUNKS_V (1), unrolled: one block per c
                {
                    const c = 0u;
                    // for g < GROUPS (4), unrolled: one block per g
                    {
                        const g = 0u;
                        let x = item_group(vw[u][c], g);
                        // for i < ROWS (4), unrolled: one block per i
                        {
                            const i = 0u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 1u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 2u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 3u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                    }
                    {
                        const g = 1u;
                        let x = item_group(vw[u][c], g);
                        // for i < ROWS (4), unrolled: one block per i
                        {
                            const i = 0u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 1u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 2u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 3u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                    }
                    {
                        const g = 2u;
                        let x = item_group(vw[u][c], g);
                        // for i < ROWS (4), unrolled: one block per i
                        {
                            const i = 0u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 1u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 2u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 3u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                    }
                    {
                        const g = 3u;
                        let x = item_group(vw[u][c], g);
                        // for i < ROWS (4), unrolled: one block per i
                        {
                            const i = 0u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 1u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 2u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 3u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                    }
                }
}
        }
        {
            const u = 2u;
            {  // (i8 values are finite)
                // for c < CHUNKS_V (1), unrolled: one block per c
                {
                    const c = 0u;
                    // for g < GROUPS (4), unrolled: one block per g
                    {
                        const g = 0u;
                        let x = item_group(vw[u][c], g);
                        // for i < ROWS (4), unrolled: one block per i
                        {
                            const i = 0u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 1u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 2u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 3u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                    }
                    {
                        const g = 1u;
                        let x = item_group(vw[u][c], g);
                        // for i < ROWS (4), unrolled: one block per i
                        {
                            const i = 0u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 1u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 2u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 3u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                    }
                    {
                        const g = 2u;
                        let x = item_group(vw[u][c], g);
                        // for i < ROWS (4), unrolled: one block per i
                        {
                            const i = 0u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 1u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 2u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 3u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                    }
                    {
                        const g = 3u;
                        let x = item_group(vw[u][c], g);
                        // for i < ROWS (4), unrolled: one block per i
                        {
                            const i = 0u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 1u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 2u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 3u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                    }
                }
}
        }
        {
            const u = 3u;
            {  // (i8 values are finite)
                // for c < CHUNKS_V (1), unrolled: one block per c
                {
                    const c = 0u;
                    // for g < GROUPS (4), unrolled: one block per g
                    {
                        const g = 0u;
                        let x = item_group(vw[u][c], g);
                        // for i < ROWS (4), unrolled: one block per i
                        {
                            const i = 0u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 1u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 2u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 3u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                    }
                    {
                        const g = 1u;
                        let x = item_group(vw[u][c], g);
                        // for i < ROWS (4), unrolled: one block per i
                        {
                            const i = 0u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 1u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 2u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 3u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                    }
                    {
                        const g = 2u;
                        let x = item_group(vw[u][c], g);
                        // for i < ROWS (4), unrolled: one block per i
                        {
                            const i = 0u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 1u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 2u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 3u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                    }
                    {
                        const g = 3u;
                        let x = item_group(vw[u][c], g);
                        // for i < ROWS (4), unrolled: one block per i
                        {
                            const i = 0u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 1u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 2u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
                        }
                        {
                            const i = 3u;
                            acc[i][c * GROUPS + g] = fma(vec4<f32>(s[u][i] * v_sc[u][c]), x, acc[i][c * GROUPS + g]);
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
        // for i < ROWS (4), unrolled: one block per i
        {
            const i = 0u;
            sM[team * ROWS + i] = m_i[i];
            sBad[team * ROWS + i] = select(0u, 1u, row_bad[i]);
        }
        {
            const i = 1u;
            sM[team * ROWS + i] = m_i[i];
            sBad[team * ROWS + i] = select(0u, 1u, row_bad[i]);
        }
        {
            const i = 2u;
            sM[team * ROWS + i] = m_i[i];
            sBad[team * ROWS + i] = select(0u, 1u, row_bad[i]);
        }
        {
            const i = 3u;
            sM[team * ROWS + i] = m_i[i];
            sBad[team * ROWS + i] = select(0u, 1u, row_bad[i]);
        }
    }
    workgroupBarrier();  // every team's m_i and row_bad in workgroup memory
    var m_row: array<f32, ROWS>;     // the row's max over every team
    var bad_row: array<bool, ROWS>;  // and whether any team saw a NaN or +inf score of it
    // for i < ROWS (4), unrolled: one block per i
    {
        const i = 0u;
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
        // for w < ACC_GROUPS (4), unrolled: one block per w
        {
            const w = 0u;
            acc[i][w] *= f;
        }
        {
            const w = 1u;
            acc[i][w] *= f;
        }
        {
            const w = 2u;
            acc[i][w] *= f;
        }
        {
            const w = 3u;
            acc[i][w] *= f;
        }
    }
    {
        const i = 1u;
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
        // for w < ACC_GROUPS (4), unrolled: one block per w
        {
            const w = 0u;
            acc[i][w] *= f;
        }
        {
            const w = 1u;
            acc[i][w] *= f;
        }
        {
            const w = 2u;
            acc[i][w] *= f;
        }
        {
            const w = 3u;
            acc[i][w] *= f;
        }
    }
    {
        const i = 2u;
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
        // for w < ACC_GROUPS (4), unrolled: one block per w
        {
            const w = 0u;
            acc[i][w] *= f;
        }
        {
            const w = 1u;
            acc[i][w] *= f;
        }
        {
            const w = 2u;
            acc[i][w] *= f;
        }
        {
            const w = 3u;
            acc[i][w] *= f;
        }
    }
    {
        const i = 3u;
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
        // for w < ACC_GROUPS (4), unrolled: one block per w
        {
            const w = 0u;
            acc[i][w] *= f;
        }
        {
            const w = 1u;
            acc[i][w] *= f;
        }
        {
            const w = 2u;
            acc[i][w] *= f;
        }
        {
            const w = 3u;
            acc[i][w] *= f;
        }
    }
    workgroupBarrier();  // every invocation has read sM before it takes the sums
    if (lane == 0u) {
        // for i < ROWS (4), unrolled: one block per i
        {
            const i = 0u;
            sM[team * ROWS + i] = l_i[i];
        }
        {
            const i = 1u;
            sM[team * ROWS + i] = l_i[i];
        }
        {
            const i = 2u;
            sM[team * ROWS + i] = l_i[i];
        }
        {
            const i = 3u;
            sM[team * ROWS + i] = l_i[i];
        }
    }
    workgroupBarrier();
    var l_row: array<f32, ROWS>;  // the row's sum
    var inv_l: array<f32, ROWS>;
    // for i < ROWS (4), unrolled: one block per i
    {
        const i = 0u;
        var l = 0.0;
        for (var t = 0u; t < TEAMS; t++) {
            l += sM[t * ROWS + i];
        }
        l_row[i] = l;
        inv_l[i] = select(0.0, 1.0 / l, l > 0.0);
    }
    {
        const i = 1u;
        var l = 0.0;
        for (var t = 0u; t < TEAMS; t++) {
            l += sM[t * ROWS + i];
        }
        l_row[i] = l;
        inv_l[i] = select(0.0, 1.0 / l, l > 0.0);
    }
    {
        const i = 2u;
        var l = 0.0;
        for (var t = 0u; t < TEAMS; t++) {
            l += sM[t * ROWS + i];
        }
        l_row[i] = l;
        inv_l[i] = select(0.0, 1.0 / l, l > 0.0);
    }
    {
        const i = 3u;
        var l = 0.0;
        for (var t = 0u; t < TEAMS; t++) {
            l += sM[t * ROWS + i];
        }
        l_row[i] = l;
        inv_l[i] = select(0.0, 1.0 / l, l > 0.0);
    }
    // acc over the teams of each block of SUBGROUP invocations (a butterfly of shuffles over the
    // lanes that hold the same columns: TEAM apart)
    // for i < ROWS (4), unrolled: one block per i
    {
        const i = 0u;
        // for w < ACC_GROUPS (4), unrolled: one block per w
        {
            const w = 0u;
            acc[i][w] += subgroupShuffleXor(acc[i][w], 16u);
            acc[i][w] += subgroupShuffleXor(acc[i][w], 8u);
        }
        {
            const w = 1u;
            acc[i][w] += subgroupShuffleXor(acc[i][w], 16u);
            acc[i][w] += subgroupShuffleXor(acc[i][w], 8u);
        }
        {
            const w = 2u;
            acc[i][w] += subgroupShuffleXor(acc[i][w], 16u);
            acc[i][w] += subgroupShuffleXor(acc[i][w], 8u);
        }
        {
            const w = 3u;
            acc[i][w] += subgroupShuffleXor(acc[i][w], 16u);
            acc[i][w] += subgroupShuffleXor(acc[i][w], 8u);
        }
    }
    {
        const i = 1u;
        // for w < ACC_GROUPS (4), unrolled: one block per w
        {
            const w = 0u;
            acc[i][w] += subgroupShuffleXor(acc[i][w], 16u);
            acc[i][w] += subgroupShuffleXor(acc[i][w], 8u);
        }
        {
            const w = 1u;
            acc[i][w] += subgroupShuffleXor(acc[i][w], 16u);
            acc[i][w] += subgroupShuffleXor(acc[i][w], 8u);
        }
        {
            const w = 2u;
            acc[i][w] += subgroupShuffleXor(acc[i][w], 16u);
            acc[i][w] += subgroupShuffleXor(acc[i][w], 8u);
        }
        {
            const w = 3u;
            acc[i][w] += subgroupShuffleXor(acc[i][w], 16u);
            acc[i][w] += subgroupShuffleXor(acc[i][w], 8u);
        }
    }
    {
        const i = 2u;
        // for w < ACC_GROUPS (4), unrolled: one block per w
        {
            const w = 0u;
            acc[i][w] += subgroupShuffleXor(acc[i][w], 16u);
            acc[i][w] += subgroupShuffleXor(acc[i][w], 8u);
        }
        {
            const w = 1u;
            acc[i][w] += subgroupShuffleXor(acc[i][w], 16u);
            acc[i][w] += subgroupShuffleXor(acc[i][w], 8u);
        }
        {
            const w = 2u;
            acc[i][w] += subgroupShuffleXor(acc[i][w], 16u);
            acc[i][w] += subgroupShuffleXor(acc[i][w], 8u);
        }
        {
            const w = 3u;
            acc[i][w] += subgroupShuffleXor(acc[i][w], 16u);
            acc[i][w] += subgroupShuffleXor(acc[i][w], 8u);
        }
    }
    {
        const i = 3u;
        // for w < ACC_GROUPS (4), unrolled: one block per w
        {
            const w = 0u;
            acc[i][w] += subgroupShuffleXor(acc[i][w], 16u);
            acc[i][w] += subgroupShuffleXor(acc[i][w], 8u);
        }
        {
            const w = 1u;
            acc[i][w] += subgroupShuffleXor(acc[i][w], 16u);
            acc[i][w] += subgroupShuffleXor(acc[i][w], 8u);
        }
        {
            const w = 2u;
            acc[i][w] += subgroupShuffleXor(acc[i][w], 16u);
            acc[i][w] += subgroupShuffleXor(acc[i][w], 8u);
        }
        {
            const w = 3u;
            acc[i][w] += subgroupShuffleXor(acc[i][w], 16u);
            acc[i][w] += subgroupShuffleXor(acc[i][w], 8u);
        }
    }
    let block = lid / SUBGROUP;
    let writes = lid % SUBGROUP < TEAM;  // the block's first team writes the block's sums
    // for i < ROWS (4), unrolled: one block per i
    {
        const i = 0u;
        if (writes) {
            // for c < CHUNKS_V (1), unrolled: one block per c
            {
                const c = 0u;
                // for g < GROUPS (4), unrolled: one block per g
                {
                    const g = 0u;
                    sO[block * (HEAD_DIM_V / 4u) + (lane + TEAM * c) * GROUPS + g] = acc[i][c * GROUPS + g];
                }
                {
                    const g = 1u;
                    sO[block * (HEAD_DIM_V / 4u) + (lane + TEAM * c) * GROUPS + g] = acc[i][c * GROUPS + g];
                }
                {
                    const g = 2u;
                    sO[block * (HEAD_DIM_V / 4u) + (lane + TEAM * c) * GROUPS + g] = acc[i][c * GROUPS + g];
                }
                {
                    const g = 3u;
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
                // for e < 4u, unrolled: one block per e
                {
                    const e = 0u;
                    o_part[o_base + 4u * col + e] = select(o[e], nan, bad_row[i]);
                }
                {
                    const e = 1u;
                    o_part[o_base + 4u * col + e] = select(o[e], nan, bad_row[i]);
                }
                {
                    const e = 2u;
                    o_part[o_base + 4u * col + e] = select(o[e], nan, bad_row[i]);
                }
                {
                    const e = 3u;
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
    {
        const i = 1u;
        if (writes) {
            // for c < CHUNKS_V (1), unrolled: one block per c
            {
                const c = 0u;
                // for g < GROUPS (4), unrolled: one block per g
                {
                    const g = 0u;
                    sO[block * (HEAD_DIM_V / 4u) + (lane + TEAM * c) * GROUPS + g] = acc[i][c * GROUPS + g];
                }
                {
                    const g = 1u;
                    sO[block * (HEAD_DIM_V / 4u) + (lane + TEAM * c) * GROUPS + g] = acc[i][c * GROUPS + g];
                }
                {
                    const g = 2u;
                    sO[block * (HEAD_DIM_V / 4u) + (lane + TEAM * c) * GROUPS + g] = acc[i][c * GROUPS + g];
                }
                {
                    const g = 3u;
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
                // for e < 4u, unrolled: one block per e
                {
                    const e = 0u;
                    o_part[o_base + 4u * col + e] = select(o[e], nan, bad_row[i]);
                }
                {
                    const e = 1u;
                    o_part[o_base + 4u * col + e] = select(o[e], nan, bad_row[i]);
                }
                {
                    const e = 2u;
                    o_part[o_base + 4u * col + e] = select(o[e], nan, bad_row[i]);
                }
                {
                    const e = 3u;
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
    {
        const i = 2u;
        if (writes) {
            // for c < CHUNKS_V (1), unrolled: one block per c
            {
                const c = 0u;
                // for g < GROUPS (4), unrolled: one block per g
                {
                    const g = 0u;
                    sO[block * (HEAD_DIM_V / 4u) + (lane + TEAM * c) * GROUPS + g] = acc[i][c * GROUPS + g];
                }
                {
                    const g = 1u;
                    sO[block * (HEAD_DIM_V / 4u) + (lane + TEAM * c) * GROUPS + g] = acc[i][c * GROUPS + g];
                }
                {
                    const g = 2u;
                    sO[block * (HEAD_DIM_V / 4u) + (lane + TEAM * c) * GROUPS + g] = acc[i][c * GROUPS + g];
                }
                {
                    const g = 3u;
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
                // for e < 4u, unrolled: one block per e
                {
                    const e = 0u;
                    o_part[o_base + 4u * col + e] = select(o[e], nan, bad_row[i]);
                }
                {
                    const e = 1u;
                    o_part[o_base + 4u * col + e] = select(o[e], nan, bad_row[i]);
                }
                {
                    const e = 2u;
                    o_part[o_base + 4u * col + e] = select(o[e], nan, bad_row[i]);
                }
                {
                    const e = 3u;
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
    {
        const i = 3u;
        if (writes) {
            // for c < CHUNKS_V (1), unrolled: one block per c
            {
                const c = 0u;
                // for g < GROUPS (4), unrolled: one block per g
                {
                    const g = 0u;
                    sO[block * (HEAD_DIM_V / 4u) + (lane + TEAM * c) * GROUPS + g] = acc[i][c * GROUPS + g];
                }
                {
                    const g = 1u;
                    sO[block * (HEAD_DIM_V / 4u) + (lane + TEAM * c) * GROUPS + g] = acc[i][c * GROUPS + g];
                }
                {
                    const g = 2u;
                    sO[block * (HEAD_DIM_V / 4u) + (lane + TEAM * c) * GROUPS + g] = acc[i][c * GROUPS + g];
                }
                {
                    const g = 3u;
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
                // for e < 4u, unrolled: one block per e
                {
                    const e = 0u;
                    o_part[o_base + 4u * col + e] = select(o[e], nan, bad_row[i]);
                }
                {
                    const e = 1u;
                    o_part[o_base + 4u * col + e] = select(o[e], nan, bad_row[i]);
                }
                {
                    const e = 2u;
                    o_part[o_base + 4u * col + e] = select(o[e], nan, bad_row[i]);
                }
                {
                    const e = 3u;
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
const MAX_SPLITS: u32 = 64u;  // the most splits a launch uses (the runtime's bound)

@compute @workgroup_size(64, 1, 1)
fn attngen_decode_i8_paged_combine(@builtin(global_invocation_id) gid: vec3<u32>) {
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
        out[out_base + d] = elem_t(select(o, nan, row_bad));
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
