"""KernelPlan -> WGSL source (for WebGPU: wgpu/naga, Chrome's Tint, ...) and its manifest.

The kernel is templates/wgsl/kernel.wgsl.j2 with its parts (config, memory, math, mask). This
module only turns the plan into the lists and numbers the templates print: the `enable`
directives, the Params struct, the bindings, the buffer sizes and the shuffle masks of the
subgroup reduction. No decisions are made here; they are the plan's.
"""

from __future__ import annotations

import textwrap

from ...plan.kernel_plan import LOG2E, KernelPlan
from ...plan.schedule import WORKSPACE_FILL, max_splits, pack_gqa
from ...version import __version__
from ..render import c_float, comment_block, constants, header_lines, layout_lines, manifest, mask_doc, render, transform_doc
from . import manifest as wgsl_layout
from .lower import COMBINE_WORKGROUP, append_params
from .unroll import unroll_loops

# Longest loops over an invocation's vec4 of head dims and over a tile's keys that are left to the
# compiler in one piece (longer ones are split in chunks; see the DIM_CHUNK_QK comment in
# templates/wgsl/config.j2).
MAX_VEC_CHUNK = 8
MAX_KEY_CHUNK = 16
BLOCK_MASK_WORKGROUP = 64  # invocations per workgroup of the block-mask builder
_COMMENT_WIDTH = 92  # text width of wrapped comments (96 columns with '// ')

# WGSL scalar types of the attngen dtypes a WGSL kernel can hold (bf16 is rejected by the checker).
_SCALAR = {"f16": "f16", "f32": "f32"}
_WORD = {"f16": "f16", "f32": "f32", "u32": "u32", "e4m3": "u32", "e5m2": "u32", "i8": "u32"}  # kv_dtype: 4 bytes a word
_F32_ALWAYS = ("lse", "o_part", "lse_part", "s_scratch", "stats")  # f32 whatever the storage dtype

_TYPES_DOC = {
    "f32": ["Storage is f32; all arithmetic is f32 unless an accumulator below says f16."],
    "f16": ["Storage is f16 (`enable f16;`, the shader-f16 feature): tiles stay f16 in workgroup",
            "memory and are widened to f32 where the arithmetic is f32."],
    "f16 packed": ["Storage is f16 packed in u32 words (no shader-f16; section memory): elem_t, the",
                   "type of the tiles in workgroup memory, is f32, and so is all arithmetic."],
}
_PACKED = ("q", "k", "v", "kv_new")  # u32 words when f16 is packed (read by <name>_vec); out: store_out
_VECTOR_READ = ("q", "k", "v")  # bound as arrays of 4 elements (vec4<elem_t>, or vec2<u32> packed)


def _fields(plan: KernelPlan) -> list[dict]:
    """The Params struct's fields, with `pad` spaces so that their trailing comments line up."""
    rows = [{"name": n, "type": t, "doc": d} for n, t, d in plan.details.uniform_fields]
    width = max((len(r["name"]) + len(r["type"]) for r in rows), default=0)
    return [{**r, "pad": width - len(r["name"]) - len(r["type"])} for r in rows]


def module_params(plan: KernelPlan) -> list:
    """Every binding of the module (the union over its entry points), by binding number."""
    seen = {}
    twin = append_params(plan.spec, plan.params) if wgsl_layout.append_entry(plan) else ()  # (i8: k_scale_w)
    for p in list(plan.params) + list(twin) + [q for e in plan.entries for q in e.params]:
        seen.setdefault(p.binding, p)
    return [seen[b] for b in sorted(seen)]


def _bindings(plan: KernelPlan) -> list[dict]:
    """One row per Param: WGSL address space and type, from the param's kind, access and dtype,
    and its doc as comment lines."""
    rows = []
    for p in module_params(plan):
        if p.kind == "uniform":
            space, typ = "uniform", "Params"
        else:
            # WGSL has no write-only storage buffers: outputs are read_write. Tensors in the
            # storage dtype are elem_t; lse, workspaces (f32) and the word buffers (u32) are not.
            space = "storage, read" if p.access == "read" else "storage, read_write"
            typ = "array<elem_t>" if p.dtype == plan.dtype and p.dtype != "u32" and p.name not in _F32_ALWAYS \
                else f"array<{_WORD[p.dtype]}>"
            if plan.details.f16_packed and typ == "array<elem_t>":
                typ = "array<atomic<u32>>" if p.name == "out" else "array<u32>"
            if p.name in _VECTOR_READ and typ in ("array<elem_t>", "array<u32>") and p.dtype in _SCALAR:
                # Tile copies read 4 elements in one load (16 bytes of f32, 8 of f16); naga and
                # the drivers do not merge 4 scalar loads (each has its own bounds check).
                typ = "array<vec4<elem_t>>" if typ == "array<elem_t>" else "array<vec2<u32>>"
        doc = f"{p.name}: {p.doc}"
        if p.shape:
            doc = f"{p.name} ({', '.join(p.shape)}) {p.dtype}: {p.doc}"
        rows.append({"binding": p.binding, "name": p.name, "space": space, "type": typ,
                     "doc": textwrap.wrap(doc, width=_COMMENT_WIDTH)})
    return rows


_OPTIONAL_NOTE = {
    "lse": "bind any buffer of at least 4 bytes and set write_lse = 0 to skip it",
    "seq_meta": "bind any buffer of at least 4 bytes when the layout is padded without kv_lens",
    "kv_new": "bind any buffer of at least 4 bytes and set len_new = 0 when nothing is appended",
}


def _chunk(n: int, cap: int) -> int:
    """The largest divisor of n that is at most cap."""
    return max(c for c in range(1, min(n, cap) + 1) if n % c == 0)


def _shuffle_masks(threads_per_row: int) -> list[int]:
    """Lane masks of the butterfly reduction over a row: T/2, T/4, ..., 1."""
    masks, m = [], threads_per_row // 2
    while m >= 1:
        masks.append(m)
        m //= 2
    return masks


# The value of each Params field as a formula (attngen.plan.formulas' grammar) over the grid
# symbols and the launch symbols the manifest lists in "launch_symbols"; fields not listed are 0.
# attngen/backends/wgsl/args.py computes the same values from a Launch (tests/backends/wgsl/
# test_manifest_values.py holds the two together).
VALUES = {"batch": "B", "len_q": "Lq", "len_k": "Lk", "heads_q": "Hq", "heads_kv": "Hkv", "group": "G",
          "write_lse": "write_lse", "splits": "S", "kv_layout": "layout", "has_kv_lens": "has_kv_lens", "cap": "cap",
          "total_q": "Tq", "len_new": "Lnew", "meta_cu_q": "meta_cu_q", "meta_cu_k": "meta_cu_k",
          "meta_kv_lens": "meta_kv_lens", "meta_table": "meta_table", "table_width": "Pmax",
          "new_v": "B * Lnew * Hkv * Dqk", "scale_v": "k_scale_words"}


def _values(plan: KernelPlan) -> dict:
    """VALUES plus the inputs' offsets and the custom-mask fields, over the mask symbols (Bm, Hm, Lqm,
    Lkm, mask_additive)."""
    nq, nk = f"ceil(Lqm / {plan.tile_q})", f"ceil(Lkm / {plan.tile_kv})"
    return {**VALUES, **wgsl_layout.input_offsets(plan.spec), "mask_additive": "mask_additive", "mask_batch": "Bm",
            "mask_heads": "Hm",
            "mask_len_q": "Lqm", "mask_len_k": "Lkm", "mask_qtiles": nq, "mask_kvtiles": nk,
            "mask_counts": "0", "mask_tiles": f"Bm * Hm * {nq}", "mask_data": f"Bm * Hm * {nq} + Bm * Hm * {nq} * {nk}"}


def block_mask_manifest(plan: KernelPlan) -> dict:
    """How to run the block-mask builder (`attngen build --emit block-mask`) before the kernel."""
    nq, nk = f"ceil(Lqm / {plan.tile_q})", f"ceil(Lkm / {plan.tile_kv})"
    fields = [("slices", "Bm * Hm"), ("len_q", "Lqm"), ("len_k", "Lkm"), ("qtiles", nq), ("kvtiles", nk),
              ("additive", "mask_additive"), ("counts", "0"), ("tiles", f"Bm * Hm * {nq}"),
              ("data", f"Bm * Hm * {nq} + Bm * Hm * {nq} * {nk}"), ("_pad9", "0"), ("_pad10", "0"), ("_pad11", "0")]
    return {
        "source": "a separate module: attngen build SPEC --target wgsl --emit block-mask",
        "workgroup_size": [BLOCK_MASK_WORKGROUP, 1, 1],
        "bindings": [{"binding": 0, "type": "uniform", "struct": "BmParams", "size_bytes": 4 * len(fields),
                      "fields": [{"name": n, "type": "u32", "offset": 4 * i, "value": v}
                                 for i, (n, v) in enumerate(fields)]},
                     {"binding": 1, "type": "storage", "name": "mask",
                      "words": f"Bm * Hm * {nq} + Bm * Hm * {nq} * {nk} + data words"}],
        "data": "bool (mask_additive = 0): the mask as bytes (1 = attend), 4 per u32 word, little-endian, "
                "(Bm, Hm, Lqm, Lkm) row-major; additive (1): its f32 bits, -inf for masked pairs",
        "fill_word": 0xFFFFFFFF,
        "fill_note": "every word before data (counts and tiles) holds fill_word before the builder runs",
        "entry_points": [
            {"entry_point": "block_mask_classify", "dispatch": [f"ceil({nk} / {BLOCK_MASK_WORKGROUP})", nq, "Bm * Hm"]},
            {"entry_point": "block_mask_compact", "dispatch": [f"ceil({nq} / {BLOCK_MASK_WORKGROUP})", "Bm * Hm", "1"]}],
        "then": "bind the same buffer as the kernel's `mask` binding; Params' mask fields have their values",
    }


LAUNCH_SYMBOLS = {
    "layout": "0 padded (B, L, H, D) tensors, 1 packed sequences (cu_seqlens), 2 a paged cache (block_table)",
    "has_kv_lens": "1 when kv_lens is given, else 0",
    "cap": "padded: rows per sequence of k and v (their second dimension); paged: rows per page",
    "Tq": "rows of q: packed, total_q; else B * Lq",
    "Lnew": "rows appended per sequence (k_new / v_new), else 0",
    "Pmax": "columns of block_table, else 0",
    "Lk": "keys per sequence; with kv_lens or packed: of the longest sequence, after the append",
    "meta_cu_q, meta_cu_k, meta_kv_lens, meta_table": "word offsets of the seq_meta sections (its layout)",
    "write_lse": "1 when lse is wanted, else 0",
    "Bm, Hm, Lqm, Lkm": "mask custom: the mask's (batch, heads, Lq, Lk) shape (Bm 1 or B, Hm 1 or Hq)",
    "mask_additive": "mask custom: 0 for a boolean mask, 1 for an additive one",
}


def _binding_manifest(plan: KernelPlan) -> list[dict]:
    out = []
    layouts = wgsl_layout.buffer_layouts(plan)
    fields = plan.details.uniform_fields
    values = _values(plan)
    for p in module_params(plan):
        entry = {"group": 0, "binding": p.binding, "name": p.name}
        if p.kind == "uniform":
            entry.update(
                type="uniform",
                struct="Params",
                size_bytes=4 * len(fields),
                fields=[{"name": n, "type": t, "offset": 4 * i, "doc": d, "value": values.get(n, "0")}
                        for i, (n, t, d) in enumerate(fields)],
                value_note="value: the field's value as a formula (grammar: formula_grammar) of the grid "
                           "symbols and launch_symbols",
            )
        else:
            entry.update(
                type="read-only-storage" if p.access == "read" else "storage",
                dtype=p.dtype,
                shape=list(p.shape),
            )
            if p.optional:
                entry["optional"] = _OPTIONAL_NOTE[p.name]
            if plan.details.f16_packed and (p.name in _PACKED or p.name == "out"):
                entry["packing"] = ("two f16 per u32 word, element 2w in the low 16 bits (the bytes of a "
                                    "little-endian f16 array)")
            if p.dtype in wgsl_layout.KV_PACKING:
                entry["packing"] = wgsl_layout.KV_PACKING[p.dtype]
            if p.name in layouts:
                entry["layout"] = layouts[p.name]
        out.append(entry)
    return out


def render_source(plan: KernelPlan) -> str:
    """The WGSL source of a plan (every entry point of its schedule in one module): the register-tiled
    kernel, or the decode kernel where the plan chose it (decode.py)."""
    c = plan.config
    if c.decode is not None:
        source = render_decode(plan)
        return unroll_loops(source) if plan.details.unroll_sub_block else source
    sizes = {b.name: b.rows * b.cols for b in c.buffers}
    layout = layout_lines(plan, "Workgroup memory")
    if c.matrix is not None:
        layout.append(f"Subgroup matrices: {c.matrix.summary} (of the profile's configs); acc in registers as "
                      "result matrices, rescaled lazily (section config).")
    else:
        layout.append(f"Register tiling: {c.sub_block}" + ("; its loops unrolled (the profile's dialect)."
                                                           if plan.details.unroll_sub_block else "."))
    if c.chunked:
        layout.append(f"Head dim: {c.chunk_summary}.")
    source = render(
        "wgsl/kernel_sgmat.wgsl.j2" if c.matrix is not None else "wgsl/kernel.wgsl.j2",
        header=comment_block(header_lines(plan, layout)),
        directives=list(plan.details.directives),
        c=c,
        entry=plan.entry,
        dim_chunk_qk=_chunk(c.tile_dqk // 4, MAX_VEC_CHUNK),
        key_chunk=_chunk(c.tile_kv, MAX_KEY_CHUNK),
        # P through sP as vec4 of 4 consecutive keys (one load serves 4 keys of a row in P V)
        p_vec4=c.threads_per_row > 1 and c.tile_kv % 4 == 0 and c.pad % 4 == 0,
        key_chunk4=_chunk(c.tile_kv // 4, MAX_KEY_CHUNK // 4) if c.tile_kv % 4 == 0 else 1,
        max_chunk=MAX_VEC_CHUNK,
        max_dims_v=c.table_accumulators,
        elem="f32" if plan.details.f16_packed else _SCALAR[plan.dtype],
        f16_packed=plan.details.f16_packed,
        packed_inputs=[p.name for p in module_params(plan) if p.name in _PACKED and p.dtype in _SCALAR],
        kv_dtype=plan.spec.kv_dtype,
        decode=False,  # sequence.j2's cache reads and append: the register-tiled kernel's (decode.py has its own)
        vector_inputs=[p.name for p in module_params(plan) if p.name in _VECTOR_READ],
        acc_qk=_SCALAR[plan.acc_qk],
        acc_pv=_SCALAR[plan.acc_pv],
        types_doc=_TYPES_DOC["f16 packed" if plan.details.f16_packed else plan.dtype],
        fields=_fields(plan),
        bindings=_bindings(plan),
        sizes=sizes,
        shuffle_masks=_shuffle_masks(c.threads_per_row),
        mask=plan.mask,
        schedule=plan.spec.schedule.kind,
        pack_gqa=pack_gqa(plan.spec),
        paged=plan.spec.kv_cache.is_paged,
        page=plan.spec.kv_cache.page,
        max_splits=max_splits(plan.spec),
        combine_workgroup=COMBINE_WORKGROUP,
        unwritten_bits=f"0x{WORKSPACE_FILL:08x}",
        mask_doc=mask_doc(plan),
        transform_doc=transform_doc(plan),
        **expression_sources(plan),
        **constants(plan),
    )
    # the loops over each invocation's rows, keys and column groups, unrolled where the profile's
    # dialect asks for it (unroll.py: a driver that keeps them as loops keeps acc, s and part in
    # memory, not registers; SwiftShader's compiler takes 20x longer on the unrolled form)
    if plan.details.unroll_sub_block and c.matrix is None:
        source = unroll_loops(source)
    return source


def render_decode(plan) -> str:
    """The decode kernel's source for `plan` (its config's decode shape)."""
    from .decode import ITEM_DOC, NONFINITE, shuffle_masks
    c, spec = plan.config, plan.spec
    d = c.decode
    layout = layout_lines(plan, "Workgroup memory (the epilogue's)")
    layout.append(f"Decode kernel: {d.summary()}.")
    bindings = []
    for b in _bindings(plan):  # q and the cache as u32 words: 16-byte items of k, v and kv_new
        if b["name"] in ("k", "v", "kv_new"):
            b = {**b, "type": "array<vec4<u32>>", "doc": b["doc"] + ["(read and written as 16-byte items, vec4<u32>)"]}
        elif b["name"] == "q":
            b = {**b, "type": "array<u32>", "doc": b["doc"] + ["(read as u32 words)"]}
        bindings.append(b)
    stored = spec.kv_dtype or plan.dtype
    nonfinite = NONFINITE.get(stored)
    return render(
        "wgsl/decode.wgsl.j2",
        header=comment_block(header_lines(plan, layout)),
        directives=list(plan.details.directives),
        c=c,
        d=d,
        entry=plan.entry,
        kv_dtype=spec.kv_dtype,
        dtype=plan.dtype,
        fp8=spec.kv_dtype in ("e4m3", "e5m2"),
        append=True,  # (a quantized cache's: k_new / v_new in seq_meta, quantized by the kernel)
        decode=True,  # sequence.j2: the layouts only, not the register-tiled kernel's cache reads
        item_doc=ITEM_DOC[stored],
        nonfinite=None if nonfinite is None else dict(zip(("field", "one", "top", "doc"), nonfinite)),
        team_masks=shuffle_masks(1, d.team),
        block_masks=shuffle_masks(d.team, d.subgroup),
        f16_packed=plan.details.f16_packed,
        elem="f32" if plan.details.f16_packed else plan.dtype,
        types_doc=_TYPES_DOC["f16 packed" if plan.details.f16_packed else plan.dtype],
        acc_qk="f32",
        acc_pv="f32",
        fields=_fields(plan),
        bindings=bindings,
        mask=plan.mask,
        mask_doc=mask_doc(plan),
        transform_doc=transform_doc(plan),
        score_expr_source="",
        expr_tiles=False,
        paged=spec.kv_cache.is_paged,
        page=spec.kv_cache.page,
        schedule="split_kv",
        max_splits=max_splits(spec),
        combine_workgroup=COMBINE_WORKGROUP,
        unwritten_bits=f"0x{WORKSPACE_FILL:08x}",
        **constants(plan),
    )


def expression_sources(plan: KernelPlan) -> dict:
    """The template values of the spec's score and mask expressions (issue 42; expr.py): the
    mask section's mask_expr, the score section's score_expr with its constants, and before the
    first of them the helpers and input loaders they use ("" where the spec has none);
    reads_inputs: whether the kernel binds `inputs` (then it evaluates the expressions only
    where the reference uses them); expr_tiles and mask_expr_tile_source: the tile
    classification of an index-only mask expression (mask_tile_sources)."""
    from . import expr as wgsl_expr
    spec = plan.spec
    mask = spec.mask.expr if spec.mask.kind == "expr" else None
    helpers = wgsl_expr.helpers_of(mask, spec.score) + [wgsl_expr.loader(i) for i in spec.inputs]
    helpers = "".join(h + "\n" for h in helpers)
    site_of = {id(n): at + 1 for at, (_, n) in enumerate(wgsl_expr.sites(spec))}
    out = {"mask_expr_source": "", "score_expr_source": "", "reads_inputs": bool(spec.inputs),
           **mask_tile_sources(plan)}
    if mask is not None:
        out["mask_expr_source"] = helpers + wgsl_expr.function("mask_expr", mask, "mask", site_of)
    if spec.score is not None:
        out["score_expr_source"] = (
            "// score expression (issue 42): the score the softmax sees, score_expr(s, b, h, hkv, q, k, Lq, Lk),\n"
            "// of the scaled score s = SCORE_SCALE * (raw dot product) and the pair's indices (q and k 0-based,\n"
            "// top-left, within the sequence); the kernel takes it to the log2 domain (times SCORE_LOG2E).\n"
            f"const SCORE_SCALE: f32 = {c_float(1.0 if plan.prescale_q else plan.scale)};\n"
            f"const SCORE_LOG2E: f32 = {c_float(LOG2E)};\n"
            + ("" if mask is not None else helpers) + wgsl_expr.function("score_expr", spec.score, "score", site_of)
            + "\n")
    return out


def _mask_inputs_section(plan: KernelPlan) -> dict:
    """{"mask_inputs": the two-part call (manifest.mask_inputs_manifest)} of a spec whose mask reads
    inputs and whose `mask custom` kernel fits the profile; {} otherwise."""
    from ...plan.mask_inputs import reads_inputs
    att = wgsl_layout.companion_plan(plan) if reads_inputs(plan.spec) else None
    if att is None:
        return {}
    return {"mask_inputs": wgsl_layout.mask_inputs_manifest(plan, att, render_manifest(att), block_mask_manifest(att),
                                                            BLOCK_MASK_WORKGROUP)}


def mask_tile_sources(plan: KernelPlan) -> dict:
    """expr_tiles: whether the kernels classify their tiles by the mask expression (an index-only
    one: attngen/backends/wgsl/expr.py), skipping SKIP tiles and testing FULL ones without
    mask_expr; mask_expr_tile_source: its mask_expr_tile ("" where not)."""
    from ...plan.expr_blocks import index_only
    from .expr import tile_function
    spec = plan.spec
    if spec.mask.kind != "expr" or not index_only(spec.mask.expr):
        return {"expr_tiles": False, "mask_expr_tile_source": ""}
    return {"expr_tiles": True, "mask_expr_tile_source": tile_function(spec.mask.expr)}


def _decode_manifest(plan: KernelPlan) -> dict:
    from .decode import decode_manifest
    return decode_manifest(plan)


def render_manifest(plan: KernelPlan) -> dict:
    """What a launcher without Python (a browser) needs: the common part
    (attngen.backends.render.manifest) plus bindings, entry points and dispatches."""
    c = plan.config
    extra = {
        "language": "WGSL",
        "directives": [f"enable {d};" for d in plan.details.directives],
        "workgroup_size": [c.workgroup, 1, 1],
        "dispatch": list(plan.grid),
        "dispatch_note": "dispatchWorkgroups(x, y, z) with the grid formulas; each dimension at most "
                         "maxComputeWorkgroupsPerDimension; y = heads * V_BLOCKS (head-major) when the "
                         "output columns are split over V_BLOCKS workgroups, heads being Hq, or Hkv for "
                         "split schedules that pack GQA groups (schedule.rows)",
        "workgroup_storage_bytes": c.smem_bytes,
        "head_dim_chunks": {"tile_d": c.tile_d, "from_spec": c.tile_d_given, "v_blocks": c.v_blocks,
                            "note": c.chunk_summary},
        "features": list(plan.features),
        **({"subgroup_matrix": {**vars(c.matrix), "note": "the subgroup-matrix config the kernel uses: the "
                                "adapter must list it (Dawn: AdapterPropertiesSubgroupMatrixConfigs) and "
                                "run subgroups of exactly this size"}} if c.matrix is not None else {}),
        **({"f16_storage": "packed" if plan.details.f16_packed else "native"} if plan.dtype == "f16" else {}),
        "bindings": _binding_manifest(plan),
        "entry_points": wgsl_layout.entry_points(plan),
        "entry_points_note": "dispatch every entry point in this order, each with a bind group of exactly "
                             "its bindings (its own pipeline layout, group 0); the params uniform is shared",
        "schedule": wgsl_layout.schedule_manifest(plan),
        "grid_extra_symbols": {"G": "Hq / Hkv, query heads per KV head", "S": "KV splits of this launch"},
        "formula_grammar": "integers, symbol names, a + b, a * b and ceil(a / b) (integer division rounded "
                           "up); nothing else (attngen/plan/formulas.py)",
        "launch_symbols": {**LAUNCH_SYMBOLS, **({n: v for n, v in wgsl_layout.KV_SYMBOLS.items()  # v_scale: the decode kernel's
                                                 if n != "v_scale_words" or c.decode is not None}
                                                if plan.spec.kv_dtype else {})},
        **({"block_mask": block_mask_manifest(plan)} if plan.spec.mask.is_custom else {}),
        **({"decode": _decode_manifest(plan)} if c.decode is not None else {}),
        **({"inputs": wgsl_layout.inputs_manifest(plan)} if plan.spec.inputs else {}),
        **_mask_inputs_section(plan),
        "backward": backward_manifest(plan),
        "layout": "contiguous row-major buffers: q (B, Lq, Hq, Dqk), k (B, Lk, Hkv, Dqk), "
                  "v (B, Lk, Hkv, Dv), out (B, Lq, Hq, Dv), lse (B, Hq, Lq); no strides. Packed "
                  "(kv_layout = 1): q (total_q, Hq, Dqk), k, v (total_k, Hkv, D), out (total_q, Hq, Dv), "
                  "lse (Hq, total_q); paged (kv_layout = 2): k, v (num_pages, page, Hkv, D)",
        "buffer_note": "buffers are contiguous (B, L, H, D); f16 buffers are padded with zeros to a "
                       "multiple of 4 bytes (WebGPU buffer sizes); q, k and v are bound as arrays of "
                       "4-element items (vec4<elem_t>, or vec2<u32> for packed f16), so their buffers "
                       "hold at least 16 bytes (an empty tensor is bound as one zero item)",
        "completion_note": "if a driver cuts the main loop short (Mesa's llvmpipe ends all loops of a "
                           "shader after 65535 iterations), the kernel stores nothing for those rows: "
                           "fill out with NaN before the dispatch to detect it",
    }
    return manifest(plan, extra)


def block_mask_source(plan: KernelPlan) -> str:
    """The block-mask builder for `plan`'s tiles (templates/wgsl/block_mask.wgsl.j2)."""
    c = plan.config
    return render("wgsl/block_mask.wgsl.j2", tile_q=c.tile_q, tile_kv=c.tile_kv, kernel=plan.spec.name,
                  workgroup=BLOCK_MASK_WORKGROUP)


def expr_block_mask_source(spec, tile_q: int, tile_kv: int) -> str:
    """The builder of a mask expression over inputs (templates/wgsl/expr_block_mask.wgsl.j2) for
    tiles tile_q x tile_kv: the mask's bytes, then block_mask_source's tile lists."""
    from ...lang.expr import format_expr
    from ...plan.mask_inputs import mask_inputs
    from .expr import function, helpers_of, loader, sites
    site_of = {id(load): n for n, (what, load) in enumerate(sites(spec), 1) if what == "mask"}
    read, e = mask_inputs(spec), spec.mask.expr
    fixed = 10  # the template's Params fields before the inputs' offsets (a multiple of 4 words in all)
    return render("wgsl/expr_block_mask.wgsl.j2", kernel=spec.name, expr_text=format_expr(e), tile_q=tile_q,
                  tile_kv=tile_kv, workgroup=BLOCK_MASK_WORKGROUP, input_fields=[i.name for i in read],
                  pad=-(fixed + len(read)) % 4, helpers=helpers_of(e), loaders=[loader(i) for i in read],
                  mask_fn=function("mask_expr", e, "mask", site_of))


# ---- the backward (issue 41): templates/wgsl/backward.wgsl.j2, a module of its own -------------

def backward_plan(plan: KernelPlan):
    """(config.WgslBackward, its entry points) of `plan`'s backward, or None where it has none
    (plan.backward.problems, or head dims too large for the backward's blocks)."""
    from .expr_grads import backward_problems
    from .config import backward_config
    from .lower import backward_entries
    if backward_problems(plan.spec):
        return None
    cfg = backward_config(plan)
    if cfg is None:
        return None
    return cfg, backward_entries(plan.spec, plan.entry, cfg)


def _backward_params(entries) -> list:
    seen = {}
    for e in entries:
        for p in e.params:
            seen.setdefault(p.binding, p)
    return [seen[b] for b in sorted(seen)]


def _backward_bindings(plan: KernelPlan, entries) -> list[dict]:
    rows = []
    packed = plan.details.f16_packed
    for p in _backward_params(entries):
        if p.kind == "uniform":
            space, typ = "uniform", "Params"
        else:
            space = "storage, read" if p.access == "read" else "storage, read_write"
            if p.dtype == plan.dtype and p.dtype != "u32" and p.name not in ("lse", "rows"):
                typ = "array<vec2<u32>>" if packed else "array<vec4<elem_t>>"  # 4 elements per item
            else:
                typ = f"array<{_WORD[p.dtype]}>"
        doc = f"{p.name} ({', '.join(p.shape)}) {p.dtype}: {p.doc}" if p.shape else f"{p.name}: {p.doc}"
        rows.append({"binding": p.binding, "name": p.name, "space": space, "type": typ,
                     "doc": textwrap.wrap(doc, width=_COMMENT_WIDTH)})
    return rows


def _backward_header(plan: KernelPlan, cfg, entries) -> str:
    lines = [
        f"attngen {__version__}: flash-attention backward kernels for target {plan.target} (profile {plan.profile}).",
        f"Generated from the spec below; regenerate with `attngen build SPEC --target {plan.target} --kernel "
        f"{plan.spec.name} --emit backward` rather than editing.",
        "",
        "Spec (normalised, every default filled in):",
        *["  " + ln for ln in plan.spec_text.rstrip("\n").splitlines()],
        "",
        f"Backward of the forward plan: {plan.summary()}.",
        f"Scale {plan.scale!r}" + (f", softcap {plan.softcap!r}" if plan.softcap is not None else "")
        + f"; {mask_doc(plan)}",
        f"Backward blocks: {cfg.summary}.",
        "Entry points, dispatched in this order (the manifest's \"backward\" lists their bindings):",
        *[f"  {e.entry}: grid ({', '.join(e.grid)}) x {e.threads}" for e in entries],
        "Tensors are (batch, seq, heads, head_dim) as the forward's; dq as q, dk and dv as k and v "
        "(one binding, dkv); lse (B, Hq, Lq) f32.",
    ]
    return comment_block(lines)


def backward_source(plan: KernelPlan) -> str:
    """The backward module of `plan` (ValueError where it has none: backward_plan)."""
    made = backward_plan(plan)
    if made is None:
        raise ValueError(f"kernel '{plan.spec.name}' has no WGSL backward")
    cfg, entries = made
    c = constants(plan)
    scale = c_float(plan.scale)
    extra = {"scale_log2": c_float(plan.scale * LOG2E)}
    if plan.softcap is not None:
        extra.update(scale_over_cap=c_float(plan.scale / plan.softcap), softcap_log2=c_float(plan.softcap * LOG2E))
    native_f16 = plan.dtype == "f16" and not plan.details.f16_packed
    return render(
        "wgsl/backward.wgsl.j2",
        header=_backward_header(plan, cfg, entries),
        directives=["f16"] if native_f16 else [],
        cfg=cfg,
        tile_q=plan.tile_q,
        tile_kv=plan.tile_kv,
        entry=plan.entry,
        elem="f32" if plan.details.f16_packed else _SCALAR[plan.dtype],
        f16_packed=plan.details.f16_packed,
        types_doc=_BACKWARD_TYPES_DOC["f16 packed" if plan.details.f16_packed else plan.dtype],
        fields=_fields(plan),
        bindings=_backward_bindings(plan, entries),
        mask=plan.mask,
        mask_doc=mask_doc(plan),
        **backward_expression_sources(plan),
        scale=scale,
        scale_doc="1 / sqrt(head_dim qk)" if plan.spec.scale is None else "from the spec",
        softcap=c["softcap"],
        log2e=c["log2e"],
        **extra,
    )


def backward_expression_sources(plan: KernelPlan) -> dict:
    """The backward template's expressions (issue 42): the mask section's mask_expr (as the
    forward's), and score_expr with score_expr_ds, d score / d s (attngen.plan.expr_grad), for
    the recompute section, after the helpers and input loaders they use ("" where the spec has
    none), and the forward's tile classification (mask_tile_sources) for the backward's blocks. A
    read in score_expr_ds flags the site of the same read in the score (`sites`)."""
    from ...lang.expr import Load, walk
    from ...plan.expr_grad import as_real, grad_reads, score_ds
    from . import expr as wgsl_expr
    from . import expr_grads
    spec = plan.spec
    mask = spec.mask.expr if spec.mask.kind == "expr" else None
    ds = as_real(score_ds(spec.score)) if spec.score is not None else None
    derived = [d for *_, d in grad_reads(spec)]  # d score / d each read of a grad input
    helpers = wgsl_expr.helpers_of(mask, spec.score, ds, *derived) + [wgsl_expr.loader(i) for i in spec.inputs]
    helpers = "".join(h + "\n" for h in helpers)
    found = wgsl_expr.sites(spec)
    site_of = {id(n): at + 1 for at, (_, n) in enumerate(found)}
    for n in (n for e in [ds, *derived] if e is not None for n in walk(e)):
        if isinstance(n, Load) and id(n) not in site_of:
            site_of[id(n)] = next(at + 1 for at, (what, m) in enumerate(found) if what == "score" and m == n)
    out = {"mask_expr_source": "", "score_expr_source": "", **mask_tile_sources(plan),
           "grad_inputs_source": expr_grads.source(spec, site_of)}
    if mask is not None:
        out["mask_expr_source"] = helpers + wgsl_expr.function("mask_expr", mask, "mask", site_of)
    if spec.score is not None:
        out["score_expr_source"] = (
            "// score expression (issue 42): the score the softmax saw, score_expr(s, b, h, hkv, q, k, Lq, Lk), of\n"
            "// the scaled score s = SCALE * Q_i . K_j and the pair's indices (q and k 0-based, top-left, within the\n"
            "// sequence), and its derivative d score / d s (attngen.plan.expr_grad: simplified, with PyTorch's\n"
            "// subgradients where it is not differentiable), which multiplies dS_ij.\n"
            + ("" if mask is not None else helpers) + wgsl_expr.function("score_expr", spec.score, "score", site_of)
            + "\n" + wgsl_expr.function("score_expr_ds", ds, "d score / d s =", site_of) + "\n")
    return out


_BACKWARD_TYPES_DOC = {
    "f32": ["Storage is f32; all arithmetic is f32."],
    "f16": ["Storage is f16 (`enable f16;`, the shader-f16 feature); blocks are widened to f32 as they",
            "are loaded, all arithmetic and accumulation is f32, gradients are rounded to f16 as stored."],
    "f16 packed": ["Storage is f16 packed in u32 words (no shader-f16): q, k, v, out, dout, dq and dkv are",
                   "bound as vec2<u32> (4 elements per item); all arithmetic is f32."],
}


def backward_manifest(plan: KernelPlan) -> dict | None:
    """The manifest's "backward": how a runtime without Python runs the backward module."""
    made = backward_plan(plan)
    if made is None:
        from .expr_grads import backward_problems
        why = [p.message for p in backward_problems(plan.spec)] or [
            "head dims too large for the backward's blocks (one row and one key of Q, dO, K and V in 16384 "
            "bytes of workgroup memory)"]
        return {"available": False, "why": "; ".join(why)}
    cfg, entries = made
    values = _values(plan)
    fields = plan.details.uniform_fields
    bindings = []
    for p in _backward_params(entries):
        entry = {"group": 0, "binding": p.binding, "name": p.name}
        if p.kind == "uniform":
            entry.update(type="uniform", struct="Params", size_bytes=4 * len(fields),
                         fields=[{"name": n, "type": t, "offset": 4 * i, "doc": d, "value": values.get(n, "0")}
                                 for i, (n, t, d) in enumerate(fields)],
                         value_note="the forward's Params, with the same values (write_lse and Lnew: 0)")
        else:
            entry.update(type="read-only-storage" if p.access == "read" else "storage", dtype=p.dtype,
                         shape=list(p.shape), doc=p.doc)
            if plan.details.f16_packed and p.dtype == "f16":
                entry["packing"] = ("two f16 per u32 word, element 2w in the low 16 bits (the bytes of a "
                                    "little-endian f16 array)")
        bindings.append(entry)
    from . import expr_grads
    grads = [i for i in plan.spec.inputs if i.grad]
    out = {
        "available": True,
        "source": "a separate module: attngen build SPEC --target wgsl --emit backward",
        "workgroup_storage_bytes": cfg.smem_bytes,
        "block": {"q": cfg.block_q, "kv": cfg.block_kv},
        "bindings": bindings,
        "entry_points": [{"entry_point": e.entry, "role": e.name, "doc": e.doc, "workgroup_size": [e.threads, 1, 1],
                          "dispatch": list(e.grid), "workgroup_storage_bytes": e.smem_bytes,
                          "bindings": [p.binding for p in e.params],
                          "storage_buffers": sum(1 for p in e.params if p.kind == "tensor")} for e in entries],
        "entry_points_note": f"dispatch the {'three' if len(entries) == 3 else 'four'} in this order, each with a bind group of exactly its bindings; "
                             "rows and dkv / dq zero-filled before the first (fresh WebGPU buffers are)",
        "rows": {"bytes": "4 * (2 * Hq * Tq + 1)",
                 "index": "2 * r: lse_i * log2(e), 2 * r + 1: D_i, r = lse's index of the row; word "
                          "2 * Hq * Tq: 1 when a driver cut a step's loops short (the results are then invalid)"},
        "dkv": {"dk": "elements [0, rows(k) * Hkv * Dqk): rows(k) = B * cap (padded) or total_k (packed)",
                "dv": "the next rows(k) * Hkv * Dv elements"},
        "inputs": "q, k, v as the forward's call; out and lse the forward's (lse natural log, written with "
                  "write_lse = 1); dout shaped as out; mask custom: the forward's BlockMask buffer"
                  + ("; expression inputs: the forward's `inputs` words (its flag word zeroed: the backward sets "
                     "it as the forward)" if plan.spec.inputs else ""),
    }
    if grads:  # issue 42: the `grad` inputs' gradients follow rows' flag word (expr_grads.py)
        sym = {"b": "B", "h": "Hq", "hkv": "Hkv", "q": "Lq", "k": "Lk"}  # (a padded batch: Lk = k.shape[1])
        size = {i.name: " * ".join(sym[a] if isinstance(a, str) else str(a) for a in i.axes) for i in grads}
        out["rows"]["bytes"] = "4 * (2 * Hq * Tq + 1 + " + " + ".join(size[i.name] for i in grads) + ")"
        out["grads"] = [{"name": i.name, "dtype": "f32", "shape": [sym[a] if isinstance(a, str) else a for a in i.axes],
                         "at_word": "2 * Hq * Tq + 1" + "".join(f" + {size[j.name]}" for j in grads[:n]),
                         "doc": "d loss / d the input, in rows from word at_word, row-major in its declared shape; "
                                "written by the dkdv step (the grads step for those in \"partials\"), 0 where no "
                                "visible pair reads an entry"}
                        for n, i in enumerate(grads)]
        part = expr_grads.partials(plan.spec)
        if part:  # then the partial sums of the inputs many pairs read, one slice per dkdv workgroup
            at = "2 * Hq * Tq + 1 + " + " + ".join(size[i.name] for i in grads)
            slices = f"ceil(Lk / {cfg.block_kv}) * Hkv * B"
            out["partials"] = []
            for p in part:
                ext = p.formula("BKV")  # (by the source's name: "block" gives its value; cuda's check prints a number)
                words = f"{slices} * " + " * ".join(ext)
                out["partials"].append({
                    "name": p.input.name, "slice": ext, "at_word": at, "words": words,
                    "doc": "f32 partial sums of d loss / d the input: one slice per dkdv workgroup (x, y, z), the "
                           "(z * Hkv + y) * ceil(Lk / BKV) + x-th, row-major in `slice` (an axis named k spans the "
                           "workgroup's BKV keys, b and hkv one, h the group's G heads); the grads step sums them"})
                at += f" + {words}"
            out["rows"]["bytes"] = f"4 * ({at})"
    return out
