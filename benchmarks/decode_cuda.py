"""Decode timing of the CUDA split_kv(auto) kernel: B=8, 32 query heads over 8 KV heads, d128, f16.

    python benchmarks/decode_cuda.py [--out results.json]

Times with CUDA events after 10 warm-up calls: `call_us` is the median of 50 single calls
through kernel(...) (Python checks, allocations and both launches: main kernel + combine);
`gpu_us` is the mean of 200 back-to-back replays of the same launches (kernel.prepared), the
GPU time. Effective K+V bandwidth = bytes of K and V read / gpu time (copy ceiling 2.97 TB/s).
"""

from __future__ import annotations

import argparse
import json

import numpy as np

import attngen

SPEC = """attention decode {
    head_dim 128
    heads q=32 kv=8
    dtype f16
    schedule split_kv(auto)
}
"""


def main():
    import cupy as cp
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    kernel = attngen.compile(attngen.parse(SPEC)[0], target="cuda")
    rows = []
    for lk in (4096, 32768):
        b, hq, hkv, d = 8, 32, 8, 128
        rng = cp.random.default_rng(0)
        q = rng.standard_normal((b, 1, hq, d), dtype=cp.float32).astype(cp.float16)
        k = rng.standard_normal((b, lk, hkv, d), dtype=cp.float32).astype(cp.float16)
        v = rng.standard_normal((b, lk, hkv, d), dtype=cp.float32).astype(cp.float16)
        for _ in range(10):
            kernel(q, k, v)
        times = []
        for _ in range(50):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            kernel(q, k, v)
            end.record()
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end) * 1e-3)
        t_call = float(np.median(times))
        replay = kernel.prepared(q, k, v)
        for _ in range(10):
            replay()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(200):
            replay()
        end.record()
        end.synchronize()
        t = cp.cuda.get_elapsed_time(start, end) * 1e-3 / 200
        nbytes = 2 * b * lk * hkv * d * 2
        rows.append({"B": b, "Hq": hq, "Hkv": hkv, "d": d, "Lk": lk, "call_us": t_call * 1e6, "gpu_us": t * 1e6,
                     "kv_TBps": nbytes / t / 1e12})
        print(f"Lk {lk:6d}: call {t_call * 1e6:8.1f} us, gpu {t * 1e6:8.1f} us, K+V {nbytes / t / 1e12:.2f} TB/s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
