"""FP8 prefill's inputs on the host (attngen/runtime/fp8.py) and the float64 reference fed FP8 bytes
(docs/language.md, "FP8 prefill"): exact dequantization, the descales' defaults and checks, bad input."""

from __future__ import annotations

import numpy as np
import pytest

import attngen
from attngen import LaunchError
from attngen.runtime.fp8 import check_descales, dequantize_fp8, quantize_fp8
from attngen.runtime.kvquant import FP8, decode_fp8

from conftest import spec_of


def fp8_spec(body: str = "", dtype: str = "e4m3"):
    return spec_of(f"head_dim 64\ndtype {dtype}\n{body}", name="f")


def _inputs(seed=0, b=2, lq=9, lk=13, hq=6, hkv=2, d=64, dtype="e4m3"):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(s) * 3 for s in ((b, lq, hq, d), (b, lk, hkv, d), (b, lk, hkv, d)))
    (q8, qd), (k8, kd), (v8, vd) = (quantize_fp8(x, dtype, heads_kv=hkv) for x in (q, k, v))
    return q8, k8, v8, qd, kd, vd


def _softmax_attention(q, k, v, scale, visible=None):
    """Plain float64 attention of dequantized values (B, L, H, D), GQA by head // group."""
    group = q.shape[2] // k.shape[2]
    kk, vv = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, kk) * scale
    if visible is not None:
        s = np.where(visible, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhij,bjhd->bihd", p / p.sum(-1, keepdims=True), vv)


@pytest.mark.parametrize("dtype", ["e4m3", "e5m2"])
def test_quantize_and_dequantize(dtype):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 5, 6, 16)) * 10
    x[1, :, 4:] = 0.0  # an all-zero (sequence, KV head): descale 1
    stored, descale = quantize_fp8(x, dtype, heads_kv=3)
    assert stored.dtype == np.uint8 and stored.shape == x.shape
    assert descale.dtype == np.float32 and descale.shape == (2, 3) and descale[1, 2] == 1.0
    back = dequantize_fp8(stored, descale, dtype)
    assert np.array_equal(back, decode_fp8(stored, dtype) * np.repeat(descale.astype(np.float64), 2, axis=1)[:, None, :, None])
    rel = np.abs(back - x) / np.maximum(np.abs(x), 1e-30)
    assert rel[np.abs(x) > 1e-2 * np.abs(x).max()].max() <= 2.0 ** -(FP8[dtype][1] + 1) * 1.01
    g = np.abs(x).reshape(2, 5, 3, 2, 16).max(axis=(1, 3, 4))
    assert np.allclose(np.where(g > 0, g / FP8[dtype][3], 1.0), descale)  # max|x| / largest per (b, hkv)
    with pytest.raises(ValueError, match="inf"):
        quantize_fp8(np.full((1, 1, 1, 16), np.inf), dtype)


@pytest.mark.parametrize("dtype", ["e4m3", "e5m2"])
def test_the_reference_dequantizes_exactly(dtype):
    q8, k8, v8, qd, kd, vd = _inputs(dtype=dtype)
    spec = fp8_spec("mask causal(bottom_right)", dtype)
    out, lse = attngen.reference(spec, q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd, return_lse=True)
    q, k, v = dequantize_fp8(q8, qd, dtype), dequantize_fp8(k8, kd, dtype), dequantize_fp8(v8, vd, dtype)
    visible = np.arange(13)[None, :] <= np.arange(9)[:, None] + 13 - 9
    want = _softmax_attention(q, k, v, spec.resolved_scale, visible)
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)
    assert out.shape == (2, 9, 6, 64) and lse.shape == (2, 6, 9)


def test_descales_default_to_one_and_torch_float8_reads_as_its_bytes():
    q8, k8, v8, *_ = _inputs()
    spec = fp8_spec()
    ones = np.ones((2, 2), np.float32)
    a = attngen.reference(spec, q8, k8, v8)
    b = attngen.reference(spec, q8, k8, v8, q_descale=ones, k_descale=ones, v_descale=ones)
    assert np.array_equal(a, b)
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this PyTorch has no float8")
    t = [torch.from_numpy(x).view(torch.float8_e4m3fn) for x in (q8, k8, v8)]
    assert np.array_equal(attngen.reference(spec, *t), a)
    with pytest.raises(LaunchError, match=r"k is a torch.float8_e5m2 tensor; spec dtype e4m3 takes torch.float8_e4m3fn"):
        attngen.reference(spec, t[0], torch.from_numpy(k8).view(torch.float8_e5m2), t[2])


@pytest.mark.parametrize("change, message", [
    (lambda d: {"q_descale": d[:1]}, r"q_descale has shape \(1, 2\); it must be \(B, Hkv\) = \(2, 2\)"),
    (lambda d: {"k_descale": d.T[:, :, None]}, r"k_descale has shape \(2, 2, 1\)"),
    (lambda d: {"v_descale": np.where([[1, 1], [1, 0]], d, 0)}, r"v_descale\[1, 1\] is 0.0: not > 0"),
    (lambda d: {"q_descale": np.where([[1, 0], [1, 1]], d, np.inf)}, r"q_descale\[0, 1\] is inf: inf"),
    (lambda d: {"k_descale": np.where([[0, 1], [1, 1]], d, np.nan)}, r"k_descale\[0, 0\] is nan: NaN"),
    (lambda d: {"v_descale": -d}, r"v_descale\[0, 0\] is -1.0: not > 0"),
    (lambda d: {"q_descale": d.astype(np.int32)}, r"q_descale has dtype int32; descales are float32"),
])
def test_bad_descales_are_named(change, message):
    q8, k8, v8, *_ = _inputs()
    with pytest.raises(LaunchError, match=message):
        attngen.reference(fp8_spec(), q8, k8, v8, **change(np.ones((2, 2), np.float32)))


def test_bad_fp8_inputs_are_named():
    q8, k8, v8, qd, kd, vd = _inputs()
    spec = fp8_spec()
    with pytest.raises(LaunchError, match="q has dtype float16; spec dtype e4m3 takes its FP8 bytes as uint8"):
        attngen.reference(spec, q8.astype(np.float16), k8, v8)
    with pytest.raises(LaunchError, match="FP8 kernels take padded batches"):
        attngen.reference(spec, q8, k8, v8, kv_lens=[3, 4])
    with pytest.raises(LaunchError, match=r"v has head_dim 32"):
        attngen.reference(spec, q8, k8, v8[..., :32])
    with pytest.raises(LaunchError, match=r"q_descale= needs a spec with an FP8 dtype"):
        attngen.reference(spec_of("head_dim 64\ndtype f16"), q8.astype(np.float32), k8.astype(np.float32),
                          v8.astype(np.float32), q_descale=qd)


def test_check_descales_reads_floats_as_float32():
    out = check_descales({"q_descale": [[0.5, 2.0]]}, 1, 2, "who")
    assert out["q_descale"].dtype == np.float32 and out["k_descale"].tolist() == [[1.0, 1.0]]


def test_non_finite_fp8_values_follow_the_contract():
    """NaN in v at a key a row does not see changes nothing; a row that sees it is NaN (the kernels'
    _prepare_v zeroes it and marks the key)."""
    q8, k8, v8, *_ = _inputs(b=1, lq=4, lk=4, hq=2, hkv=1)
    v8[0, 3, 0, 5] = 0x7F  # e4m3 NaN at key 3
    out = attngen.reference(fp8_spec("mask causal"), q8, k8, v8)
    assert np.isfinite(out[0, :3]).all() and np.isnan(out[0, 3]).any()  # (the kernels: the whole row)
