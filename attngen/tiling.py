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

    @property
    def threads(self) -> int:
        return self.warps * 32

    @property
    def frags(self) -> int:
        """16-row fragments of Q per warp (1 or 2)."""
        return self.tile_q // (self.warps * CUDA_ROWS_PER_WARP)

    @property
    def smem_summary(self) -> str:
        return _describe(self.buffers)


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
    def smem_summary(self) -> str:
        return _describe(self.buffers)


class TileProblem(Exception):
    """A configuration that cannot work; `key` names the spec key to point at."""

    def __init__(self, message, key="tile", hint=None):
        super().__init__(message)
        self.message, self.key, self.hint = message, key, hint


def cuda_math(spec: AttentionSpec) -> str:
    return "fma" if spec.dtype == "f32" else "mma"


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _cuda_layout(spec, math, tile_q, tile_kv, stages):
    elem = spec.dtype
    pad = 16 if math == "mma" else 1
    d_qk_pad, d_v_pad = _round_up(spec.head_dim_qk, pad), _round_up(spec.head_dim_v, pad)
    skew = CUDA_SMEM_SKEW_BYTES // DTYPE_BYTES[elem]
    entries = [
        ("sQ", elem, 1, tile_q, d_qk_pad + skew, "the block's rows of Q"),
        ("sK", elem, stages, tile_kv, d_qk_pad + skew, "K tiles, one per pipeline stage"),
        ("sV", elem, stages, tile_kv, d_v_pad + skew, "V tiles, one per pipeline stage"),
    ]
    if math == "fma":
        entries.append(("sP", "f32", 1, tile_q, tile_kv + 4, "probabilities P of the current tile"))
    buffers, total = _layout(entries)
    return d_qk_pad, d_v_pad, buffers, total


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


def cuda_config(spec: AttentionSpec, profile: Profile) -> CudaConfig:
    """Resolve tiles for CUDA; raise TileProblem if the spec's own choices cannot work."""
    math = cuda_math(spec)
    big = max(spec.head_dim_qk, spec.head_dim_v)
    row = profile.default_row(big, math)
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

    while True:
        frags = tile_q // (warps * CUDA_ROWS_PER_WARP)
        q_in_regs = math == "mma" and frags * _round_up(spec.head_dim_qk, 16) <= 128
        d_qk_pad, d_v_pad, buffers, smem = _cuda_layout(spec, math, tile_q, tile_kv, stages)
        regs = _cuda_registers(math, frags, tile_kv, d_qk_pad, d_v_pad, q_in_regs)
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
        else:
            break
    limit = profile.limit("shared_memory_bytes")
    if smem > limit:
        raise TileProblem(
            f"tile q={tile_q} kv={tile_kv} with {stages} stage(s) and head_dim qk={spec.head_dim_qk} "
            f"v={spec.head_dim_v} needs {smem} bytes of shared memory ({_describe(buffers)}), but "
            f"{profile.name} allows {limit}",
            hint="use a smaller tile kv or q, or fewer stages (target cuda { stages=1 })")
    if regs > reg_cap * CUDA_SPILL_FACTOR:
        raise TileProblem(
            f"tile q={tile_q} kv={tile_kv} on {warps} warps with head_dim v={spec.head_dim_v} needs "
            f"about {regs} registers per thread for scores and accumulators, but {warps * 32} "
            f"threads may use at most {reg_cap} each (more than {CUDA_SPILL_FACTOR:g}x would spill "
            "most of them to local memory)",
            hint="use a smaller tile kv, or more warps (16 rows each)")
    return CudaConfig(math, tile_q, tile_kv, warps, stages, spec.head_dim_qk, spec.head_dim_v,
                      d_qk_pad, d_v_pad, q_in_regs, buffers, smem, regs, reg_cap)


def _wgsl_layout(spec, tile_q, tile_kv, threads_per_row, subgroups):
    elem = spec.dtype
    entries = [
        ("sK", elem, 1, tile_kv, spec.head_dim_qk, "the current K tile"),
        ("sV", elem, 1, tile_kv, spec.head_dim_v, "the current V tile"),
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


def wgsl_config(spec: AttentionSpec, profile: Profile) -> WgslConfig:
    """Resolve tiles for WGSL; raise TileProblem if the spec's own choices cannot work."""
    row = profile.default_row(max(spec.head_dim_qk, spec.head_dim_v))
    sg_min = int(profile.features.get("subgroup_min_size", 4))
    max_inv = profile.limit("invocations_per_workgroup")
    tile_q = spec.tile.q if spec.tile.q is not None else row["tile_q"]
    subgroups = wgsl_subgroup_choice(spec, profile)
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
        while tpr > 1 and (spec.head_dim_qk % tpr or spec.head_dim_v % tpr):
            tpr //= 2
    if tpr & (tpr - 1):
        raise TileProblem(f"{tpr} invocations per row of Q (workgroup / tile q) is not a power of two",
                          key="target.wgsl", hint="make workgroup = tile q x 1, 2, 4, 8, 16 or 32")
    for d in (spec.head_dim_qk, spec.head_dim_v):
        if d % tpr:
            raise TileProblem(f"{tpr} invocations per row of Q do not divide head dim {d}",
                              key="target.wgsl", hint="use fewer invocations per row")
    if tpr == 1:
        subgroups = False  # one invocation per row: nothing to reduce, no feature needed
    elif subgroups is None:
        subgroups = tpr <= sg_min
    elif subgroups and tpr > sg_min:
        raise TileProblem(f"subgroups=on with {tpr} invocations per row of Q, but {profile.name} "
                          f"guarantees subgroups of only {sg_min}", key="target.wgsl",
                          hint=f"use workgroup = tile q x {sg_min} or fewer")
    wg = tile_q * tpr
    if wg > max_inv:
        raise TileProblem(f"workgroup of {wg} invocations (tile q={tile_q} x {tpr} per row) exceeds "
                          f"{profile.name}'s {max_inv}", hint="use a smaller tile q")
    given_kv = spec.tile.kv
    if given_kv is not None and given_kv > 128:
        raise TileProblem(f"tile kv={given_kv} is too large for WGSL (at most 128: each invocation "
                          "keeps a tile row of scores in registers)", hint="try tile kv=32")
    tile_kv = given_kv if given_kv is not None else row["tile_kv"]
    limit = profile.limit("workgroup_storage_bytes")
    while True:
        buffers, smem = _wgsl_layout(spec, tile_q, tile_kv, tpr, subgroups)
        if smem <= limit or given_kv is not None or tile_kv <= 4:
            break
        tile_kv //= 2
    if smem > limit:
        raise TileProblem(
            f"tile q={tile_q} kv={tile_kv} with head_dim qk={spec.head_dim_qk} v={spec.head_dim_v} "
            f"needs {smem} bytes of workgroup memory ({_describe(buffers)}), but {profile.name} "
            f"allows {limit}", hint="use a smaller tile kv")
    return WgslConfig(tile_q, tile_kv, tpr, subgroups, spec.head_dim_qk, spec.head_dim_v, buffers, smem)
