"""FP8 prefill on the Hopper family (`dtype e4m3 | e5m2`, issue 44): what the CUDA target builds of
it and what it refuses, the layout of V^T the kernel reads, and its shared memory.

The kernel is the producer family's (templates/cuda/family_producer.j2) with FP8 products
(templates/cuda/math_wgmma_fp8.j2): wgmma m64nNk32 with e4m3 / e5m2 operands, both K-major in
shared memory (the A of P V from registers). Q and K as stored ([row][d]) are K-major already;
V is not, so a first entry point (`<kernel>_prepare_v`, templates/cuda/fp8_prepare.j2) writes V^T
into a workspace before the attention: vt[b][hkv][d][slot] for every key slot of the sequence,
zero past Lk up to a whole tile, with two more jobs:

- the keys of each 32-key block are stored permuted (`KEY_SLOTS`): slot k holds key KEY_SLOTS[k],
  so that the f32 accumulator of S, quantized to e4m3 in registers in its own order, is the A
  fragment of P V without a shuffle (the m64nN accumulator gives lane 4 G + T columns 8 j + 2 T and
  8 j + 2 T + 1 of rows G and G + 8; the m64nNk32 A fragment of 8-bit values wants k = 4 T .. 4 T + 3
  and 4 T + 16 .. 4 T + 19 of the same rows: PTX ISA, "Register Fragments" of wgmma; CUTLASS's
  ALayout_64x32); tests/backends/cuda/test_fp8_layout.py emulates both;
- V's non-finite values are zeroed in V^T and their keys marked in `vt_bad` (one bit per key), so
  that a row gives such a key's values a weight of 0 without a NaN, and a row that does see one
  (p != 0) outputs NaN, as every kernel does (docs/language.md, "A key of weight 0 adds nothing").

Everything else (masks, GQA, softcap, work items) is the producer family's, with the score scaled
by q_descale * k_descale (per sequence and KV head) and the output by v_descale.
"""

from __future__ import annotations

from ...lang.spec import AttentionSpec
from ...plan.kernel_plan import Problem, place_buffers
from ...plan.profiles import Profile
from .tiles import WARPGROUP_ROWS, WGMMA_ALIGN, WGMMA_COLUMNS, tiles_for

KEY_BLOCK = 32  # the k of wgmma m64nNk32: keys are permuted within blocks of this many
TILE_KV = 128  # keys per block of _prepare_v and the workspaces' padding (V^T rows of whole 128-key rows)
MIN_TILE_KV, MAX_TILE_KV = 64, 256  # the attention's tile kv: a multiple of KEY_BLOCK, at most the N of m64nNk32
ROW_BYTES = 128  # Q and K rows are padded to whole 128-byte swizzle rows (128 values) ...
NARROW_ROW_BYTES = 64  # ... or, head dims qk up to 64 with CudaTiles.fp8_swizzle64, one 64-byte swizzle row
STAGES = 2  # K and V^T tiles in flight (the producer's ring)
P_OFFSET = 8.0  # P = exp2(t - m + 8) <= 256 in e4m3 (normal from 2^-6): benchmarks/probes/emulate_fp8_p.py
MAX_HEAD_DIM = 256  # Q whole in shared memory and the N of P V (at most 256)
HEAD_DIM_STEP = 16  # head dims in 16-byte steps: the tensor maps' row strides (H * D bytes) stay 16-byte multiples
TILE_Q = (64, 128, 192)  # one, two or three consumer warpgroups of 64 rows
MAX_HEAD_DIM_Q192 = 64  # three consumer warpgroups (160 registers each) up to it: d128 q192 spilled and ptxas
# serialised its products (C7512) from kv 128 (tests/backends/cuda/test_fp8_source.py, test_tiles_compile)
WIDE_D_V = 192  # above it (acc of more than 96 registers) the consumers need 240 registers (producer_regs)


def vt_swizzle(tile_kv: int) -> int:
    """Bytes of a V^T tile's row in shared memory, its swizzle (128, 64 or 32): a tile of tile_kv key
    slots is ceil(tile_kv / swizzle) column blocks of that many slots (one tensor copy each), and the
    wgmma descriptors of P V read them with the same swizzle. 128 where tile kv is a multiple of 128
    (the widest, the f16 family's), else 64 or 32, the widest that divides it (FlashAttention-3's
    FP8 V^T at 160 or 224 keys takes 32 the same way, CuTe's smem layout selector)."""
    return next(b for b in (128, 64, 32) if tile_kv % b == 0)


def key_slot_permutation() -> tuple:
    """KEY_SLOTS[k]: the key (0..31 within its 32-key block) that slot k of V^T holds: for lane
    T = 0..3 and u = 0..3, slot 4 T + u holds key 2 T + 8 (u // 2) + u % 2 and slot 4 T + 16 + u
    holds key 2 T + 16 + 8 (u // 2) + u % 2 (module docstring)."""
    slots = [0] * KEY_BLOCK
    for t in range(4):
        for u in range(4):
            slots[4 * t + u] = 2 * t + 8 * (u // 2) + u % 2
            slots[4 * t + 16 + u] = 2 * t + 16 + 8 * (u // 2) + u % 2
    return tuple(slots)


KEY_SLOTS = key_slot_permutation()
GROUP = 16  # key slots per 16-byte store of the _prepare_v entry: slots 16 g .. 16 g + 15 of a V^T row


def group_slots() -> tuple:
    """KEY_SLOTS within a group of GROUP slots: ((k0, k1, k2, k3) per 4 slots), the keys (0..15 of
    the group's own 16) that slots 4 T .. 4 T + 3 hold. _prepare_v writes a V^T row 16 slots per
    store from 16 keys, which holds because each half of a 32-key block holds its own 16 keys in
    the same order (KEY_SLOTS[16 + k] = 16 + KEY_SLOTS[k])."""
    first, second = KEY_SLOTS[:GROUP], KEY_SLOTS[GROUP:]
    assert sorted(first) == list(range(GROUP)) and second == tuple(GROUP + s for s in first), KEY_SLOTS
    return tuple(first[i:i + 4] for i in range(0, GROUP, 4))


def padded_keys(len_k: int) -> int:
    """Key slots per row of V^T: Lk rounded up to whole blocks of _prepare_v (the formula `TILE_KV *
    ceil(Lk / TILE_KV)`); the attention's last tile reads zeros past them (its tensor map's
    out-of-bounds fill) where its tile kv is not TILE_KV."""
    return -(-len_k // TILE_KV) * TILE_KV


_WHY = "FP8 prefill is built for"


def fp8_problems(spec: AttentionSpec, profile: Profile) -> list:
    """What target cuda refuses of an FP8 spec on `profile`, each with its reason (nothing is
    changed silently): a profile without FP8 wgmma, and the combinations not built yet."""
    d = spec.dtype
    if not profile.features.get("fp8_wgmma"):
        arch = profile.section("device").get("arch", "?")
        return [Problem(f"dtype {d} needs FP8 tensor cores with wgmma (wgmma.mma_async m64nNk32 .{d}, sm_90a: "
                        f"Hopper, compute capability 9.0); profile {profile.name} ({arch}) has none", key="dtype",
                        hint="build for profile cuda-sm90 (H100, H200), or use dtype f16 / bf16 here")]
    out = []
    hint = "use dtype f16 or bf16 for it (an FP8 KV cache for decode: kv_dtype e4m3)"
    if spec.schedule.is_split:
        out.append(Problem(f"schedule {spec.schedule.kind}: {_WHY} prefill (schedule fused); the split decode "
                           "schedules are not built for FP8", key="schedule", hint=hint))
    if spec.kv_cache.is_paged:
        out.append(Problem(f"kv_cache paged: {_WHY} contiguous K and V; paged caches are not built for FP8",
                           key="kv_cache", hint=hint))
    for what, dim in (("qk", spec.head_dim_qk), ("v", spec.head_dim_v)):
        if dim % HEAD_DIM_STEP or dim > MAX_HEAD_DIM:
            out.append(Problem(f"head_dim {what}={dim}: {_WHY} head dims that are multiples of {HEAD_DIM_STEP} "
                               f"up to {MAX_HEAD_DIM} (Q whole in shared memory; rows of whole 16-byte steps for "
                               "the tensor copy engine)", key="head_dim", hint="e.g. head_dim 64, 128 or 256"))
            break
    if spec.tile.d is not None:
        out.append(Problem(f"tile d={spec.tile.d}: {_WHY} whole head dims (no chunks)", key="tile",
                           hint="leave tile d out"))
    rows, kv = fp8_tiles(spec, tiles_for(profile))
    whose = "" if spec.tile.kv else " (the tile table's, CudaTiles.fp8_tiles)"
    if kv % KEY_BLOCK or not MIN_TILE_KV <= kv <= MAX_TILE_KV:
        out.append(Problem(f"tile kv={kv}{whose}: {_WHY} tile kv a multiple of {KEY_BLOCK} from {MIN_TILE_KV} to "
                           f"{MAX_TILE_KV} (V^T's key slots are permuted in blocks of {KEY_BLOCK}, the k of a P V "
                           f"step; S is one m64nNk32 product, N at most {MAX_TILE_KV})", key="tile",
                           hint=f"e.g. tile kv={TILE_KV}, or leave it out"))
    if spec.mask.is_custom and kv > TILE_KV:
        out.append(Problem(f"tile kv={kv}{whose}: mask custom is built for FP8 tiles of up to {TILE_KV} keys (its words "
                           "of a tile's keys are staged 8 a row)", key="tile", hint=f"use tile kv={TILE_KV} or less"))
    whose = "" if spec.tile.q else " (the tile table's, CudaTiles.fp8_tiles)"
    if rows not in TILE_Q:
        out.append(Problem(f"tile q={rows}{whose}: {_WHY} tile q 64, 128 or 192 (one, two or three consumer "
                           "warpgroups)", key="tile", hint="use tile q=128 or leave it out"))
    elif rows == 3 * WARPGROUP_ROWS and max(spec.head_dim_qk, spec.head_dim_v) > MAX_HEAD_DIM_Q192:
        out.append(Problem(f"tile q=192{whose}: {_WHY} three consumer warpgroups up to head dim {MAX_HEAD_DIM_Q192} "
                           "(their 160 registers each hold S, P and acc of 64 rows only so far)", key="tile",
                           hint="use tile q=128 or leave it out"))
    opts = spec.options("cuda")
    for opt in ("producer", "tma"):
        if opts.get(opt) == "off":
            out.append(Problem(f"{opt}=off: {_WHY} the producer warpgroup with the tensor copy engine (its only FP8 "
                               "kernel)", key="target.cuda", hint=f"leave {opt} out"))
    warps = opts.get("warps")
    if warps is not None and warps != rows // 16:
        out.append(Problem(f"warps={warps}: an FP8 block has a consumer warp per 16 rows of tile q "
                           f"({rows // 16})", key="target.cuda", hint="leave warps out"))
    if spec.mask.kind == "expr" or spec.score is not None:
        what = "mask" if spec.mask.kind == "expr" else "score"
        out.append(Problem(f"{what} expressions are not built for FP8 yet (issue 44; those the planner reads as a "
                           "named mask or softcap are)", key=f"{what}.expr",
                           hint="use a named mask, mask custom or softcap, or dtype f16 / bf16"))
    if spec.inputs:
        out.append(Problem("expression inputs are not built for FP8 yet", key=f"input.{spec.inputs[0].name}",
                           hint="use dtype f16 or bf16"))
    return out


def fp8_tiles(spec: AttentionSpec, t) -> tuple:
    """(tile q, tile kv) of an FP8 kernel: the spec's where it gives them, else the tile table's
    (CudaTiles.fp8_tiles: the first row whose head-dim bound holds the larger head dim, CudaTiles.fp8_masked_tiles'
    rows first for a mask; mask custom at most TILE_KV keys, the widest tile its staged words serve)."""
    d = max(spec.head_dim_qk, spec.head_dim_v)
    rows = (t.fp8_masked_tiles if spec.mask.kind != "none" else ()) + t.fp8_tiles
    q, kv = next((tiles for bound, tiles in rows if d <= bound), t.fp8_tiles[-1][1])
    if spec.mask.is_custom:
        kv = min(kv, TILE_KV)
    return spec.tile.q or q, spec.tile.kv or kv


def producer_regs(spec: AttentionSpec, t) -> int:
    """The FP8 producer's registers after setmaxnreg (CudaConfig.producer_regs), from the tile table `t`
    (CudaTiles.fp8_producer_regs). Not the f16 family's tma_producer_regs with its cleaning_producer_regs
    minimum (32: the f16 producer's redo of an item spilled at 24): V^T comes cleaned, so the FP8
    producer has no redo and 24 serve it with every named mask but custom (which copies the mask's
    words). 24 leave the two consumer warpgroups 240 registers (65536 / 384 threads = 168 each at
    launch: 24 x 128 + 240 x 256 = 168 x 384); 32 or 40 leave them 232, and from d224 acc (128) + S
    (64) + P in flight (16) beside the loop's state do not fit: ptxas serialised the wgmma (C7512) and
    spilled (benchmarks/NOTES.md, 2026-11-28, "FP8 setmaxnreg"). Mask custom's producer spills at 24:
    its 40 up to d192, where 232 serve the consumers; above, fp8_wide_custom_producer_regs (a few spills
    in the producer's loop rather than serialised products)."""
    if spec.mask.is_custom and padded_fp8_v(spec.head_dim_v) > WIDE_D_V:
        return t.fp8_wide_custom_producer_regs
    return t.fp8_producer_regs["custom" if spec.mask.kind == "expr" else spec.mask.kind]


def fp8_config(spec: AttentionSpec, profile: Profile, t) -> dict:
    """The choices of FP8 prefill's CudaConfig (config.cuda_config builds it; the checker above refused what it
    does not build): the spec's tile q and kv or the table's (fp8_tiles), STAGES stages (or the spec's), the
    shared memory, the output through the tensor store where it fits, Q and K in the 128-byte swizzle or
    (CudaTiles.fp8_swizzle64, head dims qk up to 64) the 64-byte one (qk_swizzle)."""
    from ...plan.kernel_plan import describe_buffers
    opts, limit = spec.options("cuda"), profile.limit("shared_memory_bytes")
    tile_q, tile_kv = fp8_tiles(spec, t)
    stages = opts.get("stages") or STAGES
    buffers, smem = fp8_layout(spec, t, tile_q, tile_kv, stages)
    if smem > limit:
        raise Problem(f"FP8 tile q={tile_q} kv={tile_kv} with {stages} stages and head_dim qk={spec.head_dim_qk} "
                      f"v={spec.head_dim_v} needs {smem} bytes of shared memory ({describe_buffers(buffers)}), but "
                      f"{profile.name} allows {limit}", key="target.cuda" if opts.get("stages") else "head_dim",
                      hint="use fewer stages (target cuda { stages=2 })" if stages > 2 else "a smaller tile kv")
    tma_store = False
    if t.tma_store and spec.head_dim_v > t.tma_store_above_d_v:
        o_buffers, o_smem = fp8_layout(spec, t, tile_q, tile_kv, stages, o_stage=True)
        if o_smem <= limit:  # (never at the cost of a smaller tile, as f16's)
            buffers, smem, tma_store = o_buffers, o_smem, True
    d_qk_pad = padded_fp8_qk(spec.head_dim_qk, t.fp8_swizzle64)
    return dict(tile_q=tile_q, tile_kv=tile_kv, stages=stages, d_qk_pad=d_qk_pad, d_v_pad=padded_fp8_v(spec.head_dim_v),
                buffers=buffers, smem=smem, tma_store=tma_store, producer_regs=producer_regs(spec, t),
                resident_blocks=max(1, limit // smem), item_per_block=opts.get("persistent") == "off",
                qk_swizzle=min(d_qk_pad, ROW_BYTES))


def fp8_layout(spec: AttentionSpec, t, tile_q: int, tile_kv: int, stages: int, o_stage: bool = False) -> tuple:
    """(buffers, bytes) of an FP8 kernel's shared memory: Q, the ring of K and of V^T tiles, the
    output staged for the tensor store (o_stage), a custom mask's words, the mbarriers and work
    items (the producer family's sSync, without the cleaning's words: V^T comes cleaned)."""
    d_qk = padded_fp8_qk(spec.head_dim_qk, t.fp8_swizzle64)
    d_v = padded_fp8_v(spec.head_dim_v)
    swz = f"{min(d_qk, ROW_BYTES)}-byte swizzle"
    entries = [
        ("sQ", spec.dtype, 1, tile_q, d_qk, f"the block's rows of Q ({swz}: {min(d_qk, ROW_BYTES)} values a row)"),
        ("sK", spec.dtype, stages, tile_kv, d_qk, f"K tiles, one per stage ({swz})"),
        ("sV", spec.dtype, stages, tile_kv, d_v, f"V^T tiles, one per stage: {d_v} head-dim rows of {tile_kv} key "
                                                 f"slots ({vt_swizzle(tile_kv)}-byte swizzle)"),
    ]
    if o_stage:
        entries.append(("sO", spec.output_dtype, 1, tile_q, d_v, "the output tile, staged for the tensor store"))
    if spec.mask.is_custom:
        entries.append(("sMask", "u32", stages, tile_q, t.mask_stage_words,
                        "a boolean mask's words of each stage's partial tile (8 per row: 256 keys, padded)"))
    # mbarriers (Q, full and empty per stage, Q free, the tensor copies' landing per stage), four
    # item slots of 4 words, and the bad-key words the family's layout keeps after them
    words = 2 * (1 + 2 * stages) + 26 + stages * (tile_kv // 32) + 1 + 2 * stages
    entries.append(("sSync", "u32", 1, 1, words, "mbarriers of the copies and the work items"))
    buffers, smem = place_buffers(entries)
    return buffers, smem + WGMMA_ALIGN


def padded_fp8_qk(head_dim: int, swizzle64: bool = False) -> int:
    """Q and K rows in values, padded to whole 128-byte swizzle rows (zero columns); with `swizzle64`
    (CudaTiles.fp8_swizzle64) head dims up to 64 to one 64-byte row of the 64-byte swizzle instead
    (CudaConfig.qk_swizzle 64: templates/cuda/math_wgmma_fp8.j2, issue_scores)."""
    if swizzle64 and head_dim <= NARROW_ROW_BYTES:
        return NARROW_ROW_BYTES
    return -(-head_dim // ROW_BYTES) * ROW_BYTES


def padded_fp8_v(head_dim: int) -> int:
    """V^T's head-dim rows (the N of P V and acc's columns), padded as the wgmma family's (64)."""
    return -(-head_dim // WGMMA_COLUMNS) * WGMMA_COLUMNS


# -- the plan: parameters, the V^T workspace and the _prepare_v entry point -----------------------

PREPARE_THREADS = 256  # threads of a _prepare_v block: one tile of TILE_KV keys of one (sequence, KV head)
PAD_KEYS = f"{TILE_KV} * ceil(Lk / {TILE_KV})"  # key slots per V^T row (padded_keys)


def workspaces(spec: AttentionSpec) -> tuple:
    """V^T and its bad-key bits, written by _prepare_v and read by the attention entry."""
    from ...plan.kernel_plan import Workspace
    return (Workspace("vt", spec.dtype, ("B", "Hkv", "Dv", PAD_KEYS)),
            Workspace("vt_bad", "u32", ("B", "Hkv", f"{TILE_KV // 32} * ceil(Lk / {TILE_KV})")))


def descale_params(p) -> list:
    """q_descale, k_descale, v_descale (FlashAttention-3's), built with lower.py's Param maker `p`."""
    what = {"q": "q's values (the KV head's group of query heads)", "k": "k's values", "v": "v's values"}
    return [p(f"{n}_descale", "tensor", "f32", ("B", "Hkv"),
              doc=f"float32, contiguous: {what[n]} are the FP8 values times this, per sequence and KV head; "
                  "finite and > 0 (checked by the _prepare_v entry: errors word "
                  f"{DESCALE_WORDS[n]})") for n in ("q", "k", "v")]


# the errors words a bad descale is reported in (attngen/backends/cuda/launch.py): its flat index + 1
DESCALE_WORDS = {"q": 5, "k": 6, "v": 7}


def main_params(spec: AttentionSpec, p) -> list:
    """The attention entry's FP8 parameters (before the tensor maps): the descales and vt_bad."""
    return descale_params(p) + [
        p("vt_bad", "tensor", "u32", workspaces(spec)[1].shape,
          doc="workspace written by the _prepare_v entry: bit j % 32 of word j / 32 of a (sequence, KV head) = key "
              "j of v held an inf or NaN (zeroed in vt)")]


def vt_map_doc(tile_kv: int = TILE_KV) -> str:
    """The tensor map of V^T (the attention entry's tmap_v) of a kernel with `tile_kv` keys per tile."""
    sw = vt_swizzle(tile_kv)
    return ("a CUtensorMap (128 bytes, passed by value) from cuTensorMapEncodeTiled over the vt workspace: UINT16 (two "
            f"FP8 values an element), rank 4, dims ({PAD_KEYS} / 2, Hkv, Dv, B) innermost first, strides in bytes "
            f"of its head, row and batch axes, box ({sw // 2}, 1, Dv padded to 64, 1), {sw}-byte swizzle, L2 "
            "promotion 128 bytes, out-of-bounds fill zeros (a tile's key slots past the workspace's)")


def describe(plan) -> list:
    """`attngen check`'s lines of an FP8 plan."""
    return [f"FP8: entry point {plan.entry}_prepare_v runs first (grid (ceil(Lk / {TILE_KV}), Hkv, B) x {PREPARE_THREADS} "
            "threads): V^T into the vt workspace, key slots permuted within 32-key blocks, non-finite values zeroed "
            "and their keys in vt_bad, the descales checked; the call passes q_descale, k_descale, v_descale "
            f"(float32 (B, Hkv), 1 where not given); P in e4m3 as exp2(t - m + {P_OFFSET:g}); output {plan.out_dtype}; "
            "padded batches only (kv_lens, cu_seqlens, block tables and appends are refused at the call)"]


def prepare_entry(spec: AttentionSpec, entry: str, p, strides, errors_param):
    """The entry point launched before the attention (lower.Entry with before=True): V^T, its bad
    keys, and the descales' check."""
    from ...plan.kernel_plan import Entry
    vt, bad = workspaces(spec)
    params = [p("v", "tensor", spec.dtype, ("B", "Lk", "Hkv", "Dv"), doc="values (FP8 bytes)"),
              *strides("v", "v", (("b", "batch"), ("l", "sequence"), ("h", "head"))),
              p("vt", "tensor", vt.dtype, vt.shape, "write",
                doc=f"workspace: vt[b][h][d][slot] = v[b][32 (slot / 32) + KEY_SLOTS[slot % 32]][h][d] (KEY_SLOTS: "
                    f"{', '.join(map(str, KEY_SLOTS))}), 0 past Lk and where v held an inf or NaN"),
              p("vt_bad", "tensor", bad.dtype, bad.shape, "write", doc="workspace: the keys of v that held an inf "
                                                                      "or NaN, bit j % 32 of word j / 32"),
              *descale_params(p),
              p("len_k", "scalar", "i32", doc="Lk"),
              p(errors_param.name, errors_param.kind, errors_param.dtype, errors_param.shape, errors_param.access,
                errors_param.optional, doc="error flags: a bad descale's flat index + 1 in word 5 (q_descale), 6 "
                                          "(k_descale) or 7 (v_descale) (null: not reported)")]
    doc = ("before the attention: writes V^T of every (sequence, KV head) into vt, key slots permuted within 32-key "
           "blocks, its non-finite values zeroed and their keys in vt_bad; checks every descale (finite, > 0); one "
           f"block per {TILE_KV} keys of a (sequence, KV head)")
    return Entry("prepare_v", entry + "_prepare_v", doc, tuple(params),
                 (f"ceil(Lk / {TILE_KV})", "Hkv", "B"), PREPARE_THREADS, 0, before=True)
