"""Index-only mask expressions on cuda's bits path (attngen/backends/cuda/expr_bits.py; issue 42),
GPU machine: the builder evaluates the expression into a BlockMask and the spec with `mask
custom` runs on it; against the float64 reference (forward and backward), forced (`target cuda {
mask_expr=bits }`) and chosen by auto at 2048 x 2048, f16 / bf16 / f32, odd lengths (1, 7, 113),
Lq != Lk, GQA groups of 3, masks that name h, b and Lk, a score expression and a score input,
rows that see no key; kv_lens on the host (bits), on the GPU and packed sequences (inline); the
cache (one build per signature, the backward reusing the forward's). Without a GPU every test
skips (tests/backends/cuda/test_expr_bits_source.py and tests/plan/test_expr_bits.py run the
builder and the rule on the host)."""

from __future__ import annotations

import numpy as np
import pytest

import attngen
from attngen.backends.cuda import backward as cuda_backward
from attngen.reference import reference, relative_error, tolerance

from conftest import kernel_for, random_qkv, require, spec_of, to_device
from backward_helpers import check_backward, ints, rand
from test_cuda_expr_builder import check_output
from test_variants import _np

HOOD = "abs(q // 8 - k // 8) <= 1 && abs(q % 8 - k % 8) <= 1"
MASKS = {
    "neighbourhood": f"mask {HOOD}",
    "per head": "mask abs(q - k) <= 2 * h + 1 && k != 3",
    "per sequence": "mask k <= q + Lk - Lq && k + 40 > q + Lk - Lq - 9 * b",  # row 0 of Lq > Lk sees none
    "with a score": f"mask {HOOD} || k == 0\nscore s - 0.125 * abs(q - k)",
    "alibi input": f"input slopes[h] f32\nscore s - slopes[h] * abs(q - k)\nmask {HOOD}",
}
SHAPES = [(1, 1, 1), (2, 7, 7), (1, 113, 113), (2, 7, 20), (1, 20, 7), (1, 113, 37)]
BITS = "target cuda { mask_expr=bits }"


def _spec(body, dtype="f16", head_dim=64, option=BITS):
    return spec_of(f"head_dim {head_dim}\nheads q=6 kv=2\ndtype {dtype}\n{body}\n{option}")


def _inputs(spec):
    return {"slopes": np.linspace(0.05, 0.5, 6).astype(np.float32)} if spec.inputs else {}


def _kernel(spec, profile=None):
    return attngen.compile(spec, target="cuda", profile=profile) if profile else kernel_for(spec, "cuda")


def _check(kernel, spec, qkv, inputs, **options):
    """out and lse against the reference; rows that see no key: out 0, lse -inf (the inputs on the GPU)."""
    import cupy
    check_output(kernel, spec, qkv, {n: cupy.asarray(a) for n, a in inputs.items()}, inputs, **options)


@pytest.mark.parametrize("profile", ["cuda-sm80", None])
@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
@pytest.mark.parametrize("name", sorted(MASKS))
def test_bits_against_the_reference(name, dtype, profile):
    require("cuda")
    spec = _spec(MASKS[name], dtype)
    kernel = _kernel(spec, profile)
    for n, (b, lq, lk) in enumerate(SHAPES):
        _check(kernel, spec, random_qkv(spec, b, lq, lk, seed=n), _inputs(spec))
        assert kernel.last_path == "bits"


def test_kv_lens_on_the_host_take_bits_on_the_gpu_and_packed_inline():
    require("cuda")
    import cupy
    spec = _spec(MASKS["per sequence"])
    kernel = _kernel(spec)
    qkv = random_qkv(spec, 3, 50, 113, seed=4)
    lens = np.array([113, 40, 0], np.int32)
    _check(kernel, spec, qkv, {}, kv_lens=lens)
    assert kernel.last_path == "bits"
    out = kernel(*to_device("cuda", spec.dtype, *qkv), kv_lens=cupy.asarray(lens))
    assert kernel.last_path == "inline" and "kv_lens on the GPU" in kernel.last_reason
    assert relative_error(_np(out), reference(spec, *qkv, kv_lens=lens)) <= tolerance(spec)
    cuq, cuk = np.array([0, 7, 120], np.int32), np.array([0, 20, 57], np.int32)
    rng = np.random.default_rng(5)
    q, k, v = rand(rng, 120, 6, 64), rand(rng, 57, 2, 64), rand(rng, 57, 2, 64)
    out = kernel(*to_device("cuda", spec.dtype, q, k, v), cu_seqlens_q=ints(cuq), cu_seqlens_k=ints(cuk))
    assert kernel.last_path == "inline" and kernel.last_reason.startswith("cu_seqlens_q=")
    want = reference(spec, q, k, v, cu_seqlens_q=cuq, cu_seqlens_k=cuk)
    assert relative_error(_np(out), want) <= tolerance(spec)


@pytest.mark.parametrize("mask, path", [(HOOD, "bits"), ("k <= q && q - k < 1500", "inline")])
def test_auto_at_2048(mask, path):
    """mask_expr=auto at 2048 x 2048 (MIN_PAIRS): the neighbourhood (every live tile partial) on
    bits, a band `k <= q && q - k < 1500` inline (mostly full tiles); both against the reference; one build for two calls."""
    require("cuda")
    spec = spec_of(f"head_dim 64\nheads q=3 kv=1\ndtype f16\nmask {mask}")
    kernel = kernel_for(spec, "cuda")
    qkv = random_qkv(spec, 1, 2048, 2048, seed=6)
    dev = to_device("cuda", spec.dtype, *qkv)
    out = kernel(*dev)
    assert kernel.last_path == path
    assert relative_error(_np(out), reference(spec, *qkv)) <= tolerance(spec)
    kernel(*dev, mask=None)  # (as a harness may pass it)
    assert kernel.mask_builds == (1 if path == "bits" else 0) and kernel.path(*dev) == path
    # both paths by hand (what benchmarks/probes/probe_expr_masks.py times)
    for out in (kernel.inline(*dev), kernel.bits(*dev, mask=kernel.bits_mask(*dev))):
        assert relative_error(_np(out), reference(spec, *qkv)) <= tolerance(spec)
    assert kernel.mask_builds == 1


@pytest.mark.parametrize("family", ["fast", "deterministic"])
@pytest.mark.parametrize("name", ["neighbourhood", "per head", "per sequence"])
def test_the_backward_takes_the_bits_of_its_forward(name, family):
    require("cuda")
    option = BITS if family == "fast" else "target cuda { mask_expr=bits backward=deterministic }"
    spec = _spec(MASKS[name], "bf16" if family == "fast" else "f16", head_dim=128, option=option)
    kernel = kernel_for(spec, "cuda")
    if cuda_backward.family(kernel.plan) != ("wgmma" if family == "fast" else "fma"):
        pytest.skip(f"the fast backward runs on sm_90 (this GPU's plan is {kernel.plan.details.arch})")
    rng = np.random.default_rng(len(name))
    for b, lq, lk in ((1, 113, 300), (2, 300, 113), (2, 7, 7), (1, 1, 300)):
        builds = kernel.mask_builds
        check_backward(spec, rand(rng, b, lq, 6, 128), rand(rng, b, lk, 2, 128), rand(rng, b, lk, 2, 128))
        assert kernel.last_path == "bits" and kernel.mask_builds == builds + 1  # the forward's, reused


def test_inline_is_the_expression_kernel():
    """mask_expr=inline: attngen.compile returns the CudaKernel itself (no bits path)."""
    require("cuda")
    kernel = attngen.compile(_spec(MASKS["neighbourhood"], option="target cuda { mask_expr=inline }"),
                             target="cuda")
    assert type(kernel).__name__ == "CudaKernel"


def test_a_capture_before_the_build_runs_inline():
    """A call captured into a CUDA graph (torch) before its mask is built runs inline; after a call
    outside the capture has built it, a capture takes bits; both graphs replay the reference."""
    require("cuda")
    torch = pytest.importorskip("torch")
    spec = _spec(MASKS["neighbourhood"])
    kernel = attngen.compile(spec, target="cuda")
    qkv = random_qkv(spec, 2, 113, 37, seed=11)
    q, k, v = (torch.from_numpy(x).cuda().half() for x in qkv)
    want = reference(spec, *qkv)
    kernel.inline(q, k, v)  # the inline kernel's module loaded outside the capture
    for path in ("inline", "bits"):
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            out = kernel(q, k, v)
        assert kernel.last_path == path, kernel.last_reason
        graph.replay()
        torch.cuda.synchronize()
        assert relative_error(_np(out), want) <= tolerance(spec)
        kernel(q, k, v)  # outside a capture: builds the mask
        assert kernel.last_path == "bits" and kernel.mask_builds == 1
