"""Score and mask expressions (issue 42) as WGSL: one inline function per expression.

    fn mask_expr(b: i32, h: i32, hkv: i32, q: i32, k: i32, Lq: i32, Lk: i32) -> bool
    fn score_expr(s: f32, b: i32, h: i32, hkv: i32, q: i32, k: i32, Lq: i32, Lk: i32) -> f32

The IR of attngen.lang.expr, typed: integers are i32, reals f32, booleans bool; an integer
operand of a real operation is converted with f32(). `//` and `%` floor, as in the language
(WGSL's / and % truncate toward zero; expr_floor_div / expr_floor_mod correct them for operands
of opposite signs); `where` is select (both branches are evaluated: index-only expressions read
no input, so nothing is read out of bounds); `&&` and `||` are WGSL's (short-circuit);
sigmoid is 1 / (1 + exp(-x)); tanh is computed accurately for small arguments and clamped for
large ones (exp overflow in some implementations' tanh), as the softcap's; clamp(x, lo, hi) is
min(max(x, lo), hi) (WGSL's clamp differs where lo > hi). Every binary operand
that is itself an operation is parenthesised, so WGSL's precedence rules (which refuse mixing
&& and || without parentheses) never matter.

Differences from the float64 reference (attngen.reference_expr): integers are 32-bit and wrap
on overflow (the reference's are 64-bit), reals are f32, and an integer division by zero gives
a value (WGSL: a / 0 = a, a % 0 = 0) where the reference raises.

Only expressions over indices and `s` are rendered here; inputs are not passed to the WGSL
target yet (the backend refuses specs whose expressions read them).
"""

from __future__ import annotations

import math
import struct

from ...lang.expr import BOOL, INT, REAL, Binary, Const, Fn, Load, Unary, Var, format_expr, walk

INDEX_PARAMS = ("b", "h", "hkv", "q", "k", "Lq", "Lk")  # every expression function's i32 parameters

_HELPERS = {
    "floor_div": """\
// Integer division rounded toward -inf, as the language's `//` (and Python's): WGSL's / truncates.
fn expr_floor_div(a: i32, b: i32) -> i32 {
    let t = a / b;
    return select(t, t - 1i, (a % b != 0i) && ((a < 0i) != (b < 0i)));
}
""",
    "floor_mod": """\
// The remainder of expr_floor_div, with the sign of the divisor, as the language's `%` (and Python's).
fn expr_floor_mod(a: i32, b: i32) -> i32 {
    let r = a % b;
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
    """An expression the WGSL emitter does not render (one that reads an input)."""


def _int_literal(v: int) -> str:
    if v == -2**31:
        return "(-2147483647i - 1i)"
    return f"{v}i" if v >= 0 else f"(-{-v}i)"


def _real_literal(v: float) -> str:
    """v rounded to f32, as the shortest decimal text that reads back to that f32."""
    f = struct.unpack("f", struct.pack("f", float(v)))[0]
    if not math.isfinite(f):
        raise ExprError(f"the constant {v!r} is not finite in f32")
    for digits in range(1, 18):
        text = f"{f:.{digits}g}"
        if struct.unpack("f", struct.pack("f", float(text)))[0] == f:
            break
    text = repr(float(text))  # '30.0', '0.125', '1e-07': Python's shortest form of that value
    return f"{text}f" if not text.startswith("-") else f"({text}f)"


def helpers_of(*exprs) -> list[str]:
    """The helper functions the expressions use (in a fixed order)."""
    used = set()
    for e in exprs:
        if e is None:
            continue
        for n in walk(e):
            if isinstance(n, Binary) and n.op == "//":
                used.add("floor_div")
            elif isinstance(n, Binary) and n.op == "%":
                used.add("floor_mod")
            elif isinstance(n, Fn) and n.name in ("sigmoid", "tanh"):
                used.add(n.name)
    return [_HELPERS[k] for k in _HELPERS if k in used]


def _as(e, t: str) -> str:
    """e rendered as type t (REAL: an integer is converted; else as it is)."""
    if t == REAL and e.type == INT:
        if isinstance(e, Const):
            return _real_literal(e.value)
        return f"f32({render(e)})"
    return render(e)


def _infix(e) -> bool:
    """Whether e renders as an operator expression (not a call, a name or a literal)."""
    return isinstance(e, Unary) or (isinstance(e, Binary) and e.op not in ("//", "%"))


def _operand(e, t: str) -> str:
    """e as an operand of a binary operator: parenthesised when it is an operation itself."""
    text = _as(e, t)
    return f"({text})" if _infix(e) and not (t == REAL and e.type == INT) else text


def render(e) -> str:
    """The WGSL text of IR expression `e` (its type: e.type)."""
    if isinstance(e, Const):
        if e.type == BOOL:
            return "true" if e.value else "false"
        return _int_literal(int(e.value)) if e.type == INT else _real_literal(e.value)
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Load):
        raise ExprError(f"input '{e.input}' is read: inputs are not passed to target wgsl yet")
    if isinstance(e, Unary):
        return f"{e.op}{_operand(e.x, e.x.type)}"
    if isinstance(e, Binary):
        if e.op in ("&&", "||"):
            return f"{_operand(e.a, BOOL)} {e.op} {_operand(e.b, BOOL)}"
        if e.op in ("//", "%"):
            fn = "expr_floor_div" if e.op == "//" else "expr_floor_mod"
            return f"{fn}({render(e.a)}, {render(e.b)})"
        if e.type == BOOL:  # a comparison: of reals if either side is real
            t = REAL if REAL in (e.a.type, e.b.type) else e.a.type
        else:
            t = e.type  # + - * / : the result's type (`/` is always real)
        return f"{_operand(e.a, t)} {e.op} {_operand(e.b, t)}"
    # Fn
    a = e.args
    if e.name == "where":
        return f"select({_as(a[2], e.type)}, {_as(a[1], e.type)}, {render(a[0])})"
    if e.name == "floor":
        # floor of an integer is the integer, parenthesised where it is an operation (-floor(-q)
        # must not render as --q)
        return _operand(a[0], INT) if a[0].type == INT else f"i32(floor({render(a[0])}))"
    if e.name == "clamp":
        # the language's clamp is min(max(x, lo), hi), also where lo > hi (as the reference's);
        # WGSL's clamp is not: its float clamp may take the median, and constant operands with
        # lo > hi are a shader-creation error
        x, lo, hi = (_as(v, e.type) for v in a)
        return f"min(max({x}, {lo}), {hi})"
    if e.name in ("abs", "min", "max"):
        return f"{e.name}({', '.join(_as(x, e.type) for x in a)})"
    if e.name in ("sigmoid", "tanh"):
        return f"expr_{e.name}({_as(a[0], REAL)})"
    return f"{e.name}({_as(a[0], REAL)})"  # exp, log, sqrt


_WGSL_TYPE = {INT: "i32", REAL: "f32", BOOL: "bool"}


def function(name: str, e, what: str) -> str:
    """`fn name(...)` returning `e`, under a comment quoting the spec's expression (`what`:
    "mask" or "score"); a score function takes s (the scaled score) first."""
    params = ([] if what == "mask" else ["s: f32"]) + [f"{p}: i32" for p in INDEX_PARAMS]
    return (f"// {what} {format_expr(e)}\n"
            f"fn {name}({', '.join(params)}) -> {_WGSL_TYPE[e.type]} {{\n"
            f"    return {render(e)};\n"
            "}\n")
