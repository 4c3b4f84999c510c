"""The gradients of `grad` inputs in the CUDA backward (issue 42; docs/backward.md): what the fast
(wgmma) family adds to its recompute step for a score that reads a `grad` input, and what the
deterministic (fma) family adds to its dK/dV step, without atomics (`source`'s `atomic`; below).

    struct ExprGrads { float* bias; ... };        // one f32 buffer per grad input, its shape, zeroed
    void grad_inputs_add(in, g, ds, s, b, h, hkv, q, k, Lq, Lk)

For each visible pair the kernel calls grad_inputs_add with ds = d loss / d score (P (dP - D),
before the factor d score / d s) and s, the scaled score: for every distinct read of every grad
input (attngen.plan.expr_grad.input_derivatives) it adds ds * d score / d that read into the
read's entry, with atomicAdd (f32, in no fixed order: the entries' last bits may differ between
runs). The read's indices are the score's (a read out of its bounds adds nothing: the score's
loader has reported it). Each derivative is a function of its own, `grad_NAME_M` (read M of
input NAME, from 1), under a comment quoting it.

The deterministic family (atomic=False) adds a read that names one entry per pair
(attngen.plan.backward.injective) with a plain `+=`: one thread per entry. Every other input
(*partials*: a table read at k - q, slopes[h], a bias without b) goes through partial sums, as
the WGSL backward does: the recompute keeps each pair's ds and s in shared memory (Tiles' gds and
gs); after the tile pair, grad_partials_add walks the tile's pairs in order and adds ds * d score
/ d entry into the block's own slice of the input's partials (`ExprGrads::NAME_partials`), each
slice word by the thread whose index is its offset modulo kThreads; the entry point
<entry>_bwd_grads (grad_partials_sum) then sums, per entry, the slices of the blocks that can
name it in grid order. A slice spans the input's axes, except an axis indexed by its own name in
every read, k (the block's kTile keys), b, hkv (one) or h (without hkv: the group's heads). No
atomics: the same bits on every run. A pair whose ds is exactly 0 adds nothing.
"""

from __future__ import annotations

from ...lang.expr import Load, Var, format_expr, inputs_read, walk
from . import expr as cuda_expr


def grad_inputs(spec) -> list:
    """The spec's `grad` inputs (attngen.lang.expr.Input), in declaration order."""
    return [i for i in spec.inputs if i.grad]


def derivatives(spec) -> list:
    """d score / d read of every distinct read of every grad input (their helpers are rendered
    with the score's)."""
    from ...plan.expr_grad import as_real, input_derivatives
    return [as_real(d) for i in grad_inputs(spec) for _, d in input_derivatives(spec.score, i.name)]


def site_of(spec, exprs) -> dict:
    """cuda_expr.site_numbers(spec), with each read of `exprs` (derived expressions: their reads
    may be new objects) given the site of the same read in the score (0 where it is in bounds)."""
    from ...plan.expr_reads import in_bounds
    found = cuda_expr.sites(spec)
    out = cuda_expr.site_numbers(spec)
    for e in exprs:
        for n in walk(e):
            if isinstance(n, Load) and id(n) not in out:
                out[id(n)] = 0 if in_bounds(n, spec.inputs) else next(
                    at + 1 for at, (what, m) in enumerate(found) if what == "score" and m == n)
    return out


def _reads(spec) -> list:
    """(input, M, Load, d score / d Load as a real) of every distinct read of every grad input."""
    from ...plan.expr_grad import as_real, input_derivatives
    return [(inp, m, ld, as_real(d)) for inp in grad_inputs(spec)
            for m, (ld, d) in enumerate(input_derivatives(spec.score, inp.name), 1)]


def partial_inputs(spec) -> list:
    """The grad inputs the deterministic family sums through partials: those with a read that is
    not once per pair (attngen.plan.backward.injective)."""
    from ...plan.backward import injective
    found = _reads(spec)
    return [i for i in grad_inputs(spec) if not all(injective(ld, i) for inp, _, ld, _ in found if inp is i)]


def fields(spec, atomic: bool) -> list:
    """ExprGrads' pointers, in order: each grad input's gradient, then (deterministic family) each
    partials input's partial sums (NAME_partials)."""
    return [i.name for i in grad_inputs(spec)] + ([] if atomic else [f"{i.name}_partials" for i in partial_inputs(spec)])


SUM_BLOCKS = 256  # blocks of <entry>_bwd_grads: their threads stride over the gradients' entries
PARTIALS_LIMIT_BYTES = 1 << 32  # the partial sums a call may allocate (4 GiB)

# An owned axis's extent in a block's slice (C++)
_SLICE = {"k": "kTile", "b": "1", "hkv": "1", "h": "a.group"}


def owned(spec, inp) -> list:
    """Per axis of `inp`: the name a block's slice owns ("k", "b", "hkv", "h") or None (the slice
    spans the axis)."""
    loads = [ld for i, _, ld, _ in _reads(spec) if i is inp]
    out = []
    for n, axis in enumerate(inp.axes):
        own = axis in _SLICE and all(ld.indices[n] == Var(axis, ld.indices[n].type) for ld in loads)
        out.append(axis if own and not (axis == "h" and "hkv" in inp.axes) else None)
    return out


def slice_extents(spec, inp, tile: int | None = None) -> list:
    """The C++ extents of one block's slice of `inp`'s partial sums; with `tile` (the family's)
    the formulas `attngen check` prints (G: the GQA group; B, Hq, Hkv, Lq, Lk: the call's)."""
    if tile is not None:
        names = {"k": str(tile), "b": "1", "hkv": "1", "h": "G"}
        full = {"b": "B", "h": "Hq", "hkv": "Hkv", "q": "Lq", "k": "Lk"}
        return [names[o] if o else full.get(a, str(a)) for a, o in zip(inp.axes, owned(spec, inp))]
    return [_SLICE[o] if o else (f"in.ext_{a}" if isinstance(a, str) else str(a)) for a, o in zip(inp.axes, owned(spec, inp))]


def partial_words(spec, shapes: dict, n_slices: int, tile: int, group: int) -> dict:
    """{NAME_partials: words} of a call: `n_slices` dK/dV blocks (its grid), each with a slice of
    every partials input (`shapes`: the inputs' shapes in the call)."""
    out = {}
    for inp in partial_inputs(spec):
        n = 1
        for extent, own in zip(shapes[inp.name], owned(spec, inp)):
            n *= {"k": tile, "b": 1, "hkv": 1, "h": group}.get(own, int(extent))
        out[f"{inp.name}_partials"] = n_slices * n
    return out


def check_partials(kernel: str, words: dict) -> None:
    """A LaunchError where a call's partial sums (partial_words) exceed PARTIALS_LIMIT_BYTES."""
    from ...errors import LaunchError
    total = 4 * sum(words.values())
    if total > PARTIALS_LIMIT_BYTES:
        raise LaunchError(f"kernel '{kernel}' (cuda, deterministic backward): the partial sums of the `grad` inputs "
                          f"({', '.join(n.removesuffix('_partials') for n in words)}) would take {total} bytes, above "
                          f"the {PARTIALS_LIMIT_BYTES} this target allocates for them (one slice per dK/dV block); "
                          "a smaller batch or sequence, or the fast family (backward=auto on cuda-sm90, f16 / bf16), "
                          "computes it")


def source(spec, atomic: bool = True) -> str:
    """ExprGrads, the derivative functions and grad_inputs_add ("" without grad inputs). `atomic`:
    atomicAdd (the fast family); False: a plain `+=` (the deterministic family, for reads that
    name one entry per pair, attngen.plan.backward.injective: one thread adds into each entry, a
    GQA group's heads in the loop's order), and for the others grad_partials_add and
    grad_partials_sum (module docstring)."""
    grads = grad_inputs(spec)
    if not grads:
        return ""
    reads = _reads(spec)
    part = [] if atomic else partial_inputs(spec)
    sites = site_of(spec, [d for *_, d in reads])
    fields = "\n".join(f"    float* {i.name};  // d loss / d {i.name}: f32, {i.name}'s shape, zeroed before the launch"
                        for i in grads) + "".join(
        f"\n    float* {i.name}_partials;  // {i.name}'s partial sums: one slice per dK/dV block, zeroed" for i in part)
    how = "added into with atomicAdd" if atomic else "each entry added into by one thread (no atomics)"
    out = [f"// The gradients of the `grad` inputs (issue 42): one f32 buffer each, {how}.\n"
           f"struct ExprGrads {{\n{fields}\n}};\n"]
    body = []
    args = "s, b, h, hkv, q, k, Lq, Lk"
    for inp, m, ld, d in reads:
        name = f"grad_{inp.name}_{m}"
        out.append(cuda_expr.function(name, d, f"d score / d {format_expr(ld)} =", sites))
        if inp in part:
            continue
        ext = [f"in.ext_{a}" if isinstance(a, str) else str(a) for a in inp.axes]
        idx = [cuda_expr.render(i, sites) for i in ld.indices]
        body.append(f"    {{  // {format_expr(ld)}\n"
                    + "".join(f"        const int i{n} = {x};\n" for n, x in enumerate(idx))
                    + f"        if ({' && '.join(f'i{n} >= 0 && i{n} < {x}' for n, x in enumerate(ext))}) {{\n"
                    + (f"            atomicAdd(g.{inp.name} + {_flat(ext)}, " if atomic
                       else f"            g.{inp.name}[{_flat(ext)}] += (")
                    + f"ds * {name}({'in, ' if inputs_read(d) else ''}{args}));\n"
                    + "        }\n    }\n")
    out.append("// ds = d loss / d score at a visible pair (q, k), s its scaled score: each grad input's entry that\n"
               "// the pair reads gets ds times the score's derivative with respect to that read.\n"
               f"__device__ __forceinline__ void grad_inputs_add(const ExprInputs& in, const ExprGrads& g, float ds, "
               f"float s, int b, int h, int hkv, int q, int k, int Lq, int Lk) {{\n" + "".join(body) + "}\n")
    if part:
        out.append(_partials_source(spec, part, reads, sites))
    return "\n".join(out)


def _index_flat(parts: list, ext: list) -> str:
    flat = f"(long long)({parts[0]})"
    for x, e in zip(parts[1:], ext[1:]):
        flat = f"({flat}) * {e} + ({x})"
    return flat


def _partials_source(spec, part, reads, sites) -> str:
    adds, sums = [], []
    for inp in part:
        ext, own = slice_extents(spec, inp), owned(spec, inp)
        full = [f"in.ext_{a}" if isinstance(a, str) else str(a) for a in inp.axes]
        size = " * ".join(f"(long long){e}" if n == 0 else e for n, e in enumerate(ext))
        for _, m, ld, d in (r for r in reads if r[0] is inp):
            idx = [cuda_expr.render(i, sites) for i in ld.indices]
            slot = {"k": f"i{{n}} - key0", "b": "0", "hkv": "0", "h": "i{n} - hkv * a.group"}
            parts = [slot[o].format(n=n) if o else f"i{n}" for n, o in enumerate(own)]
            adds.append(
                f"        {{  // {format_expr(ld)}: slices of {' * '.join(ext)} words\n"
                + "".join(f"            const int i{n} = {x};\n" for n, x in enumerate(idx))
                + f"            if ({' && '.join(f'i{n} >= 0 && i{n} < {x}' for n, x in enumerate(full))}) {{\n"
                f"                const long long o = {_index_flat(parts, ext)};\n"
                "                if (o % kThreads == threadIdx.x) {\n"
                f"                    g.{inp.name}_partials[slice * {size} + o] += "
                f"ds * grad_{inp.name}_{m}({'in, ' if inputs_read(d) else ''}s, b, h, hkv, q, k, Lq, Lk);\n"
                "                }\n            }\n        }\n")
        rng = {"z": ("0", "in.ext_b"), "y": ("0", "in.ext_hkv"), "x": ("0", "n_x")}
        slot = []
        for n, o in enumerate(own):
            if o == "b":
                rng["z"] = (f"ax{n}", f"ax{n} + 1")
            elif o == "hkv":
                rng["y"] = (f"ax{n}", f"ax{n} + 1")
            elif o == "h":
                rng["y"] = (f"ax{n} / a.group", f"ax{n} / a.group + 1")
            elif o == "k":
                rng["x"] = (f"ax{n} / kTile", f"min(ax{n} / kTile + 1, n_x)")  # keys past the grid: none
            slot.append({"k": f"ax{n} % kTile", "b": "0", "hkv": "0", "h": f"ax{n} % a.group"}.get(o, f"ax{n}"))
        decomp = "".join(f"            const int ax{n} = (int)(rest % {full[n]});\n            rest /= {full[n]};\n"
                         for n in reversed(range(1, len(full)))) + "            const int ax0 = (int)rest;\n"
        entries = " * ".join(f"(long long){e}" if n == 0 else e for n, e in enumerate(full))
        sums.append(
            f"    {{  // {inp.name}\n"
            f"        for (long long n = first; n < {entries}; n += stride) {{\n"
            "            long long rest = n;\n" + decomp
            + f"            const long long o = {_index_flat(slot, ext)};\n"
            "            float sum = 0.0f;\n"
            f"            for (int z = {rng['z'][0]}; z < {rng['z'][1]}; ++z)\n"
            f"                for (int y = {rng['y'][0]}; y < {rng['y'][1]}; ++y)\n"
            f"                    for (int x = {rng['x'][0]}; x < {rng['x'][1]}; ++x)\n"
            f"                        sum += g.{inp.name}_partials[(((long long)z * in.ext_hkv + y) * n_x + x) * "
            f"{size} + o];\n"
            f"            g.{inp.name}[n] = sum;\n        }}\n    }}\n")
    return (
        "// After the dK/dV step's tile pair (rows [row0, row0 + kTile) of head h, keys [key0, key0 + kTile)): every\n"
        "// pair of the tile, in order, adds ds times d score / d entry into this block's slice (`slice`, the grid in\n"
        "// order) of each partials input, each slice word by the thread whose index is its offset modulo kThreads.\n"
        "__device__ __forceinline__ void grad_partials_add(const Args& a, const ExprInputs& in, const ExprGrads& g, "
        "const Tiles& t, int row0, int key0, int b, int h, int hkv, int Lq, int Lk) {\n"
        "    const long long slice = ((long long)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;\n"
        "    for (int e = 0; e < kTile * kTile; ++e) {\n"
        "        const int r = e / kTile, c = e % kTile;\n"
        "        const float ds = t.gds[r * kStrideT + c];\n"
        "        if (ds == 0.0f) continue;  // hidden, or nothing to add\n"
        "        const float s = t.gs[r * kStrideT + c];\n"
        "        const int q = row0 + r, k = key0 + c;\n"
        + "".join(adds) + "    }\n}\n\n"
        "// <entry>_bwd_grads: each entry of a partials input's gradient, written once, is the sum of the slices of the\n"
        "// dK/dV blocks that can name it (z, y, x in grid order); the threads of the grid stride over the entries.\n"
        "__device__ __forceinline__ void grad_partials_sum(const Args& a, const ExprInputs& in, const ExprGrads& g) {\n"
        "    const int n_x = (a.rows_k + kTile - 1) / kTile;  // the dK/dV grid's x\n"
        "    const long long first = (long long)blockIdx.x * kThreads + threadIdx.x;\n"
        "    const long long stride = (long long)gridDim.x * kThreads;\n"
        + "".join(sums) + "}\n")


def _flat(ext: list) -> str:
    flat = "(long long)i0"
    for d in range(1, len(ext)):
        flat = f"({flat}) * {ext[d]} + i{d}" if d > 1 else f"{flat} * {ext[d]} + i{d}"
    return flat
