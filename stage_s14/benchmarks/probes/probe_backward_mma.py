"""Probe (issue 41): the sm_80 tensor-core backward (the mma family, templates/cuda/backward_mma.cu.j2)
built with profile cuda-sm80 and timed on this GPU beside SDPA flash's backward (FlashAttention-2,
the same instructions), and variants of its generated source with parts removed (the results are
wrong on purpose): the dQ atomics, the whole dQ product. f16, B L = 16384, H D = 2048, full and
causal; TFLOP/s = 2.5 x the forward's count, as the backward suite.

    python3 benchmarks/probes/probe_backward_mma.py [--dims 64,96,128] [--lengths 1024,4096] [--parts]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attngen
from attngen.backends.cuda import backward as bw
from attngen.backends.cuda import backward_launch as bl
from attngen.backends.cuda import nvrtc
from common import median_ms as bench_ms

PARTS = {
    "no dQ atomics": [("            red_add(row + 8 * n, acc[n][2 * half]);\n", ""),
                      ("            red_add(row + 8 * n + 1, acc[n][2 * half + 1]);\n", "")],
    "no dQ": [("            add_dq(a, seq, b, hk * a.group + g, i0, sDS, sK, warp, lane);\n", "")],
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", default="64,96,128")
    ap.add_argument("--lengths", default="1024,4096")
    ap.add_argument("--parts", action="store_true", help="also time the variants with parts removed")
    args = ap.parse_args()
    for d in map(int, args.dims.split(",")):
        for L in map(int, args.lengths.split(",")):
            for mask in ("none", "causal"):
                B, H = 16384 // L, 2048 // d
                spec = attngen.parse(f"attention m{d}_{mask} {{\n head_dim {d}\n dtype f16\n mask {mask}\n}}\n")[0]
                kernel = attngen.compile(spec, target="cuda", profile="cuda-sm80")
                assert bw.family(kernel.plan) == "mma", bw.family(kernel.plan)
                g = torch.Generator(device="cuda").manual_seed(0)
                q, k, v, dout = (torch.randn((B, L, H, d), device="cuda", dtype=torch.float16, generator=g)
                                 for _ in range(4))
                out, lse = kernel(q, k, v, return_lse=True)
                flops = 2.5 * 4.0 * B * H * L * L * d * (0.5 if mask == "causal" else 1.0)
                tf = (lambda ms: flops / ms / 1e9)
                ms = bench_ms(lambda: kernel.backward(q, k, v, out, lse, dout))
                qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
                with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                    o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=mask == "causal")
                    flash = bench_ms(lambda: torch.autograd.grad(o, (qt, kt, vt), dout.transpose(1, 2),
                                                                 retain_graph=True))
                line = f"d{d} L{L} {mask:6s} mma {tf(ms):6.1f}  SDPA flash {tf(flash):6.1f} TFLOP/s"
                if args.parts:
                    source = bw.render_backward(kernel.plan)
                    for name, edits in PARTS.items():
                        text = source
                        for old, new in edits:
                            assert old in text, (name, old)
                            text = text.replace(old, new)
                        cubin = nvrtc.compile_cubin(text, kernel.plan.details.arch)[0]
                        saved, bl._cubin = bl._cubin, (lambda plan, c=cubin: c)
                        kernel.__dict__.pop("_backward_functions", None)
                        line += f"  {name} {tf(bench_ms(lambda: kernel.backward(q, k, v, out, lse, dout))):6.1f}"
                        bl._cubin = saved
                        kernel.__dict__.pop("_backward_functions", None)
                print(line, flush=True)


if __name__ == "__main__":
    main()
