"""Semantic checks of a spec against a target profile; every problem reported at once.

The reader has already checked the language (known keys, value ranges, heads that divide).
Here the target's backend checks what depends on the target (dtypes and features it has),
then searches its tile configuration once: a configuration that cannot work (memory,
threads, registers) is a Problem. Each message names the target and profile and the reason;
nothing is silently changed. The configuration found is the one the plan is built from, so
`attngen check` shows what `attngen build` uses.

A score expression that is exactly a soft-cap, `score C * tanh(s / C)` (or `tanh(s / C) * C`),
is planned as `softcap C` (`normalised`): the language defines the two as the same function, so
they get the same plan and the same kernels, forward and backward, on every target. So is a mask
expression that is exactly a named mask as a function of the positions (`k <= q`: `mask causal`;
`k <= q + Lk - Lq`: causal(bottom_right); `q + Lk - Lq - N <= k && k <= q + Lk - Lq + M`:
window(left=N, right=M)), whatever the arrangement of its linear inequalities (`q >= k`,
`k - q < 1`, ...): the named masks' kernels test each row's key range once, not the expression
per element.
"""

from __future__ import annotations

import functools
import math

from ..errors import Diagnostic
from ..lang import validate
from ..lang.expr import INT, REAL, Binary, Const, Fn, Unary, Var
from ..limits import INT32_MAX
from ..lang.spec import AttentionSpec, typed_key
from .kernel_plan import Problem
from .profiles import Profile


def where(profile: Profile) -> str:
    return f"target {profile.target} (profile {profile.name})"


def check(spec: AttentionSpec, backend, profile: Profile) -> tuple[object | None, list[Diagnostic]]:
    """(configuration, diagnostics) for building `spec` with `backend` on `profile`; the
    configuration is None unless the diagnostics are empty (it builds)."""
    def diagnostic(p: Problem) -> Diagnostic:
        return Diagnostic(f"{where(profile)}: {p.message}", spec.span(p.key), p.hint)

    diags = _validated(spec)  # the language's rules first, whoever built the spec
    if diags:
        return None, diags
    spec = normalised(spec)
    diags = [diagnostic(p) for p in backend.check(spec, profile)]
    config = None
    if not diags:
        try:
            config = backend.configure(spec, profile)
        except Problem as p:
            diags.append(diagnostic(p))
    return config, sorted(diags, key=Diagnostic.sort_key)


def _softcap_of(e) -> float | None:
    """C where `e` is C * tanh(s / C) or tanh(s / C) * C with the same constant C, within the
    range `softcap` takes (the reader's MIN_REAL..MAX_REAL; the reader is loaded by then: validate)."""
    from ..lang.reader import MAX_REAL, MIN_REAL
    if not (isinstance(e, Binary) and e.op == "*"):
        return None
    for c, t in ((e.a, e.b), (e.b, e.a)):
        if (isinstance(c, Const) and isinstance(t, Fn) and t.name == "tanh" and isinstance(t.args[0], Binary)
                and t.args[0].op == "/" and t.args[0].a == Var("s", REAL) and isinstance(t.args[0].b, Const)
                and t.args[0].b.value == c.value and MIN_REAL <= c.value <= MAX_REAL):
            return float(c.value)  # (as the reader reads `softcap C`)
    return None


_POSITIONS = ("q", "k", "Lq", "Lk")


def _linear(e) -> tuple | None:
    """(c_q, c_k, c_Lq, c_Lk, c_0) where integer expression `e` is c_q q + c_k k + c_Lq Lq + c_Lk Lk
    + c_0 (sums, differences, negations and products by constants of positions and constants);
    None for anything else."""
    if isinstance(e, Const) and e.type == INT:
        return (0, 0, 0, 0, int(e.value))
    if isinstance(e, Var) and e.name in _POSITIONS:
        return tuple(int(e.name == n) for n in _POSITIONS) + (0,)
    if isinstance(e, Unary) and e.op == "-":
        x = _linear(e.x)
        return None if x is None else tuple(-c for c in x)
    if isinstance(e, Binary) and e.op in ("+", "-", "*"):
        a, b = _linear(e.a), _linear(e.b)
        if a is None or b is None:
            return None
        if e.op == "*":
            if any(a[:4]) and any(b[:4]):
                return None  # a product of positions
            (k, x) = (a[4], b) if not any(a[:4]) else (b[4], a)
            return tuple(k * c for c in x)
        sign = 1 if e.op == "+" else -1
        return tuple(x + sign * y for x, y in zip(a, b))
    return None


def _constraints(e) -> set | None:
    """The set of `c . (q, k, Lq, Lk) + c_0 <= 0` (tuples, the position coefficients divided by
    their gcd, the constant rounded as integers allow) whose conjunction is boolean expression `e`:
    comparisons <, <=, >, >= of linear integer expressions joined by &&; None for anything else."""
    if isinstance(e, Binary) and e.op == "&&":
        a, b = _constraints(e.a), _constraints(e.b)
        return None if a is None or b is None else a | b
    if not (isinstance(e, Binary) and e.op in ("<", "<=", ">", ">=")):
        return None
    a, b = _linear(e.a), _linear(e.b)
    if a is None or b is None:
        return None
    lhs, rhs = (a, b) if e.op in ("<", "<=") else (b, a)
    c = [x - y for x, y in zip(lhs, rhs)]
    if e.op in ("<", ">"):
        c[4] += 1  # integers: x < 0 is x + 1 <= 0
    g = math.gcd(*c[:4])
    if g == 0:
        return None
    return {tuple(x // g for x in c[:4]) + (-((-c[4]) // g),)}  # c.x <= -c0  ->  (c/g).x <= floor(-c0/g)


def _named_mask_of(e):
    """The named mask (Mask) that is exactly mask expression `e` as a function of q, k, Lq and Lk:
    causal (`k <= q`), causal(bottom_right) (`k <= q + Lk - Lq`) or window(left=N, right=M)
    (`q + Lk - Lq - N <= k && k <= q + Lk - Lq + M`), in any arrangement of the same linear
    inequalities; None for any other expression."""
    from ..lang.spec import Mask
    cs = _constraints(e)
    if cs is None:
        return None
    if cs == {(-1, 1, 0, 0, 0)}:
        return Mask("causal")
    if cs == {(-1, 1, 1, -1, 0)}:
        return Mask("causal", bottom_right=True)
    upper = [c for c in cs if c[:4] == (-1, 1, 1, -1)]   # k - q - off <= M
    lower = [c for c in cs if c[:4] == (1, -1, -1, 1)]   # q + off - k <= N
    if len(cs) == 2 and len(upper) == 1 and len(lower) == 1:
        right, left = -upper[0][4], -lower[0][4]
        if 0 <= left <= INT32_MAX and 0 <= right <= INT32_MAX:
            return Mask("window", left=left, right=right)
    return None


def normalised(spec: AttentionSpec) -> AttentionSpec:
    """`spec` as planned: a score expression that is a soft-cap becomes `softcap C`, and a mask
    expression that is a named mask (_named_mask_of) that mask (module docstring); any other spec
    is returned as it is."""
    from dataclasses import replace
    cap = _softcap_of(spec.score) if spec.score is not None else None
    if cap is not None:
        spec = replace(spec, score=None, softcap=cap)
    named = _named_mask_of(spec.mask.expr) if spec.mask.kind == "expr" else None
    return spec if named is None else replace(spec, mask=named)


def planned_as(spec: AttentionSpec) -> tuple[str, ...]:
    """`attngen check`'s lines for what normalised() changed in `spec` (KernelPlan.notes): a score
    expression planned as `softcap C`, a mask expression planned as the named mask it is; () when
    the spec is planned as written."""
    from ..lang.expr import format_expr
    from ..lang.spec import format_mask
    planned = normalised(spec)
    notes = []
    if spec.score is not None and planned.score is None:
        notes.append(f"score {format_expr(spec.score)} is planned as softcap {planned.softcap:g} (the same function: "
                     "the kernels and their sources are softcap's)")
    if spec.mask.kind == "expr" and planned.mask.kind != "expr":
        notes.append(f"mask {format_expr(spec.mask.expr)} is planned as mask {format_mask(planned.mask)} (the same "
                     "pairs for every Lq and Lk: the named mask's kernels)")
    return tuple(notes)


def _validated(spec) -> list[Diagnostic]:
    """attngen.lang.validate, remembered per spec (a spec is checked once however often it is
    planned); an unhashable spec is invalid anyway and is checked every time."""
    try:
        key = typed_key(spec)
        hash(key)
    except TypeError:
        return validate(spec)
    return list(_validate_cached(key, spec))


@functools.lru_cache(maxsize=1024)
def _validate_cached(key, spec) -> tuple:
    """Keyed by typed_key(spec) first: specs equal in value but not in type (head_dim 32 and
    32.0) share no entry, so neither one's answer is given for the other."""
    return tuple(validate(spec))
