"""attngen.reference_backward: the float64 gradients every backward kernel is held to, checked
against PyTorch's float64 autograd of the same function, variant by variant (issue 41)."""

from __future__ import annotations

import numpy as np
import pytest

import attngen
from attngen.errors import LaunchError
from attngen.reference import reference, reference_backward, structured_mask

torch = pytest.importorskip("torch")


def _autograd(spec, q, k, v, dout, mask=None, kv_lens=None, cu=None):
    """PyTorch float64 autograd of attention with the spec's mask, per sequence, GQA by repeat."""
    qt, kt, vt = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    hq, hkv = q.shape[-2], k.shape[-2]

    def one(qb, kb, vb, b):
        g = hq // hkv
        kb, vb = kb.repeat_interleave(g, dim=1), vb.repeat_interleave(g, dim=1)
        s = torch.einsum("ihd,jhd->hij", qb, kb) * spec.resolved_scale
        if spec.softcap:
            s = spec.softcap * torch.tanh(s / spec.softcap)
        ok = torch.ones(s.shape, dtype=torch.bool)
        vis = structured_mask(spec, qb.shape[0], kb.shape[0])
        if vis is not None:
            ok &= torch.tensor(vis)[None]
        if mask is not None:
            m = np.broadcast_to(mask, (q.shape[0], hq) + mask.shape[-2:])[b][:, :qb.shape[0], :kb.shape[0]]
            ok &= torch.tensor(np.ascontiguousarray(m))
        p = torch.softmax(s.masked_fill(~ok, -torch.inf), -1).nan_to_num(0.0)
        return torch.einsum("hij,jhd->ihd", p, vb)

    if cu is None:
        o = torch.stack([one(qt[b], kt[b, :(k.shape[1] if kv_lens is None else kv_lens[b])],
                             vt[b, :(k.shape[1] if kv_lens is None else kv_lens[b])], b) for b in range(q.shape[0])])
    else:
        o = torch.cat([one(qt[cu[i]:cu[i + 1]], kt[cu[i]:cu[i + 1]], vt[cu[i]:cu[i + 1]], i)
                       for i in range(len(cu) - 1)])
    o.backward(torch.tensor(dout))
    return o.detach().numpy(), qt.grad.numpy(), kt.grad.numpy(), vt.grad.numpy()


CASES = [
    ("plain", "", {}),
    ("causal", "mask causal", {}),
    ("causal, Lq > Lk", "mask causal", {"lq": 17, "lk": 13}),
    ("bottom-right", "mask causal(bottom_right)", {"lq": 7, "lk": 19}),
    ("window, softcap, scale", "mask window(left=3, right=2)\n softcap 2.0\n scale 0.7", {}),
    ("custom", "mask custom", {"mask": True}),
    ("kv_lens", "mask causal(bottom_right)", {"kv_lens": [9, 17]}),
    ("packed", "mask causal", {"cu": [0, 5, 5, 21]}),
    ("MQA, 1 row", "mask causal(bottom_right)\n softcap 30.0", {"lq": 1, "hkv": 1}),
]


def _inputs(case, seed=0):
    _, _, o = case
    rng = np.random.default_rng(seed)
    b, lq, lk, hq, hkv = 2, o.get("lq", 13), o.get("lk", 17), 6, o.get("hkv", 2)  # groups of 3 (or 6)
    if "cu" in o:
        n = o["cu"][-1]
        q, k, v = (rng.standard_normal((n, h, d)) for h, d in ((hq, 16), (hkv, 16), (hkv, 8)))
    else:
        q, k, v = (rng.standard_normal((b, n, h, d)) for n, h, d in ((lq, hq, 16), (lk, hkv, 16), (lk, hkv, 8)))
    q, k, v = (x.astype(np.float32).astype(np.float64) for x in (q, k, v))
    mask = rng.random((b, 1, lq, lk)) > 0.6 if o.get("mask") else None
    return q, k, v, mask, o.get("kv_lens"), o.get("cu"), rng


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_gradients_equal_autograds(case):
    name, body, _ = case
    spec = attngen.parse(f"attention t {{\n head_dim qk=16 v=8\n dtype f32\n {body}\n}}\n")[0]
    q, k, v, mask, kv_lens, cu, rng = _inputs(case)
    out = reference(spec, q, k, v, mask=mask, kv_lens=kv_lens, cu_seqlens_q=cu)
    dout = rng.standard_normal(out.shape).astype(np.float32).astype(np.float64)
    grads = reference_backward(spec, q, k, v, dout, mask=mask, kv_lens=kv_lens, cu_seqlens_q=cu)
    o, *want = _autograd(spec, q, k, v, dout, mask, kv_lens, cu)
    np.testing.assert_allclose(out, o, atol=1e-12)
    for got, w, what in zip(grads, want, ("dq", "dk", "dv")):
        assert got.shape == w.shape, what
        np.testing.assert_allclose(got, w, atol=1e-10, err_msg=what)


def test_hidden_keys_holding_inf_and_nan_do_not_reach_any_gradient():
    spec = attngen.parse("attention t {\n head_dim qk=16 v=8\n dtype f32\n mask causal(bottom_right)\n}\n")[0]
    q, k, v, _, _, _, rng = _inputs(("", "", {}))
    lens = [9, 17]
    dout = rng.standard_normal((2, 13, 6, 8))
    clean = reference_backward(spec, q, k, v, dout, kv_lens=lens)
    k2, v2 = k.copy(), v.copy()
    k2[0, 9:] = np.inf
    v2[0, 9:] = np.nan
    poisoned = reference_backward(spec, q, k2, v2, dout, kv_lens=lens)
    for a, b in zip(clean, poisoned):
        assert np.array_equal(a, b)
    assert np.all(clean[1][0, 9:] == 0) and np.all(clean[2][0, 9:] == 0)  # keys past kv_lens: no gradient
    assert all(np.isfinite(g).all() for g in clean)


def test_rows_that_see_no_key_pass_no_gradient():
    spec = attngen.parse("attention t {\n head_dim 16\n dtype f32\n mask custom\n}\n")[0]
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 5, 2, 16)) for _ in range(3))
    mask = np.ones((1, 1, 5, 5), bool)
    mask[..., 2, :] = False  # row 2 sees nothing
    dq, dk, dv = reference_backward(spec, q, k, v, rng.standard_normal((1, 5, 2, 16)), mask=mask)
    assert np.all(dq[0, 2] == 0) and np.isfinite(dk).all() and np.isfinite(dv).all()


def test_dout_of_another_shape_is_refused():
    spec = attngen.parse("attention t {\n head_dim 16\n dtype f32\n}\n")[0]
    q = np.zeros((1, 4, 2, 16))
    with pytest.raises(LaunchError, match="dout has shape"):
        reference_backward(spec, q, q, q, np.zeros((1, 4, 2, 8)))
