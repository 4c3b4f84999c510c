"""The WGSL part of lowering: the Params struct, the bindings, the entry points, workspaces.

One WGSL module holds every entry point of a spec (the attention kernel, and for the split
schedules the combine and two_pass's second pass); they share the uniform `params` and the
binding numbers of group 0, and each entry point gets a pipeline layout with only the
bindings it uses, so that none needs more than webgpu-core's 8 storage buffers:

    binding  name      used by                      holds
    0        params    every entry point            struct Params (uniform)
    1        q         attention                    (B, Lq, Hq, Dqk) / packed (total_q, Hq, Dqk)
    2        k         attention                    (B, Lk, Hkv, Dqk) / packed / paged pages
    3        v         attention, pv                (B, Lk, Hkv, Dv) ...
    4        out       fused attention, combine     (B, Lq, Hq, Dv) / packed (total_q, Hq, Dv)
    5        lse       fused attention, combine     (B, Hq, Lq) / packed (Hq, total_q), f32
    6        seq_meta  every entry point            u32 words: cu_seqlens_q/k, kv_lens, block_table
    7        kv_new    attention, pv                k_new then v_new (appending to the cache)
    8        mask      attention, pv (mask custom)  u32 words: counts | tiles | data
    9        o_part    split schedules              (S, B, Lq, Hq, Dv) f32 partial outputs
    10       lse_part  split schedules              (S, B, Hq, Lq) f32 partial lse
    11       s_scratch two_pass                     (B, Hq, Lq, Lk) f32 transformed, masked S
    12       stats     two_pass                     (S, B, Hq, Lq, 2) f32 per-split row max, sum
    13       inputs    attention (specs with inputs)  u32 words: a flag, then each expression input
    14       kv_scale  attention, pv (kv_dtype)     f32: k_scale, then v_scale from word scale_v
    15, 16   k_scale,  the decode kernel (kv_dtype) f32: k_scale and v_scale, one binding each (decode.py)
             v_scale

The decode kernel (decode.py) binds q, k, v, seq_meta, kv_new (without kv_dtype), o_part, lse_part
and, with kv_dtype, k_scale and v_scale: a quantized cache's scales stay where they are (resident
WgslTensors are bound, not copied into one buffer); an append to a quantized cache there reads
k_new / v_new from seq_meta (from word meta_new), not kv_new (8 storage buffers at most,
webgpu-core's limit), and an i8 append writes its new rows' scales into k_scale / v_scale.

k and v are read_write storage in every kernel: a call may append k_new / v_new to the cache
(docs/variants.md), which the attention entry point writes in place. Optional bindings (lse,
kv_new, seq_meta) take any buffer of at least 4 bytes when unused. `inputs` (issue 42) holds every
input of the spec's expressions in one binding, so that any number of them costs one storage
buffer: word 0 is the out-of-bounds flag (read_write: the kernel writes it), then each input
from the word offset in its Params field input_NAME (attngen/backends/wgsl/expr.py says how
each dtype is stored).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...lang.spec import AttentionSpec
from ...plan.kernel_plan import Entry, Lowered, Param, Workspace
from ...plan.profiles import Profile, ProfileError
from ...plan.schedule import WORKSPACE_FILL, main_grid

COMBINE_WORKGROUP = 64  # invocations of the combine entry point: one (query row, head) each


@dataclass(frozen=True)
class WgslDetails:
    """What only the WGSL target needs of a plan (KernelPlan.details)."""

    uniform_fields: tuple  # (name, type, doc) of struct Params, in order
    directives: tuple  # `enable ...;` lines the source needs
    f16_packed: bool = False  # f16 tensors as pairs in u32 words (WgslConfig.f16_packed)
    unroll_sub_block: bool = False  # the source's sub-block loops unrolled (the profile's dialect; unroll.py)
    runtime_checks: str = "all"  # wgpu's own shader checks the module keeps (the profile's dialect; RUNTIME_CHECKS)


# `[dialect] runtime_checks`: which of wgpu's (naga's) own runtime checks the shader module keeps,
# where the runtime is wgpu-native (adapter.create_module; Dawn and browsers take no such choice).
# "all" (the default): every array index clamped into its array and every loop given a hidden
# iteration counter ("loop bounding"). "bounds": the index clamps only; attngen's loops all end by
# their own bounds (counts from params, the plan's constants, or mask counts clamped to the
# mask's tiles), so the counter guards nothing. "none": neither; the kernels guard every index
# themselves (integer inputs are checked on the host before a WGSL launch).
RUNTIME_CHECKS = {"all": "every index clamped and every loop bounded: wgpu's default",
                  "bounds": "index clamps kept, loop bounding off",
                  "none": "no index clamps, no loop bounding"}


def runtime_checks(profile: Profile) -> str:
    """The profile's `[dialect] runtime_checks`, checked."""
    mode = profile.section("dialect").get("runtime_checks", "all")
    if mode not in RUNTIME_CHECKS:
        raise ProfileError(f"profile {profile.name}: [dialect] runtime_checks = {mode!r}; expected one of "
                         f"{', '.join(repr(m) for m in RUNTIME_CHECKS)}")
    return mode

# binding number, name, dtype ("elem" = the storage dtype), shape, access, optional, doc
_BINDINGS = {
    "params": (0, "struct", None, "read", False, "sizes and word offsets of this launch (struct Params)"),
    "q": (1, "elem", ("B", "Lq", "Hq", "Dqk"), "read", False, "queries (packed: (total_q, Hq, Dqk))"),
    "k": (2, "elem", ("B", "Lk", "Hkv", "Dqk"), "readwrite", False,
          "keys (packed: (total_k, Hkv, Dqk); paged: (num_pages, page, Hkv, Dqk)); read_write: appended "
          "rows are written in place"),
    "v": (3, "elem", ("B", "Lk", "Hkv", "Dv"), "readwrite", False,
          "values, laid out as k; read_write: appended rows are written in place"),
    "out": (4, "elem", ("B", "Lq", "Hq", "Dv"), "write", False, "attention output (packed: (total_q, Hq, Dv))"),
    "lse": (5, "f32", ("B", "Hq", "Lq"), "write", True,
            "log-sum-exp of each row's scores (natural log; -inf where a row sees no key; packed: "
            "(Hq, total_q)); written only when requested"),
    "seq_meta": (6, "u32", ("meta_words",), "read", True,
             "the integer inputs as u32 words at the offsets in params: cu_seqlens_q (B + 1) at "
             "meta_cu_q, cu_seqlens_k (B + 1) at meta_cu_k, kv_lens (B) at meta_kv_lens, block_table "
             "(B, table_width) row-major at meta_table; only those the layout uses are read"),
    "kv_new": (7, "elem", ("2", "B", "Lnew", "Hkv", "D"), "read", True,
               "rows to append: k_new (B, Lnew, Hkv, Dqk) at element 0, then v_new (B, Lnew, Hkv, Dv) "
               "at element params.new_v; read only when params.len_new > 0"),
    "mask": (8, "u32", ("mask_words",), "read", False,
             "the BlockMask as u32 words: counts (Bm, Hm, n_qtiles) at mask_counts, tiles (Bm, Hm, "
             "n_qtiles, n_kvtiles) at mask_tiles (kv_tile * 2 + partial), data (Bm, Hm, Lq_m, Lk_m) at "
             "mask_data: bool as bytes, 4 per word, little-endian; additive as f32 bits"),
    "o_part": (9, "f32", ("S", "B", "Lq", "Hq", "Dv"), "write", False,
               "workspace: each KV split's output, normalised by its own sum (two_pass: by the row's)"),
    "lse_part": (10, "f32", ("S", "B", "Hq", "Lq"), "write", False,
                 "workspace: each KV split's lse (MASKED = -3e38 for a split that saw no key)"),
    "s_scratch": (11, "f32", ("B", "Hq", "Lq", "Lk"), "write", False,
               "two_pass scratch: transformed, masked scores in the log2 domain (MASKED where masked)"),
    "stats": (12, "f32", ("S", "B", "Hq", "Lq", "2"), "write", False,
              "two_pass scratch: each split's row max (log2 domain) and sum of exp2(t - max)"),
    "inputs": (13, "u32", ("input_words",), "readwrite", False,
               "the expression inputs as u32 words: word 0 is 0 before the launch and the kernel writes "
               "the number of a read out of an input's bounds there; each input from word params.input_NAME "
               "(f32 and f16 as f32 bits, i32 as its bits, u8 and bool as bytes, 4 per word, little-endian)"),
    "kv_scale": (14, "f32", ("kv_scale_words",), "read", False,
                 "kv_dtype: the scales of the quantized K and V, f32: k_scale at word 0, then v_scale at word "
                 "params.scale_v; e4m3 / e5m2: (B, Hkv) each, one per sequence and KV head; i8: the cache's "
                 "shape with the head dim replaced by D / 32, one per block of 32 values of a row"),
    "k_scale": (15, "f32", ("k_scale_words",), "read", False,
                "kv_dtype, the decode kernel: k's scales, f32: e4m3 / e5m2: (B, Hkv), one per sequence and KV head; "
                "i8: k's shape with the head dim replaced by Dqk / 32, one per block of 32 values of a row"),
    "v_scale": (16, "f32", ("v_scale_words",), "read", False,
                "kv_dtype, the decode kernel: v's scales, laid out as k_scale's (Dv / 32 for i8)"),
    # i8, the decode kernel's appending twin (<entry>_append): the same buffers as k_scale / v_scale,
    # read_write, as it writes the new rows' scales; the main entry point keeps them read-only, which
    # lets the driver read them through its read-only path (NVIDIA's Vulkan: 1.40x -> 1.14x f16 at
    # Lk 32768 with the scales read_write in the main loop, same call)
    "k_scale_w": (17, "f32", ("k_scale_words",), "readwrite", False,
                  "kv_dtype i8, the decode kernel's appending twin only: k_scale, bound read_write (the "
                  "append writes its new rows' scales)"),
    "v_scale_w": (18, "f32", ("v_scale_words",), "readwrite", False,
                  "kv_dtype i8, the decode kernel's appending twin only: v_scale, bound read_write"),
}


def wgsl_param(name: str, dtype: str, access: str | None = None) -> Param:
    binding, kind_dtype, shape, acc, optional, doc = _BINDINGS[name]
    if name == "params":
        return Param("params", "uniform", "struct", binding=0, doc=doc)
    return Param(name, "tensor", dtype if kind_dtype == "elem" else kind_dtype, shape, access or acc,
                 optional=optional, binding=binding, doc=doc)


def _params(spec: AttentionSpec, names) -> tuple:
    # read_write buffers that an entry point only reads are still declared read_write in the
    # module (one declaration per binding), so every layout uses the declared access.
    # a quantized cache (kv_dtype) is k and v of that dtype: bytes in u32 words (templates/wgsl/quant.j2)
    # (i8: an append writes its new rows' scales, so kv_scale is read_write; the decode kernel's
    # twin writes them through k_scale_w / v_scale_w, append_params)
    return tuple(wgsl_param(n, spec.kv_dtype if n in ("k", "v") and spec.kv_dtype else spec.dtype,
                            "readwrite" if n == "kv_scale" and spec.kv_dtype == "i8" else None)
                 for n in names)


def append_params(spec: AttentionSpec, params: tuple) -> tuple:
    """The bindings of the decode kernel's appending twin: the main entry point's, with an i8
    cache's scales bound read_write (k_scale_w / v_scale_w: the same buffers)."""
    if spec.kv_dtype != "i8":
        return params
    return tuple(wgsl_param(p.name + "_w", "f32") if p.name in ("k_scale", "v_scale") else p for p in params)


def uniform_fields(spec: AttentionSpec) -> tuple:
    """(name, type, doc) of struct Params, padded to a multiple of 16 bytes."""
    f = [
        ("batch", "u32", "B, sequences"),
        ("len_q", "u32", "Lq: query rows per sequence (packed: of the longest sequence)"),
        ("len_k", "u32", "Lk: keys per sequence (with kv_lens or packed: of the longest, after the append)"),
        ("heads_q", "u32", "Hq, query heads"),
        ("heads_kv", "u32", "Hkv, KV heads"),
        ("group", "u32", "Hq / Hkv, query heads per KV head"),
        ("write_lse", "u32", "1 to write lse, 0 to skip it"),
        ("kv_layout", "u32", "0 padded (B, L, H, D), 1 packed (cu_seqlens), 2 paged (block_table)"),
        ("has_kv_lens", "u32", "1: sequence b has seq_meta[meta_kv_lens + b] keys (+ len_new); 0: len_k"),
        ("cap", "u32", "padded: rows per sequence of k and v; paged: rows per page"),
        ("total_q", "u32", "rows of q: packed total_q, else B * Lq"),
        ("len_new", "u32", "Lnew, rows appended per sequence (0: no append)"),
        ("meta_cu_q", "u32", "word offset of cu_seqlens_q in seq_meta"),
        ("meta_cu_k", "u32", "word offset of cu_seqlens_k in seq_meta"),
        ("meta_kv_lens", "u32", "word offset of kv_lens in seq_meta"),
        ("meta_table", "u32", "word offset of block_table in seq_meta"),
        ("table_width", "u32", "max_pages, entries per row of block_table"),
        ("new_v", "u32", "element offset of v_new in kv_new: B * Lnew * Hkv * Dqk"),
    ]
    if spec.schedule.is_split:
        f.append(("splits", "u32", "S, KV splits: key tiles are divided over S workgroups"))
    if spec.mask.is_custom:
        f += [
            ("mask_additive", "u32", "0: boolean mask data (bytes), 1: additive (f32)"),
            ("mask_batch", "u32", "Bm, 1 or B"),
            ("mask_heads", "u32", "Hm, 1 or Hq"),
            ("mask_len_q", "u32", "Lq of the mask"),
            ("mask_len_k", "u32", "Lk of the mask"),
            ("mask_qtiles", "u32", "ceil(mask_len_q / TILE_Q)"),
            ("mask_kvtiles", "u32", "ceil(mask_len_k / TILE_KV)"),
            ("mask_counts", "u32", "word offset of counts in mask"),
            ("mask_tiles", "u32", "word offset of tiles in mask"),
            ("mask_data", "u32", "word offset of data in mask"),
        ]
    f += [(f"input_{i.name}", "u32", f"word offset of input {i.name} in inputs") for i in spec.inputs]
    if spec.kv_dtype is not None:
        f.append(("scale_v", "u32", "word offset of v_scale in kv_scale (k_scale's size)"))
        f.append(("meta_new", "u32", "the decode kernel: word offset of k_new, then v_new, in seq_meta"))
    while len(f) % 4:
        f.append((f"_pad{len(f)}", "u32", "keeps the struct a multiple of 16 bytes"))
    return tuple(f)


def attention_bindings(spec: AttentionSpec, decode: bool = False) -> tuple:
    """Names of the bindings of the main (attention) entry point, by binding number (`decode`: of
    the decode kernel, decode.py)."""
    if decode:
        plain = spec.kv_dtype is None
        return ("params", "q", "k", "v", "seq_meta") + (("kv_new",) if plain else ()) + ("o_part", "lse_part") + (
            () if plain else ("k_scale", "v_scale"))
    names = ["params", "q", "k", "v"]
    kind = spec.schedule.kind
    if kind == "fused":
        names += ["out", "lse"]
    names += ["seq_meta", "kv_new"]
    if spec.mask.is_custom:
        names.append("mask")
    if kind == "split_kv":
        names += ["o_part", "lse_part"]
    elif kind == "two_pass":
        names += ["s_scratch", "stats"]
    if spec.inputs:  # the expressions are evaluated by the attention entry point only
        names.append("inputs")
    if spec.kv_dtype is not None:
        names.append("kv_scale")
    return tuple(names)


def main_params(spec: AttentionSpec, decode: bool = False) -> tuple:
    return _params(spec, attention_bindings(spec, decode))


def grids(spec: AttentionSpec, tile_q: int, v_blocks: int) -> dict:
    """Dispatch formulas of each entry point, over B, Lq, Hq, Hkv, G (= Hq / Hkv), S (splits):
    x: row tiles (times splits), y: heads (KV heads when GQA groups are packed) times the
    workgroups that split the output columns, head-major; z: batch (attngen.plan.schedule)."""
    rows = main_grid(spec, tile_q, v_blocks)
    if not spec.schedule.is_split:
        return {"main": rows}
    return {"main": rows, "pv": rows, "combine": (f"ceil(Lq * Hq / {COMBINE_WORKGROUP})", "B", "1")}


def workspaces(spec: AttentionSpec) -> tuple:
    """The split schedules' f32 workspaces; lse_part and stats start filled with WORKSPACE_FILL
    (a workgroup cut short leaves it, and the combine notices). Their dtypes and shapes are their
    bindings' (_BINDINGS: declared once)."""
    kind = spec.schedule.kind
    if kind == "fused":
        return ()
    names = ["o_part", "lse_part"] + (["s_scratch", "stats"] if kind == "two_pass" else [])
    fills = {"lse_part": WORKSPACE_FILL, "stats": WORKSPACE_FILL}
    return tuple(Workspace(n, _BINDINGS[n][1], _BINDINGS[n][2], fill=fills.get(n)) for n in names)


def entries(spec: AttentionSpec, entry: str, tile_q: int, v_blocks: int, threads: int) -> tuple:
    """The entry points launched after the main one, in order."""
    kind = spec.schedule.kind
    if kind == "fused":
        return ()
    g = grids(spec, tile_q, v_blocks)
    out = []
    if kind == "two_pass":
        # mask custom: pass 2 walks the same BlockMask list entries as pass 1 (8 storage buffers)
        mask = ("mask",) if spec.mask.is_custom else ()
        scales = ("kv_scale",) if spec.kv_dtype is not None else ()  # pass 2 reads V
        out.append(Entry(
            name="pv", entry=entry + "_pv",
            doc="two_pass, pass 2: per row, the splits' statistics merged into the row's max and sum; "
                "P = exp2(S - m) / l from the scores scratch (no K read) times V, per split, into o_part",
            params=_params(spec, ("params", "v", "seq_meta", "kv_new", *mask, "o_part", "lse_part", "s_scratch",
                                  "stats", *scales)),
            grid=g["pv"], threads=threads))
    how = ("sums the splits' outputs (already normalised by the row's sum)" if kind == "two_pass" else
           "merges the splits by their lse: lse = log(sum_s exp(lse_s)), out = sum_s exp(lse_s - lse) out_s")
    out.append(Entry(
        name="combine", entry=entry + "_combine",
        doc=f"one invocation per (query row, head): {how}; a row no split saw gets 0 and lse -inf",
        params=_params(spec, ("params", "out", "lse", "seq_meta", "o_part", "lse_part")),
        grid=g["combine"], threads=COMBINE_WORKGROUP))
    return tuple(out)


def lower(spec: AttentionSpec, profile: Profile, cfg, entry: str) -> Lowered:
    """The WGSL part of the KernelPlan of `spec` with configuration `cfg`: the features and
    `enable` directives the source needs (per the profile's dialect), bindings, dispatches."""
    features, directives = [], []
    if (spec.dtype == "f16" and not cfg.f16_packed) or "f16" in (spec.acc_qk, spec.acc_pv):
        features.append("shader-f16")
        directives.append("f16")
    if cfg.subgroups:
        features.append("subgroups")
        if profile.section("dialect").get("subgroups_directive", False):
            directives.append("subgroups")
    if cfg.matrix is not None:  # the subgroup-matrix family (matrix.py)
        from .matrix import DIRECTIVE, FEATURE
        features.append(FEATURE)
        directives.append(DIRECTIVE)
    return Lowered(
        threads=cfg.workgroup,
        grid=grids(spec, cfg.tile_q, cfg.v_blocks)["main"],
        params=main_params(spec, cfg.decode is not None),
        smem_bytes=cfg.smem_bytes,
        entries=entries(spec, entry, cfg.tile_q, cfg.v_blocks, cfg.workgroup),
        features=tuple(features),
        workspaces=workspaces(spec),
        details=WgslDetails(uniform_fields=uniform_fields(spec), directives=tuple(directives),
                            f16_packed=cfg.f16_packed,
                            unroll_sub_block=bool(profile.section("dialect").get("unroll_sub_block", False)),
                            runtime_checks=runtime_checks(profile)),
    )


# ---- the backward (issue 41): a module of its own (Backend.helper_sources' "backward") ----------
# Its bindings share the forward's numbers where the names are the same; the outputs of the
# forward are inputs here. dk and dv share one binding (dkv) so that no entry point binds more than
# webgpu-core's 8 storage buffers (step 2 with a custom mask binds 8).
_BACKWARD_BINDINGS = {
    "out": (4, "elem", ("B", "Lq", "Hq", "Dv"), "read", False, "the forward's output (packed: (total_q, Hq, Dv))"),
    "lse": (5, "f32", ("B", "Hq", "Lq"), "read", False,
            "the forward's lse (natural log; -inf: the row saw no key; packed: (Hq, total_q))"),
    "dout": (7, "elem", ("B", "Lq", "Hq", "Dv"), "read", False, "the gradient of the output, laid out as out"),
    "rows": (9, "f32", ("Hq * Tq * 2 + 1",), "readwrite", False,
             "workspace: per query row and head at lse's index r, rows[2r] = lse_i * log2(e) (MASKED: the "
             "row saw no key) and rows[2r + 1] = D_i; the last word is set to 1 by a step whose loops a "
             "driver cut short (fill: 0)"),
    "dq": (10, "elem", ("B", "Lq", "Hq", "Dqk"), "write", False, "the gradient of q, laid out as q"),
    "dkv": (11, "elem", ("2", "B", "Lk", "Hkv", "D"), "write", False,
            "the gradients of k then v: dk (B, Lk, Hkv, Dqk) at element 0 (packed: (total_k, Hkv, Dqk)), dv "
            "(B, Lk, Hkv, Dv) right after it, at element rows(k) * Hkv * Dqk"),
}
BACKWARD_ROLES = ("preprocess", "dkdv", "dq", "grads")  # "grads": only with partials (expr_grads.py)
GRADS_WORKGROUPS = 64  # the grads entry's grid (x): its invocations stride over the gradients' entries


def backward_param(name: str, dtype: str, grads: tuple = ()) -> Param:
    """A binding of the backward; `grads`: the names of the spec's `grad` inputs (their gradients
    follow rows' flag word: attngen/backends/wgsl/expr_grads.py)."""
    if name not in _BACKWARD_BINDINGS:  # params and inputs (its flag is written) as declared, the rest read
        return wgsl_param(name, dtype, "read") if name not in ("params", "inputs") else wgsl_param(name, dtype)
    binding, kind_dtype, shape, acc, optional, doc = _BACKWARD_BINDINGS[name]
    if name == "rows" and grads:
        shape = ("Hq * Tq * 2 + 1 + " + " + ".join(f"size({g})" for g in grads),)
        doc += (f"; then the gradients of the `grad` inputs {', '.join(grads)} (issue 42), f32, one area per input "
                "in declaration order, row-major in its shape, written by step 2 (fill: 0); then the partial "
                "sums of those many pairs read (the manifest's \"partials\"), summed by the grads step")
    return Param(name, "tensor", dtype if kind_dtype == "elem" else kind_dtype, shape, acc,
                 optional=optional, binding=binding, doc=doc)


def backward_entries(spec: AttentionSpec, entry: str, cfg) -> tuple:
    """The backward's entry points, in dispatch order (`cfg`: config.WgslBackward): three, and
    a fourth, grads, where `grad` inputs are summed through partials (cfg.partials)."""
    mask = ("mask",) if spec.mask.is_custom else ()
    inputs = ("inputs",) if spec.inputs else ()  # the expressions' (issue 42), read by steps 2 and 3
    grads = tuple(i.name for i in spec.inputs if i.grad)  # their gradients: in rows, by step 2
    names = {
        "preprocess": ("params", "out", "lse", "dout", "rows"),
        "dkdv": ("params", "q", "k", "v", "seq_meta", "dout", *mask, "rows", "dkv", *inputs),
        "dq": ("params", "q", "k", "v", "seq_meta", "dout", *mask, "rows", "dq", *inputs),
    }
    if cfg.partials:  # issue 42: a 4th entry sums step 2's partials of `grad` inputs (expr_grads.py)
        names["grads"] = ("params", "rows")
    grids = {
        "grads": (str(GRADS_WORKGROUPS), "1", "1"),
        "preprocess": (f"ceil(Tq / {cfg.workgroup})", "Hq", "1"),
        "dkdv": (f"ceil(Lk / {cfg.block_kv})", "Hkv", "B"),
        "dq": (f"ceil(Lq / {cfg.block_q})", "Hq", "B"),
    }
    docs = {
        "preprocess": "step 1, one invocation per (query row, head): D_i = rowsum(dO_i * O_i) and lse_i * log2(e) "
                      "into rows",
        "dkdv": "step 2, one workgroup per (key block, KV head, batch): over the query blocks that see the key "
                "block and every query head of the group, dV_j += P_ij^T dO_i and dK_j += dS_ij^T Q_i; "
                "writes its rows of dk and dv once",
        "dq": "step 3, one workgroup per (query block, query head, batch): over the key blocks it sees, "
              "dQ_i += dS_ij K_j; writes its rows of dq once",
        "grads": "the gradients of `grad` inputs that many pairs read: each entry the sum, in grid order, of the "
                 "partial sums in rows of the dkdv workgroups that can name it (grid-stride over the entries)",
    }
    smem = {"preprocess": 0, "dkdv": cfg.smem_bytes, "dq": cfg.smem_bytes, "grads": 0}
    return tuple(Entry(name=role, entry=f"{entry}_bw_{role}", doc=docs[role],
                       params=tuple(backward_param(n, spec.dtype, grads) for n in names[role]), grid=grids[role],
                       threads=cfg.workgroup, smem_bytes=smem[role]) for role in BACKWARD_ROLES if role in names)
