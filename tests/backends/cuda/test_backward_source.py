"""The CUDA backward's source (issue 41; docs/backward.md): its sections, header and argument
struct, which specs have one, what `attngen check` says of it, and NVRTC compiles of every kind
of variant for sm_80 and sm_90a (no GPU needed; the runs are tests/equivalence/test_backward_cuda.py)."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess

import pytest

from attngen.api import lower
from attngen.backends import get
from attngen.backends.cuda import backward, backward_launch, nvrtc
from attngen.errors import SpecError
from attngen.plan.backward import SECTIONS

from conftest import nvrtc_compile, spec_of


def _plan(body: str, profile: str = "cuda-sm80"):
    return lower(spec_of(body, name="b"), "cuda", profile)


def test_sections_in_order_and_the_spec_in_the_header():
    # (the deterministic family: cuda-sm80 takes the mma one by default, tests/backends/cuda/test_backward_mma_source.py)
    plan = _plan("head_dim 64\n heads q=6 kv=2\n dtype f16\n mask causal\n softcap 30\n"
                 " target cuda { backward=deterministic }")
    source = get("cuda").helper_sources(plan)["backward"]
    at = [source.index(f"// ---- {name} ----\n") for name in SECTIONS]
    assert at == sorted(at), "the sections of plan.backward.SECTIONS, in that order"
    assert "flash-attention backward kernels" in source.split("\n", 2)[1]
    assert "mask       causal" in source and "softcap    30.0" in source  # the normalised spec
    for name in backward.entry_names(plan):
        assert re.search(rf'extern "C" __global__ void __launch_bounds__\(kThreads\)\n{name}\(', source), name
    assert backward.entry_names(plan) == ("attngen_b_bwd_preprocess", "attngen_b_bwd_dkdv", "attngen_b_bwd_dq")
    assert "atomic" not in source.replace("no atomics", "")  # deterministic: no atomics anywhere


def test_the_source_is_deterministic():
    a = backward.render_backward(_plan("head_dim 32\n dtype f32\n mask window(left=3, right=1)"))
    b = backward.render_backward(_plan("head_dim 32\n dtype f32\n mask window(left=3, right=1)"))
    assert a == b


def test_the_argument_struct_has_no_padding():
    """The launcher's ctypes struct and the C struct lay out the same fields the same way: 8-byte
    fields first, then the ints, so neither pads between fields."""
    offset = 0
    args = backward_launch._Args
    for (ctype, name, _), (fname, ftype) in zip(backward.ARG_FIELDS, args._fields_):
        assert name == fname
        assert getattr(args, name).offset == offset, name
        offset += ctypes.sizeof(ftype)
    assert ctypes.sizeof(args) == offset and offset % 8 == 0


def test_paged_specs_have_no_backward():
    plan = _plan("head_dim 64\n dtype f16\n mask causal(bottom_right)\n kv_cache paged(page=16)")
    cuda = get("cuda")
    assert cuda.helper_sources(plan) == {}
    with pytest.raises(SpecError, match="paged KV cache is an inference cache"):
        backward.render_backward(plan)
    assert cuda.describe_backward(plan)[0].startswith("backward: none (a paged KV cache")


def test_head_dims_too_large_are_refused_clearly():
    plan = _plan("head_dim 1024\n dtype f16")
    assert any("head dims qk=1024" in p.message for p in backward.backward_problems(plan))
    assert get("cuda").helper_sources(plan) == {}


def test_describe_backward():
    lines = get("cuda").describe_backward(_plan("head_dim 128\n heads q=32 kv=8\n dtype bf16\n mask causal\n"
                                                " target cuda { backward=deterministic }"))
    text = "\n".join(lines)
    assert "attngen_b_bwd_dkdv: dK_j, dV_j; grid (ceil(Lk / 32), Hkv, B) x 256 threads" in text
    assert "attngen_b_bwd_dq: dQ_i; grid (ceil(Lq / 32), Hq, B)" in text
    assert "workspace: D, 4 * B * Hq * Lq bytes" in text
    assert "deterministic (no atomics" in text


def test_the_fast_family_on_hopper():
    """cuda-sm90, f16/bf16, head dims 64/128: the wgmma family (atomic dQ) unless the spec asks for
    backward=deterministic; backward=fast where it cannot run is refused, naming the reason."""
    body = "head_dim 128\n heads q=32 kv=8\n dtype bf16\n mask causal"
    plan = _plan(body, "cuda-sm90")
    assert backward.family(plan) == "wgmma"
    text = "\n".join(get("cuda").describe_backward(plan))
    assert "fast: Hopper tensor cores" in text and "grid (ceil(Lk / 128), Hkv, B)" in text
    assert "dQ's accumulator, 4 * B * Lq * Hq * 128 bytes" in text
    source = backward.render_backward(plan)
    assert "wgmma.mma_async" in source and "cp.reduce.async.bulk.tensor" in source
    assert "Hopper tensor cores" in source.split("extern \"C\"")[0]
    slow = _plan(body + "\n target cuda { backward=deterministic }", "cuda-sm90")
    assert backward.family(slow) == "fma" and "wgmma.mma_async" not in backward.render_backward(slow)
    for refused, why in (("head_dim 192\n dtype f16", "head dims 64 or 128"), ("head_dim 64\n dtype f32", "f16 or bf16")):
        p = _plan(refused + "\n target cuda { backward=fast }", "cuda-sm90")
        assert backward.family(p) == "fma"
        assert any(why in x.message for x in backward.backward_problems(p))
        with pytest.raises(SpecError, match="target cuda, backward: backward=fast"):
            backward.render_backward(p)
    p = _plan("head_dim 64\n dtype f16\n mask custom\n target cuda { backward=fast }")  # cuda-sm80: neither
    assert any("sm_90a" in x.message and "the mma family" in x.message for x in backward.backward_problems(p))


def test_head_dim_64_steps_of_128_rows():
    """The fast family at head dim 64 walks steps of 128 query rows with the named masks (no
    softcap, no score expression); 64 elsewhere (head dim 128, mask custom's per-64-row lists,
    softcap, mask and score expressions). The source and `attngen check` say which."""
    for body, rows in (("head_dim 64\n dtype f16", 128),
                       ("head_dim 64\n dtype bf16\n mask causal(bottom_right)", 128),
                       ("head_dim 64\n dtype f16\n mask window(left=9, right=2)", 128),
                       ("head_dim 128\n dtype f16\n mask causal", 64), ("head_dim qk=64 v=128\n dtype f16", 64),
                       ("head_dim 64\n dtype f16\n mask custom", 64), ("head_dim 64\n dtype f16\n softcap 30", 64),
                       ("head_dim 64\n dtype f16\n mask k <= q && q - k < 64", 64),
                       ("head_dim 64\n dtype f16\n score s - 0.25 * abs(q - k)", 64)):
        plan = _plan(body, "cuda-sm90")
        assert backward.family(plan) == "wgmma" and backward.wgmma_rows(plan) == rows, body
        source = backward.render_backward(plan)
        assert f"constexpr int kBlockM = {rows};" in source
        smem = backward.wgmma_smem_bytes(plan.d_qk, plan.d_v, rows, plan.spec.mask.is_custom)
        assert smem == backward.fast_smem_bytes(plan) and f"steps of {rows} query rows (Q_i and dO_i by the tensor copy engine), {smem} bytes" in "\n".join(get("cuda").describe_backward(plan))
        assert ("kDqSplitRows" in source) == (rows == 128)
    assert backward.wgmma_smem_bytes(64, 64, 128) <= 227 * 1024  # (sm_90's largest dynamic shared memory)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on PATH")
@pytest.mark.parametrize("body", ["head_dim 64\n dtype f16", "head_dim 64\n dtype bf16\n mask causal(bottom_right)",
                                  "head_dim 64\n dtype f16\n mask window(left=100)"])
def test_head_dim_64_steps_of_128_rows_do_not_spill(body, tmp_path):
    """ptxas (sm_90a) keeps the 128-row dK/dV kernel in registers: dP^T is computed by halves of the
    rows, so that at most 160 of its accumulators are live (S^T and dP^T whole, 192, spilled)."""
    source = backward.render_backward(_plan(body, "cuda-sm90"))
    (tmp_path / "b.cu").write_text(source)
    log = subprocess.run(["nvcc", "-gencode=arch=compute_90a,code=sm_90a", "-cubin", "-Xptxas", "-v",
                          str(tmp_path / "b.cu"), "-o", str(tmp_path / "b.cubin")], capture_output=True, text=True)
    assert log.returncode == 0, log.stderr
    dkdv = log.stderr[log.stderr.index("attngen_b_bwd_dkdv' for"):]
    assert re.search(r"\b0 bytes spill stores, 0 bytes spill loads", dkdv.split("Compiling")[0]), dkdv[:400]


def test_custom_mask_tiles_divide_the_block_masks():
    for body in ("head_dim 64\n dtype f16\n mask custom", "head_dim 32\n dtype f16\n tile q=16 kv=16\n mask custom"):
        plan = _plan(body)
        c = backward.backward_config(plan)
        assert plan.tile_q % c.tile == 0 and plan.tile_kv % c.tile == 0


# Every kind of variant the kernels render differently: dtypes, masks, softcap, custom masks
# (boolean and additive share a source), unequal head dims. Each compile takes NVRTC ~10 s.
COMPILED = [
    ("f32 d16 none", "head_dim 16\n dtype f32"),
    ("f16 192/128 window softcap", "head_dim qk=192 v=128\n dtype f16\n mask window(left=5, right=2)\n softcap 30"),
    ("bf16 d128 causal bottom-right scale", "head_dim 128\n dtype bf16\n mask causal(bottom_right)\n scale 0.3"),
    ("f16 d64 causal", "head_dim 64\n dtype f16\n mask causal"),
    ("f16 d64 custom", "head_dim 64\n dtype f16\n mask custom"),
    ("bf16 qk128 v64 window softcap", "head_dim qk=128 v=64\n dtype bf16\n mask window(left=9)\n softcap 20"),
]


@pytest.mark.skipif(not nvrtc.available(), reason="NVRTC not installed (pip install -e '.[test]')")
@pytest.mark.parametrize("profile, arch", [("cuda-sm80", "sm_80"), ("cuda-sm90", "sm_90a")])
@pytest.mark.parametrize("variant", COMPILED, ids=lambda v: v[0])
def test_backward_compiles(variant, profile, arch):
    source = get("cuda").helper_sources(_plan(variant[1], profile))["backward"]
    cubin, log = nvrtc_compile(source, arch)
    assert cubin[:4] == b"\x7fELF"
    assert "warning" not in log.lower(), log
