"""Quantized KV caches on target cuda (issue 44, `kv_dtype e4m3 | e5m2 | i8`) run on the CPU (no
GPU): the generated sources of the mma.sync family (f16 / bf16) and of CUDA cores (f32) compiled
with g++ behind tests/cuda_emulation.py's shim (run_forward), against the float64 reference fed the
same stored bytes and scales. So the fragment orders (kvquant.py's column groups, acc_col), the
decoders (e4m3 by its sm_80 bit pattern path: g++ has no __CUDA_ARCH__), the scales, paged gathers,
the split schedules' combines and the fused append's bytes are checked wherever the suite runs;
tests/equivalence/test_cuda_kv_quant.py runs the same kernels on a GPU (and the sm_89+ e4m3
conversions). Slow (an OS thread per CUDA thread): few small cases."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import attngen
from attngen.api import lower
from attngen.reference import reference, relative_error, tolerance
from attngen.runtime.kvquant import I8_BLOCK, append_kv, decode_fp8

from conftest import paged_caches, spec_of
from cuda_emulation import run_forward

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to compile the emulation")

D = 64
PAGE = 16


def _spec(kv_dtype, schedule, paged, dtype="f16", d=D):
    cache = f"\n kv_cache paged(page={PAGE})" if paged else ""
    return spec_of(f"head_dim {d}\n dtype {dtype}\n schedule {schedule}{cache}\n kv_dtype {kv_dtype}")


def _words(x, dtype):
    """float32 -> (what the emulated kernel reads: f16 / bf16 words or f32, the values)."""
    x = np.asarray(x, np.float32)
    if dtype == "f16":
        h = x.astype(np.float16)
        return h.view(np.uint16), h.astype(np.float32)
    if dtype == "bf16":
        u = x.view(np.uint32)
        bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        return bits, (bits.astype(np.uint32) << 16).view(np.float32)
    return x, x


def _values(words, dtype):
    if dtype == "f16":
        return words.view(np.float16).astype(np.float64)
    if dtype == "bf16":
        return (words.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return words.astype(np.float64)



def _check(spec, tmp_path, hq, hkv, lens, lq=1, seed=0, append=0, kv_lens=True, defer_copies=False):
    """The emulated kernel's out and lse against the reference; with `append` rows, the cache's bytes
    against runtime/kvquant.py's append_kv; kv_lens False: a call without it (every key of the
    cache: the fused schedule's main entry point); defer_copies: cp.async lands at its wait, not
    before (cuda_emulation.run_forward)."""
    plan = lower(spec, "cuda", "cuda-sm80")
    kv, dt, d, dv = spec.kv_dtype, spec.dtype, spec.head_dim_qk, spec.head_dim_v
    rng = np.random.default_rng(seed)
    lens = np.asarray(lens, np.int32)
    room = int(lens.max()) + append
    q_words, q = _words(rng.standard_normal((len(lens), lq, hq, d)), dt)
    caches = [attngen.quantize_kv(rng.standard_normal((len(lens), room, hkv, dim)) * s, kv) for s, dim in ((2, d), (1, dv))]
    kw = {"kv_lens": lens} if kv_lens else {}
    if spec.kv_cache.is_paged:
        caches, kw["block_table"] = paged_caches(caches, kv, lens + append, rng, PAGE)
    (k, ks), (v, vs) = caches
    new = {}
    if append:
        (kn_w, kn), (vn_w, vn) = (_words(rng.standard_normal((len(lens), append, hkv, dim)), dt) for dim in (d, dv))
        new = {"k_new": kn_w, "v_new": vn_w}
        before = [x.copy() for x in (k, v, ks, vs)]
        want = append_kv(kv, *before, kn, vn, lens, kw.get("block_table"))
    out, lse, errors = run_forward(plan, str(tmp_path), q_words, k, v, k_scale=ks, v_scale=vs,
                                   defer_copies=defer_copies, **kw, **new)
    assert not errors.any(), errors
    if append:
        for name, got, w in zip(("k", "v", "k_scale", "v_scale"), (k, v, ks, vs), want):
            assert np.array_equal(got, w), f"{name}: the append's bytes differ from append_kv's"
        ref, ref_lse = reference(spec, q, *before[:2], k_scale=before[2], v_scale=before[3], k_new=kn, v_new=vn,
                                 return_lse=True, **kw)
    else:
        ref, ref_lse = reference(spec, q, k, v, k_scale=ks, v_scale=vs, return_lse=True, **kw)
    got = _values(out, dt)
    err = relative_error(got, ref)
    assert err <= tolerance(spec), f"relative error {err:.3g}"
    assert np.abs(lse - ref_lse).max() <= 1e-3 * max(1.0, np.abs(ref_lse).max())


# (schedule, paged, kv_dtype): every schedule with every kv_dtype, and every pair of schedule and layout and of
# kv_dtype and layout, in 9 emulated runs (about a second of g++ each, one build per source per process;
# the suite's 15 minutes); every triple runs on the GPU (tests/equivalence/test_cuda_kv_quant.py)
COVER = [(s, paged, kv) for i, s in enumerate(["split_kv(2)", "two_pass", "fused"])
         for j, kv in enumerate(["e4m3", "e5m2", "i8"]) for paged in [(i + j) % 2 == 1]]


@pytest.mark.parametrize("schedule, paged, kv_dtype", COVER,
                         ids=[f"{s}-{'paged' if p else 'contiguous'}-{kv}" for s, p, kv in COVER])
def test_quantized_cache_matches_the_reference(kv_dtype, paged, schedule, tmp_path):
    """kv_dtype x layout x schedule (COVER), GQA groups 3 (1 query row, decode) and 1 (3 query rows),
    sequences of 1, 7 and 113 keys."""
    spec = _spec(kv_dtype, schedule, paged)
    _check(spec, tmp_path, 6, 2, [1, 7, 113])
    _check(spec, tmp_path, 2, 2, [7, 113], lq=3, seed=1)


@pytest.mark.parametrize("body", [
    "head_dim 128\n dtype f16\n schedule split_kv(2)\n kv_dtype e4m3",   # two 64-column groups, 16-tile V group
    "head_dim 256\n dtype f16\n schedule two_pass\n kv_dtype e5m2",      # 128-byte rows: four K groups, two V groups
    "head_dim 96\n dtype bf16\n schedule split_kv(2)\n kv_dtype i8",     # i8's 32-column groups; V 64 + 32
    "head_dim qk=80 v=48\n dtype f16\n schedule two_pass\n kv_dtype e5m2",  # groups 64 + 16; V 32 + 16
    "head_dim 64\n dtype f32\n schedule split_kv(2)\n kv_cache paged(page=16)\n kv_dtype e4m3",  # CUDA cores
    "head_dim 64\n dtype f32\n schedule two_pass\n kv_dtype i8",
    "head_dim 64\n dtype f16\n mask causal(bottom_right)\n softcap 20\n kv_dtype i8",
])
def test_head_dims_dtypes_and_masks(body, tmp_path):
    _check(spec_of(body), tmp_path, 3, 1, [7, 70], lq=2)


@pytest.mark.parametrize("kv_dtype", ["e4m3", "i8"])
def test_the_fused_main_entry_without_kv_lens(kv_dtype, tmp_path):
    """Without kv_lens the fused schedule takes its main entry point (namespace padded: two 16-row
    fragments per warp), the other instantiation of the same parts."""
    _check(_spec(kv_dtype, "fused", False), tmp_path, 4, 2, [70, 70], lq=37, kv_lens=False)


def test_q_read_from_shared_memory_per_tile(tmp_path):
    """Two fragments of head dim 96 do not stay in registers (q_in_registers): the A fragments are
    read from sQ per group of k16 steps, in the groups' column order."""
    spec = _spec("e5m2", "fused", False, d=96)
    assert not lower(spec, "cuda", "cuda-sm80").config.q_in_registers
    _check(spec, tmp_path, 2, 1, [50], lq=40, kv_lens=False)


def test_a_long_sequence(tmp_path):
    _check(_spec("e4m3", "split_kv(2)", True), tmp_path, 4, 1, [1023])


def test_128_byte_rows_paged_with_an_append(tmp_path):
    """Head dims multiples of 128: the byte tiles in 128-byte rows with permuted chunks (kvquant.chunk_key,
    tests/backends/cuda/test_kvquant_banks.py), written by the page copies, the gather and the append's
    quantizer, read by both products (i8: 32-column groups, 8-byte loads)."""
    spec = _spec("i8", "split_kv(2)", True, dtype="bf16", d=128)
    assert lower(spec, "cuda", "cuda-sm80").config.swizzle_kv
    _check(spec, tmp_path, 6, 2, [0, 5, 30], append=3)


@pytest.mark.parametrize("body, append", [
    ("head_dim 64\n dtype f16\n schedule split_kv(2)\n kv_cache paged(page=16)\n kv_dtype i8", 3),
    ("head_dim 128\n dtype f16\n schedule two_pass\n kv_dtype e4m3", 0),
    ("head_dim 128\n dtype f16\n schedule fused\n kv_dtype e5m2", 0),
], ids=["split_kv-paged-i8-append", "two_pass-e4m3-d128", "fused-e5m2-d128"])
def test_copies_land_at_their_wait(body, append, tmp_path):
    """cp.async landing only at the cp.async.wait_group that lets it (never when issued): a stage read
    before its copies were waited for reads the last tile's bytes (or NaN), and a copy never waited
    for is an error; the ring of stages, the scales' copies, a paged gather and the append's rows."""
    _check(spec_of(body), tmp_path, 6, 2, [0 if append else 1, 5, 70], append=append, defer_copies=True)


APPEND_COVER = [c for c in COVER if c[0] != "fused"]  # (each kv_dtype with each layout and each schedule)


@pytest.mark.parametrize("schedule, paged, kv_dtype", APPEND_COVER,
                         ids=[f"{s}-{'paged' if p else 'contiguous'}-{kv}" for s, p, kv in APPEND_COVER])
def test_the_fused_append_writes_the_bytes_quantize_rows_gives(kv_dtype, paged, schedule, tmp_path):
    """k_new / v_new quantized into the cache by the blocks of the first row tile, byte for byte
    runtime/kvquant.py's append_kv, and read quantized alike by every block in the same call."""
    _check(_spec(kv_dtype, schedule, paged), tmp_path, 6, 2, [0, 5, 30], append=3)


@pytest.mark.parametrize("kv_dtype", ["e4m3", "e5m2", "i8"])
def test_every_byte_decodes_as_the_reference_decodes_it(kv_dtype, tmp_path):
    """One key (weight 1): out is V's dequantized row, each finite byte once, in f32 (e4m3's 0x7e is
    448, its subnormals 2^-9 m); then one NaN or inf byte makes the row NaN (a row that sees a value
    of V that is not finite outputs NaN, on cuda as for f16 caches)."""
    spec = spec_of(f"head_dim 256\n dtype f32\n kv_dtype {kv_dtype}")
    plan = lower(spec, "cuda", "cuda-sm80")
    codes = np.arange(256, dtype=np.uint8).view(np.int8 if kv_dtype == "i8" else np.uint8)
    want = codes.astype(np.float64) if kv_dtype == "i8" else decode_fp8(codes, kv_dtype)
    finite = np.isfinite(want)
    v = np.where(finite, codes, 0).astype(codes.dtype).reshape(1, 1, 1, 256)
    k = np.zeros_like(v)
    scale = np.ones((1, 1, 1, 256 // I8_BLOCK) if kv_dtype == "i8" else (1, 1), np.float32)
    q = np.ones((1, 1, 1, 256), np.float32)
    out, _, errors = run_forward(plan, str(tmp_path), q, k, v, k_scale=scale, v_scale=scale.copy())
    assert np.array_equal(out.reshape(-1), np.where(finite, want, 0).astype(np.float32))
    if kv_dtype != "i8":
        v[..., 3] = np.flatnonzero(~finite)[0]
        out, _, _ = run_forward(plan, str(tmp_path), q, k, v, k_scale=scale, v_scale=scale.copy())
        assert np.isnan(out).all()


def test_bad_scales_on_the_device_are_reported(tmp_path):
    """A scale that is not finite and >= 0 reaches the kernels only from the device (the runtime
    checks host scales whole): they report it in error word 8 (the call's LaunchError names it)."""
    for kv_dtype, bad in (("e4m3", np.nan), ("i8", -1.0)):
        spec = _spec(kv_dtype, "split_kv(2)", False)
        plan = lower(spec, "cuda", "cuda-sm80")
        rng = np.random.default_rng(2)
        q, _ = _words(rng.standard_normal((2, 1, 4, D)), "f16")
        (k, ks), (v, vs) = [attngen.quantize_kv(rng.standard_normal((2, 9, 2, D)), kv_dtype) for _ in "kv"]
        ks[(1,) * ks.ndim] = bad
        _, _, errors = run_forward(plan, str(tmp_path), q, k, v, k_scale=ks, v_scale=vs)
        assert errors[8] == 2, errors  # sequence 1 (+ 1)


def test_a_nan_byte_in_v_reaches_only_the_rows_that_see_it(tmp_path):
    """e4m3 0x7f (NaN) in V at key L - 2 of sequence 0 (causal, bottom-right, 3 query rows: rows 1 and
    2 see it, row 0 does not) and at a key past kv_lens: the split_kv kernel's key warps zero it in
    shared memory and mark the rows that see it; they output NaN, the others the reference's."""
    spec = spec_of("head_dim 64\n dtype f16\n mask causal(bottom_right)\n schedule split_kv(2)\n kv_dtype e4m3")
    plan = lower(spec, "cuda", "cuda-sm80")
    rng = np.random.default_rng(9)
    lens = np.array([70, 40], np.int32)
    q_words, q = _words(rng.standard_normal((2, 3, 2, D)), "f16")
    (k, ks), (v, vs) = [attngen.quantize_kv(rng.standard_normal((2, 72, 2, D)), "e4m3") for _ in "kv"]
    v[0, 68, 1, 5] = 0x7F
    v[1, 50, 0, 0] = 0xFF  # past sequence 1's 40 keys
    out, _, errors = run_forward(plan, str(tmp_path), q_words, k, v, k_scale=ks, v_scale=vs, kv_lens=lens)
    ref = reference(spec, q, k, v, k_scale=ks, v_scale=vs, kv_lens=lens)
    got = _values(out, "f16")
    assert np.array_equal(np.isnan(got).any(axis=-1), np.isnan(ref).any(axis=-1))
    assert np.isnan(got[0, 1:, 1]).all() and np.isfinite(got[0, 0]).all() and np.isfinite(got[1]).all()
    clean = ~np.isnan(ref).any(axis=-1, keepdims=True)  # (the reference's row: NaN only in the NaN's column)
    assert relative_error(np.where(clean, got, 0), np.where(clean, ref, 0)) <= tolerance(spec)
