"""attngen.torch (docs/torch.md): a compiled kernel as a PyTorch operator, called eagerly, traced
by torch.compile(fullgraph=True) and captured in a CUDA graph. Needs a GPU and PyTorch."""

from __future__ import annotations

import numpy as np
import pytest

import attngen
import attngen.torch
from attngen.reference import reference, relative_error, tolerance

from conftest import cuda_available, random_qkv, spec_of

pytestmark = pytest.mark.skipif(not cuda_available(), reason="no CUDA GPU with CuPy here")
torch = pytest.importorskip("torch") if cuda_available() else None


def _t(a, dtype=None):
    return torch.from_numpy(np.ascontiguousarray(a)).cuda().to(dtype or torch.float16)


def _close(spec, out, *args, **kw):
    ref = reference(spec, *args, **kw)
    got = out.float().cpu().numpy()
    assert relative_error(got, ref) <= tolerance(spec)


def test_operator_eager_and_fake():
    spec = spec_of("head_dim 64\n dtype f16\n mask causal", name="op_eager")
    op = attngen.torch.operator(attngen.compile(spec, target="cuda"))
    q, k, v = random_qkv(spec, 2, 113, 113, heads_q=6, heads_kv=2)
    out, lse = op(_t(q), _t(k), _t(v), return_lse=True)
    assert out.shape == (2, 113, 6, 64) and lse.shape == (2, 6, 113)
    _close(spec, out, q, k, v)
    direct, _ = op.op(_t(q), _t(k), _t(v), None, None, None, None, -1, -1, False)  # through the dispatcher
    _close(spec, direct, q, k, v)
    # the fake implementation gives the same shapes without running anything
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(_t(a)) for a in (q, k, v))
        fo, fl = op.op(fq, fk, fv, None, None, None, None, -1, -1, True)
        assert tuple(fo.shape) == (2, 113, 6, 64) and tuple(fl.shape) == (2, 6, 113)


def test_torch_compile_fullgraph():
    spec = spec_of("head_dim 64\n dtype f16", name="op_compile")
    op = attngen.torch.operator(attngen.compile(spec, target="cuda"))
    q, k, v = random_qkv(spec, 1, 70, 70, heads_q=4, heads_kv=4)
    proj = torch.nn.Linear(64, 64, dtype=torch.float16, device="cuda")

    def block(q, k, v):
        return proj(op(q, k, v)) + 1.0

    compiled = torch.compile(block, fullgraph=True)
    tq, tk, tv = _t(q), _t(k), _t(v)
    with torch.no_grad():
        got = compiled(tq, tk, tv)
        want = block(tq, tk, tv)
    torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)


def test_cuda_graph_capture_and_replay():
    spec = spec_of("head_dim 64\n dtype f16\n schedule split_kv(auto)\n kv_cache paged(page=16)", name="op_graph")
    op = attngen.torch.operator(attngen.compile(spec, target="cuda"))
    rng = np.random.default_rng(3)
    b, hq, hkv, pages = 4, 8, 2, 40
    q = rng.standard_normal((b, 1, hq, 64)).astype(np.float32)
    k = rng.standard_normal((pages, 16, hkv, 64)).astype(np.float32)
    v = rng.standard_normal((pages, 16, hkv, 64)).astype(np.float32)
    table = rng.permutation(pages).astype(np.int32).reshape(b, 10)
    lens = np.array([1, 160, 37, 99], np.int32)
    sq, sk, sv = _t(q), _t(k), _t(v)
    st, sl = _t(table, torch.int32), _t(lens, torch.int32)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (plans the launch) before the capture, as torch asks
        op(sq, sk, sv, kv_lens=sl, block_table=st)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = op(sq, sk, sv, kv_lens=sl, block_table=st)
    for seed in range(2):  # new contents in the captured buffers, then replay
        r = np.random.default_rng(10 + seed)
        q2 = r.standard_normal(q.shape).astype(np.float32)
        lens2 = np.array([160, 3, 80, 1], np.int32) if seed else lens
        sq.copy_(_t(q2))
        sl.copy_(_t(lens2, torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        _close(spec, out, q2, k, v, kv_lens=lens2, block_table=table)


def test_append_operator_mutates_the_cache():
    spec = spec_of("head_dim 32\n dtype f16", name="op_append")
    op = attngen.torch.operator(attngen.compile(spec, target="cuda"))
    rng = np.random.default_rng(4)
    q = rng.standard_normal((2, 2, 4, 32)).astype(np.float32)
    k = rng.standard_normal((2, 12, 2, 32)).astype(np.float32)
    v = rng.standard_normal((2, 12, 2, 32)).astype(np.float32)
    kn = rng.standard_normal((2, 2, 2, 32)).astype(np.float32)
    vn = rng.standard_normal((2, 2, 2, 32)).astype(np.float32)
    lens = np.array([3, 10], np.int32)
    tk, tv = _t(k), _t(v)
    out = op(_t(q), tk, tv, kv_lens=_t(lens, torch.int32), k_new=_t(kn), v_new=_t(vn))
    k_after, v_after = k.copy(), v.copy()
    for b in range(2):
        k_after[b, lens[b]:lens[b] + 2] = kn[b]
        v_after[b, lens[b]:lens[b] + 2] = vn[b]
    np.testing.assert_allclose(tk.float().cpu().numpy(), k_after.astype(np.float16).astype(np.float32))
    _close(spec, out, q, k_after, v_after, kv_lens=lens + 2)


def test_custom_mask_kernels_say_they_are_not_operators():
    spec = spec_of("head_dim 32\n dtype f16\n mask custom", name="op_mask")
    with pytest.raises(attngen.LaunchError, match="mask custom"):
        attngen.torch.operator(attngen.compile(spec, target="cuda"))
