"""Launches with per-sequence lengths against padded ones: the same tokens attended as B padded
sequences (the main entry point), packed with cu_seqlens (the `_varlen` entry point, as a serving
engine's prefill calls it) and padded with kv_lens (also `_varlen`), beside SDPA flash (FA2) on
the padded shape, in one process. f16, H D = 2048; each output is checked against FA2 (relative
error in brackets); medians of triton do_bench; TFLOP/s = 4 B H L^2 D (halved for causal).

    python3 benchmarks/probe_varlen.py [--dims 128] [--lengths 1024,4096] [--masks none,causal]
        [--docs 4] [--uneven]

--uneven packs sequences of lengths L/2, L, 3L/2 ... (the same total per batch) instead of B
sequences of L; the padded and FA2 cells are then left out (no padded shape matches).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import attngen


def _ms(fn) -> float:
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dims", default="128")
    ap.add_argument("--lengths", default="1024,4096")
    ap.add_argument("--masks", default="none,causal")
    ap.add_argument("--docs", type=int, default=4, help="sequences per launch")
    ap.add_argument("--uneven", action="store_true")
    args = ap.parse_args()
    for d in (int(x) for x in args.dims.split(",")):
        H = 2048 // d
        for mask in args.masks.split(","):
            causal = mask == "causal"
            spec = attngen.parse(f"attention varlen_probe {{\n head_dim {d}\n heads q={H} kv={H}\n dtype f16\n"
                                 f" mask {'causal' if causal else 'none'}\n}}\n")[0]
            kern = attngen.compile(spec, target="cuda")
            for L in (int(x) for x in args.lengths.split(",")):
                B = args.docs
                lens = [L * (i + 1) // 2 for i in range(B)] if args.uneven else [L] * B
                total = sum(lens)
                g = torch.Generator(device="cuda").manual_seed(5)
                q, k, v = (torch.randn((total, H, d), device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
                cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device="cuda", dtype=torch.int32)
                flops = sum(4.0 * H * n * n * d * (0.5 if causal else 1.0) for n in lens)
                cells = []
                ref = None
                if not args.uneven:
                    qp, kp, vp = (x.view(B, L, H, d) for x in (q, k, v))
                    qt, kt, vt = (x.transpose(1, 2) for x in (qp, kp, vp))
                    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                        ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2).float()
                        ms = _ms(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))
                    cells.append(f"FA2 {flops / ms / 1e9:4.0f}")
                    out = kern(qp, kp, vp).float()
                    cells.append(f"padded {flops / _ms(lambda: kern(qp, kp, vp)) / 1e9:4.0f} "
                                 f"({float((out - ref).norm() / ref.norm()):.0e})")
                    kv_lens = torch.full((B,), L, device="cuda", dtype=torch.int32)
                    out = kern(qp, kp, vp, kv_lens=kv_lens).float()
                    cells.append(f"kv_lens {flops / _ms(lambda: kern(qp, kp, vp, kv_lens=kv_lens)) / 1e9:4.0f} "
                                 f"({float((out - ref).norm() / ref.norm()):.0e})")
                mx = max(lens)
                call = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=mx, max_seqlen_k=mx)
                out = kern(q, k, v, **call).float()
                err = "" if ref is None else f" ({float((out.view(B, L, H, d) - ref).norm() / ref.norm()):.0e})"
                cells.append(f"packed {flops / _ms(lambda: kern(q, k, v, **call)) / 1e9:4.0f}{err}")
                what = f"{B} sequences of {'L/2 .. ' if args.uneven else ''}L{L}"
                print(f"f16 d{d} {mask} {what} TFLOP/s | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
