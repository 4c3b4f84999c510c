"""Persistent blocks against one block per row tile (issue 11): the producer kernels with
`persistent=on` (one block per multiprocessor taking work items in turn) beside `persistent=off`,
and the other tile plans given with --extra, with SDPA flash (FA2) and FlexAttention in the same
run. f16, B L = 16384, H D = 2048 (the dense suite's shapes); each kernel is checked against SDPA
flash before it is timed (relative error in brackets), medians of do_bench after warm-up.

    python3 benchmarks/probes/probe_persistent.py [--dims 128] [--lengths 1024,4096,16384]
        [--masks "none,causal,window(left=1024)"] [--softcap 30] [--no-flex]
        [--extra "tile q=128 kv=128\\n target cuda { producer=on }" ...]

--rewrite NAME adds the default plan with one change made to its generated source (a timing
probe, not a variant): `reverse` walks each item's K/V tiles from the last (a causal item's
diagonal tiles, the partial ones, first: FlashAttention-3's order); `noclean` drops the cleaning
of hidden non-finite values (wrong for such values: it shows what the step costs).

Windows count the keys each row sees (FLOPs of the visible scores); FA2 and Flex then time the
same window (SDPA with an explicit boolean mask is not FA2: the peers are left out for windows
and softcap, which compare attngen's plans only).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import attngen
from common import compile_with  # noqa: E402  (benchmarks/probes/common.py)

REWRITES = {
    "reverse": [("auto kv_tile = [&](int it) { return tile_first + it; };",
                 "auto kv_tile = [&](int it) { return tile_first + n_tiles - 1 - it; };")],
    "noclean": [],  # (the table's clean_values=False instead: with_tiles)
}


def compile_rewritten(spec, name):
    """attngen.compile of `spec` with REWRITES[name] made to its source."""
    return compile_with(spec, REWRITES[name], clean=name != "noclean")


def flex_time(q, k, v, causal):
    """FlexAttention's median ms (compiled once per shape), or None where it is not available."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return None
    fn = torch.compile(flex_attention, dynamic=False)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    bm = None
    if causal:
        L = q.shape[1]
        bm = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, L, L, device="cuda")
    fn(qt, kt, vt, block_mask=bm)
    return do_bench(lambda: fn(qt, kt, vt, block_mask=bm), warmup=25, rep=100, return_mode="median")


def visible_keys(mask: str, L: int) -> float:
    """Keys all rows of one (batch, head) see: L^2 (none), L(L+1)/2 (causal), a window's band."""
    if mask == "none":
        return float(L * L)
    if mask == "causal":
        return L * (L + 1) / 2
    left = int(mask.split("left=")[1].rstrip(")").split(",")[0])  # window(left=W): keys i - W .. i
    return float(sum(min(i, left) + 1 for i in range(L)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dims", default="128")
    ap.add_argument("--lengths", default="1024,4096,16384")
    ap.add_argument("--masks", default="none,causal")
    ap.add_argument("--extra", action="append", default=[], help="more spec lines to time (tile / target)")
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--softcap", default=None, help="a softcap line for every plan (the peers are left out)")
    ap.add_argument("--rewrite", action="append", default=[], choices=sorted(REWRITES))
    args = ap.parse_args()
    masks = [m for m in args.masks.replace(", right", ";right").split(",")]
    for d in (int(x) for x in args.dims.split(",")):
        for mask in (m.replace(";", ",") for m in masks):
            causal = mask == "causal"
            peers = mask in ("none", "causal") and args.softcap is None
            for L in (int(x) for x in args.lengths.split(",")):
                B, H = 16384 // L, 2048 // d
                q, k, v = (torch.randn(B, L, H, d, device="cuda", dtype=torch.float16) for _ in range(3))
                flops = 4.0 * B * H * visible_keys(mask, L) * d
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                cells, ref = [], None
                if peers:
                    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                        ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2).float()
                        fa2 = do_bench(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal), warmup=25,
                                       rep=100, return_mode="median")
                    cells.append(f"FA2 {flops / fa2 / 1e9:4.0f}")
                if peers and not args.no_flex:
                    fl = flex_time(q, k, v, causal)
                    cells.append(f"Flex {flops / fl / 1e9:4.0f}" if fl else "Flex -")
                plans = [("default", ""), ("persistent=off", " target cuda { persistent=off }")]
                plans += [(x.replace("\\n", " "), " " + x.replace("\\n", "\n")) for x in args.extra]
                plans += [(r, r) for r in args.rewrite]
                cap = f" softcap {args.softcap}\n" if args.softcap else ""
                for label, extra in plans + [("default again", "")]:
                    rewrite = extra if extra in REWRITES else None
                    name = f"probe_{rewrite}" if rewrite else "probe"  # its own cache entry
                    body = "" if rewrite else extra
                    spec = attngen.parse(f"attention {name} {{\n head_dim {d}\n dtype f16\n mask {mask}\n{cap}{body}\n}}\n")[0]
                    try:
                        kern = compile_rewritten(spec, rewrite) if rewrite else attngen.compile(spec, target="cuda")
                    except attngen.SpecError as e:
                        cells.append(f"{label}: refused ({str(e).splitlines()[0][:60]})")
                        continue
                    out = kern(q, k, v).float()
                    ref = out if ref is None else ref  # no peer: checked against the first plan
                    err = float((out - ref).norm() / ref.norm())
                    ms = do_bench(lambda: kern(q, k, v), warmup=25, rep=100, return_mode="median")
                    cells.append(f"{label} {flops / ms / 1e9:4.0f} ({err:.0e})")
                what = f"{mask} softcap {args.softcap}" if args.softcap else mask
                print(f"f16 d{d} L{L} {what} TFLOP/s | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
