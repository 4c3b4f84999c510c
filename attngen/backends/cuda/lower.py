"""The CUDA part of lowering: the kernel's parameters, grids, workspaces and further entry
points (docs/variants.md, docs/cuda-variants.md).

The lowering driver (attngen.plan.lower) calls lower() through the backend; the emitter prints
the parameter list from the plan and the manifest describes it, so a foreign runtime launches
exactly what the CUDA runtime does.
Groups of parameters are present only when the spec needs them: the block-mask group for
`mask custom`, the block table for `kv_cache paged`, the workspaces for split schedules.
Run-time options that any spec takes (packed sequences, kv_lens, appending) are nullable
pointers of every kernel.

Symbols of the shape and grid formulas: B, Lq (the longest sequence's query rows), Lk (its
keys), Hq, Hkv, G = Hq / Hkv, Dqk, Dv, S (KV splits: the spec's N, or chosen at launch for
split_kv(auto) / two_pass), Tq (rows of the packed q tensor), Tk (keys of the packed k tensor),
P (pages), Pmax (block-table columns), Bm / Hm (mask batch / heads), Nq = ceil(Lq / tile q),
Nk = ceil(Lk / tile kv), SM (the GPU's multiprocessors: the grid of persistent blocks).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...lang.spec import AttentionSpec
from ...plan.kernel_plan import Entry, Lowered, Param, Workspace
from ...plan.profiles import Profile
from ...plan.schedule import main_grid, row_blocks

COMBINE_WARPS = 4  # rows per combine block (one warp each)

_I64, _I32 = "i64", "i32"


@dataclass(frozen=True)
class CudaDetails:
    """What only the CUDA target needs of a plan (KernelPlan.details)."""

    arch: str  # the profile's architecture, e.g. "sm_80": the source needs it or newer
    # The entry point a launch with per-sequence lengths (cu_seqlens_q, kv_lens or an append)
    # takes instead of the main one (CudaConfig.varlen); None: the main one serves every launch.
    varlen: Entry | None = None


def _p(name, kind, dtype, shape=None, access="read", optional=False, doc=""):
    return Param(name, kind, dtype, shape, access, optional, doc=doc)


def _strides(prefix, full, axes):
    return [_p(f"{prefix}_s{a}", "scalar", _I64, doc=f"stride of {full} along its {what} axis, in elements")
            for a, what in axes]


_BLH = (("b", "batch"), ("l", "sequence"), ("h", "head"))


def fused_combine(spec: AttentionSpec, cfg) -> bool:
    """split_kv merges its splits in the main kernel: the last split block of each row tile runs
    the combine (templates/cuda/combine_fused.j2, section "combine (fused ...)"), so a call is one launch.
    two_pass, and kernels whose output columns are split over blocks (chunked head dims), keep
    the combine launch."""
    return spec.schedule.is_split and not spec.schedule.is_two_pass and not cfg.chunked


def main_params(spec: AttentionSpec, counters: tuple | None = None, persistent: bool = False,
                tma: bool = False, tma_q: bool = False, stored_p: bool = False, tma_store: bool = False,
                fp8: bool = False, fp8_tile_kv: int = 0) -> tuple:
    """The main entry point's parameters; `counters`: the shape of the fused combine's
    tile_counters (None: no such parameter); `persistent`: the persistent blocks' batch size and
    work counter (CudaConfig.persistent); `tma`: the tensor maps of K and V (CudaConfig.tma);
    `tma_q`: and of Q before them (CudaConfig.tma_q); `stored_p`: P through memory's workspace
    (CudaConfig.stored_p: its persistent blocks take their items in a fixed order, no counter);
    `tma_store`: the tensor map of out last (CudaConfig.tma_store)."""
    d = spec.dtype
    paged = spec.kv_cache.is_paged
    kv_shape = ("P", spec.kv_cache.page, "Hkv") if paged else ("B", "Lk", "Hkv")
    kv_doc = "; keys kv_lens[b] .. are written in place when k_new / v_new are given"
    where = f" in pages of {spec.kv_cache.page} keys" if paged else " (packed: (Tk, Hkv, D))"
    kv = spec.kv_dtype or d
    if spec.kv_dtype is not None:  # docs/language.md, "Quantized KV caches"
        kv_doc = (f", stored as kv_dtype {spec.kv_dtype} (one byte per value, times its scale)"
                  + kv_doc.replace("written", "quantized and written"))
    ps = [
        _p("q", "tensor", d, ("B", "Lq", "Hq", "Dqk"), doc="queries (packed: (Tq, Hq, Dqk))"),
        _p("k", "tensor", kv, kv_shape + ("Dqk",), "readwrite", doc="keys" + where + kv_doc),
        _p("v", "tensor", kv, kv_shape + ("Dv",), "readwrite", doc="values" + where + kv_doc),
        _p("out", "tensor", spec.output_dtype, ("B", "Lq", "Hq", "Dv"), "write",
           doc="attention output (packed: (Tq, Hq, Dv))"),
        _p("lse", "tensor", "f32", ("B", "Hq", "Lq"), "write", True,
           doc="log-sum-exp of each row's scores (natural log; -inf where a row sees no key), packed: "
               "(Hq, Tq); written only when requested (null: not written)"),
    ]
    for t, full in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "out")):
        ps += _strides(t, full, _BLH)
    ps += [
        _p("len_q", "scalar", _I32, doc="Lq: query rows per sequence (packed: the longest sequence's)"),
        _p("len_k", "scalar", _I32, doc="Lk: keys per sequence when neither kv_lens nor cu_seqlens says"),
        _p("heads_q", "scalar", _I32, doc="Hq, query heads"),
        _p("group", "scalar", _I32, doc="G = Hq / Hkv, query heads per KV head"),
        _p("lse_sb", "scalar", _I64, doc="stride of lse along the batch (padded: Hq * Lq; packed: 0)"),
        _p("lse_sh", "scalar", _I64, doc="stride of lse along the heads (padded: Lq; packed: Tq)"),
        _p("cu_seqlens_q", "tensor", _I32, ("B + 1",), optional=True,
           doc="packed sequences: first q row of each sequence (null: padded)"),
        _p("cu_seqlens_k", "tensor", _I32, ("B + 1",), optional=True,
           doc="packed sequences: first key of each sequence (null: cu_seqlens_q)"),
        _p("kv_lens", "tensor", _I32, ("B",), optional=True,
           doc="keys in each sequence's cache before the append (null: Lk)"),
        _p("k_new", "tensor", d, ("B", "Lnew", "Hkv", "Dqk"), optional=True,
           doc="keys appended at kv_lens[b] in this call (null: no append)"),
        _p("v_new", "tensor", d, ("B", "Lnew", "Hkv", "Dv"), optional=True, doc="values appended with k_new"),
    ]
    ps += _strides("kn", "k_new", _BLH) + _strides("vn", "v_new", _BLH)
    ps.append(_p("len_new", "scalar", _I32, doc="Lnew, rows appended per sequence (0: none)"))
    if spec.kv_dtype is not None:
        ps += kv_scale_params(spec)
    ps += _bounds(spec.kv_dtype)
    if paged:
        ps += [
            _p("block_table", "tensor", _I32, ("B", "Pmax"),
               doc=f"page of key j of sequence b: block_table[b, j / {spec.kv_cache.page}]"),
            _p("bt_stride", "scalar", _I32, doc="Pmax, the block table's row stride"),
        ]
    if spec.mask.is_custom:
        ps += [
            _p("mask_bits", "tensor", "u32", ("Bm", "Hm", "Lq", "Wm"), optional=True,
               doc="boolean mask, bit j % 32 of word j / 32 of a row = key j is seen (BlockMask.data); "
                   "null for an additive mask"),
            _p("mask_add", "tensor", "f32", ("Bm", "Hm", "Lq", "Lk"), optional=True,
               doc="additive mask (-inf = masked); null for a boolean mask"),
            _p("mask_counts", "tensor", _I32, ("Bm", "Hm", "Nq"), doc="live kv tiles per q tile (BlockMask.counts)"),
            _p("mask_tiles", "tensor", _I32, ("Bm", "Hm", "Nq", "Nk"),
               doc="live kv tiles per q tile, ascending, as kv_tile * 2 + partial (BlockMask.tiles)"),
            _p("mask_sb", "scalar", _I64, doc="stride of the mask along the batch (0 when Bm = 1)"),
            _p("mask_sh", "scalar", _I64, doc="stride of the mask along the heads (0 when Hm = 1)"),
            _p("mask_sl", "scalar", _I64, doc="stride of the mask along its rows (Wm words, or Lk floats)"),
            _p("list_sb", "scalar", _I32, doc="stride of mask_counts along the batch (Hm * Nq; 0 when Bm = 1)"),
            _p("list_sh", "scalar", _I32, doc="stride of mask_counts along the heads (Nq; 0 when Hm = 1)"),
            _p("n_kvtiles", "scalar", _I32, doc="Nk, the row length of mask_tiles"),
        ]
    if spec.inputs:
        ps += _inputs(spec)
    if spec.schedule.is_split:
        ps += _workspaces(spec)
    if counters:
        ps.append(_ws_param(tile_counters(counters),
                            "fused combine: per row tile, how many of its splits are done; zero before the "
                            "launch, and left zero by it (the runtime keeps one such buffer per stream)"))
    if persistent:
        ps.append(_p("batch_size", "scalar", _I32, doc="B, sequences (persistent blocks: the grid does not say)"))
    if persistent and not stored_p:
        ps.append(_ws_param(WORK_COUNTER,
                            "persistent blocks: work items handed out after each block's first; zero before the "
                            "launch, and left zero by it (the runtime keeps one such buffer per stream)"))
    if stored_p:
        ps.append(_ws_param(STORED_P,
                            "workspace (P through memory): block x's slot holds, for the row tile it works on, each "
                            "consumer thread's P fragments (16 bytes per 16 keys) and its rows' running max after "
                            "each tile of 256 keys; uninitialised"))
    if fp8:  # the descales and V^T's bad keys (fp8.py; tmap_v is over the vt workspace)
        from . import fp8 as fp8_plan
        ps += fp8_plan.main_params(spec, _p)
    if tma:
        how = ("a CUtensorMap (128 bytes, passed by value) from cuTensorMapEncodeTiled over {t}: "
               "{dtype}, rank 4, dims (D{d}, {h}, {l}, B) innermost first, strides in bytes of its head, {r} and "
               "batch axes, box (64, 1, tile {b}, 1), element strides 1, no interleave, 128-byte swizzle, "
               "L2 promotion 128 bytes, out-of-bounds fill zeros; the main entry point only (the _varlen "
               "entry does not read it: pass any 128 bytes)")
        dt = {"f16": "FLOAT16", "bf16": "BFLOAT16", "e4m3": "UINT16 (two FP8 values an element: dims D / 2)",
              "e5m2": "UINT16 (two FP8 values an element: dims D / 2)"}.get(d, d)
        kv = dict(dtype=dt, h="Hkv", l="Lk", r="key", b="kv")
        if tma_q:
            ps.append(_p("tmap_q", "tensor_map", d, ("Dqk", "Hq", "Lq", "B"),
                         doc=how.format(t="q", d="qk", **{**kv, "h": "Hq", "l": "Lq", "r": "row", "b": "q"})))
        ps += [
            _p("tmap_k", "tensor_map", d, ("Dqk", "Hkv", "Lk", "B"), doc=how.format(t="k", d="qk", **kv)),
            _p("tmap_v", "tensor_map", d, ("Dv", "Hkv", "Lk", "B"), doc=fp8_plan.vt_map_doc(fp8_tile_kv) if fp8
               else how.format(t="v", d="v", **kv)),
        ]
        if tma_store:
            ps.append(_p("tmap_o", "tensor_map", spec.output_dtype, ("Dv", "Hq", "Lq", "B"),
                         doc=f"a CUtensorMap (128 bytes, passed by value) from cuTensorMapEncodeTiled over out: "
                             f"{ {'f16': 'FLOAT16', 'bf16': 'BFLOAT16'}.get(spec.output_dtype, dt)}, "
                             "rank 4, dims (Dv, Hq, Lq, B) innermost first, strides in bytes of its head, row and batch "
                             "axes, box (64, 1, 64, 1) (a warpgroup's rows), element strides 1, no interleave, no "
                             "swizzle, L2 promotion 128 bytes; stores past the bounds are dropped; the main entry point "
                             "only (the _varlen entry does not read it: pass any 128 bytes)"))
    return tuple(ps)


def kv_scale_params(spec: AttentionSpec) -> list:
    """A quantized cache's scales (docs/language.md, "Quantized KV caches"): f32, FP8 one per
    (sequence, KV head), i8 one per 32 values of a row (written by an append at its rows)."""
    paged = spec.kv_cache.is_paged
    if spec.kv_dtype != "i8":
        shape, access = ("B", "Hkv"), "read"
        doc = "f32 scale of each (sequence, KV head) of {x}: a value is scale * the decoded byte"
        axes = (("b", "batch"), ("l", "unused (0)"), ("h", "head"))
    else:
        rows = ("P", spec.kv_cache.page, "Hkv") if paged else ("B", "Lk", "Hkv")
        access = "readwrite"
        doc = ("f32 scale of each 32 values of a row of {x} (its shape with the head dim / 32): a value is "
               "scale * the int8; written at the appended rows when k_new / v_new are given")
        axes = (("b", "page" if paged else "batch"), ("l", "slot" if paged else "sequence"), ("h", "head"))
    ps = []
    for name, x, dim in (("k_scale", "k", "Dqk"), ("v_scale", "v", "Dv")):
        sh = shape if spec.kv_dtype != "i8" else rows + (f"{dim} / 32",)
        ps.append(_p(name, "tensor", "f32", sh, access, doc=doc.format(x=x)))
    for prefix, full in (("ks", "k_scale"), ("vs", "v_scale")):
        ps += _strides(prefix, full, axes)
    return ps


def _bounds(kv_dtype: str | None = None) -> list:
    """What the kernels check integer inputs against (they may stay on the device: docs/variants.md,
    "Integer inputs on the device"), and where they report a bad one."""
    kv = ("; a quantized cache's: 8 k_scale or v_scale not finite and >= 0, 9 an i8 append of inf or NaN"
          if kv_dtype else "")
    return [
        _p("rows_q", "scalar", _I32, doc="packed: rows of q (Tq), which cu_seqlens_q must stay within; else 0"),
        _p("rows_k", "scalar", _I32, doc="packed: rows of k / v (Tk); paged: pages in k / v (P); else 0"),
        _p("errors", "tensor", _I32, ("10" if kv_dtype else "8",), "write", True,
           doc=f"error flags: word 0 cu_seqlens_q, 1 cu_seqlens_k, 2 kv_lens, 3 block_table{kv}; a kernel that "
               "finds a bad entry writes its sequence's index + 1 there (null: not reported)"),
    ]


EXTENTS = ("b", "h", "hkv", "q", "k")  # the index axes an input may have (ext_b .. ext_k; backends/cuda/expr.py)
_AXIS_SYMBOLS = {"b": "B", "h": "Hq", "hkv": "Hkv", "q": "Lq", "k": "Lk"}
_EXTENT_DOCS = {"b": "the batch (B)", "h": "query heads (Hq)", "hkv": "KV heads (Hkv)",
                "q": "query rows of the padded q tensor (Lq)", "k": "keys of the k / v tensors (k.shape[1])"}


def _inputs(spec: AttentionSpec) -> list:
    """The expression inputs (issue 42; backends/cuda/expr.py): one pointer per `input` line, the
    extents of the index axes, and the number added to a read's site where one out of bounds is
    reported in `errors`."""
    ps = [_p(f"input_{i.name}", "tensor", i.dtype, tuple(_AXIS_SYMBOLS.get(a, str(a)) for a in i.axes),
             doc=f"expression input {i.name}[{', '.join(map(str, i.axes))}] {i.dtype}, row-major, contiguous"
                 + (" (bits of each element; bool: one byte, 0 or 1)" if i.dtype in ("bf16", "f16", "bool") else ""))
          for i in spec.inputs]
    ps += [_p(f"ext_{a}", "scalar", _I32, doc=f"extent of the inputs' axis {a}: {_EXTENT_DOCS[a]}")
           for a in EXTENTS]
    ps.append(_p("expr_site0", "scalar", _I32,
                 doc="added to a read's site number (1.. in the manifest's expression sites) where a read out of "
                     "an input's bounds is reported in errors word 4 (0: the site itself)"))
    return ps


def _ws_param(w: Workspace, doc: str = "", access: str = "readwrite") -> Param:
    """The parameter that passes workspace `w` (its name, dtype and shape: declared once, in the
    Workspace the launcher allocates)."""
    return _p(w.name, "tensor", w.dtype, w.shape, access, doc=doc)


def split_workspaces(spec: AttentionSpec) -> tuple:
    """The split schedules' f32 workspaces (uninitialised), declared once: the main entry point
    passes them (main_params, with _WS_DOCS), the combine reads ws_o, ws_lse (and ws_l), and the
    launcher allocates them (workspaces())."""
    if not spec.schedule.is_split:
        return ()
    rows = "B * Hq * Lq"
    out = [Workspace("ws_o", "f32", ("S", rows, "Dv")), Workspace("ws_lse", "f32", ("S", rows))]
    if spec.schedule.is_two_pass:
        out += [Workspace("ws_l", "f32", ("S", rows)), Workspace("ws_s", "f32", (rows, "Lk"))]
    return tuple(out)


_WS_DOCS = {
    "ws_o": "workspace: each split's output for row ((b * Hq + h) * Lq + i), normalised by its own sum",
    "ws_lse": "workspace: each split's log2-domain log-sum-exp (two_pass: its row max m), -inf: no key",
    "ws_l": "workspace (two_pass): each split's row sum l of exp2(t - m)",
    "ws_s": "workspace (two_pass): the transformed, masked scores t (log2 domain: "
            "log2(e) * scale * q.k, softcapped, plus log2(e) * additive mask; -inf where masked)",
}


def _workspaces(spec: AttentionSpec) -> list:
    ps = []
    for w in split_workspaces(spec):
        doc = _WS_DOCS[w.name]
        if w.name == "ws_o" and spec.schedule.is_two_pass:
            doc += " (two_pass: by the merged sum, so the splits add up)"
        ps.append(_ws_param(w, doc))
    if spec.schedule.is_two_pass:
        ps.append(_p("s_stride", "scalar", _I32, doc="row stride of ws_s (Lk)"))
    ps.append(_p("splits", "scalar", _I32, doc="S, KV splits"))
    return ps


# P through memory (CudaConfig.stored_p): one slot per block of the persistent grid, of 2 warpgroups
# x 128 threads x (16 steps of 16 keys x 4 words of P + 2 words of running max) per 256 keys.
STORED_P_SHAPE = ("min(SM, ceil(Lq / 128) * Hq * B)", "16896 * ceil(Lk / 256)")
STORED_P = Workspace("ws_p", "u32", STORED_P_SHAPE)
# The persistent blocks' work counter (persistent: the runtime keeps it zeroed per stream).
WORK_COUNTER = Workspace("work_counter", "u32", ("1",), fill=0, persistent=True)


def tile_counters(shape: tuple) -> Workspace:
    """The fused combine's tile counters of `shape` (counter_shape), persistent and zeroed."""
    return Workspace("tile_counters", "u32", shape, fill=0, persistent=True)


def workspaces(spec: AttentionSpec, cfg) -> tuple:
    """The workspaces the launcher allocates: the split schedules' (split_workspaces) and the
    fused combine's tile counters, the persistent blocks' work counter (persistent, zeroed once),
    or P through memory's slots."""
    if cfg.stored_p:
        return (STORED_P,)
    if cfg.fp8:  # V^T and its bad keys (fp8.py), besides the work counter
        from .fp8 import workspaces as fp8_workspaces
        return (WORK_COUNTER,) + fp8_workspaces(spec)
    if cfg.persistent:
        return (WORK_COUNTER,)
    out = list(split_workspaces(spec))
    if fused_combine(spec, cfg):
        out.append(tile_counters(counter_shape(spec, cfg)))
    return tuple(out)


def counter_shape(spec: AttentionSpec, cfg) -> tuple | None:
    """The fused combine's tile_counters: one per row tile of the main grid (its x / S, y, z)."""
    if not fused_combine(spec, cfg):
        return None
    tiles, heads = row_blocks(spec, cfg.tile_q)
    return (tiles, heads, "B")


def grid(spec: AttentionSpec, cfg, column_blocks: bool | None = None) -> tuple:
    """The main kernel's grid (attngen.plan.schedule.main_grid) with the blocks that split the
    output columns (head = blockIdx.y / v_blocks). two_pass's pass 1 (the main entry) writes
    scores and statistics, no output columns: its y has no column blocks (column_blocks
    defaults to that); its pass 2 has them."""
    if cfg.persistent:  # one block per multiprocessor, or per work item when there are fewer
        rows, heads = row_blocks(spec, cfg.tile_q)
        if cfg.v_blocks > 1:  # items of (head, output column block) pairs
            heads = f"{heads} * {cfg.v_blocks}"
        if cfg.item_per_block:  # persistent=off: one block per work item
            return (f"{rows} * {heads} * B", "1", "1")
        return (f"min({cfg.persistent_blocks}, {rows} * {heads} * B)", "1", "1")
    if column_blocks is None:
        column_blocks = not spec.schedule.is_two_pass
    return main_grid(spec, cfg.tile_q, cfg.v_blocks if column_blocks else 1)


def entries(spec: AttentionSpec, entry: str, cfg) -> tuple:
    """Entry points launched after the main one, in order (FP8's preparation of V: before it)."""
    if cfg.fp8:
        from .fp8 import prepare_entry
        return (prepare_entry(spec, entry, _p, _strides, _bounds()[2]),)
    if not spec.schedule.is_split:
        return ()
    out = []
    if spec.schedule.is_two_pass:
        out.append(Entry("pv", entry + "_pv",
                         "two_pass pass 2: merges the splits' row statistics, P = exp2(t - m) / l from ws_s, "
                         "P V per split into ws_o (no K read); same parameters as the main entry",
                         main_params(spec), grid(spec, cfg, column_blocks=True), cfg.threads, cfg.smem_bytes))
    if fused_combine(spec, cfg):
        return tuple(out)
    d = spec.dtype
    combine = [_ws_param(w, access="read") for w in split_workspaces(spec) if w.name != "ws_s"]
    combine += [
        _p("out", "tensor", d, ("B", "Lq", "Hq", "Dv"), "write"),
        _p("lse", "tensor", "f32", ("B", "Hq", "Lq"), "write", True),
        *_strides("o", "out", _BLH),
        _p("lse_sb", "scalar", _I64), _p("lse_sh", "scalar", _I64),
        _p("cu_seqlens_q", "tensor", _I32, ("B + 1",), optional=True), _p("rows_q", "scalar", _I32),
        _p("len_q", "scalar", _I32), _p("heads_q", "scalar", _I32), _p("batch", "scalar", _I32),
        _p("splits", "scalar", _I32),
    ]
    how = ("sums the splits' outputs; lse from the merged max and sum" if spec.schedule.is_two_pass
           else "lse = log(sum_s exp(lse_s)), out = sum_s exp(lse_s - lse) * out_s; -inf splits weigh 0")
    out.append(Entry("combine", entry + "_combine",
                     f"merges the S partial results of each row into out and lse: {how}. One warp per "
                     "row (b, h, i); rows past a packed sequence's length are skipped. Same names as the main "
                     "entry's parameters mean the same values.",
                     tuple(combine), (f"ceil(B * Hq * Lq / {COMBINE_WARPS})", "1", "1"), 32 * COMBINE_WARPS))
    return tuple(out)


def lower(spec: AttentionSpec, profile: Profile, cfg, entry: str) -> Lowered:
    """The CUDA part of the KernelPlan of `spec` with configuration `cfg`."""
    return Lowered(
        threads=cfg.threads,
        grid=grid(spec, cfg),
        params=main_params(spec, counter_shape(spec, cfg), cfg.persistent, cfg.tma, cfg.tma_q, cfg.stored_p,
                           cfg.tma_store, cfg.fp8, cfg.tile_kv),
        smem_bytes=cfg.smem_bytes,
        entries=entries(spec, entry, cfg),
        workspaces=workspaces(spec, cfg),
        details=CudaDetails(arch=profile.section("device")["arch"], varlen=varlen_entry(spec, cfg, entry)),
        resident_blocks=cfg.resident_blocks,
    )


def varlen_entry(spec: AttentionSpec, cfg, entry: str) -> Entry | None:
    """The main entry point's stand-in for launches with per-sequence lengths (CudaConfig.varlen)."""
    v = cfg.varlen
    if v is None:
        return None
    if v.producer:
        how = (f"the same algorithm with tile q={v.tile_q} kv={v.tile_kv}, persistent blocks whose items cover the "
               "longest sequence, Q, K and V by cp.async")
    elif v.math == cfg.math:
        how = f"the same algorithm with tile q={v.tile_q} (one 16-row fragment per warp)"
    else:
        how = (f"the {'mma.sync' if v.math == 'mma' else v.math} family with tile q={v.tile_q}"
               + (f", head dims in chunks of {v.chunk}" if v.chunked else ""))
    return Entry("varlen", entry + "_varlen",
                 "launched instead of the main entry point when cu_seqlens_q, kv_lens or k_new / v_new is "
                 f"given: {how}; same parameters",
                 main_params(spec, counter_shape(spec, cfg), cfg.persistent, cfg.tma, cfg.tma_q, cfg.stored_p,
                           cfg.tma_store),
                 grid(spec, v) if v.persistent else main_grid(spec, v.tile_q, v.v_blocks), v.threads, v.smem_bytes)
