"""FP8 prefill on cuda (issue 44, `dtype e4m3 | e5m2`): the kernels against the float64 reference fed
the same FP8 bytes and descales (exact dequantization in the oracle), at lengths 1, 7, 113 and 1023,
Lq != Lk, GQA groups 3 and 1, every mask the FP8 kernel takes, softcap, head dims 64 / 128 / 256; and
beside each, the error of the same (dequantized) inputs through the f16 kernel, for the record
(`pytest -s` prints both). The call's refusals and the non-finite contract. Needs an H100 (sm_90a):
skipped elsewhere; the checker's refusals and the sources are tests/backends/cuda/test_fp8_source.py,
the reference's dequantization tests/runtime/test_fp8_inputs.py."""

from __future__ import annotations

import numpy as np
import pytest

import attngen
from attngen import LaunchError
from attngen.reference import reference, relative_error, tolerance
from attngen.runtime.fp8 import dequantize_fp8, quantize_fp8

from conftest import kernel_for, require, spec_of

CASES = [  # (lq, lk, hq, hkv)
    (1, 1, 6, 2), (7, 7, 6, 2), (113, 113, 2, 2), (1023, 1023, 6, 2), (113, 1023, 6, 2), (1023, 7, 2, 2),
]
MASKS = ["none", "causal", "causal(bottom_right)", "window(left=100)", "window(left=64, right=32)"]


def _sm90():
    require("cuda")
    import cupy
    if cupy.cuda.Device().compute_capability != "90":
        pytest.skip("FP8 prefill needs an sm_90 GPU (H100, H200)")
    return pytest.importorskip("torch")


def _inputs(torch, spec, batch, lq, lk, hq, hkv, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(s) * 2 for s in ((batch, lq, hq, spec.head_dim_qk), (batch, lk, hkv, spec.head_dim_qk),
                                                   (batch, lk, hkv, spec.head_dim_v)))
    (q8, qd), (k8, kd), (v8, vd) = (quantize_fp8(x, spec.dtype, heads_kv=hkv) for x in (q, k, v))
    fp8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[spec.dtype]
    dev = [torch.from_numpy(x).cuda().view(fp8) for x in (q8, k8, v8)]
    scales = {n: torch.from_numpy(x).cuda() for n, x in (("q_descale", qd), ("k_descale", kd), ("v_descale", vd))}
    host = dict(q=q8, k=k8, v=v8, q_descale=qd, k_descale=kd, v_descale=vd)
    return dev, scales, host


def _f16_error(torch, spec, host, ref, mask=None):
    """The same (dequantized) inputs rounded to f16, through the f16 kernel of the same spec."""
    f16 = attngen.parse(attngen.format_spec(spec).replace(f"{spec.dtype} out={spec.out_dtype}", "f16")
                        .replace(f"attention {spec.name} ", f"attention {spec.name}_f16 "))[0]
    group = host["q"].shape[2] // host["k"].shape[2]
    vals = [dequantize_fp8(host[n], host[f"{n}_descale"], spec.dtype, group if n == "q" else 1) for n in "qkv"]
    out = kernel_for(f16, "cuda")(*[torch.from_numpy(x.astype(np.float16)).cuda() for x in vals],
                                   **({"mask": mask} if mask is not None else {}))
    return relative_error(out.float().cpu().numpy(), ref)


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "lq{}-lk{}-h{}/{}".format(*c))
def test_fp8_matches_the_reference(case, mask, d):
    torch = _sm90()
    lq, lk, hq, hkv = case
    spec = spec_of(f"head_dim {d}\ndtype e4m3\nmask {mask}", name=f"fp8_d{d}")
    kernel = kernel_for(spec, "cuda")
    (q, k, v), scales, host = _inputs(torch, spec, 2, lq, lk, hq, hkv)
    out, lse = kernel(q, k, v, return_lse=True, check=True, **scales)
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == (2, lq, hq, d)
    ref, ref_lse = reference(spec, return_lse=True, **host)
    err = relative_error(out.float().cpu().numpy(), ref)
    print(f"\nFP8 d{d} {mask} {case}: {err:.2e} (f16 kernel, same values: {_f16_error(torch, spec, host, ref):.2e})")
    assert err <= tolerance(spec), err
    got = lse.cpu().numpy()
    assert np.array_equal(np.isneginf(got), np.isneginf(ref_lse))
    fin = np.isfinite(ref_lse)
    np.testing.assert_allclose(got[fin], ref_lse[fin], atol=2e-2, rtol=1e-3)


@pytest.mark.parametrize("variant", ["e5m2 out=f16", "e4m3 softcap", "e4m3 tile q=64", "e4m3 persistent off"])
def test_fp8_variants(variant):
    torch = _sm90()
    dtype = variant.split()[0] + (" out=f16" if "out=f16" in variant else "")
    extra = {"e4m3 softcap": "softcap 20\nmask causal", "e4m3 tile q=64": "tile q=64",
             "e4m3 persistent off": "target cuda { persistent=off }"}.get(variant, "")
    spec = spec_of(f"head_dim 128\ndtype {dtype}\n{extra}", name="fp8_" + variant.replace(" ", "_").replace("=", ""))
    (q, k, v), scales, host = _inputs(torch, spec, 3, 333, 517, 6, 2, seed=3)
    out = kernel_for(spec, "cuda")(q, k, v, check=True, **scales)
    ref = reference(spec, **host)
    err = relative_error(out.float().cpu().numpy(), ref)
    print(f"\nFP8 {variant}: {err:.2e} (f16 kernel, same values: {_f16_error(torch, spec, host, ref):.2e})")
    assert err <= tolerance(spec), err


# FP8 tiles (fp8.fp8_tiles; benchmarks/probes/probe_fp8.py --tiles): beside the table's (d64 128 x 256, d128
# 128 x 192, above 128 x 128), three consumer warpgroups (q 192), the 128 x 128 of before, and tile kv in V^T
# column blocks of a 64- or 32-byte swizzle (kv 192, 160) with every named mask
TILES = [(64, "none", 192, 128), (64, "causal", 192, 128), (64, "window(left=100)", 192, 128), (64, "none", 128, 128),
         (64, "causal", 128, 128), (128, "none", 64, 128), (128, "none", 128, 128), (128, "causal", 128, 128),
         (64, "causal(bottom_right)", 128, 256), (64, "window(left=64, right=32)", 128, 256),
         (128, "causal(bottom_right)", 128, 192), (128, "window(left=64, right=32)", 128, 192),
         (64, "none", 128, 160), (128, "causal", 128, 160), (64, "window(left=100)", 128, 96)]


@pytest.mark.parametrize("d, mask, tq, tkv", TILES, ids=[f"d{d}-{m.split('(')[0]}-q{q}kv{kv}" for d, m, q, kv in TILES])
@pytest.mark.parametrize("case", [(7, 7, 2, 2), (113, 1023, 6, 2), (1023, 333, 6, 2)], ids=lambda c: "lq{}-lk{}".format(*c))
def test_fp8_tiles(d, mask, tq, tkv, case):
    torch = _sm90()
    lq, lk, hq, hkv = case
    spec = spec_of(f"head_dim {d}\ndtype e4m3\nmask {mask}\ntile q={tq} kv={tkv}", name=f"fp8_q{tq}kv{tkv}_d{d}")
    (q, k, v), scales, host = _inputs(torch, spec, 2, lq, lk, hq, hkv, seed=11)
    v8 = host["v"].copy()
    v8[1, lk - 1, 1, 5] = 0x7F  # NaN at the last key: rows that see it (p != 0) are NaN, the others are not
    host["v"] = v8
    v = torch.from_numpy(v8).cuda().view(torch.float8_e4m3fn)
    out, lse = kernel_for(spec, "cuda")(q, k, v, return_lse=True, check=True, **scales)
    out, ref = out.float().cpu().numpy(), reference(spec, **host)
    assert np.array_equal(np.isnan(out), np.isnan(ref))
    seen = np.isfinite(ref)
    err = relative_error(out[seen], ref[seen])
    print(f"\nFP8 d{d} {mask} tile q={tq} kv={tkv} {case}: {err:.2e}")
    assert err <= tolerance(spec), err


def test_fp8_custom_mask_and_rows_that_see_no_key():
    torch = _sm90()
    spec = spec_of("head_dim 64\ndtype e4m3\nmask custom", name="fp8_custom")
    (q, k, v), scales, host = _inputs(torch, spec, 2, 200, 300, 6, 2, seed=5)
    rng = np.random.default_rng(6)
    mask = rng.random((2, 1, 200, 300)) < 0.3
    mask[:, :, 7] = False  # a row that sees no key: 0, lse -inf
    out, lse = kernel_for(spec, "cuda")(q, k, v, mask=torch.from_numpy(mask).cuda(), return_lse=True, check=True,
                                        **scales)
    ref = reference(spec, mask=mask, **host)
    assert relative_error(out.float().cpu().numpy(), ref) <= tolerance(spec)
    assert (out[:, 7] == 0).all() and torch.isneginf(lse[:, :, 7]).all()
    with pytest.raises(LaunchError, match="an additive mask is not built for FP8"):
        kernel_for(spec, "cuda")(q, k, v, mask=torch.zeros(2, 1, 200, 300, device="cuda"), **scales)


def test_fp8_non_finite_values():
    """NaN in v at keys a row does not see changes nothing (the _prepare_v entry zeroes it); a row
    that sees one is NaN; NaN in k at a hidden key too."""
    torch = _sm90()
    spec = spec_of("head_dim 128\ndtype e4m3\nmask causal", name="fp8_nan")
    (q, k, v), scales, host = _inputs(torch, spec, 1, 300, 300, 2, 2, seed=7)
    v8, k8 = host["v"].copy(), host["k"].copy()
    v8[0, 200, 1, 17] = 0x7F  # key 200: rows < 200 do not see it
    k8[0, 250, 0, 3] = 0xFF
    host.update(v=v8, k=k8)
    dev = [torch.from_numpy(x).cuda().view(torch.float8_e4m3fn) for x in (host["q"], k8, v8)]
    out = kernel_for(spec, "cuda")(*dev, check=True, **scales).float().cpu().numpy()
    assert np.isfinite(out[0, :200, 1]).all() and np.isnan(out[0, 200:, 1]).any(axis=-1).all()
    assert np.isfinite(out[0, :250, 0]).all()
    ref = reference(spec, **host)
    seen = np.isfinite(ref)
    assert relative_error(out[seen], ref[seen]) <= tolerance(spec)


def test_fp8_call_refusals():
    torch = _sm90()
    spec = spec_of("head_dim 64\ndtype e4m3", name="fp8_bad")
    kernel = kernel_for(spec, "cuda")
    (q, k, v), scales, _ = _inputs(torch, spec, 2, 33, 40, 6, 2)
    with pytest.raises(LaunchError, match=r"q_descale has shape \(1, 2\); it must be \(B, Hkv\) = \(2, 2\)"):
        kernel(q, k, v, q_descale=scales["q_descale"][:1])
    with pytest.raises(LaunchError, match=r"k_descale is a device array of float16; descales are float32"):
        kernel(q, k, v, k_descale=scales["k_descale"].half())
    for bad, what in ((0.0, "0"), (float("inf"), "inf"), (float("nan"), "NaN"), (-1.0, "negative")):
        vd = scales["v_descale"].clone()
        vd[1, 0] = bad
        with pytest.raises(LaunchError, match=r"v_descale.ravel\(\)\[2\] \(flat over \(B, Hkv\)\) is 0, negative, inf or NaN"):
            kernel(q, k, v, v_descale=vd, check=True)
        with pytest.raises(LaunchError, match=r"v_descale\[1, 0\] is"):  # a host array: at once
            kernel(q, k, v, v_descale=vd.cpu().numpy())
    with pytest.raises(LaunchError, match="q has dtype f16, but kernel 'fp8_bad' was built for dtype e4m3"):
        kernel(q.view(torch.uint8).half(), k, v)
    with pytest.raises(LaunchError, match=r"kv_lens= \(per-sequence lengths\) is not built for FP8 yet"):
        kernel(q, k, v, kv_lens=torch.full((2,), 20, dtype=torch.int32, device="cuda"))
    with pytest.raises(LaunchError, match=r"cu_seqlens_q= \(packed sequences\) is not built for FP8 yet"):
        kernel(q, k, v, cu_seqlens_q=torch.zeros(3, dtype=torch.int32, device="cuda"))
    # missing descales are 1: the same as passing ones; uint8 bytes are the same input
    ones = torch.ones(2, 2, device="cuda")
    a = kernel(q, k, v)
    assert torch.equal(a, kernel(q, k, v, q_descale=ones, k_descale=ones, v_descale=ones))
    assert torch.equal(a, kernel(q.view(torch.uint8), k.view(torch.uint8), v.view(torch.uint8)))


def test_fp8_cupy_bytes_with_an_f16_output():
    _sm90()
    import cupy
    spec = spec_of("head_dim 64\ndtype e4m3 out=f16\nmask causal", name="fp8_cupy")
    rng = np.random.default_rng(9)
    host = {n: quantize_fp8(rng.standard_normal(s), "e4m3") for n, s in
            (("q", (1, 77, 2, 64)), ("k", (1, 77, 2, 64)), ("v", (1, 77, 2, 64)))}
    out = kernel_for(spec, "cuda")(*[cupy.asarray(host[n][0]) for n in "qkv"],
                                   **{f"{n}_descale": host[n][1] for n in "qkv"}, check=True)
    assert out.dtype == cupy.float16
    ref = reference(spec, *[host[n][0] for n in "qkv"], **{f"{n}_descale": host[n][1] for n in "qkv"})
    assert relative_error(cupy.asnumpy(out), ref) <= tolerance(spec)


# -- Q and K in the 64-byte swizzle (CudaTiles.fp8_swizzle64: head dims qk up to 64 in 64-byte rows) --------

_SW64 = {}


def _swizzle64_kernel(spec):
    """The FP8 kernel of `spec` built with fp8_swizzle64 on (this GPU's profile with the override)."""
    if spec not in _SW64:
        from attngen import backends
        from attngen.backends.cuda.devices import device_profile
        profile = device_profile(backends.get("cuda")).with_overrides(fp8_swizzle64=True)
        _SW64[spec] = attngen.compile(spec, target="cuda", profile=profile)
        assert _SW64[spec].plan.config.qk_swizzle == 64
    return _SW64[spec]


@pytest.mark.parametrize("d", [64, 48, 32, 16])
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "lq{}-lk{}-h{}/{}".format(*c))
def test_fp8_swizzle64_matches_the_reference(case, mask, d):
    torch = _sm90()
    lq, lk, hq, hkv = case
    spec = spec_of(f"head_dim {d}\ndtype e4m3\nmask {mask}", name=f"fp8_sw64_d{d}")
    (q, k, v), scales, host = _inputs(torch, spec, 2, lq, lk, hq, hkv)
    out, lse = _swizzle64_kernel(spec)(q, k, v, return_lse=True, check=True, **scales)
    ref, ref_lse = reference(spec, return_lse=True, **host)
    err = relative_error(out.float().cpu().numpy(), ref)
    print(f"\nFP8 64-byte swizzle d{d} {mask} {case}: {err:.2e}")
    assert err <= tolerance(spec), err
    got = lse.cpu().numpy()
    assert np.array_equal(np.isneginf(got), np.isneginf(ref_lse))
    fin = np.isfinite(ref_lse)
    np.testing.assert_allclose(got[fin], ref_lse[fin], atol=2e-2, rtol=1e-3)


@pytest.mark.parametrize("variant", ["e5m2 out=f16", "e4m3 softcap", "e4m3 tile q=64", "e4m3 persistent off",
                                     "e4m3 v128", "e4m3 custom"])
def test_fp8_swizzle64_variants(variant):
    """d64 in the 64-byte swizzle beside the other choices of the kernel; strided q (every other head)."""
    torch = _sm90()
    dtype = variant.split()[0] + (" out=f16" if "out=f16" in variant else "")
    extra = {"e4m3 softcap": "softcap 20\nmask causal", "e4m3 tile q=64": "tile q=64",
             "e4m3 persistent off": "target cuda { persistent=off }", "e4m3 custom": "mask custom"}.get(variant, "")
    dims = "head_dim qk=64 v=128" if variant == "e4m3 v128" else "head_dim 64"
    spec = spec_of(f"{dims}\ndtype {dtype}\n{extra}", name="fp8_sw64_" + variant.replace(" ", "_").replace("=", ""))
    (q, k, v), scales, host = _inputs(torch, spec, 3, 333, 517, 6, 2, seed=3)
    wide = torch.zeros((3, 333, 12, 64), dtype=q.dtype, device="cuda")
    wide.view(torch.uint8)[:, :, ::2] = q.view(torch.uint8)
    mask = None
    if "custom" in variant:
        mask = np.random.default_rng(4).random((3, 1, 333, 517)) < 0.5
    got = _swizzle64_kernel(spec)(wide[:, :, ::2], k, v, check=True, **scales,
                                  **({"mask": torch.from_numpy(mask).cuda()} if mask is not None else {}))
    ref = reference(spec, **host, **({"mask": mask} if mask is not None else {}))
    err = relative_error(got.float().cpu().numpy(), ref)
    print(f"\nFP8 64-byte swizzle {variant}: {err:.2e}")
    assert err <= tolerance(spec), err


TILES_SW64 = [tile for tile in TILES if tile[0] <= 64] + [(48, "window(left=100)", 192, 128)]


@pytest.mark.parametrize("d, mask, tq, tkv", TILES_SW64,
                         ids=[f"d{d}-{m.split('(')[0]}-q{q}kv{kv}" for d, m, q, kv in TILES_SW64])
@pytest.mark.parametrize("case", [(7, 7, 2, 2), (113, 1023, 6, 2), (1023, 333, 6, 2)], ids=lambda c: "lq{}-lk{}".format(*c))
def test_fp8_swizzle64_tiles(d, mask, tq, tkv, case):
    """fp8tile's tiles with Q and K in the 64-byte swizzle: K tiles of tile kv 64-byte rows, three consumer
    warpgroups' Q, V^T's column blocks by tile kv beside them."""
    torch = _sm90()
    lq, lk, hq, hkv = case
    spec = spec_of(f"head_dim {d}\ndtype e4m3\nmask {mask}\ntile q={tq} kv={tkv}", name=f"fp8_sw64_q{tq}kv{tkv}_d{d}")
    (q, k, v), scales, host = _inputs(torch, spec, 2, lq, lk, hq, hkv, seed=13)
    kernel = _swizzle64_kernel(spec)
    assert (kernel.plan.config.tile_q, kernel.plan.config.tile_kv) == (tq, tkv)
    out = kernel(q, k, v, check=True, **scales)
    ref = reference(spec, **host)
    err = relative_error(out.float().cpu().numpy(), ref)
    print(f"\nFP8 64-byte swizzle d{d} {mask} tile q={tq} kv={tkv} {case}: {err:.2e}")
    assert err <= tolerance(spec), err
