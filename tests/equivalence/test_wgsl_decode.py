"""The WGSL decode kernel (`target wgsl { decode=on }`, attngen/backends/wgsl/decode.py) against the
float64 reference on this machine's adapter: f16 (native and packed), f32 and every kv_dtype,
contiguous, paged and packed caches, masks none / causal / window with Lq > 1, soft-capping, GQA
groups 1, 3, 4 and 7, sequences of 0, 1, 7, 113 and 1023 keys; appends; keys a row does not see
(and a visible key of weight 0) holding inf / NaN; NaN rows; every stored byte decoded; resident
caches; the checker's refusals; the source's main loop without workgroup memory."""

from __future__ import annotations

import re
import zlib

import numpy as np
import pytest

import attngen
from attngen.backends import get as get_backend
from attngen.reference import reference, relative_error, tolerance
from attngen.runtime.kvquant import I8_BLOCK, decode_fp8

from conftest import kernel_for, require, spec_of
from test_hidden_keys import _check_weight_zero_key, _compare, _plant

LENS = np.array([0, 1, 7, 113, 1023], np.int32)
DECODE = "target wgsl { decode=on }"


def _spec(body: str, decode: str = "on"):
    return spec_of(body + f"\n target wgsl {{ decode={decode} }}")


def _np(x):
    from attngen.reference import to_numpy
    return np.asarray(to_numpy(x), dtype=np.float64)


def _cache(rng, kv_dtype, dtype, shape):
    """(k, v, options) of a cache of `shape` (B, L, Hkv, D): quantized where kv_dtype says."""
    k, v = rng.standard_normal(shape) * 2, rng.standard_normal(shape)
    if kv_dtype is None:
        np_dtype = np.float16 if dtype == "f16" else np.float32
        return k.astype(np_dtype), v.astype(np_dtype), {}
    (k, ks), (v, vs) = attngen.quantize_kv(k, kv_dtype), attngen.quantize_kv(v, kv_dtype)
    return k, v, {"k_scale": ks, "v_scale": vs}


def _paged(k, v, opts, lens, page, rng):
    """The contiguous cache scattered over shuffled pages (junk in the pages nobody uses); i8 scales
    travel with their rows."""
    per = [max(1, -(-int(n) // page)) for n in lens]
    n_pages = sum(per) + 2
    order = rng.permutation(n_pages)
    table = np.zeros((len(lens), max(per)), np.int32)
    kp = np.zeros((n_pages, page) + k.shape[2:], k.dtype)
    vp = np.zeros((n_pages, page) + v.shape[2:], v.dtype)
    sc = {n: (np.ones((n_pages, page) + x.shape[2:], np.float32) if x.ndim == 4 else x) for n, x in opts.items()}
    at = 0
    for b, n in enumerate(per):
        table[b, :n] = order[at:at + n]
        for i, p in enumerate(order[at:at + n]):
            rows = slice(i * page, min((i + 1) * page, k.shape[1]))
            width = rows.stop - rows.start
            kp[p, :width], vp[p, :width] = k[b, rows], v[b, rows]
            for name, x in opts.items():
                if x.ndim == 4:
                    sc[name][p, :width] = x[b, rows]
        at += n
    return kp, vp, {**sc, "block_table": table}


# (storage, kv_dtype, mask and extras, Lq, Hq, Hkv, layout)
CASES = [
    ("f16", None, "mask none", 1, 8, 2, "contiguous"),
    ("f16", None, "mask causal(bottom_right)", 13, 8, 2, "paged"),
    ("f32", None, "mask window(left=50)\n softcap 20.0", 1, 7, 1, "contiguous"),
    ("f16 packed", None, "mask causal(bottom_right)", 5, 12, 4, "paged"),
    ("f16", "i8", "mask none", 1, 6, 2, "contiguous"),
    ("f16", "i8", "mask causal(bottom_right)", 4, 8, 2, "paged"),
    ("f16", "e4m3", "mask window(left=300, right=2)", 3, 4, 4, "contiguous"),
    ("f32", "e5m2", "mask none\n softcap 30.0", 1, 8, 2, "paged"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(x).split("\n")[0].replace(" ", "") for x in c))
def test_the_decode_kernel_matches_the_reference(case):
    require("wgsl")
    storage, kv_dtype, extra, lq, hq, hkv, layout = case
    dtype = storage.split()[0]
    body = f"head_dim 64\n dtype {dtype}\n {extra}\n schedule split_kv(3)"
    body += f"\n kv_dtype {kv_dtype}" if kv_dtype else ""
    body += "\n kv_cache paged(page=16)" if layout == "paged" else ""
    spec = spec_of(body + ("\n target wgsl { decode=on f16=packed }" if storage == "f16 packed" else "\n " + DECODE))
    kernel = kernel_for(spec, "wgsl")
    assert kernel.plan.config.decode is not None, kernel.plan.summary()
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    q = rng.standard_normal((len(LENS), lq, hq, 64)).astype(np.float16 if dtype == "f16" else np.float32)
    k, v, opts = _cache(rng, kv_dtype, dtype, (len(LENS), int(LENS.max()), hkv, 64))
    if layout == "paged":
        k, v, opts = _paged(k, v, opts, LENS, 16, rng)
    opts["kv_lens"] = LENS
    out, lse = kernel(q, k, v, return_lse=True, **opts)
    ref, ref_lse = reference(spec, q, k, v, return_lse=True, **opts)
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    assert relative_error(out, ref) <= tolerance(spec)
    empty = np.isneginf(ref_lse)
    assert empty.any() and np.array_equal(np.isneginf(lse), empty), "rows that see no key: lse -inf exactly"
    assert np.all(out[np.transpose(empty, (0, 2, 1))] == 0), "rows that see no key: out 0"
    assert np.abs(lse[~empty] - ref_lse[~empty]).max() <= 1e-3 * max(1.0, np.abs(ref_lse[~empty]).max())


@pytest.mark.parametrize("splits", ["split_kv(1)", "split_kv(auto)", "split_kv(7)"])
def test_packed_sequences_and_split_counts(splits):
    """cu_seqlens (packed queries and keys), GQA 4, causal with Lq > 1 per sequence."""
    require("wgsl")
    spec = _spec(f"head_dim 32\n dtype f16\n mask causal(bottom_right)\n schedule {splits}")
    rng = np.random.default_rng(5)
    cq, ck = np.array([0, 1, 4, 4, 9], np.int32), np.array([0, 30, 31, 40, 240], np.int32)
    q = rng.standard_normal((int(cq[-1]), 8, 32)).astype(np.float16)
    k = rng.standard_normal((int(ck[-1]), 2, 32)).astype(np.float16)
    v = rng.standard_normal((int(ck[-1]), 2, 32)).astype(np.float16)
    out, lse = kernel_for(spec, "wgsl")(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, return_lse=True)
    ref, ref_lse = reference(spec, q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, return_lse=True)
    assert relative_error(out, ref) <= tolerance(spec)
    fin = np.isfinite(ref_lse)
    assert np.array_equal(fin, np.isfinite(lse)) and np.abs(lse[fin] - ref_lse[fin]).max() <= 1e-3


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("dtype", ["f16", "f32"])
def test_appends_land_in_the_cache_and_are_attended_to(paged, dtype):
    """k_new / v_new: read from kv_new by every workgroup, copied into the cache (16-byte items, bit
    for bit) by the first of each (sequence, KV head); nothing else of the cache changes."""
    require("wgsl")
    from test_variants import _append_reference, paged_cache
    cache = "paged(page=8)" if paged else "contiguous"
    spec = _spec(f"head_dim 32\n dtype {dtype}\n mask causal(bottom_right)\n schedule split_kv(2)\n kv_cache {cache}")
    np_dtype = np.float16 if dtype == "f16" else np.float32
    rng = np.random.default_rng(8)
    lens, lnew = np.array([0, 13, 30], np.int32), 3
    if paged:
        k, v, table, _ = paged_cache(rng, lens + lnew, 8, 4, 32, 32)
        table = np.minimum(table, len(k) - 1)
    else:
        k, v, table = rng.standard_normal((3, 40, 4, 32)), rng.standard_normal((3, 40, 4, 32)), None
    k, v = k.astype(np_dtype), v.astype(np_dtype)
    k_new, v_new = (rng.standard_normal((3, lnew, 4, 32)).astype(np_dtype) for _ in "kv")
    q = rng.standard_normal((3, lnew, 8, 32)).astype(np_dtype)
    k_after, v_after = _append_reference(k, v, k_new, v_new, lens, table)
    extra = {"block_table": table} if paged else {}
    out = kernel_for(spec, "wgsl")(q, k, v, kv_lens=lens, k_new=k_new, v_new=v_new, **extra)
    ref = reference(spec, q, k_after, v_after, kv_lens=lens + lnew, **extra)
    assert relative_error(out, ref) <= tolerance(spec)
    assert np.array_equal(k, k_after) and np.array_equal(v, v_after)


@pytest.mark.parametrize("mask", ["causal", "window(left=9, right=3)"])
def test_planted_keys_reach_only_the_rows_that_see_them(mask):
    """inf / NaN in K and V at keys some rows see and others do not (masked, outside the window)."""
    require("wgsl")
    rng = np.random.default_rng(11)
    b, lq, lk, hq, hkv, d = 2, 57, 83, 4, 2, 32
    spec = _spec(f"head_dim {d}\n dtype f16\n mask {mask}\n schedule split_kv(3)")
    q = rng.standard_normal((b, lq, hq, d)).astype(np.float32)
    k, v = _plant(rng.standard_normal((b, lk, hkv, d)).astype(np.float32),
                  rng.standard_normal((b, lk, hkv, d)).astype(np.float32), [lq // 2, lq // 2 + 1, lk - 1, 2, lk - 20])
    out, lse = kernel_for(spec, "wgsl")(q.astype(np.float16), k.astype(np.float16), v.astype(np.float16),
                                       return_lse=True)
    with np.errstate(invalid="ignore", over="ignore"):
        ref, ref_lse = reference(spec, q, k, v, return_lse=True)
    _compare(spec, _np(out), _np(lse), ref, ref_lse)


@pytest.mark.parametrize("kv_dtype", [None, "e4m3", "e5m2"])
def test_keys_past_kv_lens_and_in_unused_pages_add_nothing(kv_dtype):
    """Cache rows past each sequence's keys (and a page no sequence uses) hold inf / NaN (FP8: their
    NaN and inf bytes)."""
    require("wgsl")
    rng = np.random.default_rng(12)
    lens, page = np.array([0, 37, 70], np.int32), 16
    body = "head_dim 32\n dtype f16\n mask causal(bottom_right)\n schedule split_kv(3)\n kv_cache paged(page=16)"
    spec = _spec(body + (f"\n kv_dtype {kv_dtype}" if kv_dtype else ""))
    q = rng.standard_normal((3, 5, 4, 32)).astype(np.float16)
    k, v, opts = _cache(rng, kv_dtype, "f16", (3, 80, 2, 32))
    k, v, opts = _paged(k, v, opts, np.array([80, 80, 80]), page, rng)
    bad_k, bad_v = (np.float16(np.nan), np.float16(np.inf)) if kv_dtype is None else (0x7F, 0x7F if kv_dtype == "e4m3" else 0x7C)
    for b, n in enumerate(lens):
        for j in range(int(n), 80):
            p = opts["block_table"][b, j // page]
            k[p, j % page], v[p, j % page] = bad_k, bad_v
    out, lse = kernel_for(spec, "wgsl")(q, k, v, kv_lens=lens, return_lse=True, **opts)
    ref, ref_lse = reference(spec, q, k, v, kv_lens=lens, return_lse=True, **opts)
    assert np.isfinite(out).all() and not np.isnan(lse).any()
    assert relative_error(out, ref) <= tolerance(spec)
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse))


@pytest.mark.parametrize("mask", ["none", "causal(bottom_right)"])
@pytest.mark.parametrize("dtype", ["f16", "f32"])
def test_a_visible_key_whose_weight_underflows_adds_nothing_whatever_its_v(dtype, mask):
    require("wgsl")
    spec = _spec(f"head_dim 32\n heads q=3 kv=1\n dtype {dtype}\n mask {mask}\n schedule split_kv(3)")
    _check_weight_zero_key(spec, "wgsl", 2, 7, 70, 3, 1)


def test_a_nan_query_row_gives_nan_and_only_there():
    require("wgsl")
    rng = np.random.default_rng(13)
    spec = _spec("head_dim 32\n dtype f32\n mask causal(bottom_right)\n schedule split_kv(2)")
    q = rng.standard_normal((1, 9, 2, 32)).astype(np.float32)
    k, v = (rng.standard_normal((1, 90, 1, 32)).astype(np.float32) for _ in "kv")
    q[0, 4, 1, 7] = np.nan
    out, lse = kernel_for(spec, "wgsl")(q, k, v, return_lse=True)
    assert np.isnan(out[0, 4, 1]).all() and np.isnan(lse[0, 1, 4])
    ok = np.ones(out.shape[:3], bool)
    ok[0, 4, 1] = False
    ref = reference(spec, np.where(np.isnan(q), 0, q), k, v)
    assert np.isfinite(out[ok]).all() and relative_error(out[ok], ref[ok]) <= tolerance(spec)


@pytest.mark.parametrize("kv_dtype", ["e4m3", "e5m2", "i8"])
def test_every_byte_decodes_as_the_reference_decodes_it(kv_dtype):
    """One key of weight 1: out is V's row, each of the 256 bytes once (16 of them per 16-byte item,
    decoded four at a time); NaN bytes give NaN, e5m2's infinities inf, subnormals exact."""
    require("wgsl")
    spec = _spec(f"head_dim 256\n dtype f32\n schedule split_kv(2)\n kv_dtype {kv_dtype}")
    codes = np.arange(256, dtype=np.uint8).view(np.int8 if kv_dtype == "i8" else np.uint8)
    v = codes.reshape(1, 1, 1, 256)
    k = np.zeros_like(v)
    scale = np.ones((1, 1, 1, 256 // I8_BLOCK) if kv_dtype == "i8" else (1, 1), np.float32)
    q = np.ones((1, 1, 1, 256), np.float32)
    out = kernel_for(spec, "wgsl")(q, k, v, k_scale=scale, v_scale=scale)
    want = codes.astype(np.float64) if kv_dtype == "i8" else decode_fp8(codes, kv_dtype)
    assert np.array_equal(out.reshape(-1), want.astype(np.float32), equal_nan=True)


@pytest.mark.parametrize("decode", ["on", "off"])
@pytest.mark.parametrize("kv_dtype", [None, "i8", "e4m3"])
def test_resident_caches_give_the_host_caches_results(kv_dtype, decode):
    """k, v (a quantized cache's uint8 / int8 bytes too) and the scales as WgslTensors that stay on
    the GPU across calls: the same bits out as numpy caches, with either kernel."""
    require("wgsl")
    from attngen.backends.wgsl import WgslTensor
    body = "head_dim 64\n dtype f16\n schedule split_kv(3)\n kv_cache paged(page=16)"
    spec = _spec(body + (f"\n kv_dtype {kv_dtype}" if kv_dtype else ""), decode)
    kernel = kernel_for(spec, "wgsl")
    rng = np.random.default_rng(21)
    lens = np.array([5, 70], np.int32)
    q = rng.standard_normal((2, 1, 4, 64)).astype(np.float16)
    k, v, opts = _cache(rng, kv_dtype, "f16", (2, 70, 2, 64))
    k, v, opts = _paged(k, v, opts, lens, 16, rng)
    host = kernel(q, k, v, kv_lens=lens, **opts)
    dev = {n: WgslTensor.from_numpy(x) if n.endswith("scale") else x for n, x in opts.items()}
    resident = kernel(WgslTensor.from_numpy(q), WgslTensor.from_numpy(k), WgslTensor.from_numpy(v), kv_lens=lens, **dev)
    assert isinstance(resident, WgslTensor) and np.array_equal(resident.numpy(), host)
    assert relative_error(host, reference(spec, q, k, v, kv_lens=lens, **opts)) <= tolerance(spec)


def test_resident_scales_are_checked_for_shape_and_dtype():
    require("wgsl")
    from attngen.backends.wgsl import WgslTensor
    spec = _spec("head_dim 64\n dtype f16\n schedule split_kv(2)\n kv_dtype i8")
    rng = np.random.default_rng(2)
    q = rng.standard_normal((2, 1, 4, 64)).astype(np.float16)
    k, v, opts = _cache(rng, "i8", "f16", (2, 9, 2, 64))
    for bad, message in ((WgslTensor.from_numpy(opts["k_scale"][:1].copy()), "k_scale has shape (1, 9, 2, 2)"),
                         (WgslTensor.from_numpy(opts["k_scale"].astype(np.float16)), "k_scale has dtype f16")):
        with pytest.raises(attngen.LaunchError, match=re.escape(message)):
            kernel_for(spec, "wgsl")(q, WgslTensor.from_numpy(k), v, k_scale=bad, v_scale=opts["v_scale"])


# ---- the plan: which specs, which refusals, what the source holds -------------------------------

@pytest.mark.parametrize("body, why", [
    ("schedule two_pass", "schedule two_pass: the decode kernel is a split_kv kernel"),
    ("schedule fused", "schedule fused: the decode kernel is a split_kv kernel"),
    ("schedule split_kv(2)\n mask custom", "mask custom: the decode kernel takes masks none, causal and window"),
    ("schedule split_kv(2)\n accumulate qk=f16 pv=f32", "f16 accumulators"),
    ("schedule split_kv(2)\n tile q=16 kv=16", "`tile` and prefetch=on shape the register-tiled kernel"),
])
def test_decode_on_is_refused_where_it_does_not_apply(body, why):
    spec = spec_of(f"head_dim 64\n dtype f16\n {body}\n " + DECODE)
    with pytest.raises(attngen.SpecError) as e:
        attngen.lower(spec, "wgsl", "wgpu-vulkan-nvidia")
    assert "target wgsl (profile wgpu-vulkan-nvidia)" in str(e.value) and f"decode=on: {why}" in str(e.value)
    auto = spec_of(f"head_dim 64\n dtype f16\n {body}")  # auto: the register-tiled kernel, no error
    assert attngen.lower(auto, "wgsl", "wgpu-vulkan-nvidia").config.decode is None


def test_subgroups_off_and_auto_choices():
    spec = spec_of("head_dim 64\n dtype f16\n schedule split_kv(2)\n target wgsl { decode=on subgroups=off }")
    with pytest.raises(attngen.SpecError, match="decode=on: it sums a key's dot products over subgroup shuffles"):
        attngen.lower(spec, "wgsl", "wgpu-vulkan-nvidia")
    # auto follows the profile's [dialect] decode_kernel; webgpu-core takes decode=on (subgroups on request)
    plain = spec_of("head_dim 64\n dtype f16\n schedule split_kv(2)")
    for profile in ("webgpu-core", "wgpu-vulkan-nvidia", "wgpu-software"):
        want = bool(get_backend("wgsl").profile(profile).section("dialect").get("decode_kernel", False))
        assert (attngen.lower(plain, "wgsl", profile).config.decode is not None) == want
    plan = attngen.lower(_spec("head_dim 64\n dtype f16\n schedule split_kv(2)"), "wgsl", "webgpu-core")
    assert plan.config.decode.team == 4 and "subgroups" in plan.features


@pytest.mark.parametrize("body, team, rows", [
    ("head_dim 128\n heads q=32 kv=8\n dtype f16\n kv_dtype i8", 8, 4),   # one 16-byte item per invocation
    ("head_dim 128\n heads q=32 kv=8\n dtype f16", 16, 4),
    ("head_dim 128\n heads q=64 kv=8\n dtype f16", 16, 8),                # GQA 8: one workgroup per group
    ("head_dim 128\n heads q=64 kv=8\n dtype f16\n kv_dtype e4m3", 8, 4),  # its registers: two blocks of 4
    ("head_dim 64\n heads q=28 kv=4\n dtype f32", 16, 7),                 # GQA 7 in one block
])
def test_the_shape_on_the_h100_profile(body, team, rows):
    plan = attngen.lower(_spec(body + "\n schedule split_kv(auto)"), "wgsl", "wgpu-vulkan-nvidia")
    d = plan.config.decode
    assert (d.team, d.rows, d.subgroup, d.workgroup) == (team, rows, 32, 128)
    assert plan.tile_q == rows and plan.tile_kv == d.step and plan.smem_bytes <= 4096
    assert max(sum(p.kind == "tensor" for p in ps) for ps in [plan.params] + [e.params for e in plan.entries]) <= 8


@pytest.mark.parametrize("profile", ["wgpu-vulkan-nvidia", "webgpu-core"])
@pytest.mark.parametrize("kv_dtype", [None, "i8", "e5m2"])
def test_the_main_loop_touches_no_workgroup_memory(kv_dtype, profile):
    """Between the main loop's start and the epilogue: no barrier, no workgroup array, 16-byte loads of
    k and v (the unrolled source on the H100's profile as well)."""
    body = "head_dim 128\n heads q=32 kv=8\n dtype f16\n schedule split_kv(auto)\n kv_cache paged(page=16)"
    spec = _spec(body + (f"\n kv_dtype {kv_dtype}" if kv_dtype else ""))
    out = attngen.emit(spec, target="wgsl", profile=profile)
    loop = out.source.split("// ---- section: main loop over key steps ----")[1].split("// ---- section: epilogue")[0]
    assert "workgroupBarrier" not in loop and not re.search(r"\bs(M|O|Bad)\[", loop)
    assert "var<storage, read_write> k: array<vec4<u32>>;" in out.source
    assert re.search(r"kw\[u?\d*u?\]\[c?\d*u?\] = k\[", loop.replace(" ", "")) or "kw[u][c] = k[" in loop
    m = out.manifest
    assert m["decode"]["team"] == out.plan.config.decode.team
    names = {b["name"] for b in m["bindings"]}
    assert ({"k_scale", "v_scale"} <= names) == (kv_dtype is not None) and "kv_scale" not in names


def test_i8_by_unpack4xi8_decodes_every_byte_too():
    """The tile table's decode_i8_unpack (a variant the probe times): WGSL's unpack4xI8 instead of the
    integer decode, the same values."""
    require("wgsl")
    from attngen.backends.wgsl import adapter_profile
    spec = _spec("head_dim 256\n dtype f32\n schedule split_kv(2)\n kv_dtype i8")
    kernel = attngen.compile(spec, target="wgsl", profile=adapter_profile().with_overrides(decode_i8_unpack=True))
    assert "unpack4xI8(w)" in kernel.source
    codes = np.arange(256, dtype=np.uint8).view(np.int8)
    v, scale = codes.reshape(1, 1, 1, 256), np.ones((1, 1, 1, 256 // I8_BLOCK), np.float32)
    out = kernel(np.ones((1, 1, 1, 256), np.float32), np.zeros_like(v), v, k_scale=scale, v_scale=scale)
    assert np.array_equal(out.reshape(-1), codes.astype(np.float32))


def test_byte_tensors_are_only_a_quantized_caches():
    """A WgslTensor of uint8 / int8 is a quantized cache's bytes: as k of an f16 cache, or as q, it is
    refused by the dtype checks every call makes."""
    require("wgsl")
    from attngen.backends.wgsl import WgslTensor
    rng = np.random.default_rng(4)
    q = rng.standard_normal((1, 1, 2, 64)).astype(np.float16)
    k = rng.standard_normal((1, 5, 1, 64)).astype(np.float16)
    byte_k = WgslTensor.from_numpy(np.zeros((1, 5, 1, 64), np.int8))
    with pytest.raises(attngen.LaunchError, match="k has dtype int8, but kernel"):
        kernel_for(_spec("head_dim 64\n dtype f16\n schedule split_kv(2)"), "wgsl")(q, byte_k, k)
    spec = _spec("head_dim 64\n dtype f16\n schedule split_kv(2)\n kv_dtype i8")
    _, _, opts = _cache(rng, "i8", "f16", (1, 5, 1, 64))
    with pytest.raises(attngen.LaunchError, match="q has dtype int8"):
        kernel_for(spec, "wgsl")(WgslTensor.from_numpy(np.zeros((1, 1, 2, 64), np.int8)), byte_k, byte_k, **opts)
