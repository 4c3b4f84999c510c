"""Probe (issue 41): the fast CUDA backward at head dim 256 (templates/cuda/backward_wgmma_wide.cu.j2)
beside SDPA's flash and cuDNN backwards, and what its dK/dV step spends its time on, by timing
variants of its generated source with parts removed (those results are wrong on purpose): the dQ
reductions, the whole dQ step (206b8ad's kernel) or its products (its staging kept), the softmax
math. f16 and bf16, B L = 16384, H = 8 (H D = 2048), L 4096 and 16384, masks none and causal;
TFLOP/s counted as the full backward's (2.5 x the forward's FLOPs).
`python3 benchmarks/probes/probe_backward_wide.py [--parts]`."""

import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attngen
from attngen.backends.cuda import backward as bw
from attngen.backends.cuda import backward_launch as bl
from attngen.backends.cuda import nvrtc

sys.path.insert(0, "benchmarks/suite")
from variants import bench_ms  # noqa: E402

# Each variant's edits are applied where their text is found (the kernel of 206b8ad, whose steps
# ran their phases in order, and the one whose dQ staging overlaps products: ab.sh runs both);
# a variant none of whose edits applies is reported as such.
VARIANTS = {
    "no dQ reductions": [("                    tma_reduce_add(dq_map, stage, col, h, row, map_batch);\n"
                          "                    tma_reduce_add(dq_map, stage + 64 * 32, col + 32, h, row, map_batch);\n",
                          ""),
                         ("        tma_reduce_add(dq_map, stage, col, h, row, batch);\n"
                          "        tma_reduce_add(dq_map, stage + 64 * 32, col + 32, h, row, batch);\n",
                          "")],
    "no dQ": [("            for (int part = 0; part < 2; ++part) {",
               "            for (int part = 0; part < 0; ++part) {")],
    "no dQ products": [("    for (int kk = 0; kk < kBlockN / 16; ++kk) {\n        wgmma_dq(",
                        "    for (int kk = 0; kk < 0; ++kk) {\n        wgmma_dq(")],
    "no softmax math": [("            if (elem) recompute<true>", "            if (false) recompute<true>"),
                        ("            else recompute<false>(s", "            else if (false) recompute<false>(s")],
}
TORCH = {"f16": torch.float16, "bf16": torch.bfloat16}

for dtype in ("f16", "bf16"):
    for L in (4096, 16384):
        for mask in ("none", "causal"):
            B, H, d = 16384 // L, 8, 256
            spec = attngen.parse(f"attention w {{\n head_dim {d}\n dtype {dtype}\n mask {mask}\n}}\n")[0]
            kernel = attngen.compile(spec, target="cuda")
            assert bw.family(kernel.plan) == "wgmma" and bw.wide(kernel.plan), "needs cuda-sm90 (an H100 / H200)"
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v, dout = (torch.randn((B, L, H, d), device="cuda", dtype=TORCH[dtype], generator=g)
                             for _ in range(4))
            out, lse = kernel(q, k, v, return_lse=True)
            flops = 2.5 * 4.0 * B * H * L * L * d * (0.5 if mask == "causal" else 1.0)
            label = f"{dtype} L{L} {mask}"
            ms = bench_ms(lambda: kernel.backward(q, k, v, out, lse, dout))
            line = f"{label:18s} attngen {flops / ms / 1e9:6.1f}"
            qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
            for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cuDNN", SDPBackend.CUDNN_ATTENTION)):
                try:
                    with sdpa_kernel([backend]):
                        o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=mask == "causal")
                        t = bench_ms(lambda: torch.autograd.grad(o, (qt, kt, vt), dout.transpose(1, 2),
                                                                 retain_graph=True))
                    line += f"  {name} {flops / t / 1e9:6.1f}"
                except RuntimeError:
                    line += f"  {name} n/a"
            print(line + "  TFLOP/s", flush=True)
            if "--parts" not in sys.argv or L != 16384:
                continue
            source = bw.render_backward(kernel.plan)
            cubin_of = bl._cubin
            for name, edits in VARIANTS.items():
                text = source
                for old, new in edits:
                    text = text.replace(old, new)
                if text == source:
                    print(f"  {label} {name:18s} (not in this source)", flush=True)
                    continue
                cubin = nvrtc.compile_cubin(text, kernel.plan.details.arch)[0]
                bl._cubin = lambda plan, c=cubin: c
                kernel.__dict__.pop("_backward_functions", None)
                ms = bench_ms(lambda: kernel.backward(q, k, v, out, lse, dout))
                print(f"  {label} {name:18s} {ms:7.3f} ms  {flops / ms / 1e9:6.1f} TFLOP/s", flush=True)
            bl._cubin = cubin_of
            kernel.__dict__.pop("_backward_functions", None)
