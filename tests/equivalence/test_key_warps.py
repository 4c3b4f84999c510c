"""split_kv with warps over keys (`target cuda { key_warps=N }`): the warps of a block own the
same rows and divide each K/V tile's keys; their partial softmaxes are merged at the end of the
block (templates/cuda/family_plain.j2, section "merge the key warps"). Checked against the float64
reference on the GPU: odd lengths (1, 7, 113, 1023), Lq != Lk, GQA groups 4 and 7, masks, kv_lens
with an empty sequence, a paged cache, planted inf / NaN that only some rows see. The plan and
the checker's refusals are checked without a GPU."""

from __future__ import annotations

import numpy as np
import pytest

import attngen
from attngen.api import emit_plan
from attngen.errors import SpecError
from attngen.reference import reference, relative_error, tolerance

from conftest import kernel_for, require, spec_of, to_device
from test_hidden_keys import _compare, _plant
from test_variants import _device_ints, _np, _rand, check, paged_cache


def _spec(body, key_warps, extra=""):
    return spec_of(f"{body}\n schedule split_kv(auto)\n{extra}\n target cuda {{ key_warps={key_warps} }}")


# ---- the plan (no GPU) ----------------------------------------------------------------------------

def test_the_plan_shows_the_key_warps():
    plan = attngen.lower(_spec("head_dim 128\n heads q=32 kv=8\n dtype f16", 4), "cuda", "cuda-sm90")
    c = plan.config
    assert (c.key_warps, c.warps, c.tile_q, c.tile_kv, c.frags) == (4, 4, 16, 128, 1)
    assert "4 warps over the keys of each tile, 32 keys each" in plan.summary()
    src = emit_plan(plan).source
    assert "constexpr int kKeyWarps = 4;" in src and "section: merge the key warps" in src


@pytest.mark.parametrize("body, why", [
    ("head_dim 64\n dtype f16", "split decode schedules"),                             # fused
    ("head_dim 64\n dtype f16\n schedule two_pass", "two_pass keeps one warp"),
    ("head_dim 64\n dtype f32\n schedule split_kv(2)", "f32 storage"),
    ("head_dim 512\n dtype f16\n schedule split_kv(2)", "tile d"),
])
def test_key_warps_refused_where_the_kernel_has_one_warp(body, why):
    with pytest.raises(SpecError) as e:
        attngen.lower(spec_of(body + "\n target cuda { key_warps=2 }"), "cuda", "cuda-sm90")
    assert why in str(e.value) and "key_warps=2" in str(e.value)


def test_a_tile_that_does_not_divide_is_refused():
    with pytest.raises(SpecError) as e:
        attngen.lower(_spec("head_dim 64\n dtype f16\n tile kv=48", 2), "cuda", "cuda-sm90")
    assert "24 keys per warp" in str(e.value) and "multiple of 16" in str(e.value)


# ---- against the reference (GPU) ------------------------------------------------------------------

@pytest.mark.parametrize("key_warps", [2, 4])
@pytest.mark.parametrize("lq, lk, hq, hkv, mask", [
    (1, 1, 8, 2, "none"),
    (1, 7, 7, 1, "none"),                       # GQA 7
    (1, 113, 8, 2, "window(left=50)"),
    (1, 1023, 8, 2, "causal(bottom_right)"),
    (13, 301, 8, 2, "causal(bottom_right)"),    # chunked prefill: Lq > 1, Lq != Lk
    (3, 1023, 14, 2, "window(left=100, right=7)"),
])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_matches_the_reference(key_warps, lq, lk, hq, hkv, mask, dtype):
    require("cuda")
    spec = _spec(f"head_dim 128\n dtype {dtype}\n mask {mask}", key_warps)
    rng = np.random.default_rng(lk + lq)
    q, k, v = _rand(rng, 2, lq, hq, 128), _rand(rng, 2, lk, hkv, 128), _rand(rng, 2, lk, hkv, 128)
    check(spec, "cuda", q, k, v)
    lens = np.array([0, max(1, lk // 2)], np.int32)  # a sequence with no keys: every split sees nothing
    check(spec, "cuda", q, k, v, kv_lens=_device_ints("cuda", lens), ref_kw={"kv_lens": lens},
          expect_empty_rows=True)


@pytest.mark.parametrize("key_warps, tile", [(2, 64), (4, 64), (4, 128), (8, 128)])
def test_tiles_and_splits(key_warps, tile):
    require("cuda")
    for splits in ("split_kv(1)", "split_kv(5)"):
        spec = spec_of(f"head_dim 64\n dtype f16\n mask causal(bottom_right)\n tile kv={tile}\n schedule {splits}"
                       f"\n target cuda {{ key_warps={key_warps} }}")
        rng = np.random.default_rng(tile + key_warps)
        q, k, v = _rand(rng, 3, 2, 8, 64), _rand(rng, 3, 777, 2, 64), _rand(rng, 3, 777, 2, 64)
        check(spec, "cuda", q, k, v)


@pytest.mark.parametrize("page", [16, 64])
def test_paged_cache(page):
    require("cuda")
    spec = _spec("head_dim 128\n dtype f16\n mask causal(bottom_right)", 4, f" kv_cache paged(page={page})")
    rng = np.random.default_rng(page)
    lens = np.array([300, 1, 1023], np.int32)
    k, v, table, _ = paged_cache(rng, lens, page, 2, 128, 128)
    table = np.minimum(table, len(k) - 1)
    q = _rand(rng, 3, 1, 14, 128)  # GQA 7
    check(spec, "cuda", q, k, v, kv_lens=_device_ints("cuda", lens), block_table=_device_ints("cuda", table),
          ref_kw={"kv_lens": lens, "block_table": table})


@pytest.mark.parametrize("mask, keys", [
    ("causal(bottom_right)", [212, 215, 230, 249]),        # rows i see keys <= i + 210
    ("window(left=9, right=3)", [45, 97, 215, 230, 249]),  # 45 and 97: no row sees them
])
def test_planted_keys_only_their_rows_see(mask, keys):
    """inf / NaN in K and V at keys only some rows see: only those rows are non-finite, whichever
    warp's share of the tile (4 warps of 32 keys in tiles of 128) held the key."""
    require("cuda")
    spec = _spec(f"head_dim 64\n dtype f16\n mask {mask}", 4)
    rng = np.random.default_rng(5)
    lq, lk = 40, 250
    q, k, v = _rand(rng, 2, lq, 4, 64), _rand(rng, 2, lk, 2, 64), _rand(rng, 2, lk, 2, 64)
    k, v = _plant(k, v, keys)
    kernel = kernel_for(spec, "cuda")
    out, lse = kernel(*to_device("cuda", spec.dtype, q, k, v), return_lse=True)
    ref, ref_lse = reference(spec, q, k, v, return_lse=True)
    _compare(spec, _np(out), _np(lse), ref, ref_lse)


def test_the_same_result_as_one_warp():
    """key_warps=4 and 1 agree closely (the merge is the split combine's arithmetic)."""
    require("cuda")
    rng = np.random.default_rng(3)
    q, k, v = _rand(rng, 2, 1, 32, 128), _rand(rng, 2, 4096, 8, 128), _rand(rng, 2, 4096, 8, 128)
    outs = []
    for kw in (1, 4):
        spec = _spec("head_dim 128\n heads q=32 kv=8\n dtype f16", kw)
        outs.append(_np(kernel_for(spec, "cuda")(*to_device("cuda", spec.dtype, q, k, v))))
    assert relative_error(outs[1], outs[0]) <= tolerance(spec)
