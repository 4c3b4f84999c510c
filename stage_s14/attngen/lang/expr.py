"""Score and mask expressions (issue 42): the target-neutral IR, its checker and its printer.

    input    slopes[h] f32
    score    s - slopes[h] * abs(q - k)
    mask     k <= q || k < prefix[b]

The IR is small frozen dataclasses without positions (Const, Var, Load, Unary, Binary, Fn),
each carrying its type (int, real or bool), so that a spec read from two differently spaced
files compares equal. attngen.lang.expr_check types the syntax tree into it (with every error
at its position); this module needs no parser (specs print and load without lark).
`format_expr` prints the IR back with the fewest parentheses that read back to the same tree.
The float64 oracle evaluates the IR with numpy (attngen.reference_expr); attngen.plan.expr_blocks
classifies tiles by interval analysis; attngen.plan.expr_grad derives d score / d s; each target
renders the IR in its own emitter (attngen/backends/cuda/expr.py, attngen/backends/wgsl/expr.py)
and refuses, through Backend.check, what it does not compile.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from ..errors import clip

INT, REAL, BOOL = "int", "real", "bool"
# The names an expression may use besides its inputs, and their types: s is the scaled score
# (scores only); b, h, hkv are the batch, query head and KV head; q and k the query row and key
# positions within their sequence (0-based, top-left); Lq and Lk the sequence's lengths.
VARS = {"s": REAL, "b": INT, "h": INT, "hkv": INT, "q": INT, "k": INT, "Lq": INT, "Lk": INT}
INDEX_NAMES = ("b", "h", "hkv", "q", "k")  # the names an input's axis may take
# function -> its parameters (for arity messages)
FUNCTIONS = {"where": ("cond", "a", "b"), "abs": ("x",), "min": ("a", "b"), "max": ("a", "b"),
             "clamp": ("x", "lo", "hi"), "exp": ("x",), "log": ("x",), "sqrt": ("x",), "tanh": ("x",),
             "sigmoid": ("x",), "floor": ("x",)}
REAL_FUNCTIONS = ("exp", "log", "sqrt", "tanh", "sigmoid")
INPUT_DTYPES = ("f32", "f16", "bf16", "i32", "u8", "bool")
INPUT_DTYPE_ALIASES = {"fp16": "f16", "float16": "f16", "half": "f16", "bfloat16": "bf16", "fp32": "f32",
                       "float32": "f32", "float": "f32", "int32": "i32", "int": "i32", "uint8": "u8",
                       "byte": "u8", "bool8": "bool"}
DTYPE_TYPES = {"f32": REAL, "f16": REAL, "bf16": REAL, "i32": INT, "u8": INT, "bool": BOOL}
# The keywords of a kernel call and of attngen.reference: an input passed by keyword may not take one.
CALL_KEYWORDS = ("v", "mask", "kv_lens", "cu_seqlens_q", "cu_seqlens_k", "block_table", "k_new", "v_new",
                 "return_lse", "out", "max_seqlen_q", "max_seqlen_k", "check", "dout", "lse")
NAMED_MASKS = ("none", "causal", "window", "custom")


# ---- the IR ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Const:
    value: int | float
    type: str


@dataclass(frozen=True)
class Var:
    name: str  # one of VARS
    type: str


@dataclass(frozen=True)
class Load:
    """input[indices]: one element of an input tensor."""

    input: str
    indices: tuple
    type: str


@dataclass(frozen=True)
class Unary:
    op: str  # "-" or "!"
    x: object
    type: str


@dataclass(frozen=True)
class Binary:
    op: str  # || && == != < <= > >= + - * / // %
    a: object
    b: object
    type: str


@dataclass(frozen=True)
class Fn:
    name: str  # one of FUNCTIONS
    args: tuple
    type: str


EXPR_TYPES = (Const, Var, Load, Unary, Binary, Fn)


@dataclass(frozen=True)
class Input:
    """`input NAME[AXES] DTYPE [grad]`: a tensor passed to the call by keyword. Each axis is an
    index name (its extent comes from the call) or a positive integer."""

    name: str
    axes: tuple
    dtype: str
    grad: bool = False

    @property
    def type(self) -> str:
        return DTYPE_TYPES[self.dtype]


def children(e) -> tuple:
    if isinstance(e, Load):
        return e.indices
    if isinstance(e, Unary):
        return (e.x,)
    if isinstance(e, Binary):
        return (e.a, e.b)
    if isinstance(e, Fn):
        return e.args
    return ()


def walk(e):
    """Every node of `e`, parents first."""
    yield e
    for c in children(e):
        yield from walk(c)


def inputs_read(e) -> set:
    """The names of the inputs `e` reads (an empty set for None)."""
    return set() if e is None else {n.input for n in walk(e) if isinstance(n, Load)}


def helpers_used(exprs, functions: tuple = ()) -> set:
    """Which helpers a target's rendering of `exprs` (None entries skipped) needs: "floor_div" and
    "floor_mod" for `//` and `%` (the language floors, targets truncate), and each of `functions`
    (the target's own, e.g. sigmoid) that is called."""
    used = set()
    for e in exprs:
        for n in walk(e) if e is not None else ():
            if isinstance(n, Binary) and n.op in ("//", "%"):
                used.add("floor_div" if n.op == "//" else "floor_mod")
            elif isinstance(n, Fn) and n.name in functions:
                used.add(n.name)
    return used


def f32_text(v: float) -> str:
    """v rounded to f32, as the shortest decimal text that reads back to that f32, in Python's
    shortest form ('30.0', '0.125', '1e-07'); a ValueError where it is not finite in f32."""
    f = struct.unpack("f", struct.pack("f", float(v)))[0]
    if not math.isfinite(f):
        raise ValueError(f"the constant {v!r} is not finite in f32")
    for digits in range(1, 18):
        text = f"{f:.{digits}g}"
        if struct.unpack("f", struct.pack("f", float(text)))[0] == f:
            break
    return repr(float(text))


def fold_int(e) -> int | None:
    """The value of an integer expression of constants only (None when it reads a name or an
    input, is not integer, or divides by zero)."""
    if isinstance(e, Const) and e.type == INT:
        return e.value
    if e.type != INT or isinstance(e, (Var, Load)):
        return None
    vals = [fold_int(c) for c in children(e)]
    if any(v is None for v in vals):
        return None
    if isinstance(e, Unary):
        return -vals[0]
    if isinstance(e, Binary):
        a, b = vals
        if e.op in ("//", "%") and b == 0:
            return None
        return {"+": a + b, "-": a - b, "*": a * b, "//": a // b if b else 0, "%": a % b if b else 0}[e.op]
    if e.name == "abs":
        return abs(vals[0])
    if e.name in ("min", "max"):
        return min(vals) if e.name == "min" else max(vals)
    if e.name == "clamp":
        return min(max(vals[0], vals[1]), vals[2])
    return None  # where (of a boolean) and floor (of a real) are not folded


# ---- printing ----------------------------------------------------------------------------------

_PREC = {"||": 1, "&&": 2, "==": 3, "!=": 3, "<": 3, "<=": 3, ">": 3, ">=": 3, "+": 4, "-": 4,
         "*": 5, "/": 5, "//": 5, "%": 5}
_UNARY_PREC, _ATOM_PREC = 6, 7


def _prec(e) -> int:
    if isinstance(e, Binary):
        return _PREC[e.op]
    if isinstance(e, Unary) or (isinstance(e, Const) and format_number(e.value).startswith("-")):
        return _UNARY_PREC
    return _ATOM_PREC


def format_number(x) -> str:
    """Shortest text that reads back to the same value (ints stay ints)."""
    return str(x) if isinstance(x, int) else repr(float(x))


def format_expr(e) -> str:
    """`e` in the language, with the fewest parentheses that read back to the same IR."""
    def wrap(x, need_above: int) -> str:
        text = format_expr(x)
        return f"({text})" if _prec(x) <= need_above else text
    if isinstance(e, Const):
        return format_number(e.value)
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Load):
        return f"{e.input}[{', '.join(format_expr(i) for i in e.indices)}]"
    if isinstance(e, Fn):
        return f"{e.name}({', '.join(format_expr(a) for a in e.args)})"
    if isinstance(e, Unary):
        return e.op + wrap(e.x, _UNARY_PREC - 1)
    p = _PREC[e.op]
    # left-associative; comparisons do not chain, so a comparison under one is parenthesised
    left_above = p if p == 3 else p - 1
    return f"{wrap(e.a, left_above)} {e.op} {wrap(e.b, p)}"


def format_input(i: Input) -> str:
    axes = ", ".join(str(a) for a in i.axes)
    return f"{i.name}[{axes}] {i.dtype}" + (" grad" if i.grad else "")


# ---- as JSON data (api.parse's disk cache) -----------------------------------------------------

_TYPES = (INT, REAL, BOOL)


def expr_to_data(e):
    """`e` as nested lists: [kind, ..., type]."""
    if isinstance(e, Const):
        return ["const", e.value, e.type]
    if isinstance(e, Var):
        return ["var", e.name, e.type]
    if isinstance(e, Load):
        return ["load", e.input, [expr_to_data(i) for i in e.indices], e.type]
    if isinstance(e, Unary):
        return ["unary", e.op, expr_to_data(e.x), e.type]
    if isinstance(e, Binary):
        return ["binary", e.op, expr_to_data(e.a), expr_to_data(e.b), e.type]
    return ["fn", e.name, [expr_to_data(a) for a in e.args], e.type]


def expr_from_data(d, depth: int = 0):
    """The IR expr_to_data stored; ValueError for data of any other form."""
    if depth > 200 or not isinstance(d, list) or len(d) < 3 or d[-1] not in _TYPES:
        raise ValueError(f"stored expression: {clip(repr(d), 80)}")
    kind, t = d[0], d[-1]
    if kind == "const" and len(d) == 3 and type(d[1]) in (int, float):
        return Const(d[1], t)
    if kind == "var" and len(d) == 3 and d[1] in VARS:
        return Var(d[1], t)
    if kind == "load" and len(d) == 4 and isinstance(d[1], str) and isinstance(d[2], list):
        return Load(d[1], tuple(expr_from_data(i, depth + 1) for i in d[2]), t)
    if kind == "unary" and len(d) == 4 and d[1] in ("-", "!"):
        return Unary(d[1], expr_from_data(d[2], depth + 1), t)
    if kind == "binary" and len(d) == 5 and d[1] in _PREC:
        return Binary(d[1], expr_from_data(d[2], depth + 1), expr_from_data(d[3], depth + 1), t)
    if kind == "fn" and len(d) == 4 and d[1] in FUNCTIONS and isinstance(d[2], list):
        return Fn(d[1], tuple(expr_from_data(a, depth + 1) for a in d[2]), t)
    raise ValueError(f"stored expression: {clip(repr(d), 80)}")


def input_to_data(i: Input) -> list:
    return [i.name, list(i.axes), i.dtype, i.grad]


def input_from_data(d) -> Input:
    if not (isinstance(d, list) and len(d) == 4 and isinstance(d[0], str) and isinstance(d[1], list)
            and all(a in INDEX_NAMES or type(a) is int for a in d[1]) and d[2] in INPUT_DTYPES
            and type(d[3]) is bool):
        raise ValueError(f"stored input: {clip(repr(d), 80)}")
    return Input(d[0], tuple(d[1]), d[2], d[3])
