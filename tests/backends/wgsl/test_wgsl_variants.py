"""WGSL-specific checks of issue 3's variants (tests/equivalence/test_variants.py runs the shared ones).

The block-mask shader against the numpy oracle on odd shapes, the binding budget of every
entry point (webgpu-core: 8 storage buffers per stage), the manifest's description of the
packed buffers and entry points, emission for Chrome's Tint dialect, appending to caches held
on the GPU, and split schedules over packed sequences.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import attngen
from attngen.runtime.blockmask import reference_block_mask
from attngen.reference import reference, relative_error, tolerance

from conftest import kernel_for, require, spec_of

SCHEDULES = ["fused", "split_kv(3)", "split_kv(auto)", "two_pass"]


def _specs():
    for sched, mask, cache, body in itertools.product(
            SCHEDULES, ["causal", "custom"], ["contiguous", "paged(page=16)"],
            ["head_dim 64\n dtype f16", "head_dim 512\n dtype f32", "head_dim 64\n dtype f32\n tile d=32"]):
        yield spec_of(f"{body}\n mask {mask}\n schedule {sched}\n kv_cache {cache}")


@pytest.mark.parametrize("profile", ["webgpu-core", "wgpu-software", "wgpu-vulkan-nvidia"])
def test_every_entry_point_fits_the_binding_budget(profile):
    for spec in _specs():
        em = attngen.emit(spec, "wgsl", profile)
        eps = em.manifest["entry_points"]
        assert [e["entry_point"] for e in eps][0] == em.plan.entry
        for e in eps:
            assert e["storage_buffers"] <= 8, (spec, e)
        # every binding the module declares is listed once, and each entry point's are among them
        declared = {b["binding"] for b in em.manifest["bindings"]}
        assert all(set(e["bindings"]) <= declared for e in eps)
        assert em.source.count("@binding(") == len(declared)


def test_manifest_describes_split_schedules():
    spec = spec_of("head_dim 64\n dtype f16\n schedule two_pass\n kv_cache paged(page=16)")
    m = attngen.emit(spec, "wgsl", "webgpu-core").manifest
    roles = [e["role"] for e in m["entry_points"]]
    assert roles == ["attention", "pv", "combine"]
    names = {b["name"]: b for b in m["bindings"]}
    assert {"seq_meta", "kv_new", "o_part", "lse_part", "s_scratch", "stats"} <= set(names)
    assert [s["name"] for s in names["seq_meta"]["layout"]["sections"]] == [
        "cu_seqlens_q", "cu_seqlens_k", "kv_lens", "block_table"]
    assert "4 * S * B * Lq * Hq * Dv" in names["o_part"]["layout"]["bytes"]
    assert m["entry_points"][0]["dispatch"][0].endswith("* S")
    fields = [f["name"] for f in names["params"]["fields"]]
    assert {"splits", "meta_table", "table_width", "kv_layout"} <= set(fields)
    assert names["params"]["size_bytes"] % 16 == 0
    assert m["schedule"]["kind"] == "two_pass"


def test_manifest_describes_the_mask_buffer():
    m = attngen.emit(spec_of("head_dim 64\n dtype f16\n mask custom"), "wgsl", "webgpu-core").manifest
    mask = next(b for b in m["bindings"] if b["name"] == "mask")
    assert [s["offset"] for s in mask["layout"]["sections"]] == ["mask_counts", "mask_tiles", "mask_data"]
    assert "little-endian" in mask["layout"]["sections"][2]["doc"]


@pytest.mark.parametrize("sched", SCHEDULES)
def test_tint_dialect_for_webgpu_core(sched):
    spec = spec_of(f"head_dim 64\n dtype f16\n schedule {sched}\n target wgsl {{ subgroups=on f16=native }}")
    src = attngen.emit(spec, "wgsl", "webgpu-core").source
    assert "enable subgroups;" in src and "enable f16;" in src
    packed = attngen.emit(spec_of(f"head_dim 64\n dtype f16\n schedule {sched}\n target wgsl {{ subgroups=on }}"),
                          "wgsl", "webgpu-core").source
    assert "enable subgroups;" in packed and "enable f16;" not in packed  # webgpu-core packs f16 by default
    if sched != "fused":
        assert "_combine(" in src


@pytest.mark.parametrize("sched", ["split_kv(2)", "two_pass"])
def test_custom_mask_with_split_schedules_is_one_head_per_workgroup(sched):
    """mask custom: the block lists are per query head, so split workgroups do not pack GQA heads."""
    spec = spec_of(f"head_dim 64\n dtype f16\n mask custom\n schedule {sched}")
    em = attngen.emit(spec, "wgsl", "webgpu-core")
    m = em.manifest
    main = m["entry_points"][0]
    assert main["dispatch"] == ["ceil(Lq / 16) * S", "Hq", "B"] == m["dispatch"]
    assert "one query head" in m["schedule"]["rows"] and "split_of_the_list" in m["schedule"]
    mask = next(b["binding"] for b in m["bindings"] if b["name"] == "mask")
    for e in m["entry_points"]:  # the attention (and two_pass's pass 2) walk the lists
        assert (mask in e["bindings"]) == (e["role"] in ("attention", "pv")), e
        assert e["storage_buffers"] <= 8
    assert em.source.count("u32(tile_first + it)") == (2 if sched == "two_pass" else 1)
    # without mask custom the same schedule packs the group's heads
    packed = attngen.emit(spec_of(f"head_dim 64\n dtype f16\n mask causal\n schedule {sched}"), "wgsl",
                          "webgpu-core").manifest
    assert packed["dispatch"][:2] == ["ceil(Lq * G / 16) * S", "Hkv"]


# ---- on the device ------------------------------------------------------------------------------

@pytest.mark.parametrize("shape, kind, tiles", [
    ((1, 1, 1, 1), "bool", "tile q=16 kv=16"),
    ((3, 5, 131, 77), "bool", "tile q=16 kv=16"),
    ((2, 1, 33, 250), "additive", "tile q=16 kv=32"),
    ((1, 3, 200, 9), "additive", ""),
    ((97, 300), "bool", "tile q=32 kv=16"),
])
def test_block_mask_shader_matches_the_oracle(shape, kind, tiles):
    require("wgsl")
    spec = spec_of(f"head_dim 32\n dtype f32\n mask custom\n {tiles}".rstrip())
    kernel = kernel_for(spec, "wgsl")
    rng = np.random.default_rng(sum(shape))
    if kind == "bool":
        m = rng.random(shape) < 0.02  # mostly empty tiles, some partial
        m[..., : shape[-2] // 2, :] = True  # full tiles too
    else:
        m = np.where(rng.random(shape) < 0.5, -np.inf, 0.0).astype(np.float32)
        m[..., 5:, :] = 0.0  # full tiles
        m[..., 7, :] = 0.5  # a partial row with a finite bias
    bm = attngen.block_mask(m, kernel)
    oracle = reference_block_mask(m, kernel.plan.tile_q, kernel.plan.tile_kv)
    assert np.array_equal(bm.counts, oracle.counts)
    assert np.array_equal(bm.tiles, oracle.tiles)
    assert (bm.live_tiles, bm.partial_tiles) == (oracle.live_tiles, oracle.partial_tiles)
    assert "BlockMask" in repr(bm)


def test_block_mask_for_other_tiles_is_refused():
    require("wgsl")
    a = kernel_for(spec_of("head_dim 32\n dtype f32\n mask custom\n tile q=16 kv=16"), "wgsl")
    b = kernel_for(spec_of("head_dim 32\n dtype f32\n mask custom\n tile q=16 kv=32"), "wgsl")
    bm = attngen.block_mask(np.ones((5, 40), bool), a)
    q = np.zeros((1, 5, 2, 32), np.float32)
    k = np.zeros((1, 40, 2, 32), np.float32)
    with pytest.raises(attngen.LaunchError, match="tiles 16x16"):
        b(q, k, k, mask=bm)


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_append_to_a_cache_on_the_gpu(paged):
    """WgslTensor caches are updated on the GPU, in the same launch as the attention."""
    require("wgsl")
    from attngen.backends.wgsl import WgslTensor
    cache = "paged(page=8)" if paged else "contiguous"
    spec = spec_of(f"head_dim 32\n dtype f16\n mask causal(bottom_right)\n kv_cache {cache}\n schedule split_kv(2)")
    rng = np.random.default_rng(1)
    lens, lnew = np.array([5, 0], np.int32), 2
    if paged:
        k = rng.standard_normal((4, 8, 2, 32)).astype(np.float16)
        table = np.array([[2, 0], [1, 3]], np.int32)
    else:
        k = rng.standard_normal((2, 12, 2, 32)).astype(np.float16)
        table = None
    v = rng.standard_normal(k.shape).astype(np.float16)
    kn = rng.standard_normal((2, lnew, 2, 32)).astype(np.float16)
    vn = rng.standard_normal((2, lnew, 2, 32)).astype(np.float16)
    q = rng.standard_normal((2, 3, 4, 32)).astype(np.float16)
    k_after, v_after = k.copy(), v.copy()
    for b in range(2):
        for i in range(lnew):
            j = int(lens[b]) + i
            at = (table[b, j // 8], j % 8) if paged else (b, j)
            k_after[at], v_after[at] = kn[b, i], vn[b, i]
    kernel = kernel_for(spec, "wgsl")
    dk, dv = WgslTensor.from_numpy(k), WgslTensor.from_numpy(v)
    extra = {"block_table": table} if paged else {}
    out = kernel(WgslTensor.from_numpy(q), dk, dv, kv_lens=lens, k_new=kn, v_new=vn, **extra)
    assert isinstance(out, WgslTensor)
    assert np.array_equal(dk.numpy(), k_after) and np.array_equal(dv.numpy(), v_after)
    ref = reference(spec, q, k_after, v_after, kv_lens=lens + lnew, **extra)
    assert relative_error(out.numpy(), ref) <= tolerance(spec)



def packed_sequences(spec, seed):
    """Three packed sequences (lengths q 3, 0, 17 and k 40, 5, 70), 6 query heads over 2 KV heads."""
    rng = np.random.default_rng(seed)
    lq, lk = [3, 0, 17], [40, 5, 70]
    cuq = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    cuk = np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)
    d = spec.head_dim_qk
    q = rng.standard_normal((cuq[-1], 6, d)).astype(np.float32)
    k = rng.standard_normal((cuk[-1], 2, d)).astype(np.float32)
    v = rng.standard_normal((cuk[-1], 2, spec.head_dim_v)).astype(np.float32)
    return rng, cuq, cuk, q, k, v


@pytest.mark.parametrize("sched", ["split_kv(2)", "two_pass"])
@pytest.mark.parametrize("dims", ["head_dim 32", "head_dim 32\n tile d=16", "head_dim 512"],
                         ids=["whole", "tile-d", "v-blocks"])
def test_split_schedules_over_packed_sequences(sched, dims):
    require("wgsl")
    spec = spec_of(f"{dims}\n dtype f32\n mask causal(bottom_right)\n schedule {sched}")
    rng, cuq, cuk, q, k, v = packed_sequences(spec, seed=2)
    out, lse = kernel_for(spec, "wgsl")(q, k, v, cu_seqlens_q=cuq, cu_seqlens_k=cuk, return_lse=True)
    ref, ref_lse = reference(spec, q, k, v, cu_seqlens_q=cuq, cu_seqlens_k=cuk, return_lse=True)
    assert lse.shape == (6, cuq[-1])
    assert relative_error(out, ref) <= tolerance(spec)
    assert np.allclose(lse, ref_lse, atol=1e-4)


@pytest.mark.parametrize("sched", ["split_kv(2)", "two_pass"])
@pytest.mark.parametrize("dims", ["head_dim 32\n tile d=16", "head_dim 512"], ids=["tile-d", "v-blocks"])
def test_custom_mask_split_schedules_over_packed_sequences(sched, dims):
    """mask custom with a split schedule (one query head per workgroup) over packed sequences,
    with head dims in chunks or over V blocks (grid y = Hq * V_BLOCKS)."""
    require("wgsl")
    spec = spec_of(f"{dims}\n dtype f32\n mask custom\n schedule {sched}")
    rng, cuq, cuk, q, k, v = packed_sequences(spec, seed=4)
    mask = rng.random((3, 6, 17, 70)) < 0.3
    kw = dict(mask=mask, cu_seqlens_q=cuq, cu_seqlens_k=cuk, return_lse=True)
    out, lse = kernel_for(spec, "wgsl")(q, k, v, **kw)
    ref, ref_lse = reference(spec, q, k, v, **kw)
    assert relative_error(out, ref) <= tolerance(spec)
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    ok = ~np.isneginf(ref_lse)
    assert np.allclose(lse[ok], ref_lse[ok], atol=1e-4)


@pytest.mark.parametrize("sched", ["split_kv(2)", "two_pass"])
def test_custom_mask_split_schedules_append(sched):
    """The append with one query head per workgroup: the first head of each GQA group writes."""
    require("wgsl")
    spec = spec_of(f"head_dim 32\n dtype f32\n mask custom\n schedule {sched}")
    rng = np.random.default_rng(5)
    lens, lnew = np.array([5, 0], np.int32), 2
    k = rng.standard_normal((2, 12, 2, 32)).astype(np.float32)
    v = rng.standard_normal(k.shape).astype(np.float32)
    kn = rng.standard_normal((2, lnew, 2, 32)).astype(np.float32)
    vn = rng.standard_normal((2, lnew, 2, 32)).astype(np.float32)
    q = rng.standard_normal((2, 3, 4, 32)).astype(np.float32)
    mask = rng.random((2, 4, 3, 7)) < 0.5
    k_after, v_after = k.copy(), v.copy()
    for b in range(2):
        k_after[b, lens[b]:lens[b] + lnew], v_after[b, lens[b]:lens[b] + lnew] = kn[b], vn[b]
    out = kernel_for(spec, "wgsl")(q, k, v, mask=mask, kv_lens=lens, k_new=kn, v_new=vn)
    assert np.array_equal(k, k_after) and np.array_equal(v, v_after)
    ref = reference(spec, q, k_after, v_after, mask=mask, kv_lens=lens + lnew)
    assert relative_error(out, ref) <= tolerance(spec)


def test_merge_of_wgsl_numpy_results_with_lse():
    require("wgsl")
    spec = spec_of("head_dim 32\n dtype f16\n schedule split_kv(2)")
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 4, 2, 32)).astype(np.float16)
    k = rng.standard_normal((1, 90, 2, 32)).astype(np.float16)
    v = rng.standard_normal((1, 90, 2, 32)).astype(np.float16)
    kernel = kernel_for(spec, "wgsl")
    a = kernel(q, np.ascontiguousarray(k[:, :50]), np.ascontiguousarray(v[:, :50]), return_lse=True)
    b = kernel(q, np.ascontiguousarray(k[:, 50:]), np.ascontiguousarray(v[:, 50:]), return_lse=True)
    out, lse = attngen.merge([a[0], b[0]], [a[1], b[1]])
    ref = reference(spec, q, k, v)
    assert out.dtype == np.float16 and relative_error(out, ref) <= tolerance(spec)
