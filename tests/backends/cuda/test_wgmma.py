"""The Hopper kernel family (wgmma, sm_90a): which specs the plan gives it on cuda-sm90, what it
leaves to mma.sync (and says so), and what its source holds. Checked without a GPU; the
equivalence suite runs every variant through it on an H100 (tests/equivalence, on the GPU
machine), NVRTC compiles every example and variant for sm_90a (test_nvrtc.py), and the default
plans do not spill (test_spills.py)."""

from __future__ import annotations

import pytest

import attngen
from attngen.api import emit_plan
from attngen.backends.cuda import BACKEND
from attngen.backends.cuda.devices import profile_for

from conftest import spec_of


def _plan(body, profile="cuda-sm90"):
    return attngen.lower(spec_of(body), "cuda", profile)


@pytest.mark.parametrize("body", [
    "head_dim 64\n dtype f16\n mask causal",
    "head_dim 128\n dtype bf16",
    "head_dim 256\n dtype f16\n mask window(left=100)",
    "head_dim qk=192 v=128\n dtype bf16\n mask causal",           # MLA prefill
    "head_dim 128\n heads q=28 kv=4\n dtype bf16\n mask causal",  # a GQA group of 7
    "head_dim 96\n dtype f16\n mask causal\n softcap 30",
    "head_dim 128\n dtype f16\n mask custom",
    "head_dim 128\n dtype f16\n tile q=192 kv=64",
])
def test_hopper_takes_the_f16_and_bf16_prefill_kernels(body):
    p = _plan(body)
    c = p.config
    assert c.math == "wgmma" and c.family_note == ""
    assert c.tile_q % 64 == 0 and c.warps == c.tile_q // 16 and c.frags == 1
    assert c.d_qk_pad % 64 == 0 and c.d_v_pad % 64 == 0
    assert p.details.arch == "sm_90a"
    assert "Hopper tensor cores (wgmma" in p.summary()
    # the same spec on sm_80 keeps mma.sync, and says nothing of a family it cannot have
    old = _plan(body, "cuda-sm80").config
    assert old.math == "mma" and old.family_note == ""


@pytest.mark.parametrize("body, why", [
    ("head_dim 128\n dtype f32", "f32 storage runs on CUDA cores"),
    ("head_dim 128\n dtype f16\n accumulate qk=f16", "accumulate f16"),
    ("head_dim 128\n dtype f16\n schedule split_kv(4)", "split decode schedules"),
    ("head_dim 128\n dtype f16\n kv_cache paged(page=16)", "paged KV cache"),
    ("head_dim 1024\n dtype f16\n mask causal", "head dims above 512 take the wgmma family only with P through memory"),
    ("head_dim 512\n dtype f16\n mask window(left=64)", "head dims above 256 on the wgmma family take the producer"),
    ("head_dim 128\n dtype f16\n tile q=32", "tile q=32 is not a multiple of 64"),
    ("head_dim 128\n dtype f16\n tile q=128\n target cuda { warps=4 }", "warps=4"),
])
def test_what_stays_on_mma_sync_is_said(body, why):
    p = _plan(body)
    assert p.config.math in ("mma", "fma")
    assert why in p.config.family_note
    lines = BACKEND.describe(p)
    assert any(line.startswith("kernel family: mma.sync, not the Hopper wgmma family") and why in line
               for line in lines), lines


def test_only_compute_capability_9_0_gets_the_family():
    hopper = profile_for(BACKEND, 90)
    assert hopper.section("device")["arch"] == "sm_90a" and hopper.features["wgmma"]
    spec = spec_of("head_dim 128\n dtype f16\n mask causal")
    assert attngen.lower(spec, "cuda", hopper).config.math == "wgmma"
    for cc in (100, 120):  # later GPUs have no wgmma: the mma.sync family, their own arch
        prof = profile_for(BACKEND, cc)
        assert prof.section("device")["arch"] == f"sm_{cc}" and not prof.features["wgmma"]
        assert attngen.lower(spec, "cuda", prof).config.math == "mma"


def test_the_source_and_the_manifest():
    p = _plan("head_dim 128\n dtype f16\n mask causal\n target cuda { producer=off }")  # (test_producer: with it)
    em = emit_plan(p)
    src = em.source
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16" in src
    assert "fence.proxy.async.shared::cta" in src and "swizzled<kRows>(r, col)" in src
    assert "mma.sync.aligned" not in src  # no m16n8k16 products
    assert "ldmatrix" not in src and "padded by 16 bytes" not in src
    # the buffers plus the alignment slack
    assert p.smem_bytes == sum(b.bytes for b in p.config.buffers) + 1024
    assert em.manifest["dynamic_shared_memory_bytes"] == p.smem_bytes
    assert em.manifest["compile_options"][-1] == "--gpu-architecture=sm_90a"
    # launches with per-sequence lengths: the _varlen entry point, tile kv 64 (causal auto tiles:
    # q64 there, with or without the producer in the main entry)
    v = p.config.varlen
    assert v.math == "wgmma" and (v.tile_q, v.tile_kv) == (64, 64)
    full = _plan("head_dim 128\n dtype f16").config  # a producer kernel: the producer there too, kv 96
    assert (full.varlen.tile_q, full.varlen.tile_kv) == (full.tile_q, 96)
    assert full.varlen.producer and full.varlen.persistent and not full.varlen.tma
    assert p.details.varlen.entry == p.entry + "_varlen"
    bf = emit_plan(_plan("head_dim 256\n dtype bf16")).source
    assert "m64n48k16.f32.bf16.bf16" in bf and "m64n256k16.f32.bf16.bf16" in bf  # tile kv 48 (3 stages)


def test_a_padded_head_dim_is_zero_filled():
    p = _plan("head_dim 96\n dtype f16")
    assert (p.config.d_qk_pad, p.config.d_v_pad) == (128, 128)
    assert "dst[swizzled<kRows>(i / (kColsPad - kCols), kCols + i % (kColsPad - kCols))] = elem_t(0);" in emit_plan(p).source
