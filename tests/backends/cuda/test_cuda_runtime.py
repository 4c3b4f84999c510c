"""The CUDA runtime as users call it: PyTorch and CuPy inputs, strides, streams, bad inputs.

These need a GPU with CuPy (and PyTorch for the torch cases): they run on the GPU machine.
"""

from __future__ import annotations

import numpy as np
import pytest

import attngen
from attngen.reference import reference, relative_error, tolerance

from conftest import _to_numpy, cuda_available, kernel_for, random_qkv, spec_of

pytestmark = pytest.mark.skipif(not cuda_available(), reason="no CUDA GPU with CuPy here")

torch = pytest.importorskip("torch") if cuda_available() else None

SPEC = "head_dim 64\n dtype f16\n mask causal"


def _check(spec, out, q, k, v):
    ref = reference(spec, q, k, v)
    err = relative_error(_to_numpy(out), ref)
    assert err <= tolerance(spec), err


def test_torch_tensors_and_output_type():
    spec = spec_of(SPEC)
    q, k, v = random_qkv(spec, 2, 77, 90, heads_q=6, heads_kv=3)
    tq, tk, tv = (torch.from_numpy(a).half().cuda() for a in (q, k, v))
    out = kernel_for(spec, "cuda")(tq, tk, tv)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float16 and out.is_cuda
    _check(spec, out, q, k, v)


def test_torch_bf16():
    spec = spec_of("head_dim 128\n dtype bf16\n mask causal(bottom_right)")
    q, k, v = random_qkv(spec, 1, 100, 130, heads_q=4, heads_kv=1)
    tq, tk, tv = (torch.from_numpy(a).cuda().bfloat16() for a in (q, k, v))
    out, lse = kernel_for(spec, "cuda")(tq, tk, tv, return_lse=True)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    _check(spec, out, q, k, v)


def test_strided_views_are_read_in_place():
    """q, k, v as views into one packed (B, L, 3, H, D) tensor: strides honoured, no copy."""
    spec = spec_of(SPEC)
    rng = np.random.default_rng(1)
    qkv = rng.standard_normal((2, 50, 3, 4, 64)).astype(np.float32)
    t = torch.from_numpy(qkv).half().cuda()
    q, k, v = t[:, :, 0], t[:, :, 1], t[:, :, 2]
    assert not q.is_contiguous()
    out = kernel_for(spec, "cuda")(q, k, v)
    _check(spec, out, qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2])


def test_layouts_the_kernel_cannot_read_are_copied():
    """A head-dim stride != 1 and a misaligned base pointer still give the right answer."""
    spec = spec_of(SPEC)
    q, k, v = random_qkv(spec, 1, 33, 47, heads_q=2, heads_kv=2)
    tq = torch.from_numpy(np.ascontiguousarray(q.transpose(0, 1, 3, 2))).half().cuda().transpose(2, 3)
    assert tq.stride(-1) != 1
    big = torch.from_numpy(np.concatenate([np.zeros(1, np.float32), k.ravel()])).half().cuda()
    tk = big[1:].view(k.shape)
    assert tk.data_ptr() % 16 != 0
    tv = torch.from_numpy(v).half().cuda()
    out = kernel_for(spec, "cuda")(tq, tk, tv)
    _check(spec, out, q, k, v)


def test_cupy_arrays_and_out():
    import cupy
    spec = spec_of(SPEC)
    q, k, v = random_qkv(spec, 1, 20, 20, heads_q=2, heads_kv=1)
    cq, ck, cv = (cupy.asarray(a.astype(np.float16)) for a in (q, k, v))
    out = cupy.empty((1, 20, 2, 64), dtype=cupy.float16)
    assert kernel_for(spec, "cuda")(cq, ck, cv, out=out) is out
    _check(spec, out, q, k, v)


def test_runs_on_the_callers_torch_stream():
    spec = spec_of(SPEC)
    q, k, v = random_qkv(spec, 4, 300, 300, heads_q=8, heads_kv=8)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        tq, tk, tv = (torch.from_numpy(a).half().cuda() for a in (q, k, v))
        out = kernel_for(spec, "cuda")(tq, tk, tv)
        out2 = out * 1  # ordered after the kernel on the same stream
    s.synchronize()
    _check(spec, out2, q, k, v)


@pytest.mark.parametrize("case, match", [
    ("numpy", "host memory"),
    ("cpu_torch", "needs CUDA"),
    ("dtype", "dtype f32"),
    ("rank", "4 dimensions"),
    ("head_dim", "head_dim"),
    ("batch", "batch sizes differ"),
    ("heads", "not a multiple"),
    ("out_shape", "out must have shape"),
    ("out_overlap", "zero stride"),
])
def test_bad_inputs_raise_launch_error(case, match):
    spec = spec_of(SPEC)
    kernel = kernel_for(spec, "cuda")
    q, k, v = random_qkv(spec, 1, 8, 8, heads_q=4, heads_kv=2)
    tq, tk, tv = (torch.from_numpy(a).half().cuda() for a in (q, k, v))
    kw = {}
    if case == "numpy":
        tq = q.astype(np.float16)
    elif case == "cpu_torch":
        tq = torch.from_numpy(q).half()
    elif case == "dtype":
        tq = tq.float()
    elif case == "rank":
        tq = tq[0]
    elif case == "head_dim":
        tq = tq[..., :32]
    elif case == "batch":
        tq = torch.cat([tq, tq])
    elif case == "heads":
        tq = tq[:, :, :3]
    elif case == "out_shape":
        kw["out"] = torch.empty((1, 8, 4, 32), dtype=torch.float16, device="cuda")
    elif case == "out_overlap":
        kw["out"] = torch.empty((1, 1, 4, 64), dtype=torch.float16, device="cuda").expand(1, 8, 4, 64)
    with pytest.raises(attngen.LaunchError, match=match):
        kernel(tq, tk, tv, **kw)


def test_spec_heads_are_enforced():
    spec = spec_of("head_dim 64\n heads q=8 kv=2\n dtype f16")
    q, k, v = random_qkv(spec, 1, 8, 8, heads_q=4, heads_kv=2)
    tq, tk, tv = (torch.from_numpy(a).half().cuda() for a in (q, k, v))
    with pytest.raises(attngen.LaunchError, match="heads q=8 kv=2"):
        kernel_for(spec, "cuda")(tq, tk, tv)


def test_empty_batch_and_zero_length_keys():
    spec = spec_of(SPEC)
    kernel = kernel_for(spec, "cuda")
    q, k, v = random_qkv(spec, 1, 5, 0, heads_q=2, heads_kv=2)
    tq, tk, tv = (torch.from_numpy(a).half().cuda() for a in (q, k, v))
    out, lse = kernel(tq, tk, tv, return_lse=True)
    assert torch.all(out == 0) and torch.all(torch.isneginf(lse))


class _OnlyCudaArrayInterface:
    """Something that is neither CuPy nor PyTorch: only __cuda_array_interface__."""

    def __init__(self, t):
        self._t = t
        self.__cuda_array_interface__ = t.__cuda_array_interface__


class _OnlyDLPack:
    """Something that only speaks DLPack (like a JAX array)."""

    def __init__(self, t):
        self._t = t

    def __dlpack__(self, **kw):
        return self._t.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()


@pytest.mark.parametrize("wrap", [_OnlyCudaArrayInterface, _OnlyDLPack], ids=["cai", "dlpack"])
def test_cuda_array_interface_and_dlpack_inputs(wrap):
    spec = spec_of(SPEC)
    q, k, v = random_qkv(spec, 2, 31, 45, heads_q=4, heads_kv=2)
    tq, tk, tv = (torch.from_numpy(a).half().cuda() for a in (q, k, v))
    out = kernel_for(spec, "cuda")(wrap(tq), wrap(tk), wrap(tv))
    _check(spec, out, q, k, v)


def test_zero_query_heads_and_out_aliasing_an_input():
    spec = spec_of(SPEC)
    kernel = kernel_for(spec, "cuda")
    q, k, v = random_qkv(spec, 1, 6, 6, heads_q=2, heads_kv=2)
    tq, tk, tv = (torch.from_numpy(a).half().cuda() for a in (q, k, v))
    empty = kernel(tq[:, :, :0], tk, tv)
    assert empty.shape == (1, 6, 0, 64)
    with pytest.raises(attngen.LaunchError, match="out overlaps k"):
        kernel(tq, tk, tv, out=tk)  # self-attention shapes: out could alias k
