"""The WGSL tile configuration: tiles, the register sub-block of each invocation, and the
workgroup-memory layout.

The backend's configure(): the checker runs it once (a configuration that cannot work is a
Problem, with the bytes it needs and the limit) and the plan is built from what it returns.
Values the spec leaves at `auto` come from the profile's tuned defaults and are shrunk until
they fit; values the spec gives are never changed: if they do not fit, that is an error.

The kernel is register-tiled (docs/design-notes.md, "WGSL register tiling"): a workgroup of
TILE_Q rows is TR x TC invocations; invocation (tr, tc) owns R = TILE_Q / TR rows of the tile
(tr + TR * i), C = TILE_KV / TC keys of S (tc + TC * u) and, of acc, the same R rows x the
column groups tc + TC * w (4 columns each, vec4). Q, K, V and P pass through workgroup memory
as vec4, so one 16-byte load feeds R (or C) 4-term dot products. TC invocations share a row
(threads_per_row): its max is reduced over them per tile (subgroup shuffles or workgroup memory),
its sum once at the end. With TC = 1 an invocation owns whole rows of S: P stays in registers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...lang.spec import AttentionSpec
from ...plan.kernel_plan import Problem, describe_buffers as _describe, place_buffers as _layout
from ...plan.profiles import Profile
from .decode import plan_decode
from .tiles import DEFAULT, VEC, WgslTiles, tiles_for


def register_budget(profile: Profile, t: WgslTiles) -> tuple[int, int]:
    """(scores, accumulators): the f32 values of S (R x C) and of acc (R x columns) one invocation
    may hold. A wider head dim v is split over V_BLOCKS workgroups per row tile (grid.y = Hq *
    V_BLOCKS), each computing V_COLS columns. A profile may set its own budget ([limits]
    invocation_scores, invocation_accumulators): GPUs whose occupancy falls fast with registers
    per invocation (Adreno, Intel) take smaller sub-blocks; else the table's (tiles.py)."""
    return (int(profile.limits.get("invocation_scores", t.max_scores)),
            int(profile.limits.get("invocation_accumulators", t.max_accumulators)))


@dataclass(frozen=True)
class WgslConfig:
    tile_q: int
    tile_kv: int
    threads_per_row: int   # TC: invocations sharing a row of the tile (its keys and output columns)
    rows: int              # R: rows of the tile each invocation owns
    subgroups: bool
    d_qk: int
    d_v: int
    buffers: tuple
    smem_bytes: int
    # tile d: head-dim columns of Q, K and V per chunk in workgroup memory; None = the whole head
    # dims at once (Q resident for the whole loop, one K and one V tile per step, no chunk loops).
    tile_d: int | None = None
    tile_d_given: bool = False  # from the spec's `tile d=` (else chosen because the head dim did not fit)
    v_blocks: int = 1  # workgroups splitting the output columns (grid.y = Hq * v_blocks)
    # f16 storage without shader-f16: tensors are read and written as pairs of f16 in u32 words
    # (unpack2x16float / pack2x16float) and all arithmetic is f32 (f16_storage()).
    f16_packed: bool = False
    pad: int = DEFAULT.row_pad  # elements of padding on rows of sQ, sK and sP
    budget: tuple = (DEFAULT.max_scores, DEFAULT.max_accumulators)  # the profile's register budget (register_budget)
    # the next step's Q / K / V tiles loaded into registers during the current step's math
    # (prefetch_choice; kernel.wgsl.j2 section prefetch)
    prefetch: bool = False
    # the table's accumulators per invocation (WgslTiles.max_accumulators), which the source's note
    # on V_BLOCKS prints (where a profile sets its own budget, budget[1] is what the plan used)
    table_accumulators: int = DEFAULT.max_accumulators
    # the decode kernel's shape where it serves the spec (decode.py; templates/wgsl/decode.wgsl.j2), else
    # None: the register-tiled kernel. Its tile_q is the decode rows, tile_kv its keys per step.
    decode: object = None
    # the subgroup-matrix family's config (matrix.py, kernel_sgmat.wgsl.j2); None: the scalar family
    matrix: object = None

    def items(self, rows: int, cols: int) -> int:
        """vec4 items of a rows x cols tile each invocation copies (all copy together)."""
        return -(-rows * (cols // VEC) // self.workgroup)

    @property
    def prefetch_items(self) -> dict:
        """Registers (vec4 each) of the prefetched tiles per invocation: Q_ITEMS (chunked: Q is
        re-read with each K/V tile), K_ITEMS, V_ITEMS."""
        out = {"K_ITEMS": self.items(self.tile_kv, self.tile_dqk), "V_ITEMS": self.items(self.tile_kv, self.tile_dv)}
        if self.chunked:
            out["Q_ITEMS"] = self.items(self.tile_q, self.tile_dqk)
        return out

    @property
    def workgroup(self) -> int:
        if self.decode is not None:
            return self.decode.workgroup
        return self.tile_q // self.rows * self.threads_per_row

    @property
    def row_groups(self) -> int:
        """TR: invocations along the rows (workgroup / threads_per_row)."""
        return self.tile_q // self.rows

    @property
    def keys(self) -> int:
        """C: keys of S per invocation."""
        return self.tile_kv // self.threads_per_row

    @property
    def cols(self) -> int:
        """Columns of acc per invocation (of the workgroup's V_COLS)."""
        return self.v_cols // self.threads_per_row

    @property
    def reduction(self) -> str:
        """How a row's max and sum are combined over its invocations: none, subgroup or workgroup."""
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
        """Columns of Q and K per chunk (a head dim narrower than tile d is one chunk)."""
        return min(self.tile_d, self.d_qk) if self.chunked else self.d_qk

    @property
    def tile_dv(self) -> int:
        return min(self.tile_d, self.v_cols) if self.chunked else self.v_cols

    @property
    def chunk_summary(self) -> str:
        """How the head dims are split, in words (attngen check, source headers)."""
        if self.decode is not None:
            return "whole head dims, streamed from global memory in 16-byte items (the decode kernel)"
        if not self.chunked:
            return "whole head dims in workgroup memory"
        why = "from the spec" if self.tile_d_given else "chosen: the whole head dim does not fit"
        text = (f"tile d={self.tile_d} ({why}): Q and K in {self.d_qk // self.tile_dqk} chunk(s) of "
                f"{self.tile_dqk}, V in {self.v_cols // self.tile_dv} of {self.tile_dv}")
        if self.v_blocks > 1:
            text += f"; out split over {self.v_blocks} workgroups of {self.v_cols} columns"
        return text

    @property
    def smem_summary(self) -> str:
        text = _describe(self.buffers)
        return f"{text}; {self.chunk_summary}" if self.chunked else text

    @property
    def sub_block(self) -> str:
        """The register sub-block of one invocation, in words."""
        return (f"sub-block {self.rows} row(s) x {self.keys} key(s) of S and {self.rows} x {self.cols} "
                f"columns of acc per invocation")

    def summary(self) -> str:
        """One line a person reads in `attngen check` and in source headers."""
        if self.decode is not None:
            return self.decode.summary() + (", f16 packed in u32 words" if self.f16_packed else "")
        if self.matrix is not None:
            m = self.matrix
            return (f"tile q={self.tile_q} kv={self.tile_kv}, subgroup matrix {m.m}x{m.n}x{m.k} f16 -> f32: "
                    f"workgroup {self.workgroup} ({self.workgroup // m.max_subgroup_size} subgroups of "
                    f"{m.max_subgroup_size}, each {m.m} rows of Q), S and P through workgroup memory")
        how = {"subgroup": "row max and sum over subgroup shuffles",
               "workgroup": "row max and sum through workgroup memory",
               "none": "whole rows per invocation"}[self.reduction]
        who = (f"workgroup {self.workgroup} ({self.row_groups} row groups x {self.threads_per_row} "
               f"invocations per row), {self.sub_block}, {how}")
        packed = ", f16 packed in u32 words (f32 arithmetic)" if self.f16_packed else ""
        ahead = ", the next tiles prefetched into registers" if self.prefetch else ""
        return f"tile q={self.tile_q} kv={self.tile_kv}, {who}{packed}{ahead}"


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


def _wgsl_layout(spec, tile_q, tile_kv, tc, subgroups, cols_qk, cols_v, chunked, pad, packed=False):
    """Workgroup buffers: the Q tile (resident) or chunk, K and V tiles of `cols_*` columns (whole
    head dims: separate; chunks: one buffer sKV holding a K chunk, then a V chunk), P when
    several invocations share a row, and the row reduction buffer without subgroups. With packed
    f16 storage the tiles hold the values widened to f32."""
    elem = "f32" if packed else spec.dtype
    entries = [("sQ", elem, 1, tile_q, cols_qk + pad,
                "one d-chunk of the Q tile" if chunked else "the Q tile, resident for the whole loop")]
    if chunked:
        entries.append(("sKV", elem, 1, tile_kv, max(cols_qk + pad, cols_v),
                        "one d-chunk of the current K tile, then of the V tile"))
    else:
        entries += [("sK", elem, 1, tile_kv, cols_qk + pad, "the current K tile"),
                    ("sV", elem, 1, tile_kv, cols_v, "the current V tile")]
    if tc > 1:
        entries.append(("sP", "f32", 1, tile_q, tile_kv + pad, "probabilities P of the tile, for P V"))
        entries.append(("p_zero_tile", "u32", 1, 1, 1, "the last tile in which some p was 0 (it + 1)"))
        entries.append(("v_nonfinite_tile", "u32", 1, 1, 1, "the last tile whose V holds inf or NaN (it + 1)"))
        if not subgroups:
            entries.append(("sRed", "f32", 1, tile_q, tc, "a row's partial max (and sum) per invocation of the row"))
    return _layout(entries)


def wgsl_subgroup_choice(spec: AttentionSpec, profile: Profile) -> bool | None:
    """True/False when decided by the spec and profile alone; None: depends on the row width."""
    mode = spec.options("wgsl").get("subgroups") or "auto"
    if mode == "off":
        return False
    if mode == "on":
        return True
    return None if profile.has_feature("subgroups") else False


def prefetch_choice(spec: AttentionSpec, profile: Profile, cfg: "WgslConfig", t: WgslTiles) -> bool:
    """Whether the main loop loads the next step's tiles into registers during the current step's
    math (the spec's `target wgsl { prefetch=... }`; auto: the profile's `[dialect] prefetch_tiles`
    where each tile costs at most WgslTiles.prefetch_max_items vec4 per invocation). The two_pass schedule's
    second entry point keeps plain copies."""
    mode = spec.options("wgsl").get("prefetch") or "auto"
    most = max(cfg.prefetch_items.values())
    if mode == "off":
        return False
    if mode == "on":
        if most > t.prefetch_limit_items:
            raise Problem(f"prefetch=on would hold {most} vec4 of the next tile in each invocation's registers "
                          f"(at most {t.prefetch_limit_items}): the workgroup of {cfg.workgroup} is small for "
                          f"tile q={cfg.tile_q} kv={cfg.tile_kv}", key="target.wgsl",
                          hint="use prefetch=off, a smaller tile or more invocations")
        return True
    return bool(profile.section("dialect").get("prefetch_tiles", False)) and most <= t.prefetch_max_items


def _chunk_fits(width: int, d: int) -> bool:
    """A chunk of d columns covers `width` columns exactly (or the width is one chunk)."""
    return width <= d or width % d == 0


def _v_blocks(d_v: int, tc: int, rows: int, tile_d: int | None, max_acc: int) -> int:
    """Fewest workgroups to split the output columns over so that each invocation keeps at most
    max_acc accumulators (rows x columns; the profile's register budget), each block a whole
    number of vec4 column groups per invocation (and of tile d chunks)."""
    for b in range(1, d_v // (VEC * tc) + 1):
        cols = d_v // b
        if d_v % b or cols % (VEC * tc):
            continue
        chunkable = _chunk_fits(cols, tile_d) if tile_d is not None else b == 1 or cols % 8 == 0
        if rows * cols // tc <= max_acc and chunkable:
            return b
    return 0  # none: the caller tries other sub-blocks


def _sub_blocks(spec, profile, row, tile_q, subgroups, t):
    """(threads_per_row, rows, subgroups) to try, in order of preference, checked against the
    spec's own `workgroup`."""
    sg_min = int(profile.features.get("subgroup_min_size", 4))
    max_inv = profile.limit("invocations_per_workgroup")
    wg = spec.options("wgsl").get("workgroup")
    if wg is not None:
        if wg >= tile_q:
            if wg % tile_q:
                raise Problem(f"workgroup={wg} is not a multiple of tile q={tile_q} (each row of Q "
                              "gets the same number of invocations)", key="target.wgsl")
            shapes = [(wg // tile_q, 1)]
        else:
            if tile_q % wg:
                raise Problem(f"workgroup={wg} does not divide tile q={tile_q} (each invocation "
                              "owns the same number of rows)", key="target.wgsl")
            shapes = [(1, tile_q // wg)]
        tc = shapes[0][0]
        if tc & (tc - 1) or shapes[0][1] & (shapes[0][1] - 1):
            raise Problem(f"{tc} invocations per row of Q (workgroup / tile q) is not a power of two",
                          key="target.wgsl", hint="make workgroup = tile q x 1, 2, 4, 8, 16 or 32")
    else:
        tc = row["threads_per_row"]
        if subgroups is not False:
            tc = min(tc, sg_min)
        tcs = []
        while tc >= 1:
            tcs.append(tc)
            tc //= 2
        shapes = []
        for tc in tcs:
            max_rows = int(row.get("rows_per_invocation", t.max_rows))  # the profile's cap, if any
            for r in (r for r in (t.max_rows, 2, 1) if r <= max_rows):
                if tile_q % r == 0 and r <= tile_q and (tile_q // r * tc >= min(t.min_workgroup, tile_q * tc)):
                    shapes.append((tc, r))
                    break
            # rows enough to keep the workgroup within the profile's invocations
            r = 1
            while r < tile_q and tile_q // r * tc > max_inv:
                r *= 2
            if (tc, r) not in shapes and tile_q % r == 0:
                shapes.append((tc, r))
    out = []
    for tc, r in shapes:
        if tc == 1:
            sg = False  # whole rows per invocation: nothing to reduce, no feature needed
        elif subgroups is None:
            sg = tc <= sg_min
        elif subgroups and tc > sg_min:
            if wg is not None:
                raise Problem(f"subgroups=on with {tc} invocations per row of Q, but {profile.name} "
                              f"guarantees subgroups of only {sg_min}", key="target.wgsl",
                              hint=f"use workgroup = tile q x {sg_min} or fewer")
            continue
        else:
            sg = subgroups
        out.append((tc, r, sg))
    return out


def _kv_steps(given_kv, default_kv):
    """tile kv values to try: the given one, else the default halved down to 4."""
    if given_kv is not None:
        return [given_kv]
    out = [default_kv]
    while out[-1] > 4:
        out.append(out[-1] // 2)
    return out


def wgsl_config(spec: AttentionSpec, profile: Profile) -> WgslConfig:
    """Resolve tiles and the sub-block for WGSL; raise Problem if the spec's own choices cannot
    work.

    Candidates are tried in order, the first that fits the profile's workgroup storage and
    invocations wins: for each sub-block (the profile's invocations per row first, then fewer,
    down to whole rows per invocation), each tile kv (shrinking down to 4 when not given), the
    whole head dims first (Q resident) then chunks of tile d columns (the spec's d as given,
    else the widest that fits), rows padded first, then unpadded.
    """
    from . import matrix
    if matrix.uses_family(spec, profile, f16_storage(spec, profile)):  # on, or auto's choice (matrix.auto_picks)
        return matrix.matrix_config(spec, profile, WgslConfig)
    row = profile.default_row(max(spec.head_dim_qk, spec.head_dim_v), dtype=spec.dtype,
                              schedule="split" if spec.schedule.is_split else "fused")
    max_inv = profile.limit("invocations_per_workgroup")
    tile_q = spec.tile.q if spec.tile.q is not None else row["tile_q"]
    given_kv, given_d = spec.tile.kv, spec.tile.d
    if given_kv is not None and given_kv > 128:
        raise Problem(f"tile kv={given_kv} is too large for WGSL (at most 128: an invocation "
                      "keeps its keys' scores in registers)", hint="try tile kv=32")
    d_qk, d_v = spec.head_dim_qk, spec.head_dim_v
    if given_d is not None and not _chunk_fits(d_qk, given_d):
        good = [c for c in range(8, d_qk, 8) if d_qk % c == 0]
        raise Problem(f"tile d={given_d} does not divide head_dim qk={d_qk} (the chunks cover the "
                      "head dim exactly)", hint=f"use d={good[-1]}" + (f" or d={good[0]}" if len(good) > 1
                                                                    else "") if good else None)
    t = tiles_for(profile)
    packed = f16_storage(spec, profile) == "packed"
    decode = plan_decode(spec, profile, t)
    if decode is not None:  # the decode kernel (decode.py): none of the register tiling below
        shape, buffers, smem = decode
        return WgslConfig(shape.rows, shape.step, shape.team, 1, True, d_qk, d_v, buffers, smem, f16_packed=packed,
                          pad=0, decode=shape)
    shapes = _sub_blocks(spec, profile, row, tile_q, wgsl_subgroup_choice(spec, profile), t)
    if given_d is not None and spec.options("wgsl").get("workgroup") is not None:
        tc = shapes[0][0] if shapes else 1
        if min(given_d, d_v) % (VEC * tc):
            raise Problem(f"tile d={given_d} is not a multiple of {VEC * tc} (4 columns for each of the {tc} "
                          "invocations per row)", hint=f"use a multiple of {VEC * tc} for d, or fewer "
                                                        "invocations per row")
    limit = profile.limit("workgroup_storage_bytes")
    max_scores, max_acc = register_budget(profile, t)
    kv_steps = _kv_steps(given_kv, row["tile_kv"])
    tried, last, why = [], None, None

    if spec.options("wgsl").get("workgroup") is not None and shapes:
        tc, r = shapes[0][:2]
        if not _v_blocks(d_v, tc, r, given_d, max_acc):
            if d_v % (VEC * tc):
                raise Problem(f"{tc} invocations per row of Q do not divide head dim v={d_v} into vec4 groups of "
                              "output columns (each invocation owns a multiple of 4 of them)", key="target.wgsl",
                              hint="use fewer invocations per row (a smaller workgroup for this tile q)")
            fewest = r * VEC  # an invocation's rows x one vec4 group of columns
            raise Problem(f"workgroup={tc * tile_q // r}: each invocation owns {r} row(s) of the {tile_q}-row "
                          f"tile, and {r} row(s) x at least {VEC} output columns per column block do not fit "
                          f"the {max_acc} accumulators {profile.name} allows per invocation"
                          if fewest > max_acc else
                          f"workgroup={tc * tile_q // r}: each invocation owns {r} row(s) of the {tile_q}-row "
                          f"tile x {d_v // tc} output columns = {r * d_v // tc} accumulators, above the {max_acc} "
                          f"{profile.name} allows, and no split of the {d_v} columns into column blocks"
                          + (f" of whole tile d={given_d} chunks" if given_d is not None else "") + " fits",
                          key="target.wgsl",
                          hint="use a smaller tile q or a larger workgroup (fewer rows per invocation)")
    for tc, r, sg in shapes:
        wg = tile_q // r * tc
        if wg > max_inv:
            why = why or Problem(f"workgroup of {wg} invocations (tile q={tile_q}: {tile_q // r} row groups x "
                                 f"{tc} per row) exceeds {profile.name}'s {max_inv}", hint="use a smaller tile q")
            continue
        for tile_kv in kv_steps:
            if tile_kv % tc or tile_kv // tc * r > max_scores * (1 if given_kv is None else 4):
                continue
            v_blocks = _v_blocks(d_v, tc, r, given_d, max_acc)
            if not v_blocks:
                continue
            v_cols = d_v // v_blocks
            chunks = _chunks(d_qk, v_cols, tc, given_d) if (given_d is not None or v_blocks > 1) else \
                [None] + _chunks(d_qk, v_cols, tc, None)
            for tile_d in chunks:
                for pad in (t.row_pad, 0):
                    cols = (d_qk, d_v) if tile_d is None else (min(tile_d, d_qk), min(tile_d, v_cols))
                    if cols[1] % (VEC * tc):
                        continue
                    buffers, smem = _wgsl_layout(spec, tile_q, tile_kv, tc, sg, *cols, tile_d is not None,
                                                 pad, packed=packed)
                    cfg = WgslConfig(tile_q, tile_kv, tc, r, sg, d_qk, d_v, buffers, smem, tile_d,
                                     given_d is not None, v_blocks, f16_packed=packed, pad=pad,
                                     budget=(max_scores, max_acc), table_accumulators=t.max_accumulators)
                    last = last or cfg
                    if smem <= limit:
                        return replace(cfg, prefetch=prefetch_choice(spec, profile, cfg, t))
                    tried.append(cfg)
    if last is None:
        if why is not None:
            raise why
        raise Problem(f"no register sub-block fits tile q={tile_q} kv={kv_steps[0]} with head_dim "
                      f"qk={d_qk} v={d_v} (an invocation owns whole vec4 groups of output columns and "
                      f"an equal share of the tile's keys)", key="target.wgsl" if spec.options("wgsl").get("workgroup")
                      else None, hint="use fewer invocations per row (target wgsl { workgroup=... }) or a "
                                      "larger tile kv")
    # Report the whole-head-dim attempt of the preferred sub-block at the smallest tile kv tried
    # (unpadded) when that was an option, else the attempt that came closest.
    first = (tried[0].threads_per_row, tried[0].rows)
    whole = [c for c in tried if c.tile_d is None and c.pad == 0 and (c.threads_per_row, c.rows) == first]
    best = whole[-1] if whole else min(tried, key=lambda c: c.smem_bytes)
    what = f"tile q={tile_q} kv={best.tile_kv}" + ("" if best.tile_d is None else f" d={best.tile_d}")
    raise Problem(
        f"{what} with head_dim qk={d_qk} v={d_v} needs {best.smem_bytes} bytes of workgroup memory "
        f"({_describe(best.buffers)}), but {profile.name} allows {limit}",
        hint=("use a smaller tile kv" if best.tile_kv > 4 else "use a smaller tile q")
        if given_d is None else "use a smaller tile d or tile kv")


def _chunks(d_qk, v_cols, tc, given_d):
    """tile d values: the given one, else multiples of 8 (and of 4 x tc) covering both the qk
    head dim and the workgroup's output columns exactly, widest first."""
    if given_d is not None:
        return [given_d]
    step = max(8, VEC * tc)
    return [c for c in range(max(d_qk, v_cols) // step * step, 0, -step)
            if _chunk_fits(d_qk, c) and _chunk_fits(v_cols, c)]


configure = wgsl_config  # the backend's configure() (attngen.backends.base.Backend)


# ---- the backward (issue 41; templates/wgsl/backward.wgsl.j2, docs/backward.md) ----------------

# Workgroup memory every backward plan fits in: WebGPU's default maxComputeWorkgroupStorageSize,
# which every adapter offers, so the backward of a spec is the same on every profile.
BACKWARD_SMEM_BYTES = 16384
BACKWARD_WORKGROUP = 64  # invocations per workgroup of the three backward entry points
# (rows, keys) of the backward's blocks, largest first; the first that fits is taken
_BACKWARD_BLOCKS = ((16, 16), (16, 8), (8, 16), (8, 8), (8, 4), (4, 8), (4, 4), (4, 2), (2, 4), (2, 2),
                    (2, 1), (1, 2), (1, 1))


@dataclass(frozen=True)
class WgslBackward:
    """The backward's blocks: BQ query rows x BKV keys. Each block of Q, dO, K and V sits in
    workgroup memory as f32 vec4, with P and dS of the block pair and lse, D of the rows.
    BQ divides the forward's tile q and BKV its tile kv, so that a block lies inside one tile of
    a custom mask's BlockMask (built with the forward's tiles)."""

    block_q: int
    block_kv: int
    d_qk: int
    d_v: int
    workgroup: int = BACKWARD_WORKGROUP
    partials: bool = False  # `grad` inputs summed through partials: sG, sS per pair (expr_grads.py)

    @property
    def smem_bytes(self) -> int:
        return backward_smem(self.block_q, self.block_kv, self.d_qk, self.d_v, self.partials)

    def items(self, rows: int, cols: int) -> int:
        """vec4 items of a rows x cols block each invocation owns."""
        return -(-rows * (cols // VEC) // self.workgroup)

    @property
    def summary(self) -> str:
        return (f"blocks of {self.block_q} query rows x {self.block_kv} keys, {self.workgroup} invocations, "
                f"{self.smem_bytes} bytes of workgroup memory (sQ, sdO {self.block_q} x {self.d_qk} / "
                f"{self.d_v}, sK, sV {self.block_kv} x {self.d_qk} / {self.d_v}, sP, sdS {self.block_q} x "
                f"{self.block_kv}{', sG, sS' if self.partials else ''}, lse and D {self.block_q}, all f32)")


def backward_smem(bq: int, bkv: int, d_qk: int, d_v: int, partials: bool = False) -> int:
    """Bytes of the backward's workgroup memory (f32): sQ, sdO, sK, sV, sP, sdS, sLse, sD; with
    `partials` sG and sS too (a pair's ds and s for the `grad` inputs' partial sums)."""
    return 4 * ((bq + bkv) * (d_qk + d_v) + (4 if partials else 2) * bq * bkv + 2 * bq)


def backward_config(plan) -> WgslBackward | None:
    """The backward's blocks for the forward plan `plan` (None: even one row and one key do not
    fit BACKWARD_SMEM_BYTES: head dims too large for this backward)."""
    from . import expr_grads
    partials = bool(expr_grads.partials(plan.spec))
    for bq, bkv in _BACKWARD_BLOCKS:
        if plan.tile_q % bq or plan.tile_kv % bkv:
            continue
        if backward_smem(bq, bkv, plan.d_qk, plan.d_v, partials) <= BACKWARD_SMEM_BYTES:
            return WgslBackward(bq, bkv, plan.d_qk, plan.d_v, partials=partials)
    return None
