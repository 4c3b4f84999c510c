"""The sm_80 tensor-core backward family (issue 41; templates/cuda/backward_mma.cu.j2,
attngen/backends/cuda/backward_mma.py): which plans get it, what `attngen check` says of it, and
its sources compile for sm_80 (nvcc and NVRTC) without register spills. Its results on a GPU:
tests/equivalence/test_backward_mma.py."""

from __future__ import annotations

import re

import pytest

from attngen.api import lower
from attngen.backends import get
from attngen.backends.cuda import backward, backward_mma, nvrtc
from attngen.errors import SpecError
from attngen.plan.backward import SECTIONS

from conftest import nvrtc_compile, spec_of
from test_spills import ptxas_report


def _plan(body: str, profile: str = "cuda-sm80"):
    return lower(spec_of(body, name="b"), "cuda", profile)


def test_cuda_sm80_takes_it_for_f16_bf16_head_dims_32_to_128():
    for body in ("head_dim 64\n dtype f16", "head_dim 128\n dtype bf16\n mask causal(bottom_right)",
                 "head_dim qk=128 v=64\n dtype f16\n mask window(left=9)\n softcap 20",
                 "head_dim 64\n dtype f16\n target cuda { backward=fast }", "head_dim 96\n dtype f16",
                 "head_dim qk=32 v=96\n dtype bf16\n mask causal"):
        assert backward.family(_plan(body)) == "mma", body
    assert backward.family(_plan("head_dim 128\n dtype f16", "cuda-sm90")) == "wgmma"


@pytest.mark.parametrize("body, why", [
    ("head_dim 64\n dtype f32", "f16 or bf16"),
    ("head_dim 256\n dtype f16", "head dims 32, 64, 96 or 128"),
    ("head_dim 48\n dtype f16", "head dims 32, 64, 96 or 128"),
    ("head_dim 64\n dtype f16\n mask custom", "custom mask"),
    ("head_dim 64\n dtype f16\n mask k % 3 != 1", "mask expression"),
    ("head_dim 64\n dtype f16\n score s * 0.5", "score expression"),
])
def test_the_rest_stays_on_the_deterministic_family(body, why):
    """auto falls back to the deterministic family; backward=fast is refused, naming both fast
    families' reasons."""
    plan = _plan(body)
    assert backward.family(plan) == "fma"
    assert backward.backward_problems(plan) == []
    fast = _plan(body + "\n target cuda { backward=fast }")
    messages = " ".join(p.message for p in backward.backward_problems(fast))
    assert "the mma family" in messages and why in messages, messages
    with pytest.raises(SpecError, match="target cuda, backward: backward=fast"):
        backward.render_backward(fast)


def test_deterministic_is_still_the_same_bits_option():
    plan = _plan("head_dim 128\n dtype bf16\n mask causal\n target cuda { backward=deterministic }")
    assert backward.family(plan) == "fma"
    assert "mma.sync" not in backward.render_backward(plan)


def test_describe_and_header():
    plan = _plan("head_dim 128\n heads q=12 kv=4\n dtype bf16\n mask causal")
    text = "\n".join(get("cuda").describe_backward(plan))
    assert "fast: tensor cores (mma.sync m16n8k16, sm_80+), dQ accumulated by atomic f32 additions" in text
    assert "attngen_b_bwd_dkdv: dK_j, dV_j and the dQ_i contributions; grid (ceil(Lk / 64), Hkv, B)" in text
    assert "(1 stage), 79424 bytes of shared memory" in text
    assert "dQ's accumulator, 4 * B * Lq * Hq * 128 bytes" in text
    source = backward.render_backward(plan)
    assert "fast: tensor cores" in source.split('extern "C"')[0]
    at = [source.index(f"// ---- {name} ----\n") for name in SECTIONS]
    assert at == sorted(at)
    assert source == backward.render_backward(_plan("head_dim 128\n heads q=12 kv=4\n dtype bf16\n mask causal"))


def test_shared_memory_fits_every_sm80_gpu():
    """Two stages where they fit 96 KiB (sm_86 / sm_89 give a block 99 KiB), else one."""
    assert backward_mma.stages(64, 64) == 2 and backward_mma.stages(128, 64) == 2
    assert backward_mma.stages(128, 128) == 1 and backward_mma.stages(96, 128) == 1
    assert backward_mma.stages(96, 96) == 2
    for d_qk in backward_mma.HEAD_DIMS:
        for d_v in backward_mma.HEAD_DIMS:
            assert backward_mma.smem_bytes(d_qk, d_v, backward_mma.stages(d_qk, d_v)) <= backward_mma.SMEM_BUDGET


# Every kind of variant the template renders differently. ptxas (sm_80, nvcc 13) registers of the
# dK/dV step: d32 148, d64 200, d96 236, d128 252, qk=96 v=128 243, no spills (docs/backward.md).
COMPILED = [
    ("f16 d64 causal", "head_dim 64\n heads q=6 kv=2\n dtype f16\n mask causal"),
    ("bf16 d128 none", "head_dim 128\n dtype bf16"),
    ("f16 d128 window softcap scale", "head_dim 128\n dtype f16\n mask window(left=100, right=7)\n softcap 30\n"
     " scale 0.3"),
    ("bf16 qk128 v64 bottom-right", "head_dim qk=128 v=64\n dtype bf16\n mask causal(bottom_right)"),
    ("f16 d96 causal", "head_dim 96\n dtype f16\n mask causal"),
    ("f16 qk96 v128 softcap", "head_dim qk=96 v=128\n dtype f16\n softcap 20"),
    ("bf16 d32 window", "head_dim 32\n dtype bf16\n mask window(left=10)"),
]


@pytest.mark.parametrize("compiler", ["nvcc", "nvrtc"])
@pytest.mark.parametrize("variant", COMPILED, ids=lambda v: v[0])
def test_compiles_for_sm80_without_spills(variant, compiler):
    if compiler == "nvrtc" and not nvrtc.available():
        pytest.skip("NVRTC not installed (pip install -e '.[test]')")
    plan = _plan(variant[1])
    assert backward.family(plan) == "mma"
    source = get("cuda").helper_sources(plan)["backward"]
    cubin, log = ptxas_report(compiler, source, "sm_80")
    assert cubin[:4] == b"\x7fELF"
    assert "warning" not in log.lower(), log
    for name, spill in re.findall(r"Function properties for (\w+)\n\s*\d+ bytes stack frame, (\d+) bytes spill stores",
                                  log):
        assert spill == "0", f"{name} spills: {log}"
    assert "attngen_b_bwd_dkdv" in log


@pytest.mark.skipif(not nvrtc.available(), reason="NVRTC not installed (pip install -e '.[test]')")
def test_compiles_for_hopper_under_the_sm80_profile():
    """On an H100 a kernel built with profile cuda-sm80 compiles for sm_90a (the device's arch) with
    mma.sync: the family is chosen by the forward's math, not the arch."""
    from attngen.backends.cuda.devices import profile_for
    cuda = get("cuda")
    profile = cuda.profile("cuda-sm80").narrowed(sections={"device": profile_for(cuda, 90).section("device")})
    plan = lower(spec_of("head_dim 64\n dtype f16\n mask causal", name="b"), "cuda", profile)
    assert plan.details.arch == "sm_90a" and backward.family(plan) == "mma"
    cubin, _ = nvrtc_compile(backward.render_backward(plan), "sm_90a")
    assert cubin[:4] == b"\x7fELF"
