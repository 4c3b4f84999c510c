"""Formulas over the run-time sizes, as plans and manifests write them.

Grids, dispatch sizes and workspace shapes are strings such as "ceil(Lq * G / 64) * S" over
the symbols B, Lq, Lk, Hq, Hkv, G, S, SM, ... (each target's manifest lists its symbols). The
grammar is small: integers, names, `+`, `*`, `ceil(a / b)` (exact integer division
rounded up) and `min(a, b)`; nothing else is accepted. A runtime evaluates the same strings a foreign
runtime reads from the manifest, so both launch the same thing.
"""

from __future__ import annotations

import ast
import functools


def evaluate(formula: str, sizes: dict) -> int:
    """The value of one formula for the run-time `sizes` (symbol -> int)."""
    return _compiled(formula)(sizes)


def evaluate_all(formulas, **sizes: int) -> tuple[int, ...]:
    """The values of several formulas (a grid's three, a workspace's shape)."""
    return tuple(evaluate(f, sizes) for f in formulas)


@functools.lru_cache(maxsize=4096)
def _compiled(formula: str):
    """A function of the sizes for one formula (parsed once: launches repeat their formulas)."""
    tree = ast.parse(str(formula), mode="eval").body

    def build(node):
        if isinstance(node, ast.Constant) and type(node.value) is int:
            value = node.value
            return lambda sizes: value
        if isinstance(node, ast.Name):
            name = node.id

            def symbol(sizes):
                if name not in sizes:
                    raise ValueError(f"unknown symbol {name!r} in formula {formula!r}")
                return sizes[name]
            return symbol
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            a, b = build(node.left), build(node.right)
            if isinstance(node.op, ast.Add):
                return lambda sizes: a(sizes) + b(sizes)
            return lambda sizes: a(sizes) * b(sizes)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "ceil"
                and len(node.args) == 1 and isinstance(node.args[0], ast.BinOp)
                and isinstance(node.args[0].op, ast.Div)):
            a, b = build(node.args[0].left), build(node.args[0].right)
            return lambda sizes: -(-a(sizes) // b(sizes))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "min"
                and len(node.args) == 2 and not node.keywords):
            a, b = build(node.args[0]), build(node.args[1])
            return lambda sizes: min(a(sizes), b(sizes))
        raise ValueError(f"unexpected term in formula {formula!r}: {ast.dump(node)}")
    return build(tree)
