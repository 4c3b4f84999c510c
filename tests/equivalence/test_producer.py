"""The Hopper family's producer warpgroup (`target cuda { producer=auto|on|off }`, issue 11):
which plans get it, what the checker refuses, that every variant builds for sm_90a (NVRTC, no
GPU) within the registers setmaxnreg may move, and (on the GPU machine) that it computes the
reference's function: odd lengths, Lq != Lk, GQA 7, every mask, softcap, MLA dims, kv_lens,
packed sequences, custom masks and planted inf / NaN that only some rows see."""

from __future__ import annotations

import re

import numpy as np
import pytest

import attngen
from attngen.api import emit_plan
from attngen.backends.cuda import nvrtc
from attngen.backends.cuda.tiles import DEFAULT as TILES
from attngen.errors import SpecError
from attngen.reference import reference

from conftest import kernel_for, nvrtc_compile, require, spec_of, to_device
from test_hidden_keys import _compare, _plant
from test_variants import _device_ints, _device_mask, _np, check, make_mask


def _plan(body, profile="cuda-sm90"):
    return attngen.lower(spec_of(body), "cuda", profile)


# ---- the plan (no GPU) ----------------------------------------------------------------------------

@pytest.mark.parametrize("body, on", [
    ("head_dim 128\n dtype f16", True),                             # tile q 128: the measured gain
    ("head_dim 128\n heads q=28 kv=4\n dtype bf16", True),
    ("head_dim 96\n dtype f16", True),
    ("head_dim 64\n dtype f16", True),                              # tile q 128 (with it: +11%)
    ("head_dim 64\n dtype f16\n softcap 30", True),                # q128 with it (CudaTiles.producer_softcap)
    ("head_dim 64\n dtype f16\n softcap 30\n target cuda { producer=off }", False),  # tile q 64, no q128
    ("head_dim 64\n dtype f16\n target cuda { producer=off }", False),
    ("head_dim 256\n dtype f16", True),                             # kv 80 with persistent blocks (CudaTiles.wide_d_tiles)
    ("head_dim 256\n dtype f16\n mask window(left=64)", True),       # above d128, window / custom / softcap: kv 64
    ("head_dim 192\n dtype bf16\n softcap 50\n mask causal", True),
    ("head_dim 256\n dtype f16\n mask window(left=64)\n tile q=128 kv=96", False),  # above kv 64: not measured
    ("head_dim 256\n dtype f16\n mask window(left=64)\n target cuda { tma=off }", False),
    ("head_dim 128\n dtype f16\n mask causal", True),               # q128 kv128 (since 2026-11-27)
    ("head_dim 64\n dtype f16\n mask causal", True),                # q128 kv128 (up to d64)
    ("head_dim 128\n dtype f16\n mask causal\n tile q=128 kv=128", True),  # its consumers no longer spill
    ("head_dim 128\n dtype f16\n mask causal\n tile q=128 kv=160", False),  # above kv 128: not measured
    ("head_dim 128\n dtype f16\n mask window(left=100)", True),     # q128 kv96
    ("head_dim 128\n dtype f16\n mask window(left=100)\n tile q=128 kv=112", False),  # kv112 spills with it
    ("head_dim 128\n dtype f16\n mask custom", True),               # q128 kv80, mask words staged
    ("head_dim 128\n dtype f16\n mask custom\n tile q=128 kv=128", False),  # kv128: its consumers spill
    ("head_dim 128\n dtype f16\n softcap 30", True),
    ("head_dim 128\n dtype f16\n softcap 30\n mask causal", True),
    ("head_dim 128\n dtype f16\n target cuda { producer=off }", False),
    ("head_dim 128\n dtype f16\n mask causal\n target cuda { producer=on }", True),
    ("head_dim 256\n dtype f16\n target cuda { producer=on }", True),
])
def test_which_plans_get_a_producer(body, on):
    p = _plan(body)
    c = p.config
    assert c.producer is on
    assert c.threads == c.warps * 32 + (128 if on else 0)
    assert ("a producer warpgroup copies the tiles" in p.summary()) is on
    src = emit_plan(p).source
    assert ("-- producer warpgroup: copies only" in src) is on
    if on and c.warps == 8:
        assert "setmaxnreg.dec" in src and "setmaxnreg.inc" in src
    if c.varlen is not None:  # launches with per-sequence lengths: the producer by cp.async up to d128
        narrow = max(c.d_qk, c.d_v) <= TILES.varlen_producer_max_d and "custom" not in body
        assert c.varlen.producer is (on and narrow)
        assert not c.varlen.tma


def test_registers_setmaxnreg_may_move():
    """The launch gives a block of 384 threads 168 registers each; the producer and the two
    consumer warpgroups must fit in that, or setmaxnreg.inc waits forever (seen on the H100)."""
    assert 128 * TILES.producer_regs + 256 * TILES.consumer_regs <= 384 * 168
    assert TILES.producer_regs % 8 == 0 and TILES.consumer_regs % 8 == 0 and 24 <= TILES.producer_regs


@pytest.mark.parametrize("body, profile, words", [
    ("head_dim 128\n dtype f16\n target cuda { producer=on }", "cuda-sm80", "no Hopper wgmma family"),
    ("head_dim 128\n dtype f32\n target cuda { producer=on }", "cuda-sm90", "f32 storage"),
    ("head_dim 128\n dtype f16\n schedule split_kv(2)\n target cuda { producer=on }", "cuda-sm90", "split"),
    ("head_dim 128\n dtype f16\n target cuda { producer=on stages=1 }", "cuda-sm90", "2 or more K/V stages"),
    ("head_dim 64\n dtype f16\n tile q=256 kv=64\n target cuda { producer=on }", "cuda-sm90", "tile q=256"),
    ("head_dim 64\n dtype f16\n mask custom\n tile q=128 kv=192\n target cuda { producer=on }", "cuda-sm90",
     "up to 128 keys"),
])
def test_producer_on_refused_with_the_reason(body, profile, words):
    with pytest.raises(SpecError) as e:
        _plan(body, profile)
    assert "producer" in str(e.value) and words in str(e.value)


# ---- compiled for sm_90a (NVRTC, no GPU) ----------------------------------------------------------

VARIANTS = [
    "head_dim 128\n dtype f16",
    "head_dim 64\n dtype f16\n target cuda { producer=on }",                      # one consumer warpgroup
    "head_dim 128\n dtype f16\n mask causal\n tile q=128 kv=128\n target cuda { producer=on }",
    "head_dim 128\n dtype bf16\n mask window(left=100)\n target cuda { producer=on }",
    "head_dim 128\n dtype f16\n mask custom\n target cuda { producer=on }",
    "head_dim qk=192 v=128\n dtype bf16\n mask causal\n tile q=128 kv=128\n target cuda { producer=on }",
    "head_dim 256\n dtype f16\n target cuda { producer=on }",
    "head_dim 64\n dtype f16\n tile q=192 kv=128\n target cuda { producer=on }",             # three consumer warpgroups
    "head_dim 64\n dtype bf16\n mask causal\n tile q=192 kv=64\n target cuda { producer=on }",
    "head_dim 64\n dtype f16\n mask causal\n tile q=192 kv=128\n target cuda { producer=on }",   # 160 registers, no spill
    "head_dim 256\n dtype bf16\n mask causal",                                     # kv 80, persistent
    # persistent since 2026-11-27 (third session; one block per row tile before): cp.async copies,
    # and window / softcap above head dim 128
    "head_dim 96\n dtype f16\n mask causal\n target cuda { tma=off }",
    "head_dim 192\n dtype bf16\n mask window(left=100)\n target cuda { producer=on }",
    "head_dim 256\n dtype f16\n softcap 30\n target cuda { producer=on }",
]


@pytest.mark.skipif(not nvrtc.available(), reason="NVRTC not installed (pip install -e '.[test]')")
@pytest.mark.parametrize("body", VARIANTS)
def test_builds_for_sm90a_without_serialised_products(body):
    p = _plan(body)
    assert p.config.producer
    _, log = nvrtc_compile(emit_plan(p).source, "sm_90a")
    # C7514: ptxas serialises the wgmma products (a bar.arrive between issue and wait did this);
    # C7508: setmaxnreg ignored
    assert "C7514" not in log and "C7508" not in log, log
    # no spills, masked ones included (since Q came by the tensor copy engine: docs/cuda-variants.md)
    for stores in re.findall(r"(\d+) bytes spill stores", log):
        assert stores == "0", log


# ---- against the reference (GPU) ------------------------------------------------------------------

def _rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("body", VARIANTS[:4] + VARIANTS[5:])
@pytest.mark.parametrize("lq, lk, hq, hkv", [(1, 1, 2, 2), (7, 7, 14, 2), (113, 1023, 2, 2), (1023, 1023, 2, 1)])
def test_matches_the_reference(body, lq, lk, hq, hkv):
    require("cuda")
    spec = spec_of(body + f"\n heads q={hq} kv={hkv}")
    rng = np.random.default_rng(lq * 31 + lk)
    d_qk, d_v = spec.head_dim_qk, spec.head_dim_v
    q, k, v = _rand(rng, 2, lq, hq, d_qk), _rand(rng, 2, lk, hkv, d_qk), _rand(rng, 2, lk, hkv, d_v)
    check(spec, "cuda", q, k, v)


@pytest.mark.parametrize("opts", ["", "target cuda { persistent=off }"], ids=["persistent", "plain grid"])
@pytest.mark.parametrize("kind", ["docs", "random4", "heads", "additive"])
def test_custom_masks(kind, opts):
    """Custom masks: the producer walks the block's list of live tiles, copies a boolean mask's
    words of each partial tile beside K and V (odd lengths: rows and keys past the mask's end),
    cleans V on partial ones; persistent blocks and the plain grid."""
    require("cuda")
    spec = spec_of(f"head_dim 128\n heads q=2 kv=2\n dtype bf16\n mask custom\n {opts}")
    assert kernel_for(spec, "cuda").plan.config.producer
    rng = np.random.default_rng(len(kind))
    b, lq, lk = 2, 300, 413
    q, k, v = _rand(rng, b, lq, 2, 128), _rand(rng, b, lk, 2, 128), _rand(rng, b, lk, 2, 128)
    mask = make_mask(kind, rng, b, lq, lk, 2)
    bm = attngen.block_mask(_device_mask("cuda", mask), kernel_for(spec, "cuda"))
    check(spec, "cuda", q, k, v, mask=bm, ref_kw={"mask": mask}, expect_empty_rows=kind == "additive")


def test_custom_mask_packed_sequences_take_the_varlen_entry():
    """The producer kernel of a custom mask takes padded launches; packed sequences go to its
    _varlen entry, which keeps the same tiles, so one BlockMask serves both."""
    require("cuda")
    spec = spec_of("head_dim 128\n heads q=4 kv=2\n dtype f16\n mask custom")
    kern = kernel_for(spec, "cuda")
    v_cfg = kern.plan.details.varlen
    assert kern.plan.config.producer and v_cfg is not None
    rng = np.random.default_rng(5)
    lens = [7, 0, 200, 131]
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    total = int(cu[-1])
    q, k, v = _rand(rng, total, 4, 128), _rand(rng, total, 2, 128), _rand(rng, total, 2, 128)
    mask = rng.random((len(lens), 1, max(lens), max(lens))) < 0.4
    bm = attngen.block_mask(_device_mask("cuda", mask), kern)
    check(spec, "cuda", q, k, v, mask=bm, cu_seqlens_q=_device_ints("cuda", cu),
          ref_kw={"mask": mask, "cu_seqlens_q": cu})


def test_planted_nonfinite_values_reach_only_their_rows():
    """inf / NaN in V at keys a causal mask hides from some rows: the producer zeroes them in the
    partial tiles and the consumers mark the rows that do see them (NaN there only)."""
    require("cuda")
    spec = spec_of("head_dim 128\n dtype f16\n mask causal(bottom_right)\n tile q=128 kv=128\n"
                   " target cuda { producer=on }")
    rng = np.random.default_rng(11)
    lq, lk = 300, 520
    q, k, v = _rand(rng, 2, lq, 2, 128), _rand(rng, 2, lk, 2, 128), _rand(rng, 2, lk, 2, 128)
    k, v = _plant(k, v, [230, 231, 400, 519])
    out, lse = kernel_for(spec, "cuda")(*to_device("cuda", spec.dtype, q, k, v), return_lse=True)
    ref, ref_lse = reference(spec, q, k, v, return_lse=True)
    _compare(spec, _np(out), _np(lse), ref, ref_lse)


def test_the_same_function_as_the_plain_loop():
    """producer=on and off agree closely on a grid of many blocks (a race between the producer's
    copies and the consumers shows here: it did before the copies were committed before waiting)."""
    require("cuda")
    rng = np.random.default_rng(5)
    q, k, v = _rand(rng, 4, 1024, 8, 128), _rand(rng, 4, 1024, 8, 128), _rand(rng, 4, 1024, 8, 128)
    outs = []
    for mode in ("on", "off"):
        spec = spec_of(f"head_dim 128\n dtype f16\n mask causal\n tile q=128 kv=128\n target cuda {{ producer={mode} }}")
        outs.append(_np(kernel_for(spec, "cuda")(*to_device("cuda", spec.dtype, q, k, v))).astype(np.float32))
    assert np.abs(outs[0] - outs[1]).max() <= 2e-3


@pytest.mark.parametrize("window", ["window(left=1073741824, right=1073741824)", "window(left=5, right=1073741824)",
                                    "window(left=1073741824, right=3)", "window(left=0, right=0)"])
@pytest.mark.parametrize("lq, lk", [(300, 413), (413, 300)])
def test_windows_at_the_int_limits(window, lq, lk):
    """The Hopper family's partial tiles test each score against a row's visible keys as bits
    (Mask::row_bits): windows of 2^30 keys on either side (the bounds are clamped before the
    window is added, so nothing overflows int) and of none, with Lq above and below Lk."""
    require("cuda")
    spec = spec_of(f"head_dim 128\n heads q=2 kv=2\n dtype f16\n mask {window}")
    rng = np.random.default_rng(lq + len(window))
    q, k, v = _rand(rng, 2, lq, 2, 128), _rand(rng, 2, lk, 2, 128), _rand(rng, 2, lk, 2, 128)
    check(spec, "cuda", q, k, v)
