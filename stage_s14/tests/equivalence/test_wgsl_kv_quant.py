"""Quantized KV caches on wgsl (issue 44, `kv_dtype e4m3 | e5m2 | i8`): the kernels against the
float64 reference fed the same stored bytes and scales (exact dequantization in the oracle),
every kv_dtype x contiguous / paged x split_kv (the register-tiled and the decode kernel) / two_pass,
GQA groups 3 and 1, sequences of 1, 7, 113 and 1023 keys; every byte decoded as the reference decodes it; the checker's and the call's
refusals. (Quantizer bit patterns: tests/runtime/test_kvquant.py.)"""

from __future__ import annotations

import numpy as np
import pytest

import attngen
from attngen.reference import reference, relative_error, tolerance
from attngen.runtime.kvquant import I8_BLOCK, decode_fp8

from conftest import kernel_for, require, spec_of

KV_DTYPES = ["e4m3", "e5m2", "i8"]
LENS = np.array([1, 7, 113, 1023], np.int32)
D = 64
PAGE = 16


def _spec(kv_dtype, schedule, paged, dtype="f16"):
    """`schedule` may end in " decode": the decode kernel (target wgsl { decode=on }), else decode=off."""
    cache = f"\n kv_cache paged(page={PAGE})" if paged else ""
    schedule, _, decode = schedule.partition(" ")
    kernel = f"\n target wgsl {{ decode={'on' if decode else 'off'} }}" if schedule.startswith("split_kv") else ""
    return spec_of(f"head_dim {D}\n dtype {dtype}\n schedule {schedule}{cache}\n kv_dtype {kv_dtype}{kernel}")


def _paged(stored, scale, kv_dtype, lens, rng):
    """A contiguous quantized cache (B, L, H, D) scattered into shuffled pages, with random bytes in
    the pages no sequence uses; i8 scales travel with their rows (FP8 scales stay (B, Hkv))."""
    pages_per = [-(-int(n) // PAGE) for n in lens]
    n_pages = sum(pages_per) + 2
    order = rng.permutation(n_pages)
    table = np.zeros((len(lens), max(pages_per)), np.int32)
    kp = rng.integers(0, 256, (n_pages, PAGE) + stored.shape[2:], dtype=np.uint8).view(stored.dtype)
    sp = np.ones((n_pages, PAGE) + scale.shape[2:], np.float32) if kv_dtype == "i8" else scale
    at = 0
    for b, n in enumerate(pages_per):
        table[b, :n] = order[at:at + n]
        for i, p in enumerate(order[at:at + n]):
            rows = slice(i * PAGE, min((i + 1) * PAGE, stored.shape[1]))
            width = rows.stop - rows.start
            kp[p, :width] = stored[b, rows]
            if kv_dtype == "i8":
                sp[p, :width] = scale[b, rows]
        at += n
    return kp, sp, table


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("schedule", ["split_kv(4)", "split_kv(4) decode", "two_pass"])
def test_quantized_cache_matches_the_reference(kv_dtype, paged, schedule):
    require("wgsl")
    spec = _spec(kv_dtype, schedule, paged)
    kernel = kernel_for(spec, "wgsl")
    rng = np.random.default_rng(44)
    for hq, hkv in ((6, 2), (2, 2)):  # GQA groups 3 and 1 (heads any: one kernel)
        q = rng.standard_normal((len(LENS), 1, hq, D)).astype(np.float16)
        k32 = rng.standard_normal((len(LENS), int(LENS.max()), hkv, D)) * 2
        v32 = rng.standard_normal((len(LENS), int(LENS.max()), hkv, D))
        (k, ks), (v, vs) = attngen.quantize_kv(k32, kv_dtype), attngen.quantize_kv(v32, kv_dtype)
        kw = {"kv_lens": LENS}
        if paged:
            k, ks, table = _paged(k, ks, kv_dtype, LENS, rng)
            v, vs = _same_pages(v, vs, kv_dtype, table, k.shape[0])
            kw["block_table"] = table
        out, lse = kernel(q, k, v, k_scale=ks, v_scale=vs, return_lse=True, **kw)
        ref, ref_lse = reference(spec, q, k, v, k_scale=ks, v_scale=vs, return_lse=True, **kw)
        err = relative_error(out, ref)
        assert err <= tolerance(spec), f"{kv_dtype} groups {hq // hkv}: relative error {err:.3g}"
        assert np.abs(lse - ref_lse).max() <= 1e-3 * np.abs(ref_lse).max()


def _same_pages(stored, scale, kv_dtype, table, n_pages, lens=LENS):
    """v's quantized rows in the pages `table` gives k's (the pages no sequence uses: zeros)."""
    vp = np.zeros((n_pages, PAGE) + stored.shape[2:], stored.dtype)
    sp = np.zeros((n_pages, PAGE) + scale.shape[2:], np.float32) if kv_dtype == "i8" else scale
    for b in range(table.shape[0]):
        for i in range(-(-int(lens[b]) // PAGE)):
            rows = slice(i * PAGE, min((i + 1) * PAGE, stored.shape[1]))
            vp[table[b, i], : rows.stop - rows.start] = stored[b, rows]
            if kv_dtype == "i8":
                sp[table[b, i], : rows.stop - rows.start] = scale[b, rows]
    return vp, sp


def test_the_fused_schedule_at_a_few_query_rows_with_an_f32_spec():
    require("wgsl")
    spec = _spec("e5m2", "fused", False, "f32")
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 4, 4, D)).astype(np.float32)
    (k, ks), (v, vs) = [attngen.quantize_kv(rng.standard_normal((2, 70, 2, D)), "e5m2") for _ in "kv"]
    out = kernel_for(spec, "wgsl")(q, k, v, k_scale=ks, v_scale=vs)
    ref = reference(spec, q, k, v, k_scale=ks, v_scale=vs)
    assert relative_error(out, ref) <= tolerance(spec)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_every_byte_decodes_as_the_reference_decodes_it(kv_dtype):
    """One key (weight 1): out is V's dequantized row, each of the 256 bytes once, in f32; NaN
    bytes give NaN, e5m2's infinities inf, e4m3's 0x7e 448."""
    require("wgsl")
    spec = spec_of(f"head_dim 256\n dtype f32\n kv_dtype {kv_dtype}")
    codes = np.arange(256, dtype=np.uint8).view(np.int8 if kv_dtype == "i8" else np.uint8)
    v = codes.reshape(1, 1, 1, 256)
    k = np.zeros_like(v)
    scale = np.ones((1, 1, 256 // I8_BLOCK) if kv_dtype == "i8" else (1, 1), np.float32)
    if kv_dtype == "i8":
        scale = scale.reshape(1, 1, 1, -1)
    q = np.ones((1, 1, 1, 256), np.float32)
    out = kernel_for(spec, "wgsl")(q, k, v, k_scale=scale, v_scale=scale)
    want = codes.astype(np.float64) if kv_dtype == "i8" else decode_fp8(codes, kv_dtype)
    assert np.array_equal(out.reshape(-1), want.astype(np.float32), equal_nan=True)


# ---- refusals -------------------------------------------------------------------------------------

@pytest.mark.parametrize("body, message", [
    ("head_dim 64\n dtype f16\n accumulate qk=f16\n kv_dtype e4m3", "accumulates a quantized cache's products in f32"),
    ("head_dim 40\n dtype f16\n kv_dtype e5m2", "so its head dims are multiples of 16"),
    ("head_dim 64\n dtype f16\n tile d=32\n kv_dtype i8", "kv_dtype i8 with tile d=32"),
    ("head_dim 512\n dtype bf16\n schedule split_kv(auto)\n kv_dtype e4m3", "head dims above 256"),
])
def test_target_cuda_refuses_what_it_does_not_build_naming_the_target_and_the_reason(body, message):
    """Target cuda builds quantized caches (tests/equivalence/test_cuda_kv_quant.py); what it leaves
    out is refused by the checker with the target and the reason."""
    with pytest.raises(attngen.SpecError) as e:
        attngen.lower(spec_of(body), "cuda", "cuda-sm90")
    assert "target cuda (profile cuda-sm90)" in str(e.value) and message in str(e.value)
    attngen.lower(_spec("i8", "split_kv(4)", True), "cuda", "cuda-sm90")  # (the rest is built)


def test_the_checker_counts_the_scale_binding_against_the_profile():
    spec = spec_of("head_dim 64\n dtype f16\n mask custom\n schedule split_kv(4)\n kv_dtype e4m3")
    with pytest.raises(attngen.SpecError) as e:
        attngen.lower(spec, "wgsl", "webgpu-core")
    assert "target wgsl (profile webgpu-core)" in str(e.value)
    assert "kv_scale binding needs 9 storage buffers; profile webgpu-core allows 8" in str(e.value)
    for schedule in ("fused", "split_kv(4)", "two_pass"):  # without: 8 at most in every entry point
        plan = attngen.lower(_spec("e4m3", schedule, True), "wgsl", "webgpu-core")
        assert max(sum(p.kind == "tensor" for p in ps) for ps in [plan.params] + [e.params for e in plan.entries]) <= 8


def test_the_language_refuses_i8_head_dims_off_its_blocks_and_unknown_names():
    with pytest.raises(attngen.SpecError, match="kv_dtype i8 needs head dims that are multiples of 32"):
        spec_of("head_dim 48\n dtype f16\n kv_dtype i8")
    with pytest.raises(attngen.SpecError, match="did you mean 'i8'"):
        spec_of("head_dim 64\n dtype f16\n kv_dtype int8")
    spec = spec_of("head_dim 64\n dtype f16\n kv_dtype e4m3")
    assert "kv_dtype   e4m3" in attngen.format_spec(spec) and attngen.parse(attngen.format_spec(spec)) == [spec]
    assert "kv_dtype" not in attngen.format_spec(spec_of("head_dim 64\n dtype f16"))


def _call_args(kv_dtype="i8"):
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 1, 4, D)).astype(np.float16)
    (k, ks), (v, vs) = [attngen.quantize_kv(rng.standard_normal((2, 9, 2, D)), kv_dtype) for _ in "kv"]
    return q, k, v, ks, vs


@pytest.mark.parametrize("how, message", [
    ("missing", "stores K and V as i8: pass k_scale= and v_scale="),
    ("shape", "k_scale has shape (2, 9, 2, 1), but kv_dtype i8 needs (2, 9, 2, 2)"),
    ("dtype", "k_scale has dtype float64, but scales are float32"),
    ("zero", "k_scale[0, 0, 0, 0] is 0, but the values it scales are not all 0"),
    ("inf", "k_scale[0, 0, 0, 0] is inf: inf"),
    ("nan", "k_scale[0, 0, 0, 0] is nan: NaN"),
    ("k dtype", "stores K and V as kv_dtype i8: numpy int8"),
    ("packed", "packed sequences (cu_seqlens_q=) are not built for a quantized cache yet (issue 44)"),
    ("append nan", "k_new holds inf or NaN, which kernel 't''s kv_dtype i8 cache cannot store"),
])
def test_bad_calls_are_launch_errors_naming_the_argument(how, message):
    require("wgsl")
    spec = _spec("i8", "split_kv(4)", False)
    kernel = kernel_for(spec, "wgsl")
    q, k, v, ks, vs = _call_args()
    kw = {"k_scale": ks, "v_scale": vs}
    if how == "missing":
        del kw["v_scale"], kw["k_scale"]
    elif how == "shape":
        kw["k_scale"] = ks[..., :1].copy()
    elif how == "dtype":
        kw["k_scale"] = ks.astype(np.float64)
    elif how in ("zero", "inf", "nan"):
        kw["k_scale"] = ks.copy()
        kw["k_scale"][0, 0, 0, 0] = {"zero": 0.0, "inf": np.inf, "nan": np.nan}[how]
    elif how == "k dtype":
        k = k.astype(np.float16)
    elif how == "packed":
        q, k, v = q[0], k.reshape(-1, *k.shape[2:]), v.reshape(-1, *v.shape[2:])
        kw.update(cu_seqlens_q=np.array([0, 1], np.int32), cu_seqlens_k=np.array([0, 9], np.int32))
    elif how == "append nan":
        new = np.ones((2, 1, 2, D), np.float16)
        new[1, 0, 1, 5] = np.nan
        kw.update(k_new=new, v_new=np.ones_like(new), kv_lens=np.array([3, 4], np.int32))
    runs = [lambda: kernel(q, k, v, **kw)]
    if how not in ("packed", "append nan"):  # (the reference's own messages name them alike, prefixed)
        runs.append(lambda: reference(spec, q, k, v, **kw))
    for run in runs:
        with pytest.raises(attngen.LaunchError) as e:
            run()
        assert message in str(e.value)


def test_a_scale_on_a_kernel_without_kv_dtype_is_refused():
    require("wgsl")
    spec = spec_of(f"head_dim {D}\n dtype f16")
    q, _, _, ks, _ = _call_args()
    k = np.zeros((2, 9, 2, D), np.float16)
    with pytest.raises(attngen.LaunchError, match="k_scale= needs a kernel built with `kv_dtype"):
        kernel_for(spec, "wgsl")(q, k, k, k_scale=ks)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_the_manifest_describes_the_packed_cache_and_its_scales(kv_dtype):
    """k and v as bytes in u32 words, kv_scale's two sections, params.scale_v's formula (what the
    runtime writes: k_scale's words), and the schema takes it."""
    import json
    import os
    from conftest import ROOT
    from attngen.plan.formulas import evaluate
    spec = _spec(kv_dtype, "two_pass", True)
    m = attngen.emit(spec, target="wgsl", profile="webgpu-core").manifest
    by_name = {b["name"]: b for b in m["bindings"]}
    assert by_name["k"]["dtype"] == kv_dtype and "4 per u32 word" in by_name["k"]["packing"]
    assert set(by_name["kv_scale"]["layout"]) == {"element", "k_scale", "v_scale"}
    scale_v = next(f for f in m["bindings"][0]["fields"] if f["name"] == "scale_v")
    ks = _call_args(kv_dtype)[3]
    assert evaluate(scale_v["value"], {"k_scale_words": ks.size}) == ks.size and "k_scale_words" in m["launch_symbols"]
    assert all(e["storage_buffers"] <= 8 for e in m["entry_points"])
    assert 14 in next(e for e in m["entry_points"] if e["role"] == "pv")["bindings"]  # pass 2 reads V
    jsonschema = pytest.importorskip("jsonschema")
    with open(os.path.join(ROOT, "docs", "manifest-wgsl.schema.json")) as f:
        schema = json.load(f)
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(json.loads(json.dumps(m))))
    assert not errors, errors[:3]


@pytest.mark.parametrize("cache", ["contiguous", "paged(page=16)"])
def test_attngen_run_quantizes_the_cache_it_makes_up(tmp_path, capsys, cache):
    require("wgsl")
    from attngen.cli import main
    path = tmp_path / "kvq.attn"
    path.write_text(f"attention r {{\n head_dim {D}\n heads q=4 kv=2\n dtype f16\n schedule two_pass\n"
                    f" kv_cache {cache}\n kv_dtype i8\n}}\n")
    assert main(["run", str(path), "--target", "wgsl", "--shape", "B=2,Lq=1,Lk=40", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "quantized to kv_dtype i8" in out and " ok" in out


def test_a_quantized_cache_has_no_backward():
    """kernel.backward of a kv_dtype kernel: the checker's refusal naming kv_dtype (a quantized cache
    is an inference cache), before anything is launched."""
    require("wgsl")
    spec = spec_of(f"head_dim {D}\n dtype f16\n kv_dtype i8")
    q, k, v, ks, vs = _call_args()
    kernel = kernel_for(spec, "wgsl")
    out, lse = kernel(q, k, v, k_scale=ks, v_scale=vs, return_lse=True)
    with pytest.raises((attngen.LaunchError, attngen.SpecError), match="kv_dtype i8: a quantized KV cache is an inference cache"):
        kernel.backward(q, k, v, out, lse, out, k_scale=ks, v_scale=vs)


# ---- the fused append (k_new / v_new quantized into the cache) ------------------------------------

@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("schedule", ["split_kv(4)", "split_kv(4) decode", "two_pass", "fused"])
def test_the_append_writes_the_bytes_quantize_rows_gives(kv_dtype, paged, schedule):
    """k_new / v_new appended to a quantized cache: every byte (and i8 scale) the call writes equals
    runtime/kvquant.py's append_kv (quantize_rows: the kernels' f32 arithmetic), the rows beside them
    are untouched, and the output is the reference's over the appended cache (the appended keys are
    read quantized alike in the same call). FP8 rows hold ties, saturation, infinities and NaN."""
    require("wgsl")
    from attngen.runtime.kvquant import append_kv
    spec = _spec(kv_dtype, schedule, paged)
    kernel = kernel_for(spec, "wgsl")
    rng = np.random.default_rng(7)
    lens = np.array([1, 7, 40], np.int32)
    (k, ks), (v, vs) = [attngen.quantize_kv(rng.standard_normal((3, 48, 2, D)), kv_dtype) for _ in "kv"]
    kw = {"kv_lens": lens}
    if paged:
        k, ks, table = _paged(k, ks, kv_dtype, lens + 3, rng)
        v, vs = _same_pages(v, vs, kv_dtype, table, k.shape[0], lens + 3)
        kw["block_table"] = table
    q = rng.standard_normal((3, 2, 6, D)).astype(np.float16)
    k_new = (rng.standard_normal((3, 3, 2, D)) * 4).astype(np.float16)
    v_new = rng.standard_normal((3, 3, 2, D)).astype(np.float16)
    if kv_dtype != "i8":  # past the largest value (saturated), infinities, NaN of both signs, -0
        k_new[0, 0, 0, :6] = [6e4, -6e4, np.inf, -np.inf, np.nan, -0.0]
        v_new[1, 2, 1, :2] = [np.nan, -np.nan]
        v_new[1, 2, 1, 2:] = 0  # (that row's NaN: the rows that see key 9 output NaN)
    before = [x.copy() for x in (k, v, ks, vs)]
    want = append_kv(kv_dtype, *before, k_new, v_new, lens, kw.get("block_table"))
    out = kernel(q, k, v, k_scale=ks, v_scale=vs, k_new=k_new, v_new=v_new, **kw)
    for name, got, w in zip(("k", "v", "k_scale", "v_scale"), (k, v, ks, vs), want):
        assert np.array_equal(got.view(np.uint8) if got.dtype != np.float32 else got, w.view(np.uint8)
                              if w.dtype != np.float32 else w, equal_nan=w.dtype == np.float32), name
    ref = reference(spec, q, *before[:2], k_scale=before[2], v_scale=before[3], k_new=k_new, v_new=v_new, **kw)
    seen = np.isfinite(ref)
    assert np.array_equal(np.isnan(out), np.isnan(ref))
    assert relative_error(np.where(seen, out, 0), np.where(seen, ref, 0)) <= tolerance(spec)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_many_appended_rows_are_byte_exact_on_any_adapter(kv_dtype):
    """64 rows x 2 heads of k_new / v_new over a wide range of magnitudes: every quotient the append
    takes is the IEEE one (quant_encode.j2's div_rn corrects an adapter's division, which WGSL lets be
    2.5 ulp off: SwiftShader's is), so every byte and i8 scale equals append_kv's."""
    require("wgsl")
    from attngen.runtime.kvquant import append_kv
    spec = _spec(kv_dtype, "fused", False)
    rng = np.random.default_rng(11)
    (k, ks), (v, vs) = [attngen.quantize_kv(rng.standard_normal((2, 80, 2, D)), kv_dtype) for _ in "kv"]
    lens = np.array([3, 16], np.int32)
    grow = np.exp(rng.uniform(-6, 6, (2, 64, 2, D)))  # magnitudes e^-6 .. e^6
    k_new = (rng.standard_normal((2, 64, 2, D)) * grow).astype(np.float16)
    v_new = (rng.standard_normal((2, 64, 2, D)) * grow[:, ::-1]).astype(np.float16)
    q = rng.standard_normal((2, 1, 4, D)).astype(np.float16)
    want = append_kv(kv_dtype, k, v, ks, vs, k_new, v_new, lens)
    kernel_for(spec, "wgsl")(q, k, v, k_scale=ks, v_scale=vs, k_new=k_new, v_new=v_new, kv_lens=lens)
    for name, got, w in zip(("k", "v", "k_scale", "v_scale"), (k, v, ks, vs), want):
        assert np.array_equal(got, w), f"{name}: {np.count_nonzero(got != w)} differ"


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("schedule", ["split_kv(4)", "split_kv(4) decode"])
def test_an_append_to_resident_tensors_writes_them_in_place(kv_dtype, schedule):
    """The cache and its scales as WgslTensors: the append writes the bytes (and i8 scales) append_kv
    gives into them, on the GPU: the register-tiled kernel copies the i8 scales back into the
    caller's tensors, the decode kernel binds them and writes them in place."""
    require("wgsl")
    from attngen.backends.wgsl import WgslTensor
    from attngen.runtime.kvquant import append_kv
    spec = _spec(kv_dtype, schedule, False)
    rng = np.random.default_rng(5)
    (k, ks), (v, vs) = [attngen.quantize_kv(rng.standard_normal((2, 40, 2, D)), kv_dtype) for _ in "kv"]
    lens = np.array([5, 30], np.int32)
    k_new = (rng.standard_normal((2, 4, 2, D)) * 3).astype(np.float16)
    v_new = rng.standard_normal((2, 4, 2, D)).astype(np.float16)
    q = rng.standard_normal((2, 1, 4, D)).astype(np.float16)
    want = append_kv(kv_dtype, k, v, ks, vs, k_new, v_new, lens)
    dev = [WgslTensor.from_numpy(x) for x in (k, v, ks, vs)]
    out = kernel_for(spec, "wgsl")(q, dev[0], dev[1], k_scale=dev[2], v_scale=dev[3], k_new=k_new, v_new=v_new,
                                   kv_lens=lens)
    for name, got, w in zip(("k", "v", "k_scale", "v_scale"), dev, want):
        assert np.array_equal(got.numpy(), w), name
    ref = reference(spec, q, k, v, k_scale=ks, v_scale=vs, k_new=k_new, v_new=v_new, kv_lens=lens)
    assert relative_error(out, ref) <= tolerance(spec)
