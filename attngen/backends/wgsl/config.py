"""The WGSL tile configuration: tile sizes, invocations per row and the workgroup-memory layout.

The backend's configure(): the checker runs it once (a configuration that cannot work is a
Problem, with the bytes it needs and the limit) and the plan is built from what it returns.
Values the spec leaves at `auto` come from the profile's tuned defaults and are shrunk until
they fit; values the spec gives are never changed: if they do not fit, that is an error.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...lang.spec import AttentionSpec
from ...plan.kernel_plan import Problem, describe_buffers as _describe, place_buffers as _layout
from ...plan.profiles import Profile

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
    # f16 storage without shader-f16: tensors are read and written as pairs of f16 in u32 words
    # (unpack2x16float / pack2x16float) and all arithmetic is f32 (f16_storage()).
    f16_packed: bool = False

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

    def summary(self) -> str:
        """One line a person reads in `attngen check` and in source headers."""
        how = {"subgroup": "subgroup reductions", "workgroup": "workgroup-memory reductions",
               "none": "no cross-invocation reductions"}[self.reduction]
        who = f"workgroup {self.workgroup} ({self.tile_q} rows x {self.threads_per_row} invocations), {how}"
        packed = ", f16 packed in u32 words (f32 arithmetic)" if self.f16_packed else ""
        return f"tile q={self.tile_q} kv={self.tile_kv}, {who}{packed}"


def f16_storage(spec: AttentionSpec, profile: Profile) -> str | None:
    """How f16 tensors are stored: "native" (WGSL's f16 type, the shader-f16 feature) or "packed"
    (two f16 in each u32 word, converted with unpack2x16float / pack2x16float, arithmetic in f32);
    None when the spec stores f32. The spec's `target wgsl { f16=... }` decides, else the
    profile's `[dialect] f16_storage`; "auto" (the default) is native where the profile may use
    shader-f16 and packed where it may not (an adapter without the feature: the runtime's
    profile of the live adapter lists only the features it has). A spec with f16 accumulators
    (f16 arithmetic, which needs shader-f16) is native unless it says packed itself."""
    if spec.dtype != "f16":
        return None
    mode = spec.options("wgsl").get("f16")
    if mode in (None, "auto"):
        mode = profile.section("dialect").get("f16_storage", "auto")
        if "f16" in (spec.acc_qk, spec.acc_pv) and profile.may_use_feature("shader-f16"):
            mode = "native"  # f16 accumulators are f16 arithmetic: they need shader-f16 anyway
    if mode == "auto":
        mode = "native" if profile.may_use_feature("shader-f16") else "packed"
    return mode


def _wgsl_layout(spec, tile_q, tile_kv, threads_per_row, subgroups, cols_qk, cols_v, packed=False):
    """Workgroup buffers: K and V tiles of `cols_*` columns (whole head dims or one chunk); with
    packed f16 storage the tiles hold the values widened to f32."""
    elem = "f32" if packed else spec.dtype
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
    mode = spec.options("wgsl").get("subgroups") or "auto"
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
        # a split output must be chunkable when tile d is chosen later: whole multiples of 8 columns
        chunkable = _chunk_fits(d_v // b, tile_d) if tile_d is not None else b == 1 or (d_v // b) % 8 == 0
        if n % b == 0 and n // b <= WGSL_MAX_DIMS_V and chunkable:
            return b
    return n  # not reached: b = n gives tpr columns per block, and tile d is a multiple of tpr


def _wgsl_rows(spec, profile, row, tile_q, subgroups):
    """Invocations per row of Q (and whether subgroups reduce them), checked."""
    sg_min = int(profile.features.get("subgroup_min_size", 4))
    given_d = spec.tile.d
    wg = spec.options("wgsl").get("workgroup")
    if wg is not None:
        if wg % tile_q:
            raise Problem(f"workgroup={wg} is not a multiple of tile q={tile_q} (each row of Q "
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
        raise Problem(f"{tpr} invocations per row of Q (workgroup / tile q) is not a power of two",
                          key="target.wgsl", hint="make workgroup = tile q x 1, 2, 4, 8, 16 or 32")
    for d in (spec.head_dim_qk, spec.head_dim_v):
        if d % tpr:
            raise Problem(f"{tpr} invocations per row of Q do not divide head dim {d}",
                              key="target.wgsl", hint="use fewer invocations per row")
    if given_d is not None and given_d % tpr:
        raise Problem(f"tile d={given_d} is not a multiple of the {tpr} invocations per row of Q "
                          "(each owns the same number of a chunk's columns)",
                          hint=f"use a multiple of {tpr} for d, or fewer invocations per row")
    if tpr == 1:
        subgroups = False  # one invocation per row: nothing to reduce, no feature needed
    elif subgroups is None:
        subgroups = tpr <= sg_min
    elif subgroups and tpr > sg_min:
        raise Problem(f"subgroups=on with {tpr} invocations per row of Q, but {profile.name} "
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
    """Resolve tiles for WGSL; raise Problem if the spec's own choices cannot work.

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
        raise Problem(f"workgroup of {wg} invocations (tile q={tile_q} x {tpr} per row) exceeds "
                          f"{profile.name}'s {max_inv}", hint="use a smaller tile q")
    given_kv, given_d = spec.tile.kv, spec.tile.d
    if given_kv is not None and given_kv > 128:
        raise Problem(f"tile kv={given_kv} is too large for WGSL (at most 128: each invocation "
                          "keeps a tile row of scores in registers)", hint="try tile kv=32")
    d_qk, d_v = spec.head_dim_qk, spec.head_dim_v
    if given_d is not None and not _chunk_fits(d_qk, given_d):
        good = [c for c in range(tpr, d_qk, tpr) if d_qk % c == 0 and c % 8 == 0]
        raise Problem(f"tile d={given_d} does not divide head_dim qk={d_qk} (the chunks cover the "
                          "head dim exactly)", hint=f"use d={good[-1]}" + (f" or d={good[0]}" if len(good) > 1
                                                                        else "") if good else None)
    v_blocks = _wgsl_v_blocks(d_v, tpr, given_d)
    v_cols = d_v // v_blocks
    limit = profile.limit("workgroup_storage_bytes")
    kv_steps = _kv_steps(given_kv, row["tile_kv"])

    packed = f16_storage(spec, profile) == "packed"

    def make(tile_kv, tile_d):
        cols = (d_qk, d_v) if tile_d is None else (min(tile_d, d_qk), min(tile_d, v_cols))
        buffers, smem = _wgsl_layout(spec, tile_q, tile_kv, tpr, subgroups, *cols, packed=packed)
        return WgslConfig(tile_q, tile_kv, tpr, subgroups, d_qk, d_v, buffers, smem, tile_d,
                          given_d is not None, v_blocks, f16_packed=packed)

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
        if not chunks:
            raise Problem(
                f"head_dim qk={d_qk} v={d_v} does not fit whole, and no chunk of a multiple of {step} columns "
                f"covers both the qk head dim and the {v_cols} output columns per workgroup "
                f"({v_blocks} workgroups share the {d_v}) exactly",
                key="head_dim", hint="use head dims whose chunks line up (e.g. multiples of 32), or fewer "
                                     "invocations per row (target wgsl { workgroup=... })")
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
    raise Problem(
        f"{what} with head_dim qk={d_qk} v={d_v} needs {cfg.smem_bytes} bytes of workgroup memory "
        f"({_describe(cfg.buffers)}), but {profile.name} allows {limit}",
        hint=("use a smaller tile kv" if cfg.tile_kv > 4 else "use a smaller tile q")
        if given_d is None else "use a smaller tile d or tile kv")


configure = wgsl_config  # the backend's configure() (attngen.backends.base.Backend)
