"""What the CUDA backward's tests share: random inputs, kernel.backward against
attngen.reference_backward within twice the forward's tolerance for the dtype (check_backward and
the checks built on it: packed sequences, kv_lens with hidden keys holding inf / NaN, a NaN key,
custom masks, the two families against each other), the kernel of a backward family (skipping
where this GPU's plan takes another). The CPU emulations' part (g++ builds of a generated
source, the backward's Args filled with host addresses) is in tests/cuda_emulation.py.

The GPU checks need CuPy (tests/equivalence/test_backward_*.py call them after require("cuda") or
family_kernel(), which skip without a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

import attngen
from attngen.reference import reference_backward, relative_error, to_numpy, tolerance

from conftest import kernel_for, require, to_device


def to_np(x):
    """A kernel's array (CuPy, PyTorch or numpy) as a float64 numpy array."""
    return np.asarray(to_numpy(x), dtype=np.float64)


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def ints(a):
    """int32 on the GPU (kv_lens, cu_seqlens)."""
    import cupy
    return cupy.asarray(np.asarray(a, dtype=np.int32))


def device_mask(m):
    import cupy
    return cupy.asarray(m)


def qkv(spec, rng, b, lq, lk, hq=6, hkv=2):
    """Random q (b, lq, hq, d_qk), k (b, lk, hkv, d_qk), v (b, lk, hkv, d_v), float32, in that order."""
    return (rand(rng, b, lq, hq, spec.head_dim_qk), rand(rng, b, lk, hkv, spec.head_dim_qk),
            rand(rng, b, lk, hkv, spec.head_dim_v))


def documents(lq, lk, rng):
    """A boolean (lq, lk) mask: three documents along both axes, 70 % of each one's pairs visible."""
    docs = 3
    same = (np.arange(lq)[:, None] * docs // lq) == (np.arange(lk)[None, :] * docs // lk)
    return same & (rng.random((lq, lk)) < 0.7)


def family_kernel(spec, family, *, wide=False, profile=None):
    """`spec`'s kernel for this GPU, whose backward is of `family` ("wgmma", "mma", "fma"; `wide`:
    the head-dim-256 wgmma kernel); skips without a GPU, or where this GPU's plan takes another
    family. With `profile`: built with that profile (compiled for this GPU's arch), whose forward
    math picks the family on any GPU: another family fails the test."""
    require("cuda")
    from attngen.backends.cuda import backward as cuda_backward
    if profile is not None:
        kernel = _profile_kernel(spec, profile)
        assert cuda_backward.family(kernel.plan) == family, kernel.plan.details
        return kernel
    kernel = kernel_for(spec, "cuda")
    if cuda_backward.family(kernel.plan) != family or (wide and not cuda_backward.wide(kernel.plan)):
        pytest.skip(f"not the {family} backward{' at head dim 256' if wide else ''} on this GPU (its plan is "
                    f"{kernel.plan.details.arch}; the wgmma family runs on sm_90)")
    return kernel


_PROFILE_KERNELS: dict = {}


def _profile_kernel(spec, profile):
    key = (spec, profile)
    if key not in _PROFILE_KERNELS:
        _PROFILE_KERNELS[key] = attngen.compile(spec, target="cuda", profile=profile)
    return _PROFILE_KERNELS[key]


def check_backward(spec, q, k, v, *, call=None, ref_kw=None, seed=1, inputs=None, kernel=None):
    """Forward (out, lse), then kernel.backward with a random dout; every gradient against the
    reference: shape, dtype, kind of array, finite, relative L2 <= 2 x the forward's tolerance.
    `inputs`: the device q, k, v to pass (default: q, k, v in the spec's dtype); `kernel`: the
    compiled kernel (default: the spec's, for this GPU). Returns the kernel's gradients (numpy) and
    the reference's."""
    call, ref_kw = call or {}, ref_kw or {}
    kernel = kernel or kernel_for(spec, "cuda")
    dq_in, dk_in, dv_in = inputs if inputs is not None else to_device("cuda", spec.dtype, q, k, v)
    out, lse = kernel(dq_in, dk_in, dv_in, return_lse=True, **call)
    dout = rand(np.random.default_rng(seed), *out.shape)
    (dout_in,) = to_device("cuda", spec.dtype, dout)
    if type(out).__module__.startswith("torch") and not type(dout_in).__module__.startswith("torch"):
        import torch
        dout_in = torch.as_tensor(dout, device=out.device).to(out.dtype)
    grads = kernel.backward(dq_in, dk_in, dv_in, out, lse, dout_in, **call)
    want = reference_backward(spec, q, k, v, dout, **ref_kw)
    bound = 2 * tolerance(spec)
    got_np = []
    for got, w, name, like in zip(grads, want, ("dq", "dk", "dv"), (dq_in, dk_in, dv_in)):
        assert type(got) is type(like), f"{name} is of the inputs' kind"
        assert tuple(got.shape) == tuple(like.shape) and got.dtype == like.dtype, name
        g = to_np(got)
        assert np.isfinite(g).all(), f"{name}: inf or NaN"
        if not np.any(w):  # every row sees no key, or each sees one key (dS = P (dP - D) cancels to 0
            # in float64; the kernel's P and D round): zeros up to the bound, in dout's units
            assert np.abs(g).max() <= bound, f"{name}: the reference's gradient is 0, the kernel's is not"
        else:
            err = relative_error(g, w)
            assert err <= bound, f"{spec.name} {name}: relative L2 error {err:.3g} > {bound:g}"
        got_np.append(g)
    return got_np, want


def check_case(case, kernel=None):
    """A (label, spec body, Hq, Hkv, Lq, Lk, B) case: inputs drawn from the seed len(label), then
    check_backward (with `kernel`, a function of the spec, that kernel)."""
    from conftest import spec_of
    name, body, hq, hkv, lq, lk, b = case
    spec = spec_of(body)
    compiled = kernel(spec) if kernel else None
    check_backward(spec, *qkv(spec, np.random.default_rng(len(name)), b, lq, lk, hq, hkv), kernel=compiled)


def check_packed(spec, lq, lk, rng, hq=6, hkv=2, kernel=None):
    """check_backward on packed sequences of these lengths (cu_seqlens_q and _k)."""
    cuq = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    cuk = np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)
    q, k, v = rand(rng, cuq[-1], hq, spec.head_dim_qk), rand(rng, cuk[-1], hkv, spec.head_dim_qk), \
        rand(rng, cuk[-1], hkv, spec.head_dim_v)
    check_backward(spec, q, k, v, call={"cu_seqlens_q": ints(cuq), "cu_seqlens_k": ints(cuk)},
                   ref_kw={"cu_seqlens_q": cuq, "cu_seqlens_k": cuk}, kernel=kernel)



def check_packed_next_sequence_nan(spec, kernel, lq=(70, 130), lk=(90, 100), hq=3, hkv=1):
    """The fast family reads Q and dO through tensor maps, whose boxes of a step's rows read on past a
    packed sequence's end into the next sequence's rows; those rows are zeroed before any product.
    With the second sequence's q and dout holding NaN, the first sequence's gradients are finite and
    equal to those of the same call with the second sequence's rows finite (dq up to the order of
    its f32 reductions). f16 inputs."""
    import cupy
    rng = np.random.default_rng(12)
    d_qk, d_v = spec.head_dim_qk, spec.head_dim_v
    cuq, cuk = (np.concatenate([[0], np.cumsum(x)]).astype(np.int32) for x in (lq, lk))
    call = {"cu_seqlens_q": cupy.asarray(cuq), "cu_seqlens_k": cupy.asarray(cuk)}
    q = cupy.asarray(rng.standard_normal((cuq[-1], hq, d_qk))).astype(cupy.float16)
    k = cupy.asarray(rng.standard_normal((cuk[-1], hkv, d_qk))).astype(cupy.float16)
    v = cupy.asarray(rng.standard_normal((cuk[-1], hkv, d_v))).astype(cupy.float16)
    out, lse = kernel(q, k, v, return_lse=True, **call)
    dout = cupy.asarray(rng.standard_normal(out.shape)).astype(cupy.float16)
    clean = [cupy.asnumpy(g).astype(np.float64) for g in kernel.backward(q, k, v, out, lse, dout, **call)]
    q[lq[0]:] = np.nan
    dout[lq[0]:] = np.nan
    out2, lse2 = kernel(q, k, v, return_lse=True, **call)
    got = [cupy.asnumpy(g).astype(np.float64) for g in kernel.backward(q, k, v, out2, lse2, dout, **call)]
    rows, keys = slice(0, lq[0]), slice(0, lk[0])
    for name, g, c, part in zip(("dq", "dk", "dv"), got, clean, (rows, keys, keys)):
        assert np.isfinite(g[part]).all(), f"{name}: the next sequence's NaN reached the first's"
        if name == "dq":
            assert np.abs(g[part] - c[part]).max() <= 1e-3 * np.abs(c[part]).max()
        else:
            assert np.array_equal(g[part], c[part]), name

def check_kv_lens_hidden_keys(spec, q, k, v, lens, kernel=None):
    """Keys past kv_lens (`lens`, one per batch entry) hold inf in k and NaN in v: check_backward,
    and those keys get dk = dv = 0 exactly; the rows of an entry with no key get dq = 0 exactly.
    Returns the kernel's gradients."""
    lens = np.asarray(lens, np.int32)
    for bi, n in enumerate(lens):
        k[bi, n:] = np.inf
        v[bi, n:] = np.nan
    (dq, dk, dv), _ = check_backward(spec, q, k, v, call={"kv_lens": ints(lens)}, ref_kw={"kv_lens": lens},
                                     kernel=kernel)
    for bi, n in enumerate(lens):
        assert not dk[bi, n:].any() and not dv[bi, n:].any()
        if n == 0:
            assert not dq[bi].any()  # no keys: no gradient
    return dq, dk, dv


def check_nan_keys(spec, kernel, q, k, v, rng, seen, unseen):
    """f16 q, k, v (holding the NaN / inf the caller put in batch entry 0's keys) through the forward
    and kernel.backward with a random dout: entry 0's rows `unseen` (that see none of those keys)
    get the reference's dq, finite; some of its rows `seen` get NaN (NaN in, NaN out)."""
    import cupy
    qd, kd, vd = (cupy.asarray(x).astype(cupy.float16) for x in (q, k, v))
    out, lse = kernel(qd, kd, vd, return_lse=True)
    dout = rand(rng, *out.shape)
    dq = cupy.asnumpy(kernel.backward(qd, kd, vd, out, lse, cupy.asarray(dout).astype(cupy.float16))[0])
    want = attngen.reference_backward(spec, q, k, v, dout)[0]
    assert np.isfinite(dq[0, unseen]).all()
    assert relative_error(dq[0, unseen].astype(np.float64), want[0, unseen]) <= 2 * tolerance(spec)
    assert np.isnan(dq[0, seen]).any()


def check_custom_mask_across_key_blocks(spec, kernel, kind):
    """A custom mask (`kind`: "additive", one per batch entry, or "boolean per head") on 2 x 300
    rows and 350 keys, 3 query heads on one KV head, whose BlockMask tiles straddle the kernel's key
    blocks: rows 0-127 of keys 0-159 whole tiles, full; rows that see no key (row 3 of the additive
    mask, 150-159 of the boolean one) get dq = 0, keys no row sees (from 320, from 340) dk = dv = 0."""
    rng = np.random.default_rng(7)
    b, lq, lk, hq, hkv = 2, 300, 350, 3, 1
    q, k, v = qkv(spec, rng, b, lq, lk, hq, hkv)
    if kind == "additive":
        m = np.where(documents(lq, lk, rng)[None, None], rng.standard_normal((b, 1, lq, lk)), -np.inf)
        m = m.astype(np.float32)
        m[:, :, 3] = -np.inf
        m[:, :, :, 320:] = -np.inf
    else:
        m = np.stack([documents(lq, lk, rng) for _ in range(hq)])[None]
        m[..., :128, :160] = True  # whole BlockMask tiles, full
        m[..., 150:160, :] = False
        m[..., 340:] = False
    bm = attngen.block_mask(device_mask(m), kernel)
    (dq, dk, dv), _ = check_backward(spec, q, k, v, call={"mask": bm}, ref_kw={"mask": m})
    rows = slice(3, 4) if kind == "additive" else slice(150, 160)
    assert not dq[:, rows].any()
    keys = slice(320, None) if kind == "additive" else slice(340, None)
    assert not dk[:, keys].any() and not dv[:, keys].any()


def check_families_agree(fast, slow, q, k, v, fast_kernel=None, slow_kernel=None):
    """`slow` is `fast` with backward=deterministic (CUDA cores, no atomics): both within tolerance
    of the reference (check_backward), and of each other (relative L2 <= 2e-3 per gradient)."""
    from attngen.backends.cuda import backward as cuda_backward
    assert cuda_backward.family((slow_kernel or kernel_for(slow, "cuda")).plan) == "fma"
    got, _ = check_backward(fast, q, k, v, kernel=fast_kernel)
    again, _ = check_backward(slow, q, k, v, kernel=slow_kernel)
    for a, b_ in zip(got, again):
        assert np.linalg.norm(a - b_) <= 2e-3 * np.linalg.norm(b_)
