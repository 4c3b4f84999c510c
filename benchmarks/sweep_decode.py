"""Sweep the split_kv decode kernel's tile kv, K/V stages and split count on the GPU (issue 12
part 5: what the split rule and the decode defaults should be), beside SDPA flash and cuDNN.

    python3 benchmarks/sweep_decode.py [--lk 4096,32768]

B=8, Lq=1, 32 query heads over 8 KV heads, d128, f16; the kernels' launches alone
(kernel.prepared), median of triton do_bench; effective K+V TB/s. One line per configuration,
then the best per Lk.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import attngen

B, HQ, HKV, D = 8, 32, 8, 128


def kernel(kv: int, stages: int, splits):
    sched = "split_kv(auto)" if splits == "auto" else f"split_kv({splits})"
    text = (f"attention dec_{kv}_{stages}_{splits} {{\n head_dim {D}\n heads q={HQ} kv={HKV}\n dtype f16\n"
            f" tile q=16 kv={kv}\n schedule {sched}\n target cuda {{ stages={stages} }}\n}}")
    return attngen.compile(attngen.parse(text)[0], target="cuda")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lk", default="4096,32768")
    args = ap.parse_args()
    for lk in (int(x) for x in args.lk.split(",")):
        q = torch.randn((B, 1, HQ, D), device="cuda", dtype=torch.float16)
        k = torch.randn((B, lk, HKV, D), device="cuda", dtype=torch.float16)
        v = torch.randn_like(k)
        nbytes = 2 * k.numel() * 2
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        for name, backend in (("sdpa flash", SDPBackend.FLASH_ATTENTION), ("sdpa cudnn", SDPBackend.CUDNN_ATTENTION)):
            with sdpa_kernel(backend):
                try:
                    ms = do_bench(lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True), warmup=25,
                                  rep=100, return_mode="median")
                    print(f"Lk {lk} {name}: {ms:.4f} ms {nbytes / ms / 1e9:.2f} TB/s", flush=True)
                except RuntimeError as e:
                    print(f"Lk {lk} {name}: n/a ({str(e).splitlines()[0][:80]})")
        best = []
        for kv in (32, 64):
            for stages in (2, 3, 4):
                for splits in ("auto", 4, 6, 8, 12, 16, 24, 32):
                    try:
                        kern = kernel(kv, stages, splits)
                        f = kern.prepared(q, k, v)
                        ms = do_bench(f, warmup=25, rep=100, return_mode="median")
                    except Exception as e:  # a configuration the checker refuses, or shared memory
                        print(f"Lk {lk} kv{kv} st{stages} S={splits}: {type(e).__name__}: {str(e)[:80]}")
                        continue
                    tbs = nbytes / ms / 1e9
                    best.append((tbs, kv, stages, splits, ms))
                    print(f"Lk {lk} kv{kv} st{stages} S={splits}: {ms:.4f} ms {tbs:.2f} TB/s", flush=True)
        best.sort(reverse=True)
        print(f"Lk {lk} best: " + "; ".join(f"kv{b[1]} st{b[2]} S={b[3]} {b[0]:.2f} TB/s" for b in best[:5]))


if __name__ == "__main__":
    main()
