"""attngen.plan.grad_partials: which `grad` inputs a deterministic backward sums through partial
sums per dK/dV block, the axes a block's slice owns, and the slice's extents and words (issue 42;
docs/backward.md). Both targets render from it; their own syntax is tested with their backends."""

from __future__ import annotations

from attngen.plan.grad_partials import GRID, partials

from conftest import spec_of

SPEC = ("head_dim 64\nheads q=6 kv=2\ndtype f16\ninput t[h, 63] f32 grad\ninput bias[h, q, k] f32 grad\n"
        "input c[b, hkv, q, k] f32 grad\ninput d[b, h, q, k] f32 grad\ninput e[b, hkv, q, k] f32 grad\n"
        "score s + t[h, clamp(k - q, -31, 31) + 31] + bias[h, q, k] + c[b, hkv, q, k] * c[b, hkv, k, q]"
        " + d[b, h, q, k] + e[b, hkv, q, k]")


def test_which_inputs_and_the_axes_a_slice_owns():
    spec = spec_of(SPEC)
    # d is read once per pair at h: direct on every target; e once per pair at hkv: direct only
    # where the target adds the GQA group's heads into one entry in turn
    assert [p.input.name for p in partials(spec, direct_at_hkv=True)] == ["t", "bias", "c"]
    got = {p.input.name: p.owned for p in partials(spec, direct_at_hkv=False)}
    assert got == {"t": ("h", None), "bias": ("h", None, "k"), "c": ("b", "hkv", None, None),
                   "e": ("b", "hkv", None, "k")}  # (c[.., k, q]: q and k not its own; h spans under hkv)
    assert {GRID[o] for o in ("k", "b", "hkv", "h")} == {"x", "y", "z"}


def test_extents_formulas_and_words():
    t, bias, c = partials(spec_of(SPEC), direct_at_hkv=True)
    assert bias.extents("T", "G", "one", lambda a: f"ext({a})") == ["G", "ext(q)", "T"]
    assert t.extents("T", "G", "one", lambda a: f"ext({a})") == ["G", "ext(63)"]
    assert c.formula("32") == ["1", "1", "Lq", "Lk"] and t.formula("BKV") == ["G", "63"]
    assert (t.words((6, 63), 32, 3), bias.words((6, 9, 11), 32, 3), c.words((2, 2, 9, 11), 32, 3)) == \
        (3 * 63, 3 * 9 * 32, 9 * 11)
