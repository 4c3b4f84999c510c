"""Quantized KV caches on target cuda (issue 44, `kv_dtype e4m3 | e5m2 | i8`) on a GPU: the kernels
against the float64 reference fed the same stored bytes and scales, every kv_dtype x contiguous /
paged x split_kv / two_pass / fused, GQA groups 3 and 1, sequences of 1, 7, 113 and 1023 keys;
every byte decoded; the fused append byte for byte runtime/kvquant.py's append_kv; the call's
refusals for CuPy and PyTorch arrays. Skipped without a GPU; the same kernels run on the CPU
emulation in tests/backends/cuda/test_kvquant_emulated.py, and test_wgsl_kv_quant.py holds WGSL's."""

from __future__ import annotations

import numpy as np
import pytest

import attngen
from attngen.reference import reference, relative_error, tolerance
from attngen.runtime.kvquant import I8_BLOCK, append_kv, decode_fp8

from conftest import kernel_for, paged_caches, require, spec_of

KV_DTYPES = ["e4m3", "e5m2", "i8"]
LENS = np.array([1, 7, 113, 1023], np.int32)
D = 128
PAGE = 16


def _cp():
    require("cuda")
    import cupy
    return cupy


def _spec(kv_dtype, schedule, paged, dtype="f16", d=D):
    cache = f"\n kv_cache paged(page={PAGE})" if paged else ""
    return spec_of(f"head_dim {d}\n dtype {dtype}\n schedule {schedule}{cache}\n kv_dtype {kv_dtype}")



def _case(spec, hq, hkv, lens, lq=1, seed=44, room=0):
    rng = np.random.default_rng(seed)
    kv = spec.kv_dtype
    np_dt = np.float32 if spec.dtype == "f32" else np.float16
    q = rng.standard_normal((len(lens), lq, hq, spec.head_dim_qk)).astype(np_dt)
    caches = [attngen.quantize_kv(rng.standard_normal((len(lens), int(max(lens)) + room, hkv, d)) * s, kv)
              for s, d in ((2, spec.head_dim_qk), (1, spec.head_dim_v))]
    kw = {"kv_lens": np.asarray(lens, np.int32)}
    if spec.kv_cache.is_paged:
        caches, kw["block_table"] = paged_caches(caches, kv, np.asarray(lens) + room, rng, PAGE)
    (k, ks), (v, vs) = caches
    return q, k, v, ks, vs, kw


def _on_gpu(cupy, *arrays, torch=False):
    if torch:
        import torch as t
        return [t.from_numpy(np.ascontiguousarray(a)).cuda() for a in arrays]
    return [cupy.asarray(a) for a in arrays]


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("schedule", ["split_kv(auto)", "split_kv(4)", "two_pass", "fused"])
def test_quantized_cache_matches_the_reference(kv_dtype, paged, schedule):
    cupy = _cp()
    spec = _spec(kv_dtype, schedule, paged)
    kernel = kernel_for(spec, "cuda")
    for hq, hkv, lq in ((6, 2, 1), (2, 2, 3)):  # GQA groups 3 (decode) and 1 (3 query rows)
        q, k, v, ks, vs, kw = _case(spec, hq, hkv, LENS, lq)
        args = _on_gpu(cupy, q, k, v, ks, vs)
        out, lse = kernel(*args[:3], k_scale=args[3], v_scale=args[4], return_lse=True, check=True,
                          **{n: cupy.asarray(x) for n, x in kw.items()})
        ref, ref_lse = reference(spec, q, k, v, k_scale=ks, v_scale=vs, return_lse=True, **kw)
        err = relative_error(cupy.asnumpy(out), ref)
        assert err <= tolerance(spec), f"{kv_dtype} groups {hq // hkv}: relative error {err:.3g}"
        assert np.abs(cupy.asnumpy(lse) - ref_lse).max() <= 1e-3 * np.abs(ref_lse).max()


@pytest.mark.parametrize("body", [
    "head_dim 128\n dtype bf16\n schedule split_kv(auto)\n kv_dtype e4m3",
    "head_dim 64\n dtype f32\n schedule split_kv(auto)\n kv_dtype e5m2",
    "head_dim 256\n dtype f16\n schedule split_kv(auto)\n kv_cache paged(page=16)\n kv_dtype i8",
    "head_dim qk=192 v=128\n dtype bf16\n schedule two_pass\n kv_dtype i8",
    "head_dim 80\n dtype f16\n mask causal(bottom_right)\n kv_dtype e4m3",
])
def test_dtypes_head_dims_and_masks(body):
    cupy = _cp()
    spec = spec_of(body)
    q, k, v, ks, vs, kw = _case(spec, 3, 1, [7, 113, 1023], lq=2)
    args = _on_gpu(cupy, q, k, v, ks, vs)
    if spec.dtype == "bf16":
        import torch
        args = _on_gpu(cupy, q.astype(np.float32), k, v, ks, vs, torch=True)
        args[0] = args[0].to(torch.bfloat16)
    out = kernel_for(spec, "cuda")(*args[:3], k_scale=args[3], v_scale=args[4], check=True, **kw)
    got = out.float().cpu().numpy() if spec.dtype == "bf16" else cupy.asnumpy(out)
    ref = reference(spec, q.astype(np.float32), k, v, k_scale=ks, v_scale=vs, **kw)
    assert relative_error(got, ref) <= tolerance(spec)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_every_byte_decodes_as_the_reference_decodes_it(kv_dtype):
    """One key (weight 1): out is V's dequantized row, each finite byte once, in f32 (the sm_89+
    FP8 conversions on this GPU); a NaN or inf byte makes the row NaN (on cuda a row that sees a
    value of V that is not finite outputs NaN, as with f16 caches)."""
    cupy = _cp()
    spec = spec_of(f"head_dim 256\n dtype f32\n kv_dtype {kv_dtype}")
    codes = np.arange(256, dtype=np.uint8).view(np.int8 if kv_dtype == "i8" else np.uint8)
    want = codes.astype(np.float64) if kv_dtype == "i8" else decode_fp8(codes, kv_dtype)
    finite = np.isfinite(want)
    v = np.where(finite, codes, 0).astype(codes.dtype).reshape(1, 1, 1, 256)
    scale = np.ones((1, 1, 1, 256 // I8_BLOCK) if kv_dtype == "i8" else (1, 1), np.float32)
    q = np.ones((1, 1, 1, 256), np.float32)
    kernel = kernel_for(spec, "cuda")
    out = kernel(*_on_gpu(cupy, q, np.zeros_like(v), v), k_scale=scale, v_scale=scale)
    assert np.array_equal(cupy.asnumpy(out).reshape(-1), np.where(finite, want, 0).astype(np.float32))
    if kv_dtype != "i8":
        v[..., 3] = np.flatnonzero(~finite)[0]
        out = kernel(*_on_gpu(cupy, q, np.zeros_like(v), v), k_scale=scale, v_scale=scale)
        assert np.isnan(cupy.asnumpy(out)).all()


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("schedule", ["split_kv(auto)", "two_pass", "fused"])
def test_the_fused_append_writes_the_bytes_quantize_rows_gives(kv_dtype, paged, schedule):
    """k_new / v_new appended to a quantized cache: every byte (and i8 scale) the call writes equals
    runtime/kvquant.py's append_kv, and the output is the reference's over the appended cache (the
    appended keys are read quantized alike in the same call). FP8 rows hold saturation, infinities
    and NaN of both signs."""
    cupy = _cp()
    spec = _spec(kv_dtype, schedule, paged)
    q, k, v, ks, vs, kw = _case(spec, 6, 2, [0, 7, 113], lq=2, room=3)
    rng = np.random.default_rng(3)
    k_new = (rng.standard_normal((3, 3, 2, D)) * 4).astype(np.float16)
    v_new = rng.standard_normal((3, 3, 2, D)).astype(np.float16)
    if kv_dtype != "i8":
        k_new[0, 0, 0, :6] = [6e4, -6e4, np.inf, -np.inf, np.nan, -0.0]
        k_new[0, 0, 1, 0] = -np.float16(np.nan)
    want = append_kv(kv_dtype, k, v, ks, vs, k_new, v_new, kw["kv_lens"], kw.get("block_table"))
    dk, dv, dks, dvs, dkn, dvn = _on_gpu(cupy, k, v, ks, vs, k_new, v_new)
    out = kernel_for(spec, "cuda")(cupy.asarray(q), dk, dv, k_scale=dks, v_scale=dvs, k_new=dkn, v_new=dvn,
                                   check=True, **kw)
    for name, got, w in zip(("k", "v", "k_scale", "v_scale"), (dk, dv, dks, dvs), want):
        assert np.array_equal(cupy.asnumpy(got), w, equal_nan=w.dtype == np.float32), name
    ref = reference(spec, q, k, v, k_scale=ks, v_scale=vs, k_new=k_new, v_new=v_new, **kw)
    got = cupy.asnumpy(out).astype(np.float64)
    assert np.array_equal(np.isnan(got), np.isnan(ref))
    seen = ~np.isnan(ref)
    assert relative_error(np.where(seen, got, 0), np.where(seen, ref, 0)) <= tolerance(spec)


def test_torch_tensors_and_its_fp8_dtypes():
    """PyTorch CUDA tensors, the cache as torch.float8_e4m3fn (the same bytes as uint8)."""
    cupy = _cp()
    torch = pytest.importorskip("torch")
    spec = _spec("e4m3", "split_kv(auto)", False)
    q, k, v, ks, vs, kw = _case(spec, 8, 2, [7, 1023])
    tq, tk, tv, tks, tvs = _on_gpu(cupy, q, k, v, ks, vs, torch=True)
    kernel = kernel_for(spec, "cuda")
    out = kernel(tq, tk.view(torch.float8_e4m3fn), tv.view(torch.float8_e4m3fn), k_scale=tks, v_scale=tvs,
                 check=True, **kw)
    ref = reference(spec, q, k, v, k_scale=ks, v_scale=vs, **kw)
    assert relative_error(out.float().cpu().numpy(), ref) <= tolerance(spec)
    with pytest.raises(attngen.LaunchError, match="stores K and V as kv_dtype e4m3"):
        kernel(tq, tk.view(torch.float8_e5m2), tv.view(torch.float8_e5m2), k_scale=tks, v_scale=tvs, **kw)


def _call_args(kv_dtype="i8"):
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 1, 4, D)).astype(np.float16)
    (k, ks), (v, vs) = [attngen.quantize_kv(rng.standard_normal((2, 9, 2, D)), kv_dtype) for _ in "kv"]
    return q, k, v, ks, vs


@pytest.mark.parametrize("arrays", ["cupy", "torch"])
@pytest.mark.parametrize("how, message", [
    ("missing", "stores K and V as i8: pass k_scale= and v_scale="),
    ("shape", "k_scale has shape (2, 9, 2, 1), but kv_dtype i8 needs (2, 9, 2, 4)"),
    ("dtype", "k_scale has dtype float64, but scales are float32"),
    ("k dtype", "stores K and V as kv_dtype i8: numpy int8"),
    ("host inf", "k_scale[0, 0, 0, 0] is inf: inf"),
    ("host nan", "k_scale[0, 0, 0, 0] is nan: NaN"),
    ("device nan", "k_scale or v_scale holds a value that is not finite and >= 0"),
    ("packed", "packed sequences (cu_seqlens_q=) are not built for a quantized cache yet (issue 44)"),
    ("host scale append", "which writes k_scale at the new rows: pass it as a CUDA array"),
    ("append nan", "k_new / v_new of sequence 1 hold inf or NaN, which an i8 cache cannot store"),
])
def test_bad_calls_are_launch_errors_naming_the_argument(arrays, how, message):
    cupy = _cp()
    spec = _spec("i8", "split_kv(auto)", False)
    kernel = kernel_for(spec, "cuda")
    q, k, v, ks, vs = _call_args()
    torch = arrays == "torch"
    dq, dk, dv, dks, dvs = _on_gpu(cupy, q, k, v, ks, vs, torch=torch)
    kw = {"k_scale": dks, "v_scale": dvs}
    if how == "missing":
        del kw["k_scale"], kw["v_scale"]
    elif how == "shape":
        kw["k_scale"] = _on_gpu(cupy, ks[..., :1].copy(), torch=torch)[0]
    elif how == "dtype":
        kw["k_scale"] = _on_gpu(cupy, ks.astype(np.float64), torch=torch)[0]
    elif how == "k dtype":
        dk = _on_gpu(cupy, k.astype(np.float16), torch=torch)[0]
    elif how in ("host inf", "host nan"):
        bad = ks.copy()
        bad[0, 0, 0, 0] = {"inf": np.inf, "nan": np.nan}[how[5:]]
        kw["k_scale"] = bad
    elif how == "device nan":
        bad = ks.copy()
        bad[1, 2, 0, 1] = np.nan
        kw["k_scale"], kw["check"] = _on_gpu(cupy, bad, torch=torch)[0], True
    elif how == "packed":
        dq, dk, dv = _on_gpu(cupy, q[0], k.reshape(-1, 2, D), v.reshape(-1, 2, D), torch=torch)
        kw.update(cu_seqlens_q=np.array([0, 1], np.int32), cu_seqlens_k=np.array([0, 18], np.int32))
    elif how == "host scale append":
        kw.update(k_scale=ks, k_new=dq[:, :1, :2], v_new=dq[:, :1, :2], kv_lens=np.array([3, 4], np.int32))
    elif how == "append nan":
        new = np.ones((2, 1, 2, D), np.float16)
        new[1, 0, 1, 5] = np.nan
        dn = _on_gpu(cupy, new, torch=torch)[0]
        kw.update(k_new=dn, v_new=dn, kv_lens=np.array([3, 4], np.int32), check=True)
    with pytest.raises(attngen.LaunchError) as e:
        kernel(dq, dk, dv, **kw)
    assert message in str(e.value)


def test_a_scale_on_a_kernel_without_kv_dtype_is_refused():
    cupy = _cp()
    spec = spec_of(f"head_dim {D}\n dtype f16")
    q, _, _, ks, _ = _call_args()
    k = cupy.zeros((2, 9, 2, D), cupy.float16)
    with pytest.raises(attngen.LaunchError, match="k_scale= needs a kernel built with `kv_dtype"):
        kernel_for(spec, "cuda")(cupy.asarray(q), k, k, k_scale=cupy.asarray(ks))


def test_a_quantized_cache_has_no_backward():
    cupy = _cp()
    spec = spec_of(f"head_dim {D}\n dtype f16\n kv_dtype i8")
    q, k, v, ks, vs = [cupy.asarray(x) for x in _call_args()]
    kernel = kernel_for(spec, "cuda")
    out, lse = kernel(q, k, v, k_scale=ks, v_scale=vs, return_lse=True)
    with pytest.raises((attngen.LaunchError, attngen.SpecError), match="kv_dtype i8: a quantized KV cache is an inference cache"):
        kernel.backward(q, k, v, out, lse, out)
