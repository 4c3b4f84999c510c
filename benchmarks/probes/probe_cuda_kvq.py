"""Quantized KV caches on the CUDA target (issue 44): the decode row of the issue (B8, 32 query heads
/ 8 KV heads, d128, one query row per sequence, Lk 4096 and 32768) with e4m3, e5m2 and i8 caches
beside the f16 cache, contiguous and paged (page 16, shuffled table), tokens per second and the
ratio to the f16 cache; at the first length each output against the float64 reference (relative
L2). The must: >= 1.8x the f16 cache's tokens per second at Lk 32768, contiguous and paged (i8's
ceiling: 2 / 1.125 = 1.78x, its scales are 4 bytes per 32 values).

    python3 benchmarks/probes/probe_cuda_kvq.py [--lengths 4096,32768] [--kv e4m3,e5m2,i8]
                                                [--layouts contiguous,paged16] [--schedule 'split_kv(auto)']
                                                [--plans] [--extra 'target cuda { stages=3 }' ...]
                                                [--tiles swizzle_kv_quant=false ...]

The cases, timer and checks are benchmarks/suite/decode_quant.py's (run_gpu.py's decode_quant
suite); --plans prints each kernel's plan first. Variants, each timed beside the f16 cache after the
defaults, in one process: each --extra adds a spec line to the quantized caches' kernels (their tiles:
stages, tile kv=..., key_warps=...), each --tiles sets fields of their profile's CudaTiles
(attngen/backends/cuda/tiles.py; e.g. swizzle_kv_quant=false: the padded byte rows of before). It changes
nothing in attngen.
"""

from __future__ import annotations

import argparse

import common  # noqa: F401  (puts benchmarks/suite on the path)
import decode_quant


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="4096,32768")
    ap.add_argument("--kv", default="e4m3,e5m2,i8")
    ap.add_argument("--layouts", default="contiguous,paged16")
    ap.add_argument("--schedule", default="split_kv(auto)")
    ap.add_argument("--plans", action="store_true", help="print each kernel's plan (attngen check's lines) first")
    ap.add_argument("--extra", action="append", default=[],
                    help="a spec line for the quantized caches' kernels: a variant (repeatable)")
    ap.add_argument("--tiles", action="append", default=[],
                    help="NAME=VALUE,... (true / false / an integer): CudaTiles fields for the quantized caches' "
                         "kernels: a variant (repeatable)")
    args = ap.parse_args()

    def value(v):  # true / false for CudaTiles' switches, else an integer
        return v.lower() == "true" if v.lower() in ("true", "false") else int(v)
    # (label, spec line, profile): the defaults first, then each --extra and each --tiles alone
    variants = [("defaults", "", None)] + [(f"extra {x}", x, None) for x in args.extra] + [
        (f"tiles {t}", "", common.with_tiles(None, **{k: value(v) for k, v in (x.split("=") for x in t.split(","))}))
        for t in args.tiles]
    import torch
    print(torch.cuda.get_device_name())
    kvs, layouts = args.kv.split(","), args.layouts.split(",")
    if args.plans:
        from attngen import backends
        for label, extra, profile in variants:
            for layout in layouts:
                for kv in ["f16"] + kvs:
                    kern = decode_quant.kernel(kv, layout, args.schedule, extra, profile)
                    print(f"-- {label}: {kv} {layout}")
                    for line in backends.get("cuda").describe(kern.plan):
                        print("   " + line)
    rows = []
    for label, extra, profile in variants:
        mine = []
        decode_quant.run(mine, [int(x) for x in args.lengths.split(",")], kvs, layouts, args.schedule, verbose=False,
                         extra=extra, profile=profile)
        rows += [(label, r) for r in mine]
    print(f"{'layout':<11} {'Lk':>6} {'kv':<5} {'ms':>8} {'tok/s':>10} {'f16 ms':>8} {'vs f16':>7} {'TB/s':>6} "
          f"{'rel err':>9}  variant")
    for label, r in rows:
        a, p = r["attngen"], r["peers"]["f16_cache"]
        err = "" if r["rel_err"] is None else f"{r['rel_err']:.2e}"
        print(f"{r['layout']:<11} {r['len_k']:>6} {r['kv_dtype']:<5} {a['ms']:>8.4f} {a['tokens_per_s']:>10.0f} "
              f"{p['ms']:>8.4f} {r['ratio_vs_f16']:>6.2f}x {a['tbs']:>6.2f} {err:>9}  {label}")


if __name__ == "__main__":
    main()
