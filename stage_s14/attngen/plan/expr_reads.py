"""An expression's reads of inputs (issue 42): which are inside their tensors whatever the call,
and which a target may evaluate once per row of a work item instead of at every pair.

A read is in bounds when every index is inside its axis for any call the runtime accepts: an axis
b, h, hkv, q or k indexed by that very name (the call's extent is the axis's, and the index never
leaves it), a fixed axis (an integer) by an integer expression whose interval
(attngen.plan.expr_blocks.interval, over every position and head the limits allow) lies inside
it: `table[h, clamp(k - q, -1023, 1023) + 1023]` of `input table[h, 2047]`. Such a read can
never report an error, so a target may drop its bounds test and evaluate it where the language's
`&&`, `||` or `where` would not (the same function: a read in bounds has no effect but its value).
"""

from __future__ import annotations

from dataclasses import replace

from ..lang.expr import INT, Binary, Fn, Load, Unary, Var, walk
from ..limits import INT32_MAX, MAX_HEADS, MAX_SEQ_LEN
from .expr_blocks import interval

# The names that stay the same over a work item's keys and rows (the query head h too, per row).
ITEM_NAMES = ("b", "h", "hkv", "Lq", "Lk")
# Every value each name may take in a call the runtime accepts.
_ANY_CALL = {"b": (0, INT32_MAX), "h": (0, MAX_HEADS - 1), "hkv": (0, MAX_HEADS - 1), "q": (0, MAX_SEQ_LEN - 1),
             "k": (0, MAX_SEQ_LEN - 1), "Lq": (1, MAX_SEQ_LEN), "Lk": (1, MAX_SEQ_LEN)}


def in_bounds(load: Load, inputs) -> bool:
    """Whether every index of `load` is inside its axis in every call (module docstring);
    `inputs`: the spec's declarations."""
    decl = next((i for i in inputs if i.name == load.input), None)
    if decl is None or len(decl.axes) != len(load.indices):
        return False
    for axis, index in zip(decl.axes, load.indices):
        if isinstance(axis, int):
            r = interval(index, _ANY_CALL) if index.type == INT else None
            if r is None or r[0] < 0 or r[1] >= axis:
                return False
        elif index != Var(axis, INT):
            return False
    return True


def hoist_item_reads(e, inputs) -> tuple:
    """Split `e` into (residual, hoisted): `hoisted` the distinct largest subexpressions that read
    inputs, all in bounds, and use no name but those of ITEM_NAMES, so that a target may evaluate
    each once per row of a work item instead of at every pair (ALiBi's slopes[h]); `residual` is
    `e` with the i-th of them replaced by Var(f"item{i}", its type). A node whose parts stay is
    kept itself (targets number their reads by identity); the indices of a read are not split."""
    hoisted: list = []

    def item_only(n) -> bool:
        loads = [x for x in walk(n) if isinstance(x, Load)]
        return (bool(loads) and all(in_bounds(x, inputs) for x in loads)
                and all(x.name in ITEM_NAMES for x in walk(n) if isinstance(x, Var)))

    def go(n):
        if item_only(n):
            if n not in hoisted:
                hoisted.append(n)
            return Var(f"item{hoisted.index(n)}", n.type)
        if isinstance(n, Unary):
            x = go(n.x)
            return n if x is n.x else replace(n, x=x)
        if isinstance(n, Binary):
            a, b = go(n.a), go(n.b)
            return n if a is n.a and b is n.b else replace(n, a=a, b=b)
        if isinstance(n, Fn):
            args = tuple(go(a) for a in n.args)
            return n if all(x is y for x, y in zip(args, n.args)) else replace(n, args=args)
        return n
    return go(e), tuple(hoisted)
