"""What cleaning V where a weight is 0 costs the plain loop (mma.sync, CUDA cores): each kernel as
planned beside the same spec compiled with clean_every_tile=False (CudaTiles; partial tiles only: the
kernels before 2026-11-27, wrong for a key of weight 0 with inf / NaN in its V), timed in turn in
one process (rounds alternate, so drifting clocks hit both alike).

    python3 benchmarks/probes/probe_plain_clean.py [--rounds 3] [--only sm80,decode] [--rewrites barrier,vote]

Cases: f32 on CUDA cores (d64, L 1024 / 4096, full and causal), the cuda-sm80 profile's d128
prefill, decode B8 32q/8kv d128 Lk 4096 / 32768 (split_kv(auto), two_pass, fused). Microseconds
of the launches alone (kernel.prepared, median of triton do_bench), and the ratio. --rewrites adds
columns for the planned kernel with its generated source rewritten (timing only, wrong for the
inputs the cleaning is for): `barrier`: the block's vote without the test of the weights
(__syncthreads_or(false)); `vote`: the test with a warp's vote instead of the block's (mask none
only: a partial tile would then leave warps apart at the scan's barriers).
"""

from __future__ import annotations

import argparse

import torch
from triton.testing import do_bench

import attngen
from common import compile_with, with_tiles  # noqa: E402  (benchmarks/probes/common.py)

REWRITES = {
    "barrier": [("__syncthreads_or(zero_weight(s, rows_real))", "__syncthreads_or(false)")],
    "vote": [("__syncthreads_or(zero_weight(s, rows_real))", "__any_sync(0xffffffffu, zero_weight(s, rows_real))")],
}

DT = {"f16": torch.float16, "f32": torch.float32}


def cases():
    """(label, spec text, profile, q/k/v shapes)."""
    out = []
    for L in (1024, 4096):
        for mask in ("none", "causal"):
            b = 16384 // L
            out.append((f"f32 d64 L{L} {mask}", f"head_dim 64\n heads q=16 kv=16\n dtype f32\n mask {mask}", None,
                        "f32", (b, L, 16, 64), (b, L, 16, 64)))
            out.append((f"sm80 f16 d128 L{L} {mask}", f"head_dim 128\n heads q=16 kv=16\n dtype f16\n mask {mask}",
                        "cuda-sm80", "f16", (b, L, 16, 128), (b, L, 16, 128)))
    for lk in (4096, 32768):
        for sched in ("split_kv(auto)", "two_pass", "fused"):
            out.append((f"decode B8 Lk{lk} {sched}", f"head_dim 128\n heads q=32 kv=8\n dtype f16\n schedule {sched}",
                        None, "f16", (8, 1, 32, 128), (8, lk, 8, 128)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default="", help="cases whose label contains one of these (comma-separated)")
    ap.add_argument("--rewrites", default="", help=f"comma-separated: {', '.join(REWRITES)}")
    args = ap.parse_args()
    rewrites = [r for r in args.rewrites.split(",") if r]
    print("| case | cleaned where a weight is 0 (us) | partial tiles only (us) | ratio |"
          + "".join(f" {r} (us) |" for r in rewrites))
    print("|---|---|---|---|" + "---|" * len(rewrites))
    for i, (label, body, profile, dt, qs, ks) in enumerate(cases()):
        if args.only and not any(o in label for o in args.only.split(",")):
            continue
        q = torch.randn(qs, device="cuda", dtype=DT[dt])
        k, v = (torch.randn(ks, device="cuda", dtype=DT[dt]) for _ in range(2))
        launches = {}
        for every in (True, False):
            spec = attngen.parse(f"attention plain{i}_{int(every)} {{\n {body}\n}}")[0]
            tiles = with_tiles(profile, clean_every_tile=every)
            launches[every] = attngen.compile(spec, target="cuda", profile=tiles).prepared(q, k, v)
        for r in rewrites:
            if "causal" in label and r == "vote":
                continue
            spec = attngen.parse(f"attention plain{i}_{r} {{\n {body}\n}}")[0]
            launches[r] = compile_with(spec, REWRITES[r], strict=False, profile=profile).prepared(q, k, v)
        times = {every: [] for every in launches}
        for _ in range(args.rounds):
            for every, f in launches.items():
                times[every].append(do_bench(f, warmup=10, rep=60, return_mode="median") * 1e3)
        a, b = sorted(times[True])[args.rounds // 2], sorted(times[False])[args.rounds // 2]
        extra = "".join(f" {sorted(times[r])[args.rounds // 2]:.1f} |" if r in times else " |" for r in rewrites)
        print(f"| {label} | {a:.1f} | {b:.1f} | {a / b:.3f} |{extra}", flush=True)


if __name__ == "__main__":
    main()
