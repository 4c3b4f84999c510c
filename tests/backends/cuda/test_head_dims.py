"""Head dims 8..1024 on CUDA: `tile d` chunking of the head dim and output columns split over blocks.

The planner tests run everywhere; the NVRTC compile checks need the NVRTC wheels (no GPU);
the equivalence tests run on a machine with a CUDA GPU and CuPy (PyTorch for bf16).
"""

from __future__ import annotations

import pytest

import attngen
from attngen.api import check as _check


def check(spec, profile):
    """The checker's diagnostics for `spec` on a Profile (its target from the profile)."""
    return _check(spec, profile.target, profile)
from attngen.api import emit_plan
from attngen.api import lower as plan
from attngen.plan.formulas import evaluate_all as grid_size
from attngen.api import get_profile
from attngen.backends.cuda import nvrtc
from attngen.backends.cuda.config import cuda_config

from conftest import check_against_reference, nvrtc_compile, random_qkv, require, spec_of

# (label, spec body, query heads, KV heads): every path of the chunked kernel. "d=" cases give
# `tile d`; the others are chosen by the planner (above 256, whole head dims do not fit).
CASES = [
    ("f32 d8 d=8 causal", "head_dim 8\n dtype f32\n tile d=8\n mask causal", 2, 1),
    ("f16 d8 whole", "head_dim 8\n dtype f16\n mask window(left=3)", 3, 1),
    ("bf16 d40 d=16 bottom-right", "head_dim 40\n dtype bf16\n tile d=16\n mask causal(bottom_right)", 4, 2),
    ("f32 d80 d=32 window", "head_dim 80\n dtype f32\n tile d=32\n mask window(left=5, right=2)", 6, 2),
    ("f16 d96 d=32 acc f16", "head_dim 96\n dtype f16\n accumulate f16\n tile d=32\n mask causal", 4, 4),
    ("bf16 d160 d=64 softcap", "head_dim 160\n dtype bf16\n tile d=64\n softcap 30", 3, 1),
    ("f16 192/128 d=64", "head_dim qk=192 v=128\n dtype f16\n tile d=64\n mask causal", 4, 1),
    ("f16 d264", "head_dim 264\n dtype f16\n mask window(left=40)", 2, 2),
    ("f16 d320 causal", "head_dim 320\n dtype f16\n mask causal", 4, 2),
    ("f16 d320", "head_dim 320\n dtype f16", 3, 1),
    ("bf16 d384 causal gqa3", "head_dim 384\n dtype bf16\n mask causal", 6, 2),
    ("f16 d512", "head_dim 512\n dtype f16", 2, 2),
    ("f16 448/256", "head_dim qk=448 v=256\n dtype f16\n mask causal", 2, 1),
    ("f32 d320 window", "head_dim 320\n dtype f32\n mask window(left=20, right=3)", 2, 1),
    ("bf16 d512 gqa", "head_dim 512\n dtype bf16\n mask causal(bottom_right)", 8, 2),
    ("f16 d512 acc pv f16", "head_dim 512\n dtype f16\n accumulate qk=f32 pv=f16", 2, 1),
    ("f16 576/512 mla", "head_dim qk=576 v=512\n dtype f16\n mask causal", 8, 1),
    ("f16 d1024 bottom-right", "head_dim 1024\n dtype f16\n mask causal(bottom_right)", 2, 1),
    ("bf16 d1024 d=128", "head_dim 1024\n dtype bf16\n tile d=128", 2, 2),
    ("f32 d1024", "head_dim 1024\n dtype f32\n mask causal", 2, 1),
    ("f16 1024/64 acc qk f16", "head_dim qk=1024 v=64\n dtype f16\n accumulate qk=f16 pv=f32", 2, 1),
    # P through memory (cuda-sm90, mask none without softcap above 512; mma.sync chunks on sm80)
    ("f16 d1024", "head_dim 1024\n dtype f16", 3, 1),
    ("bf16 576/512 gqa7", "head_dim qk=576 v=512\n dtype bf16", 7, 1),
    ("f16 d640", "head_dim 640\n dtype f16", 2, 2),
    ("bf16 1024/128", "head_dim qk=1024 v=128\n dtype bf16", 2, 1),
]
# (batch, Lq, Lk): single tokens, odd lengths, Lq != Lk both ways, several K/V and Q tiles.
SHAPES = [(1, 1, 1), (1, 7, 113), (2, 113, 7), (1, 65, 200)]


def _spec(body: str):
    return spec_of(body, name="hd")


# -- the planner --------------------------------------------------------------------------------
@pytest.mark.parametrize("head_dim, chunk, v_blocks, d_v_block, profile", [
    ("320", 64, 2, 192, "cuda-sm80"), ("512", 64, 2, 256, "cuda-sm80"), ("264", 64, 2, 192, "cuda-sm80"),
    ("qk=576 v=512", 64, 2, 256, "cuda-sm80"), ("qk=576 v=512", 64, 2, 256, "cuda-sm90"),
    ("1024", 64, 4, 256, "cuda-sm80"), ("1024", 64, 4, 256, "cuda-sm90"),
    ("qk=1024 v=64", 64, 1, 64, "cuda-sm80"), ("qk=1024 v=64", 64, 1, 64, "cuda-sm90"),
])
def test_wide_head_dims_get_a_chunk_and_column_blocks(head_dim, chunk, v_blocks, d_v_block, profile):
    # (causal: on cuda-sm90 mask none takes P through memory above 512, below)
    c = cuda_config(_spec(f"head_dim {head_dim}\n dtype f16\n mask causal"), get_profile(profile, "cuda"))
    assert (c.chunk, c.v_blocks, c.d_v_block) == (chunk, v_blocks, d_v_block)
    assert not c.chunk_given and c.d_v_block <= 256
    assert [b.name for b in c.buffers] == ["sQ", "sKV"]
    assert all(b.cols == chunk + 8 for b in c.buffers)  # O(tile x chunk), rows padded by 16 bytes


# Head dims above 256 up to 512 on the Hopper family (causal, no softcap; mask none takes P through
# memory, below): the producer
# kernel with Q whole in shared memory and output column blocks; tile kv the widest that fits two
# stages (tiles.py CudaTiles.wide_d_tiles, three where they fit); the _varlen entry streams chunks on mma.sync. A padded
# qk head dim of whole 128-column halves splits Q K^T between the two consumer warpgroups, which
# then own the same 64 rows (CudaTiles.split_qk).
@pytest.mark.parametrize("body, tile_q, tile_kv, stages, v_blocks, d_v_block, d_v_pad, split", [
    ("head_dim 320\n dtype f16\n mask causal", 128, 48, 3, 2, 192, 192, False),
    ("head_dim 264\n dtype f16\n mask causal", 128, 48, 3, 2, 192, 192, False),
    ("head_dim qk=448 v=256\n dtype f16\n mask causal", 128, 32, 2, 1, 256, 256, False),
    ("head_dim 384\n dtype bf16\n mask causal", 128, 32, 3, 2, 192, 192, False),
    ("head_dim 512\n dtype f16\n mask causal", 64, 16, 4, 1, 512, 256, True),
    ("head_dim 512\n dtype bf16\n mask causal(bottom_right)", 64, 16, 4, 1, 512, 256, True),
    ("head_dim qk=256 v=512\n dtype f16\n mask causal", 64, 16, 4, 1, 512, 256, True),
])
def test_head_dims_up_to_512_take_the_wgmma_producer_with_column_blocks(body, tile_q, tile_kv, stages, v_blocks,
                                                                       d_v_block, d_v_pad, split):
    c = cuda_config(_spec(body), get_profile("cuda-sm90", "cuda"))
    assert (c.math, c.chunk, c.producer, c.tma, c.tma_q, c.persistent) == ("wgmma", None, True, True, True, True)
    assert (c.tile_q, c.tile_kv, c.stages, c.v_blocks, c.d_v_block, c.d_v_pad, c.split_qk) == (
        tile_q, tile_kv, stages, v_blocks, d_v_block, d_v_pad, split)
    assert c.threads == 384 and c.frags == 1
    assert c.smem_bytes <= get_profile("cuda-sm90", "cuda").limit("shared_memory_bytes")
    assert c.varlen.math == "mma" and c.varlen.chunk == 64
    p = plan(_spec(body), "cuda", "cuda-sm90")
    # persistent blocks: items of (row tile, head, column block, batch)
    assert p.grid == (f"min(SM, ceil(Lq / {tile_q}) * Hq{' * 2' if v_blocks == 2 else ''} * B)", "1", "1")
    assert p.details.varlen.grid[1] == ("Hq * 2" if c.varlen.v_blocks == 2 else "Hq")
    source = emit_plan(p).source
    assert f"constexpr int kVBlocks = {v_blocks};" in source
    assert ("sum_split_scores(s, sX, ring + it, wg, tid % 128);" in source) is split  # (persistent: tiles run on)
    assert "wgmma.mma_async" in source and "mma.sync.aligned.m16n8k16" in source  # both families, one file


# Head dims above 256 on the Hopper family (mask none, no softcap, auto tiles): P through memory
# (tiles.py CudaTiles.stored_p_tiles): persistent blocks of 128 rows in two phases, P in the ws_p workspace;
# launches with per-sequence lengths take the mma.sync chunks (_varlen).
@pytest.mark.parametrize("body, d_v_pad, passes", [
    ("head_dim 1024\n dtype f16", 1024, 4),
    ("head_dim qk=576 v=512\n dtype bf16\n heads q=14 kv=2", 512, 2),
    ("head_dim 640\n dtype f16", 640, 3),
    ("head_dim qk=1024 v=64\n dtype bf16", 64, 1),
    ("head_dim 320\n dtype f16", 320, 2),
    ("head_dim qk=256 v=512\n dtype bf16", 512, 2),
])
def test_head_dims_above_256_take_p_through_memory(body, d_v_pad, passes):
    c = cuda_config(_spec(body), get_profile("cuda-sm90", "cuda"))
    assert (c.math, c.stored_p, c.tile_q, c.tile_kv, c.stages, c.d_v_block, c.d_v_pad) == (
        "wgmma", True, 128, 64, 4, 256, d_v_pad)
    assert (c.producer, c.tma, c.tma_q, c.persistent, c.threads, c.chunk, c.v_blocks) == (True, True, True, True, 384,
                                                                                          None, 1)
    assert c.varlen.math == "mma" and c.varlen.chunk == 64 and c.family_note == ""
    assert c.smem_bytes <= get_profile("cuda-sm90", "cuda").limit("shared_memory_bytes")
    assert "P through memory" in c.summary()
    p = plan(_spec(body), "cuda", "cuda-sm90")
    assert p.grid == ("min(SM, ceil(Lq / 128) * Hq * B)", "1", "1")
    names = [x.name for x in p.params]
    assert "ws_p" in names and "batch_size" in names and "work_counter" not in names
    (ws,) = p.workspaces
    assert (ws.name, ws.dtype, ws.shape, ws.persistent) == ("ws_p", "u32", ("min(SM, ceil(Lq / 128) * Hq * B)",
                                                                           "16896 * ceil(Lk / 256)"), False)
    source = emit_plan(p).source
    assert f"constexpr int kVBlocks = (kHeadDimVPad + kDvBlock - 1) / kDvBlock;" in source
    assert "wgmma.mma_async.sync.aligned.m64n256k16" in source and "mma.sync.aligned.m16n8k16" in source
    assert "P through memory" in source and "section: phase B" in source
    # a warp whose acc ends non-finite redoes its P V on CUDA cores, keys of weight 0 selected out
    # (tests/equivalence/test_hidden_keys.py runs it on the GPU)
    redo = source[source.index("section: non-finite values (a key of weight 0)"):source.index("section: epilogue")]
    assert "__any_sync(0xffffffffu, !finite)" in redo and "p[x][0] == 0.f ? 0.f" in redo
    assert -(-d_v_pad // 256) == passes


def test_p_through_memory_on_a_small_profile_drops_stages_then_says_why():
    from attngen.plan.kernel_plan import Problem
    prof = get_profile("cuda-sm90", "cuda")
    c = cuda_config(_spec("head_dim 1024\n dtype f16"), prof.narrowed(limits={"shared_memory_bytes": 120 * 1024}))
    assert c.stored_p and c.stages == 2
    with pytest.raises(Problem, match="P through memory .* needs .* bytes of shared memory for 2 stages"):
        cuda_config(_spec("head_dim 1024\n dtype f16"), prof.narrowed(limits={"shared_memory_bytes": 64 * 1024}))


@pytest.mark.parametrize("body, why", [
    ("head_dim 320\n dtype f16\n mask window(left=40)", "a window or custom mask"),
    ("head_dim 320\n dtype f16\n softcap 30", "softcap"),
    ("head_dim 512\n dtype f16\n target cuda { tma=off }", "tma=off"),
    ("head_dim 512\n dtype f16\n tile q=64", "tile q=64"),
    ("head_dim 512\n dtype f16\n accumulate qk=f32 pv=f16", "accumulate f16"),
    ("head_dim 576\n dtype f16\n mask causal", "take the wgmma family only with P through memory, for mask none "
                                               "without softcap and with the planner's own tiles (mask causal)"),
    ("head_dim 1024\n dtype bf16\n softcap 30", "(softcap)"),
    ("head_dim 1024\n dtype f16\n target cuda { stages=2 }", "(stages=2)"),
    ("head_dim 320\n dtype f16\n tile d=64", "tile d"),
])
def test_wide_head_dims_the_wgmma_family_leaves_to_mma_sync_say_why(body, why):
    c = cuda_config(_spec(body), get_profile("cuda-sm90", "cuda"))
    assert c.math == "mma" and c.chunked and why in c.family_note


@pytest.mark.parametrize("head_dim", ["8", "40", "64", "96", "128", "qk=192 v=128", "256"])
@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
def test_head_dims_that_fit_keep_the_whole_head_dim_path(head_dim, dtype):
    c = cuda_config(_spec(f"head_dim {head_dim}\n dtype {dtype}"), get_profile("cuda-sm80", "cuda"))
    assert c.chunk is None and c.v_blocks == 1 and c.chunk_summary == ""


def test_a_given_tile_d_is_kept():
    c = cuda_config(_spec("head_dim 1024\n dtype f16\n tile d=32"), get_profile("cuda-sm90", "cuda"))
    assert (c.chunk, c.chunk_given, c.v_blocks, c.d_v_block) == (32, True, 4, 256)
    c = cuda_config(_spec("head_dim 64\n dtype f32\n tile d=8"), get_profile("cuda-sm90", "cuda"))
    assert (c.chunk, c.v_blocks, c.d_v_block) == (8, 1, 64)


@pytest.mark.parametrize("heads, tile_q, warps", [("q=128 kv=1", 64, 4), ("q=32 kv=1", 32, 2), ("q=12 kv=4", 16, 1),
                                                   (None, 16, 1)])
@pytest.mark.parametrize("profile", ["cuda-sm80", "cuda-sm90"])
def test_split_decode_in_chunks_takes_the_group_in_up_to_64_rows_and_64_keys(heads, tile_q, warps, profile):
    """MLA decode (128 query heads over one latent KV head, 576 / 512 dims in chunks): the GQA
    group's rows in up to 64 rows per block, 64 keys per tile (CudaTiles.split_chunked_tile_kv; 2-3x on the
    H100, benchmarks/NOTES.md). A spec without fixed heads keeps one warp of 16 rows."""
    body = "head_dim qk=576 v=512\n dtype bf16\n tile d=64\n schedule split_kv(auto)\n kv_cache paged(page=64)"
    if heads:
        body += f"\n heads {heads}"
    c = cuda_config(_spec(body), get_profile(profile, "cuda"))
    assert (c.tile_q, c.warps, c.tile_kv, c.chunk) == (tile_q, warps, 64, 64)
    # whole head dims keep the decode tiles of CudaTiles.split_tile_q rows (and warps over keys)
    c = cuda_config(_spec("head_dim 128\n dtype f16\n heads q=128 kv=1\n schedule split_kv(auto)"),
                    get_profile(profile, "cuda"))
    assert c.tile_q == 16 and c.chunk is None


def test_tiles_too_big_for_whole_head_dims_fall_back_to_chunks():
    """q=128 kv=128 on 3 stages with head dim 256 needs 473 KB whole; in chunks 108 KB."""
    s = _spec("head_dim 256\n dtype f16\n tile q=128 kv=128\n target cuda { warps=8 stages=3 }")
    c = cuda_config(s, get_profile("cuda-sm80", "cuda"))
    assert (c.chunk, c.chunk_given, c.v_blocks) == (64, False, 1)
    assert (c.tile_q, c.tile_kv, c.stages, c.smem_bytes) == (128, 128, 3, 110592)


@pytest.mark.parametrize("head_dim, line, message, hint", [
    (64, "tile d=24", "tile d=24 is not a multiple of 16 (the k of the tensor-core product m16n8k16)",
     "try tile d=16 or d=64"),
    (1024, "tile d=512", "tile d=512 is too large (at most 256: a block keeps at most 256 output columns",
     "try tile d=64"),
    (8, "tile d=8", "tile d=8 is not a multiple of 16", "leave d out: head dim 8 fits whole"),
])
def test_bad_tile_d_is_refused_with_the_reason(head_dim, line, message, hint):
    """(The language itself refuses a tile d that is not a multiple of 8 or exceeds the head dim.)"""
    s = _spec(f"head_dim {head_dim}\n dtype f16\n {line}")
    (d,) = check(s, get_profile("cuda-sm80", "cuda"))
    assert message in d.message and d.hint == hint
    assert d.span.line == 4  # the tile line


def test_a_chunk_that_does_not_fit_states_bytes_and_limit():
    s = _spec("head_dim 1024\n dtype f32\n tile q=256 kv=256 d=256\n target cuda { warps=16 stages=4 }")
    (d,) = check(s, get_profile("cuda-sm80", "cuda"))
    assert "in chunks of d=256 needs" in d.message and "cuda-sm80 allows 166912" in d.message
    assert "smaller tile d" in d.hint


def test_chunk_and_grid_show_in_check_source_and_manifest(capsys):
    from attngen.cli import main
    s = _spec("head_dim 1024\n dtype f16\n mask causal")
    p = plan(s, "cuda", "cuda-sm90")
    assert p.grid == ("ceil(Lq / 64)", "Hq * 4", "B")
    assert grid_size(p.grid, B=3, Lq=130, Hq=5) == (3, 20, 3)
    e = emit_plan(p)
    assert "// Tile d=64 (chosen: the whole head dim does not fit)" in e.source
    assert "constexpr int kChunk = 64;" in e.source and "constexpr int kVBlocks = 4;" in e.source
    assert "Grid: (ceil(Lq / 64), Hq * 4, B)" in e.source
    assert e.manifest["tile"] == {"q": 64, "kv": 64, "d": 64}  # (cuda-sm90: four steps of kv 64 in flight)
    assert e.manifest["grid"] == ["ceil(Lq / 64)", "Hq * 4", "B"]
    assert e.manifest["output_column_blocks"]["blocks"] == 4
    path = "hd.attn"
    import os
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "hd.attn")
        with open(path, "w") as f:
            f.write("attention hd {\n head_dim 1024\n dtype f16\n mask causal\n}\n")
        assert main(["check", path, "--target", "cuda", "--profile", "cuda-sm90"]) == 0
    out = capsys.readouterr().out
    assert "tile d=64" in out and "grid: (ceil(Lq / 64), Hq * 4, B)" in out


# -- NVRTC (no GPU needed) --------------------------------------------------------------------
# cases that are examples/large_head_dims.attn's kernels: named as there, their sources are the same, so
# the suite compiles each once (conftest.nvrtc_compile) for this test and test_nvrtc.py's examples
SAME_AS_EXAMPLES = {"f16 d320": "head_dim_320", "f16 d512": "head_dim_512", "f16 d640": "head_dim_640"}


@pytest.mark.skipif(not nvrtc.available(), reason="NVRTC not installed (pip install -e '.[test]')")
@pytest.mark.parametrize("profile, arch", [("cuda-sm80", "sm_80"), ("cuda-sm90", "sm_90a")])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_compiles(case, profile, arch):
    source = emit_plan(plan(spec_of(case[1], name=SAME_AS_EXAMPLES.get(case[0], "hd")), "cuda", profile)).source
    cubin, log = nvrtc_compile(source, arch)
    assert cubin[:4] == b"\x7fELF"
    assert "warning" not in log.lower(), log


# -- equivalence on a GPU -----------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_cuda_matches_reference(case):
    require("cuda")
    label, body, hq, hkv = case
    spec = _spec(body)
    for i, (b, lq, lk) in enumerate(SHAPES):
        q, k, v = random_qkv(spec, b, lq, lk, heads_q=hq, heads_kv=hkv, seed=300 + i)
        check_against_reference(spec, "cuda", q, k, v)


# -- two_pass over chunked head dims ------------------------------------------------------------
# Pass 1 streams chunks of Q and K (no V) and writes the scores and statistics once per head;
# pass 2 streams chunks of V over its block's output columns (no K; scores from ws_s).
TWO_PASS_CASES = [
    ("bf16 d512", "head_dim 512\n dtype bf16\n schedule two_pass"),
    ("bf16 576/512 mla", "head_dim qk=576 v=512\n dtype bf16\n mask causal(bottom_right)\n schedule two_pass"),
    ("f16 d320 d=64", "head_dim 320\n dtype f16\n tile d=64\n mask window(left=100)\n schedule two_pass"),
    ("f32 d320 d=64 softcap", "head_dim 320\n dtype f32\n tile d=64\n softcap 30\n schedule two_pass"),
]


@pytest.mark.parametrize("case", TWO_PASS_CASES, ids=lambda c: c[0])
def test_two_pass_chunked_plan(case):
    """Only pass 2 has column blocks; pass 1 computes each head's scores once."""
    p = plan(_spec(case[1]), "cuda", "cuda-sm90")
    c = p.config
    assert c.chunked and c.v_blocks == 2
    assert p.grid == (f"ceil(Lq * G / {c.tile_q}) * S", "Hkv", "B")
    (pv,) = [e for e in p.entries if e.name == "pv"]
    assert pv.grid == (f"ceil(Lq * G / {c.tile_q}) * S", "Hkv * 2", "B")
    source = emit_plan(p).source
    assert "constexpr int kColumnBlocks = kPass == 1 ? 1 : kVBlocks;" in source
    assert "constexpr int kStepsQK = kPass == 2 ? 0 : kChunksQK;" in source


@pytest.mark.skipif(not nvrtc.available(), reason="NVRTC not installed (pip install -e '.[test]')")
# sm_90 only: the same code paths compile for sm_80 in tests/backends/cuda/test_nvrtc.py's examples (NVRTC time).
@pytest.mark.parametrize("profile, arch", [("cuda-sm90", "sm_90a")])
@pytest.mark.parametrize("case", TWO_PASS_CASES, ids=lambda c: c[0])
def test_two_pass_chunked_compiles(case, profile, arch):
    source = emit_plan(plan(_spec(case[1]), "cuda", profile)).source
    cubin, log = nvrtc_compile(source, arch)
    assert cubin[:4] == b"\x7fELF"
    assert "warning" not in log.lower(), log


@pytest.mark.parametrize("case", TWO_PASS_CASES, ids=lambda c: c[0])
def test_two_pass_chunked_matches_reference(case):
    """Decode (Lq 1) and a chunk of prefill (Lq 37), GQA group 4, Lk 300; then kv_lens with an
    empty sequence (its rows: out 0, lse -inf)."""
    require("cuda")
    import cupy
    import numpy as np
    from attngen.reference import reference, relative_error, to_numpy, tolerance
    from conftest import kernel_for, to_device
    spec = _spec(case[1])
    kernel = kernel_for(spec, "cuda")
    for i, lq in enumerate((1, 37)):
        q, k, v = random_qkv(spec, 2, lq, 300, heads_q=8, heads_kv=2, seed=400 + i)
        check_against_reference(spec, "cuda", q, k, v)
        lens = np.array([0, 217], np.int32)
        dq, dk, dv = to_device("cuda", spec.dtype, q, k, v)
        out, lse = kernel(dq, dk, dv, kv_lens=cupy.asarray(lens), return_lse=True)
        out, lse = np.asarray(to_numpy(out), np.float64), np.asarray(to_numpy(lse), np.float64)
        ref, ref_lse = reference(spec, q, k, v, return_lse=True, kv_lens=lens)
        assert not np.isnan(out).any() and not np.isnan(lse).any(), "NaN"
        err = relative_error(out, ref)
        assert err <= tolerance(spec), f"relative error {err:.3g} > {tolerance(spec):g}"
        assert np.isneginf(lse[0]).all() and not np.isneginf(lse[1]).any()
        assert np.all(out[0] == 0)


def test_cuda_grid_y_limit_is_a_launch_error():
    require("cuda")
    spec = _spec("head_dim 1024\n dtype f16\n mask causal")  # (the mma.sync chunks: grid.y = heads x 4)
    q, k, v = random_qkv(spec, 1, 1, 1, heads_q=20000, heads_kv=20000)
    from conftest import kernel_for, to_device
    with pytest.raises(attngen.LaunchError, match="exceeds 65535 blocks along y"):
        kernel_for(spec, "cuda")(*to_device("cuda", "f16", q, k, v))


# -- head dims 257-512 on the Hopper family (the producer with output column blocks) -------------
WIDE_WGMMA = [
    ("f16 d320", "head_dim 320\n dtype f16", 4, 2),
    ("f16 256/512 split", "head_dim qk=256 v=512\n dtype f16\n mask causal", 5, 1),
    ("bf16 d512 causal gqa3", "head_dim 512\n dtype bf16\n mask causal", 3, 1),
    ("f16 448/256 bottom-right", "head_dim qk=448 v=256\n dtype f16\n mask causal(bottom_right)", 2, 2),
    ("f16 d1024 stored P", "head_dim 1024\n dtype f16", 3, 1),
    ("bf16 576/512 stored P", "head_dim qk=576 v=512\n dtype bf16", 7, 1),
]


@pytest.mark.parametrize("case", WIDE_WGMMA, ids=lambda c: c[0])
def test_the_launcher_sends_per_sequence_lengths_to_the_mma_sync_entry(case):
    """Padded launches take the wgmma producer kernel; kv_lens / cu_seqlens launches its _varlen
    entry (mma.sync, chunks), each with its own grid, block and shared memory."""
    import numpy as np
    from attngen.backends.cuda import args as cuda_args
    from attngen.runtime.launch import resolve
    p = plan(_spec(case[1]), "cuda", "cuda-sm90")
    d_qk, d_v = p.d_qk, p.d_v
    shapes = {"q": (2, 300, case[2], d_qk), "k": (2, 257, case[3], d_qk), "v": (2, 257, case[3], d_v)}
    dtypes = dict.fromkeys(shapes, p.dtype)
    c = p.config
    ((name, _, grid, threads, smem),) = cuda_args.launches(p, resolve(p, shapes, dtypes, cores=132))
    items = -(-300 // c.tile_q) * case[2] * c.v_blocks * 2  # persistent: min(SM, items) blocks
    assert (name, grid, threads, smem) == (p.entry, (min(132, items), 1, 1), 384, p.smem_bytes)
    launch = resolve(p, shapes, dtypes, cores=132, kv_lens=np.array([5, 257], np.int32))
    ((name, _, grid, threads, smem),) = cuda_args.launches(p, launch)
    v = p.details.varlen
    assert (name, grid, threads, smem) == (v.entry, (5, case[2] * c.varlen.v_blocks, 2), v.threads, v.smem_bytes)


@pytest.mark.parametrize("case", WIDE_WGMMA, ids=lambda c: c[0])
def test_wide_wgmma_matches_reference_with_several_tiles_and_per_sequence_lengths(case):
    """Several row tiles (Lq 300) and K/V tiles (Lk 257, odd) on the producer kernel; then the
    same kernel's _varlen entry (mma.sync) with kv_lens (one sequence sees no key)."""
    require("cuda")
    import numpy as np
    from attngen.reference import reference, relative_error, tolerance
    from conftest import _to_numpy, kernel_for, to_device
    label, body, hq, hkv = case
    spec = _spec(body)
    q, k, v = random_qkv(spec, 2, 300, 257, heads_q=hq, heads_kv=hkv, seed=7)
    check_against_reference(spec, "cuda", q, k, v)
    kernel = kernel_for(spec, "cuda")
    lens = np.array([0, 200], np.int32)
    dq, dk, dv = to_device("cuda", spec.dtype, q, k, v)
    if spec.dtype == "bf16":
        import torch
        dlens = torch.from_numpy(lens).cuda()
    else:
        import cupy
        dlens = cupy.asarray(lens)
    out, lse = kernel(dq, dk, dv, return_lse=True, kv_lens=dlens)
    ref, ref_lse = reference(spec, q, k, v, return_lse=True, kv_lens=lens)
    out, lse = _to_numpy(out), _to_numpy(lse)
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    assert relative_error(out, ref) <= tolerance(spec)
    assert np.all(out[0] == 0) and np.all(np.isneginf(lse[0]))  # the sequence with no keys
    empty = np.isneginf(ref_lse)  # (and rows of bottom-right causal that see no key)
    assert np.array_equal(np.isneginf(lse), empty)
    assert np.abs(lse[~empty] - ref_lse[~empty]).max() <= 1e-2 * max(1.0, np.abs(ref_lse[~empty]).max())


@pytest.mark.parametrize("same_keys", [False, True])
@pytest.mark.parametrize("body", [
    "head_dim 320\n dtype f16\n mask causal",                   # output column blocks
    "head_dim 512\n dtype f16\n mask causal(bottom_right)",     # split Q K^T
    "head_dim qk=448 v=256\n dtype bf16\n mask causal",         # column blocks with one block
])
def test_wide_wgmma_planted_non_finite_values(body, same_keys):
    """inf / NaN planted in K and V at keys some rows see and others do not (causal), in the second
    half of the head dims too (the other column block, the other warpgroup's half of Q K^T): the
    rows that see them come out non-finite as in the reference, every other row matches it. With
    K and V planted at the same keys, a row whose score with such a key is -inf (p = 0) keeps the
    key's non-finite V out, in full tiles too (the persistent blocks' cleaning pass cleans every
    tile; benchmarks/probes/probe_planted.py)."""
    require("cuda")
    import numpy as np
    from attngen.reference import reference, relative_error, tolerance
    from conftest import _to_numpy, kernel_for, to_device
    spec = _spec(body)
    b, lq, lk, hq, hkv = 2, 150, 170, 2, 1
    q, k, v = random_qkv(spec, b, lq, lk, heads_q=hq, heads_kv=hkv, seed=21)
    dqk, dv = spec.head_dim_qk, spec.head_dim_v
    k_keys, v_keys = (lk - 1, lk - 90, lk - 45), ((lk - 1, lk - 90, lk - 45) if same_keys else (lk - 30, lk - 60, lk - 5))
    for j, c, x in zip(k_keys, (dqk - 3, dqk // 2 + 1, 5), (np.inf, -np.inf, np.nan)):
        k[:, j, :, c] = x
    for j, c, x in zip(v_keys, (dv // 2 + 7, 2, dv - 1), (np.nan, np.inf, -np.inf)):
        v[:, j, :, c] = x
    out, lse = kernel_for(spec, "cuda")(*to_device("cuda", spec.dtype, q, k, v), return_lse=True)
    with np.errstate(invalid="ignore", over="ignore"):
        ref, ref_lse = reference(spec, q, k, v, return_lse=True)
    out, lse = _to_numpy(out), _to_numpy(lse)
    rows_ref, rows_out = np.isfinite(ref).all(axis=-1), np.isfinite(out).all(axis=-1)  # (B, Lq, Hq)
    assert rows_ref.any() and (~rows_ref).any(), "the case has rows that see a planted key and rows that do not"
    assert rows_out[rows_ref].all() and not rows_out[~rows_ref].any()
    assert relative_error(out[rows_ref], ref[rows_ref]) <= tolerance(spec)
    clean = np.transpose(rows_ref, (0, 2, 1)) & np.isfinite(ref_lse)
    assert np.abs(lse[clean] - ref_lse[clean]).max() <= 1e-2 * max(1.0, np.abs(ref_lse[clean]).max())


@pytest.mark.parametrize("body", ["head_dim 320\n dtype f16", "head_dim qk=576 v=512\n dtype bf16"])
def test_p_through_memory_keeps_the_non_finite_columns_keys_of_weight_above_0_give(body):
    """P through memory (mask none): inf and -inf in V at keys every row gives a weight above 0
    make those columns inf / -inf in every row, as in the reference, and leave the other columns
    finite; with no key of weight 0 the tensor cores' result stands (no redo on CUDA cores)."""
    require("cuda")
    import numpy as np
    from attngen.reference import reference, relative_error, tolerance
    from conftest import _to_numpy, kernel_for, to_device
    spec = _spec(body)
    assert attngen.lower(spec, "cuda", "cuda-sm90").config.stored_p
    b, lq, lk, hq, hkv = 2, 150, 300, 4, 2
    q, k, v = random_qkv(spec, b, lq, lk, heads_q=hq, heads_kv=hkv, seed=5)
    dv = spec.head_dim_v
    v[:, 17, :, 3] = np.inf
    v[:, lk - 1, :, dv - 2] = -np.inf
    out = _to_numpy(kernel_for(spec, "cuda")(*to_device("cuda", spec.dtype, q, k, v)))
    with np.errstate(invalid="ignore", over="ignore"):
        ref = reference(spec, q, k, v)
    assert np.all(np.isposinf(ref[..., 3])) and np.all(np.isneginf(ref[..., dv - 2]))
    assert np.array_equal(np.isposinf(out), np.isposinf(ref)) and np.array_equal(np.isneginf(out), np.isneginf(ref))
    keep = np.isfinite(ref).all(axis=(0, 1, 2))  # the columns no planted value reaches
    assert np.isfinite(out[..., keep]).all()
    assert relative_error(out[..., keep], ref[..., keep]) <= tolerance(spec)


def test_a_spec_s_own_tiles_keep_column_blocks_and_small_profiles_get_a_problem():
    """Split Q K^T is the planner's choice for auto tiles only: a spec's own tile q=128 keeps its
    rows (column blocks). A profile whose shared memory fits none of the forms gets the checker's
    message with the bytes, not a traceback."""
    from attngen.plan.kernel_plan import Problem
    c = cuda_config(_spec("head_dim 512\n dtype f16\n tile q=128"), get_profile("cuda-sm90", "cuda"))
    assert (c.math, c.tile_q, c.split_qk, c.v_blocks) == ("wgmma", 128, False, 2)
    small = get_profile("cuda-sm90", "cuda").narrowed(limits={"shared_memory_bytes": 96 * 1024})
    with pytest.raises(Problem, match="shared memory"):
        cuda_config(_spec("head_dim 512\n dtype f16"), small)


def test_p_through_memory_blocks_take_several_items_and_reuse_their_slot():
    """More row tiles than multiprocessors (2 x 12 heads x 6 row tiles = 144 items on at most 132
    blocks): a block's second item reuses its workspace slot; GQA group 3, odd Lk (333: a partial
    tile of each phase), Lq not a tile multiple; lse too."""
    require("cuda")
    spec = _spec("head_dim 640\n dtype f16")
    assert attngen.lower(spec, "cuda", "cuda-sm90").config.stored_p
    q, k, v = random_qkv(spec, 2, 700, 333, heads_q=12, heads_kv=4, seed=11)
    check_against_reference(spec, "cuda", q, k, v)


def test_p_through_memory_with_no_keys_gives_zeros_and_minus_inf():
    """Lk = 0 launches the kernel with no tile in either phase: out 0, lse -inf, no NaN."""
    require("cuda")
    import numpy as np
    from conftest import _to_numpy, kernel_for, to_device
    spec = _spec("head_dim 640\n dtype f16")
    q, k, v = random_qkv(spec, 2, 70, 0, heads_q=2, heads_kv=1, seed=3)
    out, lse = kernel_for(spec, "cuda")(*to_device("cuda", "f16", q, k, v), return_lse=True)
    out, lse = _to_numpy(out), _to_numpy(lse)
    assert np.all(out == 0) and np.all(np.isneginf(lse))
