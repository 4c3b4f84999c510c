"""The CUDA backend's tile choices, as data: one frozen table (CudaTiles) and its defaults.

config.py (the logic) reads the table of the profile it plans for, `tiles_for(profile)`: the
defaults (DEFAULT), or the profile's overrides where a benchmark or an A/B probe passes some
(`profile.with_overrides(clean_values=False)`; attngen.plan.profiles.Profile.overrides). A value
that changes the generated source reaches the emitter through the plan (CudaConfig's fields), so
the disk cache's key, a digest of the plan, changes with it.

Each field says in one line why it has its value; the measurements behind the values are in
benchmarks/NOTES.md ("config.py's measurements, moved here from the code", under these names).
The module constants below the table are facts of the hardware and of the templates, not
choices: a kernel with other values would not be a valid kernel, so no profile overrides them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...plan.profiles import Profile, ProfileError, with_overrides

# -- facts (not choices) --------------------------------------------------------------------------
ROWS_PER_WARP = 16  # rows of one m16n8k16 fragment; a warp owns 1 or 2 of them
WARPGROUP_ROWS = 64  # a wgmma warpgroup (4 warps) owns 64 rows of Q
WGMMA_COLUMNS = 64  # the 128-byte swizzle of the wgmma descriptors: rows of whole 64-element blocks
WGMMA_ALIGN = 1024  # each swizzled block is 1024-byte aligned (bytes of slack in the launch's shared memory)
PRODUCER_THREADS = 128  # the producer is one warpgroup
# The head-dim columns each kind of math works in (its step along the head dim): wgmma whole
# swizzle blocks, mma.sync the k of m16n8k16, CUDA cores the 8-column output tiles. The head
# dims are padded to it (the language makes them multiples of 8: CUDA cores pad nothing), a
# `tile d` is a multiple of it, and the source asserts both (templates/cuda/config.j2, `pad`).
COLUMN_STEP = {"wgmma": WGMMA_COLUMNS, "mma": 16, "fma": 8}


def padded_head_dim(head_dim: int, math: str) -> int:
    """A head dim padded to whole COLUMN_STEP columns of `math` (the one padding rule)."""
    step = COLUMN_STEP[math]
    return -(-head_dim // step) * step


@dataclass(frozen=True)
class CudaTiles:
    # -- every family
    spill_factor: float = 1.5  # register estimates above this multiple of the cap are refused or shrunk
    row_skew_bytes: int = 16  # row padding that keeps ldmatrix / float4 reads free of bank conflicts
    max_block_columns: int = 256  # output columns one block keeps in registers; wider outputs split over blocks
    # candidates for an auto `tile d`, largest first (the least estimated work wins)
    chunk_candidates: dict = field(default_factory=lambda: {"mma": (64, 32, 16), "fma": (64, 32, 16, 8)},
                                   hash=False)
    step_cost_columns: int = 16  # a shared-memory step's fixed cost, in head-dim columns of math (an estimate)
    # -- split (decode) schedules, mma.sync
    swizzle_kv: bool = True  # d64/128/256 K/V in 128-byte rows with permuted chunks: cp.async fills them faster
    # quantized caches (kv_dtype) with head dims multiples of 128: their byte tiles in 128-byte rows with permuted
    # chunks instead of rows padded by 64 (K) / 16 (V) bytes (kvquant.py): a third less shared memory at d128
    # (measured on the H200: paged e4m3 decode 1.60x -> 1.67x the f16 cache, contiguous the same)
    swizzle_kv_quant: bool = True
    split_tile_q: int = 16  # rows per block of split_kv / two_pass: one warp; the splits give the parallelism
    split_tile_kv: int = 32  # keys per tile of the split schedules (64 spilled registers)
    split_chunked_tile_kv: int = 64  # head dims in chunks (MLA decode): Q streams half as often as with 32
    split_chunked_max_tile_q: int = 64  # ... and up to 64 of the GQA group's rows per block: fewer K/V re-reads
    split_key_warps: int = 4  # split_kv: warps dividing each tile's keys (the measured default row)
    # -- the Hopper family (wgmma): auto tiles
    # the widest auto tile kv per kind of mask: more per-element state needs registers
    wgmma_max_kv_by_mask: dict = field(default_factory=lambda: {"window": 112, "custom": 80, "softcap": 96},
                                       hash=False)
    causal_tiles: tuple = ((128, (128, 128, None)),)  # causal up to d128: q128 kv128, FlashAttention-3's, no spills
    # above d128 without window / custom / softcap: (head dim bound, ((tile kv, stages), ...)), first that fits
    wide_d_tiles: tuple = ((192, ((80, 3), (96, 2))), (256, ((48, 3), (80, 2))), (320, ((48, 3), (64, 2))),
                           (384, ((32, 3), (48, 2))), (512, ((32, 2),)))
    q_whole_max_head_dim: int = 512  # above it Q of 128 rows no longer fits shared memory whole
    stored_p_tiles: tuple = (128, 256, 64, 256, 4)  # P through memory: tile q, phase A keys, tile kv, columns, stages
    stored_p_above_head_dim: int = 256  # P through memory beats column blocks and split Q K^T above this
    split_qk: bool = True  # split Q K^T between the two consumer warpgroups (d512: faster than column blocks)
    split_qk_min_head_dim: int = 512  # ... from this padded head dim (d384 keeps column blocks)
    split_qk_tiles: tuple = ((16, 4), (64, 2), (48, 2), (32, 2), (16, 2))  # its (tile kv, stages), first that fits
    three_group_tiles: tuple = (64, (192, 128))  # up to d64 unmasked: three consumer warpgroups, q192 kv128
    q128_only_with_producer_max_d: int = 64  # up to this head dim tile q 128 pays only with the producer
    # -- the producer warpgroup and persistent blocks
    producer_masked_max_kv: int = 96  # widest tile kv whose masked consumers stay free of spills
    producer_wide_masked_max_kv: int = 64  # d160-d256 with a window, custom mask or softcap: producer up to it
    wide_masked_tiles: tuple = ((64, 3), (64, 2))  # ... their auto (tile kv, stages), first that fits
    producer_softcap: bool = True  # softcap up to d128 takes the producer too (faster since persistent blocks)
    varlen_producer_max_d: int = 128  # the _varlen entry runs the producer up to it (above, its producer spills)
    varlen_producer_max_kv: int = 96  # ... its tile kv at most, for varlen_producer_kv_dims
    varlen_producer_kv_dims: tuple = (32, 48, 64, 80, 96, 128)  # (equal qk and v head dims)
    varlen_producer_max_kv_other: int = 64  # ... for other head dims (d112 spilled at kv 96)
    varlen_producer_max_kv_narrow: int = 128  # ... up to d64: the main entry's tile kv 128, no spills
    varlen_producer_regs: int = 112  # ... its producer's registers: the per-sequence copy state spilled below
    producer_regs: int = 72  # the cp.async producer's registers after setmaxnreg: it spilled below 72
    consumer_regs: int = 216  # the consumers' registers beside it (2 warpgroups)
    # the producer's registers with the tensor copy engine, by mask: the least that does not spill
    tma_producer_regs: dict = field(default_factory=lambda: {"none": 24, "causal": 32, "window": 32, "custom": 40},
                                    hash=False)
    # ... with Q by cp.async (no tma_q): its copy loop keeps addresses
    tma_kv_only_producer_regs: dict = field(
        default_factory=lambda: {"none": 24, "causal": 40, "window": 40, "custom": 56}, hash=False)
    cleaning_producer_regs: int = 32  # persistent blocks' producer at least: its redo of an item spilled at 24
    # FP8 prefill's producer, by mask (fp8.producer_regs): no redo (V^T comes cleaned), so 24, which leave the two
    # consumer warpgroups 240: with 232 ptxas serialised the d224 / d256 products (C7512); custom's producer
    # copies mask words and spills at 24: 40 up to d192 (232 serve those consumers), fp8_wide_custom_producer_regs
    # above (benchmarks/NOTES.md, 2026-11-28, "FP8 setmaxnreg")
    fp8_producer_regs: dict = field(default_factory=lambda: {"none": 24, "causal": 24, "window": 24, "custom": 40},
                                    hash=False)
    fp8_wide_custom_producer_regs: int = 24  # ... mask custom from d_v 208: spills in the producer, not serialised wgmma
    # FP8 prefill's auto tiles (fp8.fp8_tiles): (head-dim bound, (tile q, tile kv)), the first row that holds the
    # larger head dim, fp8_masked_tiles' rows first for a mask other than none; a spec's own `tile q=.. kv=..`
    # wins, and mask custom keeps tile kv 128 (its staged words). H200, one call beside cuDNN's FP8 (TFLOP/s
    # L4k full / causal, L16k full / causal; benchmarks/NOTES.md, 2026-11-28 sixteenth session, "FP8 tiles"):
    # d128 128 x 192 729 / 599 / 806 / 711 -> 781 / 631 / 859 / 795; d64 128 x 256 against 192 x 128: full
    # 470 -> 522, 566 -> 585, causal 417 -> 389, 530 -> 495 (so masked d64 keeps 192 x 128). The checker takes
    # tile q 64, 128 or 192 (to d64) and tile kv a multiple of 32 from 64 to 256 (V^T in column blocks of a
    # 128-, 64- or 32-byte swizzle); benchmarks/probes/probe_fp8.py --tiles compares them through this entry
    fp8_tiles: tuple = ((64, (128, 256)), (128, (128, 192)), (256, (128, 128)))
    fp8_masked_tiles: tuple = ((64, (192, 128)),)
    # FP8 head dims qk up to 64: Q and K tiles in 64-byte rows with the 64-byte swizzle (fp8.padded_fp8_qk), not
    # 128-byte rows half zeros: half their shared memory and of the tensor copies' writes (issue 44, d64)
    fp8_swizzle64: bool = False
    max_consumer_groups: int = 3  # consumer warpgroups a producer serves at most (q192: 160 registers each)
    mask_stage_words: int = 12  # a custom mask's words per row staged with K and V: 16-byte copies, no bank conflicts
    # which index-only mask expressions the overlapped loops (the producer family, wgmma with three
    # stages) list each work item's live K/V tiles for (family.lists_tiles): "holes" where
    # expr_blocks.has_holes finds some, "always", "never". Always: the list (one warp, a ballot per
    # 32 tiles) costs less than the consumers' serial scan of every tile for the key range (H100,
    # d128 f16, expression / named mask, key range vs list: causal L4k 1.17 vs 1.08, L16k 1.18 vs
    # 0.98; window 1024 L4k 1.37 vs 1.12, L16k 2.28 vs 1.12: benchmarks/NOTES.md, 2026-11-28)
    expr_tile_list: str = "always"
    tma_store: bool = True  # the output through shared memory with a tensor store, where sO fits beside the ring
    tma_store_above_d_v: int = 64  # ... above this head dim v (d64's short items were slower with it)
    persistent_blocks: str = "SM"  # blocks of a persistent grid: one per multiprocessor (grid symbol)
    causal_order_bytes: int = 16 << 20  # causal items longest first within (batch, head) groups of this much K/V: L2
    # -- what every kernel does with non-finite values, and the softmax
    clean_values: bool = True  # clean V's non-finite values where a row must not take them in (False: wrong then)
    clean_every_tile: bool = True  # the plain loop cleans in every tile with a weight of 0 (False: partial tiles only)
    rescale_slack: float = 8.0  # the lazy rescale: keep m_i until a tile's max passes it by this much (log2)
    rescale_slack_min_d_v: int = 128  # ... only from this many output columns, where acc is large

    def __post_init__(self):
        # setmaxnreg only moves registers within the launch's 65536 / 384 (a multiple of 8) per
        # thread, or the consumers' setmaxnreg.inc waits forever (it hung on the H100 at 48 / 232)
        if PRODUCER_THREADS * self.producer_regs + 256 * self.consumer_regs > 384 * (65536 // 384 // 8 * 8):
            raise ProfileError(f"CudaTiles: producer_regs={self.producer_regs} and consumer_regs="
                               f"{self.consumer_regs} exceed the registers of 384 threads")
        if self.expr_tile_list not in ("holes", "always", "never"):
            raise ProfileError(f"CudaTiles: expr_tile_list={self.expr_tile_list!r} is not one of 'holes', 'always', "
                               "'never'")


DEFAULT = CudaTiles()

def tiles_for(profile: Profile | None) -> CudaTiles:
    """The table a configuration of `profile` reads: DEFAULT with the profile's overrides (checked
    by name and type: attngen.plan.profiles.with_overrides)."""
    return with_overrides(DEFAULT, profile)
