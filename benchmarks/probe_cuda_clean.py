"""What the cleaning of hidden keys costs the Hopper family's masked prefill (issue 11).

    python3 benchmarks/probe_cuda_clean.py [--dims 64,128,256] [--lengths 1024,4096] [--rewrites]

With a mask, some rows of a block may not see keys of a tile it loads, and such keys must add
nothing whatever their values (0 * inf is NaN in P V): the kernels zero non-finite V values of
partial tiles in shared memory (section non-finite values; the producer warpgroup does it where
there is one) and mark the rows that see one. This probe times the default causal kernels beside
the same kernels generated without that step (a timing probe, not a variant: those kernels are
wrong for non-finite V), f16, B L = 16384, H D = 2048, SDPA flash as the peer. --rewrites adds
the kernels with one part of the step taken out of the generated source: the consumers' marking
of rows (`nomark`) or the producer warpgroup's wait and scan (`noscan`). It changes nothing in
attngen.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import attngen
from probe_persistent import compile_with  # noqa: E402  (benchmarks/probe_persistent.py)

REWRITES = {
    "nomark": [("if (partial) mark_bad_rows(row_bad, s, bad, t);", "")],
    "noscan": [("            if (partial) {\n                // -- clean V of a partial tile", "            if (false) {\n                // -- clean V of a partial tile")],
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--lengths", default="1024,4096")
    ap.add_argument("--rewrites", action="store_true")
    args = ap.parse_args()
    for d in (int(x) for x in args.dims.split(",")):
        for L in (int(x) for x in args.lengths.split(",")):
            B, H = 16384 // L, 2048 // d
            q, k, v = (torch.randn(B, L, H, d, device="cuda", dtype=torch.float16) for _ in range(3))
            flops = 4.0 * B * H * L * L * d / 2
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True).transpose(1, 2)
                fa2 = do_bench(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True), warmup=25,
                               rep=100, return_mode="median")
            cells = [f"FA2 {flops / fa2 / 1e9:5.0f}"]
            variants = [("default", True, None), ("no cleaning", False, None)]
            variants += [(r, True, r) for r in REWRITES] if args.rewrites else []
            for label, clean, rewrite in variants + [("default again", True, None)]:
                name = f"probe_{rewrite}" if rewrite else ("probe_clean" if clean else "probe_noclean")
                spec = attngen.parse(f"attention {name} {{\n head_dim {d}\n dtype f16\n mask causal\n}}\n")[0]
                kern = compile_with(spec, REWRITES.get(rewrite, []), clean=clean, strict=False)
                out = kern(q, k, v)
                err = float((out.float() - ref.float()).norm() / ref.float().norm())
                ms = do_bench(lambda: kern(q, k, v), warmup=25, rep=100, return_mode="median")
                cells.append(f"{label} {flops / ms / 1e9:5.0f} ({err:.0e})")
            print(f"d{d} L{L} causal TFLOP/s | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
