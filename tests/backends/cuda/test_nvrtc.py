"""Every example's CUDA source, and every variant's, compiles with NVRTC for sm_80 and sm_90.

Needs no GPU: NVRTC comes from the cuda-bindings and nvidia-cuda-nvrtc packages.
"""

from __future__ import annotations

import pytest

from attngen.api import emit_plan
from attngen.api import lower as plan
from attngen.backends.cuda import nvrtc

from conftest import VARIANTS, example_specs, nvrtc_compile, spec_of

pytestmark = pytest.mark.skipif(not nvrtc.available(), reason="NVRTC not installed (pip install -e '.[test]')")

PROFILES = [("cuda-sm80", "sm_80"), ("cuda-sm90", "sm_90a")]


def _compile(spec, profile, arch):
    source = emit_plan(plan(spec, "cuda", profile)).source
    cubin, log = nvrtc_compile(source, arch)  # (one compile per source for the whole suite)
    assert cubin[:4] == b"\x7fELF", "NVRTC returns an ELF cubin"
    assert "warning" not in log.lower(), log
    return cubin


@pytest.mark.parametrize("profile, arch", PROFILES)
@pytest.mark.parametrize("example", example_specs(), ids=lambda e: e[1].name)
def test_examples_compile(example, profile, arch):
    _compile(example[1], profile, arch)


@pytest.mark.parametrize("profile, arch", PROFILES)
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v[0])
def test_variants_compile(variant, profile, arch):
    _compile(spec_of(variant[1], name="v"), profile, arch)


# docs/variants.md: custom masks, paged caches, split schedules (with GQA packing), two_pass.
ISSUE3_VARIANTS = [
    ("mask custom f16", "head_dim 64\n dtype f16\n mask custom"),
    ("mask custom f32 softcap", "head_dim 32\n dtype f32\n mask custom\n softcap 20"),
    ("mask custom chunked", "head_dim 512\n dtype f16\n mask custom"),
    ("paged", "head_dim 64\n dtype bf16\n mask causal(bottom_right)\n kv_cache paged(page=16)"),
    ("paged small pages", "head_dim 128\n dtype f16\n kv_cache paged(page=8)\n tile kv=32"),
    ("split_kv auto", "head_dim 128\n dtype f16\n schedule split_kv(auto)"),
    ("split_kv window f32", "head_dim 64\n dtype f32\n mask window(left=50)\n schedule split_kv(3)"),
    ("split_kv custom", "head_dim 64\n dtype bf16\n mask custom\n schedule split_kv(2)"),
    ("split_kv paged chunked", "head_dim 512\n dtype f16\n kv_cache paged(page=16)\n schedule split_kv(auto)"),
    ("two_pass", "head_dim 64\n dtype f16\n mask causal(bottom_right)\n schedule two_pass"),
    ("two_pass paged custom", "head_dim 128\n dtype f16\n mask custom\n kv_cache paged(page=32)\n schedule two_pass"),
]


# The variants compile for sm_90 only: their kernels take the same code paths on sm_80 (which
# the examples above compile for both architectures: paged, split_kv, two_pass, custom masks,
# head dims in chunks), and each of these sources takes NVRTC 10-40 s on CI's two cores.
@pytest.mark.parametrize("profile, arch", PROFILES[1:])
@pytest.mark.parametrize("variant", ISSUE3_VARIANTS, ids=lambda v: v[0])
def test_issue3_variants_compile(variant, profile, arch):
    _compile(spec_of(variant[1], name="v"), profile, arch)


def test_compile_errors_are_reported_with_the_log():
    from attngen.errors import CompileError
    with pytest.raises(CompileError, match="undefined|identifier"):
        nvrtc.compile_cubin('extern "C" __global__ void f() { undefined_thing(); }', "sm_80")


def test_compiling_leaves_python_objects_alone():
    """NVRTC writes its log and cubin into buffers we pass: they must be our own mutable ones.
    (Writing into b" " * 1 once turned every b" " in the process into b"\\x00", and WGSL text
    passed to wgpu afterwards was cut short at the first space.)"""
    nvrtc.compile_cubin('extern "C" __global__ void f() {}', "sm_80")  # an empty log: size 1
    assert b" " == bytes([32]) and " ".encode() == b"\x20"


def test_lineinfo_for_profiling_compiles_with_line_tables_under_keys_of_its_own(monkeypatch):
    """ATTNGEN_NVRTC_LINEINFO=1 (docs/cli.md, for Nsight Compute's source page): -lineinfo in the
    compile (the cubin carries line tables) and a cache key of its own; unset, the keys are as
    they were."""
    from attngen.backends.cuda.kernel import kernel_key
    spec = spec_of("head_dim 64\n dtype f16")
    p = plan(spec, "cuda", "cuda-sm90")
    monkeypatch.delenv(nvrtc.LINEINFO, raising=False)
    assert nvrtc.key_extra() == {}
    plain_key = kernel_key(p)
    source = 'extern "C" __global__ void f(int* x) { x[threadIdx.x] = 1; }'
    plain, _ = nvrtc.compile_cubin(source, "sm_90a")
    monkeypatch.setenv(nvrtc.LINEINFO, "1")
    assert nvrtc.key_extra() == {"nvrtc": "-lineinfo"} and kernel_key(p) != plain_key
    lined, _ = nvrtc.compile_cubin(source, "sm_90a")
    assert b".nv_debug_line_sass" in lined or b".debug_line" in lined
    assert b".debug_line" not in plain and b".nv_debug_line_sass" not in plain


# Quantized KV caches (issue 44, kv_dtype): the mma.sync family's byte tiles (math_mma_kvq.j2) and CUDA
# cores' for f32, each schedule and layout, the append's quantizers; sm_80 compiles e4m3's bit-pattern
# decoder, sm_90 its cvt.rn.f16x2.e4m3x2. (The same kernels run on the CPU emulation:
# tests/backends/cuda/test_kvquant_emulated.py.)
KVQ_VARIANTS = [
    ("e4m3 split_kv paged", "head_dim 128\n heads q=32 kv=8\n dtype f16\n schedule split_kv(auto)\n"
                            " kv_cache paged(page=16)\n kv_dtype e4m3", PROFILES),
    ("e5m2 two_pass", "head_dim 128\n dtype bf16\n schedule two_pass\n kv_dtype e5m2", PROFILES[1:]),
    ("i8 split_kv", "head_dim 128\n heads q=32 kv=8\n dtype f16\n schedule split_kv(auto)\n kv_dtype i8", PROFILES),
    ("i8 fused paged causal", "head_dim 64\n dtype bf16\n mask causal(bottom_right)\n kv_cache paged(page=16)\n"
                              " kv_dtype i8", PROFILES[1:]),
    ("e4m3 fused f32", "head_dim 96\n dtype f32\n kv_dtype e4m3", PROFILES[1:]),
    ("e4m3 d256 split_kv custom", "head_dim 256\n dtype f16\n mask custom\n schedule split_kv(4)\n kv_dtype e4m3",
     PROFILES[1:]),
]


@pytest.mark.parametrize("variant, profile, arch", [(v, p, a) for v in KVQ_VARIANTS for p, a in v[2]],
                         ids=lambda x: x[0] if isinstance(x, tuple) else x)
def test_kv_quant_variants_compile(variant, profile, arch):
    _compile(spec_of(variant[1], name="kvq"), profile, arch)
