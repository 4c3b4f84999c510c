"""Which (query tile, key tile) pairs a mask expression skips, takes whole, or must test per
element: interval analysis over the tile's index ranges, target-neutral (issue 42).

    classify(expr, q=(0, 63), k=(64, 127), len_q=1024, len_k=1024)  ->  SKIP, FULL or PARTIAL

Each integer sub-expression gets an interval [lo, hi] that holds every value it takes over the
ranges (b, h, hkv, q and k each a range; Lq and Lk exact), each boolean one the values it may
take ((0, 0) never, (1, 1) always, (0, 1) either). The analysis is sound, never exact: SKIP
means no element of the tile is visible, FULL that every element is; PARTIAL is always a safe
answer, and is the answer for whatever the analysis does not follow (reals, inputs' values).
Python integers: no overflow.
"""

from __future__ import annotations

import functools

import numpy as np

from ..lang.expr import BOOL, INT, Binary, Const, Fn, Load, Unary, Var, walk
from ..limits import INT32_MAX, MAX_HEADS

SKIP, PARTIAL, FULL = 0, 1, 2
_EITHER = (0, 1)


def index_only(expr) -> bool:
    """Whether a mask reads indices and lengths only (no input): the analysis sees all of it."""
    return not any(isinstance(n, Load) for n in walk(expr))


def classify(expr, q: tuple, k: tuple, len_q: int, len_k: int, b: tuple | None = None,
             h: tuple | None = None, hkv: tuple | None = None) -> int:
    """SKIP, FULL or PARTIAL for the rows q[0]..q[1] and keys k[0]..k[1] (inclusive) of a
    boolean mask expression; b, h, hkv default to every batch index and head."""
    env = {"q": tuple(q), "k": tuple(k), "Lq": (len_q, len_q), "Lk": (len_k, len_k),
           "b": tuple(b) if b is not None else (0, INT32_MAX),
           "h": tuple(h) if h is not None else (0, MAX_HEADS - 1),
           "hkv": tuple(hkv) if hkv is not None else (0, MAX_HEADS - 1)}
    r = interval(expr, env)
    return SKIP if r == (0, 0) else FULL if r == (1, 1) else PARTIAL


def block_map(expr, len_q: int, len_k: int, tile_q: int, tile_k: int, **ranges) -> np.ndarray:
    """(ceil(Lq / tile_q), ceil(Lk / tile_k)) int8 array of SKIP / PARTIAL / FULL; the last
    tiles are cut at Lq and Lk. `ranges`: b, h, hkv as for classify."""
    nq, nk = -(-len_q // tile_q), -(-len_k // tile_k)
    out = np.empty((nq, nk), np.int8)
    for i in range(nq):
        rows = (i * tile_q, min(len_q, (i + 1) * tile_q) - 1)
        for j in range(nk):
            keys = (j * tile_k, min(len_k, (j + 1) * tile_k) - 1)
            out[i, j] = classify(expr, rows, keys, len_q, len_k, **ranges)
    return out


def interval(e, env: dict) -> tuple | None:
    """[lo, hi] of an integer node, (0|1, 0|1) of a boolean one; None: not followed (a real,
    an input's integer values)."""
    if isinstance(e, Const):
        return (e.value, e.value) if e.type == INT else None
    if isinstance(e, Var):
        return env.get(e.name)
    if isinstance(e, Load):
        return _EITHER if e.type == BOOL else None
    if e.type not in (INT, BOOL):
        return None
    if isinstance(e, Unary):
        x = interval(e.x, env)
        if e.op == "!":
            x = x or _EITHER
            return (1 - x[1], 1 - x[0])
        return None if x is None else (-x[1], -x[0])
    if isinstance(e, Binary):
        return _binary(e, env)
    return _fn(e, env)


def _binary(e, env):
    a = interval(e.a, env)
    if e.op in ("&&", "||"):
        a = a or _EITHER
        if a == ((0, 0) if e.op == "&&" else (1, 1)):  # decided by the left operand
            return a
        b = interval(e.b, env) or _EITHER
        if e.op == "&&":
            return (a[0] & b[0], a[1] & b[1])
        return (a[0] | b[0], a[1] | b[1])
    b = interval(e.b, env)
    if e.type == BOOL:  # a comparison
        if a is None or b is None:
            return _EITHER
        return _compare(e.op, a, b)
    if a is None or b is None:
        return None
    if e.op == "+":
        return (a[0] + b[0], a[1] + b[1])
    if e.op == "-":
        return (a[0] - b[1], a[1] - b[0])
    if e.op == "*":
        c = [x * y for x in a for y in b]
        return (min(c), max(c))
    if b[0] <= 0 <= b[1]:
        return None  # a divisor that may be 0 (or change sign)
    if e.op == "//":  # floor division is monotone in each operand on either side of 0
        c = [x // y for x in a for y in b]
        return (min(c), max(c))
    # %: the sign of the divisor; one constant divisor over one quotient keeps the order
    if b[0] == b[1] and a[0] // b[0] == a[1] // b[0]:
        return (a[0] % b[0], a[1] % b[0])
    return (0, b[1] - 1) if b[0] > 0 else (b[0] + 1, 0)


def _compare(op, a, b):
    lt = (1, 1) if a[1] < b[0] else (0, 0) if a[0] >= b[1] else _EITHER
    le = (1, 1) if a[1] <= b[0] else (0, 0) if a[0] > b[1] else _EITHER
    if op in ("<", "<="):
        return lt if op == "<" else le
    if op in (">", ">="):  # a > b is b < a
        return _compare("<" if op == ">" else "<=", b, a)
    if a[0] == a[1] == b[0] == b[1]:
        eq = (1, 1)
    elif a[1] < b[0] or b[1] < a[0]:
        eq = (0, 0)
    else:
        eq = _EITHER
    return eq if op == "==" else (1 - eq[1], 1 - eq[0])


def _fn(e, env):
    if e.name == "where":
        c = interval(e.args[0], env) or _EITHER
        if c == (1, 1):
            return interval(e.args[1], env)
        if c == (0, 0):
            return interval(e.args[2], env)
        x, y = interval(e.args[1], env), interval(e.args[2], env)
        if x is None or y is None:
            return _EITHER if e.type == BOOL else None
        return (min(x[0], y[0]), max(x[1], y[1]))
    args = [interval(a, env) for a in e.args]
    if any(a is None for a in args):
        return None  # floor of a real
    if e.name == "abs":
        lo, hi = args[0]
        return (lo, hi) if lo >= 0 else (-hi, -lo) if hi <= 0 else (0, max(-lo, hi))
    if e.name in ("min", "max"):
        f = min if e.name == "min" else max
        return (f(args[0][0], args[1][0]), f(args[0][1], args[1][1]))
    if e.name == "clamp":
        (xl, xh), (ll, lh), (hl, hh) = args
        return (min(max(xl, ll), hl), min(max(xh, lh), hh))
    if e.name == "floor":
        return args[0]
    return None


# The lengths at which has_holes looks for holes: square, and Lq != Lk either way, odd included.
HOLE_PROBES = ((1024, 1024), (4096, 4096), (1000, 3001), (3001, 1000))


@functools.lru_cache(maxsize=64)
def later_rows_see_more(expr, tile_q: int, tile_k: int, length: int = 4096) -> bool:
    """Whether the query tiles of mask expression `expr` see more key tiles the later they come
    (non-SKIP tiles per row of query tiles non-decreasing, the last row seeing more than the
    first) at Lq = Lk = `length` with b, h and hkv 0, as causal's do: a plan-time test by which
    persistent kernels take such rows longest first (the order is a balance heuristic; any
    answer is correct)."""
    live = (block_map(expr, length, length, tile_q, tile_k, b=(0, 0), h=(0, 0), hkv=(0, 0)) != SKIP).sum(axis=1)
    return bool(len(live) > 1 and (np.diff(live) >= 0).all() and live[-1] > live[0])


@functools.lru_cache(maxsize=64)
def has_holes(expr, tile_q: int, tile_k: int) -> bool:
    """Whether some row of query tiles of mask expression `expr` has a SKIP key tile between two
    that are not (a hole of its key range: a 2D neighbourhood, a dilated window), at the
    lengths of HOLE_PROBES with b, h and hkv 0: a plan-time test, so that kernels keep the
    contiguous key range where the expression has none there. It is a sample, not a proof:
    holes that only appear at other lengths are then visited and masked, never wrong."""
    for len_q, len_k in HOLE_PROBES:
        live = block_map(expr, len_q, len_k, tile_q, tile_k, b=(0, 0), h=(0, 0), hkv=(0, 0)) != SKIP
        for row in live:
            at = np.flatnonzero(row)
            if len(at) and at[-1] - at[0] + 1 > len(at):
                return True
    return False


def describe(plan, does: str, length: int = 4096) -> list[str]:
    """`attngen check`'s line for a mask expression: how the plan's tiles of a Lq = Lk = `length`
    sequence classify, then `does` (the target's words for what its kernels do with that); [] for
    other masks."""
    if plan.spec.mask.kind != "expr":
        return []
    while length > 256 and -(-length // plan.tile_q) * -(-length // plan.tile_kv) > 16384:
        length //= 2  # small tiles: a shorter sequence, so that check stays quick
    m = block_map(plan.spec.mask.expr, length, length, plan.tile_q, plan.tile_kv)
    n = m.size
    share = {name: 100.0 * int((m == v).sum()) / n for name, v in (("hidden", SKIP), ("visible", FULL),
                                                                    ("mixed", PARTIAL))}
    reads = "" if index_only(plan.spec.mask.expr) else " (the inputs' values are unknown here: mixed)"
    return [f"mask expression: by interval analysis, of the {n} tiles ({plan.tile_q} x {plan.tile_kv}) of Lq = Lk = "
            f"{length}: {share['hidden']:.1f}% wholly hidden, {share['visible']:.1f}% wholly visible, "
            f"{share['mixed']:.1f}% mixed{reads}; {does}"]
