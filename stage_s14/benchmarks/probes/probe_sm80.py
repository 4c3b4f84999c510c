"""The cuda-sm80 profile's kernels (mma.sync, cp.async: what an A100 runs) timed on this GPU, with
and without a field of the planner's tile table overridden (issue 12 / 11: is a change to the mma.sync family worth
it outside decode?). A proxy: the H100 runs them, not an A100.

    python3 benchmarks/probe_sm80.py [--patch swizzle_kv=False] [--dims 64,128] [--lengths 1024,4096]

f16, B L = 16384 tokens, H 16, full and causal; TFLOP/s of the launches alone (kernel.prepared,
median of triton do_bench) beside SDPA flash in the same process.
"""

from __future__ import annotations

import argparse
import hashlib

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import attngen
from attngen.api import get_profile


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--patch", default="", help="FIELD=VALUE of CudaTiles, attngen/backends/cuda/tiles.py (a Python literal)")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--lengths", default="1024,4096")
    args = ap.parse_args()
    profile = get_profile("cuda-sm80", "cuda")
    if args.patch:
        name, _, value = args.patch.partition("=")
        profile = profile.with_overrides(**{name: eval(value)})  # noqa: S307 - a probe's own argument
    H, tokens = 16, 16384
    for d in (int(x) for x in args.dims.split(",")):
        for L in (int(x) for x in args.lengths.split(",")):
            B = tokens // L
            q, k, v = (torch.randn((B, L, H, d), device="cuda", dtype=torch.float16) for _ in range(3))
            for mask in ("none", "causal"):
                flops = 4.0 * B * H * L * L * d / (2 if mask == "causal" else 1)
                # (the overrides reach the plan, which keys the disk cache; the name tells the runs apart)
                name = "p_" + hashlib.sha1(args.patch.encode()).hexdigest()[:8]
                text = f"attention {name} {{\n head_dim {d}\n heads q={H} kv={H}\n dtype f16\n mask {mask}\n}}"
                kern = attngen.compile(attngen.parse(text)[0], target="cuda", profile=profile)
                ms = do_bench(kern.prepared(q, k, v), warmup=25, rep=100, return_mode="median")
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    fa = do_bench(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=mask == "causal"),
                                  warmup=25, rep=100, return_mode="median")
                print(f"{args.patch or 'as planned':24s} d{d} L{L} {mask:6s}: attngen (cuda-sm80) "
                      f"{flops / ms / 1e9:6.1f} TFLOP/s | SDPA flash {flops / fa / 1e9:6.1f} "
                      f"[{kern.plan.config.swizzle_kv and 'permuted K/V rows' or 'padded K/V rows'}]", flush=True)


if __name__ == "__main__":
    main()
