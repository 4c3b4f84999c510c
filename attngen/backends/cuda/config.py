"""The CUDA tile configuration: tile sizes, warps, stages and the shared-memory layout.

The backend's configure(): the checker runs it once (a configuration that cannot work is a
Problem, with the bytes it needs and the limit) and the plan is built from what it returns.
Values the spec leaves at `auto` come from the profile's tuned defaults and are shrunk until
they fit; values the spec gives are never changed: if they do not fit, that is an error.
The choices it makes are data (tiles.py: the table of the profile, tiles_for); which kernel
family and which of its parts serve a spec is choices.py's (what each family's template renders: family.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...lang.spec import DTYPE_BYTES, AttentionSpec
from ...plan.kernel_plan import Problem, describe_buffers as _describe, place_buffers as _layout
from ...plan.profiles import Profile
from ...plan.schedule import pack_gqa
from .choices import (cuda_math, persistent_refusal, producer_registers, stored_p_refusal, swizzles_kv, takes_producer,
                      takes_split_qk, wgmma_refusal, wide_d_kv, wide_masked)
from . import kvquant
from .family import TILE_LIST_ENTRIES, TILE_LIST_HEAD, lists_tiles
from .tiles import (COLUMN_STEP, DEFAULT, PRODUCER_THREADS, ROWS_PER_WARP, WARPGROUP_ROWS, WGMMA_ALIGN, WGMMA_COLUMNS,
                    CudaTiles, padded_head_dim, tiles_for)


@dataclass(frozen=True)
class CudaConfig:
    math: str  # "wgmma" (Hopper warpgroup tensor cores), "mma" (tensor cores, f16/bf16) or "fma" (CUDA cores, f32)
    tile_q: int
    tile_kv: int
    warps: int  # per block: (tile_q / 16 / frags) row warps x key_warps
    stages: int
    d_qk: int
    d_v: int
    d_qk_pad: int  # head dims padded for the math (mma: multiple of 16)
    d_v_pad: int
    q_in_registers: bool
    buffers: tuple
    smem_bytes: int
    registers_estimate: int
    registers_cap: int
    # tile d: head-dim columns per shared-memory step, or None when the whole head dims sit in
    # shared memory at once. With a chunk, Q, K and V stream through shared memory chunk by chunk.
    chunk: int | None = None
    chunk_given: bool = False  # from the spec's `tile d=` (else chosen: the whole head dim did not fit)
    v_blocks: int = 1  # blocks per (batch, query head) along the output columns: grid.y = Hq * v_blocks
    d_v_block: int = 0  # output columns per block: a whole number of chunks (chunked), or d_v_pad (wgmma)
    # The plain kernel (fused, contiguous cache, structured mask, whole head dims) has a padded-only
    # path for launches without per-sequence lengths (no cu_seqlens, kv_lens or append): it keeps
    # the registers of the plain algorithm. Launches with them take `varlen`: the same tiles with
    # one 16-row fragment per warp (a block of warps x 16 rows), a separate entry point, so that
    # the extra per-sequence state does not spill registers; None: one entry point serves both.
    fast_path: bool = False
    varlen: "CudaConfig | None" = None
    # Why a profile that has the Hopper family (wgmma) does not use it for this spec ('' when it
    # does, or when the profile has none): `attngen check` shows it, never a silent fallback.
    family_note: str = ""
    # split_kv: warps over keys (CudaTiles.split_key_warps): every tile of tile_kv keys is divided
    # among key_warps warps that own the same rows; 1 everywhere else.
    key_warps: int = 1
    # Blocks one multiprocessor holds at once by shared memory (the profile's per-block limit
    # stands for the multiprocessor's): split_kv(auto) plans one wave of them.
    resident_blocks: int = 1
    # Hopper family: a producer warpgroup copies the tiles (warp specialisation, see
    # PRODUCER_THREADS); `warps` counts the consumer warps only.
    producer: bool = False
    # Persistent blocks (every producer kernel): one block per multiprocessor takes work items
    # (row tile, head, batch) one after the other, so that its producer copies the next item's Q
    # and first K/V tiles while its consumers finish the current one (CudaTiles.persistent_blocks).
    persistent: bool = False
    # ... with a grid of one block per work item (`persistent=off`): each block does its one row
    # tile, and again, cleaned, if its result is not finite.
    item_per_block: bool = False
    # Producer kernels: the K and V tiles come by the tensor copy engine (CudaTiles.tma_producer_regs).
    tma: bool = False
    # ... and Q too: one box of tile q rows of one query head (not where a block's rows span a
    # GQA group's heads, pack_gqa, nor with head dims in chunks).
    tma_q: bool = False
    # Split Q K^T (CudaTiles.split_qk): the two consumer warpgroups own the same tile q rows, each
    # with half of Q K^T's head dim and d_v_pad (= d_v_block / 2) of the block's output columns.
    split_qk: bool = False
    # mma.sync: the K and V tiles in 128-byte rows with permuted 16-byte chunks (CudaTiles.swizzle_kv).
    swizzle_kv: bool = False
    # Head dims above CudaTiles.q_whole_max_head_dim on the Hopper family: P through memory, two
    # phases per row tile (CudaTiles.stored_p_tiles); d_v_block is then the output columns of one
    # pass of phase B.
    stored_p: bool = False
    # The output through shared memory with a tensor store (CudaTiles.tma_store): a buffer sO and a
    # tensor map over out (tmap_o).
    tma_store: bool = False
    # The producer's registers after setmaxnreg where not producer_registers' rule (0): the _varlen
    # entry's producer, CudaTiles.varlen_producer_regs.
    producer_regs: int = 0
    # What the emitter prints from the tile table (tiles.py; set by cuda_config from the profile's
    # table, so that the plan, whose digest keys the disk cache, carries every value of the source):
    clean_values: bool = DEFAULT.clean_values  # CudaTiles.clean_values
    clean_every_tile: bool = DEFAULT.clean_every_tile  # CudaTiles.clean_every_tile
    causal_order_bytes: int = DEFAULT.causal_order_bytes  # kOrderBytes of persistent causal items
    stored_p_keys_a: int = DEFAULT.stored_p_tiles[1]  # P through memory: keys per tile of phase A
    mask_stage_words: int = DEFAULT.mask_stage_words  # a custom mask's words per row in sMask
    persistent_blocks: str = DEFAULT.persistent_blocks  # blocks of a persistent grid (a grid symbol)
    rescale_slack: float = 0.0  # kRescaleSlack: 0 rescales at every new max (rescale_slack_for)
    setmaxnreg: tuple = (255, 255)  # (producer, consumer) registers after setmaxnreg (family.producer_registers)
    # The overlapped loops (producer kernels, wgmma with three stages or more) of a mask expression:
    # each work item's live K/V tiles listed in shared memory (sTiles; family.lists_tiles,
    # CudaTiles.expr_tile_list)
    tile_list: bool = False
    # A quantized cache (`kv_dtype`, issue 44): K and V staged as their stored bytes (kvquant.py).
    kv_dtype: str | None = None
    fp8: bool = False  # FP8 prefill (fp8.py): FP8 products, V^T written by the _prepare_v entry, the producer kernel
    qk_swizzle: int = 128  # ... Q and K in rows of the 128- or 64-byte swizzle (CudaTiles.fp8_swizzle64)

    def __post_init__(self):
        # Every producer kernel runs the work-item code (templates/cuda/family_producer.j2 has no other producer
        # loop): its redo is the cleaning pass of a key of weight 0.
        if self.producer and not self.persistent:
            raise AssertionError("a producer kernel without the work-item code (CudaConfig.persistent)")

    @property
    def chunked(self) -> bool:
        return self.chunk is not None

    @property
    def chunk_summary(self) -> str:
        """How the head dims are tiled, in words (attngen check, source headers); '' unchunked."""
        if not self.chunked:
            return ""
        why = "from the spec" if self.chunk_given else "chosen: the whole head dim does not fit"
        text = f"tile d={self.chunk} ({why}): Q, K and V stream through shared memory {self.chunk} columns at a time"
        if self.v_blocks > 1:
            text += f"; out split over {self.v_blocks} blocks of {self.d_v_block} columns (grid.y = Hq x {self.v_blocks})"
        return text

    @property
    def column_step(self) -> int:
        """The head-dim columns its math works in (tiles.COLUMN_STEP): the head dims are padded to
        them, a chunk is a multiple of them, and the source asserts both (`pad` in config.j2)."""
        return COLUMN_STEP[self.math]

    @property
    def overlap(self) -> bool:
        """The Hopper family's main loop that runs the softmax of a tile while the tensor cores do
        the previous tile's P V (it needs a third K/V stage, or the producer warpgroup's ring of
        two: docs/cuda-variants.md)."""
        return self.math == "wgmma" and (self.stages >= 3 or self.producer)

    @property
    def threads(self) -> int:
        return self.warps * 32 + (PRODUCER_THREADS if self.producer else 0)

    @property
    def frags(self) -> int:
        """16-row fragments of Q per warp (1 or 2)."""
        return self.tile_q // (self.warps // self.key_warps // (2 if self.split_qk else 1) * ROWS_PER_WARP)

    @property
    def smem_summary(self) -> str:
        text = _describe(self.buffers)
        if self.math == "wgmma":
            text += f" + {WGMMA_ALIGN} bytes to align them to {WGMMA_ALIGN}"
        if not self.chunked and self.v_blocks > 1:
            return (f"{text}; out split over {self.v_blocks} blocks of {self.d_v_block} columns (grid.y = Hq x "
                    f"{self.v_blocks}), each with Q K^T over the whole head dim")
        if self.split_qk:
            return f"{text}; sX: the two warpgroups' halves of S, summed once per tile"
        return f"{text}; {self.chunk_summary}" if self.chunked else text

    def summary(self) -> str:
        """One line a person reads in `attngen check` and in source headers."""
        if self.stored_p:
            keys_a = self.stored_p_keys_a
            return (f"tile q={self.tile_q} kv={self.tile_kv}, {self.warps} consumer warps + a producer warpgroup "
                    f"({self.threads} threads), {self.stages} stage(s), Hopper tensor cores (wgmma m64n{keys_a}k16 and "
                    f"m64n{self.d_v_block}k16, 2 warpgroups of 64 rows, sm_90a); P through memory: phase A computes "
                    f"S = Q K^T in tiles of {keys_a} keys (Q and K in 64-column chunks by the tensor copy engine) and "
                    f"stores P to the block's workspace slot, phase B reads it back for P V, {self.d_v_block} output "
                    "columns at a time; persistent: one block per multiprocessor takes the row tiles in turn")
        k = "32 (FP8: e4m3 / e5m2 operands, V^T from the _prepare_v entry)" if self.fp8 else "16"
        math = {"wgmma": f"Hopper tensor cores (wgmma m64n{self.tile_kv}k{k[:2]} and m64n{self.d_v_pad}k{k}, "
                         + (f"2 warpgroups over the same 64 rows, each with half of Q K^T's head dim (S summed "
                            f"through shared memory) and {self.d_v_pad} output columns, sm_90a" if self.split_qk else
                            f"{self.warps // 4} warpgroup{'s' if self.warps > 4 else ''} of 64 rows, sm_90a")
                         + ("; softmax overlapped with P V" if self.overlap else "")
                         + ("; a producer warpgroup copies the tiles ("
                            + (("Q, K and V" if self.tma_q else "K and V") + " by the tensor copy engine, "
                               if self.tma else "") + "mbarriers, setmaxnreg"
                            + (", ping-pong" if self.warps >= 8 and not self.split_qk else "") + ")"
                            if self.producer else "") + ")",
                "mma": "tensor cores (mma.sync m16n8k16)", "fma": "CUDA cores (fma)"}[self.math]
        who = f"{self.warps} warps ({self.threads} threads), {self.stages} K/V stage(s), {math}"
        if self.producer:
            who = (f"{self.warps} consumer warps + a producer warpgroup ({self.threads} threads), {self.stages} K/V "
                   f"stage(s), {math}")
            if self.item_per_block:
                who += ("; one block per row tile (persistent=off), by the work-item code: a row tile whose result is "
                        "not finite is done again, cleaned")
            elif self.persistent:
                who += "; persistent: one block per multiprocessor takes the row tiles in turn"
        if self.key_warps > 1:
            who = (f"{self.warps} warps ({self.threads} threads; {self.key_warps} warps over the keys of each "
                   f"tile, {self.tile_kv // self.key_warps} keys each, merged at the end), {self.stages} K/V "
                   f"stage(s), {math}")
        return f"tile q={self.tile_q} kv={self.tile_kv}, {who}"

    @property
    def varlen_summary(self) -> str:
        """Which entry point a launch with per-sequence lengths takes, in words ('' when none)."""
        if self.varlen is None:
            return ""
        v = self.varlen
        if v.math != self.math:
            return (f"launches with cu_seqlens, kv_lens or an append: entry point _varlen on the mma.sync family, "
                    f"tile q={v.tile_q} kv={v.tile_kv}" + (f", {v.chunk_summary}" if v.chunked else "")
                    + f" ({v.smem_bytes} bytes of shared memory)")
        if v.math == "wgmma":
            return (f"launches with cu_seqlens, kv_lens or an append: entry point _varlen, tile q={v.tile_q} "
                    f"kv={v.tile_kv} ({v.smem_bytes} bytes of shared memory)")
        return (f"launches with cu_seqlens, kv_lens or an append: entry point _varlen, tile q={v.tile_q} "
                f"({v.frags} fragment per warp, {v.smem_bytes} bytes of shared memory)")


def _stored_p_config(spec: AttentionSpec, profile: Profile, t: CudaTiles) -> CudaConfig:
    """The configuration of P through memory (CudaTiles.stored_p_tiles): the stages that fit the profile's
    shared memory, and the mma.sync chunks for launches with per-sequence lengths (_varlen)."""
    tile_q, keys_a, tile_kv, cols, stages = t.stored_p_tiles
    d_qk_pad = padded_head_dim(spec.head_dim_qk, "wgmma")
    d_v_pad = padded_head_dim(spec.head_dim_v, "wgmma")
    limit = profile.limit("shared_memory_bytes")
    while True:
        buffers, smem = _layout([
            ("sRing", spec.dtype, stages, tile_q + keys_a, WGMMA_COLUMNS,
             f"a stage: phase A a 64-column chunk of Q ({tile_q} rows) and of K ({keys_a} keys), phase B a V tile "
             f"({tile_kv} keys x {cols} columns; 128-byte swizzle)"),
            ("sSync", "u32", 1, 1, 4 * stages, "mbarriers: full and empty per stage"),
        ])
        smem += WGMMA_ALIGN
        if smem <= limit or stages == 2:
            break
        stages -= 1
    if smem > limit:
        raise Problem(f"P through memory (head dims above {t.q_whole_max_head_dim}) needs {smem} bytes of shared "
                      f"memory for 2 stages ({_describe(buffers)}), but {profile.name} allows {limit}")
    _, consumer = producer_registers(t, True, "none", 8, True)
    return CudaConfig("wgmma", tile_q, tile_kv, 8, stages, spec.head_dim_qk, spec.head_dim_v, d_qk_pad, d_v_pad,
                      False, buffers, smem, 2 * cols // 4 + 48, consumer, v_blocks=1, d_v_block=cols,
                      fast_path=True, varlen=_cuda_config(spec, profile, "mma", t), resident_blocks=1, producer=True,
                      persistent=True, tma=True, tma_q=True, stored_p=True)


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _cuda_layout(t, spec, math, tile_q, tile_kv, stages, chunk, producer=False, persistent=False, tma=False,
                 d_v_cols=None, split_qk=False, o_stage=False):
    """Shared-memory buffers: the whole head dims (chunk None), or one chunk per pipeline stage.
    d_v_cols: the V columns of a block (wgmma output column blocks), when not the whole head dim;
    o_stage: the staging buffer of the tensor store (CudaTiles.tma_store)."""
    elem = spec.dtype
    if math == "wgmma":  # swizzled, no skew; whole 64-element blocks; 1024 bytes of alignment slack
        d_qk_pad = padded_head_dim(spec.head_dim_qk, math)
        d_v_pad = d_v_cols or padded_head_dim(spec.head_dim_v, math)
        entries = [
            ("sQ", elem, 1, tile_q, d_qk_pad, "the block's rows of Q (128-byte swizzle)"),
            ("sK", elem, stages, tile_kv, d_qk_pad, "K tiles, one per pipeline stage (128-byte swizzle)"),
            ("sV", elem, stages, tile_kv, d_v_pad, "V tiles, one per pipeline stage (128-byte swizzle)"),
        ]
        if split_qk:  # two tiles' halves of S from each warpgroup, f32 (CudaTiles.split_qk)
            entries.append(("sX", "f32", 2, 2 * tile_q, tile_kv,
                            "each warpgroup's half of S = Q K^T, alternating by tile (split Q K^T)"))
        if o_stage:  # the output tile staged for the tensor store (CudaTiles.tma_store)
            entries.append(("sO", elem, 1, tile_q, d_v_pad, "the output tile, staged for the tensor store (64-column blocks)"))
        if producer and spec.mask.is_custom:  # a boolean mask's words of each stage's partial tile
            entries.append(("sMask", "u32", stages, tile_q, t.mask_stage_words,
                            "a boolean mask's words of each stage's partial tile (8 per row: 256 keys, padded)"))
        if (producer or stages >= 3) and lists_tiles(spec, t, tile_q, tile_kv):  # the overlapped loops' list
            entries.append(("sTiles", "u32", 1, 1, TILE_LIST_HEAD + TILE_LIST_ENTRIES,
                            "a work item's live K/V tiles of a mask expression with holes (their count first)"))
        if producer:  # mbarriers (8 bytes: Q, then full and empty per stage) and each stage's bad-key bits;
            # persistent blocks: one more mbarrier (Q free), four item slots of 4 words, four redo
            # flags and two more mbarriers (the items' checks)
            # (with the tensor copy engine, a third mbarrier per stage after the bits: a cleaned tile's landing)
            words = 2 * (1 + 2 * stages) + (26 if persistent else 0) + stages * -(-tile_kv // 32)
            if tma:
                words += 1 + 2 * stages
            entries.append(("sSync", "u32", 1, 1, words,
                            "mbarriers of the copies" + (", the work items" if persistent else "")
                            + " and each stage's keys with non-finite values"))
        buffers, smem = _layout(entries)
        return buffers, smem + WGMMA_ALIGN
    skew = t.row_skew_bytes // DTYPE_BYTES[elem]
    if chunk is None:
        d_qk_pad, d_v_pad = padded_head_dim(spec.head_dim_qk, math), padded_head_dim(spec.head_dim_v, math)
        swz = swizzles_kv(spec, math, chunk, t)
        kv_skew, kv_note = (0, "; 128-byte rows, chunks permuted") if swz else (skew, "")
        entries = [
            ("sQ", elem, 1, tile_q, d_qk_pad + skew, "the block's rows of Q"),
            ("sK", elem, stages, tile_kv, d_qk_pad + kv_skew, "K tiles, one per pipeline stage" + kv_note),
            ("sV", elem, stages, tile_kv, d_v_pad + kv_skew, "V tiles, one per pipeline stage" + kv_note),
        ]
        if spec.kv_dtype is not None:  # a quantized cache: its bytes as stored (kvquant.py)
            entries[1:] = kvquant.layout_entries(spec, math, stages, tile_kv, d_qk_pad, d_v_pad, t.row_skew_bytes, swz)
    else:
        entries = [
            ("sQ", elem, stages, tile_q, chunk + skew, "a chunk of the block's rows of Q, one per stage"),
            ("sKV", elem, stages, tile_kv, chunk + skew,
             "a chunk of the K tile (Q K^T steps) or of the V tile (P V steps), one per stage"),
        ]
    if math == "fma":
        entries.append(("sP", "f32", 1, tile_q, tile_kv + 4, "probabilities P of the current tile"))
    return _layout(entries)


def _cuda_registers(math, frags, tile_kv, d_qk_pad, d_v_pad, q_in_registers):
    """Estimated 32-bit registers per thread, calibrated on ptxas -v reports for sm_90.

    Per 16-row fragment: the accumulator (16 rows x d_v over 32 lanes), the scores and their
    exponentials, the Q fragments when they stay in registers; the K rows the CUDA-core path
    holds per step; and about 48 for addresses, loop state and the softmax statistics.
    """
    if math == "wgmma":  # S, P packed in pairs, acc: 16 rows of each over a warp's 32 lanes
        return tile_kv // 2 + tile_kv // 4 + d_v_pad // 2 + 80  # (242 measured at d128 kv128)
    acc = frags * d_v_pad // 2
    scores = frags * tile_kv * 3 // 2
    q = frags * d_qk_pad // 4 if q_in_registers else 0
    k_rows = tile_kv if math == "fma" else 0
    return acc + scores + q + k_rows + 48


def cuda_register_cap(profile: Profile, threads: int) -> int:
    """Registers one thread may use when `threads` threads share the block's register file."""
    per_thread = profile.limit("registers_per_block") // threads // 8 * 8
    return min(profile.limit("registers_per_thread"), per_thread)


def _cuda_rows(given_q, given_w, row):
    """(tile_q, warps) from the spec's tile q and warps (else the profile's default row): each
    warp owns 16 or 32 rows."""
    if given_q is not None and given_q % ROWS_PER_WARP:
        raise Problem(f"tile q={given_q} is not a multiple of {ROWS_PER_WARP} (a warp owns "
                          f"whole {ROWS_PER_WARP}-row fragments of Q)", hint="try tile q=64 or q=128")
    if given_q is not None and given_w is not None:
        if given_q % given_w or (given_q // given_w) not in (16, 32):
            raise Problem(f"tile q={given_q} over warps={given_w} gives {given_q / given_w:g} rows per "
                              "warp; each warp owns 16 or 32 rows of Q", key="target.cuda",
                              hint=f"use warps={given_q // 16} or warps={given_q // 32}"
                              if given_q % 32 == 0 else f"use warps={given_q // 16}")
        return given_q, given_w
    if given_w is not None:
        return given_w * ROWS_PER_WARP, given_w
    if given_q is None and "warps" in row:
        return row["tile_q"], row["warps"]
    tile_q = given_q if given_q is not None else row["tile_q"]
    # Up to 8 warps of one fragment each; larger tiles give each warp two fragments.
    frags = 2 if tile_q > 128 and tile_q % 32 == 0 else 1
    return tile_q, tile_q // (ROWS_PER_WARP * frags)


def _smaller(*options) -> str | None:
    """A hint naming only the changes that are still possible: (words, possible) pairs."""
    words = [w for w, ok in options if ok]
    return "use " + (", or ".join(words)) if words else None


def _cuda_v_split(d_v: int, chunk: int, cap: int) -> tuple[int, int]:
    """(v_blocks, d_v_block): the output columns over the fewest blocks of at most `cap` columns,
    each a whole number of chunks (the last block's columns past d_v are computed, not stored)."""
    cap = max(chunk, cap // chunk * chunk)
    blocks = -(-d_v // cap)
    d_v_block = _round_up(-(-d_v // blocks), chunk)
    return -(-d_v // d_v_block), d_v_block


def _cuda_default_chunk(spec: AttentionSpec, math: str, t: CudaTiles) -> int:
    """The candidate chunk with the least estimated work: the head-dim columns computed (padding
    to whole chunks, Q K^T once per output block) plus, per shared-memory step, a fixed cost
    (barriers, copy latency) of about CudaTiles.step_cost_columns columns. Ties go to the larger chunk."""
    def work(chunk):
        v_blocks, d_v_block = _cuda_v_split(spec.head_dim_v, chunk, t.max_block_columns)
        columns = v_blocks * (_round_up(spec.head_dim_qk, chunk) + d_v_block)
        return columns * (chunk + t.step_cost_columns) / chunk
    return min(t.chunk_candidates[math], key=work)


def _cuda_check_chunk(spec: AttentionSpec, math: str, chunk: int, t: CudaTiles) -> None:
    """A `tile d` the spec gives is used as is, or refused with the reason."""
    align = COLUMN_STEP[math]  # (the language already wants a multiple of 8, at most the head dim)
    if chunk % align:
        why = ("the k of the tensor-core product m16n8k16" if math == "mma"
               else "the 8-column output tiles of the CUDA-core path")
        widest = max(spec.head_dim_qk, spec.head_dim_v)
        hint = (f"leave d out: head dim {widest} fits whole" if chunk >= widest
                else f"try tile d={max(align, chunk // align * align)} or d=64")
        raise Problem(f"tile d={chunk} is not a multiple of {align} ({why})", hint=hint)
    if chunk > t.max_block_columns:
        raise Problem(f"tile d={chunk} is too large (at most {t.max_block_columns}: a block keeps at most "
                          f"{t.max_block_columns} output columns in registers, a whole number of chunks)",
                          hint="try tile d=64")


def _producer_wide_d_tile(spec: AttentionSpec, profile: Profile, t: CudaTiles, masked: bool = False) -> tuple[int, int]:
    """(tile kv, stages) of the auto tile of a producer kernel above head dim 128: the first of
    CudaTiles.wide_d_tiles's options for the head dim whose buffers fit (up to d256, where the
    whole head dims sit in shared memory; above, the only option, which _cuda_fit places);
    `masked`: a window, custom mask or softcap, CudaTiles.wide_masked_tiles."""
    dmax = max(spec.head_dim_qk, spec.head_dim_v)
    options = (t.wide_masked_tiles if masked
               else next(opts for d, opts in t.wide_d_tiles if dmax <= d))
    d_v_cols = None  # (above 256: the block's output columns)
    if padded_head_dim(spec.head_dim_v, "wgmma") > t.max_block_columns:
        d_v_cols = _cuda_v_split(spec.head_dim_v, WGMMA_COLUMNS, t.max_block_columns)[1]
    for kv, stages in options[:-1]:
        if _cuda_layout(t, spec, "wgmma", 2 * WARPGROUP_ROWS, kv, stages, None, True, True, True,
                        d_v_cols)[1] <= profile.limit("shared_memory_bytes"):
            return kv, stages
    return options[-1]


def cuda_config(spec: AttentionSpec, profile: Profile) -> CudaConfig:
    """Resolve tiles for CUDA; raise Problem if the spec's own choices cannot work.

    Head dims up to CudaTiles.max_block_columns sit in shared memory whole when they fit; otherwise (or
    when the spec gives `tile d`) they stream through it in chunks.
    """
    t = tiles_for(profile)
    if spec.is_fp8:  # (the producer kernel with the tensor copy engine and persistent blocks: fp8.fp8_config)
        from . import fp8
        f, c = fp8.fp8_config(spec, profile, t), "wgmma"
        warps, d_qk, d_v = f["tile_q"] // ROWS_PER_WARP, f["d_qk_pad"], f["d_v_pad"]
        return _with_table(CudaConfig(
            c, f["tile_q"], f["tile_kv"], warps, f["stages"], spec.head_dim_qk, spec.head_dim_v, d_qk, d_v, False,
            f["buffers"], f["smem"], _cuda_registers(c, 1, f["tile_kv"], d_qk, d_v, False),
            producer_registers(t, True, spec.mask.kind, warps, True, True, f["producer_regs"])[1], d_v_block=d_v,
            resident_blocks=f["resident_blocks"], producer=True, persistent=True, item_per_block=f["item_per_block"],
            tma=True, tma_q=True, tma_store=f["tma_store"], producer_regs=f["producer_regs"], fp8=True,
            qk_swizzle=f["qk_swizzle"]), spec, t)
    return _with_table(_cuda_config_of(spec, profile, t), spec, t)


def _cuda_config_of(spec: AttentionSpec, profile: Profile, t: CudaTiles) -> CudaConfig:
    math = cuda_math(spec, profile, t)
    note = wgmma_refusal(spec, profile, t) or ""
    for opt, what in (("producer", "the producer warpgroup"), ("persistent", "persistent blocks"),
                      ("tma", "the tensor copy engine's tiles")):
        if math != "wgmma" and spec.options("cuda").get(opt) == "on":
            why = note or f"{profile.name} has no Hopper wgmma family"
            raise Problem(f"{opt}=on: {what} belong{'s' if opt == 'producer' else ''} to the Hopper wgmma family, "
                          f"which this spec does not use on {profile.name} ({why})", key="target.cuda",
                          hint=f"leave {opt} out, or build for cuda-sm90")
    dmax = max(spec.head_dim_qk, spec.head_dim_v)
    if (math == "wgmma" and dmax > t.stored_p_above_head_dim
            and (dmax > t.q_whole_max_head_dim or stored_p_refusal(spec) is None)):
        return _stored_p_config(spec, profile, t)
    if math == "wgmma":
        kv = rows = None
        opts = spec.options("cuda")
        row = profile.default_row(dmax, math)
        if spec.tile.kv is None:  # masks with more per-element state take a narrower tile kv
            # (a score expression as softcap, a mask expression as custom: per-element state)
            cap = t.wgmma_max_kv_by_mask.get("softcap" if spec.softcap is not None or spec.score is not None else
                                             "custom" if spec.mask.kind == "expr" else spec.mask.kind)
            if (spec.mask.kind == "window" and spec.softcap is None and dmax <= 128 and spec.tile.q is None
                    and row["tile_q"] == 2 * WARPGROUP_ROWS and opts.get("producer") != "off"):
                cap = t.producer_masked_max_kv  # the widest tile kv with which auto adds the producer
            if cap is not None and row["tile_kv"] > cap:
                kv = (cap, opts.get("stages"))
        if (spec.mask.kind == "causal" and dmax <= t.causal_tiles[-1][0] and spec.tile.q is None
                and spec.tile.kv is None and opts.get("warps") is None):
            tq, tkv, tst = next(tile for d, tile in t.causal_tiles if dmax <= d)
            rows, kv = (tq, tq // ROWS_PER_WARP), (tkv, opts.get("stages") or tst)
        wide_kv_auto = wide_d_kv(spec, t) if dmax > 128 else None
        masked_wide = wide_masked(spec, t)
        if ((wide_kv_auto is not None or masked_wide) and spec.tile.q is None and spec.tile.kv is None
                and opts.get("warps") is None and opts.get("producer") != "off"):
            tkv, stages = _producer_wide_d_tile(spec, profile, t, masked=masked_wide)
            rows, kv = (2 * WARPGROUP_ROWS, 2 * WARPGROUP_ROWS // ROWS_PER_WARP), (tkv, opts.get("stages") or stages)
        wide_d, (wide_q, wide_kv) = t.three_group_tiles
        if (spec.mask.kind == "none" and spec.softcap is None and spec.score is None and dmax <= wide_d
                and spec.tile.q is None
                and spec.tile.kv is None and opts.get("warps") is None and opts.get("producer") != "off"
                and opts.get("tma") != "off"):
            rows, kv = (wide_q, wide_q // ROWS_PER_WARP), (wide_kv, opts.get("stages"))
        if (takes_split_qk(spec, t) and spec.tile.q is None and spec.tile.kv is None and opts.get("warps") is None
                and opts.get("stages") is None):
            # the first tile kv and stages (CudaTiles.split_qk_tiles) that fit beside Q and the halves of S
            # (a spec's own tiles are kept: they take the column blocks below)
            cfg = None
            for cand, st in t.split_qk_tiles:
                try:
                    cfg = _cuda_fit(spec, profile, math, None, t, rows=rows, kv=(cand, st), producer=True,
                                    split_qk=True)
                except Problem:
                    continue
                if cfg.producer:
                    break
            if cfg is None:  # none fits this profile's shared memory: the column blocks' Problem says why
                cfg = _cuda_fit(spec, profile, math, None, t, rows=rows, kv=kv, producer=True)
        else:
            cfg = _cuda_fit(spec, profile, math, None, t, rows=rows, kv=kv, producer=True)
        if (dmax <= t.q128_only_with_producer_max_d and spec.tile.q is None
                and opts.get("warps") is None and cfg.tile_q > WARPGROUP_ROWS and not cfg.producer):
            # tile q 128 pays only with the producer: without it (softcap, producer=off) q64, and
            # the causal tiles by head dim (rows set above) q64 kv64, their former default
            if rows is not None:
                kv = (WARPGROUP_ROWS, opts.get("stages"))
            rows = (WARPGROUP_ROWS, WARPGROUP_ROWS // ROWS_PER_WARP)
            cfg = _cuda_fit(spec, profile, math, None, t, rows=rows, kv=kv, producer=True)
        if dmax > 256 and not cfg.producer:
            raise Problem(f"head dim {dmax} on the wgmma family needs the producer warpgroup, which needs 2 K/V stages; "
                          f"tile q={cfg.tile_q} kv={cfg.tile_kv} fits {cfg.stages}", key="target.cuda",
                          hint="leave tile kv and stages out (the planner picks the widest tile kv that fits two stages)")
        if opts.get("tma") == "on" and not cfg.tma:
            raise Problem("tma=on: the tensor copy engine brings the producer warpgroup's tiles, and this plan "
                          "has no producer", key="target.cuda", hint="add producer=on, or leave tma out")
        if opts.get("persistent") == "on" and not cfg.persistent:
            why = persistent_refusal(spec, cfg.producer)
            raise Problem(f"persistent=on: {why}", key="target.cuda",
                          hint="add producer=on, or leave persistent out")
        if spec.mask.is_custom:
            if not cfg.producer:  # one general instantiation serves every launch
                return cfg
            # The producer kernel takes launches without per-sequence lengths; the _varlen entry
            # keeps the same tiles (a BlockMask is classified for the kernel's tile q x tile kv)
            # on the plain overlapped loop.
            varlen = _cuda_fit(spec, profile, math, None, t, rows=(cfg.tile_q, cfg.warps), kv=(cfg.tile_kv, cfg.stages))
            return replace(cfg, fast_path=True, varlen=varlen)
        if dmax > 256:
            # Head dims above 256 (CudaTiles.wide_d_tiles): launches with per-sequence lengths take
            # the mma.sync family's chunked head dims in the _varlen entry point.
            return replace(cfg, fast_path=True, varlen=_cuda_config(spec, profile, "mma", t))
        if cfg.producer and dmax <= t.varlen_producer_max_d:
            # Launches with per-sequence lengths (CudaTiles.varlen_producer_max_d): the same tiles with the
            # producer, persistent blocks, and copies by cp.async (packed rows are not one tensor map)
            # (three consumer warpgroups, q192, were measured with the tensor copy engine only: q128)
            vrows = (cfg.tile_q, cfg.warps) if cfg.tile_q <= 2 * WARPGROUP_ROWS else (
                2 * WARPGROUP_ROWS, 2 * WARPGROUP_ROWS // ROWS_PER_WARP)
            kv_max = (t.varlen_producer_max_kv if spec.head_dim_qk == spec.head_dim_v
                      and spec.head_dim_qk in t.varlen_producer_kv_dims else t.varlen_producer_max_kv_other)
            if dmax <= 64:
                kv_max = t.varlen_producer_max_kv_narrow
            varlen = _cuda_fit(spec, profile, math, None, t, rows=vrows,
                               kv=(min(cfg.tile_kv, kv_max), cfg.stages), producer=True, tma_ok=False)
            if varlen.producer:
                return replace(cfg, fast_path=True, varlen=replace(varlen, producer_regs=t.varlen_producer_regs))
        # Launches with per-sequence lengths take the _varlen entry point: the same family with
        # a smaller tile kv (64, or 32 above head dim 128), so that the per-sequence state does
        # not spill registers (ptxas reports, benchmarks/NOTES.md).
        kv_cap = 64 if max(cfg.d_qk_pad, cfg.d_v_pad) <= 128 else 32
        vrows = (cfg.tile_q, cfg.warps)
        if rows is not None or (dmax <= t.q128_only_with_producer_max_d and spec.tile.q is None
                                and opts.get("warps") is None):
            # auto causal tiles, and head dims that take q128 only with the producer: the entry
            # point (which has none) keeps q64
            vrows = (WARPGROUP_ROWS, WARPGROUP_ROWS // ROWS_PER_WARP)
        # (above d128 two stages: the main entry's third stage (CudaTiles.wide_d_tiles) would turn the
        # _varlen entry's plain loop into the overlapped one, which spills there)
        vstages = min(cfg.stages, 2) if dmax > 128 and opts.get("stages") is None else cfg.stages
        varlen = _cuda_fit(spec, profile, math, None, t, rows=vrows, kv=(min(cfg.tile_kv, kv_cap), vstages))
        return replace(cfg, fast_path=True, varlen=varlen)
    if note:
        return replace(_cuda_config(spec, profile, math, t), family_note=note)
    return _cuda_config(spec, profile, math, t)


def _cuda_config(spec: AttentionSpec, profile: Profile, math: str, t: CudaTiles) -> CudaConfig:
    if spec.kv_dtype is not None:  # whole head dims only: its tiles are decoded by row
        kvquant.refuse_chunks(spec, t.max_block_columns)
    elif spec.tile.d is not None:
        _cuda_check_chunk(spec, math, spec.tile.d, t)
        return _cuda_fit(spec, profile, math, spec.tile.d, t)
    chunk = None if spec.kv_dtype is not None else _cuda_default_chunk(spec, math, t)  # (kv: no chunks to take)
    if max(spec.head_dim_qk, spec.head_dim_v) > t.max_block_columns:
        return _cuda_fit(spec, profile, math, chunk, t)
    try:
        cfg = _cuda_fit(spec, profile, math, None, t)
    except Problem as whole:
        try:
            return _cuda_fit(spec, profile, math, chunk, t)
        except Problem:
            raise whole from None  # chunks do not help either: report the plain configuration
    one_frag = None  # the configuration with one 16-row fragment per warp
    if cfg.frags > 1:
        one_frag = _cuda_fit(spec, profile, math, None, t, rows=(cfg.warps * ROWS_PER_WARP, cfg.warps),
                             kv=(cfg.tile_kv, cfg.stages))
    if spec.schedule.is_split or spec.kv_cache.is_paged or spec.mask.is_custom:
        # One general instantiation serves every launch of these kinds; with its per-sequence state,
        # two fragments per warp spill registers, so auto tiles take one (the spec's own are kept).
        auto_rows = spec.tile.q is None and spec.options("cuda").get("warps") is None
        return one_frag if one_frag is not None and auto_rows else cfg
    return replace(cfg, fast_path=True, varlen=one_frag)


def _cuda_fit(spec: AttentionSpec, profile: Profile, math: str, chunk: int | None, t: CudaTiles, rows=None,
              kv=None, producer=False, split_qk=False, tma_ok=True) -> CudaConfig:
    """Tiles for one way of holding the head dims (whole, or `chunk` columns at a time); `rows`
    (tile q, warps) and `kv` (tile kv, stages) fix those instead of the spec (the varlen path);
    `producer`: the Hopper family may take a producer warpgroup (_cuda_producer decides);
    `tma_ok` False: its copies by cp.async (the _varlen entry: rows of packed sequences)."""
    big = max(spec.head_dim_qk, spec.head_dim_v)
    row = profile.default_row(big, math)
    if spec.schedule.is_split:
        # Split schedules serve decode: a block's rows are (query row, head in group) pairs, a few
        # per KV head, so one warp of CudaTiles.split_tile_q rows; the splits give the parallelism.
        row = {**row, "tile_q": t.split_tile_q, "warps": 1, "tile_kv": t.split_tile_kv, "stages": 2}
        if chunk is not None:  # head dims in chunks: CudaTiles.split_chunked_tile_kv
            group_rows = ROWS_PER_WARP * -(-(spec.group_size or 1) // ROWS_PER_WARP)
            group_rows = min(t.split_chunked_max_tile_q, group_rows)
            row.update(tile_q=group_rows, warps=group_rows // ROWS_PER_WARP, tile_kv=t.split_chunked_tile_kv)
    opts = spec.options("cuda")
    given_q, given_kv, given_w, given_st = spec.tile.q, spec.tile.kv, opts.get("warps"), opts.get("stages")
    if rows is not None:
        given_q, given_w = rows
    if kv is not None:
        given_kv, given_st = kv

    key_warps = _cuda_key_warps(spec, math, chunk, opts.get("key_warps"), t)
    if key_warps > 1 and given_kv is None:
        given_kv = row["tile_kv"] * key_warps  # each warp keeps the one-warp tile's keys
    if given_kv is not None and given_kv % (16 * key_warps):
        raise Problem(f"tile kv={given_kv} over key_warps={key_warps} gives {given_kv / key_warps:g} keys per "
                      "warp; each warp's keys must be a multiple of 16 (the k of P V)", key="target.cuda",
                      hint=f"use tile kv={16 * key_warps * max(1, given_kv // (16 * key_warps))}")
    if given_kv is not None and given_kv % 16:
        raise Problem(f"tile kv={given_kv} is not a multiple of 16 (the k dimension of the "
                          "tensor-core product P V)", hint="try tile kv=32 or kv=64")
    if given_kv is not None and given_kv > 256:
        raise Problem(f"tile kv={given_kv} is too large (at most 256)", hint="try tile kv=64")
    if math == "wgmma":  # one 16-row fragment per warp, whole warpgroups
        tile_q = given_q if given_q is not None else (given_w * ROWS_PER_WARP if given_w else row["tile_q"])
        warps = tile_q // ROWS_PER_WARP
        if split_qk:  # two consumer warpgroups over the same 64 rows (CudaTiles.split_qk)
            tile_q, warps = WARPGROUP_ROWS, 2 * WARPGROUP_ROWS // ROWS_PER_WARP
    else:
        tile_q, warps = _cuda_rows(given_q, given_w, row)
    threads_limit = min(profile.limit("threads_per_block"), 512)
    if warps * 32 > threads_limit or tile_q > 256:
        raise Problem(f"tile q={tile_q} with warps={warps} needs {warps * 32} threads; at most "
                      f"{threads_limit} threads and 256 rows per block",
                      key="tile" if given_q else "target.cuda",
                      hint=f"use warps={min(threads_limit // 32, 256 * warps // tile_q)} or fewer"
                      if given_w and not given_q else "use tile q=128 or less")
    if warps * key_warps * 32 > threads_limit:
        raise Problem(f"key_warps={key_warps} gives {warps * key_warps} warps ({warps * key_warps * 32} threads); "
                      f"at most {threads_limit} threads per block", key="target.cuda",
                      hint=f"use key_warps={max(1, threads_limit // 32 // warps)} or less")
    tile_kv = given_kv if given_kv is not None else row["tile_kv"]
    stages = given_st if given_st is not None else row["stages"]
    if stages > 4:
        raise Problem(f"stages={stages}: at most 4 K/V pipeline stages", key="target.cuda")

    v_cap = t.max_block_columns  # output columns per block; shrinks (more blocks) as a last resort
    while True:
        frags = 1 if split_qk else tile_q // (warps * ROWS_PER_WARP)
        if chunk is None:
            d_qk_pad, d_v_pad = padded_head_dim(spec.head_dim_qk, math), padded_head_dim(spec.head_dim_v, math)
            v_blocks, d_v_block = 1, d_v_pad
            if split_qk:  # each warpgroup half of the block's columns (CudaTiles.split_qk)
                v_blocks, d_v_block = _cuda_v_split(spec.head_dim_v, 2 * WGMMA_COLUMNS, 2 * t.max_block_columns)
                d_v_pad = d_v_block // 2  # a warpgroup's columns: its acc and the N of its P V
            elif math == "wgmma" and d_v_pad > t.max_block_columns:  # output column blocks (q_whole_max_head_dim)
                v_blocks, d_v_block = _cuda_v_split(spec.head_dim_v, WGMMA_COLUMNS, t.max_block_columns)
                d_v_pad = d_v_block  # the block's columns: its V tiles, acc and the N of P V
            q_in_regs = math == "mma" and frags * padded_head_dim(spec.head_dim_qk, "mma") <= 128
        else:  # Q streams through shared memory with K; the block keeps d_v_block output columns
            v_blocks, d_v_block = _cuda_v_split(spec.head_dim_v, chunk, v_cap)
            d_qk_pad, d_v_pad = _round_up(spec.head_dim_qk, chunk), v_blocks * d_v_block
            q_in_regs = False
        ws = producer and math == "wgmma" and takes_producer(spec, tile_q, tile_kv, stages, t)
        # Every producer kernel runs the work-item code (CudaConfig.persistent): persistent blocks,
        # or with persistent=off a grid of one block per item, so that a block whose result is not
        # finite still does its item again, cleaned (docs/language.md, "A key of weight 0 adds nothing")
        persist = bool(ws) and persistent_refusal(spec, ws) is None
        item_per_block = persist and opts.get("persistent") == "off"
        tma = ws and opts.get("tma") != "off" and tma_ok
        tma_q = tma and chunk is None and not pack_gqa(spec)
        buffers, smem = _cuda_layout(t, spec, math, tile_q, tile_kv, stages, chunk, ws, persist, tma,
                                     d_v_block if chunk is None else None, split_qk)
        regs = _cuda_registers(math, frags, tile_kv // key_warps, d_qk_pad, d_v_pad if split_qk else d_v_block,
                               q_in_regs)
        # with a producer warpgroup, setmaxnreg gives the consumers their registers (producer_registers)
        reg_cap = (producer_registers(t, tma, spec.mask.kind, warps, tma_q, persist)[1] if ws
                   else cuda_register_cap(profile, warps * key_warps * 32))
        # A little spilling is slower, not wrong: the profile's measured defaults and the spec's
        # own choices may exceed the estimate's cap, but not pathologically (CudaTiles.spill_factor).
        if smem <= profile.limit("shared_memory_bytes") and regs <= reg_cap * t.spill_factor:
            break
        if given_kv is None and tile_kv > 16 * key_warps:
            tile_kv //= 2
        elif given_st is None and stages > 1:
            stages -= 1
        elif given_q is None and given_w is None and tile_q > (WARPGROUP_ROWS if math == "wgmma" else 16):
            tile_q //= 2
            warps = tile_q // ROWS_PER_WARP
        elif chunk is not None and d_v_block > chunk:
            v_cap = d_v_block - chunk
        else:
            break
    limit = profile.limit("shared_memory_bytes")
    dims = f"head_dim qk={spec.head_dim_qk} v={spec.head_dim_v}"
    if chunk is not None:
        dims += f" in chunks of d={chunk}"
    if smem > limit:
        raise Problem(
            f"tile q={tile_q} kv={tile_kv} with {stages} stage(s) and {dims} "
            f"needs {smem} bytes of shared memory ({_describe(buffers)}), but "
            f"{profile.name} allows {limit}",
            hint=_smaller(("a smaller tile kv", tile_kv > 16), ("a smaller tile q", tile_q > 16),
                          (f"fewer stages (target cuda {{ stages={stages - 1} }})", stages > 1),
                          ("a smaller tile d", chunk is not None and chunk > COLUMN_STEP[math])))
    if regs > reg_cap * t.spill_factor:
        cols = f"head_dim v={spec.head_dim_v}" if chunk is None else f"{d_v_block} output columns per block"
        raise Problem(
            f"tile q={tile_q} kv={tile_kv} on {warps} warps with {cols} needs "
            f"about {regs} registers per thread for scores and accumulators, but {warps * 32} "
            f"threads may use at most {reg_cap} each (more than {t.spill_factor:g}x would spill "
            "most of them to local memory)",
            hint=_smaller(("a smaller tile kv", tile_kv > 16), ("more warps (16 rows each)", tile_q // warps > 16))
            or "use a smaller head dim v or tile d")
    tma_store = False
    # (three consumer warpgroups with a mask keep the direct stores: at 160 registers the staging
    # spilled 4-8 bytes, causal q192 kv128 with producer=on)
    if (t.tma_store and tma_q and v_blocks == 1 and not split_qk and chunk is None
            and spec.head_dim_v > t.tma_store_above_d_v
            and not (tile_q == 3 * WARPGROUP_ROWS and spec.mask.kind != "none")):
        o_buffers, o_smem = _cuda_layout(t, spec, math, tile_q, tile_kv, stages, chunk, ws, persist, tma, d_v_block,
                                         split_qk, o_stage=True)
        if o_smem <= limit:  # (never at the cost of a smaller tile: only where sO fits beside it)
            buffers, smem, tma_store = o_buffers, o_smem, True
    return CudaConfig(math, tile_q, tile_kv, warps * key_warps, stages, spec.head_dim_qk, spec.head_dim_v,
                      d_qk_pad, d_v_pad, q_in_regs, buffers, smem, regs, reg_cap, tma_store=tma_store,
                      chunk=chunk, chunk_given=spec.tile.d is not None, v_blocks=v_blocks,
                      d_v_block=d_v_block, key_warps=key_warps, resident_blocks=max(1, limit // smem),
                      producer=ws, persistent=persist, item_per_block=item_per_block, tma=tma,
                      tma_q=tma_q, split_qk=split_qk, swizzle_kv=swizzles_kv(spec, math, chunk, t),
                      tile_list=math == "wgmma" and (bool(ws) or stages >= 3) and lists_tiles(spec, t, tile_q, tile_kv),
                      kv_dtype=spec.kv_dtype)


def _cuda_key_warps(spec: AttentionSpec, math: str, chunk: int | None, given: int | None, t: CudaTiles) -> int:
    """Warps over the keys of each tile (split_kv only): the spec's `key_warps`, else the
    default; a given value the kernel cannot honour is refused with the reason."""
    why = None
    if not spec.schedule.is_split:
        why = "warps over keys serve the split decode schedules (split_kv), whose blocks have one warp of rows"
    elif spec.schedule.is_two_pass:
        why = "schedule two_pass keeps one warp per block (its passes store per-row statistics)"
    elif chunk is not None:
        why = "head dims streamed in chunks (tile d) keep one warp per block"
    elif math != "mma":
        why = "f32 storage (CUDA cores) keeps one warp per block"
    if why is not None:
        if given is not None and given > 1:
            raise Problem(f"key_warps={given}: {why}", key="target.cuda", hint="leave key_warps out")
        return 1
    return given if given is not None else t.split_key_warps


configure = cuda_config  # the backend's configure() (attngen.backends.base.Backend)


def rescale_slack_for(spec: AttentionSpec, t: CudaTiles) -> float:
    """kRescaleSlack of the spec's kernels: CudaTiles.rescale_slack, or 0 (rescale at every new max) with
    f16 accumulators, the two_pass schedule, or fewer than CudaTiles.rescale_slack_min_d_v output columns."""
    if ("f16" in (spec.acc_qk, spec.acc_pv) or spec.schedule.is_two_pass or spec.is_fp8  # (FP8: P <= 2^8 in e4m3)
            or spec.head_dim_v < t.rescale_slack_min_d_v):
        return 0.0
    return t.rescale_slack


def _with_table(c: CudaConfig, spec: AttentionSpec, t: CudaTiles) -> CudaConfig:
    """`c` (and its _varlen configuration) with the values of the table `t` that the emitter
    prints, and the registers after setmaxnreg that follow from them."""
    regs = producer_registers(t, c.tma, spec.mask.kind, c.warps, c.tma_q, c.persistent and not c.stored_p,
                              c.producer_regs)
    return replace(c, clean_values=t.clean_values, clean_every_tile=t.clean_every_tile,
                   causal_order_bytes=t.causal_order_bytes, stored_p_keys_a=t.stored_p_tiles[1],
                   mask_stage_words=t.mask_stage_words, persistent_blocks=t.persistent_blocks,
                   rescale_slack=rescale_slack_for(spec, t), setmaxnreg=regs,
                   varlen=None if c.varlen is None else _with_table(c.varlen, spec, t))
