"""Causal prefill: the default plan (d64: q64 kv64 without the producer; d128: q128 kv96 with it)
beside tile q=128 kv=128 / kv=96 with the producer warpgroup and q=128 kv=128 without it (issue 11;
kv96 is the widest that does not spill with it, ptxas -v), f16, B L = 16384, H D = 2048, SDPA flash
as the peer; checked against it before timing. Then (--masks) window 1024 and softcap 30 causal at
d128: the default plan beside q128 kv96 with and without the producer, checked against the default
(the measurements behind auto's choice for masks, attngen/backends/cuda/config.py).
    python3 benchmarks/quick_causal.py [--masks]"""

import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import attngen

def masks():
    B, L, H, d = 1, 16384, 16, 128
    q, k, v = (torch.randn(B, L, H, d, device="cuda", dtype=torch.float16) for _ in range(3))
    for mask, keys in (("window(left=1024)", 1025 * L), ("causal\n softcap 30", L * (L + 1) // 2)):
        flops, row = 4.0 * B * H * keys * d, [f"d{d} L{L} {mask.replace(chr(10), ' ')}"]
        ref = None
        for extra in ("", "tile q=128 kv=96\n target cuda { producer=on }", "tile q=128 kv=96\n target cuda { producer=off }"):
            spec = attngen.parse(f"attention s {{\n head_dim {d}\n dtype f16\n mask {mask}\n {extra}\n}}\n")[0]
            kern = attngen.compile(spec, target="cuda")
            out = kern(q, k, v).float()
            ref = out if ref is None else ref
            err = float((out - ref).norm() / ref.norm())
            ms = do_bench(lambda: kern(q, k, v), warmup=25, rep=100, return_mode="median")
            name = "default" if not extra else "q128 kv96 " + ("producer" if "=on" in extra else "plain")
            row.append(f"{name} {flops / ms / 1e9:5.0f} ({err:.0e})")
        print(" | ".join(row), flush=True)


if "--masks" in sys.argv:
    masks()
    sys.exit(0)

for d in (64, 128):
    for L in (1024, 4096, 16384):
        B, H = 16384 // L, 2048 // d
        q, k, v = (torch.randn(B, L, H, d, device="cuda", dtype=torch.float16) for _ in range(3))
        t = [x.transpose(1, 2) for x in (q, k, v)]
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            ref = F.scaled_dot_product_attention(*t, is_causal=True).transpose(1, 2)
            fa2 = do_bench(lambda: F.scaled_dot_product_attention(*t, is_causal=True), warmup=25, rep=100,
                           return_mode="median")
        flops = 2.0 * B * H * L * L * d
        row = [f"d{d} L{L} causal", f"FA2 {flops / fa2 / 1e9:5.0f}"]
        for tile in ("", "tile q=128 kv=128\n target cuda { producer=on }", "tile q=128 kv=96\n target cuda { producer=on }",
                     "tile q=128 kv=128\n target cuda { producer=off }"):
            spec = attngen.parse(f"attention s {{\n head_dim {d}\n dtype f16\n mask causal\n {tile}\n}}\n")[0]
            kern = attngen.compile(spec, target="cuda")
            out = kern(q, k, v)
            err = float((out.float() - ref.float()).norm() / ref.float().norm())
            ms = do_bench(lambda: kern(q, k, v), warmup=25, rep=100, return_mode="median")
            name = {"": "default"}.get(tile, tile.split("\n")[0][5:] + (" producer" if "=on" in tile else " plain"))
            row.append(f"{name} {flops / ms / 1e9:5.0f} ({err:.0e})")
        print(" | ".join(row), flush=True)
