"""Block classification of mask expressions by interval analysis (attngen.plan.expr_blocks):
sound against brute force on random small tiles (never SKIP or FULL where an element disagrees),
and exact where the rule is a band (causal, windows), so that it is worth having."""

from __future__ import annotations

import numpy as np
import pytest

from attngen.plan.expr_blocks import FULL, PARTIAL, SKIP, block_map, classify, describe, has_holes, index_only

from conftest import spec_of

# (mask expression, the same rule in numpy over q (rows), k (keys), Lq, Lk, b)
CASES = {
    "causal": ("k <= q", lambda q, k, lq, lk, b: k <= q),
    "causal bottom right": ("k <= q + Lk - Lq", lambda q, k, lq, lk, b: k <= q + lk - lq),
    "window": ("q - 5 <= k && k <= q + 2", lambda q, k, lq, lk, b: (q - 5 <= k) & (k <= q + 2)),
    "window abs": ("abs(q - k) <= 3", lambda q, k, lq, lk, b: np.abs(q - k) <= 3),
    "prefix": ("k <= q || k < 7", lambda q, k, lq, lk, b: (k <= q) | (k < 7)),
    "prefix per batch": ("k <= q || k < 3 * b + 1", lambda q, k, lq, lk, b: (k <= q) | (k < 3 * b + 1)),
    "2d neighbourhood": ("abs(q // 6 - k // 6) <= 1 && abs(q % 6 - k % 6) <= 1",
                         lambda q, k, lq, lk, b: (np.abs(q // 6 - k // 6) <= 1) & (np.abs(q % 6 - k % 6) <= 1)),
    "swin windows": ("q // 9 == k // 9", lambda q, k, lq, lk, b: q // 9 == k // 9),
    "chunked causal": ("k // 4 <= q // 4 && !(k > q + 1)",
                       lambda q, k, lq, lk, b: (k // 4 <= q // 4) & ~(k > q + 1)),
    "where and clamp": ("where(q < 10, k <= q, k >= clamp(q - 3, 0, 20))",
                        lambda q, k, lq, lk, b: np.where(q < 10, k <= q, k >= np.clip(q - 3, 0, 20))),
    "min max mod": ("min(q, 12) - max(k, 2) >= -1 || (q - k) % 5 == 0",
                    lambda q, k, lq, lk, b: (np.minimum(q, 12) - np.maximum(k, 2) >= -1) | ((q - k) % 5 == 0)),
    "negative divisor": ("(q - k) // -3 >= -2 && k * 2 - q != 7",
                         lambda q, k, lq, lk, b: ((q - k) // -3 >= -2) & (k * 2 - q != 7)),
}


def mask_expr(text):
    return spec_of(f"head_dim 64\ndtype f16\nmask {text}").mask.expr


@pytest.mark.parametrize("name", CASES)
def test_classification_is_sound_on_random_tiles(name):
    text, rule = CASES[name]
    e = mask_expr(text)
    assert index_only(e)
    rng = np.random.default_rng(sum(map(ord, name)))
    seen = {SKIP: 0, PARTIAL: 0, FULL: 0}
    for _ in range(300):
        lq, lk = (int(x) for x in rng.integers(1, 48, 2))
        q0, k0 = int(rng.integers(0, lq)), int(rng.integers(0, lk))
        q1, k1 = int(rng.integers(q0, lq)), int(rng.integers(k0, lk))
        b0 = int(rng.integers(0, 3))
        b1 = b0 + int(rng.integers(0, 2))
        got = classify(e, (q0, q1), (k0, k1), lq, lk, b=(b0, b1))
        q = np.arange(q0, q1 + 1)[None, :, None]
        k = np.arange(k0, k1 + 1)[None, None, :]
        b = np.arange(b0, b1 + 1)[:, None, None]
        truth = np.broadcast_to(rule(q, k, lq, lk, b), (b1 - b0 + 1, q1 - q0 + 1, k1 - k0 + 1))
        if got == SKIP:
            assert not truth.any(), (q0, q1, k0, k1, lq, lk)
        elif got == FULL:
            assert truth.all(), (q0, q1, k0, k1, lq, lk)
        seen[got] += 1
    assert seen[PARTIAL] < 300  # it decides some tiles


def test_bands_are_classified_exactly():
    """Causal and window masks: a tile is PARTIAL only where the band's edge crosses it."""
    for text, rule in (CASES["causal"], CASES["window"], CASES["causal bottom right"]):
        e = mask_expr(text)
        got = block_map(e, 70, 90, 16, 8)
        for i in range(got.shape[0]):
            for j in range(got.shape[1]):
                q = np.arange(i * 16, min(70, i * 16 + 16))[:, None]
                k = np.arange(j * 8, min(90, j * 8 + 8))[None, :]
                t = rule(q, k, 70, 90, 0)
                assert got[i, j] == (FULL if t.all() else SKIP if not t.any() else PARTIAL), (text, i, j)


def test_the_2d_neighbourhood_skips_tiles_in_both_dimensions():
    """Radius 1 over an image 32 wide, tiles of one image row: only the row itself and its two
    neighbours are live."""
    e = mask_expr("abs(q // 32 - k // 32) <= 1 && abs(q % 32 - k % 32) <= 1")
    got = block_map(e, 32 * 32, 32 * 32, 32, 32)
    live = np.abs(np.arange(32)[:, None] - np.arange(32)[None, :]) <= 1
    assert (got[~live] == SKIP).all() and (got[live] == PARTIAL).all()


def test_has_holes_finds_skipped_tiles_between_live_ones():
    """A hole: a SKIP key tile between two live ones in a row of query tiles (at the sample lengths
    of HOLE_PROBES, Lq != Lk included); bands, windows and blocks along the diagonal have none."""
    for text in ("k < 16 || k <= q && q - k < 200", "(q - k) % 512 < 40 && k <= q",
                 "abs(q // 300 - k // 300) <= 2 && abs(q % 300 - k % 300) <= 2",
                 "(q // 100) % 3 == (k // 100) % 3 && k <= q + 50"):
        assert has_holes(mask_expr(text), 128, 80), text
    for text in ("k <= q", "k <= q + Lk - Lq && q - k < 1024", "q // 64 == k // 64", "abs(q - k) <= 3",
                 "abs(q // 64 - k // 64) <= 7 && abs(q % 64 - k % 64) <= 7", "k <= q || k < 7"):
        assert not has_holes(mask_expr(text), 128, 80), text
    # at tiles of 16 keys the 64-wide neighbourhood has holes (columns outside the radius)
    assert has_holes(mask_expr("abs(q // 64 - k // 64) <= 1 && abs(q % 64 - k % 64) <= 1"), 16, 16)


def test_masks_reading_inputs_are_partial_unless_the_indices_decide():
    spec = spec_of("head_dim 64\ndtype f16\ninput p[b] i32\ninput d[b, q] bool\nmask k <= q || k < p[b] && d[b, k]")
    e = spec.mask.expr
    assert not index_only(e)
    assert classify(e, (32, 63), (0, 31), 64, 64) == FULL  # k <= q decides
    assert classify(e, (0, 31), (32, 63), 64, 64) == PARTIAL


# ---- random well-typed index expressions (hypothesis) ------------------------------------------

from hypothesis import given, settings, strategies as st  # noqa: E402

from attngen.lang.expr import Binary, Const, Fn, Unary, Var, format_expr  # noqa: E402
from attngen.reference_expr import evaluate  # noqa: E402

def negate(x):
    """-x as the reader reads it: a negated literal is a literal (`-3` is Const(-3))."""
    if isinstance(x, Const) and x.value >= 0:
        return Const(-x.value, "int")
    return Unary("-", x, "int")


INTS = st.recursive(
    st.one_of(st.sampled_from([Var("q", "int"), Var("k", "int"), Var("Lq", "int"), Var("Lk", "int")]),
              st.integers(-20, 20).map(lambda v: Const(v, "int"))),
    lambda inner: st.one_of(
        st.tuples(st.sampled_from(["+", "-", "*"]), inner, inner).map(lambda t: Binary(t[0], t[1], t[2], "int")),
        st.tuples(st.sampled_from(["//", "%"]), inner, st.sampled_from([-7, -2, 3, 4, 9])).map(
            lambda t: Binary(t[0], t[1], Const(t[2], "int"), "int")),
        inner.map(negate),
        inner.map(lambda x: Fn("abs", (x,), "int")),
        st.tuples(st.sampled_from(["min", "max"]), inner, inner).map(lambda t: Fn(t[0], t[1:], "int")),
        st.tuples(inner, inner, inner).map(lambda t: Fn("clamp", t, "int"))),
    max_leaves=6)
BOOLS = st.recursive(
    st.tuples(st.sampled_from(["==", "!=", "<", "<=", ">", ">="]), INTS, INTS).map(
        lambda t: Binary(t[0], t[1], t[2], "bool")),
    lambda inner: st.one_of(
        st.tuples(st.sampled_from(["&&", "||"]), inner, inner).map(lambda t: Binary(t[0], t[1], t[2], "bool")),
        inner.map(lambda x: Unary("!", x, "bool")),
        st.tuples(inner, INTS, INTS).map(lambda t: Binary("<", Fn("where", t, "int"), Const(5, "int"), "bool"))),
    max_leaves=4)


@settings(max_examples=150, deadline=None)
@given(e=BOOLS, lq=st.integers(1, 40), lk=st.integers(1, 40), data=st.data())
def test_random_masks_print_back_and_classify_soundly(e, lq, lk, data):
    assert mask_expr(format_expr(e)) == e
    q0 = data.draw(st.integers(0, lq - 1))
    q1 = data.draw(st.integers(q0, lq - 1))
    k0 = data.draw(st.integers(0, lk - 1))
    k1 = data.draw(st.integers(k0, lk - 1))
    got = classify(e, (q0, q1), (k0, k1), lq, lk)
    names = {"q": np.arange(q0, q1 + 1)[:, None], "k": np.arange(k0, k1 + 1)[None, :],
             "Lq": np.int64(lq), "Lk": np.int64(lk)}
    truth = np.broadcast_to(evaluate(e, names), (q1 - q0 + 1, k1 - k0 + 1))
    assert got != SKIP or not truth.any()
    assert got != FULL or truth.all()


# ---- random masks as spec text (tests/expr_strategies.py): parsed, checked, then classified -----

from expr_strategies import masks  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(mask=masks(), lq=st.integers(1, 40), lk=st.integers(1, 40), data=st.data())
def test_random_mask_text_classifies_soundly_over_every_index(mask, lq, lk, data):
    """The generator of the WGSL expression fuzzer (b, h, hkv, floor, guarded divisors, where of
    booleans, comparisons of exact reals): never SKIP or FULL where brute force disagrees."""
    e = mask_expr(mask.text)
    assert mask_expr(format_expr(e)) == e
    ranges = {}
    for name, extent in (("q", lq), ("k", lk), ("b", 2), ("h", 6), ("hkv", 2)):
        lo = data.draw(st.integers(0, extent - 1))
        ranges[name] = (lo, data.draw(st.integers(lo, extent - 1)))
    got = classify(e, ranges["q"], ranges["k"], lq, lk, b=ranges["b"], h=ranges["h"], hkv=ranges["hkv"])
    axes = ("b", "h", "hkv", "q", "k")
    names = {n: np.arange(ranges[n][0], ranges[n][1] + 1).reshape([-1 if a == n else 1 for a in axes])
             for n in axes}
    names.update(Lq=np.int64(lq), Lk=np.int64(lk))
    shape = tuple(ranges[n][1] - ranges[n][0] + 1 for n in axes)
    truth = np.broadcast_to(evaluate(e, names), shape)
    assert got != SKIP or not truth.any(), (mask.text, ranges)
    assert got != FULL or truth.all(), (mask.text, ranges)


def test_check_describes_the_tiles_of_a_mask_expression():
    from attngen import lower
    band = lower(spec_of("head_dim 64\ndtype f16\nmask k <= q && q - k < 256\ntile q=128 kv=64"), target="cuda")
    [line] = describe(band, "what the kernel does")
    assert line.startswith("mask expression: by interval analysis, of the 2048 tiles (128 x 64) of Lq = Lk = 4096")
    assert "wholly hidden" in line and line.endswith("; what the kernel does")
    assert describe(lower(spec_of("head_dim 64\ndtype f16\nmask causal"), target="cuda"), "") == []
    small = lower(spec_of("head_dim 16\ndtype f32\nmask k <= q + 1\ntile q=16 kv=16"), target="wgsl")
    [line] = describe(small, "")
    assert "of Lq = Lk = 2048" in line
