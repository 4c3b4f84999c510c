"""The CUDA backend's choices of kernel family: whether the Hopper family (wgmma) serves a spec,
and with which of its parts (the producer warpgroup and its registers, persistent blocks, split
Q K^T, P through memory), from the spec and the tile table (tiles.py). config.py places the
tiles these choices name; nothing here looks at shared memory.
"""

from __future__ import annotations

from ...lang.spec import AttentionSpec
from ...plan.kernel_plan import Problem
from ...plan.profiles import Profile
from .tiles import PRODUCER_THREADS, ROWS_PER_WARP, WARPGROUP_ROWS, WGMMA_COLUMNS, CudaTiles, padded_head_dim


def cuda_math(spec: AttentionSpec, profile: Profile | None, t: CudaTiles) -> str:
    if spec.dtype == "f32":
        return "fma"
    return "wgmma" if profile is not None and wgmma_refusal(spec, profile, t) is None else "mma"


def wgmma_refusal(spec: AttentionSpec, profile: Profile, t: CudaTiles) -> str | None:
    """Why the Hopper family (wgmma) does not serve this spec on this profile; None when it does.
    ('' when the profile has no such family: nothing to explain.) What it leaves to the mma.sync
    family is listed in docs/cuda-variants.md."""
    if not profile.features.get("wgmma"):
        return ""
    if spec.dtype == "f32":
        return "f32 storage runs on CUDA cores"
    if "f16" in (spec.acc_qk, spec.acc_pv):
        return "accumulate f16: the wgmma family accumulates in f32"
    if spec.schedule.is_split:
        return f"schedule {spec.schedule.kind}: the split decode schedules stay on mma.sync"
    if spec.kv_cache.is_paged:
        return "a paged KV cache: gathered pages stay on mma.sync"
    if spec.kv_dtype is not None:
        return (f"kv_dtype {spec.kv_dtype}: a quantized cache's bytes are decoded in registers into mma.sync "
                "fragments (backends/cuda/kvquant.py)")
    dmax = max(spec.head_dim_qk, spec.head_dim_v)
    if spec.tile.d is not None:
        return "tile d: head dims in chunks stream on mma.sync"
    if dmax > t.q_whole_max_head_dim:
        why = stored_p_refusal(spec)
        if why is not None:
            return (f"head dims above {t.q_whole_max_head_dim} take the wgmma family only with P through memory, for mask "
                    f"none without softcap and with the planner's own tiles ({why}): they stream in chunks on "
                    "mma.sync")
        return None
    if dmax > 256:
        opts = spec.options("cuda")
        why = ("a mask expression" if spec.mask.kind == "expr" else
               "a window or custom mask" if spec.mask.kind not in ("none", "causal") else
               "softcap" if spec.softcap is not None else
               "a score expression" if spec.score is not None else
               "producer=off" if opts.get("producer") == "off" else
               "tma=off" if opts.get("tma") == "off" else
               f"tile q={spec.tile.q}" if spec.tile.q not in (None, 2 * WARPGROUP_ROWS) else
               f"warps={opts.get('warps')}" if opts.get("warps") not in (None, 8) else None)
        if why is not None:
            return (f"head dims above 256 on the wgmma family take the producer warpgroup with the tensor copy "
                    f"engine and tile q 128, for mask none or causal without softcap ({why}): they stream in "
                    "chunks on mma.sync")
    q, warps = spec.tile.q, spec.options("cuda").get("warps")
    if q is not None and q % WARPGROUP_ROWS:
        return f"tile q={q} is not a multiple of {WARPGROUP_ROWS} (a warpgroup owns 64 rows)"
    if warps is not None and (warps % 4 or (q is not None and q != warps * ROWS_PER_WARP)):
        return f"warps={warps}: the wgmma family has whole warpgroups of 4 warps, 16 rows each"
    return None


def stored_p_refusal(spec: AttentionSpec) -> str | None:
    """Why a head dim above CudaTiles.stored_p_above_head_dim cannot take P through memory
    (CudaTiles.stored_p_tiles); None when it can (above CudaTiles.q_whole_max_head_dim the mma.sync
    chunks serve what it cannot; below, the producer kernel with Q whole in shared memory). (f32,
    f16 accumulators, split schedules and paged caches are refused before.)"""
    opts = spec.options("cuda")
    given = [f"tile {k}={v}" for k, v in (("q", spec.tile.q), ("kv", spec.tile.kv)) if v is not None]
    given += [f"{k}={opts[k]}" for k in ("warps", "stages") if opts.get(k) is not None]
    given += [f"{k}=off" for k in ("producer", "tma", "persistent") if opts.get(k) == "off"]
    if spec.mask.kind != "none":
        return f"mask {spec.mask.kind}"
    if spec.softcap is not None:
        return "softcap"
    if spec.score is not None:
        return "a score expression"
    if given:
        return ", ".join(given)
    return None


def producer_registers(t: CudaTiles, tma: bool, mask_kind: str, consumer_warps: int = 8, tma_q: bool = True,
                       persistent: bool = False, given: int = 0) -> tuple[int, int]:
    """(producer, consumer) registers per thread after setmaxnreg in a producer kernel with
    `consumer_warps` consumer warps: the launch gives each thread 65536 / threads (a multiple of
    8) and the consumers share what the producer gives up (2 warpgroups, cp.async: 72 / 216; with
    the tensor copy engine 24 / 240, 40 / 232; 3 warpgroups 32 / 160, 40 / 152 with a custom mask;
    `tma_q` False: Q by cp.async, CudaTiles.tma_kv_only_producer_regs; persistent blocks with the
    tensor copy engine: CudaTiles.cleaning_producer_regs at least; `given`: the configuration's own,
    CudaConfig.producer_regs). One consumer warpgroup moves none: its threads keep what the launch gives (up to 255). The producer keeps
    the registers that would not raise the consumers' count (a multiple of 8)."""
    if consumer_warps <= 4:
        return 255, 255
    threads = consumer_warps * 32 + PRODUCER_THREADS
    per_thread = min(255, 65536 // threads) // 8 * 8

    def consumer(p):
        return min((per_thread * threads - p * PRODUCER_THREADS) // (consumer_warps * 32) // 8 * 8, 255)

    kind = "custom" if mask_kind == "expr" else mask_kind  # (a mask expression: custom's, not measured on its own)
    producer = (t.tma_producer_regs if tma_q else t.tma_kv_only_producer_regs)[kind] if tma else t.producer_regs
    if tma and persistent and t.clean_values:
        producer = max(producer, t.cleaning_producer_regs)
    producer = given or producer
    while consumer(producer + 8) == consumer(producer) and producer + 8 <= per_thread:
        producer += 8  # registers the consumers could not use anyway (3 warpgroups: 32 for 24)
    return producer, consumer(producer)


def swizzles_kv(spec: AttentionSpec, math: str, chunk: int | None, t: CudaTiles) -> bool:
    """Whether an mma.sync kernel keeps K and V in unpadded 128-byte rows (CudaTiles.swizzle_kv; a
    quantized cache's byte tiles: CudaTiles.swizzle_kv_quant, kvquant.py's chunk_key)."""
    # (a paged tile is copied page by page: pages of a multiple of 8 keys keep the pattern)
    whole_rows = not spec.kv_cache.is_paged or spec.kv_cache.page % 8 == 0
    if spec.kv_dtype is not None:  # byte rows of whole 128-byte lines: head dims that are multiples of 128
        return (t.swizzle_kv_quant and math == "mma" and chunk is None and whole_rows
                and spec.head_dim_qk % 128 == 0 and spec.head_dim_v % 128 == 0)
    # The split (decode) schedules, where it was measured, with head dims 64, 128 and 256 (ptxas:
    # benchmarks/NOTES.md, "config.py's measurements", swizzle_kv).
    return (t.swizzle_kv and math == "mma" and chunk is None and spec.schedule.is_split
            and spec.head_dim_qk in (64, 128, 256) and spec.head_dim_v in (64, 128, 256) and whole_rows)


def takes_producer(spec: AttentionSpec, tile_q: int, tile_kv: int, stages: int, t: CudaTiles) -> bool:
    """Whether the Hopper family's block gets a producer warpgroup: the spec's `producer`, else
    auto = on for blocks of two consumer warpgroups (tile q = 128) with a ring of 2+ stages, up to
    head dim 128, without softcap, for no mask or a causal or window one up to tile kv
    CudaTiles.producer_masked_max_kv (measured: benchmarks/NOTES.md, "config.py's measurements",
    takes_producer)."""
    given = spec.options("cuda").get("producer")
    if given == "off":
        return False
    if given == "on" and tile_q > t.max_consumer_groups * WARPGROUP_ROWS:
        raise Problem(f"producer=on with tile q={tile_q}: the producer serves one to three consumer warpgroups "
                      f"(tile q 64, 128 or 192; {tile_q // WARPGROUP_ROWS} would leave them too few registers "
                      "after setmaxnreg)", key="target.cuda", hint="use tile q=128 or 192")
    if stages < 2:
        if given == "on":
            raise Problem("producer=on needs 2 or more K/V stages (the copier fills one tile while the "
                          "consumers still read the previous one)", key="target.cuda", hint="use stages=2")
        return False
    if spec.mask.is_custom and tile_kv > 128 and given == "on":
        raise Problem(f"producer=on with mask custom and tile kv={tile_kv}: the producer stages a partial tile's "
                      "mask words for up to 128 keys (two 128-key chunks of a row)", key="target.cuda",
                      hint="use tile kv=128 or less, or leave producer out")
    dmax = max(spec.head_dim_qk, spec.head_dim_v)
    # causal blocks take the producer up to their own auto tile kv (CudaTiles.causal_tiles)
    causal_kv = next((tile[1] for d, tile in t.causal_tiles if dmax <= d), None)
    masked_kv = causal_kv if spec.mask.kind == "causal" and causal_kv is not None else t.producer_masked_max_kv
    masked_ok = spec.mask.kind == "none" or (spec.mask.kind in ("causal", "window", "custom", "expr")
                                             and tile_kv <= masked_kv)
    # three consumer warpgroups: auto only unmasked (causal q192 no longer spills, but was not faster)
    if tile_q == 3 * WARPGROUP_ROWS:
        return given == "on" or (spec.mask.kind == "none" and spec.softcap is None and spec.score is None
                                 and dmax <= 128)
    if dmax > 256:  # output column blocks exist only in the producer kernel (wgmma_refusal checked the rest)
        return True
    if dmax > 128:  # CudaTiles.wide_d_tiles: with the tensor copy engine, no mask but causal, its tile kv at most
        wide_kv = wide_d_kv(spec, t)
        if wide_masked(spec, t):
            wide_kv = t.producer_wide_masked_max_kv
        return given == "on" or (tile_q == 2 * WARPGROUP_ROWS and wide_kv is not None and tile_kv <= wide_kv)
    # (softcap too: CudaTiles.producer_softcap)
    return given == "on" or (tile_q == 2 * WARPGROUP_ROWS and masked_ok
                             and ((spec.softcap is None and spec.score is None) or t.producer_softcap))


def wide_masked(spec: AttentionSpec, t: CudaTiles) -> bool:
    """A head dim above 128, up to 256, with a window or custom mask or softcap, whose tiles come
    by the tensor copy engine: the producer with CudaTiles.producer_wide_masked_max_kv and its tiles
    (CudaTiles.wide_masked_tiles), where CudaTiles.wide_d_tiles has none."""
    dmax = max(spec.head_dim_qk, spec.head_dim_v)
    return (128 < dmax <= 256 and wide_d_kv(spec, t) is None and spec.options("cuda").get("tma") != "off"
            and (spec.mask.kind in ("window", "custom", "expr") or spec.softcap is not None or spec.score is not None))


def takes_split_qk(spec: AttentionSpec, t: CudaTiles) -> bool:
    """Whether a head dim above 256 on the Hopper family splits Q K^T between its two consumer
    warpgroups (CudaTiles.split_qk): a padded qk head dim of whole 128-column halves."""
    d_qk_pad = padded_head_dim(spec.head_dim_qk, "wgmma")
    d_pad = padded_head_dim(max(spec.head_dim_qk, spec.head_dim_v), "wgmma")
    return (t.split_qk and d_pad >= t.split_qk_min_head_dim
            and d_qk_pad % (2 * WGMMA_COLUMNS) == 0 and wide_d_kv(spec, t) is not None)


def wide_d_kv(spec: AttentionSpec, t: CudaTiles) -> int | None:
    """The auto tile kv of a producer kernel for head dims above 128 (CudaTiles.wide_d_tiles), or
    None where such head dims keep the plain loop (window, custom, softcap, tma=off, above 256)."""
    dmax = max(spec.head_dim_qk, spec.head_dim_v)
    if (spec.mask.kind not in ("none", "causal") or spec.softcap is not None or spec.score is not None
            or spec.options("cuda").get("tma") == "off"):
        return None
    return next((max(kv for kv, _ in opts) for d, opts in t.wide_d_tiles if dmax <= d), None)


def persistent_refusal(spec: AttentionSpec, producer: bool) -> str | None:
    """Why a Hopper-family configuration cannot run persistent blocks (None: it can)."""
    if not producer:
        return "persistent blocks belong to the producer warpgroup's kernels, and this plan has no producer"
    return None
