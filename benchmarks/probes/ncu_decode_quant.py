"""Hardware counters of the quantized-cache decode kernels beside the f16 cache's (issue 44: why the
e4m3 decode moves 3.65 TB/s where its own copies alone stream 3.95: benchmarks/NOTES.md, sixteenth
session). Run under Nsight Compute on the GPU machine:

    ncu --clock-control none --profile-from-start off --section SpeedOfLight \
        --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
        --section WarpStateStats --section SourceCounters \
        python3 benchmarks/probes/ncu_decode_quant.py [--kv e4m3,i8] [--layout contiguous] [--lk 32768]

The cases of benchmarks/suite/decode_quant.py (B8, 32 query heads over 8 KV heads, d128): each kernel's
launches (kernel.prepared) warmed up outside the profiled range, then run once inside it
(common.profiled_once), the f16 cache first.
"""

from __future__ import annotations

import argparse

from common import profiled_once  # (puts benchmarks/suite on sys.path)

import decode_quant  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kv", default="e4m3,i8")
    ap.add_argument("--layout", default="contiguous")
    ap.add_argument("--lk", type=int, default=32768)
    args = ap.parse_args()
    runs = []
    for kv in ["f16"] + args.kv.split(","):
        kern = decode_quant.kernel(kv, args.layout)
        q, k, v, opts = decode_quant.inputs(kv, args.layout, args.lk, seed=args.lk)
        runs.append((kv, kern.prepared(q, k, v, **opts)))
        print(f"{kv}: {kern.plan.summary()}")
    profiled_once(runs, warmup=5)
    print("profiled:", ", ".join(n for n, _ in runs))


if __name__ == "__main__":
    main()
