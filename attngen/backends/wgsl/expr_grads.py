"""The gradients of `grad` inputs in the WGSL backward (issue 42; docs/backward.md), without
atomics: only reads that name one entry per (batch, query head, row, key) pair
(attngen.plan.backward.injective: bias[b, h, q, k], or hkv for h) are compiled; every other read
is refused by plan.backward.problems (level "injective").

    fn grad_NAME_M(s, b, h, hkv, q, k, Lq, Lk) -> f32     d score / d read M of input NAME
    fn grad_inputs_add(ds, s, b, h, hkv, q, k, Lq, Lk)    rows[entry] += ds * grad_NAME_M(...)

Step 2 (dK and dV) calls grad_inputs_add at each visible pair it recomputes, with ds = d loss /
d score = P (dP - D) (before the factor d score / d s). The gradients live in the workspace
`rows`, after its flag word (word 2 * Hq * Tq), one f32 area per `grad` input in declaration
order, row-major in the input's declared shape (a padded batch: the input's extents are params'
batch, heads_q, heads_kv, len_q and cap, as the loaders read them). The runtime creates `rows`
zeroed, so entries of hidden pairs, rows that see no key and keys past kv_lens stay 0. An
entry is added to by one invocation only: the pair's (key block, KV head, batch) names the
workgroup and the pair's place in its block the invocation; with an hkv axis that invocation
adds the group's query heads in turn (the loop's order), so the sums are the same bits on every
run. A read out of its bounds adds nothing (the score's loader has flagged the launch).
"""

from __future__ import annotations

from ...lang.expr import format_expr
from . import expr as wgsl_expr

_EXTENT = {"b": "params.batch", "h": "params.heads_q", "hkv": "params.heads_kv", "q": "params.len_q",
           "k": "params.cap"}  # (expr._EXTENT: the loaders' extents)


def grad_inputs(spec) -> list:
    """The spec's `grad` inputs (attngen.lang.expr.Input), in declaration order."""
    return [i for i in spec.inputs if i.grad]


def reads(spec) -> list:
    """(input, M, Load, d score / d Load as a real) of every distinct read of every grad input."""
    from ...plan.expr_grad import as_real, input_derivatives
    return [(inp, m, ld, as_real(d)) for inp in grad_inputs(spec)
            for m, (ld, d) in enumerate(input_derivatives(spec.score, inp.name), 1)]


def numel(inp) -> str:
    """The WGSL u32 expression of input `inp`'s element count."""
    return " * ".join(_EXTENT[a] if isinstance(a, str) else f"{a}u" for a in inp.axes)


def source(spec, site_of: dict) -> str:
    """The derivative functions and grad_inputs_add ("" without grad inputs). `site_of`: the site
    number of each Load by id, the derivatives' reads included (emit.backward_expression_sources)."""
    found = reads(spec)
    if not found:
        return ""
    out = ["// The gradients of the `grad` inputs (issue 42): d loss / d entry, f32, in the workspace rows after\n"
           "// its flag word, one area per input in declaration order, row-major in the input's shape; each entry\n"
           "// is written by one invocation of step 2 (no atomics; a GQA group's heads in turn for hkv).\n"]
    body = []
    args = "s, b, h, hkv, q, k, Lq, Lk"
    for inp in grad_inputs(spec):
        for _, m, ld, d in (r for r in found if r[0] is inp):
            name = f"grad_{inp.name}_{m}"
            out.append(wgsl_expr.function(name, d, f"d score / d {format_expr(ld)} =", site_of))
            idx = [wgsl_expr.render(i) for i in ld.indices]
            ext = [_EXTENT[a] if isinstance(a, str) else f"{a}u" for a in inp.axes]
            # `&`, not `&&`: no branch per comparison (the loaders' `|`, wgsl/expr.py, says why)
            bounds = " & ".join(f"({x} >= 0i) & (u32({x}) < {e})" for x, e in zip(idx, ext))
            flat = f"u32({idx[0]})"
            for x, e in zip(idx[1:], ext[1:]):
                flat = f"({flat}) * {e} + u32({x})"
            body.append(f"    if ({bounds}) {{  // {format_expr(ld)}\n"
                        f"        rows[at + {flat}] += ds * {name}({args});\n"
                        "    }\n")
        body.append(f"    at += {numel(inp)};  // {inp.name}'s elements\n")
    out.append("// ds = d loss / d score at a visible pair (q, k), s its scaled score: each grad input's entry that\n"
               "// the pair reads gets ds times the score's derivative with respect to that read.\n"
               "fn grad_inputs_add(ds: f32, s: f32, b: i32, h: i32, hkv: i32, q: i32, k: i32, Lq: i32, Lk: i32) {\n"
               "    var at = 2u * params.heads_q * params.total_q + 1u;  // the first gradient's word of rows\n"
               + "".join(body) + "}\n")
    return "\n".join(out)


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
    """Why `spec` has no backward on target wgsl: attngen.plan.backward.problems at level
    "injective" (WgslBackend.backward_expressions), the messages naming wgsl; and a `grad` input read
    at `hkv` (one entry summed over the GQA group's query heads): the dK/dV step's rows may pack
    several heads of the group, whose pairs run in parallel and would add into the same entry (wrong
    sums on NVIDIA's Vulkan in testing), so it is refused."""
    from ...lang.expr import Load, walk
    from ...plan.backward import problems
    from ...plan.kernel_plan import Problem
    out = problems(spec, expressions="injective", target="wgsl")
    read = {n.input for n in walk(spec.score) if isinstance(n, Load)} if spec.score is not None else set()
    for i in spec.inputs:
        if i.grad and "hkv" in i.axes and i.name in read:
            out.append(Problem(f"the gradient of `grad` input '{i.name}' read at hkv sums the GQA group's query "
                               "heads, which wgsl's backward kernels may run in parallel into one entry: not "
                               "computed by this target (issue 42)", key=f"input.{i.name}",
                               hint="declare it per query head (axis h), or use target cuda"))
    return out
