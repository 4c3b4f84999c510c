"""The sm_80 tensor-core backward (issue 41; mma.sync m16n8k16, dQ by f32 atomics:
templates/cuda/backward_mma.cu.j2) against attngen.reference_backward. The kernels are built with
profile cuda-sm80, so that they run on any GPU of compute capability 8.0 or newer, the H100
included (the family is chosen by the profile's forward math, mma, and compiled for the device's
arch): odd lengths crossing its key blocks of 64 and steps of 64 rows, Lq != Lk both ways, GQA
groups of 3, causal (both alignments), window, softcap, scale, kv_lens with hidden keys holding
inf / NaN, packed sequences, rows that see no key, f16 and bf16, head dims 32, 64, 96 and 128 (and
qk=128 v=64, qk=96 v=128). Its results agree with the deterministic family's within the dtype's tolerance. The sources
compile anywhere (tests/backends/cuda/test_backward_mma_source.py)."""

from __future__ import annotations

import numpy as np
import pytest

import attngen
from attngen.backends.cuda import backward as cuda_backward
from attngen.reference import relative_error, tolerance

from conftest import require, spec_of
from test_backward_cuda import _ints, _rand, check_backward

_KERNELS = {}


def _sm80(spec):
    """`spec`'s kernel built with profile cuda-sm80 (on this GPU's arch), its backward the mma family."""
    require("cuda")
    if spec not in _KERNELS:
        _KERNELS[spec] = attngen.compile(spec, target="cuda", profile="cuda-sm80")
    kernel = _KERNELS[spec]
    assert cuda_backward.family(kernel.plan) == "mma", kernel.plan.details
    return kernel


def _qkv(spec, rng, b, lq, lk, hq, hkv):
    return (_rand(rng, b, lq, hq, spec.head_dim_qk), _rand(rng, b, lk, hkv, spec.head_dim_qk),
            _rand(rng, b, lk, hkv, spec.head_dim_v))


def _check(spec, q, k, v, **kw):
    return check_backward(spec, q, k, v, kernel=_sm80(spec), **kw)


# (label, spec body, Hq, Hkv, Lq, Lk, B)
CASES = [
    ("f16 d64 none one row", "head_dim 64\n dtype f16", 2, 2, 1, 7, 2),
    ("f16 d64 none 7", "head_dim 64\n dtype f16", 2, 2, 7, 7, 1),
    ("bf16 d64 causal GQA 3 113", "head_dim 64\n dtype bf16\n mask causal", 6, 2, 113, 113, 1),
    ("f16 d128 none 300x400", "head_dim 128\n dtype f16", 2, 2, 300, 400, 2),
    ("bf16 d128 causal GQA 3 257", "head_dim 128\n dtype bf16\n mask causal", 3, 1, 257, 257, 1),
    ("f16 d64 causal Lq > Lk", "head_dim 64\n dtype f16\n mask causal", 4, 4, 300, 129, 1),
    ("bf16 d64 bottom-right Lq < Lk GQA 3", "head_dim 64\n dtype bf16\n mask causal(bottom_right)", 3, 1, 7, 257, 2),
    ("f16 d128 bottom-right Lq > Lk rows that see no key", "head_dim 128\n dtype f16\n mask causal(bottom_right)",
     2, 2, 257, 113, 1),
    ("f16 d128 window softcap scale", "head_dim 128\n dtype f16\n mask window(left=100, right=7)\n softcap 30\n"
     " scale 0.3", 2, 2, 300, 400, 1),
    ("bf16 d64 window left", "head_dim 64\n dtype bf16\n mask window(left=60)", 3, 3, 257, 257, 1),
    ("bf16 qk128 v64 causal GQA 3", "head_dim qk=128 v=64\n dtype bf16\n mask causal", 3, 1, 200, 200, 1),
    ("f16 d96 causal GQA 3", "head_dim 96\n dtype f16\n mask causal", 6, 2, 257, 300, 1),
    ("bf16 qk96 v128 softcap", "head_dim qk=96 v=128\n dtype bf16\n softcap 20", 2, 2, 113, 257, 1),
    ("f16 d32 window", "head_dim 32\n dtype f16\n mask window(left=30, right=5)", 3, 3, 300, 200, 2),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_matches_reference(case):
    name, body, hq, hkv, lq, lk, b = case
    spec = spec_of(body)
    _sm80(spec)
    q, k, v = _qkv(spec, np.random.default_rng(len(name)), b, lq, lk, hq, hkv)
    _check(spec, q, k, v)


@pytest.mark.parametrize("body", ["head_dim 128\n dtype f16\n mask causal(bottom_right)",
                                  "head_dim 64\n dtype bf16\n mask window(left=60)"])
def test_kv_lens_and_hidden_keys_holding_inf_and_nan(body):
    spec = spec_of(body)
    _sm80(spec)
    rng = np.random.default_rng(6)
    lens = np.array([0, 137, 300, 1], np.int32)
    q, k, v = _qkv(spec, rng, 4, 70, 300, 6, 2)
    for bi, n in enumerate(lens):
        k[bi, n:] = np.inf
        v[bi, n:] = np.nan
    (dq, dk, dv), _ = _check(spec, q, k, v, call={"kv_lens": _ints(lens)}, ref_kw={"kv_lens": lens})
    for bi, n in enumerate(lens):
        assert not dk[bi, n:].any() and not dv[bi, n:].any()
    assert not dq[0].any()


def test_masked_keys_holding_nan_reach_no_row_that_does_not_see_them():
    """Causal: key 200 holds NaN in k, key 201 inf in v. Rows before 200 do not see them: their dq
    is the reference's; the rows that do see them get NaN (NaN in, NaN out)."""
    spec = spec_of("head_dim 64\n dtype f16\n mask causal")
    kernel = _sm80(spec)
    import cupy
    rng = np.random.default_rng(9)
    q, k, v = _qkv(spec, rng, 1, 260, 260, 2, 2)
    k[0, 200] = np.nan
    v[0, 201] = np.inf
    qd, kd, vd = (cupy.asarray(x).astype(cupy.float16) for x in (q, k, v))
    out, lse = kernel(qd, kd, vd, return_lse=True)
    dout = _rand(rng, *out.shape)
    dq = cupy.asnumpy(kernel.backward(qd, kd, vd, out, lse, cupy.asarray(dout).astype(cupy.float16))[0])
    want = attngen.reference_backward(spec, q, k, v, dout)[0]
    assert np.isfinite(dq[0, :200]).all()
    assert relative_error(dq[0, :200].astype(np.float64), want[0, :200]) <= 2 * tolerance(spec)
    assert np.isnan(dq[0, 200:]).any()


@pytest.mark.parametrize("body", ["head_dim 128\n dtype bf16\n mask causal", "head_dim 64\n dtype f16\n"
                                                                              " mask window(left=90, right=3)"])
def test_packed_sequences(body):
    spec = spec_of(body)
    _sm80(spec)
    rng = np.random.default_rng(5)
    lq, lk = [1, 70, 300, 0, 130], [1, 200, 300, 3, 0]
    cuq = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    cuk = np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)
    q, k, v = (_rand(rng, cuq[-1], 6, spec.head_dim_qk), _rand(rng, cuk[-1], 2, spec.head_dim_qk),
               _rand(rng, cuk[-1], 2, spec.head_dim_v))
    _check(spec, q, k, v, call={"cu_seqlens_q": _ints(cuq), "cu_seqlens_k": _ints(cuk)},
           ref_kw={"cu_seqlens_q": cuq, "cu_seqlens_k": cuk})


def test_agrees_with_the_deterministic_family():
    """The same spec with backward=deterministic (CUDA cores, no atomics) within the dtype's
    tolerance of each other."""
    body = "head_dim 64\n heads q=6 kv=2\n dtype f16\n mask causal"
    fast, slow = spec_of(body), spec_of(body + "\n target cuda { backward=deterministic }")
    _sm80(fast)
    _KERNELS[slow] = attngen.compile(slow, target="cuda", profile="cuda-sm80")
    assert cuda_backward.family(_KERNELS[slow].plan) == "fma"
    q, k, v = _qkv(fast, np.random.default_rng(11), 1, 300, 300, 6, 2)
    got, _ = _check(fast, q, k, v)
    again, _ = check_backward(slow, q, k, v, kernel=_KERNELS[slow])
    for a, b_ in zip(got, again):
        assert np.linalg.norm(a - b_) <= 2e-3 * np.linalg.norm(b_)
