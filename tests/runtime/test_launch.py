"""Run-time input checks (runtime/launch.py), the block-mask oracle and merge, without a device."""

from __future__ import annotations

import numpy as np
import pytest

import attngen
from attngen.runtime.blockmask import reference_block_mask
from attngen.api import lower as plan
from attngen.runtime.launch import OnDevice, on_device, resolve
from attngen.plan.schedule import choose_splits

from conftest import spec_of


def _plan(body, target="cuda"):
    return plan(spec_of(body), target, "cuda-sm90" if target == "cuda" else "webgpu-core")


def _resolve(body, q, k, v=None, **kw):
    p = _plan(body)
    v = v or k[:-1] + (p.d_v,)
    shapes = {"q": q, "k": k, "v": v}
    dt = {"q": p.dtype, "k": p.dtype, "v": p.dtype}
    for extra in ("k_new", "v_new"):
        if extra in kw:
            shapes[extra] = kw.pop(extra)
            dt[extra] = p.dtype
    return resolve(p, shapes, dt, **kw)


def test_padded_defaults():
    ln = _resolve("head_dim 64\n dtype f16", (2, 5, 8, 64), (2, 9, 2, 64))
    assert (ln.layout, ln.batch, ln.len_q, ln.len_k, ln.group, ln.splits) == ("padded", 2, 5, 9, 4, 1)
    assert ln.out_shape_for(64) == (2, 5, 8, 64) and ln.lse_shape == (2, 8, 5)


def test_packed_lengths():
    ln = _resolve("head_dim 64\n dtype f16", (12, 8, 64), (20, 2, 64), cu_seqlens_q=[0, 2, 2, 12],
                  cu_seqlens_k=np.array([0, 5, 19, 20]))
    assert (ln.layout, ln.batch, ln.len_q, ln.len_k) == ("packed", 3, 10, 14)
    assert ln.out_shape_for(64) == (12, 8, 64) and ln.lse_shape == (8, 12)
    assert list(ln.seq_lens_k()) == [5, 14, 1]


def test_paged_and_append_lengths():
    body = "head_dim 32\n dtype f16\n kv_cache paged(page=16)"
    ln = _resolve(body, (2, 1, 4, 32), (6, 16, 2, 32), kv_lens=[3, 20], block_table=[[5, 0], [1, 2]],
                  k_new=(2, 1, 2, 32), v_new=(2, 1, 2, 32))
    assert (ln.layout, ln.page, ln.capacity, ln.len_k, ln.len_new) == ("paged", 16, 96, 21, 1)
    with pytest.raises(attngen.LaunchError, match="repeats a page"):
        _resolve(body, (2, 1, 4, 32), (6, 16, 2, 32), kv_lens=[3, 20], block_table=[[5, 0], [1, 1]],
                 k_new=(2, 1, 2, 32), v_new=(2, 1, 2, 32))


# ---- integer inputs left on the device: shapes checked here, contents by the kernels ----------

def test_device_inputs_bound_the_grid_by_the_shapes():
    """kv_lens on the device: the grid covers the cache's rows (the kernel checks the values);
    packed sequences: the packed rows, or max_seqlen_q / max_seqlen_k."""
    ln = _resolve("head_dim 64\n dtype f16\n schedule split_kv(auto)", (8, 1, 32, 64), (8, 4096, 8, 64),
                  kv_lens=OnDevice((8,)))
    assert ln.len_k == 4096 and isinstance(ln.kv_lens, OnDevice) and ln.splits >= 1
    body = "head_dim 32\n dtype f16\n kv_cache paged(page=16)"
    ln = _resolve(body, (2, 1, 4, 32), (6, 16, 2, 32), kv_lens=OnDevice((2,)), block_table=OnDevice((2, 3)),
                  k_new=(2, 2, 2, 32), v_new=(2, 2, 2, 32))
    assert ln.len_k == 48 and ln.len_new == 2  # block-table columns x page
    ln = _resolve("head_dim 32\n dtype f16", (40, 4, 32), (50, 2, 32), cu_seqlens_q=OnDevice((4,)),
                  cu_seqlens_k=OnDevice((4,)))
    assert (ln.batch, ln.len_q, ln.len_k) == (3, 40, 50)
    ln = _resolve("head_dim 32\n dtype f16", (40, 4, 32), (50, 2, 32), cu_seqlens_q=OnDevice((4,)),
                  cu_seqlens_k=OnDevice((4,)), max_seqlen_q=23, max_seqlen_k=30)
    assert (ln.len_q, ln.len_k) == (23, 30)


@pytest.mark.parametrize("kw, message", [
    ({"kv_lens": OnDevice((3,))}, "kv_lens has 3 entries, but the batch is 2"),
    ({"kv_lens": OnDevice((2, 1))}, "kv_lens must have 1 dimension"),
    ({"kv_lens": OnDevice((2,)), "k_new": (2, 20, 2, 32), "v_new": (2, 20, 2, 32)},
     "k_new has 20 rows per sequence, but the cache holds 9 keys"),
    ({"kv_lens": np.array([3, 2]), "k_new": (2, 7, 2, 32), "v_new": (2, 7, 2, 32)}, "kv_lens\\[0\\] = 3 \\+ 7 new"),
], ids=["count", "ndim", "append beyond the cache", "host kv_lens with an append"])
def test_device_input_shapes_are_checked(kw, message):
    with pytest.raises(attngen.LaunchError, match=message):
        _resolve("head_dim 32\n dtype f16", (2, 5, 4, 32), (2, 9, 2, 32), **kw)


@pytest.mark.parametrize("kw, message", [
    ({"cu_seqlens_q": OnDevice((0,))}, "at least 1"),
    ({"cu_seqlens_q": OnDevice((4,)), "cu_seqlens_k": OnDevice((3,))}, "cu_seqlens_k has 3 entries"),
    ({"cu_seqlens_q": OnDevice((4,)), "max_seqlen_q": 41}, "max_seqlen_q=41 exceeds the 40 rows"),
    ({"cu_seqlens_q": OnDevice((4,)), "max_seqlen_q": -1}, "non-negative int"),
    ({"cu_seqlens_q": np.array([0, 7, 30, 40]), "max_seqlen_q": 20}, "max_seqlen_q=20, but cu_seqlens holds a "
                                                                       "sequence of 23"),
    ({"max_seqlen_q": 5}, "bound packed sequences"),
], ids=["empty", "k count", "max beyond rows", "negative max", "host max too small", "not packed"])
def test_packed_bounds_are_checked(kw, message):
    q, k = ((40, 4, 32), (40, 2, 32)) if "cu_seqlens_q" in kw else ((2, 5, 4, 32), (2, 9, 2, 32))
    with pytest.raises(attngen.LaunchError, match=message):
        _resolve("head_dim 32\n dtype f16", q, k, **kw)


def test_device_integers_must_be_int32_and_of_their_rank():
    assert on_device("kv_lens", (3,), "int32", 1) == OnDevice((3,))
    with pytest.raises(attngen.LaunchError, match="kv_lens is a device tensor of int64"):
        on_device("kv_lens", (3,), "int64", 1)
    with pytest.raises(attngen.LaunchError, match="block_table must have 2 dimension"):
        on_device("block_table", (3,), "int32", 2)


def test_append_without_queries_is_refused():
    with pytest.raises(attngen.LaunchError, match="no query rows"):
        _resolve("head_dim 32\n dtype f16", (2, 0, 4, 32), (2, 9, 2, 32), kv_lens=[1, 2],
                 k_new=(2, 1, 2, 32), v_new=(2, 1, 2, 32))


@pytest.mark.parametrize("kw, message", [
    ({"cu_seqlens_q": [0, 3, 12], "kv_lens": [1, 2]}, "cannot be combined with kv_lens"),
    ({"cu_seqlens_k": [0, 12]}, "needs cu_seqlens_q"),
    ({"cu_seqlens_q": [0, 5, 12], "cu_seqlens_k": [0, 12]}, "2 entries"),
])
def test_packed_errors(kw, message):
    q = (12, 4, 32) if "cu_seqlens_q" in kw else (1, 12, 4, 32)
    k = (12, 2, 32) if "cu_seqlens_q" in kw else (1, 12, 2, 32)
    with pytest.raises(attngen.LaunchError, match=message):
        _resolve("head_dim 32\n dtype f32", q, k, **kw)


def test_split_choice():
    p = _plan("head_dim 128\n dtype f16\n schedule split_kv(auto)")
    # decode over 8 x 8 KV heads on 132 SMs: 2 blocks per SM (4 splits), bounded by the keys
    n = choose_splits(p, 8, 1, 32768, 32, 8, 132)
    assert 2 <= n <= 64
    assert choose_splits(p, 8, 1, 64, 32, 8, 132) == 1  # too few keys to split
    assert choose_splits(_plan("head_dim 64\n dtype f16\n schedule split_kv(5)"), 1, 1, 10, 1, 1, 1) == 5
    assert choose_splits(_plan("head_dim 64\n dtype f16"), 1, 1, 10**6, 1, 1, 132) == 1


# ---- block masks (numpy oracle) ----------------------------------------------------------------

def _naive_classes(mask, tq, tkv):
    m = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    bm, hm, lq, lk = m.shape
    nq, nk = -(-lq // tq), -(-lk // tkv)
    out = np.zeros((bm, hm, nq, nk), int)  # 0 empty, 1 full, 2 partial
    for b in range(bm):
        for h in range(hm):
            for i in range(nq):
                for j in range(nk):
                    blk = m[b, h, i * tq:(i + 1) * tq, j * tkv:(j + 1) * tkv]
                    live = blk != 0 if m.dtype == bool else blk > -np.inf
                    plain = live if m.dtype == bool else blk == 0
                    out[b, h, i, j] = 0 if not live.any() else (1 if plain.all() else 2)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_block_mask_oracle_matches_naive(seed):
    rng = np.random.default_rng(seed)
    lq, lk = rng.integers(1, 70, 2)
    tq, tkv = [(16, 16), (64, 32), (8, 8), (128, 64)][seed]
    if seed % 2:
        mask = rng.random((2, 3, lq, lk)) < 0.1
        mask[:, :, :, : lk // 2] = True
    else:
        mask = np.where(rng.random((lq, lk)) < 0.5, -np.inf, 0.0).astype(np.float32)
        mask[: lq // 2] = rng.standard_normal((lq // 2, lk))
    bm = reference_block_mask(mask, tq, tkv)
    classes = _naive_classes(mask, tq, tkv)
    for idx in np.ndindex(bm.counts.shape):
        live = [j for j in range(classes.shape[-1]) if classes[idx][j]]
        assert bm.counts[idx] == len(live)
        want = [2 * j + (classes[idx][j] == 2) for j in live]
        assert list(bm.tiles[idx][: len(live)]) == want
        assert (bm.tiles[idx][len(live):] == -1).all()


@pytest.mark.parametrize("mask, message", [
    (np.ones((3,), bool), "shape"),
    (np.ones((2, 2), np.int8), "boolean"),
    (np.full((2, 2), np.nan, np.float32), "NaN"),
    (np.full((2, 2), np.inf, np.float32), r"\+inf"),
])
def test_block_mask_bad_masks(mask, message):
    with pytest.raises(attngen.LaunchError, match=message):
        reference_block_mask(mask, 16, 16)


def test_block_mask_needs_a_kernel():
    with pytest.raises(attngen.LaunchError, match="compiled attngen kernel"):
        attngen.block_mask(np.ones((2, 2), bool), object())


# ---- merge -------------------------------------------------------------------------------------

def test_merge_matches_softmax_over_union():
    rng = np.random.default_rng(0)
    s = rng.standard_normal((2, 3, 5, 40))  # (B, H, L, keys)
    v = rng.standard_normal((2, 40, 3, 8))  # (B, keys, H, D)

    def attend(sl):
        x = s[..., sl]
        m = x.max(-1, keepdims=True)
        p = np.exp(x - m)
        out = np.einsum("bhlk,bkhd->blhd", p / p.sum(-1, keepdims=True), v[:, sl])
        return out, (m + np.log(p.sum(-1, keepdims=True)))[..., 0]

    parts = [attend(slice(0, 13)), attend(slice(13, 40))]
    out, lse = attngen.merge([p[0] for p in parts], [p[1] for p in parts])
    full_out, full_lse = attend(slice(0, 40))
    assert np.allclose(out, full_out) and np.allclose(lse, full_lse)


@pytest.mark.parametrize("outs, lses, message", [
    ([np.zeros((1, 2, 3, 4))], [], "as many lse"),
    ([np.zeros((1, 2, 3, 4))], [np.zeros((1, 2, 3))], "do not match"),
    ([np.zeros((1, 2, 3, 4)), np.zeros((1, 2, 3, 5))], [np.zeros((1, 3, 2))] * 2, "part 1"),
    (["x"], [np.zeros(1)], "numpy, CuPy or PyTorch"),
])
def test_merge_errors(outs, lses, message):
    with pytest.raises(attngen.LaunchError, match=message):
        attngen.merge(outs, lses)


# ---- found by a new-user review (2026-11-27): each failed before its fix -----------------------

def test_an_append_into_a_page_another_sequence_uses_is_refused():
    """Row 1 appends into page 1, which row 0 reads: the two sequences' blocks run at once, so
    row 0 would read keys half overwritten (a race). Pages shared read-only (a common prefix)
    stay allowed, as prefix caching shares them."""
    body = "head_dim 32\n dtype f16\n kv_cache paged(page=4)"
    q, kc, new = (2, 2, 4, 32), (5, 4, 2, 32), (2, 2, 2, 32)
    with pytest.raises(attngen.LaunchError, match=r"block_table\[1, 0\] = 1: row 1's append writes page 1, which "
                                                  "row 0 also uses"):
        _resolve(body, q, kc, kv_lens=[8, 0], block_table=[[0, 1, 3], [1, 2, 4]], k_new=new, v_new=new)
    with pytest.raises(attngen.LaunchError, match="row 0's append writes page 0, which row 1 also uses"):
        _resolve(body, q, kc, kv_lens=[3, 4], block_table=[[0, 1, 3], [0, 2, 4]], k_new=new, v_new=new)
    # a full prefix page shared read-only; each row appends into its own page
    ln = _resolve(body, q, kc, kv_lens=[4, 5], block_table=[[0, 1, 3], [0, 2, 4]], k_new=new, v_new=new)
    assert ln.len_k == 7
    # without an append, rows may share any page
    _resolve(body, q, kc, kv_lens=[8, 3], block_table=[[0, 1, 3], [1, 2, 4]])


def test_a_mask_may_cover_the_cache_when_kv_lens_are_given():
    """With kv_lens a custom mask's keys are cache positions: any width from the longest
    sequence's keys up to the cache's rows (so one BlockMask serves every decode step); the
    launch's Lk is the mask's width. Before, only max(kv_lens) was accepted on the host path,
    only the cache's rows on the device path."""
    body = "head_dim 32\n dtype f16\n mask custom"
    q, k = (2, 7, 4, 32), (2, 40, 2, 32)
    for width in (10, 25, 40):
        ln = _resolve(body, q, k, kv_lens=[10, 0], has_mask=True, mask_keys=width)
        assert ln.len_k == width
    for width in (9, 41):
        with pytest.raises(attngen.LaunchError, match=f"mask covers {width} keys; with kv_lens it must cover the "
                                                      "longest sequence's 10 keys and at most the 40 keys"):
            _resolve(body, q, k, kv_lens=[10, 0], has_mask=True, mask_keys=width)
    with pytest.raises(attngen.LaunchError, match="with kv_lens on the device a mask covers the cache: 40 keys"):
        _resolve(body, q, k, kv_lens=OnDevice((2,)), has_mask=True, mask_keys=10)
    assert _resolve(body, q, k, kv_lens=OnDevice((2,)), has_mask=True, mask_keys=40).len_k == 40


def test_merge_wants_lists_of_parts():
    """merge(out, lse) with two arrays merged the batch entries as if they were parts."""
    out, lse = np.zeros((2, 5, 3, 8), np.float32), np.zeros((2, 3, 5), np.float32)
    with pytest.raises(attngen.LaunchError, match="merge takes a list of arrays for outs, one per part"):
        attngen.merge(out, lse)
    with pytest.raises(attngen.LaunchError, match="for lses"):
        attngen.merge([out], lse)
    o, l_ = attngen.merge([out], [lse])
    assert o.shape == out.shape and l_.shape == lse.shape


@pytest.mark.parametrize("call, message", [
    (lambda s, q, k, v: attngen.reference(s, q, k, v, kv_lens=np.array([-3, 3])), "kv_lens must be >= 0"),
    (lambda s, q, k, v: attngen.reference(s, q, k, v, kv_lens=np.array([100, 3])), r"kv_lens\[0\] = 100 keys exceed"),
    (lambda s, q, k, v: attngen.reference(s, q[:, :, :2], k, v), "built for heads q=3 kv=1, but q has 2 heads"),
    (lambda s, q, k, v: attngen.reference(s, q[0], k, v), "q must have 4 dimensions"),
    (lambda s, q, k, v: attngen.reference(s, q[..., :4], k, v), "q has head_dim 4"),
    (lambda s, q, k, v: attngen.reference(s, q, k, v[:1]), "k and v must have the same leading dimensions"),
])
def test_the_reference_checks_its_inputs_as_the_kernels_do(call, message):
    """The oracle used to slice with a negative kv_len (Python's end-relative slice), clip a
    kv_len past the cache, answer for other head counts than the spec's, or fail inside numpy."""
    s = spec_of("head_dim 8\n dtype f32\n heads q=3 kv=1")
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((2, 5, 3, 8)), rng.standard_normal((2, 9, 1, 8)), rng.standard_normal((2, 9, 1, 8))
    with pytest.raises(attngen.LaunchError, match="attngen.reference: .*" + message):
        call(s, q, k, v)


def test_the_reference_takes_a_mask_as_wide_as_the_cache():
    s = spec_of("head_dim 8\n dtype f32\n mask custom")
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((2, 3, 2, 8)), rng.standard_normal((2, 12, 1, 8)), rng.standard_normal((2, 12, 1, 8))
    m = rng.random((3, 12)) > 0.3
    lens = np.array([7, 4])
    wide = attngen.reference(s, q, k, v, mask=m, kv_lens=lens)
    narrow = attngen.reference(s, q, k, v, mask=m[:, :7], kv_lens=lens)
    np.testing.assert_array_equal(wide, narrow)
    with pytest.raises(attngen.LaunchError, match="attngen.reference: mask covers 6 keys"):
        attngen.reference(s, q, k, v, mask=m[:, :6], kv_lens=lens)
    with pytest.raises(attngen.LaunchError, match="attngen.reference: mask has head dimension 3"):
        attngen.reference(s, q, k, v, mask=np.ones((3, 3, 12), bool), kv_lens=lens)


@pytest.mark.parametrize("call, message", [
    (lambda: attngen.compile("attention t {}", target="wgsl"), "compile takes an AttentionSpec, not str: parse"),
    (lambda: attngen.lower([spec_of("head_dim 8\n dtype f32")] * 2, "wgsl"), "lower takes an AttentionSpec, not list"),
    (lambda: attngen.check(None), "check takes an AttentionSpec, not NoneType"),
    (lambda: attngen.load("x.attn", name=3), "load: name must be a kernel's name"),
])
def test_api_calls_with_the_wrong_kind_of_argument_say_so(call, message):
    with pytest.raises(TypeError, match=message):
        call()


def test_a_cache_wide_mask_does_not_change_the_splits_or_the_device_table_rule():
    """(A review of the change above.) split_kv(auto) counts the sequences' keys, not a cache-wide
    mask's; with kv_lens on the host and the block table on the device the mask may be narrower
    than the cache too (only device kv_lens ask for the cache's rows)."""
    body = "head_dim 64\n dtype f16\n mask custom\n schedule split_kv(auto)"
    q, k = (1, 1, 8, 64), (1, 32768, 8, 64)
    narrow = _resolve(body, q, k, kv_lens=[100], has_mask=True, mask_keys=100, cores=108)
    wide = _resolve(body, q, k, kv_lens=[100], has_mask=True, mask_keys=32768, cores=108)
    assert wide.splits == narrow.splits and (narrow.mask_lk, wide.mask_lk) == (100, 32768)
    paged = "head_dim 32\n dtype f16\n mask custom\n kv_cache paged(page=16)"
    ln = _resolve(paged, (2, 1, 4, 32), (6, 16, 2, 32), kv_lens=[20, 3], block_table=OnDevice((2, 3)),
                  has_mask=True, mask_keys=32)
    assert (ln.len_k, ln.mask_lk) == (48, 32)
    with pytest.raises(attngen.LaunchError, match="longest sequence's 20 keys"):
        _resolve(paged, (2, 1, 4, 32), (6, 16, 2, 32), kv_lens=[20, 3], block_table=OnDevice((2, 3)),
                 has_mask=True, mask_keys=16)


def test_the_reference_takes_packed_masks_up_to_the_packed_rows():
    """The oracle refused a packed mask larger than the longest sequence, which the kernels take
    (max_seqlen_q / _k, or device cu_seqlens on cuda); B = 0 failed inside numpy."""
    s = spec_of("head_dim 16\n heads q=2 kv=1\n dtype f32\n mask custom")
    rng = np.random.default_rng(2)
    cu = np.array([0, 3, 8])
    q, k = rng.standard_normal((8, 2, 16)), rng.standard_normal((8, 1, 16))
    m = rng.random((2, 1, 8, 8)) > 0.3
    wide = attngen.reference(s, q, k, k, mask=m, cu_seqlens_q=cu)
    exact = attngen.reference(s, q, k, k, mask=m[:, :, :5, :5], cu_seqlens_q=cu)
    np.testing.assert_array_equal(wide, exact)
    with pytest.raises(attngen.LaunchError, match="attngen.reference: mask covers 4 query rows, but cu_seqlens holds "
                                                  "a sequence of 5"):
        attngen.reference(s, q, k, k, mask=m[:, :, :4], cu_seqlens_q=cu)
    plain = spec_of("head_dim 8\n dtype f32")
    out, lse = attngen.reference(plain, np.zeros((0, 3, 2, 8)), np.zeros((0, 5, 2, 8)), np.zeros((0, 5, 2, 8)),
                                 return_lse=True)
    assert out.shape == (0, 3, 2, 8) and lse.shape == (0, 2, 3)


def test_key_warps_is_kept_through_a_tuned_choice():
    from attngen.harness import tune
    s = spec_of("head_dim 128\n dtype f16\n schedule split_kv(4)\n target cuda { key_warps=2 }")
    assert tune.is_auto(s, "cuda")
    assert tune.apply(s, "cuda", {"tile_q": 16, "tile_kv": 64, "options": {"stages": 3}}).options("cuda") == {
        "key_warps": 2, "stages": 3}
    assert not tune.is_auto(spec_of("head_dim 128\n dtype f16\n target cuda { warps=4 }"), "cuda")


# ---- issue 40 (hostile input): each failed before its fix ---------------------------------------

@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_merge_of_a_nan_lse_is_nan(kind, dtype):
    """A part whose lse is NaN for a row made that row 0 (or NaN) with lse -inf, the value of a
    row no part saw: NaN in must give NaN out (out and lse), for that row only."""
    rng = np.random.default_rng(1)
    outs = [rng.standard_normal((2, 5, 3, 4)).astype(dtype) for _ in range(3)]
    lses = [rng.standard_normal((2, 3, 5)).astype(dtype) for _ in range(3)]
    lses[1][0, 2, 4] = np.nan        # one part's row NaN, the other parts finite
    lses[0][1, 0, 3] = -np.inf       # a row two parts did not see and one saw as NaN
    lses[1][1, 0, 3] = -np.inf
    lses[2][1, 0, 3] = np.nan
    lses[0][1, 1, 1] = lses[1][1, 1, 1] = lses[2][1, 1, 1] = -np.inf  # seen by no part
    if kind == "torch":
        torch = pytest.importorskip("torch")
        out, lse = attngen.merge([torch.from_numpy(o) for o in outs], [torch.from_numpy(x) for x in lses])
        out, lse = out.numpy(), lse.numpy()
    else:
        out, lse = attngen.merge(outs, lses)
    nan_rows = {(0, 2, 4), (1, 0, 3)}  # (batch, head, row)
    for b, h, i in np.ndindex(2, 3, 5):
        if (b, h, i) in nan_rows:
            assert np.isnan(lse[b, h, i]) and np.isnan(out[b, i, h]).all(), (b, h, i)
        elif (b, h, i) == (1, 1, 1):
            assert lse[b, h, i] == -np.inf and (out[b, i, h] == 0).all()
        else:
            assert np.isfinite(lse[b, h, i]) and np.isfinite(out[b, i, h]).all(), (b, h, i)


def test_the_ring_s_in_place_merge_of_a_nan_lse_is_nan():
    """attngen.distributed merges torch parts in place (_merge_into): a NaN lse made the row
    out = 0 with lse NaN. Like merge: out and lse NaN, for that row only."""
    torch = pytest.importorskip("torch")
    from attngen.distributed import _merge_into
    g = torch.Generator().manual_seed(0)
    out, o = torch.randn((1, 4, 2, 3), generator=g), torch.randn((1, 4, 2, 3), generator=g)
    lse, l_ = torch.randn((1, 2, 4), generator=g), torch.randn((1, 2, 4), generator=g)
    l_[0, 1, 2] = float("nan")
    lse[0, 0, 3] = l_[0, 0, 3] = float("-inf")
    _merge_into(out, lse, (o, l_))
    for h, i in np.ndindex(2, 4):
        if (h, i) == (1, 2):
            assert torch.isnan(lse[0, h, i]) and torch.isnan(out[0, i, h]).all()
        elif (h, i) == (0, 3):
            assert lse[0, h, i] == float("-inf") and (out[0, i, h] == 0).all()
        else:
            assert torch.isfinite(lse[0, h, i]) and torch.isfinite(out[0, i, h]).all()
