"""FP8 prefill (issue 44) on the H100: attngen's FP8 kernel beside its f16 kernel and cuDNN's FP8 SDPA,
and its accuracy beside the f16 kernel's on the same values.

Speed: head dims 64 / 128 / 256 x L 4096 / 16384 x full / causal, B L = 16384, H D = 2048, e4m3 in
and bf16 out, TFLOP/s = 4 B H L^2 D (causal half), medians of CUDA events after warm-up; the
_prepare_v entry (V^T, the first launch of every call) timed apart and the attention alone beside
the whole call; cuDNN's FP8 SDPA (nvidia-cudnn-frontend, descales 1, FP8 out) where `cudnn`
imports. The rows are benchmarks/suite/fp8_prefill.py's (run_gpu.py's suite `fp8`).

Accuracy (--accuracy): the relative L2 error against the float64 reference fed the same FP8 bytes
and descales (attngen.quantize_fp8 per sequence and KV head), beside the f16 kernel's error on those
dequantized values rounded to f16, at L 1023 / 4096, d 64 / 128 / 256, full and causal, GQA 3.

    python3 benchmarks/probes/probe_fp8.py [--dims 64,128,256] [--lengths 4096,16384] [--masks none,causal]
        [--accuracy] [--no-speed] [--producer-regs 40,24] [--tiles 128x128,128x192,192x128] [--swizzle64 off,on]

--producer-regs runs the speed table once per value of the producer's registers after setmaxnreg
(attngen/backends/cuda/tiles.py, CudaTiles.fp8_producer_regs, overridden for every mask through the
profile, common.with_tiles): 40 leaves the two consumer
warpgroups 232 registers, with which ptxas serialised the d224 / d256 products (C7512: the kernel before
branch fp8wide), 24 leaves them 240 (the plan's default since). Each value is its own plan, so its own
cubin in the cache.

--tiles runs the speed table once per FP8 tile (tile q x tile kv: CudaTiles.fp8_tiles overridden at
every head dim, through the profile as --producer-regs; tile kv a multiple of 32 from 64 to 256, tile
q 64, 128 or 192 up to d64, fp8.py's checker). A candidate the planner refuses for a head dim (shared
memory: d256 fits kv 128 at most) is that row's failure, not the run's. The plan column names the tile
each row ran.

--swizzle64 off,on runs the speed table (and the accuracy table) once per value of CudaTiles.fp8_swizzle64:
on, head dims qk up to 64 keep Q and K in 64-byte rows with the 64-byte swizzle (sQ and sK halve, the
tensor copies write no zero half-rows), off in 128-byte rows half zeros. Only d64 differs: pass --dims 64.

The three options combine as a product: one speed table per (swizzle64, producer registers, tile); with
--accuracy, one accuracy table per (swizzle64, tile) (the tiles' own errors: --tiles 128x128,128x192
--accuracy --no-speed checks a tile against the default one on the GPU).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (puts benchmarks/suite on the path)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import attngen  # noqa: E402
import fp8_prefill  # noqa: E402  (benchmarks/suite/fp8_prefill.py)


def accuracy(dims, lengths, masks, profile=None):
    from attngen.reference import reference, relative_error
    from attngen.runtime.fp8 import dequantize_fp8, quantize_fp8
    print("accuracy: relative L2 error against the float64 reference on the same FP8 values (B 1, Hq 6 over Hkv 2)")
    print(f"{'case':<26}{'FP8 kernel':>12}{'f16 kernel':>12}{'ratio':>8}")
    rng = np.random.default_rng(44)
    for d in dims:
        for length in lengths:
            for mask in masks:
                x = [rng.standard_normal((1, length, h, d)) for h in (6, 2, 2)]
                (q8, qd), (k8, kd), (v8, vd) = (quantize_fp8(t, "e4m3", heads_kv=2) for t in x)
                spec = attngen.parse(f"attention fp8_acc {{\n head_dim {d}\n dtype e4m3\n mask {mask}\n}}\n")[0]
                f16 = attngen.parse(f"attention fp8_acc_f16 {{\n head_dim {d}\n dtype f16\n mask {mask}\n}}\n")[0]
                ref = reference(spec, q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd)
                dev = [torch.from_numpy(a).cuda().view(torch.float8_e4m3fn) for a in (q8, k8, v8)]
                scales = {n: torch.from_numpy(s).cuda() for n, s in (("q_descale", qd), ("k_descale", kd),
                                                                      ("v_descale", vd))}
                try:  # (a tile the planner refuses at this head dim, or a fault: that row's failure)
                    out = attngen.compile(spec, target="cuda", profile=profile)(*dev, **scales)
                    e8 = relative_error(out.float().cpu().numpy(), ref)
                except Exception as e:  # noqa: BLE001
                    print(f"{f'd{d} L{length} {mask}':<26}failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
                    continue
                vals = [dequantize_fp8(a, s, "e4m3", g) for a, s, g in ((q8, qd, 3), (k8, kd, 1), (v8, vd, 1))]
                o16 = attngen.compile(f16, target="cuda")(*[torch.from_numpy(a.astype(np.float16)).cuda() for a in vals])
                e16 = relative_error(o16.float().cpu().numpy(), ref)
                print(f"{f'd{d} L{length} {mask}':<26}{e8:>12.2e}{e16:>12.2e}{e8 / e16:>7.0f}x", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--lengths", default="4096,16384")
    ap.add_argument("--masks", default="none,causal")
    ap.add_argument("--accuracy", action="store_true", help="also the accuracy table (L 1023 and 4096)")
    ap.add_argument("--no-speed", action="store_true")
    ap.add_argument("--producer-regs", default="", help="comma-separated registers of the FP8 producer to compare")
    ap.add_argument("--tiles", default="", help="comma-separated FP8 tiles QxKV to compare (e.g. 128x128,128x192)")
    ap.add_argument("--swizzle64", default="", help="off,on: CudaTiles.fp8_swizzle64 values to compare (d <= 64)")
    a = ap.parse_args()
    dims = tuple(int(x) for x in a.dims.split(","))
    masks = tuple(a.masks.split(","))
    print(f"GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}")
    swizzles = [{"on": True, "off": False}[x] for x in a.swizzle64.split(",") if x] or [None]
    tiles = [tuple(int(n) for n in x.lower().split("x")) for x in a.tiles.split(",") if x] or [None]
    for swz in swizzles:
        base = {} if swz is None else {"fp8_swizzle64": swz}
        if swz is not None:
            print(f"-- fp8_swizzle64 {'on: Q and K of d <= 64 in 64-byte rows' if swz else 'off: 128-byte rows'}")
        if not a.no_speed:
            for regs in [int(x) for x in a.producer_regs.split(",") if x] or [None]:
                for tile in tiles:
                    overrides = dict(base)
                    if regs is not None:
                        overrides.update(fp8_producer_regs={kind: regs for kind in ("none", "causal", "window",
                                                                                     "custom")},
                                         fp8_wide_custom_producer_regs=regs)
                        print(f"-- FP8 producer {regs} registers after setmaxnreg (the consumers: 168 x 384 less "
                              "those, over 256 threads, a multiple of 8)")
                    overrides.update(tile_overrides(tile))
                    profile = common.with_tiles(None, **overrides) if overrides else None
                    rows = []
                    fp8_prefill.section(rows, dims, tuple(int(x) for x in a.lengths.split(",")), masks, profile)
                    print(fp8_prefill.markdown(rows))
        if a.accuracy:  # (once per tile of --tiles: a tile's errors beside the 128-key tile's)
            for tile in tiles:
                overrides = {**base, **tile_overrides(tile)}
                accuracy(dims, (1023, 4096), masks, common.with_tiles(None, **overrides) if overrides else None)


def tile_overrides(tile) -> dict:
    """CudaTiles overrides of one --tiles entry (q, kv), printing its header; {} for None (the table's)."""
    if tile is None:
        return {}
    print(f"-- FP8 tile q={tile[0]} kv={tile[1]} (CudaTiles.fp8_tiles)")
    return {"fp8_tiles": ((1 << 20, tile),), "fp8_masked_tiles": ()}  # (every head dim and mask)


if __name__ == "__main__":
    main()
