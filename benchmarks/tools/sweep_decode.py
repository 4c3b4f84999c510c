"""Sweep the split_kv decode kernel's warps over keys, tile kv, K/V stages and split count on the
GPU (issue 12 part 5: what the split rule and the decode defaults should be), beside SDPA flash
and cuDNN.

    python3 benchmarks/tools/sweep_decode.py [--lk 4096,32768] [--batch 8] [--warps-kv 1x32,4x128]
                                       [--stages 2,3] [--splits auto,4,8]

Lq=1, 32 query heads over 8 KV heads, d128, f16; the kernels' launches alone (kernel.prepared),
median of triton do_bench; effective K+V TB/s. One line per configuration, then the best per Lk.
--warps-kv: key_warps x tile kv pairs (key_warps 1: one warp per block).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import attngen

HQ, HKV, D = 32, 8, 128


def kernel(key_warps: int, kv: int, stages: int, splits):
    sched = "split_kv(auto)" if splits == "auto" else f"split_kv({splits})"
    text = (f"attention dec_{key_warps}_{kv}_{stages}_{splits} {{\n head_dim {D}\n heads q={HQ} kv={HKV}\n"
            f" dtype f16\n tile q=16 kv={kv}\n schedule {sched}\n"
            f" target cuda {{ stages={stages} key_warps={key_warps} }}\n}}")
    return attngen.compile(attngen.parse(text)[0], target="cuda")


def _sdpa(qt, kt, vt, backend):
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)


def per_kernel(fn, nbytes: int, reps: int = 50) -> str:
    """Each kernel's mean GPU time over `reps` calls (torch.profiler), and the K+V TB/s of their sum."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    times = {}
    for e in prof.events():
        if e.device_type.name == "CUDA" and e.device_time > 0:
            times.setdefault(e.name, []).append(e.device_time)
    parts = sorted(((sum(v) / reps, n) for n, v in times.items()), reverse=True)
    total = sum(t for t, _ in parts)
    text = "; ".join(f"{n[:40]} {t:.1f} us" for t, n in parts)
    return f"sum {total:.1f} us ({nbytes / total / 1e6:.2f} TB/s): {text}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lk", default="4096,32768")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--warps-kv", default="1x32,1x64,2x64,4x64,4x128,8x128")
    ap.add_argument("--stages", default="2,3,4")
    ap.add_argument("--splits", default="auto,4,6,8,12,16,24,32")
    ap.add_argument("--profile", action="store_true",
                    help="per-kernel GPU times (torch.profiler) of each configuration and of the peers, "
                         "instead of the sweep's whole-call medians")
    args = ap.parse_args()
    B = args.batch
    pairs = [tuple(int(x) for x in p.split("x")) for p in args.warps_kv.split(",")]
    stage_list = [int(x) for x in args.stages.split(",")]
    split_list = [x if x == "auto" else int(x) for x in args.splits.split(",")]
    for lk in (int(x) for x in args.lk.split(",")):
        q = torch.randn((B, 1, HQ, D), device="cuda", dtype=torch.float16)
        k = torch.randn((B, lk, HKV, D), device="cuda", dtype=torch.float16)
        v = torch.randn_like(k)
        nbytes = 2 * k.numel() * 2
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        if args.profile:
            runs = [(f"sdpa {n}", lambda b=b: _sdpa(qt, kt, vt, b))
                    for n, b in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION))]
            runs += [(f"w{w} kv{kv} st{st} S={sp}", kernel(w, kv, st, sp).prepared(q, k, v))
                     for w, kv in pairs for st in stage_list for sp in split_list]
            for name, fn in runs:
                print(f"B{B} Lk {lk} {name}: " + per_kernel(fn, nbytes), flush=True)
            continue
        for name, backend in (("sdpa flash", SDPBackend.FLASH_ATTENTION), ("sdpa cudnn", SDPBackend.CUDNN_ATTENTION)):
            with sdpa_kernel(backend):
                try:
                    ms = do_bench(lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True), warmup=25,
                                  rep=100, return_mode="median")
                    print(f"Lk {lk} {name}: {ms:.4f} ms {nbytes / ms / 1e9:.2f} TB/s", flush=True)
                except RuntimeError as e:
                    print(f"Lk {lk} {name}: n/a ({str(e).splitlines()[0][:80]})")
        best = []
        for key_warps, kv in pairs:
            for stages in stage_list:
                for splits in split_list:
                    name = f"B{B} Lk {lk} w{key_warps} kv{kv} st{stages} S={splits}"
                    try:
                        kern = kernel(key_warps, kv, stages, splits)
                        f = kern.prepared(q, k, v)
                        ms = do_bench(f, warmup=25, rep=100, return_mode="median")
                    except Exception as e:  # a configuration the checker refuses, or shared memory
                        print(f"{name}: {type(e).__name__}: {str(e)[:80]}")
                        continue
                    tbs = nbytes / ms / 1e9
                    best.append((tbs, key_warps, kv, stages, splits, ms))
                    print(f"{name}: {ms:.4f} ms {tbs:.2f} TB/s", flush=True)
        best.sort(key=lambda b: b[0], reverse=True)
        print(f"B{B} Lk {lk} best: " + "; ".join(f"w{b[1]} kv{b[2]} st{b[3]} S={b[4]} {b[0]:.2f} TB/s"
                                                for b in best[:6]))


if __name__ == "__main__":
    main()
