"""Which kernel family, main-loop template and code paths one CUDA tile configuration takes.

The templates make no decisions (docs/architecture.md): every choice that depends on more than
one configuration field is taken here, once per namespace, and handed to the templates as a
named field of `KernelShape` (`f` in the templates), which they only test (`{% if f.x %}`).

The families, one main-loop template each (templates/cuda/):

- plain (family_plain.j2): one block per row tile, copies kStages - 1 tiles ahead of the math,
  the softmax after S; mma.sync (whole head dims or chunks), CUDA cores, and the Hopper wgmma
  family with two K/V stages and no producer.
- overlap (family_overlap.j2): the Hopper family without a producer and with three or more
  stages: FlashAttention-3's order, S of tile it issued with P V of tile it - 1.
- producer (family_producer.j2): the Hopper family's producer warpgroup with work items
  (persistent blocks, or one block per item): a producer copies, consumer warpgroups run the
  overlapped loop.
- stored_p (stored_p.j2): the Hopper family's head dims above 256, P through memory; it has
  its own config part.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...plan import expr_blocks, masks

# name -> (main-loop template, what `attngen check` says of it)
FAMILIES = {
    "plain": ("cuda/family_plain.j2", "the plain loop"),
    "overlap": ("cuda/family_overlap.j2", "wgmma, the overlapped loop in FlashAttention-3's order"),
    "producer": ("cuda/family_producer.j2", "wgmma with a producer warpgroup and work items"),
    "stored_p": ("cuda/stored_p.j2", "wgmma, P through memory"),
}

_MATH_WORDS = {"mma": "mma.sync", "fma": "CUDA cores", "wgmma": "wgmma"}


def family_name(c) -> str:
    """The kernel family of tile configuration `c` (a CudaConfig): a key of FAMILIES."""
    if c.stored_p:
        return "stored_p"
    if c.persistent:  # every producer kernel runs the work-item code (CudaConfig asserts it)
        return "producer"
    if c.overlap:
        return "overlap"
    return "plain"


def family_line(c) -> str:
    """`attngen check`'s words for the family of `c` and its template."""
    name = family_name(c)
    template, words = FAMILIES[name]
    if name == "plain":
        words += f", {_MATH_WORDS[c.math]}" + (" in head-dim chunks" if c.chunked else "")
    return f"{words} (templates/{template})"


@dataclass(frozen=True)
class KernelShape:
    """What the templates of one namespace branch on beyond the plain configuration fields."""

    family: str  # a key of FAMILIES
    template: str  # the main-loop template kernel.cu.j2 includes
    # warps over keys (split_kv, CudaConfig.key_warps > 1)
    key_warps: bool
    # paged caches whose pages are smaller than a tile: a tile is whole pages, copied page by page
    # (variants.j2), their block-table entries read one tile ahead unless head dims are chunked
    whole_pages: bool
    prefetch_pages: bool
    # the C++ expression of the warp's row group (warps over keys, split Q K^T's two warpgroups)
    row_warp: str
    # the first argument of WarpMath::init
    math_warp: str
    # split_kv with warps over keys: each key warp merges and stores its share of the output
    # columns (fused_combine: split_kv, not two_pass, whole head dims)
    key_warp_cols: bool
    # the fused combine with warps over keys, without key_warp_cols: key warp 0 stores, the other
    # key warps go on to the combine
    key_warp0_stores: bool
    # split_kv (decode): the first K/V tiles' copies are issued before the wait for Q, not after it
    defer_q: bool
    # output columns split over blocks (col0: the block's first): chunked head dims, and the Hopper
    # producer kernel's head dims above 256
    col_blocks: bool
    # the C++ prefix of an output column in the epilogue
    out_col: str
    # the overlapped loop without a producer cleans V optimistically (a second copy of the loop
    # where acc ends non-finite: section non-finite values)
    optimistic: bool
    # masks whose partial tiles are tested with a row's visible keys as bits (section: score
    # transform and mask): the Hopper family's causal and window masks, and custom masks whose
    # producer stages the words of a boolean mask
    bit_mask: bool
    # the Hopper family's scores and the split schedules' mma.sync ones, without softcap, whose masks
    # only hide keys (not an additive custom mask): the scale goes into the softmax's exp2 argument
    # (one FFMA per score, fmaf(s, kScaleLog2, -m)), the row max is taken on the raw products (the
    # scale is positive), and full tiles skip the mask loop
    fold_scale: bool
    # ... of a structured mask: Mask::row_bits (mask.j2)
    row_bits: bool
    # the softmax's exp2: exp2_approx (one MUFU.EX2, results below 2^-126 flushed to 0) in the Hopper
    # family and the split schedules' mma.sync loops, else exp2f (with its denormal-range fix-up)
    exp2: str
    # the producer stages a boolean custom mask's words of partial tiles (buffer sMask)
    mask_words: bool
    # the plain loop cleans V of a partial tile before the scores are live
    clean_before_scores: bool
    # causal on the Hopper family without persistent blocks: row tiles in reverse blockIdx order
    reverse_tiles: bool
    # persistent causal items longest first, in groups of heads that share L2 (section work items)
    longest_first: bool
    # producer kernels that clean: the consumers read a tile's bad-key bits after the products,
    # in the cleaning pass only (a mask that hides no keys), in two copies of the loop
    late_bits: bool
    # ... or before the products (a mask that hides keys)
    early_bits: bool
    # early_bits read by lane 0 and broadcast (up to two consumer warpgroups)
    broadcast_bits: bool
    # the producer works on a tile after its copies (cleans V, stages mask words) ...
    producer_works: bool
    # ... where this C++ condition holds
    producer_flags: str
    # the plain loop with warps over keys cleans V: each key warp its own keys' rows
    clean_key_warps: bool
    # paged split_kv: the first block-table entries of a split's share are prefetched into L1
    table_prefetch: bool
    # the tensor copy engine's producer cleans V: bar_land
    tma_cleans: bool
    # a mask expression in the plain loop over whole head dims: the K/V tiles of the key range that
    # the expression hides from every row of the block (Mask::tile_is_empty) are neither copied
    # nor computed (the holes of a 2D neighbourhood); the other loops visit them, masked
    skip_holes: bool = False
    # a mask expression with holes (expr_blocks.has_holes) in the producer family and the
    # overlapped loop: each work item's live K/V tiles listed in shared memory (sTiles), by the
    # producer warpgroup or the block's first warp, and iterated as the custom mask's list (holes
    # neither copied nor computed)
    tile_list: bool = False
    # rows that see a key whose V held an inf or NaN output NaN (row_bad, mark_bad_rows, the
    # epilogue): where the kernel cleans V, and FP8's kernel, whose V^T came cleaned with its bad
    # keys (vt_bad: attngen/backends/cuda/fp8.py)
    bad_rows: bool = False


# Entries of a work item's list of live K/V tiles (tile_list): beyond them (a row tile seeing
# more than this many tiles of keys) the item takes the first..last key range instead.
TILE_LIST_ENTRIES = 1024
TILE_LIST_HEAD = 1  # words before the entries: their count


def lists_tiles(spec, t, tile_q: int, tile_kv: int) -> bool:
    """Whether an overlapped-loop kernel of `spec` (the producer family, or wgmma with three
    stages or more) with these tiles lists each item's live K/V tiles (KernelShape.tile_list),
    by the table `t`'s expr_tile_list: a mask expression of indices only whose key ranges have
    holes at tile_q x tile_kv (expr_blocks.has_holes, a plan-time sample: "holes"), every such
    expression ("always"), or none ("never")."""
    e = spec.mask.expr if spec.mask.kind == "expr" else None
    if e is None or not expr_blocks.index_only(e) or t.expr_tile_list == "never":
        return False
    return t.expr_tile_list == "always" or expr_blocks.has_holes(e, tile_q, tile_kv)


def shape_fields(shape: KernelShape) -> str:
    """A KernelShape in one line (attngen build --emit ir): the flags that are on, then the C++
    snippets; family and template are describe's `kernel family` line."""
    on, text = [], []
    for name, value in vars(shape).items():
        if name in ("family", "template"):
            continue
        if isinstance(value, bool):
            if value:
                on.append(name)
        elif value:
            text.append(f"{name}={value!r}")
    return ", ".join(on or ["no flags"]) + ("; " + ", ".join(text) if text else "")


def kernel_shape(c, spec, mask, *, clean_v: bool, clean_all: bool, fused_combine: bool,
                 prescale_q: bool, softcap, pack_gqa: bool) -> KernelShape:
    """The KernelShape of tile configuration `c` of `spec` (mask: the plan's), given whether it
    cleans V's values (emit.cleans_values, cleans_every_tile), the plan's fused combine (lower.
    fused_combine of the main configuration), Q prescaled, softcap and GQA packing."""
    name = family_name(c)
    custom = spec.mask.is_custom
    two_pass = spec.schedule.is_two_pass
    paged, page = spec.kv_cache.is_paged, spec.kv_cache.page
    hidden_keys = masks.hides_loaded_keys(mask)
    kw = c.key_warps > 1
    wgmma = c.math == "wgmma"
    # the split schedules' mma.sync loops (decode): their softmax, like the Hopper family's, is one FFMA
    # and one MUFU.EX2 a score (fold_scale, exp2): exp2f's fix-up, the scale's FMUL and the mask's selects
    # were ~10% of the e4m3 decode's instructions (benchmarks/NOTES.md, seventeenth session; the i8 decode
    # gained 3-5%); not with f16 accumulators (Q prescaled); with head dims in chunks (MLA) the exp2 only:
    # the folded scale spilled DeepSeek-V3's d576 decode in its loop (NVRTC 13.5)
    split_mma = c.math == "mma" and spec.schedule.is_split and not prescale_q
    whole_pages = bool(paged and page < c.tile_kv and c.tile_kv % page == 0 and not wgmma)
    rw = "row_warp" if kw else ("(warp % 4)" if c.split_qk else "warp")
    col_blocks = bool(c.chunked or c.v_blocks > 1 or c.split_qk)
    bit_mask = wgmma and (mask.kind in ("causal", "window") or (custom and c.producer))
    kw_cols = kw and fused_combine and (c.d_v_pad // 8) % c.key_warps == 0
    # what the family templates leave out: the overlapped loops have no warps over keys (section
    # merge the key warps), the producer family no fused combine
    assert not (kw and name in ("overlap", "producer")), "warps over keys outside the plain loop"
    assert not (fused_combine and name == "producer"), "a fused combine in the producer family"
    return KernelShape(
        family=name,
        template=FAMILIES[name][0],
        key_warps=kw,
        whole_pages=whole_pages,
        prefetch_pages=whole_pages and not c.chunked,
        row_warp=rw,
        math_warp="warp" if c.split_qk else rw,
        key_warp_cols=kw_cols,
        key_warp0_stores=fused_combine and kw and not kw_cols,
        defer_q=fused_combine and c.math == "mma" and not c.overlap and not c.producer and not prescale_q,
        col_blocks=col_blocks,
        out_col="col0 + wg * kHeadDimVPad + " if c.split_qk else ("col0 + " if col_blocks else ""),
        optimistic=clean_v and c.overlap and not c.producer,
        bit_mask=bit_mask,
        fold_scale=not softcap and spec.score is None and not two_pass and (
            (wgmma and (bit_mask or mask.kind in ("none", "expr")))
            or (split_mma and mask.kind != "custom" and not c.chunked)),
        row_bits=bit_mask and not custom,
        exp2="exp2_approx" if wgmma or split_mma else "exp2f",
        mask_words=custom and c.producer,
        clean_before_scores=clean_v and not c.chunked and not kw and not clean_all,
        reverse_tiles=wgmma and mask.kind == "causal",
        longest_first=not pack_gqa and (mask.kind == "causal" or (
            mask.kind == "expr" and expr_blocks.later_rows_see_more(mask.expr, c.tile_q, c.tile_kv))),
        late_bits=clean_v and not hidden_keys,
        early_bits=clean_v and hidden_keys,
        broadcast_bits=c.warps <= 8,
        producer_works=clean_v or custom,
        producer_flags=" || ".join((["cleans"] if clean_v else []) + (["words"] if custom else [])),
        clean_key_warps=clean_v and kw,
        table_prefetch=paged and spec.schedule.is_split,
        tma_cleans=c.tma and clean_v,
        skip_holes=mask.kind == "expr" and name == "plain" and not c.chunked,
        tile_list=name in ("producer", "overlap") and c.tile_list,
        bad_rows=clean_v or c.fp8,
    )
