"""attngen.plan.expr_reads: which reads are in bounds in every call, and what a target may
evaluate once per row (ALiBi's slopes[h])."""

import attngen
from attngen.lang.expr import Load, Var, format_expr, walk
from attngen.plan.expr_reads import hoist_item_reads, in_bounds


def _spec(lines: str):
    (s,) = attngen.parse("attention t {\n    head_dim 64\n    heads q=6 kv=2\n    dtype f32\n" + lines + "\n}\n", "t.attn")
    return s


def _reads(s) -> dict:
    return {format_expr(n): in_bounds(n, s.inputs) for n in walk(s.score) if isinstance(n, Load)}


def test_reads_in_bounds_in_every_call():
    s = _spec("    input a[h] f32\n    input t[h, 2047] f32\n    input u[b, q] f32\n    input c[4] f32\n"
              "    score s - a[h] * abs(q - k) + t[h, clamp(k - q, -1023, 1023) + 1023] + u[b, q]"
              " + c[k % 8] + c[clamp(q, 0, 3)] + t[hkv, 0] + u[b, k] + t[h, k - q + 1023]")
    assert _reads(s) == {"a[h]": True, "t[h, clamp(k - q, -1023, 1023) + 1023]": True, "u[b, q]": True,
                         "c[k % 8]": False, "c[clamp(q, 0, 3)]": True,
                         "t[hkv, 0]": False,  # axis h indexed by hkv: not the axis's own name
                         "u[b, k]": False, "t[h, k - q + 1023]": False}


def test_item_reads_are_hoisted_once_each():
    s = _spec("    input a[h] f32\n    input w[b] f32\n    input c[4] f32\n"
              "    score where(q > 3, s - a[h] * abs(q - k), s * (a[h] * w[b])) + c[k % 8] + exp(c[2] * Lk)")
    residual, items = hoist_item_reads(s.score, s.inputs)
    assert [format_expr(x) for x in items] == ["a[h]", "a[h] * w[b]", "exp(c[2] * Lk)"]
    assert format_expr(residual) == "where(q > 3, s - item0 * abs(q - k), s * item1) + c[k % 8] + item2"
    assert Var("item1", "real") in set(walk(residual))
    # the read that stays is the spec's own node (targets number reads by identity)
    kept = [n for n in walk(residual) if isinstance(n, Load)]
    assert any(n is m for n in kept for m in walk(s.score))


def test_nothing_to_hoist_keeps_the_expression():
    s = _spec("    input t[h, 32] f32\n    score s + t[h, min(abs(k - q), 31)]")
    residual, items = hoist_item_reads(s.score, s.inputs)
    assert items == () and residual is s.score
