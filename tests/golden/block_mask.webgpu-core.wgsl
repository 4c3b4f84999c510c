// =================================================================================================
// attngen: BlockMask builder for kernel 'llama3_8b_packed_documents' (tile q=16 kv=16).
// Generated; see attngen.runtime.blockmask.build_arrays for the numpy oracle it must equal.
//
// One storage buffer of u32 words holds counts | tiles | data at the word offsets in BmParams
// (the attention kernel binds the same buffer as `mask`). The host writes data (a boolean mask
// as bytes, 4 per word, little-endian; an additive one as f32 bits) and fills counts and tiles
// with UNSET; two entry points, dispatched in order, then fill them:
//   block_mask_classify: one invocation per (mask slice, q tile, kv tile): the tile pair is
//     empty (no element attends), full (every element attends with bias 0) or partial; the
//     kind is written into the pair's slot of `tiles`.
//   block_mask_compact: one invocation per (mask slice, q tile): the live kv tiles of its row
//     of classes, in ascending order, moved to the front of the same row as kv_tile * 2 +
//     partial; the rest set to UNSET (-1 as i32), and the count written last.
// Rows and keys past the mask's Lq / Lk (in the last tiles) make no pair live or partial.
// Loops end with an empty pass: an invocation that a driver cut short (Mesa's llvmpipe stops
// all loops of an invocation after 65535 iterations) writes nothing, its count stays UNSET,
// and the runtime refuses the result.
// =================================================================================================

const TILE_Q: u32 = 16u;    // rows of the mask per q tile (the kernel's tile q)
const TILE_KV: u32 = 16u;   // keys per kv tile (the kernel's tile kv)
const UNSET: u32 = 0xffffffffu;
const NEG_INF_BITS: u32 = 0xff800000u;  // f32 -inf: a masked pair of an additive mask
const EMPTY: u32 = 0u;     // classes written by block_mask_classify
const FULL: u32 = 1u;
const PARTIAL: u32 = 2u;

struct BmParams {
    slices: u32,    // Bm * Hm
    len_q: u32,     // Lq of the mask
    len_k: u32,     // Lk of the mask
    qtiles: u32,    // ceil(len_q / TILE_Q)
    kvtiles: u32,   // ceil(len_k / TILE_KV)
    additive: u32,  // 0: boolean data (bytes), 1: additive (f32 bits)
    counts: u32,    // word offset of counts (slices, qtiles)
    tiles: u32,     // word offset of tiles (slices, qtiles, kvtiles)
    data: u32,      // word offset of data (slices, len_q, len_k)
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> bm: BmParams;
// counts | tiles | data, u32 words
@group(0) @binding(1) var<storage, read_write> mask: array<u32>;

// Element e of the data: does it attend (live), and is it plain (attends with nothing added)?
fn element(e: u32) -> vec2<bool> {
    if (bm.additive == 0u) {
        let live = ((mask[bm.data + e / 4u] >> (8u * (e % 4u))) & 0xffu) != 0u;
        return vec2<bool>(live, live);
    }
    let bits = mask[bm.data + e];
    // +0.0 and -0.0 add nothing
    return vec2<bool>(bits != NEG_INF_BITS, (bits & 0x7fffffffu) == 0u);
}

@compute @workgroup_size(64, 1, 1)
fn block_mask_classify(@builtin(global_invocation_id) gid: vec3<u32>) {
    let kt = gid.x;
    let qt = gid.y;
    let slice = gid.z;
    if (kt >= bm.kvtiles) {
        return;
    }
    let r0 = qt * TILE_Q;
    let c0 = kt * TILE_KV;
    let rows = min(r0 + TILE_Q, bm.len_q) - r0;
    let cols = min(c0 + TILE_KV, bm.len_k) - c0;
    let total = rows * cols;
    let first = (slice * bm.len_q + r0) * bm.len_k + c0;
    var any_live = false;
    var all_plain = true;
    var n = 0u;
    for (; n <= total; n++) {
        if (n == total) {
            continue;  // the empty pass
        }
        if (any_live && !all_plain) {
            continue;  // partial already: nothing left to learn
        }
        let el = element(first + (n / cols) * bm.len_k + n % cols);
        any_live = any_live || el.x;
        all_plain = all_plain && el.y;
    }
    if (n > total) {
        var kind = EMPTY;
        if (any_live) {
            kind = select(PARTIAL, FULL, all_plain);
        }
        mask[bm.tiles + (slice * bm.qtiles + qt) * bm.kvtiles + kt] = kind;
    }
}

@compute @workgroup_size(64, 1, 1)
fn block_mask_compact(@builtin(global_invocation_id) gid: vec3<u32>) {
    let qt = gid.x;
    let slice = gid.y;
    if (qt >= bm.qtiles) {
        return;
    }
    let row = slice * bm.qtiles + qt;
    let base = bm.tiles + row * bm.kvtiles;
    var count = 0u;
    var missing = false;  // a classify invocation that wrote nothing
    var kt = 0u;
    for (; kt <= bm.kvtiles; kt++) {
        if (kt == bm.kvtiles) {
            continue;  // the empty pass
        }
        let kind = mask[base + kt];
        if (kind == UNSET) {
            missing = true;
        } else if (kind != EMPTY) {
            // count <= kt: the slot written was read already (in place, in ascending order)
            mask[base + count] = kt * 2u + select(0u, 1u, kind == PARTIAL);
            count++;
        }
    }
    var e = count;
    for (; e <= bm.kvtiles; e++) {
        if (e == bm.kvtiles) {
            continue;  // the empty pass
        }
        mask[base + e] = UNSET;
    }
    if (kt > bm.kvtiles && e > bm.kvtiles && !missing) {
        mask[bm.counts + row] = count;
    }
}
