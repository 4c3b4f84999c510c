"""The block classification of an index-only mask expression as WGSL (issue 42): the kernels'
tile skipping.

    fn mask_expr_tile(b: i32, h0: i32, h1: i32, hkv: i32, q0: i32, q1: i32, k0: i32, k1: i32,
                      Lq: i32, Lk: i32) -> i32

is attngen.plan.expr_blocks.classify in WGSL, rule for rule, for the rows q0..q1, keys k0..k1
and query heads h0..h1 (inclusive; b, hkv, Lq and Lk exact): 0 SKIP (no element visible), 1
PARTIAL, 2 FULL (every element visible); an empty range (q1 < q0 or k1 < k0) is SKIP. WGSL has
no 64-bit integer, so the intervals are i32 and kept within (-2^30, 2^30): an endpoint beyond
(a constant, a sum, a product past it) drops the interval ("not followed", as a real is), so
every sum and difference of two kept endpoints fits i32, and a product is formed only after a
division test says it fits. Dropping only ever turns SKIP or FULL into PARTIAL: the function may
be less precise than the Python rules, never wrong (tests/equivalence/test_wgsl_expr_tiles.py
runs it on the adapter against `classify`). The forward and backward kernels call it once per
(q tile, K/V tile), with the same values in every invocation of a workgroup (uniform control
flow): a SKIP tile is neither loaded nor computed, a FULL one needs no per-element mask_expr.

Masks that read inputs are not classified here (their tiles come from the block-mask builder,
attngen/plan/mask_inputs.py, or are tested per element, as the reference reads them).
"""

from __future__ import annotations

from ...lang.expr import BOOL, INT, Binary, Const, Load, Unary, Var, format_expr

BOUND = 1 << 30  # intervals' endpoints stay strictly inside (-BOUND, BOUND)

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
    let t = a / b;
    return select(t, t - 1i, (a % b != 0i) && ((a < 0i) != (b < 0i)));
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
