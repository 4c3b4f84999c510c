"""attngen.torch operators are differentiable (issue 41, docs/backward.md): loss.backward()
through the operator eagerly, under torch.compile(fullgraph=True), and in a captured CUDA
graph of a training step; the gradients are attngen.reference_backward's. Needs a GPU."""

from __future__ import annotations

import numpy as np
import pytest

import attngen
import attngen.torch
from attngen.reference import relative_error, tolerance

from conftest import cuda_available, random_qkv, spec_of

pytestmark = pytest.mark.skipif(not cuda_available(), reason="no CUDA GPU with CuPy here")
torch = pytest.importorskip("torch") if cuda_available() else None


def _leaf(a):
    return torch.from_numpy(np.ascontiguousarray(a)).cuda().to(torch.float16).requires_grad_()


def _check(spec, q, k, v, dout, grads):
    want = attngen.reference_backward(spec, q.detach(), k.detach(), v.detach(), dout)
    for got, ref in zip(grads, want):
        assert relative_error(got.float().cpu().numpy(), ref) <= 2 * tolerance(spec)


@pytest.mark.parametrize("body", ["mask causal\n softcap 20.0", "mask window(left=31)\n scale 0.2", "mask none"])
def test_loss_backward_through_the_operator(body):
    spec = spec_of(f"head_dim 64\n dtype f16\n {body}", name="autograd_eager")
    op = attngen.torch.operator(attngen.compile(spec, target="cuda"))
    q, k, v = (_leaf(x) for x in random_qkv(spec, 2, 113, 97, heads_q=6, heads_kv=2))
    out = op(q, k, v)
    dout = torch.randn_like(out)
    out.backward(dout)
    _check(spec, q, k, v, dout, (q.grad, k.grad, v.grad))


def test_under_torch_compile_fullgraph():
    spec = spec_of("head_dim 64\n dtype f16\n mask causal", name="autograd_compiled")
    op = attngen.torch.operator(attngen.compile(spec, target="cuda"))
    q, k, v = (_leaf(x) for x in random_qkv(spec, 1, 70, 70, heads_q=4, heads_kv=4))
    dout = torch.randn((1, 70, 4, 64), device="cuda", dtype=torch.float16)
    step = torch.compile(lambda q, k, v: (op(q, k, v).float() * dout.float()).sum(), fullgraph=True)
    step(q, k, v).backward()
    _check(spec, q, k, v, dout, (q.grad, k.grad, v.grad))


def test_a_training_step_captured_in_a_cuda_graph():
    spec = spec_of("head_dim 64\n dtype f16\n mask causal", name="autograd_graph")
    op = attngen.torch.operator(attngen.compile(spec, target="cuda"))
    q, k, v = (_leaf(x) for x in random_qkv(spec, 1, 64, 64, heads_q=4, heads_kv=4))
    dout = torch.randn((1, 64, 4, 64), device="cuda", dtype=torch.float16)

    def step():
        for x in (q, k, v):
            x.grad = None
        op(q, k, v).backward(dout)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # warm-up: loads both modules
    torch.cuda.current_stream().wait_stream(s)
    for x in (q, k, v):
        x.grad = None  # the captured backward's gradients live in the graph's pool
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        op(q, k, v).backward(dout)
    with torch.no_grad():
        q.mul_(0.5)
    graph.replay()
    torch.cuda.synchronize()
    _check(spec, q, k, v, dout, (q.grad, k.grad, v.grad))


def test_lse_is_not_differentiated_and_paged_calls_say_so():
    spec = spec_of("head_dim 64\n dtype f16\n mask causal", name="autograd_lse")
    op = attngen.torch.operator(attngen.compile(spec, target="cuda"))
    q, k, v = (_leaf(x) for x in random_qkv(spec, 1, 16, 16, heads_q=2, heads_kv=2))
    out, lse = op(q, k, v, return_lse=True)
    assert not lse.requires_grad and out.requires_grad
