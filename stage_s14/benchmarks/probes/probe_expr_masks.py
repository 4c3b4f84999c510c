"""Index-only mask expressions on the CUDA forward beside the named masks that mean the same (issue 42).

    python3 benchmarks/probes/probe_expr_masks.py [--lengths 4096,16384] [--pairs NAME,...]

The issue's must: an index-only mask expression within 3% of the named mask that means the same
thing. Pairs, each on the same inputs (d128, 16 heads, f16, B 1, L 4096 and 16384; this GPU's
default kernel family, the producer kernels on the H100):

- `causal`: `mask causal` beside `mask k <= q` (no holes: the contiguous key range);
- `window`: `mask window(left=1024, right=0)` beside `mask k <= q && q - k <= 1024`;
- `neighbourhood`: the 2D neighbourhood of radius 7 over a square image (64 x 64 at L 4096,
  128 x 128 at L 16384) as an expression beside the same visible pairs as a `mask custom`
  BlockMask (at the kernels' 80-key tiles it has no holes: the difference is the per-element test);
- `sink`: 64 sink keys and a causal window of 1024, `k < 64 || k <= q && q - k < 1024`, beside
  the same as a BlockMask: holes between the sinks and the window, which the producer family's
  list of live tiles skips (family.tile_list).

Each line: the two kernels' medians (triton do_bench, ms), TFLOP/s on the live pairs (4 H L^2 D
times the visible fraction), the expression's time over the named mask's, the relative error of
each against SDPA's memory-efficient kernel with the dense mask, and whether the expression's
kernel lists its tiles; then `other`: the expression's kernel on the other path, the list where
the default keeps the contiguous key range and the range where it lists (the tile table's
expr_tile_list, "always" or "never", by common.with_tiles), to choose that default.

The expression runs as `attngen.compile` gives it (`target cuda { mask_expr=auto }`: the path the
call took is printed, `auto=bits` or `auto=inline`), and then on both paths of that kernel
(attngen/backends/cuda/expr_bits.py): `inline` (kernel.inline: partial tiles evaluate the
expression per element) and `bits` (kernel.bits on kernel.bits_mask: the builder evaluates it
once into a BlockMask, built before the timing, and the spec with `mask custom` runs on it), each
with its time, TFLOP/s, error and time over the named mask's, then inline/bits, by which
attngen.plan.expr_bits.prefers_bits is judged. `other` is measured on the inline path (`--extra`
must not hold a `target cuda` block: the probe adds one there).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch.nn.attention import SDPBackend

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import attngen  # noqa: E402
from common import median_ms, randn, rel_err, sdpa, with_tiles  # noqa: E402

H, D, RADIUS, WINDOW, SINKS = 16, 128, 7, 1024, 64


def _pairs(L: int) -> dict:
    """{name: (expression body, named body, custom: the named one takes a BlockMask, dense mask)}."""
    i = torch.arange(L, device="cuda")
    qi, kj = i[:, None], i[None, :]
    w = int(round(L ** 0.5))
    hood = f"abs(q // {w} - k // {w}) <= {RADIUS} && abs(q % {w} - k % {w}) <= {RADIUS}"
    return {
        "causal": ("mask k <= q", "mask causal", False, kj <= qi),
        "window": (f"mask k <= q && q - k <= {WINDOW}", f"mask window(left={WINDOW}, right=0)", False,
                   (kj <= qi) & (qi - kj <= WINDOW)),
        "neighbourhood": (f"mask {hood}", "mask custom", True,
                          ((qi // w - kj // w).abs() <= RADIUS) & ((qi % w - kj % w).abs() <= RADIUS)),
        "sink": (f"mask k < {SINKS} || k <= q && q - k < {WINDOW}", "mask custom", True,
                 (kj < SINKS) | ((kj <= qi) & (qi - kj < WINDOW))),
    }


def _compile(name: str, body: str, profile=None, path: str | None = None):
    """The kernel of `body`; `path`: the expression's mask_expr (inline or bits), None: auto."""
    option = f"\n target cuda {{ mask_expr={path} }}" if path else ""
    text = f"attention {name} {{\n head_dim {D}\n heads q={H} kv={H}\n dtype f16\n {body}{option}\n}}"
    return attngen.compile(attngen.parse(text)[0], target="cuda", profile=profile)


def _listed(kern) -> bool:
    return kern.plan.config.tile_list


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="4096,16384")
    ap.add_argument("--pairs", default="causal,window,neighbourhood,sink")
    ap.add_argument("--extra", default="", help="lines added to the expression's spec (e.g. its tiles), \\n-separated")
    args = ap.parse_args()
    for L in (int(x) for x in args.lengths.split(",")):
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (randn((1, L, H, D), generator=g) for _ in range(3))
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        pairs = _pairs(L)
        for name in args.pairs.split(","):
            expr_body, named_body, custom, dense = pairs[name]
            expr_body += "\n " + args.extra.replace("\\n", "\n ") if args.extra else ""
            expr = _compile(f"probe_expr_{name}_{L}", expr_body)
            named = _compile(f"probe_named_{name}_{L}", named_body)
            call = {"mask": attngen.block_mask(dense, named)} if custom else {}
            ref = sdpa(qt, kt, vt, SDPBackend.EFFICIENT_ATTENTION, attn_mask=dense).transpose(1, 2)
            err_e, err_n = rel_err(expr(q, k, v), ref), rel_err(named(q, k, v, **call), ref)
            ms_e = median_ms(lambda: expr(q, k, v), 10, 50)
            ms_n = median_ms(lambda: named(q, k, v, **call), 10, 50)
            live = 4.0 * H * D * float(dense.sum())
            c = expr.plan.config
            line = (f"L{L} {name:14s} expr (auto={expr.last_path}) {ms_e:.3f} ms "
                    f"{live / ms_e / 1e9:6.1f} TFLOP/s ({err_e:.1e})  "
                    f"{named_body:34s} {ms_n:.3f} ms {live / ms_n / 1e9:6.1f} TFLOP/s ({err_n:.1e})  "
                    f"expr/named {ms_e / ms_n:.3f}  tile q{c.tile_q} kv{c.tile_kv} producer={c.producer} "
                    f"list={_listed(expr)}")
            ms_p = {}
            bm = expr.bits_mask(q, k, v)  # (built here, or the auto call's: not timed)
            for path, run in (("inline", lambda: expr.inline(q, k, v)), ("bits", lambda: expr.bits(q, k, v, mask=bm))):
                err_p = rel_err(run(), ref)
                ms_p[path] = median_ms(run, 10, 50)
                line += (f"  {path} {ms_p[path]:.3f} ms {live / ms_p[path] / 1e9:6.1f} TFLOP/s ({err_p:.1e}) "
                         f"{path}/named {ms_p[path] / ms_n:.3f}")
            line += f"  inline/bits {ms_p['inline'] / ms_p['bits']:.3f}"
            if c.producer:
                way = "never" if _listed(expr) else "always"
                other = _compile(f"probe_expr_{name}_{L}_{way}", expr_body, with_tiles(None, expr_tile_list=way),
                                 path="inline")
                err_o = rel_err(other(q, k, v), ref)
                ms_o = median_ms(lambda: other(q, k, v), 10, 50)
                line += (f"  other (list={_listed(other)}) {ms_o:.3f} ms {live / ms_o / 1e9:6.1f} TFLOP/s "
                         f"({err_o:.1e}) other/named {ms_o / ms_n:.3f}")
            print(line, flush=True)
            del ref, call


if __name__ == "__main__":
    main()
