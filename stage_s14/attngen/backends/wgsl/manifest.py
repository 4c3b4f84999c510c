"""What the WGSL manifest says about the packed buffers and the entry points, for runtimes
outside Python (a browser): the word layout of `seq_meta` and `mask`, the sizes of the split
schedules' workspaces, and every entry point in dispatch order with its bindings and grid.

The formulas use the Params fields (meta_cu_q, mask_counts, ...) and the grid symbols (B, Lq,
Hq, Hkv, G = Hq / Hkv, S = splits); attngen's own runtime fills them the same way
(attngen/backends/wgsl/args.py).
"""

from __future__ import annotations

from ...plan.kernel_plan import KernelPlan
from ...plan.schedule import max_splits, pack_gqa, split_rule_for
from .lower import append_params

BUFFER_LAYOUTS = {
    "seq_meta": {
        "element": "u32",
        "sections": [
            {"name": "cu_seqlens_q", "offset": "meta_cu_q", "words": "B + 1", "when": "kv_layout = 1 (packed)"},
            {"name": "cu_seqlens_k", "offset": "meta_cu_k", "words": "B + 1",
             "when": "kv_layout = 1 (packed; a copy of cu_seqlens_q when not given)"},
            {"name": "kv_lens", "offset": "meta_kv_lens", "words": "B", "when": "has_kv_lens = 1"},
            {"name": "block_table", "offset": "meta_table", "words": "B * table_width",
             "when": "kv_layout = 2 (paged), row-major (B, table_width)"},
        ],
        "note": "attngen packs them in this order, each right after the previous one; any offsets work",
    },
    "mask": {
        "element": "u32",
        "sections": [
            {"name": "counts", "offset": "mask_counts", "words": "Bm * Hm * n_qtiles",
             "doc": "live kv tiles of each q tile, (Bm, Hm, n_qtiles)"},
            {"name": "tiles", "offset": "mask_tiles", "words": "Bm * Hm * n_qtiles * n_kvtiles",
             "doc": "per q tile, its live kv tiles in ascending order as kv_tile * 2 + partial (entries past "
                    "the count: 0xffffffff)"},
            {"name": "data", "offset": "mask_data",
             "words": "ceil(Bm * Hm * Lq_m * Lk_m / 4) (bool) or Bm * Hm * Lq_m * Lk_m (additive)",
             "doc": "the mask (Bm, Hm, Lq_m, Lk_m) row-major: bool as bytes (1 = attend), 4 per word, "
                    "little-endian (byte e in word e / 4 at bit 8 * (e % 4)); additive as f32 bits, -inf masked"},
        ],
        "note": "n_qtiles = ceil(Lq_m / tile q) = mask_qtiles, n_kvtiles = ceil(Lk_m / tile kv) = mask_kvtiles; "
                "the entry point block_mask of the block-mask module fills counts and tiles from data",
    },
    "inputs": {"element": "u32", "sections": "the manifest's inputs: word 0 the flag, then each input at its offset"},
    "kv_scale": {"element": "f32", "k_scale": "words [0, scale_v): (B, Hkv) for e4m3 / e5m2, k's shape with "
                 "the head dim replaced by Dqk / 32 for i8", "v_scale": "words [scale_v, scale_v + its size): as "
                 "k_scale, for v (Dv / 32 for i8)"},
    "kv_new": {"element": "storage dtype", "k_new": "elements [0, new_v): (B, Lnew, Hkv, Dqk)",
               "v_new": "elements [new_v, new_v + B * Lnew * Hkv * Dv): (B, Lnew, Hkv, Dv)"},
}

# kv_dtype (issue 44): k and v hold one byte per value, 4 per u32 word; the launch symbol of v_scale's offset
KV_PACKING = {
    "e4m3": "one byte per value, 4 per u32 word (byte 4w + i at bit 8i, little-endian): OCP e4m3 (fn) bits; "
            "value = scale * e4m3(byte)",
    "e5m2": "one byte per value, 4 per u32 word (byte 4w + i at bit 8i, little-endian): e5m2 bits; "
            "value = scale * e5m2(byte)",
    "i8": "one byte per value, 4 per u32 word (byte 4w + i at bit 8i, little-endian): int8; "
          "value = scale of its block of 32 * int8(byte)",
}
KV_SYMBOLS = {"k_scale_words": "kv_dtype: f32 words of k_scale (B * Hkv for e4m3 / e5m2; k's elements / 32 for i8)",
              "v_scale_words": "kv_dtype: f32 words of v_scale (B * Hkv for e4m3 / e5m2; v's elements / 32 for i8)"}


# Where each workspace element is, and why a filled one is filled (the fill value: the plan's).
_WORKSPACE_INDEX = {
    "o_part": "(((s * B + b) * Lq + row) * Hq + head) * Dv + d",
    "lse_part": "((s * B + b) * Hq + head) * Lq + row",
    "s_scratch": "((b * Hq + head) * Lq + row) * Lk + key",
    "stats": "2 * (((s * B + b) * Hq + head) * Lq + row) (+1: sum)",
}
_FILL_WHY = {"lse_part": " (the combine's unwritten-row check)"}


def buffer_layouts(plan: KernelPlan) -> dict:
    """The layouts of the packed buffers and of the plan's workspaces, by binding name."""
    out = dict(BUFFER_LAYOUTS)
    for w in plan.workspaces:
        entry = {"bytes": w.bytes_formula, "index": _WORKSPACE_INDEX[w.name]}
        if w.fill is not None:
            entry["fill"] = f"0x{w.fill:08x} in every word before the launch{_FILL_WHY.get(w.name, '')}"
            entry["fill_word"] = w.fill  # the same, as a number: every u32 word of the buffer
        out[w.name] = entry
    return out


def _entry(name: str, role: str, doc: str, params, grid, workgroup: int) -> dict:
    return {
        "entry_point": name,
        "role": role,
        "doc": doc,
        "workgroup_size": [workgroup, 1, 1],
        "dispatch": list(grid),
        "bindings": [p.binding for p in sorted(params, key=lambda p: p.binding)],
        "storage_buffers": sum(1 for p in params if p.kind == "tensor"),
    }


def append_entry(plan: KernelPlan) -> str | None:
    """The decode kernel's entry point for calls that append to a quantized cache (its main entry
    point leaves the append out of the loop decode runs: decode.wgsl.j2), else None."""
    if getattr(plan.config, "decode", None) is not None and plan.spec.kv_dtype is not None:
        return plan.entry + "_append"
    return None


def entry_points(plan: KernelPlan) -> list[dict]:
    """Every entry point in dispatch order (one command encoder, in this order)."""
    kind = plan.spec.schedule.kind
    main_doc = {
        "fused": "the attention: out and lse",
        "split_kv": "attention over each split's key tiles: o_part and lse_part",
        "two_pass": "pass 1: the scores S of each split's key tiles into s_scratch, row max and sum into stats",
    }[kind]
    out = [_entry(plan.entry, "attention", main_doc, plan.params, plan.grid, plan.threads)]
    if append_entry(plan):  # the decode kernel over a quantized cache: its appending twin
        out[0]["append_entry_point"] = append_entry(plan)
        twin = append_params(plan.spec, plan.params)
        out[0]["append_bindings"] = [p.binding for p in sorted(twin, key=lambda p: p.binding)]
        out[0]["doc"] += (f"; a call that appends (Lnew > 0) dispatches {append_entry(plan)} in its place (the same "
                          "dispatch, with the fused append; its bindings: append_bindings, where an i8 cache's "
                          "k_scale_w / v_scale_w bind the k_scale / v_scale buffers read_write)")
    for e in plan.entries:
        out.append(_entry(e.entry, e.name, e.doc, e.params, e.grid, e.threads))
    return out


def schedule_manifest(plan: KernelPlan) -> dict:
    spec = plan.spec
    kind = spec.schedule.kind
    out = {"kind": kind}
    if kind != "fused":
        rule = split_rule_for(plan)  # the rule choose_splits applies, as numbers and text
        out["splits"] = ("N of split_kv(N)" if spec.schedule.splits else
                         rule.text + " (attngen.plan.schedule.choose_splits; compute_units from the profile)")
        out["max_splits"] = max_splits(spec)
        if spec.schedule.splits:
            out["splits_fixed"] = spec.schedule.splits  # S, whatever the shapes
        else:  # choose_splits' rule as numbers (a runtime evaluates it from the shapes)
            fields = rule.fields()
            fields["note"] += ("; compute_units: the device's (browsers do not say: the webgpu-core profile "
                               "guesses 8)")
            out["split_rule"] = fields
        if pack_gqa(spec):
            out["rows"] = "a workgroup's rows are (query row, head in group) pairs of one KV head (dispatch y = Hkv)"
        else:
            out["rows"] = ("mask custom: a workgroup's rows are query rows of one query head (dispatch y = Hq), "
                           "since the BlockMask's lists are per query head")
            out["split_of_the_list"] = ("split s of S takes the contiguous entries [s * P, min(count, (s + 1) * P)) "
                                        "of its q tile's list, P = ceil(count / S); a split with no entry writes "
                                        "lse_part MASKED (weight 0)")
    return out


# ---- expression inputs (issue 42): the `inputs` binding ----------------------------------------
_AXIS_SYMBOL = {"b": "B", "h": "Hq", "hkv": "Hkv", "q": "Lq", "k": "cap"}


def _input_words(inp) -> str:
    """Words of one input in the inputs binding, as a formula (args.input_words packs it so)."""
    elems = " * ".join(_AXIS_SYMBOL[a] if isinstance(a, str) else str(a) for a in inp.axes)
    return f"ceil({elems} / 4)" if inp.dtype in ("u8", "bool") else elems


def input_offsets(spec) -> dict:
    """{Params field input_NAME: its word offset as a formula}: from word 1 (word 0 is the flag),
    each input right after the one before it, in declaration order."""
    out, at = {}, ["1"]
    for inp in spec.inputs:
        out[f"input_{inp.name}"] = " + ".join(at)
        at.append(_input_words(inp))
    return out


def inputs_manifest(plan: KernelPlan) -> dict:
    """How a runtime passes the spec's expression inputs: one storage binding of u32 words, each
    input at the offset its Params field holds, and the flag word it reads back."""
    from ...lang.expr import format_expr
    from .expr import STORAGE, sites
    offsets = input_offsets(plan.spec)
    return {
        "binding": "inputs",
        "flag_word": 0,
        "flag_note": "word 0 holds 0 before the launch; after it, nonzero means a read out of an input's "
                     "bounds where the result is used (the value is the read's site, 1-based, in `sites`): the "
                     "kernel read 0 there and its output is not to be used (attngen raises)",
        "inputs": [{"name": i.name, "axes": [str(a) for a in i.axes], "dtype": i.dtype,
                    "shape": [_AXIS_SYMBOL[a] if isinstance(a, str) else str(a) for a in i.axes],
                    "offset_field": f"input_{i.name}", "offset": offsets[f"input_{i.name}"],
                    "words": _input_words(i), "storage": STORAGE[i.dtype]} for i in plan.spec.inputs],
        "sites": [{"site": n + 1, "expression": what, "read": format_expr(load)}
                  for n, (what, load) in enumerate(sites(plan.spec))],
        "note": "row-major over the declared axes (cap: k's second dimension, the padded layout's keys); "
                "packed sequences and paged caches are refused with inputs; any offsets work, these are "
                "attngen's",
    }


# ---- masks over inputs (issue 42): the two-part call -------------------------------------------

def companion_plan(plan: KernelPlan):
    """The plan of the `mask custom` attention kernel that runs a mask over inputs on the block-mask
    builder's BlockMask (attngen/plan/mask_inputs.py), for `plan`'s profile; None where that kernel
    does not fit the profile (a custom mask and the score's inputs: one storage buffer too many;
    the spec's own kernel then tests the mask per element)."""
    from ...errors import SpecError
    from ...plan.lower import lower
    from ...plan.mask_inputs import custom_spec
    from .. import get
    backend = get("wgsl")
    if "@" in plan.profile:  # the live adapter's profile (devices.adapter_profile), not a file's
        from .devices import adapter_profile
        profile = adapter_profile(backend)
    else:
        profile = backend.profile(plan.profile)
    try:
        return lower(custom_spec(plan.spec), backend, profile)
    except SpecError:
        return None


def mask_inputs_manifest(plan: KernelPlan, att, att_manifest: dict, bm: dict, workgroup: int) -> dict:
    """The two-part call of a spec whose mask reads inputs, for a host that runs it from the
    manifest alone: the builder module (three entry points on one bind group), then the attention
    kernel `att` (the spec with `mask custom`; its manifest `att_manifest`) with the builder's
    mask buffer bound as its `mask`. `bm`: the block_mask section of att's manifest (the tile
    lists' entry points and their Params, over Lqm / Lkm, here the call's Lq / Lk)."""
    from types import SimpleNamespace

    from ...lang.expr import Var, walk
    from ...plan.mask_inputs import custom_spec, mask_inputs
    from ...lang.spec import format_spec
    from .expr import STORAGE
    spec = plan.spec
    read = mask_inputs(spec)
    names = {n.name for n in walk(spec.mask.expr) if isinstance(n, Var)}
    offsets = input_offsets(SimpleNamespace(inputs=read))
    kv_lens_at = " + ".join(["1"] + [_input_words(i) for i in read])
    fields = ([("batch", "B"), ("heads_q", "Hq"), ("heads_kv", "Hkv"), ("len_q", "Lq"), ("cap", "Lk"),
               ("mask_batch", "Bm"), ("mask_heads", "Hm"), ("elements", "Bm * Hm * Lq * Lk"),
               ("has_kv_lens", "has_kv_lens"), ("kv_lens", kv_lens_at)]
              + [(f"input_{i.name}", offsets[f"input_{i.name}"]) for i in read])
    fields += [(f"_pad{n}", "0") for n in range(-len(fields) % 4)]
    mask_binding = next(b["binding"] for b in att_manifest["bindings"] if b["name"] == "mask")
    data_words = "ceil(Bm * Hm * Lq * Lk / 4)"
    return {
        "doc": "this spec's mask reads inputs, so its tiles are known only from the inputs' values: attngen runs "
               "it in two parts, (1) the builder module evaluates the mask on every (row, key) of each (Bm, Hm) "
               "slice into a BlockMask buffer, (2) the attention kernel of the same spec with `mask custom` "
               "(`attention`) runs with that buffer as its `mask` binding. The top-level entry points of this "
               "manifest are the spec's own kernel, which tests the mask per element (no tile skipped): either "
               "way gives the same output",
        "order": [{"module": "builder", "entry_point": e} for e in
                  ["block_mask_fill"] + [e["entry_point"] for e in bm["entry_points"]]]
                 + [{"module": "attention", "entry_point": e["entry_point"]} for e in att_manifest["entry_points"]],
        "symbols": {"Bm": "B" if "b" in names else "1", "Bm_with_kv_lens": "B",
                    "Hm": "Hq" if names & {"h", "hkv"} else "1", "Lqm": "Lq", "Lkm": "Lk", "mask_additive": "0",
                    "note": "Bm: the mask's batch slices (Bm_with_kv_lens where has_kv_lens = 1: Lk is each "
                            "sequence's), Hm its head slices; both modules' formulas use these values"},
        "builder": {
            "source": "a separate module: attngen build SPEC --target wgsl --emit block-mask",
            "workgroup_size": [workgroup, 1, 1],
            "bindings": [
                bm["bindings"][0],
                {"binding": 1, "type": "storage", "name": "mask",
                 "words": f"{bm['bindings'][1]['words'].replace(' + data words', '')} + {data_words}",
                 "fill_word": bm["fill_word"],
                 "fill_note": "words before data (counts and tiles) hold fill_word, data words 0, before the "
                              "builder runs; data starts at word BmParams.data"},
                {"binding": 2, "type": "uniform", "struct": "Params", "size_bytes": 4 * len(fields),
                 "fields": [{"name": n, "type": "u32", "offset": 4 * i, "value": v} for i, (n, v) in enumerate(fields)]},
                {"binding": 3, "type": "storage", "name": "inputs", "words": f"{kv_lens_at} + B * has_kv_lens",
                 "layout": "word 0 the flag (0 before the launch; nonzero after it: a read out of an input's "
                           "bounds, its site in the top-level inputs.sites: the result is not to be used), then "
                           "each input the mask reads at its offset, then kv_lens (B words) where has_kv_lens = 1",
                 "inputs": [{"name": i.name, "dtype": i.dtype,
                             "shape": [_AXIS_SYMBOL[a] if isinstance(a, str) else str(a) for a in i.axes],
                             "offset": offsets[f"input_{i.name}"], "words": _input_words(i),
                             "storage": STORAGE[i.dtype]} for i in read],
                 "kv_lens": kv_lens_at}],
            "entry_points": [{"entry_point": "block_mask_fill", "dispatch": [f"ceil({data_words} / {workgroup})", "1", "1"],
                              "dispatch_note": "x at most maxComputeWorkgroupsPerDimension: beyond, x = that and "
                                               "y = ceil(groups / x) (the entry point reads num_workgroups)"}]
                            + bm["entry_points"],
        },
        "attention": {"spec": format_spec(custom_spec(spec)),
                      "source": "attngen build SPEC --target wgsl --emit mask-custom (the spec above's source)",
                      "manifest": att_manifest},
        "feeds": {"from": "builder binding 1 (mask)", "to": f"attention binding {mask_binding} (mask)",
                  "note": "the same buffer, after the builder's dispatches (one command encoder: builder first); the "
                          "attention's Params mask fields take their manifest values with the symbols above; its "
                          "score's inputs, if any, as its manifest's inputs section says"},
    }
