"""The gradients of `grad` inputs in the CUDA backward (issue 42; docs/backward.md): what the fast
(wgmma) family adds to its recompute step for a score that reads a `grad` input (and the
deterministic (fma) family's dK/dV step, for reads once per pair, without atomics: `source`'s
`atomic`).

    struct ExprGrads { float* bias; ... };        // one f32 buffer per grad input, its shape, zeroed
    void grad_inputs_add(in, g, ds, s, b, h, hkv, q, k, Lq, Lk)

For each visible pair the kernel calls grad_inputs_add with ds = d loss / d score (P (dP - D),
before the factor d score / d s) and s, the scaled score: for every distinct read of every grad
input (attngen.plan.expr_grad.input_derivatives) it adds ds * d score / d that read into the
read's entry, with atomicAdd (f32, in no fixed order: the entries' last bits may differ between
runs). The read's indices are the score's (a read out of its bounds adds nothing: the score's
loader has reported it). Each derivative is a function of its own, `grad_NAME_M` (read M of
input NAME, from 1), under a comment quoting it.
"""

from __future__ import annotations

from ...lang.expr import Load, format_expr, inputs_read, walk
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


def source(spec, atomic: bool = True) -> str:
    """ExprGrads, the derivative functions and grad_inputs_add ("" without grad inputs). `atomic`:
    atomicAdd (the fast family); False: a plain `+=` (the deterministic family, for reads that
    name one entry per pair, attngen.plan.backward.injective: one thread adds into each entry, a
    GQA group's heads in the loop's order)."""
    from ...plan.expr_grad import as_real, input_derivatives
    grads = grad_inputs(spec)
    if not grads:
        return ""
    reads = [(inp, m, ld, as_real(d)) for inp in grads
             for m, (ld, d) in enumerate(input_derivatives(spec.score, inp.name), 1)]
    sites = site_of(spec, [d for *_, d in reads])
    fields = "\n".join(f"    float* {i.name};  // d loss / d {i.name}: f32, {i.name}'s shape, zeroed before the launch"
                       for i in grads)
    how = "added into with atomicAdd" if atomic else "each entry added into by one thread (no atomics)"
    out = [f"// The gradients of the `grad` inputs (issue 42): one f32 buffer each, {how}.\n"
           f"struct ExprGrads {{\n{fields}\n}};\n"]
    body = []
    args = "s, b, h, hkv, q, k, Lq, Lk"
    for inp, m, ld, d in reads:
        name = f"grad_{inp.name}_{m}"
        out.append(cuda_expr.function(name, d, f"d score / d {format_expr(ld)} =", sites))
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
    return "\n".join(out)


def _flat(ext: list) -> str:
    flat = "(long long)i0"
    for d in range(1, len(ext)):
        flat = f"({flat}) * {ext[d]} + i{d}" if d > 1 else f"{flat} * {ext[d]} + i{d}"
    return flat
