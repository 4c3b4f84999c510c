"""Typing the syntax tree of a `score` or `mask` expression into the IR of attngen.lang.expr.

`Checker` types every node (int, real or bool) and reports every problem through the reader's
error function (file:line:col, a caret under the sub-expression, a hint), so that a file's
errors come all at once. The reader (attngen.lang.reader) calls it once per expression, after
the block's `input` lines are read.
"""

from __future__ import annotations

import operator

import numpy as np

from ..errors import clip, did_you_mean
from ..limits import INT32_MAX
from .expr import (BOOL, FUNCTIONS, INT, NAMED_MASKS, REAL, REAL_FUNCTIONS, VARS, Binary, Const, Fn, Load,
                   Unary, Var, children, fold_int, format_expr, walk)
from .syntax import Binary as SynBinary, Call as SynCall, Index as SynIndex, Number, Pair, Unary as SynUnary, Word

_TYPE_WORDS = {INT: "an integer", REAL: "a real", BOOL: "a boolean"}
F32_MAX = 3.4028234663852886e38


def _is_constant(e) -> bool:
    """Whether e reads no index, s nor input."""
    return not any(isinstance(n, (Var, Load)) for n in walk(e))


def _constant_value(e):
    """The float64 value of a constant expression (None where it divides an integer by zero or
    takes floor of a non-finite value: the reference refuses those where they are used)."""
    with np.errstate(all="ignore"):
        return _fold(e)


_BINARY = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv, "%": operator.mod,
           "/": lambda a, b: np.float64(a) / np.float64(b), "&&": lambda a, b: a and b,
           "||": lambda a, b: a or b, "==": operator.eq, "!=": operator.ne, "<": operator.lt,
           "<=": operator.le, ">": operator.gt, ">=": operator.ge}
_FUNCTIONS = {"abs": abs, "min": min, "max": max, "clamp": lambda x, lo, hi: min(max(x, lo), hi),
              "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "tanh": np.tanh,
              "sigmoid": lambda x: 1 / (1 + np.exp(-np.float64(x))), "where": lambda c, a, b: a if c else b}


def _fold(e):
    if isinstance(e, Const):
        return np.float64(e.value) if e.type == REAL else e.value
    vals = [_fold(c) for c in children(e)]
    if any(v is None for v in vals):
        return None
    if isinstance(e, Unary):
        return (not vals[0]) if e.op == "!" else -vals[0]
    if isinstance(e, Binary):
        if e.op in ("//", "%") and vals[1] == 0:
            return None
        return _BINARY[e.op](*vals)
    if e.name == "floor":
        return int(np.floor(vals[0])) if np.isfinite(vals[0]) else None
    return _FUNCTIONS[e.name](*(np.float64(v) if e.name in REAL_FUNCTIONS else v for v in vals))


class Checker:
    """Types the syntax tree of one `score` or `mask` expression into IR.

    `error(message, span, hint)` receives every problem (the reader's); `inputs` maps the
    block's input names to their Input; reads of the `bad` ones (declared with an error, already
    reported) are not reported again. `check` returns the IR, or None after an error."""

    def __init__(self, error, inputs: dict, where: str, bad=frozenset()):
        self.error, self.inputs, self.where, self.bad = error, inputs, where, bad

    def check(self, node):
        e = self.expr(node)
        if e is None:
            return None
        if self.where == "mask" and e.type != BOOL:
            self.error(f"a mask must be a boolean expression; this is {_TYPE_WORDS[e.type]}", node.span,
                       "compare positions, e.g. mask k <= q")
            return None
        if self.where == "score" and e.type != REAL:
            hint = ("a boolean decides visibility: write it as a mask" if e.type == BOOL
                    else "a score is real: start from s, e.g. score s - 0.5 * abs(q - k)")
            self.error(f"a score must be a real expression; this is {_TYPE_WORDS[e.type]}", node.span, hint)
            return None
        return e

    def expr(self, node):
        method = {Word: self.word, Number: self.number, SynCall: self.call, SynIndex: self.index,
                  SynUnary: self.unary, SynBinary: self.binary}.get(type(node))
        if method is None:  # a pair outside a call's arguments
            self.error(f"unexpected '{clip(node.show())}' in an expression", node.span,
                       "names are given no values here: write a comparison with =="
                       if isinstance(node, Pair) else None)
            return None
        e = method(node)
        if e is not None and e.type == REAL and not isinstance(e, Const) and _is_constant(e):
            v = _constant_value(e)
            if v is not None and not abs(v) <= F32_MAX:  # NaN too
                self.error(f"the constant {clip(format_expr(e), 40)} is {'undefined' if v != v else 'not finite'} "
                           "(reals are f32 in kernels)", node.span,
                           "constants must be finite; use e.g. -1e30, or a mask")
                return None
        if e is not None and e.type == INT and not isinstance(e, Const) and _is_constant(e):
            v = _constant_value(e)
            if v is not None and not -INT32_MAX - 1 <= v <= INT32_MAX:  # kernels' i32 would wrap it
                self.error(f"the constant {clip(format_expr(e), 40)} = {v} is out of range (|n| <= {INT32_MAX}: "
                           "index arithmetic is 32-bit)", node.span, "integers in kernels are 32-bit and wrap")
                return None
        return e

    def word(self, node: Word):
        name = node.text
        if name in VARS:
            if name == "s" and self.where == "mask":
                self.error("a mask cannot read the score s (it decides which keys are scored)", node.span,
                           "use s in `score`, e.g. score where(k <= q, s, -1e30) ... or mask on positions")
                return None
            return Var(name, VARS[name])
        if name in self.inputs:
            axes = ", ".join(str(a) for a in self.inputs[name].axes)
            self.error(f"input '{name}' is a tensor: index it", node.span, f"write: {name}[{axes}]")
        elif name in FUNCTIONS:
            self.error(f"'{name}' is a function: call it", node.span,
                       f"write: {name}({', '.join(FUNCTIONS[name])})")
        elif name in NAMED_MASKS:
            self.error(f"the named mask '{name}' is not part of an expression", node.span,
                       "write it as an expression, e.g. causal is k <= q" if name == "causal" else
                       "a named mask stands alone on its line; combined, write the rule, e.g. k <= q")
        elif name in ("nan", "inf", "infinity"):
            self.error(f"'{name}' is not a constant of the language (constants are finite)", node.span,
                       "use a large finite number, e.g. -1e30, or a mask")
        else:
            known = list(VARS) + list(self.inputs)
            hint = did_you_mean(name, known) or f"names: {', '.join(VARS)}" + (
                f"; inputs: {', '.join(self.inputs)}" if self.inputs else "")
            self.error(f"unknown name '{clip(name)}'", node.span, hint)
        return None

    def number(self, node: Number):
        v = node.value
        if isinstance(v, int):
            if abs(v) > INT32_MAX:
                self.error(f"integer constant {clip(node.text, 24)} is out of range (|n| <= {INT32_MAX}: "
                           "index arithmetic is 32-bit)", node.span)
                return None
            return Const(v, INT)
        if v != v or v in (float("inf"), float("-inf")):
            self.error(f"constant {clip(node.text, 24)} is not finite (it overflows)", node.span,
                       "constants must be finite; use e.g. -1e30, or a mask")
            return None
        return Const(v, REAL)

    def _need(self, node, e, types, what: str, hint=None) -> bool:
        if e is None:
            return False
        if e.type in types:
            return True
        self.error(f"{what} needs {' or '.join(_TYPE_WORDS[t] for t in types)}, not {_TYPE_WORDS[e.type]}",
                   node.span, hint)
        return False

    def unary(self, node: SynUnary):
        x = self.expr(node.operand)
        if node.op == "!":
            ok = self._need(node.operand, x, (BOOL,), "'!'", "compare it first, e.g. !(k < q)")
            return Unary("!", x, BOOL) if ok else None
        ok = self._need(node.operand, x, (INT, REAL), "unary '-'")
        return Unary("-", x, x.type) if ok else None

    def binary(self, node: SynBinary):
        a, b = self.expr(node.left), self.expr(node.right)
        op = node.op
        if op in ("||", "&&"):
            hint = "compare it, e.g. x != 0"
            ok = self._need(node.left, a, (BOOL,), f"'{op}'", hint) & self._need(node.right, b, (BOOL,), f"'{op}'", hint)
            return Binary(op, a, b, BOOL) if ok else None
        if op in ("==", "!="):
            if a is None or b is None:
                return None
            if (a.type == BOOL) != (b.type == BOOL):
                self.error(f"'{op}' compares a boolean with a number", node.span,
                           "compare booleans with booleans, numbers with numbers")
                return None
            return Binary(op, a, b, BOOL)
        if op in ("//", "%"):
            hint = "'//' and '%' are integer (floor) operators: for reals use '/' and floor()"
            ok = self._need(node.left, a, (INT,), f"'{op}'", hint) & self._need(node.right, b, (INT,), f"'{op}'", hint)
            if ok and fold_int(b) == 0:
                self.error(f"'{op}' by zero", node.right.span)
                return None
            return Binary(op, a, b, INT) if ok else None
        ok = self._need(node.left, a, (INT, REAL), f"'{op}'") & self._need(node.right, b, (INT, REAL), f"'{op}'")
        if not ok:
            return None
        if op in ("<", "<=", ">", ">="):
            return Binary(op, a, b, BOOL)
        return Binary(op, a, b, INT if op != "/" and a.type == b.type == INT else REAL)

    def call(self, node: SynCall):
        name = node.name
        if name not in FUNCTIONS:
            for a in node.args:
                if not isinstance(a, Pair):
                    self.expr(a)
            hint = ("a named mask stands alone on its line; combined, write the rule, e.g. k <= q + Lk - Lq"
                    if name in NAMED_MASKS else did_you_mean(name, FUNCTIONS) or
                    f"functions: {', '.join(FUNCTIONS)}")
            self.error(f"unknown function '{clip(name)}'", node.span, hint)
            return None
        args = []
        for a in node.args:
            if isinstance(a, Pair):
                self.error(f"'{name}' takes no named arguments", a.span, f"write: {name}({', '.join(FUNCTIONS[name])})")
                args.append(None)
            else:
                args.append(self.expr(a))
        params = FUNCTIONS[name]
        if len(args) != len(params):
            n = len(params)
            self.error(f"'{name}' takes {n} argument{'s' if n > 1 else ''}, not {len(args)}", node.span,
                       f"write: {name}({', '.join(params)})")
            return None
        if any(a is None for a in args):
            return None
        if name == "where":
            c, x, y = args
            ok = self._need(node.args[0], c, (BOOL,), "where's condition", "compare, e.g. where(k <= q, a, b)")
            if ok and (x.type == BOOL) != (y.type == BOOL):
                self.error("where's two branches are a boolean and a number", node.span,
                           "give both branches the same kind: numbers or booleans")
                return None
            t = BOOL if x.type == BOOL else INT if x.type == y.type == INT else REAL
            return Fn(name, tuple(args), t) if ok else None
        ok = all([self._need(n, a, (INT, REAL), f"'{name}'") for n, a in zip(node.args, args)])
        if not ok:
            return None
        if name in REAL_FUNCTIONS:
            t = REAL
        elif name == "floor":
            t = INT
        else:
            t = INT if all(a.type == INT for a in args) else REAL
        return Fn(name, tuple(args), t)

    def index(self, node: SynIndex):
        indices = [self.expr(i) for i in node.indices]
        inp = self.inputs.get(node.name)
        if inp is None and node.name in self.bad:
            return None
        if inp is None:
            if node.name in VARS or node.name in FUNCTIONS:
                self.error(f"'{node.name}' is not an input: only inputs are indexed", node.name_span,
                           "declare one: input NAME[AXES] DTYPE")
            else:
                hint = did_you_mean(node.name, self.inputs) or (
                    f"declare it: input {clip(node.name)}[...] DTYPE" if not self.inputs else
                    f"inputs: {', '.join(self.inputs)}")
                self.error(f"unknown input '{clip(node.name)}'", node.name_span, hint)
            return None
        axes = ", ".join(str(a) for a in inp.axes)
        if len(indices) != len(inp.axes):
            self.error(f"input '{inp.name}' has {len(inp.axes)} ax{'es' if len(inp.axes) > 1 else 'is'} "
                       f"({axes}), indexed with {len(indices)}", node.span, f"write: {inp.name}[{axes}]")
            return None
        ok = True
        for n, i, axis in zip(node.indices, indices, inp.axes):
            if not self._need(n, i, (INT,), "an index", "make it an integer, e.g. with floor()"):
                ok = False
                continue
            c = fold_int(i)
            if c is not None and (c < 0 or (isinstance(axis, int) and c >= axis)):
                bound = f"0 .. {axis - 1}" if isinstance(axis, int) else f"0 .. {axis} - 1"
                self.error(f"index {c} is out of range for axis {axis} of '{inp.name}' ({bound})", n.span)
                ok = False
        if self.where == "mask" and inp.type == REAL:
            self.error(f"a mask cannot read the real input '{inp.name}' ({inp.dtype}): masks read indices and "
                       "integer or boolean inputs", node.span,
                       f"add it to the score instead, e.g. score s + {inp.name}[{axes}]")
            return None
        return Load(inp.name, tuple(indices), inp.type) if ok else None
