"""KernelPlan -> CUDA C++ source (for NVRTC) and its manifest."""

from __future__ import annotations

from ...lang.spec import DTYPE_BYTES, FP8_DTYPES, KV_DTYPES
from ...plan import masks
from ...plan.kernel_plan import KernelPlan
from ...plan.schedule import blocks_per_core, pack_gqa, split_rule
from ..render import (c_float, comment_block, constants, header_lines, layout_lines, manifest, mask_doc, render,
                      transform_doc)
from . import kvquant
from .family import TILE_LIST_ENTRIES, TILE_LIST_HEAD, family_name, kernel_shape
from .lower import COMBINE_WARPS, fused_combine

# Per storage dtype: the types template and the PTX type name of the tensor-core inputs.
_TYPES = {
    "f16": ("cuda/types_f16.j2", "f16"),
    "bf16": ("cuda/types_bf16.j2", "bf16"),
    "f32": ("cuda/types_f32.j2", None),
    "e4m3": ("cuda/types_fp8.j2", "e4m3"),  # FP8 prefill: elem_t holds two FP8 values (fp8.py)
    "e5m2": ("cuda/types_fp8.j2", "e5m2"),
}


# Tensors stored in the spec's dtype (elem_t in the source); other tensors by their dtype.
_STORAGE = ("q", "k", "v", "out", "k_new", "v_new")
_C_TYPES = {"f32": "float", "i32": "int", "u32": "unsigned", "u8": "unsigned char", "i64": "long long",
            "f16": "unsigned short", "bf16": "unsigned short", "bool": "unsigned char",  # (f16 / bf16 / bool: inputs)
            "e4m3": "unsigned char", "e5m2": "unsigned char"}  # (FP8's V^T workspace)


_WS_NOTE = {
    "stored_p": "allocated by the launcher, uninitialised; one row per block of the grid, written and read back by "
                "the same launch",
    False: "allocated by the launcher, uninitialised; reused only after the combine has run",
    True: "zero before a launch and left zero by it: a caller keeps one such buffer per stream (the "
          "fused combine's last split block of each row tile resets its counter; the persistent blocks' "
          "last fetch wraps theirs to zero); zero it once when allocated",
}


def _c_decl(p, entry: bool = True, kv: bool = False) -> str:
    """The C++ declaration of one kernel parameter (of an entry point, or of the device function
    it calls: a tensor map stays in the entry's parameter space and is passed on by reference)."""
    if p.kind == "scalar":
        return f"{_C_TYPES[p.dtype]} {p.name}"
    if p.kind == "tensor_map":
        return f"const __grid_constant__ TensorMap {p.name}" if entry else f"const TensorMap& {p.name}"
    # (kv: a quantized cache's k and v hold its stored bytes, kv_t; FP8 prefill's are elem_t)
    base = ("kv_t" if kv and p.dtype in KV_DTYPES else "elem_t") if p.name in _STORAGE else _C_TYPES[p.dtype]
    # k and v are written only by an append, at keys no block reads from the cache (docs/variants.md)
    const = "const " if p.access == "read" or p.name in ("k", "v") else ""
    return f"{const}{base}* __restrict__ {p.name}"


def param_list(params, indent: int, entry: bool = True, kv: bool = False) -> str:
    """Declarations, one per line, aligned after the opening parenthesis."""
    return (",\n" + " " * indent).join(_c_decl(p, entry, kv) for p in params)


def _variant_context(plan: KernelPlan) -> dict:
    """What the templates need to know of docs/variants.md's variants (flags only)."""
    spec = plan.spec
    combine = [e for e in plan.entries if e.name == "combine"]
    kv = spec.kv_dtype is not None  # (its k and v: kv_t, the stored bytes)
    return dict(
        params_decl=param_list(plan.params, len("__device__ __forceinline__ void attention("), entry=False, kv=kv),
        tma=plan.config.tma,
        entry_decl=param_list(plan.params, len(plan.entry) + 1, kv=kv),
        pv_decl=param_list(plan.params, len(plan.entry) + len("_pv("), kv=kv),
        param_names=", ".join(p.name for p in plan.params),
        custom=spec.mask.is_custom,
        # (the types' helpers: some namespace cleans; a family template gets each namespace's own, _namespace)
        clean_v=any(cleans_values(c, plan.mask) for c in (plan.config, plan.config.varlen) if c is not None),
        clean_all=cleans_every_tile(plan.config),  # (the template without namespaces: the one configuration's)
        hidden_keys=masks.hides_loaded_keys(plan.mask),  # partial tiles are cleaned in the first pass
        paged=spec.kv_cache.is_paged,
        page=spec.kv_cache.page,
        split=spec.schedule.is_split,
        two_pass=spec.schedule.is_two_pass,
        fused_combine=fused_combine(spec, plan.config),
        combine_launch=spec.schedule.is_split and not fused_combine(spec, plan.config),  # (the combine entry)
        pack_gqa=pack_gqa(spec),
        # The plain prefill kernel (fused, contiguous cache, structured mask, whole head dims) gets
        # a second instantiation without the per-sequence machinery, for launches without
        # cu_seqlens / kv_lens / append: it keeps the plain algorithm's registers (CudaConfig:
        # fast_path, varlen). The other kinds use one general instantiation (half the NVRTC time).
        padded_fast_path=plan.config.fast_path,
        varlen=plan.details.varlen is not None,
        varlen_decl=param_list(plan.params, len(plan.entry) + len("_varlen("), kv=kv),
        general_doc="One instantiation serves every launch of this kind (padded, packed, kv_lens, appends).",
        combine_warps=COMBINE_WARPS,
        mask_stage_words=plan.config.mask_stage_words,
        tile_list_head=TILE_LIST_HEAD,  # a mask expression's list of live tiles (family.tile_list)
        tile_list_entries=TILE_LIST_ENTRIES,
        order_bytes=plan.config.causal_order_bytes,
        keys_a=plan.config.stored_p_keys_a,  # P through memory: keys per tile of phase A
        combine_decl=param_list(combine[0].params, len(plan.entry) + len("_combine(")) if combine else "",
        **expression_sources(plan),
    )


def expression_sources(plan: KernelPlan) -> dict:
    """The template values of the spec's score and mask expressions (issue 42; expr.py): the
    mask section's mask_expr and mask_expr_tile, the score section's score_expr, and before the
    first of them the helpers they use and the inputs' ExprInputs and loaders ("" where the spec
    has none); expr_scale, the factor between a raw dot product and the score expression's s;
    expr_inputs_init, the statement that builds the ExprInputs from the kernel's parameters, and
    whether each expression reads inputs (then it is evaluated only where its result is used)."""
    from ...lang.expr import format_expr, inputs_read, walk
    from ...plan.expr_reads import hoist_item_reads
    from . import expr as cuda_expr
    spec = plan.spec
    mask = spec.mask.expr if spec.mask.kind == "expr" else None
    helpers = "".join(h + "\n" for h in cuda_expr.helpers_of(mask, spec.score))
    helpers += cuda_expr.inputs_source(spec) + ("\n" if spec.inputs else "")
    site_of = cuda_expr.site_numbers(spec)
    # the score's reads that depend on the row's head only (ALiBi's slopes[h]) are evaluated once
    # per row and tile (functions score_itemN), not at every pair
    score, items = hoist_item_reads(spec.score, spec.inputs) if spec.score is not None else (None, ())
    out = {"mask_expr_source": "", "score_expr_source": "",
           "expr_scale": c_float(1.0 if plan.prescale_q else plan.scale),
           "expr_inputs_init": cuda_expr.inputs_init(spec) if spec.inputs else "",
           "mask_reads_inputs": mask is not None and bool(inputs_read(mask)),
           # the score reads inputs (takes expr_in) / may read out of bounds (evaluated only where
           # its value is used: the visible pairs of the sequence)
           "score_takes_inputs": score is not None and bool(inputs_read(score)),
           "score_reads_inputs": score is not None and any(site_of.get(id(n)) for n in walk(score)),
           "score_items": [(cuda_expr.C_TYPE[x.type], f"item{i}", format_expr(x)) for i, x in enumerate(items)]}
    if mask is not None:
        out["mask_expr_source"] = (helpers + cuda_expr.function("mask_expr", mask, "mask", site_of) + "\n"
                                   + cuda_expr.INTERVAL_HELPERS + "\n" + cuda_expr.tile_function(mask) + "\n")
    if spec.score is not None:
        out["score_expr_source"] = ("" if mask is not None else helpers) + "".join(
            cuda_expr.function(f"score_item{i}", x, "item", site_of) + "\n" for i, x in enumerate(items)
        ) + cuda_expr.function("score_expr", score, "score", site_of, items, spec.score)
    return out


_PAD_DOC = {
    "wgmma": "padded to a multiple of 64 (whole 128-byte swizzle blocks); padding is zero",
    "mma": "padded to a multiple of 16 (the k of m16n8k16); padding is zero",
    "fma": "no padding on CUDA cores",
}


def cleans_every_tile(c) -> bool:
    """Whether the kernel of tile configuration `c` cleans V, in its one pass, in every tile where
    a weight is 0: the plain loop's family (family.py: mma.sync and CUDA cores, and wgmma without a
    producer or the overlapped loop), which has no second pass (CudaTiles.clean_every_tile)."""
    return (c.clean_values and c.clean_every_tile and not c.stored_p and c.kv_dtype != "i8"
            and family_name(c) == "plain")


def cleans_values(c, mask) -> bool:
    """Whether the kernel of tile configuration `c` cleans V's non-finite values (section
    non-finite values, templates/cuda/nonfinite.j2): where the mask hides keys of the tiles a block
    loads (partial tiles), and wherever the kernel takes care of keys of weight 0: persistent
    blocks and the overlapped loop without a producer (a cleaning pass), the plain loop (every
    tile, cleans_every_tile). P through memory redoes a warp's P V on its own (templates/cuda/
    stored_p.j2); every producer kernel is persistent (docs/language.md, "A key of weight 0 adds
    nothing"). (CudaTiles.clean_values False: nowhere, a probe's switch.)"""
    return (c.clean_values and not c.stored_p and not c.fp8 and c.kv_dtype != "i8"  # (FP8: V^T comes cleaned,
            # fp8.py; int8 has no inf or NaN)
            and (masks.hides_loaded_keys(mask) or family_name(c) in ("producer", "overlap")
                 or cleans_every_tile(c)))


def _registers(c, spec) -> tuple[int, int]:
    """(producer, consumer) registers after setmaxnreg of configuration `c` (choices.producer_registers)."""
    return c.setmaxnreg


def _namespace(name: str, c, doc: str, mask, spec, plan) -> dict:
    """One tile configuration's context for its kernel family's template (its shared-memory
    offsets and strides, its family and the paths it takes (f: family.KernelShape), its matmul
    primitives: the _varlen entry of head dims above 256 runs the mma.sync family beside the main
    entry's wgmma, whether it cleans V's values, and its producer's and consumers' registers: the
    _varlen entry's producer copies by cp.async)."""
    regs = _registers(c, spec)
    clean_v, clean_all = cleans_values(c, mask), cleans_every_tile(c)
    shape = kernel_shape(c, spec, mask, clean_v=clean_v, clean_all=clean_all,
                         fused_combine=fused_combine(spec, plan.config), prescale_q=plan.prescale_q,
                         softcap=plan.softcap, pack_gqa=pack_gqa(spec))
    return {"name": name, "c": c, "doc": doc, "clean_v": clean_v, "clean_all": clean_all, "f": shape,
            "producer_regs": regs[0], "consumer_regs": regs[1],
            "offsets": {b.name: b.offset for b in c.buffers},
            # (in elements; FP8 buffers' elements hold two values; a quantized cache's bytes are kv_t)
            "strides": {b.name[1:].lower(): b.cols // (2 if c.fp8 and b.dtype in FP8_DTYPES else 1) for b in c.buffers},
            "math_template": f"cuda/math_{c.math}{'_fp8' if c.fp8 else '_kvq' if c.kv_dtype and c.math == 'mma' else ''}.j2",
            "pad": c.column_step,
            "pad_doc": _PAD_DOC[c.math]}


_NAMESPACE_DOC = {
    "padded": "launches without cu_seqlens_q, kv_lens or an append (the main entry point)",
    "varlen": "launches with cu_seqlens_q, kv_lens or an append (entry point {entry}_varlen)",
}


def _namespaces(plan: KernelPlan) -> list[dict]:
    """The context of each tile configuration the source holds: `padded` (the main one) and,
    with a _varlen entry, `varlen`."""
    c = plan.config
    out = [_namespace("padded", c, _NAMESPACE_DOC["padded"], plan.mask, plan.spec, plan)]
    if c.varlen is not None:
        out.append(_namespace("varlen", c.varlen, _NAMESPACE_DOC["varlen"].format(entry=plan.entry), plan.mask,
                              plan.spec, plan))
    return out


def namespace_shapes(plan: KernelPlan) -> list[tuple[str, object]]:
    """(namespace, KernelShape) of each tile configuration of the plan, as render_source uses them."""
    return [(ns["name"], ns["f"]) for ns in _namespaces(plan)]


def render_source(plan: KernelPlan) -> str:
    """The CUDA C++ source of a plan."""
    c = plan.config
    types_template, mma_type = _TYPES[plan.dtype]
    namespaces = _namespaces(plan)
    main = namespaces[0]
    offsets, strides = main["offsets"], main["strides"]
    layout = layout_lines(plan, "Shared memory")
    if c.chunked:
        layout.append(c.chunk_summary[0].upper() + c.chunk_summary[1:] + ".")
    if c.varlen is not None:
        layout.append(c.varlen_summary[0].upper() + c.varlen_summary[1:] + ".")
    slack = c.rescale_slack
    source = render(
        "cuda/kernel.cu.j2",
        header=comment_block(header_lines(plan, layout)),
        c=c,
        entry=plan.entry,
        elem_bytes=4 if plan.dtype == "f32" else 2,  # (FP8: elem_t is a pair of values)
        kv_bytes=1 if plan.spec.kv_dtype else (4 if plan.dtype == "f32" else 2),  # of the K and V tiles
        dtype=plan.dtype,
        out_dtype=plan.out_dtype,
        kv_perm=bool(plan.spec.kv_dtype) and c.math == "mma",  # acc's columns in kvquant.py's order
        **kvquant.template_context(plan, c),
        **_fp8_context(plan),
        pad=main["pad"],
        pad_doc=main["pad_doc"],
        strides=strides,
        offsets=offsets,
        namespaces=namespaces,
        f=main["f"],  # (the main namespace's KernelShape, for the template without namespaces)
        types_template=types_template,
        math_template=main["math_template"],
        producer_regs=main["producer_regs"],  # (the template without namespaces: the one configuration's)
        consumer_regs=main["consumer_regs"],
        mma_type=mma_type,
        acc_qk=plan.acc_qk,
        acc_pv=plan.acc_pv,
        any_f16_acc="f16" in (plan.acc_qk, plan.acc_pv),
        rescale_slack=c_float(slack) if slack else None,
        mask=plan.mask,
        mask_doc=mask_doc(plan),
        **_variant_context(plan),
        transform_doc=transform_doc(plan),
        **constants(plan),
    )
    return source


def _fp8_context(plan: KernelPlan) -> dict:
    """What the FP8 templates print (fp8.py): P's offset, and the _prepare_v entry's declaration,
    block and key slots."""
    if not plan.config.fp8:
        return {}
    from .fp8 import KEY_SLOTS, P_OFFSET, PREPARE_THREADS, TILE_KV, group_slots, vt_swizzle
    prepare = next(e for e in plan.entries if e.name == "prepare_v")
    return {"p_offset": c_float(P_OFFSET), "prepare_threads": PREPARE_THREADS, "key_slots": KEY_SLOTS,
            "group_slots": group_slots(), "vt_swizzle": vt_swizzle(plan.config.tile_kv), "prep_keys": TILE_KV,
            "prepare_decl": param_list(prepare.params, len(prepare.entry) + 1)}


def render_manifest(plan: KernelPlan) -> dict:
    """What a launcher without Python needs (the common part, attngen.backends.render.manifest,
    plus the CUDA launch facts)."""
    c = plan.config
    arch = plan.details.arch
    extra = {
        "language": "CUDA C++17 (NVRTC), no headers",
        "arch": arch,
        "compile_options": ["--std=c++17", f"--gpu-architecture={arch}"],
        "block": [c.threads, 1, 1],
        "dynamic_shared_memory_bytes": c.smem_bytes,
        "shared_memory_note": "above 48 KiB a launcher must raise the kernel's "
                              "cudaFuncAttributeMaxDynamicSharedMemorySize first",
        "alignment": "q, k, v, out base pointers 16-byte aligned; strides multiples of "
                     f"{16 // DTYPE_BYTES[plan.dtype]} elements" + (" (of q, k, v; out's: 8)" if plan.spec.is_fp8 else ""),
        "features": [],
    }
    extra["grid_symbols"] = {
        "B": "batch", "Lq": "query rows per sequence (packed: the longest sequence's)",
        "Lk": "keys per sequence (kv_lens / packed: the longest sequence's, after the append)",
        "Hq": "query heads", "Hkv": "KV heads", "G": "Hq / Hkv", "Dqk": plan.d_qk, "Dv": plan.d_v,
        "S": "KV splits (1 for fused)", "Tq": "rows of packed q", "Tk": "rows of packed k",
        "Lnew": "rows appended per sequence", "P": "pages", "Pmax": "block_table columns",
        "Bm": "mask batch (1 or B)", "Hm": "mask heads (1 or Hq)",
        "Wm": "32-bit words per row of a boolean mask: 4 * ceil(Lk / 128) + 4", "Nq": f"ceil(Lq / {c.tile_q})",
        "Nk": f"ceil(Lk / {c.tile_kv})",
        "SM": "multiprocessors of the GPU (persistent blocks: one per multiprocessor)",
    }
    extra["lse"] = {"layout": ["B", "Hq", "Lq"], "packed_layout": ["Hq", "Tq"], "dtype": "f32",
                    "units": "natural log", "empty_row": "-inf"}
    extra["variants"] = "docs/variants.md: layouts, kv_lens, packed sequences, paged caches, appends"
    if plan.details.varlen is not None:
        v = plan.details.varlen
        extra["varlen_entry_point"] = {
            "entry_point": v.entry,
            "when": "launch it instead of entry_point when cu_seqlens_q, kv_lens or k_new / v_new is given",
            "grid": list(v.grid), "block": [v.threads, 1, 1], "dynamic_shared_memory_bytes": v.smem_bytes,
            "parameters": "the same as entry_point's", "doc": v.doc}
    if plan.spec.schedule.is_split:
        splits = plan.spec.schedule.splits
        extra["splits"] = (f"S = {splits}" if splits is not None else
                           split_rule(c.tile_q, c.tile_kv, blocks_per_core(plan)) + " (attngen.plan.schedule.choose_splits; "
                           "compute_units = the GPU's multiprocessors)")
        extra["combine"] = ("fused: the last split block of each row tile merges the splits (tile_counters), "
                            "one launch" if fused_combine(plan.spec, c) else
                            "a second launch (the combine entry point) merges the splits")
    if plan.workspaces:
        extra["workspaces"] = {w.name: {"bytes": w.bytes_formula, "dtype": w.dtype,
                                        "note": _WS_NOTE["stored_p" if w.name == "ws_p" else w.persistent]}
                               for w in plan.workspaces}
    if c.stored_p:
        extra["persistent"] = ("one block per multiprocessor (grid symbol SM; min(a, b) is the smaller of a and b); "
                               "block x takes work items (row tile, head, batch; row tile fastest) x, x + gridDim.x, "
                               "...; pass batch_size = B")
        extra["stored_p"] = ("P through memory: block x keeps each row tile's P and running maxima in row x of "
                             "ws_p (uninitialised; any contents before the launch are fine) between its two phases")
    elif c.persistent:
        extra["persistent"] = ("one block per multiprocessor (grid symbol SM; min(a, b) is the smaller of a and b) "
                               "takes work items (row tile, head, batch) in turn; pass batch_size = B and a work_counter that is zero before the "
                               "launch (the launch's last fetch wraps it back to zero)")
    if plan.spec.inputs:
        from ...lang.expr import format_expr
        from .expr import ERROR_WORD, sites
        extra["expression_inputs"] = {
            "parameters": "input_NAME per `input` line: a pointer to its elements, row-major over its axes "
                          "(f16 / bf16: their bits; u8 / bool: one byte each); ext_b, ext_h, ext_hkv, ext_q, ext_k: "
                          "the extents of the axes b, h, hkv, q, k (batch, query heads, KV heads, query rows, the "
                          "k tensor's rows); padded batches only",
            "bounds": f"a read out of its input's bounds reads 0 and writes expr_site0 + its site into word "
                      f"{ERROR_WORD} of errors (null errors: not reported)",
            "sites": [{"site": n + 1, "expression": what, "read": format_expr(load)}
                      for n, (what, load) in enumerate(sites(plan.spec))]}
    if c.chunked:
        # tile d and the split of the output columns over blocks (already in the grid formula).
        extra["tile"] = {"q": c.tile_q, "kv": c.tile_kv, "d": c.chunk}
        extra["output_column_blocks"] = {
            "blocks": c.v_blocks, "columns_per_block": c.d_v_block,
            "grid_y": f"head * {c.v_blocks} + block; block b writes out[..., b * {c.d_v_block} : "
                      f"(b + 1) * {c.d_v_block}] (clipped to Dv); block 0 writes lse"}
        if plan.spec.schedule.is_two_pass:
            extra["output_column_blocks"]["two_pass"] = (
                "pass 1 (the main entry) computes the scores once per head, without column blocks "
                "(grid.y = heads); pass 2 (the _pv entry) has them: block b writes its columns of ws_o")
    return manifest(plan, extra)
