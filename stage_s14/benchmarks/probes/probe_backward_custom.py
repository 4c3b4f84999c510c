"""Probe (issue 41): where the fast CUDA backward spends its time on `mask custom`. Times
kernel.backward for a mask none kernel and a mask custom kernel given an all-true mask (every tile
full: no per-element test), a window and a document-causal mask, L 16384, H 16, d128, f16; prints
the share of (key block, q tile) steps that test the mask per element (the key-block lists)."""

import sys

import torch

import attngen
from attngen.backends.cuda.backward_launch import _key_block_lists

sys.path.insert(0, "benchmarks/suite")
from variants import bench_ms, mask_cases  # noqa: E402

L, H, D = 16384, 16, 128
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v, dout = (torch.randn((1, L, H, D), device="cuda", dtype=torch.float16, generator=g) for _ in range(4))


def kernel(mask):
    return attngen.compile(attngen.parse(f"attention p_{mask} {{\n head_dim {D}\n dtype f16\n mask {mask}\n}}\n")[0],
                           target="cuda")


dense, custom = kernel("none"), kernel("custom")
masks, _ = mask_cases(L)
masks["all true"] = torch.ones((L, L), dtype=torch.bool, device="cuda")
flops = 2.5 * 4.0 * H * L * L * D
out, lse = dense(q, k, v, return_lse=True)
ms = bench_ms(lambda: dense.backward(q, k, v, out, lse, dout))
print(f"mask none: {ms:.3f} ms, {flops / ms / 1e9:.1f} TFLOP/s")
import cupy  # noqa: E402
for name, m in masks.items():
    bm = attngen.block_mask(m, custom)
    counts, lists, _, _, nq = _key_block_lists(bm, cupy)
    c = cupy.asnumpy(counts).ravel()
    ls = cupy.asnumpy(lists).reshape(-1, nq)
    entries = sum(int(n) for n in c)
    elem = sum(int((ls[i, :n] & 1).sum()) for i, n in enumerate(c))
    out, lse = custom(q, k, v, return_lse=True, mask=bm)
    ms = bench_ms(lambda: custom.backward(q, k, v, out, lse, dout, mask=bm))
    live = float(m.float().mean())
    print(f"{name}: {ms:.3f} ms, {flops * live / ms / 1e9:.1f} TFLOP/s live ({live:.3f}); steps per-element "
          f"{elem}/{entries}; forward tiles {bm.tile_q}x{bm.tile_kv}", flush=True)
