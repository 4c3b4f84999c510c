"""Persistent blocks of the producer kernels (`target cuda { persistent=auto|on|off }`, issue 11):
which plans get them, what the checker refuses, the launch they describe (grid SM, batch_size, the
self-resetting work_counter), that they build for sm_90a without spills (NVRTC, no GPU), and (on
the GPU machine) that they compute the reference's function when a block takes many work items:
odd lengths, Lq != Lk, GQA 7, causal both ways, windows, planted inf / NaN, repeated calls of
other shapes (a counter left non-zero would skip items), and the same bits as persistent=off."""

from __future__ import annotations

import re

import numpy as np
import pytest

import attngen
from attngen.api import emit_plan
from attngen.backends.cuda import nvrtc
from attngen.errors import SpecError

from conftest import kernel_for, nvrtc_compile, require, spec_of, to_device
from test_hidden_keys import _compare, _plant
from test_variants import _np, check
from attngen.reference import reference


def _plan(body, profile="cuda-sm90"):
    return attngen.lower(spec_of(body), "cuda", profile)


# ---- the plan (no GPU) ----------------------------------------------------------------------------

@pytest.mark.parametrize("body, on", [
    ("head_dim 128\n dtype f16", True),
    ("head_dim 128\n heads q=28 kv=4\n dtype bf16\n mask causal", True),
    ("head_dim 128\n dtype f16\n mask causal(bottom_right)", True),
    ("head_dim 128\n dtype f16\n mask window(left=100)", True),
    ("head_dim 64\n dtype f16\n target cuda { producer=on }", True),
    ("head_dim 96\n dtype f16", True),                                   # tiles by the tensor copy engine
    ("head_dim 96\n dtype f16\n target cuda { tma=off }", True),           # cp.async rows 10 apart: no spill
    ("head_dim 80\n dtype f16\n mask causal\n target cuda { tma=off }", True),
    ("head_dim 256\n dtype f16\n target cuda { producer=on }", True),    # all copies by the tensor copy engine
    ("head_dim 256\n dtype f16\n target cuda { producer=on tma=off }", True),  # every producer kernel
    ("head_dim 192\n dtype f16\n mask window(left=100)\n target cuda { producer=on }", True),
    ("head_dim 256\n dtype f16\n softcap 30\n target cuda { producer=on }", True),
    ("head_dim 96\n dtype f16\n target cuda { persistent=on }", True),   # asked for: built
    ("head_dim 64\n dtype f16", True),                                   # tile q 128 with the producer
    ("head_dim 64\n dtype f16\n softcap 30", True),                      # with the producer since 2026-11-27
    ("head_dim 64\n dtype f16\n softcap 30\n target cuda { producer=off }", False),  # no producer
    ("head_dim 128\n dtype f16\n mask custom", True),                  # the _varlen entry takes packed launches
    ("head_dim 128\n dtype f16\n target cuda { producer=off }", False),
])
def test_which_plans_are_persistent(body, on):
    p = _plan(body)
    assert p.config.persistent is on
    assert (p.grid[0].startswith("min(SM, ") and p.grid[1:] == ("1", "1")) is on
    names = [q.name for q in p.params]
    assert ("batch_size" in names and "work_counter" in names) is on
    assert ([w.name for w in p.workspaces if w.persistent] == ["work_counter"]) is on
    assert ("persistent: one block per multiprocessor" in p.summary()) is on
    src = emit_plan(p).source
    assert ("section: work items (persistent blocks)" in src) is on
    if p.details.varlen is not None:  # launches with per-sequence lengths: persistent where the producer is
        assert ("SM" in p.details.varlen.grid[0]) is p.config.varlen.persistent
        assert p.config.varlen.persistent is p.config.varlen.producer


@pytest.mark.parametrize("body", ["head_dim 128\n dtype f16\n target cuda { persistent=off }",
                                  "head_dim 96\n dtype f16\n mask causal\n target cuda { persistent=off }"])
def test_persistent_off_is_one_block_per_row_tile_by_the_work_item_code(body):
    """persistent=off: one block per row tile, by the work-item code (so that a block whose
    result is not finite does its item again, cleaned), on a grid of one block per item."""
    p = _plan(body)
    assert p.config.persistent and p.config.item_per_block
    assert p.grid == ("ceil(Lq / 128) * Hq * B", "1", "1")
    assert "one block per row tile (persistent=off)" in p.summary()
    assert "persistent: one block per multiprocessor" not in p.summary()
    assert "The grid is one block per work item (persistent=off)" in emit_plan(p).source


@pytest.mark.parametrize("body, profile, words", [
    ("head_dim 128\n dtype f16\n target cuda { persistent=on }", "cuda-sm80", "no Hopper wgmma family"),
    ("head_dim 64\n dtype f16\n softcap 30\n target cuda { producer=off persistent=on }", "cuda-sm90", "no producer"),
    ("head_dim 128\n dtype f16\n target cuda { producer=off persistent=on }", "cuda-sm90", "no producer"),
    ("head_dim 128\n dtype f16\n mask custom\n target cuda { producer=off persistent=on }", "cuda-sm90",
     "no producer"),
])
def test_persistent_on_refused_with_the_reason(body, profile, words):
    with pytest.raises(SpecError) as e:
        _plan(body, profile)
    assert "persistent" in str(e.value) and words in str(e.value)


def test_the_grid_is_at_most_one_block_per_item():
    """min(SM, items): no block without an item (GQA packed: items of KV heads)."""
    from attngen.plan.formulas import evaluate_all
    p = _plan("head_dim 128\n dtype f16\n mask causal")
    assert evaluate_all(p.grid, SM=132, Lq=128, Hq=32, B=1) == (32, 1, 1)
    assert evaluate_all(p.grid, SM=132, Lq=1023, Hq=32, B=2) == (132, 1, 1)


def test_the_manifest_names_the_grid_symbol_and_the_counter():
    p = _plan("head_dim 128\n dtype f16\n mask causal")
    m = emit_plan(p).manifest
    assert m["grid"] == ["min(SM, ceil(Lq / 128) * Hq * B)", "1", "1"]
    text = str(m)
    assert "SM" in m["grid_symbols"] and "work_counter" in text and "wraps" in text


PERSISTENT = [
    "head_dim 128\n dtype f16",
    "head_dim 128\n dtype f16\n mask causal",
    "head_dim 128\n dtype bf16\n mask causal(bottom_right)",
    "head_dim 128\n dtype f16\n mask window(left=100)",
    "head_dim 64\n dtype f16\n target cuda { producer=on }",
]


@pytest.mark.skipif(not nvrtc.available(), reason="NVRTC not installed (pip install -e '.[test]')")
@pytest.mark.parametrize("body", PERSISTENT)
def test_builds_for_sm90a_without_spills(body):
    p = _plan(body)
    assert p.config.persistent
    _, log = nvrtc_compile(emit_plan(p).source, "sm_90a")
    assert "C7514" not in log and "C7508" not in log, log
    usage = nvrtc.resource_usage(log)
    if not usage:  # (an NVRTC that gives no report: compile_cubin asks for one)
        pytest.skip("this NVRTC returns no ptxas report")
    assert all(spill_stores == 0 for _, spill_stores, _ in usage.values()), log
    assert not re.search(r"warning", log), log


# ---- against the reference (GPU) ------------------------------------------------------------------

def _rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("body", PERSISTENT)
@pytest.mark.parametrize("b, lq, lk, hq, hkv", [
    (3, 1023, 1023, 14, 2),   # 336 items of 128 rows (GQA 7): more than one per block
    (2, 113, 1023, 28, 4),    # Lq != Lk, one row tile per head
    (1, 1, 7, 2, 2),          # fewer items than blocks: most blocks take none
])
def test_matches_the_reference(body, b, lq, lk, hq, hkv):
    require("cuda")
    spec = spec_of(body + f"\n heads q={hq} kv={hkv}")
    rng = np.random.default_rng(lq * 31 + lk + b)
    d = spec.head_dim_qk
    q, k, v = _rand(rng, b, lq, hq, d), _rand(rng, b, lk, hkv, d), _rand(rng, b, lk, hkv, d)
    check(spec, "cuda", q, k, v)


@pytest.mark.parametrize("mask", ["none", "causal", "causal(bottom_right)", "window(left=300, right=7)"])
def test_the_same_function_as_one_block_per_item(mask):
    """The work-item code computes the same function whatever its grid: persistent=on (one block
    per multiprocessor) and off (one block per item) agree to rounding, on
    a grid of many items per block, and again after calls of other shapes (the work counter is
    back at zero after every launch, or later launches would skip items)."""
    require("cuda")
    rng = np.random.default_rng(7)
    shapes = [(4, 1024, 1000, 12, 3), (1, 333, 77, 12, 3), (6, 515, 515, 12, 3)]
    kernels = {m: kernel_for(spec_of(f"head_dim 128\n dtype f16\n mask {mask}\n target cuda {{ persistent={m} }}"),
                             "cuda") for m in ("on", "off")}
    # off: the same work-item code on a grid of one block per item
    assert not kernels["on"].plan.config.item_per_block and kernels["off"].plan.config.item_per_block
    assert kernels["on"].plan.grid[0].startswith("min(SM, ") and "SM" not in kernels["off"].plan.grid[0]
    for b, lq, lk, hq, hkv in shapes + shapes[:1]:
        q, k, v = _rand(rng, b, lq, hq, 128), _rand(rng, b, lk, hkv, 128), _rand(rng, b, lk, hkv, 128)
        dq, dk, dv = to_device("cuda", "f16", q, k, v)
        on, lse_on = kernels["on"](dq, dk, dv, return_lse=True)
        off, lse_off = kernels["off"](dq, dk, dv, return_lse=True)
        # the same arithmetic per item, up to the compiler's contractions (s * scale - m into one FMA
        # in one build and not the other): a skipped or repeated item would differ by O(1)
        np.testing.assert_allclose(_np(on), _np(off), rtol=2e-3, atol=2e-3, err_msg=str((mask, b, lq, lk)))
        np.testing.assert_allclose(_np(lse_on), _np(lse_off), rtol=1e-5, atol=1e-5, err_msg=str((mask, b, lq, lk)))


def test_planted_nonfinite_values_reach_only_their_rows():
    """inf / NaN in V at keys a causal mask hides from some rows, on a grid of several items per
    block: the producer cleans partial tiles item after item (the ring's stages run on)."""
    require("cuda")
    spec = spec_of("head_dim 128\n heads q=16 kv=4\n dtype f16\n mask causal(bottom_right)")
    assert attngen.lower(spec, "cuda", "cuda-sm90").config.persistent
    rng = np.random.default_rng(11)
    lq, lk = 1100, 1300
    q, k, v = _rand(rng, 2, lq, 16, 128), _rand(rng, 2, lk, 4, 128), _rand(rng, 2, lk, 4, 128)
    k, v = _plant(k, v, [230, 231, 400, 1299])
    out, lse = kernel_for(spec, "cuda")(*to_device("cuda", spec.dtype, q, k, v), return_lse=True)
    ref, ref_lse = reference(spec, q, k, v, return_lse=True)
    _compare(spec, _np(out), _np(lse), ref, ref_lse)


@pytest.mark.parametrize("formula, sizes, value", [
    ("min(SM, ceil(Lq / 128) * Hq * B)", {"SM": 132, "Lq": 1, "Hq": 1, "B": 1}, 1),
    ("min(SM, ceil(Lq / 128) * Hq * B)", {"SM": 132, "Lq": 16384, "Hq": 16, "B": 1}, 132),
    ("min(2, 3) + min(7, 5) * 2", {}, 12),
])
def test_min_in_formulas(formula, sizes, value):
    from attngen.plan.formulas import evaluate
    assert evaluate(formula, sizes) == value


@pytest.mark.parametrize("bad", ["min(1)", "min(1, 2, 3)", "max(1, 2)", "min(a=1, b=2)"])
def test_other_calls_are_refused_in_formulas(bad):
    from attngen.plan.formulas import evaluate
    with pytest.raises(ValueError):
        evaluate(bad, {})


@pytest.mark.parametrize("mask", ["causal", "causal(bottom_right)"])
def test_causal_items_in_small_order_groups(mask):
    """Causal items go longest first within groups of (batch, head) pairs whose K and V fit
    CudaTiles.causal_order_bytes (templates/cuda/family_producer.j2, section work items). With the bound made
    small (the profile's override), the 42 pairs (B 3 x 14 query heads, GQA 7) fall into groups of
    8 and a last group of 2: every item is still done once (the reference's function)."""
    from attngen.api import get_profile
    small = {"causal_order_bytes": 600_000}  # 1023 keys x 256 x 2 bytes per KV head: 8 pairs
    spec = spec_of(f"head_dim 128\n dtype f16\n mask {mask}\n heads q=14 kv=2", name="order_groups")
    src = emit_plan(attngen.lower(spec, "cuda", get_profile("cuda-sm90", "cuda").with_overrides(**small))).source
    assert "constexpr long long kOrderBytes = 600000LL;" in src and "order_group(len_k, group, pairs)" in src
    require("cuda")
    from attngen import backends
    from attngen.backends.cuda.devices import device_profile
    from attngen.reference import relative_error, tolerance
    kernel = attngen.compile(spec, "cuda", profile=device_profile(backends.get("cuda")).with_overrides(**small))
    assert kernel.plan.config.causal_order_bytes == 600_000
    rng = np.random.default_rng(11)
    q, k, v = _rand(rng, 3, 1023, 14, 128), _rand(rng, 3, 1023, 2, 128), _rand(rng, 3, 1023, 2, 128)
    out = _np(kernel(*to_device("cuda", spec.dtype, q, k, v)))
    err = relative_error(out, reference(spec, q, k, v))
    assert not np.isnan(out).any() and err <= tolerance(spec), f"relative error {err:.3g}"
