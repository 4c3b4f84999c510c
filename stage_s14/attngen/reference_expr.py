"""Score and mask expressions in the float64 oracle: the IR of attngen.lang.expr with numpy.

    out = attngen.reference(spec, q, k, v, slopes=slopes)   # inputs by keyword, as declared

Each input is checked against its declaration (`check_inputs`: shape from the call's extents,
integer inputs integer-valued and in their dtype's range) and real inputs are rounded to their
dtype, as q, k and v are. `Env` evaluates the spec's expressions on one block of scores: one
sequence b, a group of query heads, rows r0..r1 and every key, broadcasting q along rows, k along
keys and h along heads. Integers are int64 here (the language's constants and indices fit in 32
bits); `//` and `%` floor, as in Python.

`&&`, `||` and `where` evaluate their right operand (branches) only where it decides the result,
as C does: `q - k < 8 && tab[q - k] > 0` never reads tab out of its bounds. An input read out
of its bounds, an integer division by zero, or floor() of a non-finite real, where the result
is used, is a LaunchError naming the expression; the score is used only at visible pairs.
"""

from __future__ import annotations

import numpy as np

from .errors import LaunchError
from .lang.expr import BOOL, INT, Binary, Const, Fn, Load, Unary, Var, format_expr
from .limits import INT32_MAX
from .runtime.inputs import check_declared

_INT_RANGE = {"i32": (-INT32_MAX - 1, INT32_MAX), "u8": (0, 255), "bool": (0, 1)}


def has_expressions(spec) -> bool:
    return bool(spec.inputs) or spec.score is not None or spec.mask.kind == "expr"


def check_inputs(spec, given: dict, extents: dict, round_to_dtype) -> dict:
    """{name: float64 / int64 / bool array} of the spec's inputs from `given` (the keywords of
    the call, as numpy arrays), each checked against its declaration (unknown, missing and
    shapes by attngen.runtime.inputs.check_declared, as the kernels check them); `extents`
    maps b, h, hkv, q, k to the call's batch, query heads, KV heads, query rows and keys; real
    inputs are rounded by `round_to_dtype(array, dtype)` (attngen.reference's)."""
    arrays = check_declared(spec, given, extents, "attngen.reference")  # unknown, missing, shapes
    out = {}
    for name, inp in ((i.name, i) for i in spec.inputs):
        a = arrays[name]
        if inp.dtype in ("f32", "f16", "bf16"):
            out[name] = round_to_dtype(a, inp.dtype)
            continue
        if not (np.issubdtype(a.dtype, np.integer) or a.dtype == bool):
            raise LaunchError(f"attngen.reference: input '{name}' is {inp.dtype}; it was given {a.dtype} "
                              "(integer or boolean values are needed)")
        lo, hi = _INT_RANGE[inp.dtype]
        if a.size and (a.min() < lo or a.max() > hi):
            raise LaunchError(f"attngen.reference: input '{name}' ({inp.dtype}) holds values outside {lo} .. {hi}")
        out[name] = a.astype(bool) if inp.dtype == "bool" else a.astype(np.int64)
    return out


class Env:
    """The names of one sequence's head group: evaluates score and mask on rows r0..r1."""

    def __init__(self, spec, inputs: dict, b: int, hq0: int, groups: int, hkv: int, len_q: int, len_k: int):
        self.spec, self.inputs = spec, inputs
        self.names = {"b": np.int64(b), "hkv": np.int64(hkv), "Lq": np.int64(len_q), "Lk": np.int64(len_k),
                      "h": np.arange(hq0, hq0 + groups, dtype=np.int64)[:, None, None],
                      "k": np.arange(len_k, dtype=np.int64)[None, None, :]}
        self.shape = (groups, len_q, len_k)

    def _rows(self, r0: int, r1: int) -> dict:
        return dict(self.names, q=np.arange(r0, r1, dtype=np.int64)[None, :, None])

    def visible(self, r0: int, r1: int) -> np.ndarray | None:
        """(groups, r1 - r0, Lk) booleans of the mask expression (None: no mask expression)."""
        if self.spec.mask.kind != "expr":
            return None
        names = self._rows(r0, r1)
        shape = (self.shape[0], r1 - r0, self.shape[2])
        return np.broadcast_to(evaluate(self.spec.mask.expr, names, self.inputs, np.ones(shape, bool), "mask"), shape)

    def score(self, s: np.ndarray, ok: np.ndarray, r0: int, r1: int) -> np.ndarray:
        """The score expression of the scaled scores s (used where ok: the visible pairs)."""
        if self.spec.score is None:
            return s
        names = dict(self._rows(r0, r1), s=s)
        with np.errstate(all="ignore"):
            return np.broadcast_to(evaluate(self.spec.score, names, self.inputs, ok, "score"), s.shape).astype(np.float64)


    def real(self, e, s: np.ndarray, ok: np.ndarray, r0: int, r1: int) -> np.ndarray:
        """A real expression of the score's names (a derivative of the score: attngen.plan.
        expr_grad) at the scaled scores s, used where ok, as float64 of s's shape."""
        names = dict(self._rows(r0, r1), s=s)
        with np.errstate(all="ignore"):
            return np.broadcast_to(evaluate(e, names, self.inputs, ok, "score"), s.shape).astype(np.float64)

    def scatter(self, grad: np.ndarray, load, values: np.ndarray, s: np.ndarray, ok: np.ndarray, r0: int, r1: int):
        """grad[load's indices] += values at each visible pair (ok), on rows r0..r1 (np.add.at:
        an entry read by several pairs sums them)."""
        names = dict(self._rows(r0, r1), s=s)
        idx = [np.broadcast_to(evaluate(i, names, self.inputs, ok, "score"), s.shape)[ok] for i in load.indices]
        np.add.at(grad, tuple(idx), values[ok])


def _fail(where: str, e, message: str):
    raise LaunchError(f"attngen.reference: the {where} expression: {message} in {format_expr(e)}")


def evaluate(e, names: dict, inputs: dict | None = None, live=True, where: str = "mask"):
    """e's values over `names` (numpy arrays that broadcast: s, b, h, hkv, q, k, Lq, Lk) and
    `inputs` (checked arrays by name); `live`: where the result is used (the rest reads nothing
    out of bounds and raises nothing); `where` names the expression in errors."""
    ev = lambda x, lv=live: evaluate(x, names, inputs, lv, where)  # noqa: E731
    if isinstance(e, Const):
        return np.int64(e.value) if e.type == INT else np.float64(e.value)
    if isinstance(e, Var):
        return names[e.name]
    if isinstance(e, Load):
        arr = inputs[e.input]
        idx = np.broadcast_arrays(*[ev(i) for i in e.indices], live)
        lv, idx = idx[-1], idx[:-1]
        for axis, (i, n) in enumerate(zip(idx, arr.shape)):
            bad = lv & ((i < 0) | (i >= n))
            if bad.any():
                _fail(where, e, f"index {int(i[bad].flat[0])} of axis {axis} of '{e.input}' is out of 0 .. {n - 1}")
        return arr[tuple(np.where(lv, i, 0) for i in idx)]
    if isinstance(e, Unary):
        x = ev(e.x)
        return np.logical_not(x) if e.op == "!" else -x
    if isinstance(e, Binary):
        a = ev(e.a)
        if e.op in ("&&", "||"):
            decided = ~a if e.op == "&&" else a  # where the left operand alone gives the result
            b = ev(e.b, live & ~decided)
            return (a & b) if e.op == "&&" else (a | b)
        b = ev(e.b)
        if e.op in ("//", "%"):
            zero = np.broadcast_to(b == 0, np.broadcast_shapes(np.shape(b), np.shape(live)))
            if (zero & live).any():
                _fail(where, e, "an integer division by zero")
            b = np.where(b == 0, 1, b)
            return np.floor_divide(a, b) if e.op == "//" else np.mod(a, b)
        ops = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.true_divide, "==": np.equal,
               "!=": np.not_equal, "<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal}
        with np.errstate(all="ignore"):
            return ops[e.op](np.float64(a) if e.op == "/" else a, b)
    if e.name == "where":
        c = ev(e.args[0])
        x, y = ev(e.args[1], live & c), ev(e.args[2], live & ~c)
        return np.where(c, x, y)
    args = [ev(a) for a in e.args]
    with np.errstate(all="ignore"):
        if e.name == "floor":
            if e.args[0].type == INT:
                return args[0]
            x = np.floor(args[0])
            bad = np.broadcast_to(~(np.abs(x) < 2.0**62), np.broadcast_shapes(np.shape(x), np.shape(live))) & live
            if bad.any():
                _fail(where, e, "floor of a non-finite or huge value")
            return np.where(np.abs(x) < 2.0**62, x, 0).astype(np.int64)
        f = {"abs": np.abs, "min": np.minimum, "max": np.maximum, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
             "tanh": np.tanh, "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-np.float64(x))),
             "clamp": lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi)}[e.name]
        r = f(*args)
    return r.astype(np.float64) if e.type not in (INT, BOOL) else r
