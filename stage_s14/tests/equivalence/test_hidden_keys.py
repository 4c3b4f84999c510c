"""Keys a row does not see contribute exactly nothing, whatever their values.

inf and NaN are planted in K and V at keys that some rows see and others do not (masked,
outside the window, beyond kv_len, in a dead tile). The rows that see a planted key may come
out non-finite (so does the float64 reference: NaN in, NaN out for that row); every other row
must match the reference within the dtype's tolerance, with no NaN. For every mask mode and
schedule, on both targets.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

import attngen
from attngen.reference import reference, relative_error, tolerance

from conftest import kernel_for, require, spec_of, to_device

TARGETS = ["cuda", "wgsl"]
SCHEDULES = ["fused", "split_kv(3)", "two_pass"]
MASKS = ["causal", "causal(bottom_right)", "window(left=9, right=3)", "custom bool", "custom additive"]


def _np(x):
    from attngen.reference import to_numpy
    return np.asarray(to_numpy(x), dtype=np.float64)


def _plant(k, v, keys):
    """inf / -inf / NaN at the given keys of K and V (all heads, all batches)."""
    k, v = k.copy(), v.copy()
    vals = [np.inf, np.nan, -np.inf]
    for n, j in enumerate(keys):
        k[:, j, :, n % k.shape[3]] = vals[n % 3]
        v[:, j, :, (3 * n) % v.shape[3]] = vals[(n + 1) % 3]
    return k, v


def _compare(spec, out, lse, ref, ref_lse):
    """Finite reference rows: within tolerance, no NaN; non-finite ones: not finite here."""
    rows_ref = np.isfinite(ref).all(axis=-1)  # (B, Lq, Hq)
    rows_out = np.isfinite(out).all(axis=-1)
    assert rows_ref.any(), "the case must leave rows that see no planted key"
    assert (~rows_ref).any(), "the case must have rows that see a planted key"
    assert rows_out[rows_ref].all(), "a row that sees no planted key came out non-finite"
    assert not rows_out[~rows_ref].any(), "a row that sees a planted key came out finite"
    err = relative_error(out[rows_ref], ref[rows_ref])
    assert err <= tolerance(spec), f"relative error {err:.3g} over the clean rows"
    clean = np.transpose(rows_ref, (0, 2, 1))  # (B, Hq, Lq)
    assert np.array_equal(np.isneginf(lse[clean]), np.isneginf(ref_lse[clean]))
    fin = clean & np.isfinite(ref_lse)
    assert np.abs(lse[fin] - ref_lse[fin]).max() <= 1e-2 * max(1.0, np.abs(ref_lse[fin]).max())


def _case(mask, lq, lk, rng):
    """(spec mask setting, call options for the kernel and the reference, keys to plant)."""
    if mask.startswith("custom"):
        m = np.tril(np.ones((lq, lk), bool), k=lk - lq)
        m[:, 5:9] = False  # keys no row sees, inside live tiles
        m[20:30, 40:50] = False
        if mask.endswith("additive"):
            m = np.where(m, rng.standard_normal((lq, lk)).astype(np.float32), -np.inf).astype(np.float32)
        return "custom", {"mask": m}, [6, 45, lk - 1, lk - 20]
    return mask, {}, [lq // 2, lq // 2 + 1, lk - 1, 2, lk - 20]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("mask", MASKS)
def test_planted_keys(mask, schedule, target):
    require(target)
    rng = np.random.default_rng(11)
    b, lq, lk, hq, hkv, d = 2, 57, 83, 4, 2, 32
    setting, opts, keys = _case(mask, lq, lk, rng)
    spec = spec_of(f"head_dim {d}\n dtype f16\n mask {setting}\n schedule {schedule}")
    q = rng.standard_normal((b, lq, hq, d)).astype(np.float32)
    k = rng.standard_normal((b, lk, hkv, d)).astype(np.float32)
    v = rng.standard_normal((b, lk, hkv, d)).astype(np.float32)
    k, v = _plant(k, v, keys)
    kernel = kernel_for(spec, target)
    dq, dk, dv = to_device(target, spec.dtype, q, k, v)
    call = dict(opts)
    if "mask" in call and target == "cuda":
        import cupy
        call["mask"] = cupy.asarray(call["mask"])
    out, lse = kernel(dq, dk, dv, return_lse=True, **call)
    with np.errstate(invalid="ignore", over="ignore"):
        ref, ref_lse = reference(spec, q, k, v, return_lse=True, **opts)
    _compare(spec, _np(out), _np(lse), ref, ref_lse)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_keys_past_kv_lens_and_in_unused_pages(schedule, target):
    """Cache rows at or past kv_lens[b] (padded and paged) hold inf / NaN: no row sees them."""
    require(target)
    rng = np.random.default_rng(12)
    b, lq, hq, hkv, d, page = 3, 5, 4, 2, 32, 16
    lens = np.array([0, 37, 70], np.int32)
    q = rng.standard_normal((b, lq, hq, d)).astype(np.float32)
    for paged in (False, True):
        spec = spec_of(f"head_dim {d}\n dtype f16\n mask causal(bottom_right)\n schedule {schedule}"
                       + ("\n kv_cache paged(page=16)" if paged else ""))
        if paged:
            pages = 16
            k = rng.standard_normal((pages, page, hkv, d)).astype(np.float32)
            v = rng.standard_normal((pages, page, hkv, d)).astype(np.float32)
            table = rng.permutation(pages)[: b * 5].reshape(b, 5).astype(np.int32)
            for bi in range(b):  # everything past the sequence's length: poison
                for j in range(int(lens[bi]), 5 * page):
                    k[table[bi, j // page], j % page] = np.nan
                    v[table[bi, j // page], j % page] = np.inf
            k[table[0, 0]] = np.inf  # a page of an empty sequence
            opts = {"kv_lens": lens, "block_table": table}
        else:
            k = rng.standard_normal((b, 80, hkv, d)).astype(np.float32)
            v = rng.standard_normal((b, 80, hkv, d)).astype(np.float32)
            for bi in range(b):
                k[bi, lens[bi]:] = np.nan
                v[bi, lens[bi]:] = -np.inf
            opts = {"kv_lens": lens}
        kernel = kernel_for(spec, target)
        dq, dk, dv = to_device(target, spec.dtype, q, k, v)
        call = {n: (_ints(target, x)) for n, x in opts.items()}
        out, lse = kernel(dq, dk, dv, return_lse=True, **call)
        ref, ref_lse = reference(spec, q, k, v, return_lse=True, **opts)
        out, lse = _np(out), _np(lse)
        assert np.isfinite(out).all() and not np.isnan(lse).any()
        assert relative_error(out, ref) <= tolerance(spec)
        assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse))


def _ints(target, a):
    a = np.asarray(a, np.int32)
    if target == "cuda":
        import cupy
        return cupy.asarray(a)
    return a


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_nan_query_row_gives_nan(schedule, target):
    """A NaN in a query row makes that row's result undefined: out and lse NaN, not 0 / -inf;
    the other rows are untouched."""
    require(target)
    rng = np.random.default_rng(13)
    spec = spec_of(f"head_dim 32\n dtype f32\n mask causal\n schedule {schedule}")
    q = rng.standard_normal((1, 9, 2, 32)).astype(np.float32)
    k = rng.standard_normal((1, 9, 1, 32)).astype(np.float32)
    v = rng.standard_normal((1, 9, 1, 32)).astype(np.float32)
    q[0, 4, 1, 7] = np.nan
    out, lse = kernel_for(spec, target)(*to_device(target, "f32", q, k, v), return_lse=True)
    out, lse = _np(out), _np(lse)
    assert np.isnan(out[0, 4, 1]).all() and np.isnan(lse[0, 1, 4])
    ok = np.ones(out.shape[:3], bool)
    ok[0, 4, 1] = False
    ref, _ = reference(spec, np.where(np.isnan(q), 0, q), k, v, return_lse=True)
    assert np.isfinite(out[ok]).all()
    assert relative_error(out[ok], ref[ok]) <= tolerance(spec)


def _check_weight_zero_key(spec, target, b, lq, lk, hq, hkv, profile=None, **opts):
    """Key 0, which every row sees, gets a score so far below each row's maximum that its weight is
    exactly 0 (in f32, and in the float64 reference), and inf and NaN in its V; other keys
    are random. Every row must stay finite and match the reference."""
    rng = np.random.default_rng(3)
    dqk, dv = spec.head_dim_qk, spec.head_dim_v
    q = rng.standard_normal((b, lq, hq, dqk)).astype(np.float32)
    q[..., 0] = np.abs(q[..., 0]) + 0.5  # q.k at key 0 below -3e4 for every row
    k = rng.standard_normal((b, lk, hkv, dqk)).astype(np.float32)
    v = rng.standard_normal((b, lk, hkv, dv)).astype(np.float32)
    k[:, 0, :, 0] = -6e4
    v[:, 0, :, 0], v[:, 0, :, dv - 1] = np.inf, np.nan
    ref_opts = dict(opts)
    if "block_table" in opts:  # the paged cache: the same keys, each sequence's pages shuffled
        page = spec.kv_cache.page
        n = -(-lk // page)
        table = rng.permutation(b * n).reshape(b, n).astype(np.int32)
        kp = np.zeros((b * n, page, hkv, dqk), np.float32)
        vp = np.zeros((b * n, page, hkv, dv), np.float32)
        for bi in range(b):
            for j in range(lk):
                kp[table[bi, j // page], j % page] = k[bi, j]
                vp[table[bi, j // page], j % page] = v[bi, j]
        ref_opts = {"kv_lens": opts["kv_lens"]}
        opts = dict(opts, block_table=table)
        kernel_k, kernel_v = kp, vp
    else:
        kernel_k, kernel_v = k, v
    kernel = kernel_for(spec, target) if profile is None else attngen.compile(spec, target=target, profile=profile)
    call = {n: (_ints(target, x) if np.asarray(x).dtype.kind in "iu" else x) for n, x in opts.items()}
    if "mask" in call and target == "cuda":
        import cupy
        call["mask"] = cupy.asarray(call["mask"])
    out, lse = kernel(*to_device(target, spec.dtype, q, kernel_k, kernel_v), return_lse=True, **call)
    out, lse = _np(out), _np(lse)
    with np.errstate(invalid="ignore", over="ignore"):
        ref, ref_lse = reference(spec, q, k, v, return_lse=True, **ref_opts)
    assert np.isfinite(ref).all(), "the reference gives key 0 a weight of exactly 0"
    assert np.isfinite(out).all(), f"a key of weight 0 brought its inf / NaN into {(~np.isfinite(out).all(-1)).sum()} rows"
    assert relative_error(out, ref) <= tolerance(spec)
    fin = np.isfinite(ref_lse)
    assert np.array_equal(fin, np.isfinite(lse))
    assert np.abs(lse[fin] - ref_lse[fin]).max() <= 1e-2 * max(1.0, np.abs(ref_lse[fin]).max())


@pytest.mark.parametrize("dtype", ["f16", "f32"])
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("mask", ["none", "causal(bottom_right)"])
def test_a_visible_key_whose_weight_underflows_adds_nothing_whatever_its_v(mask, schedule, dtype):
    """A key every row sees, in a tile the mask keeps whole, whose weight is exactly 0 adds nothing
    even with inf and NaN in its V. WGSL: a tile's keys with p = 0 (masked, or an exp2 that
    underflowed) are selected out of P V wherever its V holds inf or NaN. (Found by the whole fuzz
    campaign: a 1e4 in K and an inf in V at one key gave NaN rows.) CUDA: the next test."""
    require("wgsl")
    spec = spec_of(f"head_dim 32\n heads q=3 kv=1\n dtype {dtype}\n mask {mask}\n schedule {schedule}")
    _check_weight_zero_key(spec, "wgsl", 2, 7, 70, 3, 1)


# One spec per CUDA kernel family: each has its own loop, and so its own cleaning (the Hopper
# families: a block or work item whose acc ends non-finite runs its tiles again, cleaning V of
# every tile; the plain loop cleans every tile in its one pass: section non-finite values of
# templates/cuda/nonfinite.j2). The profile's default plan for the H100 unless a profile is named.
_LENS = np.array([150, 131], np.int32)
_CAUSAL_BR = np.tril(np.ones((37, 150), bool), k=150 - 37)
KERNEL_FAMILIES = [
    ("head_dim 64\n dtype f16", None, {}),              # producer, persistent, 3 consumer warpgroups
    ("head_dim 128\n dtype bf16", None, {}),            # producer, persistent, 2 consumer warpgroups
    ("head_dim 256\n dtype f16", None, {}),             # producer, persistent, d256 tiles
    ("head_dim 128\n dtype f16", None, {"kv_lens": _LENS}),  # the _varlen entry: overlapped loop, no producer
    ("head_dim 128\n dtype f16\n target cuda { producer=off }", None, {}),  # overlapped loop, no producer
    ("head_dim 320\n dtype f16\n mask causal(bottom_right)", None, {}),  # wide head dims, column blocks
    ("head_dim 128\n dtype f16\n mask custom", None, {"mask": _CAUSAL_BR}),  # producer, persistent, custom
    ("head_dim 96\n dtype f16", None, {}),              # producer, persistent (head dims not of 64-column blocks)
    # the plain loop (mma.sync, CUDA cores, wgmma without the overlapped loop): no second pass; the
    # tiles where a weight is 0 are cleaned in the one pass
    ("head_dim 128\n dtype f16\n schedule split_kv(auto)", None, {}),  # decode: warps over keys
    ("head_dim 128\n dtype f16\n kv_cache paged(page=16)\n schedule split_kv(auto)", None,
     {"kv_lens": _LENS, "block_table": True}),
    ("head_dim 128\n dtype f16\n schedule two_pass", None, {}),
    ("head_dim 64\n dtype f32", None, {}),              # CUDA cores
    ("head_dim 256\n dtype f16", None, {"kv_lens": _LENS}),  # the _varlen entry of d256: the plain loop
    ("head_dim 128\n dtype f16", "cuda-sm80", {}),     # mma.sync
    ("head_dim 512\n dtype f16\n mask causal(bottom_right)", "cuda-sm80", {}),  # head dims in chunks
    ("head_dim 256\n dtype f16\n target cuda { producer=off }", None, {}),  # wgmma, 2 stages: not overlapped
    # persistent=off: one block per row tile, by the work-item code (a block does its item again)
    ("head_dim 96\n dtype f16\n target cuda { persistent=off }", None, {}),
    # the producer kernels that kept one block per row tile until 2026-11-27 (third session): cp.async
    # copies (tma=off; d96: rows 10 apart) and, with producer=on given, the window, softcap and
    # custom-mask kernels above head dim 128
    ("head_dim 96\n dtype f16\n target cuda { tma=off }", None, {}),
    ("head_dim 256\n dtype f16\n target cuda { producer=on tma=off }", None, {}),
    ("head_dim 192\n dtype f16\n mask window(left=200)\n target cuda { producer=on }", None, {}),
    # (a softcap of 30 keeps every weight above 0: exp2 of at most 2 * 30 * log2(e) below the max)
    ("head_dim 256\n dtype bf16\n softcap 10000\n target cuda { producer=on }", None, {}),
    ("head_dim 192\n dtype f16\n mask custom\n target cuda { producer=on }", None, {"mask": _CAUSAL_BR}),
    ("head_dim 128\n dtype f16\n mask causal(bottom_right)\n target cuda { persistent=off }", None, {}),
    # P through memory (mask none above head dim 256): a warp whose acc is not finite redoes its P V
    # on CUDA cores, keys of weight 0 selected out
    ("head_dim 320\n dtype f16", None, {}),
]


def _family_id(case):
    body, profile, _ = case.values if hasattr(case, "values") else case
    return f"{body.replace(chr(10), ' ')} {profile or ''}".strip()


@pytest.mark.parametrize("body, profile, opts", KERNEL_FAMILIES, ids=[_family_id(c) for c in KERNEL_FAMILIES])
def test_a_key_of_weight_zero_in_every_cuda_kernel_family(body, profile, opts):
    """The same on the CUDA kernel families: a key of weight 0 with inf / NaN in its V adds
    nothing (lengths past one tile, GQA 3, Lq != Lk)."""
    require("cuda")
    spec = spec_of(body, name="w0_" + hashlib.sha1(f"{body} {profile}".encode()).hexdigest()[:8])
    _check_weight_zero_key(spec, "cuda", 2, 37, 150, 6, 2, profile=profile, **opts)
