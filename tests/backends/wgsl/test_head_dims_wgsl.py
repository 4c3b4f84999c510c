"""WGSL head dims 8..1024 and `tile d=` chunking: plans on every profile, emitted source, and
kernels run on the adapter present (lavapipe in CI) against the float64 reference.

Large head dims stream K and V through workgroup memory in chunks of tile d columns (chosen
by the planner when the whole head dim does not fit) and split the output columns over
V_BLOCKS workgroups (grid.y = Hq * V_BLOCKS). Shapes are small: lavapipe is slow.
"""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

import attngen
from attngen.api import emit_plan
from attngen.errors import SpecError
from attngen.api import lower as plan
from attngen.plan.formulas import evaluate_all as grid_size

from conftest import ROOT, check_against_reference, random_qkv, require, spec_of

PROFILES = ["webgpu-core", "wgpu-software", "wgpu-vulkan-nvidia"]
HEAD_DIMS = ["8", "40", "80", "96", "160", "320", "512", "1024", "qk=576 v=512", "qk=192 v=128"]


# ---- plans and source: no device needed -----------------------------------------------------

@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("dtype", ["f16", "f32"])
def test_every_head_dim_builds_on_every_profile(profile, dtype):
    for hd in HEAD_DIMS:
        spec = spec_of(f"head_dim {hd}\n dtype {dtype}\n mask causal")
        p = plan(spec, "wgsl", profile)
        c = p.config
        assert c.smem_bytes <= _limit(profile)
        assert c.workgroup <= (256 if profile == "webgpu-core" else 1024)
        assert c.rows * c.cols <= 64  # acc registers per invocation
        src = emit_plan(p).source
        if c.chunked:
            assert f"const TILE_D: u32 = {c.tile_d}u;" in src and f"const V_BLOCKS: u32 = {c.v_blocks}u;" in src
            assert f"Head dim: tile d={c.tile_d} (chosen" in src  # the header says so
            assert "fn load_k_chunk(" in src and "fn load_k_tile(" not in src
        else:
            assert "const TILE_D:" not in src and "fn load_k_tile(" in src and "fn load_k_chunk(" not in src


def _limit(profile):
    from attngen.api import get_profile
    return get_profile(profile, "wgsl").limit("workgroup_storage_bytes")


def test_webgpu_core_chooses_a_chunk_when_the_head_dim_does_not_fit():
    p = plan(spec_of("head_dim 1024\n dtype f32"), "wgsl", "webgpu-core")
    c = p.config
    assert c.chunked and not c.tile_d_given and c.smem_bytes <= 16384
    assert (c.tile_d, c.v_blocks, c.v_cols) == (64, 4, 256)  # 2 rows x 32 columns of acc per invocation
    assert p.grid == ("ceil(Lq / 16)", "Hq * 4", "B")
    assert grid_size(p.grid, Lq=33, Hq=3, B=2) == (3, 12, 2)
    assert "tile d=64 (chosen: the whole head dim does not fit)" in c.smem_summary
    m = emit_plan(p).manifest
    assert m["dispatch"] == ["ceil(Lq / 16)", "Hq * 4", "B"] and m["grid"] == m["dispatch"]
    assert m["head_dim_chunks"]["tile_d"] == 64 and m["head_dim_chunks"]["v_blocks"] == 4
    # head dims that fit whole keep the unchunked kernel (and its golden source)
    assert not plan(spec_of("head_dim 64\n dtype f16"), "wgsl", "webgpu-core").config.chunked


def test_given_tile_d_is_kept():
    for profile in PROFILES:
        c = plan(spec_of("head_dim qk=576 v=512\n dtype f16\n tile d=64"), "wgsl", profile).config
        assert c.tile_d == 64 and c.tile_d_given and c.tile_dqk == 64
        assert c.d_qk // c.tile_dqk == 9
    # d wider than the head dim of v: v is one chunk
    c = plan(spec_of("head_dim qk=256 v=64\n dtype f32\n tile d=128"), "wgsl", "wgpu-software").config
    assert (c.tile_dqk, c.tile_dv) == (128, 64)


@pytest.mark.parametrize("body, profile, message, hint", [
    ("head_dim qk=576 v=512\n dtype f16\n tile d=128", "webgpu-core",
     "tile d=128 does not divide head_dim qk=576", "use d=288"),
    ("head_dim 64\n dtype f32\n tile q=16 d=8\n target wgsl { workgroup=256 subgroups=off }", "webgpu-core",
     "tile d=8 is not a multiple of 64 (4 columns for each of the 16 invocations per row)", "multiple of 64"),
    ("head_dim 1024\n dtype f32\n tile d=1024", "webgpu-core",
     "tile q=16 kv=4 d=1024 with head_dim qk=1024 v=1024 needs", "smaller tile d"),
])
def test_tile_d_that_cannot_work_is_an_error(body, profile, message, hint):
    with pytest.raises(SpecError) as info:
        plan(spec_of(body), "wgsl", profile)
    (d,) = info.value.diagnostics
    assert message in d.message and hint in (d.hint or "")
    assert d.span.line == 4  # the tile line


def test_check_prints_the_chunk(tmp_path):
    path = tmp_path / "big.attn"
    path.write_text("attention big {\n head_dim 1024\n dtype f16\n}\n")
    res = subprocess.run([sys.executable, "-m", "attngen", "check", str(path), "--target", "wgsl",
                          "--profile", "webgpu-core"], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert re.search(r"tile d=\d+ \(chosen: the whole head dim does not fit\)", res.stdout)
    assert re.search(r"grid: \(ceil\(Lq / 16\), Hq \* \d+, B\)", res.stdout)
    assert "register tiling: sub-block " in res.stdout


# ---- kernels on the adapter ---------------------------------------------------------------------

# (spec body, shapes (B, Lq, Lk, Hq, Hkv)): every listed head dim, both dtypes, a mixed
# accumulator, masks, GQA groups 1/4/7, lengths 1/7/113 with Lq != Lk. Each spec is one compile.
RUNS = {
    "d8-f32-tile-d8-causal": ("head_dim 8\n dtype f32\n tile d=8\n mask causal", [(1, 7, 113, 4, 1)]),
    "d40-f16-window": ("head_dim 40\n dtype f16\n tile d=8\n mask window(left=5, right=2)",
                       [(1, 113, 7, 7, 1), (1, 1, 1, 1, 1)]),
    "d80-f32-bottom-right": ("head_dim 80\n dtype f32\n tile d=16\n mask causal(bottom_right)",
                             [(1, 7, 113, 4, 1)]),
    "d96-f16-mixed-acc": ("head_dim 96\n dtype f16\n tile d=32\n accumulate qk=f32 pv=f16\n softcap 30",
                          [(1, 7, 33, 2, 2)]),
    "d160-f16-causal": ("head_dim 160\n dtype f16\n tile d=32\n mask causal", [(1, 7, 113, 7, 7)]),
    "d320-f32": ("head_dim 320\n dtype f32\n mask causal(bottom_right)", [(1, 7, 40, 4, 1)]),
    "d512-f16-window": ("head_dim 512\n dtype f16\n mask window(left=9)", [(1, 33, 40, 2, 1)]),
    "d1024-f32": ("head_dim 1024\n dtype f32", [(1, 7, 33, 7, 1)]),
    "mla-576-512-f16-acc-qk-f16": ("head_dim qk=576 v=512\n dtype f16\n accumulate qk=f16 pv=f32\n"
                                   " mask causal(bottom_right)", [(1, 7, 40, 4, 1)]),
    "192-128-f32-tile-d64": ("head_dim qk=192 v=128\n dtype f32\n tile d=64\n mask causal",
                             [(1, 113, 7, 2, 1)]),
}


@pytest.mark.parametrize("case", sorted(RUNS))
def test_matches_reference(case):
    require("wgsl")
    body, shapes = RUNS[case]
    spec = spec_of(body, name="hd")
    for i, (b, lq, lk, hq, hkv) in enumerate(shapes):
        q, k, v = random_qkv(spec, b, lq, lk, heads_q=hq, heads_kv=hkv, seed=300 + i)
        check_against_reference(spec, "wgsl", q, k, v)


def test_webgpu_core_plan_runs():
    """The browser profile's plan (a chosen chunk, the output split over two workgroups) compiled
    by naga and run on the adapter, written into out= as a whole."""
    require("wgsl")
    from attngen.reference import reference, relative_error, tolerance
    from attngen.backends import wgsl as rt
    spec = spec_of("head_dim 1024\n dtype f16\n mask causal(bottom_right)", name="core")
    kernel = rt.compile_kernel(spec, "webgpu-core")
    c = kernel.plan.config
    assert c.chunked and c.v_blocks >= 2
    q, k, v = (a.astype(np.float16) for a in random_qkv(spec, 1, 7, 20, heads_q=2, heads_kv=1, seed=9))
    out = np.full((1, 7, 2, 1024), np.nan, np.float16)
    _, lse = kernel(q, k, v, out=out, return_lse=True)
    ref, ref_lse = reference(spec, q, k, v, return_lse=True)
    assert not np.isnan(out).any()
    assert relative_error(out, ref) <= tolerance(spec)
    np.testing.assert_allclose(lse, ref_lse, rtol=0, atol=1e-4)


def test_a_split_output_whose_blocks_are_not_multiples_of_8_plans_and_runs():
    """Fuzz finding: v=264 with qk=64 on wgpu-software split the output into 2 blocks of 132
    columns, which no chunk of multiples of 8 covers, and the planner raised IndexError. The
    split now keeps blocks chunkable (3 blocks of 88)."""
    spec = spec_of("head_dim qk=64 v=264\n dtype f32")
    c = plan(spec, "wgsl", "wgpu-software").config
    assert c.chunked and c.v_blocks == 3 and c.tile_d % 8 == 0
    require("wgsl")
    q, k, v = random_qkv(spec, 1, 7, 13, heads_q=1, heads_kv=1, seed=3)
    check_against_reference(spec, "wgsl", q, k, v)
