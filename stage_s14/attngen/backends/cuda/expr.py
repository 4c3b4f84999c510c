"""Score and mask expressions (issue 42) as CUDA C++: one inline function per expression, and
the block classification of a mask expression as a device function.

    bool  mask_expr(int b, int h, int hkv, int q, int k, int Lq, int Lk)
    float score_expr(float s, int b, int h, int hkv, int q, int k, int Lq, int Lk)
    int   mask_expr_tile(int b, int h0, int h1, int hkv, int q0, int q1, int k0, int k1, int Lq, int Lk)

The IR of attngen.lang.expr, typed: integers are int (32-bit), reals float, booleans bool; an
integer operand of a real operation is converted with (float). `//` and `%` floor, as in the
language (C++'s / and % truncate toward zero; expr_floor_div / expr_floor_mod correct them for
operands of opposite signs, and give WGSL's values where C++ has none: a // 0 = a, a % 0 = 0,
INT_MIN // -1 = INT_MIN); `where` is the conditional operator (only the branch that is the
result is evaluated); sigmoid is 1 / (1 + expf(-x)); tanh is tanhf, the
softcap's (CUDA's is accurate for small arguments and saturates for large ones). Every binary
operand that is itself an operation is parenthesised.

mask_expr_tile is attngen.plan.expr_blocks.classify in C++, rule for rule, for the rows q0..q1,
keys k0..k1 and query heads h0..h1 (inclusive; b, hkv, Lq and Lk exact): 0 SKIP (no element
visible), 1 PARTIAL, 2 FULL (every element visible). Its intervals are 64-bit (ExprIv); where
Python's unbounded integers would leave 64 bits (a product of endpoints above 2^31, a sum above
2^62) the interval is dropped ("not followed", as for reals), which only ever turns SKIP or FULL
into PARTIAL. The kernels evaluate mask_expr per element in 32-bit int, which the planner's
length bound (2^30) keeps from wrapping for the usual expressions of positions.

Functions are `__host__ __device__`, so that a host program can check them against the Python
rules (tests/backends/cuda/test_expr_source.py, test_expr_inputs_source.py).

Inputs (`input NAME[AXES] DTYPE`): each is a pointer parameter of the kernel, `input_NAME`, to
its elements row-major over its axes; the kernel gathers them with the extents of the axes b, h,
hkv, q, k (the call's: ext_b .. ext_k) and where reads out of bounds are reported in one
`ExprInputs`, passed by reference as the first argument of every expression function that reads
an input. A read `NAME[i, j]` is a call of the input's loader, `in_NAME(in, site, i, j)`, which
tests every index against its axis (64-bit element offsets): out of bounds it returns 0 (false)
and writes in.site0 + site (the read's number, 1.. in the order of `sites`) into word
kErrExprRead of `errors`, page-locked host memory the runtime reads (backends/cuda/launch.py).
f16 and bf16 inputs are read as their bits and widened to float exactly. `&&`, `||` and `?:`
evaluate the side that decides only, so a read the language does not make is not made;
mask_expr_tile takes a read as unknown (PARTIAL where it decides), never reading an input.
"""

from __future__ import annotations

import struct

from ...lang.expr import (BOOL, INT, REAL, Binary, Const, Fn, Load, Unary, Var,
                         f32_text, format_expr, helpers_used, inputs_read, walk)
from .lower import EXTENTS  # the index axes an input may have: ExprInputs' ext_b .. ext_k

INDEX_PARAMS = ("b", "h", "hkv", "q", "k", "Lq", "Lk")  # every expression function's int parameters
_FN = "__host__ __device__ __forceinline__"

_HELPERS = {
    "floor_div": f"""\
// Integer division rounded toward -inf, as the language's `//` (and Python's): C++'s / truncates.
// A divisor of 0 gives a (and INT_MIN // -1 gives INT_MIN), WGSL's values, where C++ has none.
{_FN} int expr_floor_div(int a, int b) {{
    if (b == 0) return a;
    if (b == -1) return (int)(0u - (unsigned)a);
    const int t = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? t - 1 : t;
}}
""",
    "floor_mod": f"""\
// The remainder of expr_floor_div, with the sign of the divisor, as the language's `%` (and
// Python's); a % 0 = 0.
{_FN} int expr_floor_mod(int a, int b) {{
    if (b == 0 || b == -1) return 0;
    const int r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}}
""",
    "sigmoid": f"""\
{_FN} float expr_sigmoid(float x) {{
    return 1.0f / (1.0f + expf(-x));
}}
""",
}


class ExprError(ValueError):
    """An expression the CUDA emitter does not render: a real constant not finite in f32, or an
    input read outside function() (its site numbers)."""


def _int_literal(v: int) -> str:
    if v == -2**31:
        return "(-2147483647 - 1)"
    return f"{v}" if v >= 0 else f"(-{-v})"


def _real_literal(v: float) -> str:
    """v rounded to f32, as the shortest decimal text that reads back to that f32, with suffix f."""
    try:
        text = f32_text(v)
    except ValueError as err:
        raise ExprError(str(err)) from None
    return f"{text}f" if not text.startswith("-") else f"({text}f)"


def helpers_of(*exprs) -> list[str]:
    """The helper functions the expressions use (in a fixed order)."""
    used = helpers_used(exprs, ("sigmoid",))
    return [_HELPERS[k] for k in _HELPERS if k in used]


def _as(e, t: str, site_of=None) -> str:
    """e rendered as type t (REAL: an integer is converted; else as it is)."""
    if t == REAL and e.type == INT:
        if isinstance(e, Const):
            return _real_literal(e.value)
        return f"(float)({render(e, site_of)})"
    return render(e, site_of)


def _infix(e) -> bool:
    """Whether e renders as an operator expression (not a call, a name or a literal)."""
    return isinstance(e, Unary) or (isinstance(e, Binary) and e.op not in ("//", "%"))


def _operand(e, t: str, site_of=None) -> str:
    """e as an operand of a binary operator: parenthesised when it is an operation itself."""
    text = _as(e, t, site_of)
    return f"({text})" if _infix(e) and not (t == REAL and e.type == INT) else text


_REAL_FN = {"exp": "expf", "log": "logf", "sqrt": "sqrtf", "tanh": "tanhf", "abs": "fabsf", "min": "fminf",
            "max": "fmaxf"}


def render(e, site_of: dict | None = None) -> str:
    """The C++ text of IR expression `e` (its type: e.type); `site_of`: the site number of each
    input read by id (`sites`), where e reads inputs."""
    r = lambda x: render(x, site_of)  # noqa: E731
    if isinstance(e, Const):
        if e.type == BOOL:
            return "true" if e.value else "false"
        return _int_literal(int(e.value)) if e.type == INT else _real_literal(e.value)
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Load):
        if site_of is None or id(e) not in site_of:
            raise ExprError(f"input '{e.input}' is read: render it within function() (its site numbers)")
        return f"in_{e.input}(in, {site_of[id(e)]}, {', '.join(r(i) for i in e.indices)})"
    if isinstance(e, Unary):
        return f"{e.op}{_operand(e.x, e.x.type, site_of)}"
    if isinstance(e, Binary):
        if e.op in ("&&", "||"):
            return f"{_operand(e.a, BOOL, site_of)} {e.op} {_operand(e.b, BOOL, site_of)}"
        if e.op in ("//", "%"):
            fn = "expr_floor_div" if e.op == "//" else "expr_floor_mod"
            return f"{fn}({r(e.a)}, {r(e.b)})"
        if e.type == BOOL:  # a comparison: of reals if either side is real
            t = REAL if REAL in (e.a.type, e.b.type) else e.a.type
        else:
            t = e.type  # + - * / : the result's type (`/` is always real)
        return f"{_operand(e.a, t, site_of)} {e.op} {_operand(e.b, t, site_of)}"
    # Fn
    a = e.args
    if e.name == "where":
        return f"({r(a[0])} ? {_as(a[1], e.type, site_of)} : {_as(a[2], e.type, site_of)})"
    if e.name == "floor":
        # floor of an integer is the integer, parenthesised where it is an operation (-floor(-q)
        # must not render as --q, a decrement)
        return _operand(a[0], INT, site_of) if a[0].type == INT else f"(int)floorf({r(a[0])})"
    if e.name == "clamp":
        if e.type == INT:
            return f"min(max({_as(a[0], INT, site_of)}, {_as(a[1], INT, site_of)}), {_as(a[2], INT, site_of)})"
        return f"fminf(fmaxf({_as(a[0], REAL, site_of)}, {_as(a[1], REAL, site_of)}), {_as(a[2], REAL, site_of)})"
    if e.name in ("abs", "min", "max"):
        name = e.name if e.type == INT else _REAL_FN[e.name]
        return f"{name}({', '.join(_as(x, e.type, site_of) for x in a)})"
    if e.name == "sigmoid":
        return f"expr_sigmoid({_as(a[0], REAL, site_of)})"
    return f"{_REAL_FN[e.name]}({_as(a[0], REAL, site_of)})"  # exp, log, sqrt, tanh


C_TYPE = {INT: "int", REAL: "float", BOOL: "bool"}


def function(name: str, e, what: str, site_of: dict | None = None, items: tuple = (), original=None) -> str:
    """`name(...)` returning `e`, under a comment quoting the spec's expression (`what`: "mask",
    "score", or "item": a subexpression of the score evaluated once per row, lang.expr.
    hoist_item_reads); a score function takes s (the scaled score) first and after the indices the
    values of `items` (the hoisted subexpressions: parameters item0, item1, ...; `original`: the
    spec's expression they were hoisted from, quoted), and a function that reads inputs takes
    `const ExprInputs& in` before everything (`site_of`: from `sites`)."""
    params = ([] if what in ("mask", "item") else ["float s"]) + [f"int {p}" for p in INDEX_PARAMS]
    params += [f"{C_TYPE[x.type]} item{i}" for i, x in enumerate(items)]
    if inputs_read(e):
        params.insert(0, "const ExprInputs& in")
    head = f"// {what} {format_expr(e)}\n"
    if items:
        head = (f"// {what} {format_expr(original)}\n// as {format_expr(e)}, with "
                + ", ".join(f"item{i} = {format_expr(x)}" for i, x in enumerate(items))
                + " (evaluated once per row: plan.expr_reads)\n")
    return (head +
            f"{_FN} {C_TYPE[e.type]} {name}({', '.join(params)}) {{\n"
            f"    return {render(e, site_of)};\n"
            "}\n")


# ---- the block classification (attngen.plan.expr_blocks, in C++) ------------------------------

INTERVAL_HELPERS = f"""\
// Interval analysis of a mask expression over a tile (attngen/plan/expr_blocks.py, rule for rule):
// an integer node's [lo, hi], a boolean node's (may be false, may be true) as [lo, hi] within
// [0, 1]; ok = false: not followed (a real, a divisor that may be 0, or beyond 64 bits), which the
// rules read as "either" where a boolean is needed.
struct ExprIv {{
    long long lo, hi;
    bool ok;
}};
{_FN} ExprIv iv_of(long long lo, long long hi) {{ return ExprIv{{lo, hi, true}}; }}
{_FN} ExprIv iv_none() {{ return ExprIv{{0, 0, false}}; }}
{_FN} ExprIv iv_either(ExprIv a) {{ return a.ok ? a : iv_of(0, 1); }}
// endpoints small enough that a sum (2^62) or a product (2^31) stays inside 64 bits
{_FN} bool iv_sums(ExprIv a) {{ return a.ok && a.lo >= -(1LL << 62) && a.hi <= (1LL << 62); }}
{_FN} bool iv_products(ExprIv a) {{ return a.ok && a.lo >= -(1LL << 31) && a.hi <= (1LL << 31); }}
{_FN} long long iv_floor_div(long long a, long long b) {{
    const long long t = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? t - 1 : t;
}}
{_FN} long long iv_floor_mod(long long a, long long b) {{ return a - iv_floor_div(a, b) * b; }}
{_FN} ExprIv iv_not(ExprIv x) {{
    x = iv_either(x);
    return iv_of(1 - x.hi, 1 - x.lo);
}}
{_FN} ExprIv iv_neg(ExprIv x) {{ return iv_sums(x) ? iv_of(-x.hi, -x.lo) : iv_none(); }}
{_FN} ExprIv iv_and(ExprIv a, ExprIv b) {{
    a = iv_either(a);
    b = iv_either(b);
    return a.hi == 0 ? a : iv_of(a.lo & b.lo, a.hi & b.hi);  // (decided by the left operand: never)
}}
{_FN} ExprIv iv_or(ExprIv a, ExprIv b) {{
    a = iv_either(a);
    b = iv_either(b);
    return a.lo == 1 ? a : iv_of(a.lo | b.lo, a.hi | b.hi);  // (decided by the left operand: always)
}}
{_FN} ExprIv iv_add(ExprIv a, ExprIv b) {{
    return iv_sums(a) && iv_sums(b) ? iv_of(a.lo + b.lo, a.hi + b.hi) : iv_none();
}}
{_FN} ExprIv iv_sub(ExprIv a, ExprIv b) {{
    return iv_sums(a) && iv_sums(b) ? iv_of(a.lo - b.hi, a.hi - b.lo) : iv_none();
}}
{_FN} ExprIv iv_mul(ExprIv a, ExprIv b) {{
    if (!iv_products(a) || !iv_products(b)) return iv_none();
    const long long c0 = a.lo * b.lo, c1 = a.lo * b.hi, c2 = a.hi * b.lo, c3 = a.hi * b.hi;
    return iv_of(min(min(c0, c1), min(c2, c3)), max(max(c0, c1), max(c2, c3)));
}}
// floor division is monotone in each operand on either side of 0; a divisor that may be 0: none
{_FN} ExprIv iv_div(ExprIv a, ExprIv b) {{
    if (!iv_sums(a) || !iv_sums(b) || (b.lo <= 0 && 0 <= b.hi)) return iv_none();
    const long long c0 = iv_floor_div(a.lo, b.lo), c1 = iv_floor_div(a.lo, b.hi);
    const long long c2 = iv_floor_div(a.hi, b.lo), c3 = iv_floor_div(a.hi, b.hi);
    return iv_of(min(min(c0, c1), min(c2, c3)), max(max(c0, c1), max(c2, c3)));
}}
// %: the sign of the divisor; one constant divisor over one quotient keeps the order
{_FN} ExprIv iv_mod(ExprIv a, ExprIv b) {{
    if (!iv_sums(a) || !iv_sums(b) || (b.lo <= 0 && 0 <= b.hi)) return iv_none();
    if (b.lo == b.hi && iv_floor_div(a.lo, b.lo) == iv_floor_div(a.hi, b.lo)) {{
        return iv_of(iv_floor_mod(a.lo, b.lo), iv_floor_mod(a.hi, b.lo));
    }}
    return b.lo > 0 ? iv_of(0, b.hi - 1) : iv_of(b.lo + 1, 0);
}}
{_FN} ExprIv iv_lt(ExprIv a, ExprIv b) {{
    if (!a.ok || !b.ok) return iv_of(0, 1);
    return a.hi < b.lo ? iv_of(1, 1) : a.lo >= b.hi ? iv_of(0, 0) : iv_of(0, 1);
}}
{_FN} ExprIv iv_le(ExprIv a, ExprIv b) {{
    if (!a.ok || !b.ok) return iv_of(0, 1);
    return a.hi <= b.lo ? iv_of(1, 1) : a.lo > b.hi ? iv_of(0, 0) : iv_of(0, 1);
}}
{_FN} ExprIv iv_eq(ExprIv a, ExprIv b) {{
    if (!a.ok || !b.ok) return iv_of(0, 1);
    if (a.lo == a.hi && b.lo == b.hi && a.lo == b.lo) return iv_of(1, 1);
    return a.hi < b.lo || b.hi < a.lo ? iv_of(0, 0) : iv_of(0, 1);
}}
{_FN} ExprIv iv_ne(ExprIv a, ExprIv b) {{ return iv_not(iv_eq(a, b)); }}
// where(c, x, y): the branch c decides, else both (is_bool: either when a branch is not followed)
{_FN} ExprIv iv_where(ExprIv c, ExprIv x, ExprIv y, bool is_bool) {{
    c = iv_either(c);
    if (c.lo == 1) return x;
    if (c.hi == 0) return y;
    if (!x.ok || !y.ok) return is_bool ? iv_of(0, 1) : iv_none();
    return iv_of(min(x.lo, y.lo), max(x.hi, y.hi));
}}
{_FN} ExprIv iv_abs(ExprIv a) {{
    if (!iv_sums(a)) return iv_none();
    return a.lo >= 0 ? a : a.hi <= 0 ? iv_of(-a.hi, -a.lo) : iv_of(0, max(-a.lo, a.hi));
}}
{_FN} ExprIv iv_min(ExprIv a, ExprIv b) {{
    return a.ok && b.ok ? iv_of(min(a.lo, b.lo), min(a.hi, b.hi)) : iv_none();
}}
{_FN} ExprIv iv_max(ExprIv a, ExprIv b) {{
    return a.ok && b.ok ? iv_of(max(a.lo, b.lo), max(a.hi, b.hi)) : iv_none();
}}
{_FN} ExprIv iv_clamp(ExprIv x, ExprIv l, ExprIv h) {{
    return x.ok && l.ok && h.ok ? iv_of(min(max(x.lo, l.lo), h.lo), min(max(x.hi, l.hi), h.hi)) : iv_none();
}}
"""

_CMP = {"<": ("iv_lt", False), "<=": ("iv_le", False), ">": ("iv_lt", True), ">=": ("iv_le", True),
        "==": ("iv_eq", False), "!=": ("iv_ne", False)}
_ARITH = {"+": "iv_add", "-": "iv_sub", "*": "iv_mul", "//": "iv_div", "%": "iv_mod", "&&": "iv_and",
          "||": "iv_or"}


class _Lines:
    """The statements of mask_expr_tile: one `const ExprIv vN = ...;` per node, children first."""

    def __init__(self):
        self.lines: list[str] = []

    def add(self, text: str) -> str:
        name = f"v{len(self.lines)}"
        self.lines.append(f"    const ExprIv {name} = {text};")
        return name

    def node(self, e) -> str:
        """The variable holding node e's interval (expr_blocks.interval)."""
        if isinstance(e, Const):
            return self.add(f"iv_of({int(e.value)}LL, {int(e.value)}LL)" if e.type == INT else "iv_none()")
        if isinstance(e, Var):
            known = {"b": "b, b", "h": "h0, h1", "hkv": "hkv, hkv", "q": "q0, q1", "k": "k0, k1",
                     "Lq": "Lq, Lq", "Lk": "Lk, Lk"}
            return self.add(f"iv_of({known[e.name]})" if e.name in known else "iv_none()")
        if isinstance(e, Load):
            # an input's value: not followed (no input is read here); a boolean one may be either
            return self.add("iv_of(0, 1)" if e.type == BOOL else "iv_none()")
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
            return args[0]  # of an integer (a real's is not followed: e.type is INT, its argument's none)
        return self.add(f"iv_{e.name}({', '.join(args)})")  # abs, min, max, clamp


def tile_function(e) -> str:
    """`int mask_expr_tile(b, h0, h1, hkv, q0, q1, k0, k1, Lq, Lk)`: SKIP (0), PARTIAL (1) or FULL
    (2) for rows q0..q1, keys k0..k1 and query heads h0..h1 of mask expression e (inclusive)."""
    lines = _Lines()
    top = lines.node(e)
    return (f"// mask {format_expr(e)}: which elements of rows q0..q1 x keys k0..k1 (inclusive) of query\n"
            "// heads h0..h1 are visible: 0 none (the tile is skipped), 2 all (no per-element test), 1 some\n"
            f"{_FN} int mask_expr_tile(int b, int h0, int h1, int hkv, int q0, int q1, int k0, int k1, int Lq,\n"
            "                                                       int Lk) {\n"
            + "\n".join(lines.lines) + "\n"
            f"    if (!{top}.ok) return 1;\n"
            f"    return {top}.hi == 0 ? 0 : {top}.lo == 1 ? 2 : 1;\n"
            "}\n")


# ---- inputs: the kernel's pointers, their loaders and the bounds report ----------------------------

ERROR_WORD = 4  # the word of the kernels' `errors` a read out of bounds writes (backends/cuda/launch.py)
# The element type of each input dtype's pointer (f16 / bf16: their bits, widened by expr_f16 / expr_bf16).
C_TYPES = {"f32": "float", "f16": "unsigned short", "bf16": "unsigned short", "i32": "int", "u8": "unsigned char",
           "bool": "unsigned char"}
_VALUE = {"f32": "{p}[e]", "f16": "expr_f16({p}[e])", "bf16": "expr_bf16({p}[e])", "i32": "{p}[e]",
          "u8": "(int){p}[e]", "bool": "{p}[e] != 0"}
_ZERO = {REAL: "0.0f", INT: "0", BOOL: "false"}


def sites(spec) -> list:
    """(expression, Load) of every input read of the spec, mask expression first then score, each
    in walk order: site n (from 1) is the n-th (the numbering of the wgsl target's flag too)."""
    out = []
    for what, e in (("mask", spec.mask.expr if spec.mask.kind == "expr" else None), ("score", spec.score)):
        if e is not None:
            out += [(what, n) for n in walk(e) if isinstance(n, Load)]
    return out


def site_numbers(spec) -> dict:
    """{id(Load): its site number} of the spec's input reads (render's `site_of`); 0 for a read
    the planner proved in bounds (attngen.plan.expr_reads.in_bounds: its loader tests nothing)."""
    from ...plan.expr_reads import in_bounds
    return {id(n): 0 if in_bounds(n, spec.inputs) else at + 1 for at, (_, n) in enumerate(sites(spec))}


def inputs_source(spec) -> str:
    """The ExprInputs struct of the spec's inputs, the reporting and widening helpers and one
    loader per input ("" where the spec declares none)."""
    if not spec.inputs:
        return ""
    fields = "\n".join(f"    const {C_TYPES[i.dtype]}* __restrict__ {i.name};  // input {i.name}"
                       f"[{', '.join(map(str, i.axes))}] {i.dtype}, row-major" for i in spec.inputs)
    widen = ""
    if any(i.dtype == "f16" for i in spec.inputs):
        widen += f"""\
// An f16's bits as float (exact): cvt on the GPU, by its fields on the host.
{_FN} float expr_f16(unsigned short x) {{
#ifdef __CUDA_ARCH__
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
    return f;
#else
    const unsigned sign = (x & 0x8000u) << 16, exp = (x >> 10) & 0x1fu, man = x & 0x3ffu;
    if (exp == 0) return (sign ? -1.0f : 1.0f) * (float)man * 5.9604644775390625e-8f;  // subnormal: man * 2^-24
    union {{ unsigned u; float f; }} v{{sign | (exp == 31 ? 0x7f800000u : (exp + 112u) << 23) | (man << 13)}};
    return v.f;
#endif
}}
"""
    if any(i.dtype == "bf16" for i in spec.inputs):
        widen += f"""\
// A bf16's bits as float (exact: the upper half of its f32).
{_FN} float expr_bf16(unsigned short x) {{
#ifdef __CUDA_ARCH__
    return __uint_as_float((unsigned)x << 16);
#else
    union {{ unsigned u; float f; }} v{{(unsigned)x << 16}};
    return v.f;
#endif
}}
"""
    return (f"""\
// The expression inputs (kernel parameters input_NAME), the extents of the index axes they may have
// (the call's batch, query heads, KV heads, query rows and cache keys), and where a read out of an
// input's bounds is reported: word kErrExprRead of errors gets site0 + the read's site number.
struct ExprInputs {{
{fields}
    int {", ".join("ext_" + a for a in EXTENTS)};
    int* errors;  // null: not reported
    int site0;
}};
constexpr int kErrExprRead = {ERROR_WORD};

// A read out of bounds: its site into the flag word (one lane of the warp's lanes that read it
// writes; a plain store: any of the sites found is a correct report).
{_FN} void expr_report(const ExprInputs& in, int site) {{
    if (in.errors == nullptr) return;
#ifdef __CUDA_ARCH__
    if ((int)(threadIdx.x % 32) != __ffs(__activemask()) - 1) return;
#endif
    *reinterpret_cast<volatile int*>(in.errors + kErrExprRead) = in.site0 + site;
}}
{widen}
""" + "\n".join(loader(i) for i in spec.inputs))


def loader(inp) -> str:
    """`in_NAME(in, site, i0, ...)`: one element of input `inp` (attngen.lang.expr.Input), row-major
    over its axes with a 64-bit offset; an index out of its axis reads 0 (false) and reports `site`.
    Site 0: a read the planner proved in bounds (attngen.plan.expr_reads.in_bounds), untested."""
    ext = [f"in.ext_{a}" if isinstance(a, str) else str(a) for a in inp.axes]
    bounds = " || ".join(f"i{d} < 0 || i{d} >= {x}" for d, x in enumerate(ext))
    flat = "(long long)i0"
    for d in range(1, len(ext)):
        flat = f"({flat}) * {ext[d]} + i{d}" if d > 1 else f"{flat} * {ext[d]} + i{d}"
    params = ", ".join(["const ExprInputs& in", "int site"] + [f"int i{d}" for d in range(len(ext))])
    return (f"// input {inp.name}[{', '.join(map(str, inp.axes))}] {inp.dtype}\n"
            f"{_FN} {C_TYPE[inp.type]} in_{inp.name}({params}) {{\n"
            f"    if (site != 0 && ({bounds})) {{\n"
            "        expr_report(in, site);\n"
            f"        return {_ZERO[inp.type]};\n"
            "    }\n"
            f"    const long long e = {flat};\n"
            f"    return {_VALUE[inp.dtype].format(p='in.' + inp.name)};\n"
            "}\n")


def inputs_init(spec) -> str:
    """The statement that builds the kernel's ExprInputs from its parameters (lower.py)."""
    names = ", ".join(f"input_{i.name}" for i in spec.inputs)
    return (f"const ExprInputs expr_in{{{names}, {', '.join('ext_' + a for a in EXTENTS)}, errors, expr_site0}};"
            "  // expression inputs")
