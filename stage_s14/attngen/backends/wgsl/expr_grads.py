"""The gradients of `grad` inputs in the WGSL backward (issue 42; docs/backward.md), without
atomics, deterministically (the same bits on every run).

    fn grad_NAME_M(s, b, h, hkv, q, k, Lq, Lk) -> f32     d score / d read M of input NAME
    fn grad_inputs_add(ds, s, b, h, hkv, q, k, Lq, Lk)    at each visible pair of step 2

Step 2 (dK and dV) calls grad_inputs_add at each visible pair it recomputes, with ds = d loss /
d score = P (dP - D) (before the factor d score / d s). The gradients live in the workspace
`rows`, after its flag word (word 2 * Hq * Tq), one f32 area per `grad` input in declaration
order, row-major in the input's declared shape (a padded batch: the input's extents are params'
batch, heads_q, heads_kv, len_q and cap, as the loaders read them). The runtime creates `rows`
zeroed, so entries of hidden pairs, rows that see no key and keys past kv_lens stay 0. Two ways:

- *direct*: an input whose every read names one entry per (batch, query head, row, key) pair
  (attngen.plan.backward.injective, with an axis h: bias[b, h, q, k]) is added into its area by
  grad_inputs_add itself: the pair's (key block, KV head, batch) names the workgroup and its
  place in the block the invocation, so each entry has one writer.
- *partials*: every other input (a table read at k - q, slopes[h], a bias without b, a read at
  hkv summed over the GQA group's heads). grad_inputs_add keeps the pair's ds and s in workgroup
  memory (sG, sS); after the block pair, grad_partials_add walks every pair of the block in
  order and adds ds * d score / d entry into the workgroup's own slice of the input's partial
  sums (in rows after the gradients), each slice entry by the invocation that owns it (its
  offset modulo the workgroup size): no two invocations add into one word. A slice spans the
  input's axes, except that an axis indexed by its own name in every read, k, b, hkv or h
  (without hkv), spans only what the workgroup can name there: BKV keys, one batch, one KV head,
  the group's query heads (attngen.plan.grad_partials decides which inputs and axes; this module
  renders them). Then the entry point <entry>_bw_grads sums, for each entry, the slices of the
  workgroups that can name it, in grid order, into the gradient. A pair whose ds is
  exactly 0 adds nothing (not 0 times its derivative).

A read out of its bounds adds nothing (the score's loader has flagged the launch).
"""

from __future__ import annotations

from ...lang.expr import format_expr
from ...plan import grad_partials
from ...plan.expr_grad import grad_inputs, grad_reads
from . import expr as wgsl_expr

_EXTENT = {"b": "params.batch", "h": "params.heads_q", "hkv": "params.heads_kv", "q": "params.len_q",
           "k": "params.cap"}  # (expr._EXTENT: the loaders' extents)
ARGS = "s, b, h, hkv, q, k, Lq, Lk"


def partials(spec) -> list:
    """attngen.plan.grad_partials.partials of this target: an input with an axis hkv goes through
    partial sums even where every read is once per pair, as step 2 may run several query heads of
    the GQA group in parallel (its rows pack them), whose pairs would add into one entry (wrong
    sums on NVIDIA's Vulkan in testing, before partials)."""
    return grad_partials.partials(spec, direct_at_hkv=False)


def _full(axis) -> str:
    """The WGSL u32 extent of an input's axis (the loaders' params, or its fixed size)."""
    return _EXTENT[axis] if isinstance(axis, str) else f"{axis}u"


def slice_extents(p) -> list:
    """The WGSL u32 extents of one workgroup's slice of a partials input (`p`,
    grad_partials.Partials; the manifest prints p.formula("BKV"))."""
    return p.extents("BKV", "params.group", "1u", _full)


def numel(inp) -> str:
    """The WGSL u32 expression of input `inp`'s element count."""
    return " * ".join(_full(a) for a in inp.axes)


def _bounds(idx: list, ext: list) -> str:
    """The WGSL test that every index of a read lies in its axis: comparisons joined by `&`, not
    `&&`, so no branch per comparison (the loaders' `|`, wgsl/expr.py, says why: Dawn over
    SwiftShader's compile grew past 8 GB with chains of `&&` in a loop)."""
    return " & ".join(f"({x} >= 0i) & (u32({x}) < {e})" for x, e in zip(idx, ext))


def _flat(parts: list, ext: list) -> str:
    flat = parts[0]
    for x, e in zip(parts[1:], ext[1:]):
        flat = f"({flat}) * {e} + {x}"
    return flat


def source(spec, site_of: dict) -> str:
    """The derivative functions, grad_inputs_add, and with partials grad_partials_add and the
    sum's helper ("" without grad inputs). `site_of`: the site number of each Load by id, the
    derivatives' reads included (emit.backward_expression_sources)."""
    found = grad_reads(spec)
    if not found:
        return ""
    part = partials(spec)
    out = ["// The gradients of the `grad` inputs (issue 42): d loss / d entry, f32, in the workspace rows after\n"
           "// its flag word, one area per input in declaration order, row-major in the input's shape. No atomics:\n"
           "// an input read once per pair is added into by one invocation of step 2 per entry; the others\n"
           "// (partials) through each workgroup's slice of partial sums, added up by the last entry point.\n"]
    if part:
        out.append("// The pairs' d loss / d score (0: hidden, or nothing to add) and scaled score of the block pair, for\n"
                   "// grad_partials_add.\n"
                   "var<workgroup> sG: array<f32, BQ * BKV>;\n"
                   "var<workgroup> sS: array<f32, BQ * BKV>;\n")
    body = []
    for inp in grad_inputs(spec):
        if any(p.input is inp for p in part):
            body.append(f"    at += {numel(inp)};  // {inp.name}'s elements (partials: grad_partials_add)\n")
            continue
        for _, m, ld, d in (r for r in found if r[0] is inp):
            name = f"grad_{inp.name}_{m}"
            out.append(wgsl_expr.function(name, d, f"d score / d {format_expr(ld)} =", site_of))
            idx = [wgsl_expr.render(i) for i in ld.indices]
            ext = [_full(a) for a in inp.axes]
            bounds = _bounds(idx, ext)
            body.append(f"    if ({bounds}) {{  // {format_expr(ld)}\n"
                        f"        rows[at + {_flat([f'u32({x})' for x in idx], ext)}] += ds * {name}({ARGS});\n"
                        "    }\n")
        body.append(f"    at += {numel(inp)};  // {inp.name}'s elements\n")
    if part:
        body.append("    // the partials' inputs: kept for grad_partials_add (q and k lie in the block pair, whose\n"
                    "    // first row and key are multiples of BQ and BKV)\n"
                    "    let e = (u32(q) % BQ) * BKV + u32(k) % BKV;\n"
                    "    sG[e] = ds;\n"
                    "    sS[e] = s;\n")
    out.append("// ds = d loss / d score at a visible pair (q, k), s its scaled score: each grad input's entry that\n"
               "// the pair reads gets ds times the score's derivative with respect to that read.\n"
               "fn grad_inputs_add(ds: f32, s: f32, b: i32, h: i32, hkv: i32, q: i32, k: i32, Lq: i32, Lk: i32) {\n"
               "    var at = 2u * params.heads_q * params.total_q + 1u;  // the first gradient's word of rows\n"
               + "".join(body) + "}\n")
    if part:
        out.append(_partials_source(spec, part, found, site_of))
    return "\n".join(out)


def _first_partial(spec) -> str:
    """The WGSL u32 expression of the first partial word of rows (after every gradient area)."""
    return "2u * params.heads_q * params.total_q + 1u + " + " + ".join(f"{numel(i)}" for i in grad_inputs(spec))


def _partials_source(spec, part, found, site_of) -> str:
    fns, blocks = [], []
    for p in part:
        inp, own, ext = p.input, p.owned, slice_extents(p)
        size = " * ".join(ext)
        for _, m, ld, d in (r for r in found if r[0] is inp):
            name = f"grad_{inp.name}_{m}"
            fns.append(wgsl_expr.function(name, d, f"d score / d {format_expr(ld)} =", site_of))
        lines = [f"            {{  // {inp.name}: slices of {size} words\n"]
        for _, m, ld, d in (r for r in found if r[0] is inp):
            idx = [wgsl_expr.render(i) for i in ld.indices]
            full = [_full(a) for a in inp.axes]
            bounds = _bounds(idx, full)
            slot = {"k": "u32(k) - j0", "b": "0u", "hkv": "0u", "h": "u32(h) - u32(hkv) * params.group"}
            parts = [slot[o] if o is not None else f"u32({x})" for x, o in zip(idx, own)]
            lines.append(f"                if ({bounds}) {{  // {format_expr(ld)}\n"
                         f"                    let o = {_flat(parts, ext)};\n"
                         "                    if (o % WORKGROUP_SIZE == lid) {\n"
                         f"                        rows[at + slice * ({size}) + o] += ds * grad_{inp.name}_{m}({ARGS});\n"
                         "                    }\n                }\n")
        lines.append(f"                at += n_slices * ({size});\n            }}\n")
        blocks.append("".join(lines))
    return "\n".join(fns) + (
        "\n// After step 2's block pair (rows [r0, r0 + BQ) of `head`, keys [j0, j0 + BKV)): every pair of the block, in\n"
        "// order, adds ds times d score / d entry into this workgroup's slice (`slice` of n_slices, the dkdv grid\n"
        "// in order) of each partials input, each slice word by the invocation whose index is its offset modulo\n"
        "// WORKGROUP_SIZE; then each invocation clears its own pairs of sG (those it writes in recompute).\n"
        "fn grad_partials_add(lid: u32, seq: Seq, r0: u32, j0: u32, head: u32, wg: vec3<u32>, n_wg: vec3<u32>) {\n"
        "    let slice = (wg.z * n_wg.y + wg.y) * n_wg.x + wg.x;\n"
        "    let n_slices = n_wg.x * n_wg.y * n_wg.z;\n"
        "    let b = i32(seq.batch);\n    let h = i32(head);\n    let hkv = i32(head / params.group);\n"
        "    let Lq = i32(seq.len_q);\n    let Lk = i32(seq.len_k);\n"
        "    for (var e = 0u; e < BQ * BKV; e++) {\n"
        "        let ds = sG[e];\n"
        "        if (ds != 0.0) {  // else hidden, or nothing to add\n"
        "            let s = sS[e];\n            let q = i32(r0 + e / BKV);\n            let k = i32(j0 + e % BKV);\n"
        f"            var at = {_first_partial(spec)};\n"
        + "".join(blocks) + "        }\n    }\n"
        "    workgroupBarrier();  // every invocation is done reading sG\n"
        "    for (var e = lid; e < BQ * BKV; e += WORKGROUP_SIZE) {\n        sG[e] = 0.0;\n    }\n}\n"
        + _sum_source(spec, part))


def _sum_source(spec, part) -> str:
    """The body of <entry>_bw_grads: each gradient entry of a partials input is the sum, in grid
    order, of the slices of the dkdv workgroups that can name it."""
    out = []
    for p in part:
        inp, own, ext = p.input, p.owned, slice_extents(p)
        full = [_full(a) for a in inp.axes]
        decomp = "".join(f"        let a{n} = rest % {full[n]};\n        rest = rest / {full[n]};\n"
                         for n in reversed(range(1, len(full)))) + "        let a0 = rest;\n"
        rng = {"z": ("0u", "params.batch"), "y": ("0u", "params.heads_kv"), "x": ("0u", "n_x")}
        slot = []
        for n, o in enumerate(own):
            if o:  # the one workgroup of the grid's dimension that names the entry (keys past Lk: none)
                at = {"k": f"a{n} / BKV", "h": f"a{n} / params.group"}.get(o, f"a{n}")
                rng[grad_partials.GRID[o]] = (at, f"min({at} + 1u, n_x)" if o == "k" else f"{at} + 1u")
            slot.append({"k": f"a{n} % BKV", "b": "0u", "hkv": "0u", "h": f"a{n} % params.group"}.get(o, f"a{n}"))
        size = " * ".join(ext)
        out.append(
            f"    for (var n = first; n < {numel(inp)}; n += stride) {{\n"
            "        var rest = n;\n" + decomp
            + f"        let o = {_flat(slot, ext)};\n"
            "        var sum = 0.0;\n"
            f"        for (var z = {rng['z'][0]}; z < {rng['z'][1]}; z++) {{\n"
            f"            for (var y = {rng['y'][0]}; y < {rng['y'][1]}; y++) {{\n"
            f"                for (var x = {rng['x'][0]}; x < {rng['x'][1]}; x++) {{\n"
            f"                    sum += rows[part + ((z * params.heads_kv + y) * n_x + x) * ({size}) + o];\n"
            "                }\n            }\n        }\n"
            "        rows[grad + n] = sum;\n    }\n")
    body, at = [], "2u * params.heads_q * params.total_q + 1u"
    inputs = [p.input for p in part]
    for inp in grad_inputs(spec):
        if inp in inputs:
            n = inputs.index(inp)
            step = (f"    part += n_x * params.heads_kv * params.batch * ({' * '.join(slice_extents(part[n]))});\n"
                    if n + 1 < len(part) else "")
            body.append(f"    {{  // {inp.name}\n        let grad = {at};  // its gradient's first word\n"
                        + "".join("    " + ln + "\n" for ln in out[n].splitlines()) + "    }\n" + step)
        at += f" + {numel(inp)}"
    return ("\n// <entry>_bw_grads: invocation `first` of `stride` sums the partials of every `stride`-th entry (the\n"
            "// slices of the dkdv workgroups that can name it: z, y, x in grid order) into the gradient.\n"
            "fn grad_partials_sum(first: u32, stride: u32) {\n"
            "    let n_x = (params.len_k + BKV - 1u) / BKV;  // the dkdv grid's x (ceil(Lk / BKV))\n"
            f"    {'var' if len(part) > 1 else 'let'} part = {_first_partial(spec)};  // the first input's partial sums\n"
            + "".join(body) + "}\n")


def partial_words(spec, arrays: dict, n_slices: int, block_kv: int, group: int) -> int:
    """Words of rows' partial sums for a call: `n_slices` dkdv workgroups (its grid), each with a
    slice of every partials input (`arrays`: the call's inputs, checked as declared)."""
    return sum(n_slices * p.words(arrays[p.input.name].shape, block_kv, group) for p in partials(spec))


def layout(spec, arrays: dict, rows_words: int) -> dict:
    """{name: (first word in rows, shape)} of the gradients, the first at `rows_words` (the word
    after the flag), with the shapes of the call's `arrays` (the inputs, checked as declared)."""
    out, at = {}, rows_words
    for inp in grad_inputs(spec):
        shape = tuple(arrays[inp.name].shape)
        out[inp.name] = (at, shape)
        n = 1
        for x in shape:
            n *= int(x)
        at += n
    return out


def backward_problems(spec) -> list:
    """Why `spec` has no backward on target wgsl: attngen.plan.backward.problems at level "grads"
    (WgslBackend.backward_expressions: every `grad` input, direct or through partials), the
    messages naming wgsl."""
    from ...plan.backward import problems
    return problems(spec, expressions="grads", target="wgsl")
