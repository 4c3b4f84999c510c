"""Probe (issue 41): the fast CUDA backward at head dim 64 against SDPA flash's backward, the six
dense rows of benchmarks/suite/backward.py (f16, B L = 16384, H D = 2048, L 1024 / 4096 / 16384,
full and causal; TFLOP/s = 2.5x the forward's FLOPs, halved for causal), and the relative error
of the gradients against flash's. For an A / B of the 64-row steps (main before the 128-row steps)
and the 128-row steps (docs/backward.md, "Head dim 64: steps of 128 query rows") in one device call:
    git archive <base> templates attngen | (mkdir -p ab-base && tar -x -C ab-base)
    bash benchmarks/ab.sh ab-base python3 benchmarks/probes/probe_backward_d64.py
"""

import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attngen
from attngen.backends.cuda import backward as bw

sys.path.insert(0, "benchmarks/suite")
from variants import bench_ms, rel_err  # noqa: E402

d, dtype = 64, torch.float16
for seqlen in (1024, 4096, 16384):
    for mask in ("none", "causal"):
        batch, heads = 16384 // seqlen, 2048 // d
        spec = attngen.parse(f"attention p_{mask} {{\n head_dim {d}\n dtype f16\n mask {mask}\n}}\n")[0]
        kernel = attngen.compile(spec, target="cuda")
        g = torch.Generator(device="cuda").manual_seed(0)
        shape = (batch, seqlen, heads, d)
        q, k, v, dout = (torch.randn(shape, device="cuda", dtype=dtype, generator=g) for _ in range(4))
        out, lse = kernel(q, k, v, return_lse=True)
        grads = kernel.backward(q, k, v, out, lse, dout)
        ms = bench_ms(lambda: kernel.backward(q, k, v, out, lse, dout))
        qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
        dt = dout.transpose(1, 2)
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=mask == "causal")
            ref = torch.autograd.grad(o, (qt, kt, vt), dt, retain_graph=True)
            flash_ms = bench_ms(lambda: torch.autograd.grad(o, (qt, kt, vt), dt, retain_graph=True))
        err = max(rel_err(a, b.transpose(1, 2)) for a, b in zip(grads, ref))
        flops = 2.5 * 4.0 * batch * heads * seqlen * seqlen * d * (0.5 if mask == "causal" else 1.0)
        rows = bw.wgmma_rows(kernel.plan) if hasattr(bw, "wgmma_rows") else 64  # (before the 128-row steps: 64)
        print(f"d{d} L{seqlen:5d} {'causal' if mask == 'causal' else 'full':6s} rows/step {rows:3d}  "
              f"attngen {flops / ms / 1e9:6.1f}  "
              f"flash {flops / flash_ms / 1e9:6.1f} TFLOP/s  ({flash_ms / ms:.2f}x)  err vs flash {err:.1e}", flush=True)
