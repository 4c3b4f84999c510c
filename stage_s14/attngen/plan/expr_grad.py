"""Gradients of score expressions (issue 42; docs/backward.md): symbolic derivatives as IR.

    score_ds(spec.score)              d score / d s             s - slopes[h] * abs(q - k)  ->  1
                                                                30 * tanh(s / 30)  ->  1 - tanh(s / 30) * tanh(s / 30)
    input_derivatives(score, "bias")  [(Load, d score / d Load), ...], one per distinct read of `bias`
    grad_reads(spec)                  [(input, M, Load, d score / d Load), ...] of every `grad` input

The results are attngen.lang.expr IR, simplified as they are built (`add`, `sub`, `mul`, `div`,
`neg`, `where`: constants folded, x * 1, x + 0, x - 0, x / 1, 0 * x, --x removed, the constant
factors of a product multiplied together, a `where` of equal branches dropped),
so that the backward kernels compute them per element as the forward computes the score. Their
value is always real: a result (or part of one) typed int (`s * abs(q - k)` gives `abs(q - k)`)
stands for that integer's value as a real; renderers convert it.

Where a function is not differentiable the derivative is the subgradient PyTorch's autograd
takes, so that gradients match torch's of the same score_mod:

    abs(x)           sign(x) * dx, 0 at x = 0
    min(a, b)        da where a < b, db where a > b, (da + db) / 2 where a = b (max alike)
    clamp(x, lo, hi) dlo where x < lo, dhi where x > hi, else dx (the bounds themselves go to x;
                     lo <= hi assumed, as torch.clamp's gradient does)
    where(c, a, b)   where(c, da, db): only the branch taken
    floor(x)         0 (an integer: piecewise constant), as `//` and `%` and every integer
    sqrt(x)          dx / (2 sqrt(x)): inf at 0, as torch's

`0 * x` simplifies to 0 even where x would be inf or NaN (a derivative that is identically 0
stays 0). Booleans (comparisons, `&&`, `||`, `!`) have no derivative: they only choose.
"""

from __future__ import annotations

from ..lang.expr import BOOL, INT, REAL, Binary, Const, Fn, Load, Unary, Var, walk

ZERO, ONE = Const(0.0, REAL), Const(1.0, REAL)


def _is(e, value) -> bool:
    return isinstance(e, Const) and e.type != BOOL and e.value == value


def _const(value, t: str) -> Const:
    return Const(int(value), INT) if t == INT else Const(float(value), REAL)


def _factors(e) -> list:
    """The factors of a real product tree (through real `*` only: an integer product keeps its
    form, as it may wrap in 32 bits on a target)."""
    if isinstance(e, Binary) and e.op == "*" and e.type == REAL:
        return _factors(e.a) + _factors(e.b)
    return [e]


def mul(a, b):
    """a * b, simplified: constant factors multiplied together (first), 0 and 1 removed."""
    t = REAL if REAL in (a.type, b.type) else INT
    factors = _factors(a) + _factors(b)
    c, rest = 1, []
    for f in factors:
        if isinstance(f, Const):
            c = c * f.value
        else:
            rest.append(f)
    if c == 0:
        return _const(0, t)
    out = None
    for f in rest:
        out = f if out is None else Binary("*", out, f, t)
    if out is None:
        return _const(c, t)
    if c == 1:
        return out  # (an integer factor alone stands for its value as a real)
    if c == -1:
        return neg(out)
    return Binary("*", _const(c, t), out, t)


def add(a, b):
    t = REAL if REAL in (a.type, b.type) else INT
    if isinstance(a, Const) and isinstance(b, Const):
        return _const(a.value + b.value, t)
    if _is(a, 0):
        return b
    if _is(b, 0):
        return a
    if isinstance(b, Unary) and b.op == "-":
        return sub(a, b.x)
    return Binary("+", a, b, t)


def sub(a, b):
    t = REAL if REAL in (a.type, b.type) else INT
    if isinstance(a, Const) and isinstance(b, Const):
        return _const(a.value - b.value, t)
    if _is(b, 0):
        return a
    if _is(a, 0):
        return neg(b)
    if isinstance(b, Unary) and b.op == "-":
        return add(a, b.x)
    return Binary("-", a, b, t)


def neg(a):
    if isinstance(a, Const):
        return _const(-a.value, a.type)
    if isinstance(a, Unary) and a.op == "-":
        return a.x
    return Unary("-", a, a.type)


def div(a, b):
    """a / b (real)."""
    if _is(a, 0):
        return ZERO
    if _is(b, 1):
        return a
    if isinstance(b, Const) and b.value != 0:
        return mul(a, Const(1.0 / b.value, REAL))
    return Binary("/", a, b, REAL)


def where(c, a, b):
    if a == b:
        return a
    if isinstance(c, Const):
        return a if c.value else b
    return Fn("where", (c, a, b), REAL)


def _cmp(op: str, a, b):
    return Binary(op, a, b, BOOL)


def derivative(e, wrt):
    """d e / d wrt, simplified, where `wrt` is Var s or a Load node (every equal Load is the same
    value: the same input entry). Integer and boolean expressions have derivative 0."""
    if e.type != REAL:
        return ZERO
    if e == wrt:
        return ONE
    if isinstance(e, (Const, Var, Load)):
        return ZERO
    d = lambda x: derivative(x, wrt)  # noqa: E731
    if isinstance(e, Unary):
        return neg(d(e.x))
    if isinstance(e, Binary):
        a, b = e.a, e.b
        if e.op == "+":
            return add(d(a), d(b))
        if e.op == "-":
            return sub(d(a), d(b))
        if e.op == "*":
            return add(mul(d(a), b), mul(a, d(b)))
        # a / b: da / b - a db / b^2
        return sub(div(d(a), b), div(mul(a, d(b)), mul(b, b)))
    x = e.args
    if e.name == "where":
        return where(x[0], d(x[1]), d(x[2]))
    if e.name == "abs":
        dx = d(x[0])
        if _is(dx, 0):
            return ZERO
        return where(_cmp(">", x[0], ZERO), dx, where(_cmp("<", x[0], ZERO), neg(dx), ZERO))
    if e.name in ("min", "max"):
        da, db = d(x[0]), d(x[1])
        first = "<" if e.name == "min" else ">"  # where a is the result
        return where(_cmp(first, x[0], x[1]), da, where(_cmp(first, x[1], x[0]), db, mul(Const(0.5, REAL), add(da, db))))
    if e.name == "clamp":
        return where(_cmp("<", x[0], x[1]), d(x[1]), where(_cmp(">", x[0], x[2]), d(x[2]), d(x[0])))
    dx = d(x[0])
    if _is(dx, 0):
        return ZERO
    if e.name == "exp":
        outer = e
    elif e.name == "log":
        return div(dx, x[0])
    elif e.name == "sqrt":
        return div(dx, mul(Const(2.0, REAL), e))
    elif e.name == "tanh":
        outer = sub(ONE, mul(e, e))
    else:  # sigmoid
        outer = mul(e, sub(ONE, e))
    return mul(dx, outer) if isinstance(dx, Const) else mul(outer, dx)


def score_ds(score):
    """d score / d s of a score expression (None: no expression, the derivative is 1)."""
    return None if score is None else derivative(score, Var("s", REAL))


def as_real(e):
    """`e`, typed real: an integer result (`abs(q - k)`) becomes 1.0 * it (the IR has no
    conversion node; a renderer converts the integer operand of a real product)."""
    if e.type == REAL:
        return e
    if isinstance(e, Const):
        return Const(float(e.value), REAL)
    return Binary("*", ONE, e, REAL)


def loads_of(e, name: str) -> list:
    """The distinct reads of input `name` in `e`, in order of first appearance."""
    out = []
    for n in walk(e):
        if isinstance(n, Load) and n.input == name and n not in out:
            out.append(n)
    return out


def input_derivatives(score, name: str) -> list:
    """[(Load, d score / d that Load)] for each distinct read of input `name` by the score: an
    entry's gradient sums, over every visible pair and every read that names it, dS (d loss /
    d score) times that read's derivative."""
    return [(ld, derivative(score, ld)) for ld in loads_of(score, name)]


def grad_inputs(spec) -> list:
    """The spec's `grad` inputs (attngen.lang.expr.Input), in declaration order."""
    return [i for i in spec.inputs if i.grad]


def grad_reads(spec) -> list:
    """(input, M, Load, d score / d Load as a real) of every distinct read of every `grad` input,
    M counting an input's reads from 1 (the order of input_derivatives)."""
    return [(inp, m, ld, as_real(d)) for inp in grad_inputs(spec)
            for m, (ld, d) in enumerate(input_derivatives(spec.score, inp.name), 1)]
