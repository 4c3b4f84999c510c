"""f16 storage without shader-f16 (issue 13): the WGSL kernels read and write f16 as pairs in u32
words and compute in f32 (`target wgsl { f16=packed }`, or an adapter without the feature). Every
variant against the float64 reference on the adapter at hand (lavapipe in CI) with the f16
tolerance: plain and masked prefill at odd lengths, GQA 7, softcap, a chunked head dim, the
split schedules over a paged cache, the append (the cache is written bit for bit), custom
masks, hidden non-finite keys, and the output's two halves of a word written by different
invocations."""

from __future__ import annotations

import numpy as np
import pytest

import attngen
from attngen.reference import reference, relative_error, tolerance

from conftest import kernel_for, random_qkv, require, runtime_inputs, spec_of, to_device
from test_variants import _append_reference, _device_ints, _np, _rand, check, paged_cache

PACKED = "\n target wgsl { f16=packed }"


def _spec(body):
    return spec_of(body + PACKED)


@pytest.mark.parametrize("body, lq, lk, hq, hkv", [
    ("head_dim 64\n dtype f16", 7, 113, 4, 2),
    ("head_dim 64\n dtype f16\n mask causal", 113, 113, 4, 4),
    ("head_dim 32\n dtype f16\n mask causal(bottom_right)", 1, 1023, 7, 1),    # decode row, GQA 7
    ("head_dim 64\n dtype f16\n mask window(left=9, right=3)", 37, 50, 2, 2),
    ("head_dim 96\n dtype f16\n softcap 30", 17, 33, 2, 1),
    ("head_dim 512\n dtype f16\n tile d=64", 5, 40, 2, 2),                     # chunked head dim
    ("head_dim qk=48 v=32\n dtype f16\n mask causal", 9, 9, 3, 3),            # unequal head dims
])
def test_prefill(body, lq, lk, hq, hkv):
    require("wgsl")
    spec = _spec(body)
    kernel = kernel_for(spec, "wgsl")
    assert kernel.plan.config.f16_packed and "shader-f16" not in kernel.plan.features
    q, k, v = random_qkv(spec, 2, lq, lk, heads_q=hq, heads_kv=hkv, seed=lq)
    check(spec, "wgsl", q, k, v)


@pytest.mark.parametrize("schedule", ["split_kv(4)", "two_pass"])
def test_split_schedules_over_a_paged_cache(schedule):
    require("wgsl")
    spec = _spec(f"head_dim 64\n dtype f16\n kv_cache paged(page=16)\n schedule {schedule}")
    rng = np.random.default_rng(10)
    lens = np.array([100, 1, 33], np.int32)
    k, v, table, _ = paged_cache(rng, lens, 16, 2, 64, 64)
    table = np.minimum(table, len(k) - 1)
    q = _rand(rng, 3, 1, 8, 64)
    check(spec, "wgsl", q, k, v, kv_lens=_device_ints("wgsl", lens), block_table=_device_ints("wgsl", table),
          ref_kw={"kv_lens": lens, "block_table": table})


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_append_writes_the_cache_bit_for_bit(paged):
    require("wgsl")
    cache = "paged(page=8)" if paged else "contiguous"
    spec = _spec(f"head_dim 32\n dtype f16\n mask causal(bottom_right)\n kv_cache {cache}")
    rng = np.random.default_rng(8)
    lens = np.array([0, 13, 30], np.int32)
    lnew = 3
    if paged:
        k, v, table, _ = paged_cache(rng, lens + lnew, 8, 4, 32, 32)
        table = np.minimum(table, len(k) - 1)
    else:
        k, v, table = _rand(rng, 3, 40, 4, 32), _rand(rng, 3, 40, 4, 32), None
    k, v = k.astype(np.float16), v.astype(np.float16)
    k_new, v_new = _rand(rng, 3, lnew, 4, 32).astype(np.float16), _rand(rng, 3, lnew, 4, 32).astype(np.float16)
    k_new[0, 0, 0, :2] = [np.inf, np.nan]  # copied as bits, not converted
    q = _rand(rng, 3, lnew, 4, 32)
    k_after, v_after = _append_reference(k, v, k_new, v_new, lens, table)
    kernel = kernel_for(spec, "wgsl")
    dk, dv = k.copy(), v.copy()
    extra = {"block_table": table} if paged else {}
    kernel(q.astype(np.float16), dk, dv, kv_lens=lens, k_new=k_new, v_new=v_new, **extra)
    assert dk.tobytes() == k_after.tobytes() and dv.tobytes() == v_after.tobytes()
    k_new[0, 0, 0, :2] = 0  # the keys the reference sees (a NaN key would make its rows NaN)
    k_after, v_after = _append_reference(k, v, k_new, v_new, lens, table)
    dk, dv = k.copy(), v.copy()
    out = kernel(q.astype(np.float16), dk, dv, kv_lens=lens, k_new=k_new, v_new=v_new, **extra)
    ref = reference(spec, q, k_after.astype(np.float32), v_after.astype(np.float32), kv_lens=lens + lnew,
                    **({"block_table": table} if paged else {}))
    assert relative_error(_np(out), ref) <= tolerance(spec)


def test_custom_mask():
    require("wgsl")
    spec = _spec("head_dim 64\n dtype f16\n mask custom")
    q, k, v = random_qkv(spec, 2, 37, 50, heads_q=4, heads_kv=2, seed=3)
    k, v, call, ref_kw = runtime_inputs(spec, "wgsl", q, k, v, seed=3)
    check(spec, "wgsl", q, k, v, ref_kw=ref_kw, **call)


def test_hidden_keys_with_non_finite_values_change_nothing():
    """Keys after row 30 hold inf in K and NaN in V: rows before 30 do not see them (causal) and
    are unchanged; the later rows are NaN exactly where the float64 reference says so."""
    require("wgsl")
    spec = _spec("head_dim 64\n dtype f16\n mask causal")
    q, k, v = random_qkv(spec, 1, 40, 40, heads_q=2, heads_kv=2, seed=4)
    k_bad, v_bad = k.copy(), v.copy()
    k_bad[0, 30:, :, 0], v_bad[0, 30:, :, 1] = np.inf, np.nan
    kernel = kernel_for(spec, "wgsl")
    out = _np(kernel(*to_device("wgsl", "f16", q, k_bad, v_bad)))
    ref = reference(spec, q, k, v)
    assert not np.isnan(out[0, :30]).any()
    assert relative_error(out[0, :30], ref[0, :30]) <= tolerance(spec)
    ref_bad = reference(spec, q, k_bad, v_bad)
    assert np.isnan(ref_bad).any()
    assert np.array_equal(np.isnan(out), np.isnan(ref_bad))


def test_every_element_of_out_is_written():
    """Each u32 word of out holds elements of two invocations: out is filled with NaN first, and
    every element must come back finite and right."""
    require("wgsl")
    spec = _spec("head_dim 16\n dtype f16")
    q, k, v = random_qkv(spec, 1, 33, 21, heads_q=3, heads_kv=3, seed=5)
    kernel = kernel_for(spec, "wgsl")
    out = np.full((1, 33, 3, 16), np.nan, np.float16)
    kernel(*to_device("wgsl", "f16", q, k, v), out=out)
    assert not np.isnan(out).any()
    assert relative_error(out.astype(np.float64), reference(spec, q, k, v)) <= tolerance(spec)


def test_the_checker_and_the_plan():
    from attngen.api import emit_plan, get_profile
    spec = _spec("head_dim 64\n dtype f16")
    p = attngen.lower(spec, "wgsl", "webgpu-core")
    src = emit_plan(p).source
    assert "enable f16;" not in src and "array<atomic<u32>>" in src and "unpack2x16float" in src
    assert p.features == () and "f16 packed in u32 words" in p.summary()
    # accumulate f16 is f16 arithmetic: refused with packed storage
    bad = spec_of("head_dim 64\n dtype f16\n accumulate qk=f16" + PACKED)
    (d,) = attngen.check(bad, "wgsl", get_profile("webgpu-core", "wgsl"))
    assert "packed storage computes in f32" in d.message
    # a profile without shader-f16 packs f16 by itself (auto)
    prof = get_profile("webgpu-core", "wgsl").narrowed(features={"guaranteed": [], "optional": ["subgroups"]})
    auto = attngen.lower(spec_of("head_dim 64\n dtype f16"), "wgsl", prof)
    assert auto.config.f16_packed
    (d,) = attngen.check(spec_of("head_dim 64\n dtype f16\n target wgsl { f16=native }"), "wgsl", prof)
    assert "f16=native needs the shader-f16 feature" in d.message
