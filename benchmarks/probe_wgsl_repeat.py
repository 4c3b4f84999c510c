"""Are the WGSL suite's f16 timings bimodal, and where does the second level come from? (issue 13)

Two runs of `run_gpu.py --only wgsl` an hour apart gave the same f32 rows to 1% but f16 rows at
two levels 2-3x apart (benchmarks/NOTES.md, 2026-11-24). This times one case (B4 L4096 H16, d128,
f16 and f32, causal and full) many times in one process: each kernel compiled `--compiles` times
under different names (a new pipeline each), each pipeline timed `--calls` times (GPU time of the
dispatches). A bimodal spread across pipelines points at the pipeline (the driver's compile);
across calls of one pipeline, at the GPU's state (clocks).

    python3 benchmarks/probe_wgsl_repeat.py [--compiles 4] [--calls 6]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import attngen  # noqa: E402
from attngen.backends import wgsl  # noqa: E402
from attngen.backends.wgsl.launch import gpu_timer  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compiles", type=int, default=4)
    ap.add_argument("--calls", type=int, default=6)
    ap.add_argument("--small", action="store_true", help="a tiny case (a software adapter)")
    args = ap.parse_args()
    B, L, H, D = (4, 4096, 16, 128) if "--small" not in sys.argv else (1, 64, 2, 128)
    rng = np.random.default_rng(0)
    host = [rng.standard_normal((B, L, H, D), dtype=np.float32).astype(np.float16) for _ in range(3)]
    for dtype in ("f16", "f32"):
        dev = [wgsl.WgslTensor.from_numpy(a if dtype == "f16" else a.astype(np.float32)) for a in host]
        out = wgsl.WgslTensor.from_numpy(np.zeros((B, L, H, D), np.float16 if dtype == "f16" else np.float32))
        for mask in ("none", "causal"):
            flops = 4.0 * B * H * L * L * D / (2 if mask == "causal" else 1)
            for n in range(args.compiles):
                spec = attngen.parse(f"attention probe_{dtype}_{mask}_{n} {{\n head_dim {D}\n dtype {dtype}\n"
                                     f" mask {mask}\n}}\n")[0]
                kernel = attngen.compile(spec, target="wgsl")
                kernel(*dev, out=out)  # warm-up
                ms = []
                with gpu_timer(kernel) as times:
                    for _ in range(args.calls):
                        times.clear()
                        kernel(*dev, out=out)
                        ms.append(sum(times))
                tf = " ".join(f"{flops / m / 1e9:5.1f}" for m in ms)
                print(f"{dtype} {mask:6} pipeline {n}: TFLOP/s per call {tf}", flush=True)


if __name__ == "__main__":
    main()
