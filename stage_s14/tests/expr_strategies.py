"""Hypothesis strategies of random well-typed index-only expressions as spec TEXT (issue 42), so
that a test exercises the parser and the checker as well as what it compiles them to.

    masks()   boolean expressions of b, h, hkv, q, k, Lq, Lk and integer constants
    scores()  real expressions of s and the same indices

Each strategy draws a Term: the text, fully parenthesised, and a bound on the magnitude of its
value (over every index below INDEX_BOUND; for s, |s| <= S_BOUND). The bounds keep the values
where the WGSL kernel and the float64 reference agree by design (docs/language.md):

- integers stay below 2^20 in magnitude (a product is drawn only where its operands' bounds
  multiply below 2^30, then clamped): no i32 wraps;
- every `//` and `%` divides by a nonzero constant or by a guarded `1 + abs(x)`: no division by
  zero, where WGSL gives a value and the reference raises;
- reals stay within REAL_BOUND (clamped where a sum or product could leave it), `exp` takes
  arguments of at most 4 in magnitude, `/` divides by a constant or by `1 + abs(x)`, `sqrt` and
  `log` take `abs(..)` and `1 + abs(..)`: nothing overflows f32, nothing is NaN, and the f32
  rounding of a score stays within the f32 tolerance of the output;
- what decides a discontinuity (a comparison, a `where` condition, `floor`) is exact in f32: an
  integer, or an "exact" real (integers below 64 and dyadic constants under + - * and division
  by a power of two), so f32 and float64 never fall on different sides of it. `floor(s)` and
  comparisons of `s` are left out for that reason (a score one ulp from an integer would flip).

INDEX_BOUND is the tests' largest extent (batch 2, 6 query heads, lengths up to 40).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hypothesis import strategies as st

INDEX_BOUND = 40
S_BOUND = 8.0
INT_BOUND = 2**20
REAL_BOUND = 64.0
INDICES = ("b", "h", "hkv", "q", "k", "Lq", "Lk")
DIVISORS = (-7, -3, -2, 1, 2, 3, 5, 8)
REAL_DIVISORS = (-4, -2.5, -0.5, 0.5, 1.5, 2, 3, 8)
DYADIC = (-4.0, -1.5, -0.5, -0.125, 0.25, 0.5, 0.75, 1.0, 2.0, 3.5)


@dataclass(frozen=True)
class Term:
    """Spec text of one sub-expression; `bound`: |value| <= bound (booleans: 1). Which reals are
    exact in f32 is by construction: those EXACT_REALS draws."""
    text: str
    bound: float


def _lit(v) -> str:
    return f"({v})" if v < 0 else f"{v}"


def _int_clamped(t: Term, limit: int = INT_BOUND) -> Term:
    return t if t.bound <= limit else Term(f"clamp({t.text}, {-limit}, {limit})", limit)


def _real_clamped(t: Term) -> Term:
    if t.bound <= REAL_BOUND:
        return t
    return Term(f"clamp({t.text}, {-REAL_BOUND:g}, {REAL_BOUND:g})", REAL_BOUND)


# ---- integers -----------------------------------------------------------------------------------

_INT_LEAVES = st.one_of(st.sampled_from(INDICES).map(lambda n: Term(n, INDEX_BOUND)),
                        st.integers(-9, 9).map(lambda v: Term(_lit(v), abs(v))))


def _int_binary(t) -> Term:
    op, a, b = t
    if op == "*" and a.bound * b.bound <= 2**30:
        return _int_clamped(Term(f"({a.text} * {b.text})", a.bound * b.bound))
    op = "-" if op == "-" else "+"
    return _int_clamped(Term(f"({a.text} {op} {b.text})", a.bound + b.bound))


def _int_divide(t) -> Term:
    op, a, d = t
    if op == "//":
        return Term(f"({a.text} // {_lit(d)})", a.bound)
    return Term(f"({a.text} % {_lit(d)})", abs(d) - 1)


def _int_divide_guarded(t) -> Term:
    """a // (1 + abs(y)) or a % (1 + abs(y)): a divisor of at least 1, whatever y is."""
    op, a, y = t
    d = f"(1 + abs({y.text}))"
    return Term(f"({a.text} // {d})", a.bound) if op == "//" else Term(f"({a.text} % {d})", y.bound)


def _ints(inner):
    return st.one_of(
        st.tuples(st.sampled_from(["+", "-", "*"]), inner, inner).map(_int_binary),
        st.tuples(st.sampled_from(["//", "%"]), inner, st.sampled_from(DIVISORS)).map(_int_divide),
        st.tuples(st.sampled_from(["//", "%"]), inner, inner).map(_int_divide_guarded),
        inner.map(lambda x: Term(f"(-{x.text})", x.bound)),
        inner.map(lambda x: Term(f"abs({x.text})", x.bound)),
        st.tuples(st.sampled_from(["min", "max"]), inner, inner).map(
            lambda t: Term(f"{t[0]}({t[1].text}, {t[2].text})", max(t[1].bound, t[2].bound))),
        st.tuples(inner, inner, inner).map(
            lambda t: Term(f"clamp({t[0].text}, {t[1].text}, {t[2].text})", max(x.bound for x in t))),
        st.tuples(st.deferred(lambda: MASKS), inner, inner).map(
            lambda t: Term(f"where({t[0].text}, {t[1].text}, {t[2].text})", max(t[1].bound, t[2].bound))),
        st.deferred(lambda: EXACT_REALS).map(lambda x: Term(f"floor({x.text})", math.floor(x.bound) + 1)))


INTS = st.recursive(_INT_LEAVES, _ints, max_leaves=5)

# ---- exact reals (the same value in f32 and float64) --------------------------------------------


def _as_exact_real(x: Term) -> Term:
    """An integer as a real operand below 64: clamped first where it could be larger."""
    return _int_clamped(x, 64)


def _exact_binary(t) -> Term:
    op, a, b = t
    if op == "*" and a.bound * b.bound <= REAL_BOUND:
        return Term(f"({a.text} * {b.text})", a.bound * b.bound)
    op = "-" if op == "-" else "+"
    return _real_clamped(Term(f"({a.text} {op} {b.text})", a.bound + b.bound))


EXACT_REALS = st.recursive(
    st.one_of(st.sampled_from(DYADIC).map(lambda v: Term(_lit(v), abs(v))),
              st.deferred(lambda: INTS).map(_as_exact_real)),
    lambda inner: st.one_of(
        st.tuples(st.sampled_from(["+", "-", "*"]), inner, inner).map(_exact_binary),
        st.tuples(inner, st.sampled_from([2, 4, 8])).map(
            lambda t: Term(f"({t[0].text} / {t[1]})", t[0].bound / t[1])),
        inner.map(lambda x: Term(f"abs({x.text})", x.bound))),
    max_leaves=3)

# ---- booleans (masks) ---------------------------------------------------------------------------

_COMPARISONS = ["==", "!=", "<", "<=", ">", ">="]
_BOOL_LEAVES = st.one_of(
    st.tuples(st.sampled_from(_COMPARISONS), INTS, INTS).map(lambda t: Term(f"({t[1].text} {t[0]} {t[2].text})", 1)),
    st.tuples(st.sampled_from(_COMPARISONS), EXACT_REALS, INTS).map(
        lambda t: Term(f"({t[1].text} {t[0]} {t[2].text})", 1)))

MASKS = st.recursive(
    _BOOL_LEAVES,
    lambda inner: st.one_of(
        st.tuples(st.sampled_from(["&&", "||", "&&", "||", "==", "!="]), inner, inner).map(
            lambda t: Term(f"({t[1].text} {t[0]} {t[2].text})", 1)),
        inner.map(lambda x: Term(f"!{x.text}", 1)),
        st.tuples(inner, inner, inner).map(lambda t: Term(f"where({t[0].text}, {t[1].text}, {t[2].text})", 1))),
    max_leaves=4)

# ---- reals (scores) -----------------------------------------------------------------------------


def _real_binary(t) -> Term:
    op, a, b = t
    if op == "*" and a.bound * b.bound <= REAL_BOUND:
        return Term(f"({a.text} * {b.text})", a.bound * b.bound)
    op = "-" if op == "-" else "+"
    return _real_clamped(Term(f"({a.text} {op} {b.text})", a.bound + b.bound))


def _real_divide(t) -> Term:
    a, d = t
    return _real_clamped(Term(f"({a.text} / {_lit(d)})", a.bound / abs(d)))


def _exp(x: Term) -> Term:
    if x.bound > 4:
        x = Term(f"clamp({x.text}, -4, 4)", 4)
    return Term(f"exp({x.text})", math.exp(x.bound))


_REAL_LEAVES = st.one_of(
    st.just(Term("s", S_BOUND)),
    st.sampled_from([0.5, -0.125, 1.5, 2.0, -3.0, 0.3, 1e-3]).map(lambda v: Term(_lit(v), abs(v))),
    # an exact real or an integer made real (a score's leaves are all real)
    EXACT_REALS.map(lambda x: Term(f"({x.text} * 0.5)", x.bound / 2)),
    INTS.map(_as_exact_real).map(lambda x: Term(f"({x.text} / 4)", x.bound / 4)))

SCORES = st.recursive(
    _REAL_LEAVES,
    lambda inner: st.one_of(
        st.tuples(st.sampled_from(["+", "-", "*"]), inner, inner).map(_real_binary),
        st.tuples(inner, st.sampled_from(REAL_DIVISORS)).map(_real_divide),
        st.tuples(inner, inner).map(lambda t: Term(f"({t[0].text} / (1 + abs({t[1].text})))", t[0].bound)),
        inner.map(lambda x: Term(f"(-{x.text})", x.bound)),
        inner.map(_exp),
        inner.map(lambda x: Term(f"tanh({x.text})", 1)),
        inner.map(lambda x: Term(f"sigmoid({x.text})", 1)),
        inner.map(lambda x: Term(f"sqrt(abs({x.text}))", math.sqrt(x.bound))),
        inner.map(lambda x: Term(f"log(1 + abs({x.text}))", math.log1p(x.bound))),
        st.tuples(st.sampled_from(["min", "max"]), inner, inner).map(
            lambda t: Term(f"{t[0]}({t[1].text}, {t[2].text})", max(t[1].bound, t[2].bound))),
        st.tuples(inner, inner, inner).map(
            lambda t: Term(f"clamp({t[0].text}, {t[1].text}, {t[2].text})", max(x.bound for x in t))),
        st.tuples(MASKS, inner, inner).map(
            lambda t: Term(f"where({t[0].text}, {t[1].text}, {t[2].text})", max(t[1].bound, t[2].bound)))),
    max_leaves=5)


def masks():
    """Boolean mask expressions (Terms) of the indices."""
    return MASKS


def scores():
    """Real score expressions (Terms) of s and the indices; most of them read s."""
    return st.one_of(SCORES, st.tuples(SCORES, st.sampled_from(["+", "-"])).map(
        lambda t: Term(f"s {t[1]} {t[0].text}", t[0].bound + S_BOUND)))
