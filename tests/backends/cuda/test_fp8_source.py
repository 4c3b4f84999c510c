"""FP8 prefill on target cuda (issue 44; attngen/backends/cuda/fp8.py): what the checker refuses and
why (target wgsl, profiles and devices without FP8 wgmma, the combinations not built), the plan
(the producer kernel, V^T's workspaces, the _prepare_v entry before the attention, the descales),
and NVRTC compiles of its sources for sm_90a (no GPU needed)."""

from __future__ import annotations

import re

import pytest

import attngen
from attngen import SpecError, backends
from attngen.api import emit_plan, get_profile
from attngen.backends.cuda import nvrtc
from attngen.backends.cuda.devices import profile_for
from attngen.plan import backward

from conftest import nvrtc_compile, spec_of


def fp8(body: str = "", dtype: str = "e4m3", head_dim: int = 128):
    return spec_of(f"head_dim {head_dim}\ndtype {dtype}\n{body}", name="f")


def refusal(spec, target="cuda", profile="cuda-sm90") -> str:
    with pytest.raises(SpecError) as e:
        attngen.lower(spec, target, profile)
    return "\n".join(d.message for d in e.value.diagnostics)


def test_wgsl_refuses_fp8_with_the_reason():
    for profile in ("webgpu-core", "wgpu-vulkan-nvidia"):
        msg = refusal(fp8(), "wgsl", profile)
        assert msg == (f"target wgsl (profile {profile}): dtype e4m3: FP8 prefill is not built on target wgsl: WGSL has "
                       "no 8-bit float type and WebGPU no FP8 matrix instructions (issue 44)")


@pytest.mark.parametrize("cc, arch", [(80, "sm_80"), (86, "sm_86"), (89, "sm_89"), (100, "sm_100"), (120, "sm_120")])
def test_devices_without_fp8_wgmma_are_named(cc, arch):
    """A device's profile (compile's, precompile's) says it has no FP8 wgmma: sm_90a only."""
    profile = profile_for(backends.get("cuda"), cc)
    msg = refusal(fp8(), profile=profile)
    assert f"dtype e4m3 needs FP8 tensor cores with wgmma (wgmma.mma_async m64nNk32 .e4m3, sm_90a" in msg
    assert f"profile {profile.name} ({arch}) has none" in msg


def test_the_h100_profile_plans_it():
    plan = attngen.lower(fp8(), "cuda", profile_for(backends.get("cuda"), 90))
    assert plan.config.fp8 and plan.details.arch == "sm_90a"


@pytest.mark.parametrize("body, head_dim, words", [
    ("schedule split_kv(4)", 128, "schedule split_kv: FP8 prefill is built for prefill (schedule fused)"),
    ("schedule two_pass", 128, "schedule two_pass: FP8 prefill is built for prefill"),
    ("kv_cache paged(page=64)", 128, "kv_cache paged: FP8 prefill is built for contiguous K and V"),
    ("", 72, "head_dim qk=72: FP8 prefill is built for head dims that are multiples of 16 up to 256"),
    ("", 320, "head_dim qk=320: FP8 prefill is built for head dims that are multiples of 16 up to 256"),
    ("tile d=64", 128, "tile d=64: FP8 prefill is built for whole head dims"),
    ("tile q=128 kv=48", 128, "tile kv=48: FP8 prefill is built for tile kv a multiple of 32 from 64 to 256"),
    ("tile q=128 kv=288", 64, "tile kv=288: FP8 prefill is built for tile kv a multiple of 32 from 64 to 256"),
    ("tile q=96", 64, "tile q=96: FP8 prefill is built for tile q 64, 128 or 192"),
    ("tile q=192", 128, "tile q=192: FP8 prefill is built for three consumer warpgroups up to head dim 64"),
    ("target cuda { producer=off }", 128, "producer=off: FP8 prefill is built for the producer warpgroup"),
    ("target cuda { tma=off }", 128, "tma=off: FP8 prefill is built for the producer warpgroup with the tensor"),
    ("target cuda { warps=4 }", 128, "warps=4: an FP8 block has a consumer warp per 16 rows of tile q (8)"),
    ("mask k <= q && k % 2 == 0", 128, "mask expressions are not built for FP8 yet"),
    ("score s * 2", 128, "score expressions are not built for FP8 yet"),
])
def test_what_is_not_built_is_refused_by_name(body, head_dim, words):
    msg = refusal(fp8(body, head_dim=head_dim))
    assert msg.startswith("target cuda (profile cuda-sm90): ") and words in msg, msg


@pytest.mark.parametrize("body, head_dim, words", [
    ("tile q=128 kv=256", 256, "FP8 tile q=128 kv=256 with 2 stages and head_dim qk=256 v=256 needs"),
    ("mask custom\ntile q=128 kv=160", 64, "tile kv=160: mask custom is built for FP8 tiles of up to 128 keys"),
])
def test_other_tile_kv_refusals(body, head_dim, words):
    """What tiles of other widths than 128 keys cannot do is refused by name."""
    msg = refusal(fp8(body, head_dim=head_dim))
    assert msg.startswith("target cuda (profile cuda-sm90): ") and words in msg, msg


def test_expressions_that_are_named_masks_or_softcap_are_built():
    """The planner reads `k <= q` as mask causal and `score 30 * tanh(s / 30)` as softcap 30."""
    plan = attngen.lower(fp8("mask k <= q\nscore 30 * tanh(s / 30)"), "cuda", "cuda-sm90")
    assert plan.config.fp8 and plan.spec.mask.kind == "causal" and plan.softcap == 30


def test_fp8_has_no_backward():
    (p,) = [p for p in backward.problems(fp8()) if p.key == "dtype"]
    assert p.message == "dtype e4m3: FP8 prefill kernels are inference kernels: they have no backward (issue 44)"


def test_the_plan():
    plan = attngen.lower(fp8("heads q=12 kv=4\nmask causal"), "cuda", "cuda-sm90")
    c = plan.config
    assert (c.fp8, c.math, c.producer, c.persistent, c.tma, c.tma_q, c.tile_q, c.tile_kv, c.stages) == (
        True, "wgmma", True, True, True, True, 128, 192, 2)
    assert c.rescale_slack == 0.0  # P <= 2^8 in e4m3: no lazy rescale on top (fp8.P_OFFSET)
    # the producer has no cleaning redo (V^T comes cleaned): 24 registers, the consumers 240
    # (CudaTiles.fp8_producer_regs); mask custom's producer copies mask words: 40 up to d192, 24 above
    # (where the consumers need 240)
    assert c.setmaxnreg == (24, 240)
    assert attngen.lower(fp8("mask custom"), "cuda", "cuda-sm90").config.setmaxnreg == (40, 232)
    assert attngen.lower(fp8("mask custom", head_dim=256), "cuda", "cuda-sm90").config.setmaxnreg == (24, 240)
    assert [(e.name, e.before) for e in plan.entries] == [("prepare_v", True)]
    assert [w.name for w in plan.workspaces] == ["work_counter", "vt", "vt_bad"]
    names = [p.name for p in plan.params]
    assert {"q_descale", "k_descale", "v_descale", "vt_bad", "tmap_q", "tmap_k", "tmap_v"} <= set(names)
    assert next(p for p in plan.params if p.name == "out").dtype == "bf16"
    assert plan.out_dtype == "bf16" and plan.dtype == "e4m3"
    manifest = emit_plan(plan).manifest
    assert [e["role"] for e in manifest["entry_points"]] == ["prepare_v", "main"]
    assert manifest["dtype"] == "e4m3" and manifest["out_dtype"] == "bf16"
    assert "sV 2x192x128 e4m3" in c.smem_summary and "sO 128x128 bf16" in c.smem_summary


def test_tiles_from_the_spec_and_the_table():
    """tile q / kv of an FP8 kernel: the spec's, else CudaTiles.fp8_tiles (a probe overrides it through the
    profile); V^T's column blocks take the widest swizzle of 128, 64, 32 bytes that divides tile kv."""
    from attngen.backends.cuda.fp8 import vt_map_doc, vt_swizzle
    assert [vt_swizzle(kv) for kv in (64, 96, 128, 160, 192, 224, 256)] == [64, 32, 128, 32, 64, 32, 128]
    sm90 = get_profile("cuda-sm90", "cuda")
    c = attngen.lower(fp8("tile q=128 kv=160"), "cuda", sm90).config
    assert (c.tile_q, c.tile_kv, c.warps) == (128, 160, 8) and "sV 2x160x128 e4m3" in c.smem_summary
    # the table's rows: d64 128 x 256 (masked: 192 x 128), d128 128 x 192, above 128 x 128; mask custom keeps
    # 128 keys (its words)
    table = {(d, m): attngen.lower(fp8(f"mask {m}", head_dim=d), "cuda", sm90).config
             for d in (64, 128, 256) for m in ("none", "causal", "custom")}
    assert {k: (c.tile_q, c.tile_kv) for k, c in table.items()} == {
        (64, "none"): (128, 256), (64, "causal"): (192, 128), (64, "custom"): (192, 128),
        (128, "none"): (128, 192), (128, "causal"): (128, 192), (128, "custom"): (128, 128),
        (256, "none"): (128, 128), (256, "causal"): (128, 128), (256, "custom"): (128, 128)}
    assert "tile kv=256: mask custom is built for FP8 tiles of up to 128 keys" in refusal(fp8("mask custom\ntile kv=256"))
    profile = sm90.with_overrides(fp8_tiles=((128, (192, 160)), (256, (128, 128))))
    plan = attngen.lower(fp8(head_dim=64), "cuda", profile)
    assert (plan.config.tile_q, plan.config.tile_kv, plan.config.setmaxnreg) == (192, 160, (32, 160))
    source = emit_plan(plan).source
    assert "constexpr int kVtSwizzle = 32;" in source and "m64n160k32.f32.e4m3.e4m3" in source
    assert "box (16, 1, Dv padded to 64, 1), 32-byte swizzle" in next(p.doc for p in plan.params if p.name == "tmap_v")
    assert "box (64, 1, Dv padded to 64, 1), 128-byte swizzle" in vt_map_doc()
    assert attngen.lower(fp8(head_dim=256), "cuda", profile).config.tile_kv == 128  # (the second row)
    assert "tile q=192 (the tile table's, CudaTiles.fp8_tiles)" in refusal(fp8(), profile=profile)


def test_out_f16_and_e5m2():
    plan = attngen.lower(fp8(dtype="e5m2 out=f16"), "cuda", "cuda-sm90")
    assert plan.out_dtype == "f16" and next(p for p in plan.params if p.name == "out").dtype == "f16"
    source = emit_plan(plan).source
    # Q K^T over the table's 192 keys, P V over 128 columns (P is e4m3)
    assert "m64n192k32.f32.e5m2.e5m2" in source and "m64n128k32.f32.e4m3.e5m2" in source
    assert "cvt.rn.f16x2.f32" in source


def test_check_and_ir_show_the_fp8_plan(capsys, tmp_path):
    from attngen.cli import main
    path = tmp_path / "f.attn"
    path.write_text("attention f {\n    head_dim 128\n    dtype e4m3\n    mask causal\n}\n")
    assert main(["check", str(path), "--target", "cuda", "--profile", "cuda-sm90"]) == 0
    out = capsys.readouterr().out
    assert "m64n128k32 (FP8: e4m3 / e5m2 operands, V^T from the _prepare_v entry)" in out
    assert "FP8: entry point attngen_f_prepare_v runs first" in out
    assert main(["check", str(path), "--target", "wgsl"]) == 1
    assert "FP8 prefill is not built on target wgsl" in capsys.readouterr().err
    assert main(["build", str(path), "--target", "cuda", "--profile", "cuda-sm90", "--emit", "manifest"]) == 0
    assert '"out_dtype": "bf16"' in capsys.readouterr().out


CASES = {
    "d64": "head_dim 64\ndtype e4m3",
    "d128 causal gqa": "head_dim 128\nheads q=12 kv=4\ndtype e4m3\nmask causal",
    "d256": "head_dim 256\ndtype e4m3",
    "d128 window e5m2 f16": "head_dim 128\ndtype e5m2 out=f16\nmask window(left=100)",
    "d128 custom": "head_dim 128\ndtype e4m3\nmask custom",
    "d128 softcap bottom_right": "head_dim 128\ndtype e4m3\nmask causal(bottom_right)\nsoftcap 30",
    "d96 q64": "head_dim 96\ndtype e4m3\ntile q=64",
    "d64 causal persistent off": "head_dim 64\ndtype e4m3\nmask causal\ntarget cuda { persistent=off }",
}


@pytest.mark.skipif(not nvrtc.available(), reason="NVRTC not installed (pip install -e '.[test]')")
@pytest.mark.parametrize("case", CASES, ids=str)
def test_it_compiles_for_sm_90a(case):
    source = emit_plan(attngen.lower(spec_of(CASES[case], name="f"), "cuda", "cuda-sm90")).source
    cubin, log = nvrtc_compile(source, "sm_90a")
    assert cubin[:4] == b"\x7fELF" and "warning" not in log.lower(), log
    assert "attngen_f_prepare_v" in log
    assert "C7512" not in log and "Potential Performance Loss" not in log, log  # ("ptxas info": not a warning)
    spills = {m.group(1): int(m.group(2)) for m in re.finditer(
        r"Function properties for (\w+)\n[^\n]*?(\d+) bytes spill stores", log)}
    assert spills.get("attngen_f_prepare_v") == 0 and spills.get("attngen_f") == 0, log


# (head dim, mask): ptxas serialised the wgmma of d224 and d256 (C7512, "insufficient register resources")
# and spilled 32 bytes while the consumers had 232 registers (CudaTiles.fp8_producer_regs); with 240 these compile
# without either. The masks' own state still spills a few bytes from d224 (docs/cuda-variants.md).
WIDE = [(d, "none") for d in (64, 128, 192, 224, 256)] + [(d, m) for d in (224, 256)
                                                          for m in ("causal", "window(left=100)", "custom")]


@pytest.mark.skipif(not nvrtc.available(), reason="NVRTC not installed (pip install -e '.[test]')")
@pytest.mark.parametrize("head_dim, mask", WIDE, ids=[f"d{d}-{m.split('(')[0]}" for d, m in WIDE])
def test_products_are_not_serialised(head_dim, mask):
    """ptxas keeps the FP8 products asynchronous (no C7512) at every head dim, and mask none spills
    nothing: acc (head dim / 2 registers) + S (64) + P in flight (16) beside the loop's state fit the
    consumers' 240 registers after setmaxnreg (the producer keeps 24: CudaTiles.fp8_producer_regs)."""
    plan = attngen.lower(fp8(f"mask {mask}", head_dim=head_dim), "cuda", "cuda-sm90")
    # (d64's default tile q 192: three consumer warpgroups of 160 registers, the producer 32)
    assert plan.config.setmaxnreg == ((32, 160) if plan.config.tile_q == 192 else (24, 240))
    source = emit_plan(plan).source
    assert "constexpr int kProducerRegs = %d, kConsumerRegs = %d;" % plan.config.setmaxnreg in source
    _, log = nvrtc_compile(source, "sm_90a")
    assert "C7512" not in log and "Potential Performance Loss" not in log, log
    regs, stores, loads = nvrtc.resource_usage(log)["attngen_f"]
    print(f"d{head_dim} mask {mask}: setmaxnreg {plan.config.setmaxnreg}, {regs} registers at launch, "
          f"spills {stores} / {loads} bytes")
    if mask == "none":
        assert (stores, loads) == (0, 0), log


# (head dim, mask, tile q, tile kv): tiles beside the table's (benchmarks/probes/probe_fp8.py --tiles)
# that ptxas keeps asynchronous (no C7512) without spills. Serialised and spilling (not listed): d128 kv 256 (S 128
# + acc 64 + P 32 registers), d64 q192 kv 192, d128 q192 at any kv (fp8.MAX_HEAD_DIM_Q192), d256 kv 160; spilling
# 12 / 16 bytes: d128 causal kv 224, d64 causal q192 kv 160
TILES = [(64, m, 128, kv) for m in ("none", "causal") for kv in (160, 192, 224, 256)] + [
    (64, "none", 192, 128), (64, "causal", 192, 128), (64, "none", 192, 160)] + [
    (128, "none", 128, kv) for kv in (160, 192, 224)] + [(128, "causal", 128, kv) for kv in (160, 192)] + [
    (128, "window(left=100)", 128, 192), (256, "none", 128, 96), (64, "none", 64, 256)]


@pytest.mark.skipif(not nvrtc.available(), reason="NVRTC not installed (pip install -e '.[test]')")
@pytest.mark.parametrize("head_dim, mask, tq, tkv", TILES, ids=[f"d{d}-{m.split('(')[0]}-q{q}kv{kv}" for d, m, q, kv in TILES])
def test_tiles_compile(head_dim, mask, tq, tkv):
    plan = attngen.lower(fp8(f"mask {mask}\ntile q={tq} kv={tkv}", head_dim=head_dim), "cuda", "cuda-sm90")
    _, log = nvrtc_compile(emit_plan(plan).source, "sm_90a")
    assert "C7512" not in log and "Potential Performance Loss" not in log and "warning" not in log.lower(), log
    regs, stores, loads = nvrtc.resource_usage(log)["attngen_f"]
    print(f"d{head_dim} {mask} q{tq} kv{tkv}: setmaxnreg {plan.config.setmaxnreg}, smem {plan.config.smem_bytes}, "
          f"spills {stores} / {loads} bytes")
    assert (stores, loads) == (0, 0), log


# (and two more the GPU test runs: tests/equivalence/test_fp8_prefill.py, test_fp8_swizzle64_tiles)
TILES_SW64 = [tile for tile in TILES if tile[0] <= 64] + [(64, "causal", 128, 192), (48, "window(left=100)", 192, 160)]


@pytest.mark.skipif(not nvrtc.available(), reason="NVRTC not installed (pip install -e '.[test]')")
@pytest.mark.parametrize("head_dim, mask, tq, tkv", TILES_SW64,
                         ids=[f"d{d}-{m.split('(')[0]}-q{q}kv{kv}" for d, m, q, kv in TILES_SW64])
def test_tiles_compile_with_swizzle64(head_dim, mask, tq, tkv):
    """The d64 tile candidates with Q and K in the 64-byte swizzle (CudaTiles.fp8_swizzle64; probe_fp8.py
    --tiles .. --swizzle64 off,on compares them): asynchronous products, no spills, as without it."""
    plan = attngen.lower(fp8(f"mask {mask}\ntile q={tq} kv={tkv}", head_dim=head_dim), "cuda", swizzle64())
    assert (plan.config.qk_swizzle, plan.config.tile_q, plan.config.tile_kv) == (64, tq, tkv)
    _, log = nvrtc_compile(emit_plan(plan).source, "sm_90a")
    assert "C7512" not in log and "Potential Performance Loss" not in log and "warning" not in log.lower(), log
    regs, stores, loads = nvrtc.resource_usage(log)["attngen_f"]
    print(f"d{head_dim} {mask} q{tq} kv{tkv} swizzle64: smem {plan.config.smem_bytes}, spills {stores} / {loads} bytes")
    assert (stores, loads) == (0, 0), log


def test_fp8_hgmma_in_the_hot_loop():
    """The attention entry's loop runs FP8 warpgroup products (SASS QGMMA.64x192x32.F32.E4M3.E4M3 for Q K^T
    over d128's 192-key tile, QGMMA.64x128x32 for P V) and no mma.sync; _prepare_v has no tensor-core
    instruction."""
    import os
    import subprocess
    import tempfile
    from test_sass import NVDISASM, loops
    if NVDISASM is None or not nvrtc.available():
        pytest.skip("needs NVRTC and nvdisasm (pip install -e '.[test]')")
    plan = attngen.lower(fp8("mask causal"), "cuda", "cuda-sm90")
    cubin, _ = nvrtc_compile(emit_plan(plan).source, "sm_90a")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        sass = subprocess.run([NVDISASM, "-c", path], capture_output=True, text=True, timeout=300, check=True).stdout
    found = loops(sass)
    body = sass.split(".text.attngen_f:", 1)[1].split(".section", 1)[0]
    assert "HMMA" not in body
    hot = {line.split()[1] for loop in found["attngen_f"] for line in loop if "GMMA" in line}
    assert hot == {"QGMMA.64x192x32.F32.E4M3.E4M3", "QGMMA.64x128x32.F32.E4M3.E4M3"}, hot
    assert "GMMA" not in sass.split(".text.attngen_f_prepare_v:", 1)[1].split(".section", 1)[0]


# -- Q and K in the 64-byte swizzle (CudaTiles.fp8_swizzle64; head dims qk up to 64) ---------------------

def swizzle64(on: bool = True):
    return backends.get("cuda").profile("cuda-sm90").with_overrides(fp8_swizzle64=on)


@pytest.mark.parametrize("head_dim, pad, swizzle", [(16, 64, 64), (32, 64, 64), (48, 64, 64), (64, 64, 64),
                                                    (80, 128, 128), (128, 128, 128), (256, 256, 128)])
def test_swizzle64_plans_64_byte_rows_up_to_d64(head_dim, pad, swizzle):
    on = attngen.lower(fp8(head_dim=head_dim), "cuda", swizzle64()).config
    off = attngen.lower(fp8(head_dim=head_dim), "cuda", swizzle64(False)).config
    assert (on.d_qk_pad, on.qk_swizzle) == (pad, swizzle)
    assert (off.d_qk_pad, off.qk_swizzle) == (-(-head_dim // 128) * 128, 128)
    if swizzle == 64:  # sQ and sK halve: tile q x 64 bytes of Q and 2 x tile kv x 64 of K less than 128-byte rows
        assert off.smem_bytes - on.smem_bytes == (on.tile_q + 2 * on.tile_kv) * 64
        assert f"sQ {on.tile_q}x64 e4m3 + sK 2x{on.tile_kv}x64 e4m3" in on.smem_summary
    else:
        assert on == off


def test_swizzle64_source():
    """The 64-byte mode's pieces (and none of them without it): Q and K's descriptors of 64-byte rows (the
    one V^T's column blocks take: mode 2 and stride 512, test_fp8_layout.py's g++ model), one tensor copy of 64-byte rows for Q and each K tile, no zero padding in the 128-byte layout."""
    on = emit_plan(attngen.lower(fp8(head_dim=64), "cuda", swizzle64())).source
    off = emit_plan(attngen.lower(fp8(head_dim=64), "cuda", swizzle64(False))).source
    assert "constexpr int kHeadDimQKPad = 32;" in on and "constexpr int kSwizzleQK = 64;" in on
    assert "smem_descriptor_sw(sQ + kk * 16, kSwizzleQK), smem_descriptor_sw(sK + kk * 16, kSwizzleQK)" in on
    assert "tma_tile_sw64<kBlockQ, kHeadDimQKPad>(sQ" in on and "tma_tile_sw64<kBlockKV, kHeadDimQKPad>(sK" in on
    assert "zero_padding<kBlockQ" not in on and "zero_padding<kBlockQ" in off
    assert "(warp / 4) * 64 * kHeadDimQKPad" in on
    assert "smem_descriptor(sQ + at * kBlockQ + step, 16, 1024)" in off
    for piece in ("sw64", "kSwizzleQK", "smem_descriptor_sw(sQ"):
        assert piece not in off


def test_swizzle64_tensor_maps():
    """tmap_q and tmap_k of the 64-byte mode: boxes of 32 two-value elements (64 bytes) x tile rows, the
    driver's CU_TENSOR_MAP_SWIZZLE_64B (2); none in place of kernel.py's in the 128-byte mode. (The maps
    are only encoded on the GPU; their fields are checked here.)"""
    from types import SimpleNamespace as NS
    from attngen.backends.cuda.fp8_call import qk_maps
    plan = attngen.lower(fp8(head_dim=48), "cuda", swizzle64())
    named = {"q": NS(shape=(2, 300, 6, 48), strides=(300 * 6 * 48, 6 * 48, 48, 1), dtype="e4m3"),
             "k": NS(shape=(2, 200, 2, 48), strides=(200 * 2 * 48, 2 * 48, 48, 1), dtype="e4m3")}
    maps = qk_maps(plan, named, NS(len_q=300, len_k=200))
    assert set(maps) == {"tmap_q", "tmap_k"}
    for name, rows, box in (("q", 300, plan.config.tile_q), ("k", 200, plan.config.tile_kv)):
        m = maps["tmap_" + name]
        assert (tuple(m.box), m.swizzle, m.dtype) == ((32, 1, box, 1), 2, 1)  # UINT16 pairs
        assert tuple(m.dims) == (24, named[name].shape[2], rows, 2)
    assert qk_maps(attngen.lower(fp8(head_dim=48), "cuda", swizzle64(False)), named, NS(len_q=300, len_k=200)) == {}


SW64_CASES = {
    "d64": "head_dim 64\ndtype e4m3",
    "d64 causal gqa": "head_dim 64\nheads q=12 kv=4\ndtype e4m3\nmask causal",
    "d32 window e5m2 f16": "head_dim 32\ndtype e5m2 out=f16\nmask window(left=100)",
    "d48 custom": "head_dim 48\ndtype e4m3\nmask custom",
    "d64 softcap q64": "head_dim 64\ndtype e4m3\nsoftcap 30\ntile q=64",
    "d16 persistent off": "head_dim 16\ndtype e4m3\nmask causal\ntarget cuda { persistent=off }",
    "d64 v128": "head_dim qk=64 v=128\ndtype e4m3",
}


@pytest.mark.skipif(not nvrtc.available(), reason="NVRTC not installed (pip install -e '.[test]')")
@pytest.mark.parametrize("case", SW64_CASES, ids=str)
def test_swizzle64_compiles_for_sm_90a(case):
    plan = attngen.lower(spec_of(SW64_CASES[case], name="f"), "cuda", swizzle64())
    assert plan.config.qk_swizzle == 64
    cubin, log = nvrtc_compile(emit_plan(plan).source, "sm_90a")
    assert cubin[:4] == b"\x7fELF" and "warning" not in log.lower(), log
    assert "C7512" not in log and "Potential Performance Loss" not in log, log
    spills = {m.group(1): int(m.group(2)) for m in re.finditer(
        r"Function properties for (\w+)\n[^\n]*?(\d+) bytes spill stores", log)}
    assert spills.get("attngen_f_prepare_v") == 0, log
    if "custom" not in case:
        assert spills.get("attngen_f") == 0, log
