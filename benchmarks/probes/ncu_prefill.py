"""Hardware counters of a prefill kernel beside SDPA cuDNN's and flash's on the same inputs: where
a row of the dense suite loses to cuDNN (d128 causal L1024: 338 vs 408 TFLOP/s at d2938aa). Run
under Nsight Compute on the GPU machine:

    ncu --clock-control none --profile-from-start off --section SpeedOfLight \
        --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy \
        --section WarpStateStats --section SchedulerStats \
        python3 benchmarks/probes/ncu_prefill.py [--d 128] [--l 1024] [--mask causal] [--dtype f16]

The dense suite's shape (B L = 16384, H D = 2048). Each kernel is warmed up outside the
profiled range, then run once inside it (torch.cuda.profiler.start / stop): attngen's launch
alone (kernel.prepared), then SDPA cuDNN, then SDPA flash. --extra adds spec lines to attngen's.
"""

from __future__ import annotations

import argparse

import torch
from torch.nn.attention import SDPBackend

import attngen
from common import profiled_once, randn, sdpa


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--l", type=int, default=1024)
    ap.add_argument("--mask", default="causal", choices=["none", "causal"])
    ap.add_argument("--dtype", default="f16", choices=["f16", "bf16"])
    ap.add_argument("--extra", default="", help="spec lines added to attngen's kernel ('\\n' between lines)")
    args = ap.parse_args()
    d, length = args.d, args.l
    heads, batch = 2048 // d, 16384 // length
    dt = torch.float16 if args.dtype == "f16" else torch.bfloat16
    q, k, v = (randn((batch, length, heads, d), dt) for _ in range(3))
    text = (f"attention prefill {{\n head_dim {d}\n heads q={heads} kv={heads}\n dtype {args.dtype}\n"
            f" mask {args.mask}\n{args.extra.replace(chr(92) + 'n', chr(10))}\n}}")
    kern = attngen.compile(attngen.parse(text)[0], target="cuda")
    print(kern.plan.summary(), flush=True)
    ours = kern.prepared(q, k, v)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

    def peer(backend):
        return lambda: sdpa(qt, kt, vt, backend, is_causal=args.mask == "causal")

    runs = [("attngen", ours), ("sdpa cudnn", peer(SDPBackend.CUDNN_ATTENTION)),
            ("sdpa flash", peer(SDPBackend.FLASH_ATTENTION))]
    profiled_once(runs, warmup=5)


if __name__ == "__main__":
    main()
