"""The CUDA backward pass (issue 41; docs/backward.md) against attngen.reference_backward, the
float64 oracle: kernel.backward(q, k, v, out, lse, dout) of the forward call's out and lse.

Odd lengths (1, 7, 113), Lq != Lk, GQA groups 1 / 3 / 4, the structured masks, softcap, scale,
unequal head dims, f32 / f16 / bf16, kv_lens, packed sequences, custom masks (boolean and
additive), hidden keys holding inf and NaN, rows that see no key; the tolerance is the forward's
for the dtype times 2 (relative L2 per gradient). Bad inputs are refused with a LaunchError that
names the argument. Every test needs a CUDA GPU (CuPy); the NVRTC compiles of the same sources
run anywhere (tests/backends/cuda/test_backward_source.py).
"""

from __future__ import annotations

import numpy as np
import pytest

import attngen
from attngen.errors import LaunchError

from conftest import kernel_for, require, spec_of, to_device
from backward_helpers import check_backward, check_case, check_kv_lens_hidden_keys, check_packed, device_mask, \
    documents, qkv, rand


# (label, spec body, Hq, Hkv, Lq, Lk, B)
CASES = [
    ("f32 d16 none", "head_dim 16\n dtype f32", 2, 2, 7, 7, 2),
    ("f16 d32 causal GQA 3", "head_dim 32\n dtype f16\n mask causal", 6, 2, 113, 113, 1),
    ("f16 d64 causal Lq > Lk", "head_dim 64\n dtype f16\n mask causal", 4, 4, 113, 7, 1),
    ("bf16 d64 bottom-right Lq < Lk GQA 4", "head_dim 64\n dtype bf16\n mask causal(bottom_right)", 4, 1, 7, 113, 2),
    ("f16 d40 bottom-right empty rows", "head_dim 40\n dtype f16\n mask causal(bottom_right)", 2, 1, 17, 5, 1),
    ("f16 d64 window softcap scale", "head_dim 64\n dtype f16\n mask window(left=5, right=2)\n softcap 30\n scale 0.3",
     4, 4, 113, 100, 1),
    ("f16 192/128 causal GQA 4", "head_dim qk=192 v=128\n dtype f16\n mask causal", 4, 1, 33, 47, 1),
    ("f32 d128 window softcap one row", "head_dim 128\n dtype f32\n mask window(left=20)\n softcap 10", 3, 3, 1, 113, 1),
    # (two keys: with one, dq and dk are exactly 0, and D_i from the rounded out leaves noise there)
    ("bf16 d128 none GQA 3 two keys", "head_dim 128\n dtype bf16", 3, 1, 113, 2, 1),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_matches_reference(case):
    require("cuda")
    check_case(case)


def test_deterministic_and_torch_tensors_in_and_out():
    """PyTorch tensors in (q a strided view), PyTorch tensors out; two calls of the deterministic
    family give the same bits."""
    require("cuda")
    torch = pytest.importorskip("torch")
    spec = spec_of("head_dim 64\n dtype f16\n mask causal\n target cuda { backward=deterministic }")
    rng = np.random.default_rng(4)
    q, k, v = rand(rng, 2, 37, 6, 64), rand(rng, 2, 37, 2, 64), rand(rng, 2, 37, 2, 64)
    qt = torch.from_numpy(np.ascontiguousarray(q.transpose(0, 2, 1, 3))).cuda().half().transpose(1, 2)
    kt, vt = (torch.from_numpy(x).cuda().half() for x in (k, v))
    assert not qt.is_contiguous()
    check_backward(spec, q, k, v, inputs=(qt, kt, vt))
    kernel = kernel_for(spec, "cuda")
    out, lse = kernel(qt, kt, vt, return_lse=True)
    dout = torch.randn_like(out)
    first = kernel.backward(qt, kt, vt, out, lse, dout)
    second = kernel.backward(qt, kt, vt, out, lse, dout)
    for a, b in zip(first, second):
        assert isinstance(a, torch.Tensor) and torch.equal(a, b)


@pytest.mark.parametrize("mask", ["causal(bottom_right)", "window(left=20)"])
def test_kv_lens_and_hidden_keys_holding_inf_and_nan(mask):
    """Keys past kv_lens hold inf / NaN: no gradient sees them, and they get dk = dv = 0."""
    require("cuda")
    spec = spec_of(f"head_dim 64\n dtype f16\n mask {mask}")
    rng = np.random.default_rng(6)
    lens = [0, 37, 100, 1]
    check_kv_lens_hidden_keys(spec, *qkv(spec, rng, 4, 7, 100), lens)


@pytest.mark.parametrize("mask", ["causal", "window(left=9, right=3)", "causal(bottom_right)"])
def test_packed_sequences(mask):
    require("cuda")
    spec = spec_of(f"head_dim 64\n dtype f16\n mask {mask}")
    check_packed(spec, [1, 7, 113, 0, 30], [1, 20, 113, 3, 0], np.random.default_rng(5))


@pytest.mark.parametrize("kind", ["boolean per head", "additive"])
def test_custom_mask(kind):
    """mask custom: dQ follows each q tile's list, dK/dV scan the q tiles' lists; rows that see
    no key get dq = 0, keys no row sees dk = dv = 0."""
    require("cuda")
    spec = spec_of("head_dim 32\n dtype f16\n mask custom")
    rng = np.random.default_rng(7)
    b, lq, lk, hq, hkv = 2, 113, 150, 6, 2
    q, k, v = qkv(spec, rng, b, lq, lk, hq, hkv)
    if kind == "additive":
        m = np.where(documents(lq, lk, rng)[None, None], rng.standard_normal((b, 1, lq, lk)), -np.inf)
        m = m.astype(np.float32)
        m[:, :, 3] = -np.inf  # a row that sees nothing
        m[:, :, :, 120:] = -np.inf  # keys nobody sees
    else:
        m = np.stack([documents(lq, lk, rng) for _ in range(hq)])[None]  # (1, Hq, Lq, Lk)
        m[..., 50:60, :] = False
        m[..., 140:] = False
    kernel = kernel_for(spec, "cuda")
    bm = attngen.block_mask(device_mask(m), kernel)
    (dq, dk, dv), _ = check_backward(spec, q, k, v, call={"mask": bm}, ref_kw={"mask": m})
    rows = slice(3, 4) if kind == "additive" else slice(50, 60)
    assert not dq[:, rows].any()
    keys = slice(120, None) if kind == "additive" else slice(140, None)
    assert not dk[:, keys].any() and not dv[:, keys].any()
    # a raw mask tensor works too (the BlockMask is built for the call)
    check_backward(spec, q, k, v, call={"mask": device_mask(m)}, ref_kw={"mask": m})


def test_custom_mask_with_packed_sequences():
    require("cuda")
    spec = spec_of("head_dim 32\n dtype f32\n mask custom")
    rng = np.random.default_rng(3)
    lens = [5, 0, 40, 17]
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    total = int(cu[-1])
    q, k, v = rand(rng, total, 4, 32), rand(rng, total, 2, 32), rand(rng, total, 2, 32)
    mask = rng.random((len(lens), 1, max(lens), max(lens))) < 0.5
    bm = attngen.block_mask(device_mask(mask), kernel_for(spec, "cuda"))
    check_backward(spec, q, k, v, call={"mask": bm, "cu_seqlens_q": cu}, ref_kw={"mask": mask, "cu_seqlens_q": cu})


# ---- bad input ---------------------------------------------------------------------------------

def _forward(spec, b=1, lq=9, lk=11, hq=4, hkv=2):
    rng = np.random.default_rng(0)
    q, k, v = qkv(spec, rng, b, lq, lk, hq, hkv)
    kernel = kernel_for(spec, "cuda")
    dq, dk, dv = to_device("cuda", spec.dtype, q, k, v)
    out, lse = kernel(dq, dk, dv, return_lse=True)
    return kernel, dq, dk, dv, out, lse


def test_bad_inputs_are_refused_naming_the_argument():
    require("cuda")
    import cupy
    spec = spec_of("head_dim 32\n dtype f16\n mask causal")
    kernel, q, k, v, out, lse = _forward(spec)
    with pytest.raises(LaunchError, match="dout must have shape"):
        kernel.backward(q, k, v, out, lse, out[:, :-1])
    with pytest.raises(LaunchError, match="dout must have shape .* dtype f16"):
        kernel.backward(q, k, v, out, lse, out.astype(cupy.float32))
    with pytest.raises(LaunchError, match="out must have shape"):
        kernel.backward(q, k, v, out[..., :16], lse, out)
    _, _, _, _, _, other_lse = _forward(spec, lq=8)  # lse of another call (Lq 8, not 9)
    with pytest.raises(LaunchError, match="lse must have shape"):
        kernel.backward(q, k, v, out, other_lse, out)
    with pytest.raises(LaunchError, match="lse must have shape .* f32"):
        kernel.backward(q, k, v, out, lse.astype(cupy.float16), out)
    with pytest.raises(LaunchError, match="numpy array in host memory"):
        kernel.backward(q, k, v, out, lse, cupy.asnumpy(out))
    with pytest.raises(LaunchError, match="mask= needs a kernel built with `mask custom`"):
        kernel.backward(q, k, v, out, lse, out, mask=cupy.ones((9, 11), bool))
    with pytest.raises(LaunchError, match="kv_lens"):
        kernel.backward(q, k, v, out, lse, out, kv_lens=np.array([12], np.int32))  # more than the cache


def test_a_paged_kernel_has_no_backward():
    require("cuda")
    spec = spec_of("head_dim 64\n dtype f16\n kv_cache paged(page=16)")
    kernel = kernel_for(spec, "cuda")
    import cupy
    x = cupy.zeros((1, 4, 2, 64), cupy.float16)
    with pytest.raises(LaunchError, match="paged KV cache is an inference cache"):
        kernel.backward(x, x, x, x, cupy.zeros((1, 2, 4), cupy.float32), x)
