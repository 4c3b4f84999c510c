"""Time attngen's chunked CUDA kernels (head dims above 256) against PyTorch SDPA mem-efficient.

    . .gl/env.sh && python3 benchmarks/head_dims.py [--out DIR]

B=1, H=48, L=4096, f16, no mask; TFLOP/s = 4 * B * H * L * L * D / time (median of CUDA-event
timings after warm-up). Checks each output against SDPA first. Writes head_dims.json into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import attngen  # noqa: E402

DIMS = (320, 512, 1024)
B, H, L = 1, 48, 4096


def _time(fn, reps=10):
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    rows = []
    for d in DIMS:
        spec = attngen.parse(f"attention d{d} {{\n head_dim {d}\n dtype f16\n}}\n")[0]
        kernel = attngen.compile(spec, target="cuda")
        q, k, v = (torch.randn(B, L, H, d, device="cuda", dtype=torch.float16) for _ in range(3))
        out = kernel(q, k, v)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            ref = F.scaled_dot_product_attention(qt, kt, vt).transpose(1, 2)
            t_ref = _time(lambda: F.scaled_dot_product_attention(qt, kt, vt))
        err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
        t = _time(lambda: kernel(q, k, v, out=out))
        flops = 4 * B * H * L * L * d
        c = kernel.plan.config
        rows.append({"head_dim": d, "attngen_tflops": flops / t / 1e12, "sdpa_mem_eff_tflops": flops / t_ref / 1e12,
                     "attngen_ms": t * 1e3, "sdpa_ms": t_ref * 1e3, "rel_err_vs_sdpa": err,
                     "plan": kernel.plan.summary(), "chunk": c.chunk, "v_blocks": c.v_blocks})
        print(f"d{d}: attngen {rows[-1]['attngen_tflops']:.1f} TFLOP/s, SDPA mem-eff "
              f"{rows[-1]['sdpa_mem_eff_tflops']:.1f} TFLOP/s, err {err:.2e} ({rows[-1]['plan']}, "
              f"d={c.chunk}, {c.v_blocks} column blocks)", flush=True)
    with open(os.path.join(args.out, "head_dims.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "B": B, "H": H, "L": L, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
