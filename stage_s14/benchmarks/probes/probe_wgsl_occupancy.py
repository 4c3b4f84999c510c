"""How many workgroups of a WGSL kernel share one multiprocessor (issue 13), told by timing alone.

    python3 benchmarks/probes/probe_wgsl_occupancy.py [--dims 128] [--dtypes f16,f32] [--lk 4096]
                                               [--row-tiles 4,8,16,24,32]
                                               [--variants "default|target wgsl { prefetch=off }"]

Vulkan through wgpu reports no register counts, so this probe infers residency from the grid: B 1,
H 16, Lk keys and Lq = 128 n rows give 16 n workgroups of the q128 plans, each doing the same work
(all Lk keys). Up to one workgroup per multiprocessor (n <= 8 on the H100's 132) every workgroup
runs alone; if a multiprocessor can hold only one of the kernel's workgroups (registers: 256
invocations x more than 128), twice as many take twice as long (waves); if it holds two, they share
it and take less than twice as long. The table gives GPU microseconds per 128 workgroups (time x 128 /
workgroups): about level from n 8 (128 workgroups) to 16 and 32 says one workgroup per
multiprocessor (waves); falling says more than one share it. It changes nothing in attngen.
"""

from __future__ import annotations

import argparse

import numpy as np

import attngen
from attngen.backends import wgsl
from common import spec_text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dims", default="128")
    ap.add_argument("--dtypes", default="f16,f32")
    ap.add_argument("--lk", type=int, default=4096)
    ap.add_argument("--row-tiles", default="4,8,16,24,32")
    ap.add_argument("--variants", default="default|target wgsl { prefetch=off }")
    args = ap.parse_args()
    L, H = args.lk, 16
    for d in (int(x) for x in args.dims.split(",")):
        for dtype in args.dtypes.split(","):
            for variant in args.variants.split("|"):
                extra = "" if variant == "default" else "\n ".join(x.strip() for x in variant.split(";"))
                kern = attngen.compile(attngen.parse(spec_text(dtype, d, "none", extra))[0], target="wgsl")
                cells = []
                for n in (int(x) for x in args.row_tiles.split(",")):
                    lq = n * kern.plan.config.tile_q
                    rng = np.random.default_rng(n)
                    np_dt = np.float16 if dtype == "f16" else np.float32
                    dev = [wgsl.WgslTensor.from_numpy(rng.standard_normal((1, length, H, d), dtype=np.float32).astype(np_dt))
                           for length in (lq, L, L)]
                    ms = wgsl.BACKEND.time_call(kern, tuple(dev), {}, 5)
                    groups = n * H
                    flops = 4.0 * H * lq * L * d
                    cells.append(f"{groups} wg {ms * 128e3 / groups:.0f} us/128wg {flops / ms / 1e9:5.2f} TFLOP/s")
                    for t in dev:
                        t.buffer.destroy()
                print(f"{dtype} d{d} L{L} {variant} [{kern.plan.config.summary()}; {kern.plan.smem_bytes} bytes]\n  "
                      + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
