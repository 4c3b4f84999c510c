"""The register-tiled WGSL kernel (issue 13 part 1): the sub-block the plan picks from the
profile (invocations, workgroup storage, the register budget), what `attngen check` and
`--emit ir` show of it, and every sub-block shape the plan can pick run on the adapter against
the float64 reference at the design tolerances: odd lengths (1, 7, 113), Lq != Lk, GQA group 7,
head dims 64 / 128 / 512, whole rows per invocation (P in registers) and shared rows (P through
sP, row max over subgroup shuffles or workgroup memory).
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from attngen.api import emit_plan, get_profile
from attngen.backends import get
from attngen.errors import LaunchError
from attngen.api import lower as plan

from conftest import ROOT, check_against_reference, random_qkv, require, spec_of

pytestmark = pytest.mark.wgsl


def _shape(c):
    return (c.threads_per_row, c.rows, c.keys, c.cols)


# ---- the plan's choice: no device needed ------------------------------------------------------

@pytest.mark.parametrize("dtype, head_dim, kv, cols", [("f32", 64, 32, 8), ("f16", 64, 64, 8), ("f16", 128, 64, 16),
                                                     ("f32", 128, 32, 16)])
def test_gpu_profile_picks_4_rows_by_4_or_8_keys(dtype, head_dim, kv, cols):
    """wgpu-vulkan-nvidia, fused kernels: 128-row tiles, 8 invocations per row (within a
    subgroup of 32), 4 rows each: a 4 x (kv / 8) block of S and 4 rows x head_dim / 8 columns
    of acc, 256 invocations (the head dims stream through workgroup memory in chunks); 32 keys
    per tile in f32, 64 in f16 (the profile's f16 row)."""
    c = plan(spec_of(f"head_dim {head_dim}\n dtype {dtype}\n mask causal"), "wgsl", "wgpu-vulkan-nvidia").config
    assert (c.tile_q, c.tile_kv, c.workgroup) == (128, kv, 256)
    assert _shape(c) == (8, 4, kv // 8, cols) and c.reduction == "subgroup"
    assert c.smem_bytes <= 49152


@pytest.mark.parametrize("dtype", ["f16", "f32"])
def test_gpu_profile_split_schedules_keep_64_rows(dtype):
    """The q128 row is for fused kernels (`schedule = "fused"`): decode (split_kv, a few rows
    per KV head) keeps 64 x 32 tiles and 128 invocations where it runs the register-tiled kernel
    (decode=off); under auto this profile takes the decode kernel (its decode_kernel)."""
    text = f"head_dim 128\n heads q=32 kv=8\n dtype {dtype}\n schedule split_kv(auto)"
    c = plan(spec_of(text + "\n target wgsl { decode=off }"), "wgsl", "wgpu-vulkan-nvidia").config
    assert (c.tile_q, c.tile_kv, c.workgroup) == (64, 32, 128) and c.decode is None
    assert plan(spec_of(text), "wgsl", "wgpu-vulkan-nvidia").config.decode is not None


@pytest.mark.parametrize("head_dim", [32, 64])
def test_gpu_profile_f16_decode_up_to_d64_takes_one_row_per_invocation(head_dim):
    """wgpu-vulkan-nvidia's f16 split-schedule row up to d64 (`dtype`, `schedule`,
    `rows_per_invocation` = 1), where the register-tiled kernel runs (decode=off): 32 x 16 tiles,
    4 invocations per row, one row each, 128 invocations; the fused f16 kernels take the q128 row."""
    fused = plan(spec_of(f"head_dim {head_dim}\n dtype f16"), "wgsl", "wgpu-vulkan-nvidia").config
    assert (fused.tile_q, fused.tile_kv, fused.workgroup) == (128, 64, 256)
    c = plan(spec_of(f"head_dim {head_dim}\n dtype f16\n schedule split_kv(auto)\n target wgsl {{ decode=off }}"),
             "wgsl", "wgpu-vulkan-nvidia").config  # (under auto: the decode kernel)
    assert (c.tile_q, c.tile_kv, c.workgroup) == (32, 16, 128)
    assert _shape(c)[:3] == (4, 1, 4) and c.reduction == "subgroup"


@pytest.mark.parametrize("head_dim, cols", [(64, 8), (128, 16)])
def test_webgpu_core_picks_2_rows_by_2_keys(head_dim, cols):
    """webgpu-core (16 KiB, 256 invocations, no subgroups): 16 x 16 tiles, 8 invocations per row
    reducing through sRed, 2 rows each (a workgroup of 64)."""
    c = plan(spec_of(f"head_dim {head_dim}\n dtype f16"), "wgsl", "webgpu-core").config
    assert (c.tile_q, c.tile_kv, c.workgroup) == (16, 16, 64)
    assert _shape(c) == (8, 2, 2, cols) and c.reduction == "workgroup"
    assert c.smem_bytes <= 16384


def test_webgpu_core_builds_head_dim_512_with_64_rows():
    """Tile rows are not tied to invocations: q=64 kv=64 d=64 at head dim 512 fits webgpu-core's
    256 invocations and 16 KiB (whole rows per invocation: no sP; the rows unpadded)."""
    spec = spec_of("head_dim 512\n dtype f16\n tile q=64 kv=64 d=64\n target wgsl { f16=native }")
    p = plan(spec, "wgsl", "webgpu-core")
    c = p.config
    assert c.workgroup <= 256 and c.smem_bytes <= 16384
    assert (c.tile_q, c.tile_kv, c.tile_d) == (64, 64, 64)
    assert _shape(c) == (1, 1, 64, 64) and c.v_blocks == 8 and c.pad == 0
    src = emit_plan(p).source
    assert "const ROWS: u32 = 1u;" in src and "var<workgroup> sP" not in src


def test_check_and_ir_show_the_sub_block(tmp_path):
    path = tmp_path / "t.attn"
    path.write_text("attention t {\n head_dim 128\n dtype f16\n mask causal\n}\n")
    for args in (["check", str(path)], ["build", str(path), "--emit", "ir"]):
        res = subprocess.run([sys.executable, "-m", "attngen", *args, "--target", "wgsl", "--profile",
                              "wgpu-vulkan-nvidia"], capture_output=True, text=True, cwd=ROOT)
        assert res.returncode == 0, res.stderr
        assert "sub-block 4 row(s) x 8 key(s) of S and 4 x 16 columns of acc per invocation" in res.stdout, args


def test_source_names_the_sub_block():
    src = emit_plan(plan(spec_of("head_dim 64\n dtype f32"), "wgsl", "wgpu-vulkan-nvidia")).source
    for line in ("const ROWS: u32 = 4u;", "const KEYS: u32 = 4u;", "const THREADS_PER_ROW: u32 = 8u;",
                 "const ROW_GROUPS: u32 = 32u;", "Register tiling: sub-block 4 row(s) x 4 key(s)"):
        assert line in src, line
    assert "var<workgroup> sQ: array<vec4<elem_t>" in src and "var<workgroup> sKV: array<vec4<elem_t>" in src
    assert "fma(qv[i].x, kv.x, part[i][u])" in src  # one vec4 of K serves ROWS rows


# ---- every sub-block shape on the adapter ----------------------------------------------------

def _profile(tile_q, threads_per_row, tile_kv):
    """wgpu-software with other defaults: the way to ask the planner for R > 1 rows."""
    base = get_profile("wgpu-software", "wgsl")
    row = {"max_head_dim": 1024, "tile_q": tile_q, "threads_per_row": threads_per_row, "tile_kv": tile_kv}
    return replace(base, name=f"tiles-q{tile_q}-t{threads_per_row}-kv{tile_kv}", defaults=(row,))


ODD = [(1, 1, 7, 7, 1), (2, 7, 113, 7, 7), (1, 113, 40, 7, 1)]  # (B, Lq, Lk, Hq, Hkv): GQA 7, Lq != Lk

# name: (spec body, profile (None: the adapter's; a name; or tiles for _profile), expected (threads_per_row, rows), shapes)
SHAPES = {
    "whole-rows-1": ("head_dim 64\n dtype f32\n mask causal\n tile q=16 kv=16\n target wgsl { workgroup=16 }",
                     None, (1, 1), ODD),
    "whole-rows-4": ("head_dim 128\n dtype f16\n mask causal(bottom_right)\n tile q=32 kv=16\n"
                     " target wgsl { workgroup=8 }", None, (1, 4), ODD),
    "2-per-row": ("head_dim 64\n dtype f32\n mask window(left=5, right=2)\n tile q=16 kv=16\n"
                  " target wgsl { workgroup=32 subgroups=off }", None, (2, 1), ODD),
    # (the software profile pinned: the adapter's own profile picks other sub-blocks, e.g. 4 x 4 on NVIDIA)
    "4x2-subgroups": ("head_dim 64\n dtype f32\n mask causal", "wgpu-software", (4, 2), ODD),
    "4x4-subgroups": ("head_dim 128\n dtype f16\n softcap 30", (64, 4, 16), (4, 4), ODD),
    "8x4-workgroup-memory": ("head_dim 64\n dtype f16\n mask causal\n target wgsl { subgroups=off }",
                             (64, 8, 32), (8, 4), ODD),
    "8x2-webgpu-core": ("head_dim 64\n dtype f16\n mask causal", "webgpu-core", (8, 2), ODD),
    "d512-chunked": ("head_dim 512\n dtype f32\n mask causal", "wgpu-software", (4, 2), [(1, 7, 113, 7, 1)]),
    "d512-webgpu-core-q64": ("head_dim 512\n dtype f16\n tile q=64 kv=64 d=64\n target wgsl { f16=native }",
                             "webgpu-core", (1, 1), [(1, 7, 113, 7, 1), (1, 113, 7, 1, 1)]),
    "4x4-split-gqa": ("head_dim 64\n dtype f16\n mask causal\n schedule split_kv(3)", (64, 4, 16), (4, 4),
                      [(2, 7, 113, 7, 1)]),
    "4x4-two-pass": ("head_dim 64\n dtype f32\n schedule two_pass", (64, 4, 16), (4, 4), [(1, 1, 113, 7, 1)]),
}


@pytest.mark.parametrize("name", list(SHAPES))
def test_sub_block_matches_reference(name):
    require("wgsl")
    from attngen.backends import wgsl as rt
    from attngen.reference import reference, relative_error, tolerance
    body, profile, expected, shapes = SHAPES[name]
    spec = spec_of(body, name="tiles")
    prof = _profile(*profile) if isinstance(profile, tuple) else profile
    try:
        kernel = rt.compile_kernel(spec, prof)
    except LaunchError as e:  # a profile given here may ask for what this adapter lacks (shader-f16 on SwiftShader)
        if "does not have" in str(e):
            pytest.skip(str(e))
        raise
    c = kernel.plan.config
    assert (c.threads_per_row, c.rows) == expected, c.summary()
    for n, (b, lq, lk, hq, hkv) in enumerate(shapes):
        q, k, v = random_qkv(spec, b, lq, lk, heads_q=hq, heads_kv=hkv, seed=n)
        dt = np.float16 if spec.dtype == "f16" else np.float32
        q, k, v = (a.astype(dt) for a in (q, k, v))
        out, lse = kernel(q, k, v, return_lse=True)
        ref, ref_lse = reference(spec, q, k, v, return_lse=True)
        out = np.asarray(out, dtype=np.float64)
        assert relative_error(out, ref) <= tolerance(spec), (name, b, lq, lk, hq, hkv)
        fin = np.isfinite(ref_lse)
        assert np.array_equal(np.isneginf(np.asarray(lse)), np.isneginf(ref_lse))
        assert np.abs(np.asarray(lse)[fin] - ref_lse[fin]).max() <= 1e-3 * max(1.0, np.abs(ref_lse[fin]).max())


# ---- profiles of other adapters: the register budget in the plan ------------------------------

@pytest.mark.parametrize("name, scores, accs", [("wgpu-apple", 32, 64), ("wgpu-intel", 16, 32),
                                                ("wgpu-adreno", 8, 16), ("wgpu-vulkan-nvidia", 32, 64)])
def test_each_vendor_profile_plans_within_its_register_budget(name, scores, accs):
    for body in ("head_dim 64\n dtype f16\n mask causal", "head_dim 128\n dtype f32", "head_dim 512\n dtype f16"):
        p = plan(spec_of(body), "wgsl", name)
        c = p.config
        assert c.budget == (scores, accs)
        assert c.rows * c.keys <= scores and c.rows * c.cols <= accs, (name, body, c.summary())
        assert f"register budget: {scores} scores and {accs} accumulators" in "\n".join(get("wgsl").describe(p))


def test_adreno_gets_smaller_sub_blocks_than_nvidia():
    """seed 001's lesson: where registers decide (Adreno), each invocation holds fewer values."""
    spec = spec_of("head_dim 128\n dtype f16\n mask causal")
    nv, ad = (plan(spec, "wgsl", n).config for n in ("wgpu-vulkan-nvidia", "wgpu-adreno"))
    assert ad.rows * ad.keys < nv.rows * nv.keys and ad.rows * ad.cols < nv.rows * nv.cols


def test_vendor_profiles_match_their_adapters():
    from attngen.backends.wgsl.devices import _matches
    from attngen.api import get_profile
    cases = {"wgpu-adreno": {"vendor_id": 0x5143, "backend_type": "Vulkan", "adapter_type": "IntegratedGPU"},
             "wgpu-intel": {"vendor_id": 0x8086, "backend_type": "Vulkan", "adapter_type": "DiscreteGPU"},
             "wgpu-apple": {"vendor_id": 0, "backend_type": "Metal", "adapter_type": "IntegratedGPU"},
             "wgpu-vulkan-nvidia": {"vendor_id": 0x10DE, "backend_type": "Vulkan", "adapter_type": "DiscreteGPU"}}
    names = list(cases)
    for name, info in cases.items():
        matching = [n for n in names if _matches(get_profile(n, "wgsl"), info)]
        assert matching == [name], (name, matching)


@pytest.mark.parametrize("name", ["wgpu-adreno", "wgpu-intel"])
def test_small_budget_plans_match_the_reference(name):
    """The sub-blocks of the small-budget profiles (fewer keys and columns per invocation, outputs
    split over workgroups, chunked head dims) run on the adapter at hand, vs the reference."""
    require("wgsl")
    from attngen.backends import wgsl as rt
    from attngen.reference import reference, relative_error, tolerance
    # (subgroups off: those profiles assume subgroups of 8 or more, which this adapter may not run)
    for body in ("head_dim 64\n dtype f32\n mask causal", "head_dim 128\n dtype f32\n mask window(left=20)"):
        spec = spec_of(body + "\n target wgsl { subgroups=off }", name="budget")
        kernel = rt.compile_kernel(spec, get_profile(name, "wgsl"))
        for n, (b, lq, lk, hq, hkv) in enumerate(ODD):
            q, k, v = random_qkv(spec, b, lq, lk, heads_q=hq, heads_kv=hkv, seed=n)
            out = np.asarray(kernel(q, k, v), dtype=np.float64)
            assert relative_error(out, reference(spec, q, k, v)) <= tolerance(spec), (name, body, lq, lk)
