"""The WGSL backward (issue 41; docs/backward.md, "wgsl"): Kernel.backward against the float64
reference_backward on the live adapter (lavapipe in CI), with twice the forward's tolerance per
gradient (relative L2): odd lengths (1, 7, 113), Lq != Lk, GQA groups 1, 3 and 4, every
structured mask, softcap, scale, unequal head dims, f32 and f16 (native and packed in u32 words),
kv_lens, packed sequences, custom masks (boolean and additive), hidden keys holding inf / NaN,
rows that see no key; and the inputs it refuses."""

from __future__ import annotations

import numpy as np
import pytest

import attngen
from attngen.errors import LaunchError
from attngen.reference import reference_backward, relative_error, tolerance

from conftest import kernel_for, require, spec_of

NP = {"f16": np.float16, "f32": np.float32}


def _draw(rng, shape, dtype):
    return rng.standard_normal(shape).astype(NP[dtype])


def _run(spec, q, k, v, *, seed=0, ref_kw=None, **kw):
    """The kernel's gradients and the reference's, for a forward call with the options `kw`."""
    kernel = kernel_for(spec, "wgsl")
    out, lse = kernel(q, k, v, return_lse=True, **kw)
    dout = _draw(np.random.default_rng(seed + 99), out.shape, spec.dtype)
    got = kernel.backward(q, k, v, out, lse, dout, **kw)
    ref = reference_backward(spec, *(x.astype(np.float64) for x in (q, k, v, dout)), **(ref_kw or kw))
    return got, ref


def _check(spec, got, ref):
    tol = 2 * tolerance(spec)
    errors = {name: relative_error(g, r) for name, g, r in zip(("dq", "dk", "dv"), got, ref)}
    for g, r in zip(got, ref):
        assert g.shape == r.shape and g.dtype == NP[spec.dtype]
    assert all(e <= tol for e in errors.values()), f"{errors} above {tol}"


CASES = [
    # (id, spec body, B, Lq, Lk, Hq, Hkv)
    ("plain-7x113-g3", "head_dim 32", 2, 7, 113, 6, 2),
    ("causal-113-g4", "head_dim 32\n mask causal", 1, 113, 113, 4, 1),
    ("causal-Lq>Lk", "head_dim 16\n mask causal", 2, 17, 7, 3, 3),
    ("bottom-right-1x113", "head_dim 32\n mask causal(bottom_right)", 2, 1, 113, 3, 1),
    ("bottom-right-Lq>Lk", "head_dim 16\n mask causal(bottom_right)", 1, 19, 7, 2, 2),
    ("window-softcap-scale", "head_dim 32\n mask window(left=9, right=3)\n softcap 2.0\n scale 0.7", 2, 37, 50, 6, 2),
    ("window-left-only", "head_dim 16\n mask window(left=4)", 1, 113, 40, 2, 1),
    ("softcap-large", "head_dim 16\n softcap 30", 1, 7, 7, 4, 4),
    ("unequal-192-128", "head_dim qk=192 v=128\n mask causal", 1, 7, 9, 2, 1),
    ("unequal-48-32", "head_dim qk=48 v=32\n mask causal(bottom_right)", 1, 13, 21, 3, 1),
]


# f16 on half of them (each case's kernels compile once per dtype: lavapipe's time)
F16_CASES = ("causal-113-g4", "bottom-right-Lq>Lk", "window-softcap-scale", "unequal-48-32", "plain-7x113-g3")


@pytest.mark.parametrize("case, dtype", [(c, "f32") for c in CASES] + [(c, "f16") for c in CASES if c[0] in F16_CASES],
                         ids=[f"{c[0]}-f32" for c in CASES] + [f"{c[0]}-f16" for c in CASES if c[0] in F16_CASES])
def test_matches_reference(case, dtype):
    require("wgsl")
    _, body, b, lq, lk, hq, hkv = case
    spec = spec_of(f"{body}\n dtype {dtype}")
    rng = np.random.default_rng(lq * 1000 + lk)
    q = _draw(rng, (b, lq, hq, spec.head_dim_qk), dtype)
    k = _draw(rng, (b, lk, hkv, spec.head_dim_qk), dtype)
    v = _draw(rng, (b, lk, hkv, spec.head_dim_v), dtype)
    _check(spec, *_run(spec, q, k, v))


@pytest.mark.parametrize("body", ["mask causal(bottom_right)\n softcap 5.0", "mask window(left=5, right=2)"])
def test_f16_packed_in_words(body):
    """f16 storage without shader-f16 (target wgsl { f16=packed }): the gradients are written as
    pairs of f16 in u32 words."""
    require("wgsl")
    spec = spec_of(f"head_dim qk=24 v=16\n dtype f16\n {body}\n target wgsl {{ f16=packed }}")
    assert kernel_for(spec, "wgsl").plan.details.f16_packed
    rng = np.random.default_rng(3)
    q, k, v = (_draw(rng, (2, n, h, d), "f16") for n, h, d in ((7, 3, 24), (23, 1, 24), (23, 1, 16)))
    _check(spec, *_run(spec, q, k, v))


def test_kv_lens():
    """Keys past a sequence's kv_lens get zero gradients, whatever they hold."""
    require("wgsl")
    spec = spec_of("head_dim 16\n dtype f32\n mask causal(bottom_right)")
    rng = np.random.default_rng(4)
    q, k, v = _draw(rng, (3, 5, 4, 16), "f32"), _draw(rng, (3, 40, 2, 16), "f32"), _draw(rng, (3, 40, 2, 16), "f32")
    lens = np.array([40, 1, 17], np.int32)
    for b, n in enumerate(lens):
        k[b, n:] = np.nan
        v[b, n:] = np.inf
    got, ref = _run(spec, q, k, v, kv_lens=lens)
    _check(spec, got, ref)
    assert not got[1][1, 1:].any() and not got[2][2, 17:].any()


@pytest.mark.parametrize("mask", ["causal", "window(left=3, right=1)"])
def test_packed_sequences(mask):
    require("wgsl")
    spec = spec_of(f"head_dim qk=16 v=8\n dtype f32\n mask {mask}")
    rng = np.random.default_rng(5)
    cu_q, cu_k = np.array([0, 5, 5, 26], np.int32), np.array([0, 9, 10, 23], np.int32)
    q, k, v = _draw(rng, (26, 6, 16), "f32"), _draw(rng, (23, 2, 16), "f32"), _draw(rng, (23, 2, 8), "f32")
    got, ref = _run(spec, q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    _check(spec, got, ref)
    assert not got[1][9].any() and not got[2][9].any()  # sequence 1 has no query: its key gets nothing


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_custom_mask(kind):
    """Step 3 follows the q tile's BlockMask list; step 2 finds its kv tile in each q tile's list."""
    require("wgsl")
    spec = spec_of("head_dim 16\n dtype f32\n mask custom")
    rng = np.random.default_rng(6)
    b, lq, lk, hq, hkv = 2, 45, 70, 4, 2
    q, k, v = _draw(rng, (b, lq, hq, 16), "f32"), _draw(rng, (b, lk, hkv, 16), "f32"), _draw(rng, (b, lk, hkv, 16), "f32")
    keep = rng.random((b, hq, lq, lk)) > 0.5
    keep[:, :, :, 20:40] = False  # whole kv tiles skipped by the lists
    keep[0, 1, 3] = False  # a row that sees no key
    mask = keep if kind == "bool" else np.where(keep, rng.standard_normal(keep.shape), -np.inf).astype(np.float32)
    got, ref = _run(spec, q, k, v, mask=mask)
    _check(spec, got, ref)
    assert not got[0][0, 3, 1].any()


def test_hidden_keys_do_not_leak_and_empty_rows_give_zero():
    """inf and NaN in keys a row does not see never reach its gradients (keys no row sees: no
    gradient at all, bit for bit the clean result); a row that sees no key gets zero dq."""
    require("wgsl")
    rng = np.random.default_rng(7)
    # causal, Lq 8 < Lk 12: keys 8-11 are hidden from every row
    spec = spec_of("head_dim 16\n dtype f32\n mask causal")
    kernel = kernel_for(spec, "wgsl")
    q, k, v = _draw(rng, (1, 8, 2, 16), "f32"), _draw(rng, (1, 12, 2, 16), "f32"), _draw(rng, (1, 12, 2, 16), "f32")
    out, lse = kernel(q, k, v, return_lse=True)
    dout = _draw(rng, out.shape, "f32")
    clean = kernel.backward(q, k, v, out, lse, dout)
    k2, v2 = k.copy(), v.copy()
    k2[0, 8:], v2[0, 9:] = np.nan, np.inf
    v2[0, 8] = -np.inf
    poisoned = kernel.backward(q, k2, v2, out, lse, dout)
    assert all(np.array_equal(a, b) for a, b in zip(clean, poisoned))
    assert not clean[1][0, 8:].any() and not clean[2][0, 8:].any()
    # bottom-right, Lq 20 > Lk 12: rows 0-7 see no key; key 11 is seen by row 19 alone
    spec = spec_of("head_dim 16\n dtype f32\n mask causal(bottom_right)")
    kernel = kernel_for(spec, "wgsl")
    q, k, v = _draw(rng, (1, 20, 2, 16), "f32"), _draw(rng, (1, 12, 2, 16), "f32"), _draw(rng, (1, 12, 2, 16), "f32")
    got, ref = _run(spec, q, k, v)
    _check(spec, got, ref)
    assert not got[0][0, :8].any()
    k[0, 11], v[0, 11] = np.nan, np.inf
    out, lse = kernel(q, k, v, return_lse=True)
    dq, _, _ = kernel.backward(q, k, v, out, lse, _draw(rng, out.shape, "f32"))
    assert np.isfinite(dq[0, :19]).all() and not dq[0, :8].any()  # row 19 saw the NaN: NaN in, NaN out


def test_deterministic_and_on_device_tensors():
    """Two calls give the same bits; WgslTensor inputs give WgslTensor gradients."""
    require("wgsl")
    from attngen.backends.wgsl import WgslTensor
    spec = spec_of("head_dim 16\n dtype f32\n mask causal")
    kernel = kernel_for(spec, "wgsl")
    rng = np.random.default_rng(8)
    q, k, v = _draw(rng, (1, 33, 4, 16), "f32"), _draw(rng, (1, 33, 2, 16), "f32"), _draw(rng, (1, 33, 2, 16), "f32")
    out, lse = kernel(q, k, v, return_lse=True)
    dout = _draw(rng, out.shape, "f32")
    first = kernel.backward(q, k, v, out, lse, dout)
    second = kernel.backward(q, k, v, out, lse, dout)
    assert all(np.array_equal(a, b) for a, b in zip(first, second))
    dev = [WgslTensor.from_numpy(x) for x in (q, k, v, out, lse, dout)]
    on_gpu = kernel.backward(*dev)
    assert all(isinstance(g, WgslTensor) for g in on_gpu)
    assert all(np.array_equal(g.numpy(), a) for g, a in zip(on_gpu, first))


def test_bad_inputs_are_refused():
    require("wgsl")
    spec = spec_of("head_dim 16\n dtype f32\n mask causal")
    kernel = kernel_for(spec, "wgsl")
    rng = np.random.default_rng(9)
    q, k, v = _draw(rng, (2, 9, 2, 16), "f32"), _draw(rng, (2, 11, 2, 16), "f32"), _draw(rng, (2, 11, 2, 16), "f32")
    out, lse = kernel(q, k, v, return_lse=True)
    dout = _draw(rng, out.shape, "f32")
    with pytest.raises(LaunchError, match="dout"):
        kernel.backward(q, k, v, out, lse, dout[:, :8])
    with pytest.raises(LaunchError, match="dout"):
        kernel.backward(q, k, v, out, lse, dout.astype(np.float16))
    with pytest.raises(LaunchError, match="out"):
        kernel.backward(q, k, v, out[:1], lse, dout)
    other_lse = kernel(q[:, :5], k, v, return_lse=True)[1]  # another call's lse: (2, 2, 5)
    with pytest.raises(LaunchError, match="lse"):
        kernel.backward(q, k, v, out, other_lse, dout)
    with pytest.raises(LaunchError, match="lse"):
        kernel.backward(q, k, v, out, lse.astype(np.float16), dout)
    with pytest.raises(LaunchError, match="k"):
        kernel.backward(q, k[:, :, :1], v, out, lse, dout)
    with pytest.raises(LaunchError, match="mask"):
        kernel.backward(q, k, v, out, lse, dout, mask=np.ones((2, 2, 9, 11), bool))


def test_paged_specs_have_no_backward():
    require("wgsl")
    spec = spec_of("head_dim 16\n dtype f32\n kv_cache paged(page=16)")
    kernel = kernel_for(spec, "wgsl")
    rng = np.random.default_rng(10)
    q, k, v = _draw(rng, (1, 3, 2, 16), "f32"), _draw(rng, (2, 16, 2, 16), "f32"), _draw(rng, (2, 16, 2, 16), "f32")
    opts = {"kv_lens": np.array([20], np.int32), "block_table": np.array([[0, 1]], np.int32)}
    out, lse = kernel(q, k, v, return_lse=True, **opts)
    with pytest.raises(LaunchError, match="paged"):
        kernel.backward(q, k, v, out, lse, out, kv_lens=opts["kv_lens"])
    assert "backward" not in attngen.backends.get("wgsl").helper_sources(kernel.plan)
    assert kernel.manifest["backward"]["available"] is False


def test_split_schedule_forward():
    """The backward of a split_kv kernel (its out and lse are the same function; its Params have
    the splits field), with a custom mask shared by all heads and GQA 3."""
    require("wgsl")
    spec = spec_of("head_dim 16\n dtype f32\n mask custom\n schedule split_kv(2)")
    rng = np.random.default_rng(11)
    q, k, v = _draw(rng, (1, 20, 3, 16), "f32"), _draw(rng, (1, 37, 1, 16), "f32"), _draw(rng, (1, 37, 1, 16), "f32")
    keep = rng.random((1, 1, 20, 37)) > 0.3
    _check(spec, *_run(spec, q, k, v, mask=keep))


def test_loops_cut_short_by_the_software_adapter_are_refused():
    """Mesa's llvmpipe ends all loops of a shader after 65535 iterations: a step cut short marks
    the workspace's last word, and the call raises instead of returning a wrong gradient."""
    require("wgsl")
    from attngen.backends.wgsl.devices import device_state
    if device_state().loop_budget is None:
        pytest.skip("this adapter does not cut loops short (only Mesa's llvmpipe does)")
    spec = spec_of("head_dim 256\n dtype f32")  # blocks of 4 x 2: many passes per workgroup
    kernel = kernel_for(spec, "wgsl")
    rng = np.random.default_rng(12)
    q, k, v = _draw(rng, (1, 4, 1, 256), "f32"), _draw(rng, (1, 2048, 1, 256), "f32"), _draw(rng, (1, 2048, 1, 256), "f32")
    out, lse = kernel(q, k, v, return_lse=True)
    with pytest.raises(LaunchError, match="cut short"):
        kernel.backward(q, k, v, out, lse, out)
