"""Probe (issue 41): the fast CUDA backward's short rows (L1024, where a key block has few steps
and its prologue and the grid's order show) beside a long one, against SDPA flash's backward:
f16, d64 and d128, L1024 full and causal (B 16, H D = 2048), L16384 causal (B 1); TFLOP/s = 2.5x
the forward's FLOPs, halved for causal; the relative error of the gradients against flash's. About
a minute a side (four kernels to compile). For an A / B of a change to the fast family in one device
call (docs/backward.md, "The fast family's persistent grid"):
    git archive <base> templates attngen | (mkdir -p ab-base && tar -x -C ab-base)
    bash benchmarks/ab.sh ab-base python3 benchmarks/probes/probe_backward_short.py
"""

import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attngen

sys.path.insert(0, "benchmarks/suite")
from variants import bench_ms, rel_err  # noqa: E402

ROWS = [(d, seqlen, mask) for d in (64, 128) for seqlen, mask in ((1024, "none"), (1024, "causal"), (16384, "causal"))]
kernels = {}
for d, seqlen, mask in ROWS:
    dtype = torch.float16
    batch, heads = 16384 // seqlen, 2048 // d
    if (d, mask) not in kernels:
        spec = attngen.parse(f"attention p{d}_{mask} {{\n head_dim {d}\n dtype f16\n mask {mask}\n}}\n")[0]
        kernels[d, mask] = attngen.compile(spec, target="cuda")
    kernel = kernels[d, mask]
    g = torch.Generator(device="cuda").manual_seed(0)
    shape = (batch, seqlen, heads, d)
    q, k, v, dout = (torch.randn(shape, device="cuda", dtype=dtype, generator=g) for _ in range(4))
    out, lse = kernel(q, k, v, return_lse=True)
    grads = kernel.backward(q, k, v, out, lse, dout)
    ms = bench_ms(lambda: kernel.backward(q, k, v, out, lse, dout))
    qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=mask == "causal")
        ref = torch.autograd.grad(o, (qt, kt, vt), dout.transpose(1, 2), retain_graph=True)
        flash_ms = bench_ms(lambda: torch.autograd.grad(o, (qt, kt, vt), dout.transpose(1, 2), retain_graph=True))
    err = max(rel_err(a, b.transpose(1, 2)) for a, b in zip(grads, ref))
    flops = 2.5 * 4.0 * batch * heads * seqlen * seqlen * d * (0.5 if mask == "causal" else 1.0)
    print(f"d{d:3d} L{seqlen:5d} {'causal' if mask == 'causal' else 'full':6s} B{batch:2d} H{heads:2d}  "
          f"attngen {flops / ms / 1e9:6.1f}  flash {flops / flash_ms / 1e9:6.1f} TFLOP/s  ({flash_ms / ms:.2f}x)  "
          f"err vs flash {err:.1e}", flush=True)
    del q, k, v, dout, out, lse, grads, o, ref, qt, kt, vt
