"""Tile configuration: tile sizes, threads and on-chip memory layout for a spec on a profile.

Shared by the checker (which reports a configuration that cannot work, with the bytes it
needs and the limit) and the planner (which builds the kernel from it). Values the spec
leaves at `auto` come from the profile's tuned defaults and are shrunk until they fit;
values the spec gives are never changed: if they do not fit, that is an error.
"""

from __future__ import annotations

from dataclasses import dataclass

from .profiles import Profile
from .spec import DTYPE_BYTES, AttentionSpec

CUDA_ROWS_PER_WARP = 16  # rows of one m16n8k16 fragment; a warp owns 1 or 2 of them
CUDA_SPILL_FACTOR = 1.5  # register estimates above this multiple of the cap are refused or shrunk
CUDA_SMEM_SKEW_BYTES = 16  # row padding that keeps ldmatrix / float4 reads free of bank conflicts
CUDA_SPLIT_ROWS = 16  # default rows per block of the split schedules (split_kv, two_pass)
CUDA_MAX_DV_BLOCK = 256  # output columns one block keeps in registers; wider outputs split over blocks
# Candidates for a default `tile d` (head-dim columns per shared-memory step), largest first. The
# tensor-core path needs multiples of 16 (the k of m16n8k16), the CUDA-core path multiples of 8.
CUDA_CHUNKS = {"mma": (64, 32, 16), "fma": (64, 32, 16, 8)}
CUDA_CHUNK_ALIGN = {"mma": 16, "fma": 8}
CUDA_STEP_COST = 16  # a shared-memory step's fixed cost, in head-dim columns of math (an estimate)


@dataclass(frozen=True)
class Buffer:
    """One array in shared (CUDA) or workgroup (WGSL) memory."""

    name: str
    dtype: str
    copies: int  # pipeline stages
    rows: int
    cols: int  # elements per row, padding included
    offset: int  # bytes from the start of the shared memory
    doc: str

    @property
    def bytes(self) -> int:
        return self.copies * self.rows * self.cols * DTYPE_BYTES[self.dtype]


def _layout(entries) -> tuple[tuple[Buffer, ...], int]:
    """Place buffers one after another, each 16-byte aligned."""
    out, offset = [], 0
    for name, dtype, copies, rows, cols, doc in entries:
        buf = Buffer(name, dtype, copies, rows, cols, offset, doc)
        out.append(buf)
        offset += -(-buf.bytes // 16) * 16
    return tuple(out), offset


def _describe(buffers) -> str:
    parts = []
    for b in buffers:
        n = f"{b.copies}x" if b.copies > 1 else ""
        parts.append(f"{b.name} {n}{b.rows}x{b.cols} {b.dtype}")
    return " + ".join(parts)


@dataclass(frozen=True)
class CudaConfig:
    math: str  # "mma" (tensor cores, f16/bf16) or "fma" (CUDA cores, f32)
    tile_q: int
    tile_kv: int
    warps: int
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
    d_v_block: int = 0  # output columns per block, a whole number of chunks (chunked kernels only)

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
    def threads(self) -> int:
        return self.warps * 32

    @property
    def frags(self) -> int:
        """16-row fragments of Q per warp (1 or 2)."""
        return self.tile_q // (self.warps * CUDA_ROWS_PER_WARP)

    @property
    def smem_summary(self) -> str:
        text = _describe(self.buffers)
        return f"{text}; {self.chunk_summary}" if self.chunked else text


# Output columns one WGSL invocation accumulates (acc registers). A wider head dim v is split
# over V_BLOCKS workgroups per row tile (grid.y = Hq * V_BLOCKS), each computing V_COLS columns.
WGSL_MAX_DIMS_V = 64


@dataclass(frozen=True)
class WgslConfig:
    tile_q: int
    tile_kv: int
    threads_per_row: int
    subgroups: bool
    d_qk: int
    d_v: int
    buffers: tuple
    smem_bytes: int
    # tile d: head-dim columns of K and V per chunk in workgroup memory; None = the whole head
    # dims at once (one K and one V tile per step, no chunk loops).
    tile_d: int | None = None
    tile_d_given: bool = False  # from the spec's `tile d=` (else chosen because the head dim did not fit)
    v_blocks: int = 1  # workgroups splitting the output columns (grid.y = Hq * v_blocks)

    @property
    def workgroup(self) -> int:
        return self.tile_q * self.threads_per_row

    @property
    def reduction(self) -> str:
        """How a row's partial dot products are summed: none, subgroup or workgroup (memory)."""
        if self.threads_per_row == 1:
            return "none"
        return "subgroup" if self.subgroups else "workgroup"

    @property
    def chunked(self) -> bool:
        return self.tile_d is not None

    @property
    def v_cols(self) -> int:
        """Columns of v / out one workgroup computes."""
        return self.d_v // self.v_blocks

    @property
    def tile_dqk(self) -> int:
        """Columns of K per chunk (a head dim narrower than tile d is one chunk)."""
        return min(self.tile_d, self.d_qk) if self.chunked else self.d_qk

    @property
    def tile_dv(self) -> int:
        return min(self.tile_d, self.v_cols) if self.chunked else self.v_cols

    @property
    def chunk_summary(self) -> str:
        """How the head dims are split, in words (attngen check, source headers)."""
        if not self.chunked:
            return "whole head dims in workgroup memory"
        why = "from the spec" if self.tile_d_given else "chosen: the whole head dim does not fit"
        text = (f"tile d={self.tile_d} ({why}): K in {self.d_qk // self.tile_dqk} chunk(s) of "
                f"{self.tile_dqk}, V in {self.v_cols // self.tile_dv} of {self.tile_dv}")
        if self.v_blocks > 1:
            text += f"; out split over {self.v_blocks} workgroups of {self.v_cols} columns"
        return text

    @property
    def smem_summary(self) -> str:
        text = _describe(self.buffers)
        return f"{text}; {self.chunk_summary}" if self.chunked else text


class TileProblem(Exception):
    """A configuration that cannot work; `key` names the spec key to point at."""

    def __init__(self, message, key="tile", hint=None):
        super().__init__(message)
        self.message, self.key, self.hint = message, key, hint


def cuda_math(spec: AttentionSpec) -> str:
    return "fma" if spec.dtype == "f32" else "mma"


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _cuda_layout(spec, math, tile_q, tile_kv, stages, chunk):
    """Shared-memory buffers: the whole head dims (chunk None), or one chunk per pipeline stage."""
    elem = spec.dtype
    skew = CUDA_SMEM_SKEW_BYTES // DTYPE_BYTES[elem]
    if chunk is None:
        pad = 16 if math == "mma" else 1
        d_qk_pad, d_v_pad = _round_up(spec.head_dim_qk, pad), _round_up(spec.head_dim_v, pad)
        entries = [
            ("sQ", elem, 1, tile_q, d_qk_pad + skew, "the block's rows of Q"),
            ("sK", elem, stages, tile_kv, d_qk_pad + skew, "K tiles, one per pipeline stage"),
            ("sV", elem, stages, tile_kv, d_v_pad + skew, "V tiles, one per pipeline stage"),
        ]
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
    if given_q is not None and given_q % CUDA_ROWS_PER_WARP:
        raise TileProblem(f"tile q={given_q} is not a multiple of {CUDA_ROWS_PER_WARP} (a warp owns "
                          f"whole {CUDA_ROWS_PER_WARP}-row fragments of Q)", hint="try tile q=64 or q=128")
    if given_q is not None and given_w is not None:
        if given_q % given_w or (given_q // given_w) not in (16, 32):
            raise TileProblem(f"tile q={given_q} over warps={given_w} gives {given_q / given_w:g} rows per "
                              "warp; each warp owns 16 or 32 rows of Q", key="target.cuda",
                              hint=f"use warps={given_q // 16} or warps={given_q // 32}"
                              if given_q % 32 == 0 else f"use warps={given_q // 16}")
        return given_q, given_w
    if given_w is not None:
        return given_w * CUDA_ROWS_PER_WARP, given_w
    if given_q is None and "warps" in row:
        return row["tile_q"], row["warps"]
    tile_q = given_q if given_q is not None else row["tile_q"]
    # Up to 8 warps of one fragment each; larger tiles give each warp two fragments.
    frags = 2 if tile_q > 128 and tile_q % 32 == 0 else 1
    return tile_q, tile_q // (CUDA_ROWS_PER_WARP * frags)


def _cuda_v_split(d_v: int, chunk: int, cap: int) -> tuple[int, int]:
    """(v_blocks, d_v_block): the output columns over the fewest blocks of at most `cap` columns,
    each a whole number of chunks (the last block's columns past d_v are computed, not stored)."""
    cap = max(chunk, cap // chunk * chunk)
    blocks = -(-d_v // cap)
    d_v_block = _round_up(-(-d_v // blocks), chunk)
    return -(-d_v // d_v_block), d_v_block


def _cuda_default_chunk(spec: AttentionSpec, math: str) -> int:
    """The candidate chunk with the least estimated work: the head-dim columns computed (padding
    to whole chunks, Q K^T once per output block) plus, per shared-memory step, a fixed cost
    (barriers, copy latency) of about CUDA_STEP_COST columns. Ties go to the larger chunk."""
    def work(chunk):
        v_blocks, d_v_block = _cuda_v_split(spec.head_dim_v, chunk, CUDA_MAX_DV_BLOCK)
        columns = v_blocks * (_round_up(spec.head_dim_qk, chunk) + d_v_block)
        return columns * (chunk + CUDA_STEP_COST) / chunk
    return min(CUDA_CHUNKS[math], key=work)


def _cuda_check_chunk(spec: AttentionSpec, math: str, chunk: int) -> None:
    """A `tile d` the spec gives is used as is, or refused with the reason."""
    align = CUDA_CHUNK_ALIGN[math]  # (the language already wants a multiple of 8, at most the head dim)
    if chunk % align:
        why = ("the k of the tensor-core product m16n8k16" if math == "mma"
               else "the 8-column output tiles of the CUDA-core path")
        widest = max(spec.head_dim_qk, spec.head_dim_v)
        hint = (f"leave d out: head dim {widest} fits whole" if chunk >= widest
                else f"try tile d={max(align, chunk // align * align)} or d=64")
        raise TileProblem(f"tile d={chunk} is not a multiple of {align} ({why})", hint=hint)
    if chunk > CUDA_MAX_DV_BLOCK:
        raise TileProblem(f"tile d={chunk} is too large (at most {CUDA_MAX_DV_BLOCK}: a block keeps at most "
                          f"{CUDA_MAX_DV_BLOCK} output columns in registers, a whole number of chunks)",
                          hint="try tile d=64")


def cuda_config(spec: AttentionSpec, profile: Profile) -> CudaConfig:
    """Resolve tiles for CUDA; raise TileProblem if the spec's own choices cannot work.

    Head dims up to CUDA_MAX_DV_BLOCK sit in shared memory whole when they fit; otherwise (or
    when the spec gives `tile d`) they stream through it in chunks.
    """
    math = cuda_math(spec)
    if spec.tile.d is not None:
        _cuda_check_chunk(spec, math, spec.tile.d)
        return _cuda_fit(spec, profile, math, spec.tile.d)
    chunk = _cuda_default_chunk(spec, math)
    if max(spec.head_dim_qk, spec.head_dim_v) > CUDA_MAX_DV_BLOCK:
        return _cuda_fit(spec, profile, math, chunk)
    try:
        return _cuda_fit(spec, profile, math, None)
    except TileProblem as whole:
        try:
            return _cuda_fit(spec, profile, math, chunk)
        except TileProblem:
            raise whole from None  # chunks do not help either: report the plain configuration


def _cuda_fit(spec: AttentionSpec, profile: Profile, math: str, chunk: int | None) -> CudaConfig:
    """Tiles for one way of holding the head dims (whole, or `chunk` columns at a time)."""
    big = max(spec.head_dim_qk, spec.head_dim_v)
    row = profile.default_row(big, math)
    if spec.schedule.kind != "fused":
        # Split schedules serve decode: a block's rows are (query row, head in group) pairs, a few
        # per KV head, so one warp of CUDA_SPLIT_ROWS rows; the splits give the parallelism.
        row = {**row, "tile_q": CUDA_SPLIT_ROWS, "warps": 1, "tile_kv": max(row["tile_kv"], 64)}
    given_q, given_kv, given_w, given_st = spec.tile.q, spec.tile.kv, spec.cuda.warps, spec.cuda.stages

    if given_kv is not None and given_kv % 16:
        raise TileProblem(f"tile kv={given_kv} is not a multiple of 16 (the k dimension of the "
                          "tensor-core product P V)", hint="try tile kv=32 or kv=64")
    if given_kv is not None and given_kv > 256:
        raise TileProblem(f"tile kv={given_kv} is too large (at most 256)", hint="try tile kv=64")
    tile_q, warps = _cuda_rows(given_q, given_w, row)
    threads_limit = min(profile.limit("threads_per_block"), 512)
    if warps * 32 > threads_limit or tile_q > 256:
        raise TileProblem(f"tile q={tile_q} needs {warps} warps ({warps * 32} threads); at most "
                          f"{threads_limit} threads and 256 rows per block",
                          key="tile" if given_q else "target.cuda", hint="use tile q=128 or less")
    tile_kv = given_kv if given_kv is not None else row["tile_kv"]
    stages = given_st if given_st is not None else row["stages"]
    if stages > 4:
        raise TileProblem(f"stages={stages}: at most 4 K/V pipeline stages", key="target.cuda")

    v_cap = CUDA_MAX_DV_BLOCK  # output columns per block; shrinks (more blocks) as a last resort
    while True:
        frags = tile_q // (warps * CUDA_ROWS_PER_WARP)
        if chunk is None:
            pad = 16 if math == "mma" else 1
            d_qk_pad, d_v_pad = _round_up(spec.head_dim_qk, pad), _round_up(spec.head_dim_v, pad)
            v_blocks, d_v_block = 1, d_v_pad
            q_in_regs = math == "mma" and frags * _round_up(spec.head_dim_qk, 16) <= 128
        else:  # Q streams through shared memory with K; the block keeps d_v_block output columns
            v_blocks, d_v_block = _cuda_v_split(spec.head_dim_v, chunk, v_cap)
            d_qk_pad, d_v_pad = _round_up(spec.head_dim_qk, chunk), v_blocks * d_v_block
            q_in_regs = False
        buffers, smem = _cuda_layout(spec, math, tile_q, tile_kv, stages, chunk)
        regs = _cuda_registers(math, frags, tile_kv, d_qk_pad, d_v_block, q_in_regs)
        reg_cap = cuda_register_cap(profile, warps * 32)
        # A little spilling is slower, not wrong: the profile's measured defaults and the spec's
        # own choices may exceed the estimate's cap, but not pathologically (CUDA_SPILL_FACTOR).
        if smem <= profile.limit("shared_memory_bytes") and regs <= reg_cap * CUDA_SPILL_FACTOR:
            break
        if given_kv is None and tile_kv > 16:
            tile_kv //= 2
        elif given_st is None and stages > 1:
            stages -= 1
        elif given_q is None and given_w is None and tile_q > 16:
            tile_q //= 2
            warps = tile_q // CUDA_ROWS_PER_WARP
        elif chunk is not None and d_v_block > chunk:
            v_cap = d_v_block - chunk
        else:
            break
    limit = profile.limit("shared_memory_bytes")
    dims = f"head_dim qk={spec.head_dim_qk} v={spec.head_dim_v}"
    if chunk is not None:
        dims += f" in chunks of d={chunk}"
    if smem > limit:
        raise TileProblem(
            f"tile q={tile_q} kv={tile_kv} with {stages} stage(s) and {dims} "
            f"needs {smem} bytes of shared memory ({_describe(buffers)}), but "
            f"{profile.name} allows {limit}",
            hint="use a smaller tile kv or q, or fewer stages (target cuda { stages=1 })"
            + (", or a smaller tile d" if chunk is not None else ""))
    if regs > reg_cap * CUDA_SPILL_FACTOR:
        cols = f"head_dim v={spec.head_dim_v}" if chunk is None else f"{d_v_block} output columns per block"
        raise TileProblem(
            f"tile q={tile_q} kv={tile_kv} on {warps} warps with {cols} needs "
            f"about {regs} registers per thread for scores and accumulators, but {warps * 32} "
            f"threads may use at most {reg_cap} each (more than {CUDA_SPILL_FACTOR:g}x would spill "
            "most of them to local memory)",
            hint="use a smaller tile kv, or more warps (16 rows each)")
    return CudaConfig(math, tile_q, tile_kv, warps, stages, spec.head_dim_qk, spec.head_dim_v,
                      d_qk_pad, d_v_pad, q_in_regs, buffers, smem, regs, reg_cap,
                      chunk=chunk, chunk_given=spec.tile.d is not None, v_blocks=v_blocks,
                      d_v_block=d_v_block)


def _wgsl_layout(spec, tile_q, tile_kv, threads_per_row, subgroups, cols_qk, cols_v):
    """Workgroup buffers: K and V tiles of `cols_*` columns (whole head dims or one chunk)."""
    elem = spec.dtype
    chunk = cols_qk < spec.head_dim_qk or cols_v < spec.head_dim_v
    what = "one d-chunk of the current {} tile" if chunk else "the current {} tile"
    entries = [
        ("sK", elem, 1, tile_kv, cols_qk, what.format("K")),
        ("sV", elem, 1, tile_kv, cols_v, what.format("V")),
    ]
    if not subgroups and threads_per_row > 1:
        entries.append(("sRed", "f32", 1, tile_q * threads_per_row, tile_kv,
                        "partial dot products, summed across a row's invocations"))
    return _layout(entries)


def wgsl_subgroup_choice(spec: AttentionSpec, profile: Profile) -> bool | None:
    """True/False when decided by the spec and profile alone; None: depends on the row width."""
    mode = spec.wgsl.subgroups
    if mode == "off":
        return False
    if mode == "on":
        return True
    return None if profile.has_feature("subgroups") else False


def _chunk_fits(width: int, d: int) -> bool:
    """A chunk of d columns covers `width` columns exactly (or the width is one chunk)."""
    return width <= d or width % d == 0


def _wgsl_v_blocks(d_v: int, tpr: int, tile_d: int | None) -> int:
    """Fewest workgroups to split the output columns over so that each invocation keeps at most
    WGSL_MAX_DIMS_V of them, each block a whole number of tile d chunks."""
    n = d_v // tpr  # output columns per invocation without a split
    for b in range(1, n + 1):
        if n % b == 0 and n // b <= WGSL_MAX_DIMS_V and (tile_d is None or _chunk_fits(d_v // b, tile_d)):
            return b
    return n  # not reached: b = n gives tpr columns per block, and tile d is a multiple of tpr


def _wgsl_rows(spec, profile, row, tile_q, subgroups):
    """Invocations per row of Q (and whether subgroups reduce them), checked."""
    sg_min = int(profile.features.get("subgroup_min_size", 4))
    given_d = spec.tile.d
    if spec.wgsl.workgroup is not None:
        wg = spec.wgsl.workgroup
        if wg % tile_q:
            raise TileProblem(f"workgroup={wg} is not a multiple of tile q={tile_q} (each row of Q "
                              "gets the same number of invocations)", key="target.wgsl")
        tpr = wg // tile_q
    else:
        tpr = row["threads_per_row"]
        if subgroups is not False:
            tpr = min(tpr, sg_min)
        # a default that does not divide the head dims (e.g. 16 for head_dim 136) is halved
        while tpr > 1 and (spec.head_dim_qk % tpr or spec.head_dim_v % tpr or (given_d or tpr) % tpr):
            tpr //= 2
    if tpr & (tpr - 1):
        raise TileProblem(f"{tpr} invocations per row of Q (workgroup / tile q) is not a power of two",
                          key="target.wgsl", hint="make workgroup = tile q x 1, 2, 4, 8, 16 or 32")
    for d in (spec.head_dim_qk, spec.head_dim_v):
        if d % tpr:
            raise TileProblem(f"{tpr} invocations per row of Q do not divide head dim {d}",
                              key="target.wgsl", hint="use fewer invocations per row")
    if given_d is not None and given_d % tpr:
        raise TileProblem(f"tile d={given_d} is not a multiple of the {tpr} invocations per row of Q "
                          "(each owns the same number of a chunk's columns)",
                          hint=f"use a multiple of {tpr} for d, or fewer invocations per row")
    if tpr == 1:
        subgroups = False  # one invocation per row: nothing to reduce, no feature needed
    elif subgroups is None:
        subgroups = tpr <= sg_min
    elif subgroups and tpr > sg_min:
        raise TileProblem(f"subgroups=on with {tpr} invocations per row of Q, but {profile.name} "
                          f"guarantees subgroups of only {sg_min}", key="target.wgsl",
                          hint=f"use workgroup = tile q x {sg_min} or fewer")
    return tpr, subgroups


def _kv_steps(given_kv, default_kv):
    """tile kv values to try: the given one, else the default halved down to 4."""
    if given_kv is not None:
        return [given_kv]
    out = [default_kv]
    while out[-1] > 4:
        out.append(out[-1] // 2)
    return out


def wgsl_config(spec: AttentionSpec, profile: Profile) -> WgslConfig:
    """Resolve tiles for WGSL; raise TileProblem if the spec's own choices cannot work.

    The whole head dims go to workgroup memory at once when they fit (tile kv shrinking down to
    4) and the output columns need no split; otherwise K and V are streamed in chunks of tile d
    columns: the spec's d as given, else the widest chunk that fits.
    """
    row = profile.default_row(max(spec.head_dim_qk, spec.head_dim_v))
    max_inv = profile.limit("invocations_per_workgroup")
    tile_q = spec.tile.q if spec.tile.q is not None else row["tile_q"]
    tpr, subgroups = _wgsl_rows(spec, profile, row, tile_q, wgsl_subgroup_choice(spec, profile))
    wg = tile_q * tpr
    if wg > max_inv:
        raise TileProblem(f"workgroup of {wg} invocations (tile q={tile_q} x {tpr} per row) exceeds "
                          f"{profile.name}'s {max_inv}", hint="use a smaller tile q")
    given_kv, given_d = spec.tile.kv, spec.tile.d
    if given_kv is not None and given_kv > 128:
        raise TileProblem(f"tile kv={given_kv} is too large for WGSL (at most 128: each invocation "
                          "keeps a tile row of scores in registers)", hint="try tile kv=32")
    d_qk, d_v = spec.head_dim_qk, spec.head_dim_v
    if given_d is not None and not _chunk_fits(d_qk, given_d):
        good = [c for c in range(tpr, d_qk, tpr) if d_qk % c == 0 and c % 8 == 0]
        raise TileProblem(f"tile d={given_d} does not divide head_dim qk={d_qk} (the chunks cover the "
                          "head dim exactly)", hint=f"use d={good[-1]}" + (f" or d={good[0]}" if len(good) > 1
                                                                        else "") if good else None)
    v_blocks = _wgsl_v_blocks(d_v, tpr, given_d)
    v_cols = d_v // v_blocks
    limit = profile.limit("workgroup_storage_bytes")
    kv_steps = _kv_steps(given_kv, row["tile_kv"])

    def make(tile_kv, tile_d):
        cols = (d_qk, d_v) if tile_d is None else (min(tile_d, d_qk), min(tile_d, v_cols))
        buffers, smem = _wgsl_layout(spec, tile_q, tile_kv, tpr, subgroups, *cols)
        return WgslConfig(tile_q, tile_kv, tpr, subgroups, d_qk, d_v, buffers, smem, tile_d,
                          given_d is not None, v_blocks)

    if given_d is None and v_blocks == 1:  # the whole head dims, if they fit
        for tile_kv in kv_steps:
            cfg = make(tile_kv, None)
            if cfg.smem_bytes <= limit:
                return cfg
    if given_d is not None:
        chunks = [given_d]
    else:  # the widest chunk that fits: multiples of 8 and of tpr covering both head dims exactly
        step = max(8, tpr)
        chunks = [c for c in range(max(d_qk, v_cols) // step * step, 0, -step)
                  if _chunk_fits(d_qk, c) and _chunk_fits(v_cols, c)]
    for tile_kv in kv_steps:
        for tile_d in chunks:
            cfg = make(tile_kv, tile_d)
            if cfg.smem_bytes <= limit:
                return cfg
    # Nothing fits: report the whole-head-dim attempt when that was an option (the spec's tile kv
    # is then what is too large even for the narrowest chunk), else the narrowest chunk.
    whole = given_d is None and v_blocks == 1
    cfg = make(kv_steps[-1], None if whole else chunks[-1])
    what = f"tile q={tile_q} kv={cfg.tile_kv}" + ("" if whole else f" d={cfg.tile_d}")
    raise TileProblem(
        f"{what} with head_dim qk={d_qk} v={d_v} needs {cfg.smem_bytes} bytes of workgroup memory "
        f"({_describe(cfg.buffers)}), but {profile.name} allows {limit}",
        hint="use a smaller tile kv" if given_d is None else "use a smaller tile d or tile kv")
