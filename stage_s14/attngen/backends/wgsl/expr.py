"""Score and mask expressions (issue 42) as WGSL: one inline function per expression.

    fn mask_expr(b: i32, h: i32, hkv: i32, q: i32, k: i32, Lq: i32, Lk: i32) -> bool
    fn score_expr(s: f32, b: i32, h: i32, hkv: i32, q: i32, k: i32, Lq: i32, Lk: i32) -> f32
    fn mask_expr_tile(b: i32, h0: i32, h1: i32, hkv: i32, q0: i32, q1: i32, k0: i32, k1: i32,
                      Lq: i32, Lk: i32) -> i32      (the block classification: the end of this file)

The IR of attngen.lang.expr, typed: integers are i32, reals f32, booleans bool; an integer
operand of a real operation is converted with f32(). `//` and `%` floor, as in the language
(WGSL's / and % truncate toward zero; expr_floor_div / expr_floor_mod correct them for operands
of opposite signs); `where` is select where neither branch reads an input (both are evaluated),
else a function of its own that evaluates only the branch that is the result (`if (c) { return
a; } return b;`); `&&` and `||` are WGSL's, which evaluate their right side only where it
decides the result, so no input is read on a side that does not (as in the language);
sigmoid is 1 / (1 + exp(-x)); tanh is computed accurately for small arguments and clamped for
large ones (exp overflow in some implementations' tanh), as the softcap's; clamp(x, lo, hi) is
min(max(x, lo), hi) (WGSL's clamp differs where lo > hi). Every binary operand
that is itself an operation is parenthesised, so WGSL's precedence rules (which refuse mixing
&& and || without parentheses) never matter.

Differences from the float64 reference (attngen.reference_expr): integers are 32-bit and wrap
on overflow (the reference's are 64-bit), reals are f32, and an integer division by zero gives
a value (WGSL: a / 0 = a, a % 0 = 0) where the reference raises.

Inputs (`input NAME[AXES] DTYPE`) live in one storage binding of u32 words, `inputs` (lower.py):
each from the word offset in Params' input_NAME, row-major over its axes; f32 as its bits, f16
widened to f32 bits on upload (exact), i32 as its bits, u8 and bool as bytes, 4 per word,
little-endian (WGSL has no 8-bit type). A read `NAME[i, j]` is a call of the input's loader,
`in_NAME(site, i, j)`, which tests every index against its axis' extent (b: params.batch, h:
params.heads_q, hkv: params.heads_kv, q: params.len_q, k: params.cap, or the literal); a read
out of bounds returns 0 and writes its site (the read's number, 1.. in the order of `sites`)
into word 0 of inputs, which the launcher reads and raises on (attngen/backends/wgsl/launch.py).
The kernel evaluates the expressions only where the reference uses them (mask: rows and keys of
the sequence; score: visible pairs), so a flag means the reference raises too.
"""

from __future__ import annotations

from ...lang.expr import (BOOL, INT, REAL, Binary, Const, Fn, Load, Unary, Var,
                         f32_text, format_expr, helpers_used, inputs_read, walk)
from ...limits import MAX_SEQ_LEN

INDEX_PARAMS = ("b", "h", "hkv", "q", "k", "Lq", "Lk")  # every expression function's i32 parameters

_HELPERS = {
    "floor_div": """\
// Integer division rounded toward -inf, as the language's `//` (and Python's): WGSL's / truncates.
// (No WGSL % here or below: NVIDIA's Vulkan driver gives a % b = a for a divisor b < 0.)
fn expr_floor_div(a: i32, b: i32) -> i32 {
    let t = a / b;
    return select(t, t - 1i, (b != 0i) && (t * b != a) && ((a < 0i) != (b < 0i)));
}
""",
    "floor_mod": """\
// The remainder of expr_floor_div, with the sign of the divisor, as the language's `%` (and Python's).
fn expr_floor_mod(a: i32, b: i32) -> i32 {
    let r = select(a - (a / b) * b, 0i, b == 0i);  // truncated, as WGSL's % (a % 0 = 0), wrapping
    return select(r, r + b, (r != 0i) && ((r < 0i) != (b < 0i)));
}
""",
    "sigmoid": """\
fn expr_sigmoid(x: f32) -> f32 {
    return 1.0f / (1.0f + exp(-x));
}
""",
    "tanh": """\
// tanh accurate for small arguments (the odd series below 0.0625) and clamped for large ones
// (where an implementation's tanh through exp overflows); NaN stays NaN.
fn expr_tanh(x: f32) -> f32 {
    if (is_nan(x)) {  // the kernel's (section config): on the bits
        return x;
    }
    if (abs(x) < 0.0625f) {
        let x2 = x * x;
        return x * (1.0f - x2 * (1.0f / 3.0f - x2 * (2.0f / 15.0f)));
    }
    return tanh(clamp(x, -15.0f, 15.0f));
}
""",
}


class ExprError(ValueError):
    """An expression the WGSL emitter does not render: a real constant not finite in f32, or an
    input read outside function()."""


def sites(spec) -> list:
    """(expression, Load) of every input read of the spec, mask expression first then score, each
    in walk order: site n (from 1) is the n-th, the number an out-of-bounds read writes."""
    out = []
    for what, e in (("mask", spec.mask.expr if spec.mask.kind == "expr" else None), ("score", spec.score)):
        if e is not None:
            out += [(what, n) for n in walk(e) if isinstance(n, Load)]
    return out


class _Context:
    """What rendering one expression function with input reads needs: each Load's site number,
    the function's name and parameters (a `where` that reads an input becomes a function of the
    same parameters), and those functions (each before the functions its branches add: WGSL allows calls before a
    declaration)."""

    def __init__(self, name: str, params: list, site_of: dict):
        self.name, self.params, self.site_of = name, params, site_of
        self.functions = []


def _int_literal(v: int) -> str:
    if v == -2**31:
        return "(-2147483647i - 1i)"
    return f"{v}i" if v >= 0 else f"(-{-v}i)"


def _real_literal(v: float) -> str:
    """v rounded to f32, as the shortest decimal text that reads back to that f32, with suffix f."""
    try:
        text = f32_text(v)
    except ValueError as err:
        raise ExprError(str(err)) from None
    return f"{text}f" if not text.startswith("-") else f"({text}f)"


def helpers_of(*exprs) -> list[str]:
    """The helper functions the expressions use (in a fixed order)."""
    used = helpers_used(exprs, ("sigmoid", "tanh"))
    return [_HELPERS[k] for k in _HELPERS if k in used]


def _as(e, t: str, ctx=None) -> str:
    """e rendered as type t (REAL: an integer is converted; else as it is)."""
    if t == REAL and e.type == INT:
        if isinstance(e, Const):
            return _real_literal(e.value)
        return f"f32({render(e, ctx)})"
    return render(e, ctx)


def _infix(e) -> bool:
    """Whether e renders as an operator expression (not a call, a name or a literal)."""
    return isinstance(e, Unary) or (isinstance(e, Binary) and e.op not in ("//", "%"))


def _operand(e, t: str, ctx=None) -> str:
    """e as an operand of a binary operator: parenthesised when it is an operation itself."""
    text = _as(e, t, ctx)
    return f"({text})" if _infix(e) and not (t == REAL and e.type == INT) else text


def render(e, ctx: _Context | None = None) -> str:
    """The WGSL text of IR expression `e` (its type: e.type); `ctx`: where it reads inputs."""
    if isinstance(e, Const):
        if e.type == BOOL:
            return "true" if e.value else "false"
        return _int_literal(int(e.value)) if e.type == INT else _real_literal(e.value)
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Load):
        if ctx is None:
            raise ExprError(f"input '{e.input}' is read: render it within function() (its site numbers)")
        return f"in_{e.input}({ctx.site_of[id(e)]}u, {', '.join(render(i, ctx) for i in e.indices)})"
    if isinstance(e, Unary):
        return f"{e.op}{_operand(e.x, e.x.type, ctx)}"
    if isinstance(e, Binary):
        if e.op in ("&&", "||"):
            return f"{_operand(e.a, BOOL, ctx)} {e.op} {_operand(e.b, BOOL, ctx)}"
        if e.op in ("//", "%"):
            fn = "expr_floor_div" if e.op == "//" else "expr_floor_mod"
            return f"{fn}({render(e.a, ctx)}, {render(e.b, ctx)})"
        if e.type == BOOL:  # a comparison: of reals if either side is real
            t = REAL if REAL in (e.a.type, e.b.type) else e.a.type
        else:
            t = e.type  # + - * / : the result's type (`/` is always real)
        return f"{_operand(e.a, t, ctx)} {e.op} {_operand(e.b, t, ctx)}"
    # Fn
    a = e.args
    if e.name == "where" and (inputs_read(a[1]) or inputs_read(a[2])):
        return _where_function(e, ctx)
    if e.name == "where":
        return f"select({_as(a[2], e.type, ctx)}, {_as(a[1], e.type, ctx)}, {render(a[0], ctx)})"
    if e.name == "floor":
        # floor of an integer is the integer, parenthesised where it is an operation (-floor(-q)
        # must not render as --q)
        return _operand(a[0], INT, ctx) if a[0].type == INT else f"i32(floor({render(a[0], ctx)}))"
    if e.name == "clamp":
        # the language's clamp is min(max(x, lo), hi), also where lo > hi (as the reference's);
        # WGSL's clamp is not: its float clamp may take the median, and constant operands with
        # lo > hi are a shader-creation error
        x, lo, hi = (_as(v, e.type, ctx) for v in a)
        return f"min(max({x}, {lo}), {hi})"
    if e.name in ("abs", "min", "max"):
        return f"{e.name}({', '.join(_as(x, e.type, ctx) for x in a)})"
    if e.name in ("sigmoid", "tanh"):
        return f"expr_{e.name}({_as(a[0], REAL, ctx)})"
    return f"{e.name}({_as(a[0], REAL, ctx)})"  # exp, log, sqrt


def _where_function(e, ctx: _Context) -> str:
    """A call of a new function of ctx's parameters that evaluates only the branch of `where`
    that is its result (a branch reads an input: select would read both)."""
    at = len(ctx.functions)
    name = f"{ctx.name}_where{at + 1}"
    ctx.functions.append(None)  # its place, before the functions its branches add
    c, a, b = (render(e.args[0], ctx), _as(e.args[1], e.type, ctx), _as(e.args[2], e.type, ctx))
    ctx.functions[at] = (f"// {format_expr(e)}: only the branch that is the result is evaluated (one reads an input)\n"
                         f"fn {name}({', '.join(ctx.params)}) -> {_WGSL_TYPE[e.type]} {{\n"
                         f"    if ({c}) {{\n        return {a};\n    }}\n    return {b};\n}}\n")
    return f"{name}({', '.join(p.split(':')[0] for p in ctx.params)})"


_WGSL_TYPE = {INT: "i32", REAL: "f32", BOOL: "bool"}


def function(name: str, e, what: str, site_of: dict | None = None) -> str:
    """`fn name(...)` returning `e`, under a comment quoting the spec's expression (`what`:
    "mask" or "score"); a score function takes s (the scaled score) first. `site_of`: the site
    number of each Load by id (from `sites`), where e reads inputs; a `where` whose branch reads
    one becomes a function of its own, before this one."""
    params = ([] if what == "mask" else ["s: f32"]) + [f"{p}: i32" for p in INDEX_PARAMS]
    ctx = _Context(name, params, site_of or {})
    body = render(e, ctx)
    return ("".join(f + "\n" for f in ctx.functions)
            + f"// {what} {format_expr(e)}\n"
            f"fn {name}({', '.join(params)}) -> {_WGSL_TYPE[e.type]} {{\n"
            f"    return {body};\n"
            "}\n")


# How each input dtype is stored in the inputs words, and read back from word index `w` / element `e`.
STORAGE = {"f32": "f32 bits, one per word", "f16": "widened to f32 bits on upload (exact), one per word",
           "i32": "its bits, one per word", "u8": "bytes, 4 per word, little-endian",
           "bool": "bytes (0 or 1), 4 per word, little-endian"}
_ZERO = {REAL: "0.0f", INT: "0i", BOOL: "false"}
_EXTENT = {"b": "params.batch", "h": "params.heads_q", "hkv": "params.heads_kv", "q": "params.len_q",
           "k": "params.cap"}


def _read(inp, e: str) -> str:
    word = f"inputs[params.input_{inp.name} + {e}]"
    if inp.dtype in ("f32", "f16"):
        return f"bitcast<f32>({word})"
    if inp.dtype == "i32":
        return f"bitcast<i32>({word})"
    byte = f"extractBits(inputs[params.input_{inp.name} + {e} / 4u], 8u * ({e} % 4u), 8u)"
    return f"{byte} != 0u" if inp.dtype == "bool" else f"i32({byte})"


def loader(inp) -> str:
    """`fn in_NAME(site, i0, ...)`: one element of input `inp` (attngen.lang.expr.Input), row-major
    over its axes; an index out of its axis returns 0 (false) and writes `site` into the flag."""
    n = len(inp.axes)
    ext = [_EXTENT[a] if isinstance(a, str) else f"{a}u" for a in inp.axes]
    # `|`, not `||`: every comparison is evaluated, without a branch each. Dawn over SwiftShader
    # compiles a kernel in time and memory that grow exponentially with the short-circuit branches
    # of the per-pair code (past 8 GB at ~30: a few reads of a 5-axis input; benchmarks/NOTES.md,
    # eleventh session); the comparisons have no side effects, so the two are the same test.
    bounds = " | ".join(f"(i{d} < 0i) | (i{d} >= i32({x}))" if isinstance(a, str) else f"(i{d} < 0i) | (i{d} >= {a}i)"
                        for d, (a, x) in enumerate(zip(inp.axes, ext)))
    flat = "u32(i0)"
    for d in range(1, n):
        flat = f"({flat}) * {ext[d]} + u32(i{d})" if d > 1 else f"{flat} * {ext[d]} + u32(i{d})"
    params = ", ".join(["site: u32"] + [f"i{d}: i32" for d in range(n)])
    t = _WGSL_TYPE[inp.type]
    return (f"// input {inp.name}[{', '.join(map(str, inp.axes))}] {inp.dtype}: {STORAGE[inp.dtype]}, from word "
            f"params.input_{inp.name},\n// row-major; an index out of its axis reads 0 and flags the launch "
            "(word 0 of inputs: the read's site)\n"
            f"fn in_{inp.name}({params}) -> {t} {{\n"
            f"    if ({bounds}) {{\n"
            f"        inputs[0] = site;\n"
            f"        return {_ZERO[inp.type]};\n"
            "    }\n"
            f"    let e = {flat};\n"
            f"    return {_read(inp, 'e')};\n"
            "}\n")


# ---- the block classification of an index-only mask expression: the kernels' tile skipping ----------
#
# mask_expr_tile is attngen.plan.expr_blocks.classify in WGSL, rule for rule, for the rows q0..q1, keys k0..k1
# and query heads h0..h1 (inclusive; b, hkv, Lq and Lk exact): 0 SKIP (no element visible), 1
# PARTIAL, 2 FULL (every element visible); an empty range (q1 < q0 or k1 < k0) is SKIP. WGSL has
# no 64-bit integer, so the intervals are i32 and kept within (-2^30, 2^30): an endpoint beyond
# (a constant, a sum, a product past it) drops the interval ("not followed", as a real is), so
# every sum and difference of two kept endpoints fits i32, and a product is formed only after a
# division test says it fits. Dropping only ever turns SKIP or FULL into PARTIAL: the function may
# be less precise than the Python rules, never wrong (tests/equivalence/test_wgsl_expr_tiles.py
# runs it on the adapter against `classify`). The forward and backward kernels call it once per
# (q tile, K/V tile), with the same values in every invocation of a workgroup (uniform control
# flow): a SKIP tile is neither loaded nor computed, a FULL one needs no per-element mask_expr.
#
# Masks that read inputs are not classified here (their tiles come from the block-mask builder,
# attngen/plan/mask_inputs.py, or are tested per element, as the reference reads them).

BOUND = MAX_SEQ_LEN  # intervals' endpoints stay strictly inside (-BOUND, BOUND): 2^30, above every position

HELPERS = f"""\
// Interval analysis of a mask expression over a tile (attngen/plan/expr_blocks.py, rule for rule):
// an integer node's [lo, hi], a boolean node's (may be false, may be true) as [lo, hi] within
// [0, 1]; ok = false: not followed (a real, a divisor that may be 0, an endpoint outside
// (-2^30, 2^30): WGSL has no i64), which the rules read as "either" where a boolean is needed.
struct ExprIv {{
    lo: i32,
    hi: i32,
    ok: bool,
}}
fn iv_none() -> ExprIv {{
    return ExprIv(0i, 0i, false);
}}
// [lo, hi], or not followed where an endpoint leaves (-2^30, 2^30) (so that sums of two fit i32)
fn iv_of(lo: i32, hi: i32) -> ExprIv {{
    return ExprIv(lo, hi, lo > -{BOUND}i && hi < {BOUND}i);
}}
fn iv_either(a: ExprIv) -> ExprIv {{
    if (a.ok) {{
        return a;
    }}
    return ExprIv(0i, 1i, true);
}}
// a comparison's result: always (1, 1), never (0, 0), else either
fn iv_bool(always: bool, never: bool) -> ExprIv {{
    if (always) {{
        return ExprIv(1i, 1i, true);
    }}
    if (never) {{
        return ExprIv(0i, 0i, true);
    }}
    return ExprIv(0i, 1i, true);
}}
fn iv_floor_div(a: i32, b: i32) -> i32 {{
    let t = a / b;  // (b != 0 here; t * b, not WGSL's %: see expr_floor_div)
    return select(t, t - 1i, (t * b != a) && ((a < 0i) != (b < 0i)));
}}
fn iv_floor_mod(a: i32, b: i32) -> i32 {{
    return a - iv_floor_div(a, b) * b;
}}
fn iv_not(x: ExprIv) -> ExprIv {{
    let a = iv_either(x);
    return ExprIv(1i - a.hi, 1i - a.lo, true);
}}
fn iv_neg(a: ExprIv) -> ExprIv {{
    if (!a.ok) {{
        return iv_none();
    }}
    return iv_of(-a.hi, -a.lo);
}}
fn iv_and(x: ExprIv, y: ExprIv) -> ExprIv {{
    let a = iv_either(x);
    let b = iv_either(y);
    if (a.hi == 0i) {{
        return a;  // decided by the left operand: never
    }}
    return ExprIv(a.lo & b.lo, a.hi & b.hi, true);
}}
fn iv_or(x: ExprIv, y: ExprIv) -> ExprIv {{
    let a = iv_either(x);
    let b = iv_either(y);
    if (a.lo == 1i) {{
        return a;  // decided by the left operand: always
    }}
    return ExprIv(a.lo | b.lo, a.hi | b.hi, true);
}}
fn iv_add(a: ExprIv, b: ExprIv) -> ExprIv {{
    if (!a.ok || !b.ok) {{
        return iv_none();
    }}
    return iv_of(a.lo + b.lo, a.hi + b.hi);
}}
fn iv_sub(a: ExprIv, b: ExprIv) -> ExprIv {{
    if (!a.ok || !b.ok) {{
        return iv_none();
    }}
    return iv_of(a.lo - b.hi, a.hi - b.lo);
}}
// whether x * y stays inside (-2^30, 2^30) (|x|, |y| < 2^30: abs cannot overflow)
fn iv_product_fits(x: i32, y: i32) -> bool {{
    return y == 0i || abs(x) <= ({BOUND - 1}i / abs(y));
}}
fn iv_mul(a: ExprIv, b: ExprIv) -> ExprIv {{
    if (!a.ok || !b.ok || !iv_product_fits(a.lo, b.lo) || !iv_product_fits(a.lo, b.hi)
        || !iv_product_fits(a.hi, b.lo) || !iv_product_fits(a.hi, b.hi)) {{
        return iv_none();
    }}
    let c0 = a.lo * b.lo;
    let c1 = a.lo * b.hi;
    let c2 = a.hi * b.lo;
    let c3 = a.hi * b.hi;
    return iv_of(min(min(c0, c1), min(c2, c3)), max(max(c0, c1), max(c2, c3)));
}}
// floor division is monotone in each operand on either side of 0; a divisor that may be 0: none
fn iv_div(a: ExprIv, b: ExprIv) -> ExprIv {{
    if (!a.ok || !b.ok || (b.lo <= 0i && 0i <= b.hi)) {{
        return iv_none();
    }}
    let c0 = iv_floor_div(a.lo, b.lo);
    let c1 = iv_floor_div(a.lo, b.hi);
    let c2 = iv_floor_div(a.hi, b.lo);
    let c3 = iv_floor_div(a.hi, b.hi);
    return iv_of(min(min(c0, c1), min(c2, c3)), max(max(c0, c1), max(c2, c3)));
}}
// %: the sign of the divisor; one constant divisor over one quotient keeps the order
fn iv_mod(a: ExprIv, b: ExprIv) -> ExprIv {{
    if (!a.ok || !b.ok || (b.lo <= 0i && 0i <= b.hi)) {{
        return iv_none();
    }}
    if (b.lo == b.hi && iv_floor_div(a.lo, b.lo) == iv_floor_div(a.hi, b.lo)) {{
        return iv_of(iv_floor_mod(a.lo, b.lo), iv_floor_mod(a.hi, b.lo));
    }}
    if (b.lo > 0i) {{
        return iv_of(0i, b.hi - 1i);
    }}
    return iv_of(b.lo + 1i, 0i);
}}
fn iv_lt(a: ExprIv, b: ExprIv) -> ExprIv {{
    if (!a.ok || !b.ok) {{
        return ExprIv(0i, 1i, true);
    }}
    return iv_bool((a.hi < b.lo), (a.lo >= b.hi));
}}
fn iv_le(a: ExprIv, b: ExprIv) -> ExprIv {{
    if (!a.ok || !b.ok) {{
        return ExprIv(0i, 1i, true);
    }}
    return iv_bool((a.hi <= b.lo), (a.lo > b.hi));
}}
fn iv_eq(a: ExprIv, b: ExprIv) -> ExprIv {{
    if (!a.ok || !b.ok) {{
        return ExprIv(0i, 1i, true);
    }}
    if (a.lo == a.hi && b.lo == b.hi && a.lo == b.lo) {{
        return ExprIv(1i, 1i, true);
    }}
    return iv_bool(false, (a.hi < b.lo) || (b.hi < a.lo));
}}
fn iv_ne(a: ExprIv, b: ExprIv) -> ExprIv {{
    return iv_not(iv_eq(a, b));
}}
// where(c, x, y): the branch c decides, else both (is_bool: either when a branch is not followed)
fn iv_where(cond: ExprIv, x: ExprIv, y: ExprIv, is_bool: bool) -> ExprIv {{
    let c = iv_either(cond);
    if (c.lo == 1i) {{
        return x;
    }}
    if (c.hi == 0i) {{
        return y;
    }}
    if (!x.ok || !y.ok) {{
        if (is_bool) {{
            return ExprIv(0i, 1i, true);
        }}
        return iv_none();
    }}
    return ExprIv(min(x.lo, y.lo), max(x.hi, y.hi), true);
}}
fn iv_abs(a: ExprIv) -> ExprIv {{
    if (!a.ok) {{
        return iv_none();
    }}
    if (a.lo >= 0i) {{
        return a;
    }}
    if (a.hi <= 0i) {{
        return ExprIv(-a.hi, -a.lo, true);
    }}
    return ExprIv(0i, max(-a.lo, a.hi), true);
}}
fn iv_min(a: ExprIv, b: ExprIv) -> ExprIv {{
    if (!a.ok || !b.ok) {{
        return iv_none();
    }}
    return ExprIv(min(a.lo, b.lo), min(a.hi, b.hi), true);
}}
fn iv_max(a: ExprIv, b: ExprIv) -> ExprIv {{
    if (!a.ok || !b.ok) {{
        return iv_none();
    }}
    return ExprIv(max(a.lo, b.lo), max(a.hi, b.hi), true);
}}
fn iv_clamp(x: ExprIv, l: ExprIv, h: ExprIv) -> ExprIv {{
    if (!x.ok || !l.ok || !h.ok) {{
        return iv_none();
    }}
    return ExprIv(min(max(x.lo, l.lo), h.lo), min(max(x.hi, l.hi), h.hi), true);
}}
"""

_CMP = {"<": ("iv_lt", False), "<=": ("iv_le", False), ">": ("iv_lt", True), ">=": ("iv_le", True),
        "==": ("iv_eq", False), "!=": ("iv_ne", False)}
_ARITH = {"+": "iv_add", "-": "iv_sub", "*": "iv_mul", "//": "iv_div", "%": "iv_mod", "&&": "iv_and",
          "||": "iv_or"}
_KNOWN = {"b": "b, b", "h": "h0, h1", "hkv": "hkv, hkv", "q": "q0, q1", "k": "k0, k1", "Lq": "Lq, Lq",
          "Lk": "Lk, Lk"}


class _Lines:
    """The statements of mask_expr_tile: one `let vN = ...;` per node, children first."""

    def __init__(self):
        self.lines: list[str] = []

    def add(self, text: str) -> str:
        name = f"v{len(self.lines)}"
        self.lines.append(f"    let {name} = {text};")
        return name

    def node(self, e) -> str:
        """The name holding node e's interval (expr_blocks.interval)."""
        if isinstance(e, Const):
            if e.type != INT:
                return self.add("iv_none()")
            v = int(e.value)
            if not -BOUND < v < BOUND:
                return self.add("iv_none()")  # beyond the i32 intervals' bound: not followed
            return self.add(f"iv_of({v}i, {v}i)" if v >= 0 else f"iv_of(-{-v}i, -{-v}i)")
        if isinstance(e, Var):
            return self.add(f"iv_of({_KNOWN[e.name]})" if e.name in _KNOWN else "iv_none()")
        if isinstance(e, Load):
            raise ValueError("mask_expr_tile classifies index-only masks: this one reads an input")
        if e.type not in (INT, BOOL):
            return self.add("iv_none()")  # a real: not followed
        if isinstance(e, Unary):
            x = self.node(e.x)
            return self.add(f"iv_not({x})" if e.op == "!" else f"iv_neg({x})")
        if isinstance(e, Binary):
            a, b = self.node(e.a), self.node(e.b)
            if e.type == BOOL and e.op in _CMP:
                fn, swap = _CMP[e.op]
                return self.add(f"{fn}({b}, {a})" if swap else f"{fn}({a}, {b})")
            return self.add(f"{_ARITH[e.op]}({a}, {b})")
        args = [self.node(x) for x in e.args]
        if e.name == "where":
            return self.add(f"iv_where({', '.join(args)}, {'true' if e.type == BOOL else 'false'})")
        if e.name == "floor":
            return args[0]  # of an integer (a real's is not followed: its argument's interval is none)
        return self.add(f"iv_{e.name}({', '.join(args)})")  # abs, min, max, clamp


def tile_function(e) -> str:
    """The interval helpers and `fn mask_expr_tile(...) -> i32` of index-only mask expression e:
    SKIP (0), PARTIAL (1) or FULL (2) for rows q0..q1, keys k0..k1 and query heads h0..h1."""
    lines = _Lines()
    top = lines.node(e)
    return (HELPERS + "\n"
            f"// mask {format_expr(e)}: which elements of rows q0..q1 x keys k0..k1 (inclusive) of query\n"
            "// heads h0..h1 are visible: 0 none (the tile is skipped), 2 all (no per-element test), 1 some;\n"
            "// an empty range has none\n"
            "fn mask_expr_tile(b: i32, h0: i32, h1: i32, hkv: i32, q0: i32, q1: i32, k0: i32, k1: i32, Lq: i32,\n"
            "                  Lk: i32) -> i32 {\n"
            "    if (q1 < q0 || k1 < k0) {\n"
            "        return 0i;\n"
            "    }\n"
            + "\n".join(lines.lines) + "\n"
            f"    if (!{top}.ok) {{\n"
            "        return 1i;\n"
            "    }\n"
            f"    return select(select(1i, 2i, {top}.lo == 1i), 0i, {top}.hi == 0i);\n"
            "}\n")
