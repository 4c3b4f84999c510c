"""The bits-or-inline rule of index-only mask expressions (attngen/plan/expr_bits.py; issue 42),
the cuda option that picks it (`target cuda { mask_expr=auto|inline|bits }`) and `attngen
check`'s line: plain unit tests, no GPU (tests/equivalence/test_cuda_expr_bits.py runs both paths)."""

from __future__ import annotations

import numpy as np
import pytest

import attngen
from attngen.plan import expr_bits
from attngen.plan.expr_blocks import FULL, PARTIAL, block_map

from conftest import spec_of

HOOD = "abs(q // 64 - k // 64) <= 7 && abs(q % 64 - k % 64) <= 7"  # the 2D neighbourhood, L 4096
HOOD_16K = "abs(q // 128 - k // 128) <= 7 && abs(q % 128 - k % 128) <= 7"


def _expr(mask):
    return spec_of(f"head_dim 128\ndtype f16\nmask {mask}").mask.expr


@pytest.mark.parametrize("tiles", [(128, 80), (128, 128), (64, 64)])
def test_the_2d_neighbourhood_takes_bits(tiles):
    assert expr_bits.prefers_bits(_expr(HOOD), 4096, 4096, *tiles)
    assert expr_bits.prefers_bits(_expr(HOOD_16K), 16384, 16384, *tiles)
    assert expr_bits.prefers_bits(_expr(HOOD), 4096, 3001, *tiles)  # Lq != Lk


@pytest.mark.parametrize("mask", ["k <= q", "k <= q && q - k <= 1024", "k < 64 || k <= q && q - k < 1024",
                                  "q - k < 512 && k - q < 512"])
@pytest.mark.parametrize("length", [4096, 16384, 3001])
def test_mostly_full_masks_stay_inline(mask, length):
    assert not expr_bits.prefers_bits(_expr(mask), length, length, 128, 80)


@pytest.mark.parametrize("lq, lk", [(1, 1), (7, 113), (113, 7), (1023, 1501), (2047, 2048)])
def test_short_calls_stay_inline(lq, lk):
    assert lq * lk < expr_bits.MIN_PAIRS
    assert not expr_bits.prefers_bits(_expr(HOOD), lq, lk, 128, 80)


@pytest.mark.parametrize("mask", [HOOD, "k <= q", "k < 64 || k <= q && q - k < 1024"])
@pytest.mark.parametrize("lq, lk, tq, tk", [(1000, 3001, 64, 64), (4096, 4096, 128, 80), (16384, 16384, 128, 80)])
def test_live_tiles_counts_or_estimates_the_block_map(mask, lq, lk, tq, tk):
    e = _expr(mask)
    exact = block_map(e, lq, lk, tq, tk)
    partial, full = int((exact == PARTIAL).sum()), int((exact == FULL).sum())
    got = expr_bits.live_tiles(e, lq, lk, tq, tk)
    if exact.size <= expr_bits.SAMPLE_TILES:
        assert got == (partial, full)
    else:  # whole rows, evenly spaced: within a few percent of the live tiles here
        assert abs(got[0] - partial) + abs(got[1] - full) <= 0.05 * (partial + full)


def test_the_memory_bound():
    assert expr_bits.fits((1, 1), 16384, 16384) and expr_bits.fits((2, 1), 16384, 16384)
    assert not expr_bits.fits((4, 1), 16384, 16384) and not expr_bits.fits((1, 16), 16384, 16384)
    assert expr_bits.elements((3, 5), 7, 113) == 3 * 5 * 7 * 113


def test_the_option_is_printed_only_where_given():
    plain = spec_of(f"head_dim 64\ndtype f16\nmask {HOOD}")
    assert "mask_expr" not in attngen.format_spec(plain)
    assert plain.options("cuda").get("mask_expr") is None
    given = spec_of(f"head_dim 64\ndtype f16\nmask {HOOD}\ntarget cuda {{ mask_expr=bits }}")
    text = attngen.format_spec(given)
    assert "mask_expr=bits" in text and attngen.parse(text)[0].options("cuda") == {"mask_expr": "bits"}
    inline = spec_of(f"head_dim 64\ndtype f16\nmask {HOOD}\ntarget cuda {{ mask_expr=inline }}")
    assert inline.options("cuda") == {"mask_expr": "inline"}


@pytest.mark.parametrize("body, what", [("mask causal", "causal"), ("mask custom", "custom"),
                                        ("input doc[b, q] i32\nmask doc[b, q] == doc[b, k]", "reads inputs")])
def test_the_option_is_refused_where_it_means_nothing(body, what):
    spec = spec_of(f"head_dim 64\ndtype f16\n{body}\ntarget cuda {{ mask_expr=bits }}")
    problems = attngen.check(spec, target="cuda")
    assert any("mask_expr=bits chooses how an index-only mask expression runs" in str(p) and what in str(p)
               for p in problems), problems
    with pytest.raises(attngen.SpecError, match="mask_expr=bits"):
        attngen.lower(spec, "cuda")


def test_a_bad_choice_is_a_clear_error():
    with pytest.raises(attngen.SpecError, match="mask expression path"):
        spec_of(f"head_dim 64\ndtype f16\nmask {HOOD}\ntarget cuda {{ mask_expr=bitz }}")


@pytest.mark.parametrize("mask, option, words", [
    (HOOD, "", "mask_expr=auto: bits where a call has at least 4194304 pairs and more partial than full live tiles; "
               "at Lq = Lk = 4096, 410 partial and 0 full live tiles: bits"),
    ("!(k > q)", "", "mask_expr=auto: bits where"),
    ("!(k > q)", "target cuda { mask_expr=bits }", "mask_expr=bits; at Lq = Lk = 4096"),
])
def test_check_says_which_path(mask, option, words):
    spec = spec_of(f"head_dim 128\ndtype f16\nmask {mask}\n{option}")
    lines = attngen.backends.get("cuda").describe(attngen.lower(spec, "cuda", "cuda-sm90"))
    line = next(x for x in lines if x.startswith("mask expression path: "))
    assert words in line
    assert (": bits:" in line) == (mask == HOOD or "bits" in option)
    assert line.endswith(f"masks above {expr_bits.MAX_ELEMENTS} elements run inline")
    inline = spec_of(f"head_dim 128\ndtype f16\nmask {mask}\ntarget cuda {{ mask_expr=inline }}")
    line = next(x for x in attngen.backends.get("cuda").describe(attngen.lower(inline, "cuda", "cuda-sm90"))
                if x.startswith("mask expression path: "))
    assert line.startswith("mask expression path: mask_expr=inline;") and ": inline:" in line
    paged = spec_of(f"head_dim 128\ndtype f16\nmask {mask}\nkv_cache paged(page=16)")
    assert "mask expression path: inline (a paged cache" in "\n".join(
        attngen.backends.get("cuda").describe(attngen.lower(paged, "cuda", "cuda-sm90")))


def test_check_says_inline_where_the_custom_kernel_does_not_plan():
    """producer=on with tile kv 176: the expression's kernel plans, the spec with mask custom does
    not (the producer stages 128-key chunks of mask words), so every call runs inline."""
    spec = spec_of(f"head_dim 128\ndtype f16\nmask {HOOD}\ntile q=128 kv=176\ntarget cuda {{ producer=on }}")
    lines = attngen.backends.get("cuda").describe(attngen.lower(spec, "cuda", "cuda-sm90"))
    line = next(x for x in lines if x.startswith("mask expression path: "))
    assert line.startswith("mask expression path: inline (the spec with mask custom does not plan with these "
                           "options (target cuda (profile cuda-sm90): producer=on with mask custom and tile kv=176")
